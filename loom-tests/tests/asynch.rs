//! Async ends: a task awaiting a record is woken by a thread that sends it.
#![cfg(shmflow_loom)]

mod common;

use loom::thread;
use shmflow::{Geometry, WaitStrategy};

/// The consumer awaits in a task (`loom::future::block_on` stands for the executor) and sleeps
/// on the channel's doorbell, which the producer's thread rings: it always wakes, and reads
/// both records, then the end.
#[test]
fn an_awaiting_consumer_is_woken_by_a_sending_thread() {
    common::check(2, || {
        let (mut tx, mut rx) = shmflow::pair(Geometry {
            segment_size: 64,
            segment_count: 2,
        })
        .unwrap();
        rx.set_wait_strategy(WaitStrategy::Park);
        let writer = thread::spawn(move || {
            tx.send(&[1; 40]).unwrap();
            tx.send(&[2; 40]).unwrap();
        });
        loom::future::block_on(async {
            for i in 1..=2u8 {
                let r = rx.recv_async().await.unwrap().expect("a record");
                assert_eq!(r.as_bytes(), Some(&[i; 40][..]));
            }
            assert!(rx.recv_async().await.unwrap().is_none());
        });
        writer.join().unwrap();
    });
}
