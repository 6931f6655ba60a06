//! A gate of two channels written by two threads: checkpoint barriers.
#![cfg(shmflow_loom)]

mod common;

use loom::thread;
use shmflow::{Alignment, Gate, GateMessage, Producer, Released, WaitStrategy};

/// What the gate handed out, as plain values.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Got {
    Record(u32, u8),
    Barrier(u64, Released),
    InFlight(u32, u8),
    InFlightEnd(u64),
    End(u32),
}

/// Two producers through a gate with one segment per channel and one floating segment:
/// channel 0 sends barrier 1 then record 2, channel 1 record 1 then barrier 1. Everything the
/// gate hands out, in order. Both ends park at once when they wait (`WaitStrategy::Park`):
/// the same protocol with fewer looks, so that loom has fewer interleavings to explore.
fn run(alignment: Alignment) -> Vec<Got> {
    let (mut gate, handles) = Gate::builder()
        .channels(2)
        .exclusive(1)
        .floating(1)
        .segment_size(64)
        .wait_strategy(WaitStrategy::Park)
        .create_anonymous()
        .unwrap();
    let writers: Vec<_> = handles
        .into_iter()
        .map(|h| {
            thread::spawn(move || {
                let c = h.channel().unwrap();
                let mut tx = Producer::builder()
                    .wait_strategy(WaitStrategy::Park)
                    .from_handle(h)
                    .unwrap();
                if c == 0 {
                    tx.send_barrier(1, alignment, b"").unwrap();
                    tx.send(&[2; 8]).unwrap();
                } else {
                    tx.send(&[1; 8]).unwrap();
                    tx.send_barrier(1, alignment, b"").unwrap();
                }
            })
        })
        .collect();
    let mut got = Vec::new();
    while let Some(m) = gate.recv().unwrap() {
        got.push(match m {
            GateMessage::Record { channel, record } => {
                Got::Record(channel, record.as_bytes().unwrap()[0])
            }
            GateMessage::Barrier { id, released, .. } => Got::Barrier(id, released),
            GateMessage::InFlight {
                channel, record, ..
            } => Got::InFlight(channel, record.as_bytes().unwrap()[0]),
            GateMessage::InFlightEnd { id } => Got::InFlightEnd(id),
            GateMessage::EndOfPartition { channel } => Got::End(channel),
            other => panic!("unexpected {other:?}"),
        });
    }
    for w in writers {
        w.join().unwrap();
    }
    got
}

/// An aligned barrier is released once, after channel 1's record before it and before
/// channel 0's record after it.
#[test]
fn an_aligned_barrier_is_released_once_after_both_channels() {
    common::check(1, || {
        let got = run(Alignment::Aligned);
        let released: Vec<usize> = (0..got.len())
            .filter(|&i| matches!(got[i], Got::Barrier(..)))
            .collect();
        assert_eq!(released.len(), 1, "one release: {got:?}");
        let at = released[0];
        assert_eq!(got[at], Got::Barrier(1, Released::Aligned), "{got:?}");
        let before = got.iter().position(|g| *g == Got::Record(1, 1)).unwrap();
        let after = got.iter().position(|g| *g == Got::Record(0, 2)).unwrap();
        assert!(
            before < at && at < after,
            "the barrier between the records: {got:?}"
        );
        assert_eq!(got.iter().filter(|g| matches!(g, Got::End(_))).count(), 2);
    });
}

/// An unaligned barrier is released once, at once; channel 1's record, which it may have
/// overtaken, comes exactly once: before the release, or as in-flight data between the
/// release and its end. Channel 0's record after the barrier comes after the release.
#[test]
fn an_unaligned_barrier_hands_back_what_it_overtook() {
    common::check(1, || {
        let got = run(Alignment::Unaligned);
        let released: Vec<&Got> = got
            .iter()
            .filter(|g| matches!(g, Got::Barrier(..)))
            .collect();
        assert_eq!(
            released,
            [&Got::Barrier(1, Released::Unaligned { timed_out: false })],
            "one release: {got:?}"
        );
        let at = got
            .iter()
            .position(|g| matches!(g, Got::Barrier(..)))
            .unwrap();
        let end = got.iter().position(|g| *g == Got::InFlightEnd(1)).unwrap();
        assert!(at < end, "{got:?}");
        let seen: Vec<usize> = (0..got.len())
            .filter(|&i| got[i] == Got::Record(1, 1) || got[i] == Got::InFlight(1, 1))
            .collect();
        assert_eq!(seen.len(), 1, "channel 1's record once: {got:?}");
        let i = seen[0];
        assert!(
            (got[i] == Got::Record(1, 1) && i < at) || (at < i && i < end),
            "{got:?}"
        );
        let after = got.iter().position(|g| *g == Got::Record(0, 2)).unwrap();
        assert!(at < after, "{got:?}");
    });
}

/// One producer through a gate sends two records, a priority event and a third record while
/// the gate reads. In every execution: the records come in order, the event once and before
/// the record sent after it (the gate hands out records of a channel's turn straight from the
/// segment in hand, and must still look at the lane after each record's header).
#[test]
fn a_priority_event_overtakes_queued_records_through_a_gate() {
    common::check(2, || {
        let (mut gate, handles) = Gate::builder()
            .channels(1)
            .exclusive(2)
            .floating(0)
            .segment_size(64)
            .wait_strategy(WaitStrategy::Park)
            .create_anonymous()
            .unwrap();
        let h = handles.into_iter().next().unwrap();
        let writer = thread::spawn(move || {
            let mut tx = Producer::builder()
                .wait_strategy(WaitStrategy::Park)
                .from_handle(h)
                .unwrap();
            tx.send(&[1; 8]).unwrap();
            tx.send(&[2; 8]).unwrap();
            tx.send_priority_event(9, b"urgent").unwrap();
            tx.send(&[3; 8]).unwrap();
        });
        let mut got = Vec::new();
        while let Some(m) = gate.recv().unwrap() {
            match m {
                GateMessage::Record { record, .. } => got.push(record.as_bytes().unwrap()[0]),
                GateMessage::Event { event, .. } => {
                    assert!(event.priority);
                    assert_eq!((event.kind, event.payload), (9, &b"urgent"[..]));
                    got.push(0);
                }
                GateMessage::EndOfPartition { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        writer.join().unwrap();
        let records: Vec<u8> = got.iter().copied().filter(|&g| g != 0).collect();
        assert_eq!(records, [1, 2, 3], "{got:?}");
        assert_eq!(got.iter().filter(|&&g| g == 0).count(), 1, "{got:?}");
        let event = got.iter().position(|&g| g == 0).unwrap();
        let third = got.iter().position(|&g| g == 3).unwrap();
        assert!(
            event < third,
            "the event after a record sent after it: {got:?}"
        );
    });
}
