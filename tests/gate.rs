//! Gates: many producers into one consumer, with exclusive and floating segments.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use shmflow::{
    Gate, GateGeometry, GateMessage, OpenError, Partition, Partitioner, Producer, SendError,
    SendTimeoutError, TryRecvError, TrySendError,
};

fn small(channels: u32, exclusive: u32, floating: u32) -> GateGeometry {
    GateGeometry::new(channels)
        .with_exclusive(exclusive)
        .with_floating(floating)
        .with_segment_size(4096)
}

#[test]
fn records_from_every_channel_arrive_in_order_per_channel_then_end() {
    let name = unique_name("gate-basic");
    let mut gate = Gate::create(&name, small(3, 2, 4)).unwrap();
    let mut ps: Vec<Producer> = (0..3)
        .map(|c| Producer::open_channel(&name, c).unwrap())
        .collect();
    let n = 5_000u64;
    let writers: Vec<_> = ps
        .drain(..)
        .enumerate()
        .map(|(c, mut p)| {
            std::thread::spawn(move || {
                for i in 0..n {
                    let mut rec = (c as u64).to_le_bytes().to_vec();
                    rec.extend_from_slice(&i.to_le_bytes());
                    rec.resize(16 + (i as usize % 300), c as u8);
                    p.send(&rec).unwrap();
                }
            })
        })
        .collect();
    let mut next = [0u64; 3];
    let mut ended = [false; 3];
    assert!(!gate.is_closed());
    while let Some(m) = gate.recv().unwrap() {
        match m {
            GateMessage::Record { channel, record } => {
                let b = record.as_bytes().unwrap();
                assert_eq!(
                    u64::from_le_bytes(b[..8].try_into().unwrap()),
                    channel as u64
                );
                assert_eq!(
                    u64::from_le_bytes(b[8..16].try_into().unwrap()),
                    next[channel as usize]
                );
                assert!(b[16..].iter().all(|&x| x == channel as u8));
                next[channel as usize] += 1;
            }
            GateMessage::EndOfPartition { channel } => {
                assert_eq!(next[channel as usize], n, "end comes after every record");
                assert!(!ended[channel as usize]);
                ended[channel as usize] = true;
            }
            other => panic!("unexpected message on channel {:?}", other.channel()),
        }
    }
    assert_eq!(ended, [true; 3]);
    assert!(gate.is_closed(), "every channel has ended");
    for w in writers {
        w.join().unwrap();
    }
    // Every floating segment is back in the pool.
    assert_eq!(gate.floating_free(), 4);
}

