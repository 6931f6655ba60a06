//! Buffer debloating: a producer held to the consumer's cap goes on as the consumer reads.
#![cfg(shmflow_loom)]

mod common;

use loom::thread;
use shmflow::{Geometry, WaitStrategy};
use std::time::Duration;

/// Three segments of 64 bytes. The consumer's target is so short that its first measurement
/// of its rate caps the producer at two segments in flight, the fewest: a first record that
/// fills its segment is read before the threads start, and the look after it finishes the
/// segment (under loom the rate is measured over a millisecond of modelled time). Then three
/// records of 40 bytes, one per segment: the producer waits for the cap with a free segment in
/// its pool, and always goes on as the consumer finishes segments; every record arrives in
/// order. Both ends park at once when they wait (`WaitStrategy::Park`): the same protocol with
/// fewer looks, so that loom has fewer interleavings to explore.
#[test]
fn a_producer_held_to_the_debloating_cap_goes_on() {
    common::check(1, || {
        let (mut tx, mut rx) = shmflow::pair(Geometry {
            segment_size: 64,
            segment_count: 3,
        })
        .unwrap();
        tx.set_wait_strategy(WaitStrategy::Park);
        rx.set_wait_strategy(WaitStrategy::Park);
        rx.set_debloat_target(Some(Duration::from_nanos(1)));
        tx.send(&[0; 56]).unwrap();
        assert_eq!(rx.recv().unwrap().unwrap().as_bytes(), Some(&[0; 56][..]));
        assert!(rx.try_recv().is_err(), "nothing more yet");
        assert_eq!(rx.metrics().segment_cap, 2, "the cap engaged");
        let writer = thread::spawn(move || {
            for i in 1..4u8 {
                tx.send(&[i; 40]).unwrap();
            }
        });
        for i in 1..4u8 {
            let r = rx.recv().unwrap().expect("a record before the end");
            assert_eq!(r.as_bytes(), Some(&[i; 40][..]));
        }
        assert!(rx.recv().unwrap().is_none());
        writer.join().unwrap();
    });
}
