//! Building ends with their settings: every way of making an end applies them, and
//! `open_or_create` lets two ends start in any order.

mod common;

use std::time::Duration;

use common::unique_name;
use shmflow::{Consumer, FlushPolicy, Geometry, OpenError, Producer, RecvError, WaitStrategy};

const G: Geometry = Geometry {
    segment_size: 4096,
    segment_count: 4,
};

#[test]
fn open_or_create_works_whichever_end_comes_first() {
    for producer_first in [true, false] {
        let name = unique_name(if producer_first { "ooc-p" } else { "ooc-c" });
        let (mut tx, mut rx) = if producer_first {
            let tx = Producer::builder()
                .geometry(G)
                .open_or_create(&name)
                .unwrap();
            let rx = Consumer::builder().open_or_create(&name).unwrap();
            (tx, rx)
        } else {
            let rx = Consumer::builder()
                .geometry(G)
                .open_or_create(&name)
                .unwrap();
            let tx = Producer::builder().open_or_create(&name).unwrap();
            (tx, rx)
        };
        // The geometry is the creator's, whoever opened second.
        assert_eq!(tx.geometry(), G);
        assert_eq!(rx.geometry(), G);
        tx.send(b"either order").unwrap();
        tx.flush().unwrap();
        assert_eq!(
            rx.recv().unwrap().unwrap().as_bytes(),
            Some(&b"either order"[..])
        );
    }
}

#[test]
fn open_or_create_settles_a_race_between_two_creators() {
    // Both ends start at once, many times: exactly one creates, the other opens, and the
    // channel works every time.
    for round in 0..200 {
        let name = unique_name(&format!("ooc-race-{round}"));
        let n2 = name.clone();
        let t = std::thread::spawn(move || Consumer::builder().geometry(G).open_or_create(&n2));
        let tx = Producer::builder().geometry(G).open_or_create(&name);
        let (mut tx, mut rx) = (tx.unwrap(), t.join().unwrap().unwrap());
        tx.send(&[round as u8; 16]).unwrap();
        tx.flush().unwrap();
        let r = rx.recv().unwrap().unwrap();
        assert_eq!(r.as_bytes(), Some(&[round as u8; 16][..]));
    }
}

#[test]
fn settings_given_to_the_builder_are_in_force() {
    let (mut tx, handle) = Producer::builder()
        .geometry(G)
        .flush_policy(FlushPolicy::Explicit)
        .wait_strategy(WaitStrategy::Park)
        .metrics(false)
        .create_anonymous()
        .unwrap();
    assert_eq!(tx.flush_policy(), FlushPolicy::Explicit);
    let mut rx = Consumer::builder()
        .max_record_len(5000)
        .metrics(false)
        .from_fd(handle.into_fd())
        .unwrap();
    // Explicit: nothing is visible before the flush.
    tx.send(b"held back").unwrap();
    assert!(rx.recv_timeout(Duration::from_millis(20)).is_err());
    tx.flush().unwrap();
    assert!(rx.recv().unwrap().is_some());
    // Metrics off: per-record counts stay 0.
    let m = tx.metrics();
    assert_eq!((m.records_written, m.records_read), (0, 0));
    // The record limit: a spanning record over it is refused once its parts pass it.
    tx.send(&vec![7u8; 6000]).unwrap();
    tx.flush().unwrap();
    let r = rx.recv().unwrap().expect("the record");
    match r.to_vec() {
        Err(RecvError::RecordTooLarge(e)) => assert_eq!(e.max(), 5000),
        other => panic!("expected RecordTooLarge, got {other:?}"),
    };
}

#[test]
fn create_refuses_an_existing_name_and_open_a_missing_one() {
    let name = unique_name("builder-exists");
    let _tx = Producer::builder().geometry(G).create(&name).unwrap();
    assert!(matches!(
        Consumer::builder().create(&name),
        Err(OpenError::AlreadyExists { .. })
    ));
    assert!(matches!(
        Producer::builder().open(&unique_name("builder-missing")),
        Err(OpenError::NotFound { .. })
    ));
}

#[test]
fn the_record_limit_bounds_records_within_one_segment_too() {
    let (mut tx, handle) = Producer::builder()
        .geometry(G)
        .flush_policy(FlushPolicy::EveryRecord)
        .create_anonymous()
        .unwrap();
    let mut rx = Consumer::builder()
        .max_record_len(100)
        .from_fd(handle.into_fd())
        .unwrap();
    tx.send(&[1u8; 200]).unwrap();
    tx.send(b"within the limit").unwrap();
    match rx.recv() {
        Err(RecvError::RecordTooLarge(e)) => assert_eq!((e.length(), e.max()), (200, 100)),
        Err(e) => panic!("expected RecordTooLarge, got {e}"),
        Ok(r) => panic!("expected RecordTooLarge, got {r:?}"),
    }
    // The record over the limit was skipped; the next one arrives.
    assert_eq!(
        rx.recv().unwrap().unwrap().as_bytes(),
        Some(&b"within the limit"[..])
    );
    // `drain` reports it the same way.
    tx.send(&[2u8; 101]).unwrap();
    assert!(matches!(
        rx.drain(10, |_| Ok::<_, RecvError>(())),
        Err(RecvError::RecordTooLarge(_))
    ));
}