#[test]
fn a_single_channel_open_of_a_gate_names_what_it_is() {
    let name = unique_name("gate-magic");
    let _gate = Gate::create(&name, small(2, 2, 2)).unwrap();
    let e = shmflow::Consumer::open(&name).err().unwrap();
    assert!(matches!(e, OpenError::BadMagic { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("is a shmflow gate, not a shmflow channel"),
        "{e}"
    );
    let e = Producer::open_channel(&name, 2).err().unwrap();
    assert!(
        matches!(
            e,
            OpenError::InvalidConfig(ref c) if c.field() == "channel"
        ),
        "{e}"
    );
    let _p = Producer::open_channel(&name, 1).unwrap();
    assert!(matches!(
        Producer::open_channel(&name, 1),
        Err(OpenError::AlreadyAttached { .. })
    ));
}

#[test]
fn partition_round_robin_key_and_broadcast() {
    let name = unique_name("gate-part");
    let mut gate = Gate::create(&name, small(3, 2, 2)).unwrap();
    let outs = |name: &str| {
        (0..3)
            .map(|c| Producer::open_channel(name, c).unwrap())
            .collect()
    };
    let mut rr = Partition::new(outs(&name), Partitioner::RoundRobin).unwrap();
    for i in 0..6u8 {
        rr.send(&[i]).unwrap();
    }
    rr.flush().unwrap();
    let mut got = HashMap::<u32, Vec<u8>>::new();
    for _ in 0..6 {
        match gate.recv_timeout(Duration::from_secs(5)).unwrap().unwrap() {
            GateMessage::Record { channel, record } => got
                .entry(channel)
                .or_default()
                .push(record.as_bytes().unwrap()[0]),
            _ => panic!("records only"),
        }
    }
    assert_eq!(got[&0], vec![0, 3]);
    assert_eq!(got[&1], vec![1, 4]);
    assert_eq!(got[&2], vec![2, 5]);
    let mut producers = rr.into_outputs();
    // Broadcast: every channel gets the record.
    let mut bc = Partition::new(std::mem::take(&mut producers), Partitioner::Broadcast).unwrap();
    bc.try_send(b"all").unwrap();
    bc.send(b"all2").unwrap();
    bc.flush().unwrap();
    let mut seen = [0; 3];
    for _ in 0..6 {
        if let GateMessage::Record { channel, record } =
            gate.recv_timeout(Duration::from_secs(5)).unwrap().unwrap()
        {
            let b = record.as_bytes().unwrap();
            assert!(b == b"all" || b == b"all2");
            seen[channel as usize] += 1;
        }
    }
    assert_eq!(seen, [2, 2, 2]);
    // By key: the same key always goes to the same channel.
    let mut by_key = Partition::new(
        bc.into_outputs(),
        Partitioner::Key(Box::new(|r: &[u8]| r[0] as u64)),
    )
    .unwrap();
    for k in [5u8, 7, 5, 9, 7, 5] {
        by_key.send(&[k]).unwrap();
    }
    by_key.flush().unwrap();
    for _ in 0..6 {
        if let GateMessage::Record { channel, record } =
            gate.recv_timeout(Duration::from_secs(5)).unwrap().unwrap()
        {
            assert_eq!(record.as_bytes().unwrap()[0] as u32 % 3, channel);
        }
    }
}

/// Fills channel `p` until it has no free segment (no gate is reading, so nothing is lent).
fn fill(p: &mut Producer, tag: u8) -> usize {
    let mut n = 0;
    loop {
        match p.try_send(&[tag; 24]) {
            Ok(()) => n += 1,
            Err(TrySendError::Full) => return n,
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn partition_send_timeout_waits_for_the_routed_channel_only() {
    let name = unique_name("gate-part-timeout");
    let gate = Gate::create(&name, small(2, 2, 0)).unwrap();
    let outs = (0..2)
        .map(|c| Producer::open_channel(&name, c).unwrap())
        .collect();
    let mut part =
        Partition::new(outs, Partitioner::Key(Box::new(|r: &[u8]| r[0] as u64))).unwrap();
    let n = fill(part.output(0), 0);
    assert!(n > 0);
    // Channel 0 is full and nobody reads: its key times out, the other channel's does not.
    let start = std::time::Instant::now();
    assert!(matches!(
        part.send_timeout(&[0; 24], Duration::from_millis(40)),
        Err(SendTimeoutError::Timeout)
    ));
    assert!(start.elapsed() >= Duration::from_millis(40));
    part.send_timeout(&[1; 24], Duration::from_millis(40))
        .unwrap();
    assert!(gate.is_open(0));
}

#[test]
fn a_busy_channel_does_not_starve_another() {
    let name = unique_name("gate-fair");
    let mut gate = Gate::create(&name, small(3, 2, 0)).unwrap();
    let mut ps: Vec<Producer> = (0..3)
        .map(|c| Producer::open_channel(&name, c).unwrap())
        .collect();
    // Channel 0 holds far more than the others; all three have data before reading starts.
    let counts: Vec<usize> = ps
        .iter_mut()
        .enumerate()
        .map(|(c, p)| fill(p, c as u8))
        .collect();
    for p in &mut ps {
        p.flush().unwrap();
    }
    let mut left = counts.clone();
    let mut run = (u32::MAX, 0usize);
    let mut longest_run_while_others_wait = 0;
    while left.iter().any(|&n| n > 0) {
        let Some(GateMessage::Record { channel, record }) =
            gate.recv_timeout(Duration::from_secs(5)).unwrap()
        else {
            panic!("records only")
        };
        assert_eq!(record.as_bytes().unwrap(), &[channel as u8; 24]);
        left[channel as usize] -= 1;
        run = if run.0 == channel {
            (channel, run.1 + 1)
        } else {
            (channel, 1)
        };
        let others_waiting = left
            .iter()
            .enumerate()
            .any(|(c, &n)| c != channel as usize && n > 0);
        if others_waiting {
            longest_run_while_others_wait = longest_run_while_others_wait.max(run.1);
        }
    }
    assert!(counts
        .iter()
        .all(|&n| n > shmflow::tuning::QUANTUM as usize));
    assert!(
        longest_run_while_others_wait <= shmflow::tuning::QUANTUM as usize,
        "a channel was read {longest_run_while_others_wait} times in a row while others had data"
    );
}

#[test]
fn floating_segments_go_to_the_channel_that_asks_and_all_come_back() {
    let name = unique_name("gate-float");
    let floating = 6;
    let mut gate = Gate::create(&name, small(3, 2, floating)).unwrap();
    let mut hot = Producer::open_channel(&name, 0).unwrap();
    let cold: Vec<Producer> = (1..3)
        .map(|c| Producer::open_channel(&name, c).unwrap())
        .collect();
    // The hot channel fills its exclusive segments and asks; the gate lends it floating ones
    // between turns (at least once every QUANTUM + 1 receives; each receive here takes a
    // record of the hot channel at most).
    let mut sent = fill(&mut hot, 0);
    let mut lent_seen = 0;
    for _ in 0..floating * 2 {
        for _ in 0..=shmflow::tuning::QUANTUM {
            assert!(matches!(
                gate.try_recv(),
                Ok(Some(_)) | Err(TryRecvError::Empty)
            ));
        }
        sent += fill(&mut hot, 0);
        let m = gate.metrics();
        lent_seen = lent_seen.max(m.channels[0].floating_held);
        assert_eq!(m.channels[1].floating_held + m.channels[2].floating_held, 0);
        assert!(m.channels[0].floating_held + m.floating_free == floating as u64);
    }
    assert!(lent_seen > 0, "the hot channel was lent floating segments");
    let m = gate.metrics();
    assert!(m.input_floating_buffers_usage() > 0.5);
    assert!(m.likely_skew(), "floating high, exclusive low: skew");
    drop(hot);
    drop(cold);
    let mut got = 0;
    let mut ends = 0;
    while let Some(msg) = gate.recv().unwrap() {
        match msg {
            GateMessage::Record { channel: 0, .. } => got += 1,
            GateMessage::EndOfPartition { .. } => ends += 1,
            _ => panic!("unexpected"),
        }
    }
    // try_recv above may have handed out a few records already.
    assert!(got <= sent && ends == 3);
    let m = gate.metrics();
    assert_eq!(
        m.floating_free, floating as u64,
        "every floating segment came back"
    );
    assert!(m.channels.iter().all(|c| c.floating_held == 0));
    assert_eq!(gate.floating_free(), floating as usize);
}

#[test]
fn a_producer_without_exclusive_or_floating_segments_blocks() {
    let name = unique_name("gate-block");
    let mut gate = Gate::create(&name, small(2, 2, 1)).unwrap();
    let mut p0 = Producer::open_channel(&name, 0).unwrap();
    let mut p1 = Producer::open_channel(&name, 1).unwrap();
    // p0 takes its two segments and the only floating one.
    fill(&mut p0, 0);
    while gate.floating_free() > 0 {
        let _ = gate.try_recv();
        fill(&mut p0, 0);
    }
    // p1 has only its exclusive segments, and nothing to borrow.
    fill(&mut p1, 1);
    assert!(matches!(
        p1.send_timeout(&[1; 24], Duration::from_millis(100)),
        Err(SendTimeoutError::Timeout)
    ));
    assert!(gate.metrics().channels[1].backlog > 0, "it asked");
    p1.flush().unwrap();
    p0.flush().unwrap();
    // Reading frees p1's first segment: its blocked send goes through.
    let t = std::thread::spawn(move || {
        p1.send(&[1; 24]).unwrap();
        p1
    });
    let mut from1 = 0;
    while !t.is_finished() {
        if let Ok(Some(GateMessage::Record { channel: 1, .. })) = gate.try_recv() {
            from1 += 1;
        }
    }
    assert!(from1 > 0);
    drop(t.join().unwrap());
}

#[test]
fn events_keep_their_place_and_priority_events_overtake() {
    let name = unique_name("gate-events");
    let mut gate = Gate::create(&name, small(1, 2, 0)).unwrap();
    let mut p = Producer::open_channel(&name, 0).unwrap();
    for i in 0..5u8 {
        p.send(&[i]).unwrap();
    }
    p.send_event(7, b"marker").unwrap();
    for i in 5..10u8 {
        p.send(&[i]).unwrap();
    }
    p.flush().unwrap();
    // Sent after ten records and an event, all still queued: it comes first.
    p.send_priority_event(99, b"barrier").unwrap();
    p.send(&[10]).unwrap();
    drop(p);
    let mut seen = Vec::new();
    while let Some(m) = gate.recv().unwrap() {
        seen.push(match m {
            GateMessage::Record { record, .. } => format!("r{}", record.as_bytes().unwrap()[0]),
            GateMessage::Event { event, .. } => format!(
                "{}{}:{}",
                if event.priority { "P" } else { "e" },
                event.kind,
                String::from_utf8_lossy(event.payload)
            ),
            GateMessage::EndOfPartition { channel } => format!("end{channel}"),
            other => panic!("unexpected message {other:?}"),
        });
    }
    assert_eq!(
        seen,
        [
            "P99:barrier",
            "r0",
            "r1",
            "r2",
            "r3",
            "r4",
            "e7:marker",
            "r5",
            "r6",
            "r7",
            "r8",
            "r9",
            "r10",
            "end0"
        ]
    );
}

#[test]
fn plain_recv_skips_events_and_recv_message_sees_them() {
    let name = unique_name("events-single");
    let mut p = Producer::create(&name, shmflow::Geometry::default()).unwrap();
    let mut c2 = shmflow::Consumer::open(&name).unwrap();
    p.send_priority_event(1, &[]).unwrap();
    p.send(b"a").unwrap();
    p.send_event(2, &[0xEE; shmflow::MAX_EVENT_PAYLOAD])
        .unwrap();
    p.send(b"b").unwrap();
    assert!(matches!(
        p.send_event(3, &[0; shmflow::MAX_EVENT_PAYLOAD + 1]),
        Err(SendError::RecordTooLarge(_))
    ));
    p.flush().unwrap();
    // Many priority events: the lane holds four; the rest wait for the consumer.
    let t = std::thread::spawn(move || {
        for k in 10..20 {
            p.send_priority_event(k, &k.to_le_bytes()).unwrap();
        }
        p
    });
    let mut kinds = Vec::new();
    let mut records = Vec::new();
    while kinds.len() < 12 || records.len() < 2 {
        match c2
            .recv_message_timeout(Duration::from_secs(5))
            .unwrap()
            .unwrap()
        {
            shmflow::Message::Event(e) => kinds.push(e.kind),
            shmflow::Message::Record(r) => records.push(r.to_vec().unwrap()),
            other => panic!("unexpected message {other:?}"),
        }
    }
    let p = t.join().unwrap();
    assert_eq!(records, [b"a".to_vec(), b"b".to_vec()]);
    let prio: Vec<u32> = kinds.iter().copied().filter(|&k| k != 2).collect();
    assert_eq!(prio, [1, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]);
    assert!(kinds.contains(&2));
    // Plain recv: records only.
    let mut p = p;
    p.send_event(4, b"x").unwrap();
    p.send_priority_event(5, b"y").unwrap();
    p.send(b"c").unwrap();
    drop(p);
    assert_eq!(c2.recv().unwrap().unwrap().to_vec().unwrap(), b"c");
    assert!(c2.recv().unwrap().is_none());
}

#[test]
fn a_record_over_the_gates_limit_is_skipped_and_its_channel_goes_on() {
    let name = unique_name("gate-too-large");
    let mut gate = Gate::create(&name, small(2, 2, 2)).unwrap();
    gate.set_max_record_len(1000);
    let mut p = Producer::open_channel(&name, 0).unwrap();
    p.send(&[1u8; 5000]).unwrap(); // spans two segments, over the limit
    p.send(b"after").unwrap();
    p.flush().unwrap();
    match gate.recv() {
        Err(shmflow::RecvError::RecordTooLarge(e)) => assert_eq!(e.max(), 1000),
        Err(e) => panic!("expected RecordTooLarge, got {e}"),
        Ok(m) => panic!("expected RecordTooLarge, got {m:?}"),
    }
    assert!(gate.is_open(0), "the channel goes on");
    match gate.recv().unwrap().expect("the next record") {
        GateMessage::Record { channel, record } => {
            assert_eq!(channel, 0);
            assert_eq!(record.as_bytes(), Some(&b"after"[..]));
        }
        other => panic!("expected the record after, got {other:?}"),
    }
    drop(p);
    assert!(matches!(
        gate.recv().unwrap(),
        Some(GateMessage::EndOfPartition { channel: 0 })
    ));
}

/// Writes a kind no shmflow writes into the frame header (the 8 bytes before the payload) of
/// the record that starts with `MARKER-012345678` in region `name`.
fn scribble_on_the_marked_frame(name: &str) {
    let mut map = common::map_region_mut(name);
    let at = map
        .windows(16)
        .position(|w| w == &b"MARKER-0123456789"[..16])
        .expect("the marked record is in the region");
    map[at - 8..at].copy_from_slice(&0x1234_5678_0000_0010u64.to_le_bytes());
}

/// The producer of a channel the gate closed is told: a send (which soon needs a segment)
/// fails with `Closed`.
fn assert_told_closed(p: &mut Producer) {
    let mut err = None;
    for _ in 0..8 {
        if let Err(e) = p.send_timeout(&[1u8; 3000], Duration::from_millis(100)) {
            err = Some(e);
            break;
        }
    }
    assert!(
        matches!(err, Some(SendTimeoutError::Closed(_))),
        "the producer is told: {err:?}"
    );
}

#[test]
fn a_channel_that_breaks_the_protocol_is_closed_at_the_next_receive_while_another_streams() {
    let name = unique_name("gate-broken-busy");
    let mut gate = Gate::create(&name, small(2, 2, 0)).unwrap();
    let mut busy = Producer::open_channel(&name, 0).unwrap();
    let mut broken = Producer::open_channel(&name, 1).unwrap();
    busy.set_flush_policy(shmflow::FlushPolicy::EveryRecord);
    broken.set_flush_policy(shmflow::FlushPolicy::EveryRecord);
    for i in 0..30u8 {
        busy.send(&[i; 16]).unwrap();
    }
    let mut rec = [0u8; 64];
    rec[..16].copy_from_slice(&b"MARKER-0123456789"[..16]);
    broken.send(&rec).unwrap();
    scribble_on_the_marked_frame(&name);
    // Channel 0's records come a turn at a time; channel 1's turn finds the broken frame.
    let mut read = 0;
    loop {
        match gate.try_recv() {
            Ok(Some(GateMessage::Record { channel: 0, .. })) => read += 1,
            Err(TryRecvError::Corrupt(_)) => break,
            other => panic!("after {read} records: {other:?}"),
        }
        assert!(read <= shmflow::tuning::QUANTUM, "channel 1's turn came");
    }
    // The very next receive, a record of channel 0's new turn, closes channel 1 first: its
    // producer is told.
    assert!(matches!(
        gate.try_recv(),
        Ok(Some(GateMessage::Record { channel: 0, .. }))
    ));
    assert_told_closed(&mut broken);
}

#[test]
fn a_channel_that_breaks_the_protocol_is_closed_and_keeps_its_floating_segments() {
    let name = unique_name("gate-broken");
    let mut gate = Gate::create(&name, small(1, 1, 2)).unwrap();
    let mut p = Producer::open_channel(&name, 0).unwrap();
    p.set_flush_policy(shmflow::FlushPolicy::EveryRecord);
    p.send(b"first").unwrap();
    // The only exclusive segment is in the data ring: the next segment must be a loan.
    assert!(matches!(p.try_send(&[0u8; 4085]), Err(TrySendError::Full)));
    match gate.try_recv().unwrap().expect("the first record") {
        GateMessage::Record { record, .. } => assert_eq!(record.as_bytes(), Some(&b"first"[..])),
        other => panic!("{other:?}"),
    }
    assert_eq!(gate.floating_free(), 1, "one floating segment lent");
    // Now in the floating segment, with a marker to find it by.
    let mut rec = vec![0u8; 4085];
    rec[..16].copy_from_slice(b"MARKER-0123456789"[..16].as_ref());
    p.send(&rec).unwrap();
    // Scribble on its frame header (the 8 bytes before the payload): a kind no shmflow writes.
    scribble_on_the_marked_frame(&name);
    assert!(matches!(gate.try_recv(), Err(TryRecvError::Corrupt(_))));
    // The next call closes the channel: its producer may still write the floating segment it
    // holds, so that segment stays out of the pool, and the producer is told to stop.
    assert!(matches!(
        gate.try_recv(),
        Ok(None) | Err(TryRecvError::Empty)
    ));
    assert!(!gate.is_open(0));
    assert_eq!(
        gate.floating_free(),
        1,
        "the broken channel's loan stays out"
    );
    assert_told_closed(&mut p);
}
