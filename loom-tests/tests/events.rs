//! A priority event overtakes the records queued in front of it, and arrives whole.
#![cfg(shmflow_loom)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};

use loom::thread;
use shmflow::{Geometry, Message};

/// Set by an execution in which the event came before a record sent ahead of it (outside
/// loom's view: it counts executions, it orders nothing).
static OVERTOOK: AtomicBool = AtomicBool::new(false);

/// What the consumer read, as plain values.
#[derive(Debug, PartialEq, Eq)]
enum Got {
    Record(u8),
    Event,
}

/// The producer sends two records, a priority event, and a third record while the consumer
/// reads. In every execution: the event comes whole, once, before the record sent after it;
/// the records come in order, then the end. In some execution, the event comes before a
/// record sent ahead of it: it overtook what was queued.
#[test]
fn a_priority_event_overtakes_queued_records() {
    common::check(2, || {
        let (mut tx, mut rx) = shmflow::pair(Geometry {
            segment_size: 64,
            segment_count: 2,
        })
        .unwrap();
        let writer = thread::spawn(move || {
            tx.send(&[1; 16]).unwrap();
            tx.send(&[2; 16]).unwrap();
            tx.send_priority_event(9, b"urgent").unwrap();
            tx.send(&[3; 16]).unwrap();
        });
        let mut got = Vec::new();
        while let Some(m) = rx.recv_message().unwrap() {
            got.push(match m {
                Message::Record(r) => Got::Record(r.as_bytes().unwrap()[0]),
                Message::Event(e) => {
                    assert!(e.priority);
                    assert_eq!(
                        (e.kind, e.payload),
                        (9, &b"urgent"[..]),
                        "the event as sent"
                    );
                    Got::Event
                }
                other => panic!("unexpected {other:?}"),
            });
        }
        writer.join().unwrap();
        let records: Vec<&Got> = got.iter().filter(|g| **g != Got::Event).collect();
        assert_eq!(records, [&Got::Record(1), &Got::Record(2), &Got::Record(3)]);
        let event = got
            .iter()
            .position(|g| *g == Got::Event)
            .expect("the event");
        assert_eq!(got.iter().filter(|g| **g == Got::Event).count(), 1);
        let third = got.iter().position(|g| *g == Got::Record(3)).unwrap();
        assert!(event < third, "after a record sent after it: {got:?}");
        if event < got.iter().position(|g| *g == Got::Record(2)).unwrap() {
            OVERTOOK.store(true, Ordering::Relaxed);
        }
    });
    assert!(
        OVERTOOK.load(Ordering::Relaxed),
        "no explored execution had the event overtake a queued record"
    );
}
