//! One channel between two threads: the stream, a full pool, a consumer that leaves, and
//! `close_timeout`.
#![cfg(shmflow_loom)]

mod common;

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use shmflow::{Geometry, SendError};
use std::time::Duration;

/// Two segments of 64 bytes: each holds one 40-byte record (and its 8-byte header).
const TINY: Geometry = Geometry {
    segment_size: 64,
    segment_count: 2,
};

/// Records arrive whole, in order, then the end of the stream. The library registers every
/// byte it writes into a segment and every byte the consumer views with loom, so a record
/// read before it was committed is a causality violation.
#[test]
fn a_stream_is_read_in_order_to_its_end() {
    common::check(2, || {
        let (mut tx, mut rx) = shmflow::pair(TINY).unwrap();
        let writer = thread::spawn(move || {
            for i in 0..2u8 {
                tx.send(&[i; 40]).unwrap();
            }
            // Dropping the producer ends the stream.
        });
        for i in 0..2u8 {
            let r = rx.recv().unwrap().expect("a record before the end");
            assert_eq!(r.as_bytes(), Some(&[i; 40][..]));
        }
        assert!(rx.recv().unwrap().is_none(), "the end of the stream");
        writer.join().unwrap();
    });
}

/// Records claimed and committed as batches (`claim_batch`) arrive whole and in order: 8-byte
/// records take 16 bytes with their headers, four to a segment; the first batch claims three,
/// the second finds room for only one more in the segment in hand (a batch ends at a
/// segment's end), and the third takes a fresh segment.
#[test]
fn a_batch_is_read_whole_and_in_order() {
    common::check(2, || {
        let (mut tx, mut rx) = shmflow::pair(TINY).unwrap();
        let writer = thread::spawn(move || {
            let mut next = 0u64;
            for want in [3, 3, 1] {
                let mut batch = tx.claim_batch(8, want).unwrap();
                for r in batch.iter_mut() {
                    r.copy_from_slice(&next.to_le_bytes());
                    next += 1;
                }
                batch.commit();
            }
        });
        for i in 0..5u64 {
            let r = rx.recv().unwrap().expect("a record before the end");
            assert_eq!(r.as_pod::<u64>(), Some(&i));
        }
        assert!(rx.recv().unwrap().is_none(), "the end of the stream");
        writer.join().unwrap();
    });
}

/// The third record needs a segment back: the producer blocks until the consumer returns one,
/// and always wakes.
#[test]
fn a_producer_blocked_on_a_full_pool_wakes() {
    common::check(1, || {
        let (mut tx, mut rx) = shmflow::pair(TINY).unwrap();
        let writer = thread::spawn(move || {
            for i in 0..3u8 {
                tx.send(&[i; 40]).unwrap();
            }
        });
        for i in 0..3u8 {
            let r = rx.recv().unwrap().expect("a record before the end");
            assert_eq!(r.as_bytes(), Some(&[i; 40][..]));
        }
        assert!(rx.recv().unwrap().is_none());
        writer.join().unwrap();
    });
}

/// A consumer that leaves while the producer waits for a segment: the producer's send returns
/// `Closed`, and so does every later one.
#[test]
fn a_consumer_dropped_while_the_producer_waits_gives_closed() {
    common::check(2, || {
        let (mut tx, mut rx) = shmflow::pair(TINY).unwrap();
        let writer = thread::spawn(move || {
            let mut sent = 0;
            let err = loop {
                match tx.send(&[7; 40]) {
                    Ok(()) => sent += 1,
                    Err(e) => break e,
                }
                assert!(sent <= 3, "the pool holds two records, the reader took one");
            };
            assert!(matches!(err, SendError::Closed(_)), "{err:?}");
            assert!(matches!(tx.send(b"x"), Err(SendError::Closed(_))));
        });
        assert!(rx.recv().unwrap().is_some());
        drop(rx);
        writer.join().unwrap();
    });
}

/// `close_timeout` returns `Ok` only once the consumer has read every record.
#[test]
fn close_timeout_returns_once_everything_is_read() {
    common::check(2, || {
        let (mut tx, mut rx) = shmflow::pair(TINY).unwrap();
        let read = Arc::new(AtomicUsize::new(0));
        let reader = {
            let read = read.clone();
            thread::spawn(move || {
                while rx.recv().unwrap().is_some() {
                    read.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        tx.send(&[1; 40]).unwrap();
        tx.send(&[2; 40]).unwrap();
        // Modelled time: a wait with a deadline ends after a few looks whoever runs, so the
        // deadline is long enough for the reader to be scheduled whatever the interleaving.
        tx.close_timeout(Duration::from_secs(1)).unwrap();
        assert_eq!(
            read.load(Ordering::Relaxed),
            2,
            "close returned before the reader read"
        );
        reader.join().unwrap();
    });
}
