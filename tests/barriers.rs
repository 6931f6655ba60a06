//! Checkpoint barriers: a consumer sees them in order (and their announcements first); a gate
//! aligns them, switches to unaligned on a timeout, hands back overtaken records once, cancels
//! on a newer id, refuses ids that go backwards, and lets a channel that closes stop counting.

mod common;

use std::time::{Duration, Instant};

use common::*;
use shmflow::{
    Alignment, Gate, GateGeometry, GateMessage, Message, Producer, Released, TryRecvError,
};

fn geometry(channels: u32) -> GateGeometry {
    GateGeometry::new(channels)
        .with_exclusive(4)
        .with_floating(0)
        .with_segment_size(4096)
}

/// What a gate hands out, as text: `r<channel>:<payload>`, `i<channel>@<checkpoint>:<payload>`
/// (in flight), `B<id>:<how>`, `C<id>` (cancelled), `E<id>` (in-flight end), `end<channel>`,
/// `dead<channel>`, `err`; `None` when nothing is there now.
fn next(gate: &mut Gate) -> Option<String> {
    match gate.try_recv() {
        Ok(Some(m)) => Some(describe(m)),
        Ok(None) => Some("closed".into()),
        Err(TryRecvError::Empty) => None,
        Err(_) => Some("err".into()),
    }
}

fn describe(m: GateMessage<'_>) -> String {
    match m {
        GateMessage::Record { channel, record } => format!(
            "r{channel}:{}",
            String::from_utf8(record.to_vec().unwrap()).unwrap()
        ),
        GateMessage::InFlight {
            channel,
            checkpoint,
            record,
        } => format!(
            "i{channel}@{checkpoint}:{}",
            String::from_utf8(record.to_vec().unwrap()).unwrap()
        ),
        GateMessage::Barrier { id, released, .. } => match released {
            Released::Aligned => format!("B{id}:aligned"),
            Released::Unaligned { timed_out: true } => format!("B{id}:timeout"),
            Released::Unaligned { .. } => format!("B{id}:unaligned"),
            _ => format!("B{id}:?"),
        },
        GateMessage::BarrierCancelled { id } => format!("C{id}"),
        GateMessage::InFlightEnd { id } => format!("E{id}"),
        GateMessage::EndOfPartition { channel } => format!("end{channel}"),
        GateMessage::ChannelDead { channel, .. } => format!("dead{channel}"),
        other => format!("{other:?}"),
    }
}

/// Everything the gate has now.
fn drain(gate: &mut Gate) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(m) = next(gate) {
        let closed = m == "closed";
        out.push(m);
        if closed {
            break;
        }
    }
    out
}

#[test]
fn a_consumer_sees_barriers_in_order_and_announcements_first() {
    let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default()).unwrap();
    tx.send(b"a").unwrap();
    tx.send_barrier(1, Alignment::Aligned, b"p1").unwrap();
    tx.send(b"b").unwrap();
    tx.send_barrier(2, Alignment::Unaligned, b"").unwrap();
    tx.send(b"c").unwrap();
    tx.flush().unwrap();
    let mut seen = Vec::new();
    while let Ok(Some(m)) = rx.try_recv_message() {
        seen.push(match m {
            Message::Record(r) => String::from_utf8(r.to_vec().unwrap()).unwrap(),
            Message::Barrier(b) => {
                assert!(b.emitted_ns > 0);
                format!(
                    "B{}{}{}",
                    b.id,
                    if b.priority { "!" } else { "" },
                    String::from_utf8_lossy(b.payload)
                )
            }
            other => format!("{other:?}"),
        });
    }
    // The announcement of 2 overtakes everything not yet read; 2 itself keeps its place.
    assert_eq!(seen, ["B2!", "a", "B1p1", "b", "B2", "c"]);
    // A plain `recv` skips barriers as it skips events.
    tx.send_barrier(3, Alignment::Unaligned, b"").unwrap();
    tx.send(b"d").unwrap();
    tx.flush().unwrap();
    assert_eq!(rx.try_recv().unwrap().unwrap().to_vec().unwrap(), b"d");
}

#[test]
fn an_aligned_barrier_holds_the_channels_it_arrived_on_until_all_have_it() {
    let name = unique_name("barrier-aligned");
    let mut gate = Gate::create(&name, geometry(2)).unwrap();
    let mut a = Producer::open_channel(&name, 0).unwrap();
    let mut b = Producer::open_channel(&name, 1).unwrap();
    a.send(b"a1").unwrap();
    a.send_barrier(1, Alignment::Aligned, b"ckpt").unwrap();
    a.send(b"a2").unwrap();
    a.flush().unwrap();
    b.send(b"b1").unwrap();
    b.flush().unwrap();
    let got = drain(&mut gate);
    assert!(
        got.contains(&"r0:a1".into()) && got.contains(&"r1:b1".into()),
        "{got:?}"
    );
    assert!(
        !got.iter().any(|m| m == "r0:a2" || m.starts_with('B')),
        "held: {got:?}"
    );
    b.send_barrier(1, Alignment::Aligned, b"").unwrap();
    b.send(b"b2").unwrap();
    b.flush().unwrap();
    let got = drain(&mut gate);
    assert_eq!(got[0], "B1:aligned", "{got:?}");
    let mut rest = got[1..].to_vec();
    rest.sort();
    assert_eq!(rest, ["r0:a2", "r1:b2"]);
    // The payload comes with the release.
    a.send_barrier(2, Alignment::Aligned, b"two").unwrap();
    b.send_barrier(2, Alignment::Aligned, b"two").unwrap();
    let m = gate.recv().unwrap().unwrap();
    match m {
        GateMessage::Barrier { id: 2, payload, .. } => assert_eq!(payload, b"two"),
        other => panic!("{other:?}"),
    };
}

#[test]
fn an_unaligned_barrier_overtakes_and_hands_back_what_it_overtook_once() {
    let name = unique_name("barrier-unaligned");
    let mut gate = Gate::create(&name, geometry(2)).unwrap();
    let mut a = Producer::open_channel(&name, 0).unwrap();
    let mut b = Producer::open_channel(&name, 1).unwrap();
    for i in 0..3 {
        a.send(format!("a{i}").as_bytes()).unwrap();
        b.send(format!("b{i}").as_bytes()).unwrap();
    }
    a.send_barrier(7, Alignment::Unaligned, b"").unwrap();
    a.send(b"a-after").unwrap();
    a.flush().unwrap();
    b.flush().unwrap();
    let got = drain(&mut gate);
    // Released at once, before the queued records; channel 0's queued records come back as
    // its in-flight data up to its barrier, channel 1's until its barrier arrives.
    assert_eq!(got[0], "B7:unaligned", "{got:?}");
    let inflight0: Vec<_> = got.iter().filter(|m| m.starts_with("i0@7:")).collect();
    assert_eq!(inflight0, ["i0@7:a0", "i0@7:a1", "i0@7:a2"]);
    let inflight1: Vec<_> = got.iter().filter(|m| m.starts_with("i1@7:")).collect();
    assert_eq!(inflight1, ["i1@7:b0", "i1@7:b1", "i1@7:b2"]);
    assert!(
        got.contains(&"r0:a-after".into()),
        "after its barrier: a plain record"
    );
    assert!(
        !got.iter().any(|m| m.starts_with('E')),
        "channel 1 has not had 7 yet"
    );
    b.send(b"b3").unwrap();
    b.send_barrier(7, Alignment::Unaligned, b"").unwrap();
    b.send(b"b-after").unwrap();
    b.flush().unwrap();
    let got = drain(&mut gate);
    assert_eq!(got, ["i1@7:b3", "E7", "r1:b-after"]);
}

#[test]
fn an_alignment_timeout_switches_to_unaligned() {
    let name = unique_name("barrier-timeout");
    let mut gate = Gate::create(&name, geometry(2)).unwrap();
    let mut a = Producer::open_channel(&name, 0).unwrap();
    let mut b = Producer::open_channel(&name, 1).unwrap();
    let t = Duration::from_millis(50);
    // (The timeout counts from the barrier's sending: the clock is read before it.)
    let start = Instant::now();
    a.send_barrier(3, Alignment::AlignedWithTimeout(t), b"")
        .unwrap();
    a.send(b"a-after").unwrap();
    a.flush().unwrap();
    b.send(b"b0").unwrap();
    b.flush().unwrap();
    // Aligning: channel 1's record is read, channel 0's is held; then the timeout passes.
    let mut got = Vec::new();
    while !got.iter().any(|m: &String| m.starts_with("B3")) {
        if let Some(m) = gate.recv_timeout(Duration::from_secs(5)).unwrap() {
            got.push(describe(m));
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{got:?}");
    }
    got.extend(drain(&mut gate));
    assert!(start.elapsed() >= t, "not before the timeout");
    let i = got
        .iter()
        .position(|m| m == "B3:timeout")
        .expect("switched");
    assert!(
        !got[..i].contains(&"r0:a-after".into()),
        "held until the switch: {got:?}"
    );
    b.send(b"b1").unwrap();
    b.send_barrier(3, Alignment::AlignedWithTimeout(t), b"")
        .unwrap();
    b.flush().unwrap();
    let got = drain(&mut gate);
    assert!(
        got.contains(&"i1@3:b1".into()) && got.ends_with(&["E3".into()]),
        "{got:?}"
    );
}

#[test]
fn a_newer_barrier_cancels_and_an_older_one_is_ignored() {
    let name = unique_name("barrier-cancel");
    let mut gate = Gate::create(&name, geometry(2)).unwrap();
    let mut a = Producer::open_channel(&name, 0).unwrap();
    let mut b = Producer::open_channel(&name, 1).unwrap();
    a.send_barrier(1, Alignment::Aligned, b"").unwrap();
    a.send(b"a1").unwrap();
    a.send_barrier(2, Alignment::Aligned, b"").unwrap();
    a.flush().unwrap();
    assert!(drain(&mut gate).is_empty(), "channel 0 held at 1");
    // Channel 1 skipped checkpoint 1: its 2 cancels 1, releasing channel 0, whose 2 then
    // completes checkpoint 2.
    b.send_barrier(2, Alignment::Aligned, b"").unwrap();
    b.flush().unwrap();
    assert_eq!(drain(&mut gate), ["C1", "r0:a1", "B2:aligned"]);
}

#[test]
fn a_barrier_id_that_goes_backwards_closes_its_channel() {
    let name = unique_name("barrier-backwards");
    let mut gate = Gate::create(&name, geometry(1)).unwrap();
    let mut a = Producer::open_channel(&name, 0).unwrap();
    a.send_barrier(5, Alignment::Aligned, b"").unwrap();
    a.send_barrier(4, Alignment::Aligned, b"").unwrap();
    a.flush().unwrap();
    assert_eq!(
        gate.recv()
            .unwrap()
            .map(|m| format!("{m:?}").starts_with("Barrier")),
        Some(true)
    );
    let e = gate.recv().unwrap_err();
    assert!(e.to_string().contains("barrier id"), "{e}");
    assert!(gate.recv().unwrap().is_none(), "its only channel is closed");
}

#[test]
fn a_channel_that_ends_during_alignment_no_longer_counts() {
    let name = unique_name("barrier-end");
    let mut gate = Gate::create(&name, geometry(2)).unwrap();
    let mut a = Producer::open_channel(&name, 0).unwrap();
    let b = Producer::open_channel(&name, 1).unwrap();
    a.send_barrier(1, Alignment::Aligned, b"").unwrap();
    a.send(b"a1").unwrap();
    a.flush().unwrap();
    assert!(drain(&mut gate).is_empty());
    drop(b);
    assert_eq!(drain(&mut gate), ["end1", "B1:aligned", "r0:a1"]);
}

#[test]
fn a_gate_publishes_its_checkpoints_figures() {
    let name = unique_name("barrier-figures");
    let mut gate = Gate::create(&name, geometry(2)).unwrap();
    let mut a = Producer::open_channel(&name, 0).unwrap();
    let mut b = Producer::open_channel(&name, 1).unwrap();
    assert_eq!(gate.metrics().checkpoints, Default::default());
    // Aligned: channel 0 is held with three records behind its barrier.
    a.send_barrier(1, Alignment::Aligned, b"").unwrap();
    for _ in 0..3 {
        a.send(b"held").unwrap();
    }
    a.flush().unwrap();
    assert!(drain(&mut gate).is_empty());
    std::thread::sleep(Duration::from_millis(20));
    b.send_barrier(1, Alignment::Aligned, b"").unwrap();
    assert_eq!(drain(&mut gate)[0], "B1:aligned");
    let k = gate.metrics().checkpoints;
    assert_eq!((k.released, k.last_id), (1, 1));
    assert_eq!(k.last_released, Some(Released::Aligned));
    assert!(k.checkpoint_alignment_time_ns >= 20_000_000, "{k:?}");
    assert!(
        k.checkpoint_start_delay_nanos >= k.checkpoint_alignment_time_ns,
        "{k:?}"
    );
    assert_eq!((k.last_held_records, k.last_held_bytes), (3, 12), "{k:?}");
    let m = gate.metrics();
    assert_eq!(
        (m.channels[0].held_records, m.channels[1].held_records),
        (3, 0)
    );
    // Unaligned: two records overtaken on channel 1; a newer id cancels it.
    b.send(b"x1").unwrap();
    b.send(b"x2").unwrap();
    b.send_barrier(2, Alignment::Unaligned, b"").unwrap();
    assert_eq!(drain(&mut gate), ["B2:unaligned", "i1@2:x1", "i1@2:x2"]);
    a.send_barrier(3, Alignment::Aligned, b"").unwrap();
    b.send_barrier(3, Alignment::Aligned, b"").unwrap();
    let got = drain(&mut gate);
    assert!(
        got.contains(&"C2".into()) && got.contains(&"B3:aligned".into()),
        "{got:?}"
    );
    let m = gate.metrics();
    let k = &m.checkpoints;
    assert_eq!((k.released, k.cancelled, k.last_id), (3, 1, 3), "{k:?}");
    assert_eq!((k.inflight_records, k.inflight_bytes), (2, 4), "{k:?}");
    assert_eq!(
        (m.channels[1].inflight_records, m.channels[1].inflight_bytes),
        (2, 4)
    );
}

#[test]
fn an_unaligned_barrier_that_overtakes_an_older_one_subsumes_it() {
    let name = unique_name("barrier-subsume");
    let mut gate = Gate::create(&name, geometry(1)).unwrap();
    let mut a = Producer::open_channel(&name, 0).unwrap();
    a.send(b"a0").unwrap();
    a.send_barrier(1, Alignment::Aligned, b"").unwrap();
    a.send(b"a1").unwrap();
    a.send_barrier(2, Alignment::Unaligned, b"").unwrap();
    a.send(b"a2").unwrap();
    a.flush().unwrap();
    // 2's announcement overtakes 1: checkpoint 1 never begins here and is not reported.
    assert_eq!(
        drain(&mut gate),
        ["B2:unaligned", "i0@2:a0", "i0@2:a1", "E2", "r0:a2"]
    );
}

/// A gate with channel 0 held by a barrier with a 50 ms alignment timeout and channel 1 idle.
fn held_with_timeout(tag: &str) -> (Gate, Producer, Producer, Instant) {
    let name = unique_name(tag);
    let gate = Gate::create(&name, geometry(2)).unwrap();
    let mut a = Producer::open_channel(&name, 0).unwrap();
    let b = Producer::open_channel(&name, 1).unwrap();
    let start = Instant::now();
    a.send_barrier(
        1,
        Alignment::AlignedWithTimeout(Duration::from_millis(50)),
        b"",
    )
    .unwrap();
    a.send(b"held").unwrap();
    a.flush().unwrap();
    (gate, a, b, start)
}

#[test]
fn a_blocking_recv_wakes_for_the_switch() {
    let (mut gate, _a, _b, start) = held_with_timeout("barrier-switch-recv");
    let m = describe(gate.recv().unwrap().unwrap());
    assert_eq!(m, "B1:timeout");
    assert!(start.elapsed() >= Duration::from_millis(50));
    assert_eq!(describe(gate.recv().unwrap().unwrap()), "r0:held");
}

#[test]
fn try_recv_switches_once_the_timeout_passed() {
    let (mut gate, _a, _b, start) = held_with_timeout("barrier-switch-try");
    let mut got = Vec::new();
    while got.is_empty() {
        got = drain(&mut gate);
        assert!(start.elapsed() < Duration::from_secs(10), "never switched");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(start.elapsed() >= Duration::from_millis(50));
    assert_eq!(got, ["B1:timeout", "r0:held"]);
}

#[cfg(feature = "tokio")]
#[test]
fn recv_async_wakes_for_the_switch() {
    let (mut gate, _a, _b, start) = held_with_timeout("barrier-switch-async");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let m = rt.block_on(async {
        let m = gate.recv_async().await.unwrap().unwrap();
        describe(m)
    });
    assert_eq!(m, "B1:timeout");
    assert!(start.elapsed() >= Duration::from_millis(50));
}

#[test]
fn priority_events_of_a_held_channel_still_overtake() {
    let name = unique_name("barrier-prio");
    let mut gate = Gate::create(&name, geometry(2)).unwrap();
    let mut a = Producer::open_channel(&name, 0).unwrap();
    let mut b = Producer::open_channel(&name, 1).unwrap();
    a.send_barrier(1, Alignment::Aligned, b"").unwrap();
    a.send(b"after").unwrap();
    a.flush().unwrap();
    assert!(drain(&mut gate).is_empty(), "held");
    // A priority event sent while the channel is held overtakes its held data (and the hold);
    // an ordinary event waits behind the hold, in its place.
    a.send_event(5, b"in place").unwrap();
    a.send_priority_event(6, b"now").unwrap();
    a.flush().unwrap();
    let got = drain(&mut gate);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].contains("kind: 6"), "{got:?}");
    b.send_barrier(1, Alignment::Aligned, b"").unwrap();
    let got = drain(&mut gate);
    assert_eq!(
        got[..2],
        ["B1:aligned".to_string(), "r0:after".to_string()],
        "{got:?}"
    );
    assert!(got[2].contains("kind: 5"), "{got:?}");
}

#[test]
fn a_partition_barrier_that_stopped_part_way_reaches_the_rest_once() {
    let name = unique_name("barrier-partition-retry");
    let mut gate = Gate::create(&name, geometry(2)).unwrap();
    let a = Producer::open_channel(&name, 0).unwrap();
    let b = Producer::open_channel(&name, 1).unwrap();
    let mut part = shmflow::Partition::new(vec![a, b], shmflow::Partitioner::RoundRobin).unwrap();
    // Fill channel 1: every segment holds a record the gate has not read.
    let mut filled = 0;
    while part.try_send_to(1, &[7u8; 3000]).is_ok() {
        filled += 1;
    }
    assert!(filled > 0);
    let r = part.try_send_barrier(1, Alignment::Aligned, b"");
    assert!(matches!(r, Err(shmflow::TrySendError::Full)), "{r:?}");
    let r = part.send_barrier_timeout(1, Alignment::Aligned, b"", Duration::from_millis(20));
    assert!(
        matches!(r, Err(shmflow::SendTimeoutError::Timeout)),
        "{r:?}"
    );
    // Channel 0 has the barrier and is held; channel 1's records come through.
    let got = drain(&mut gate);
    assert_eq!(got.len(), filled, "{got:?}");
    assert!(got.iter().all(|m| m.starts_with("r1:")), "{got:?}");
    // Again with the same id: only channel 1 takes it (a second barrier 1 on channel 0 would
    // be its protocol error, and close it).
    part.send_barrier(1, Alignment::Aligned, b"").unwrap();
    part.send_to(0, b"after").unwrap();
    part.flush_timeout(Duration::from_secs(5)).unwrap();
    let got = drain(&mut gate);
    assert_eq!(got, ["B1:aligned", "r0:after"]);
    assert!(gate.is_open(0) && gate.is_open(1));
}

#[test]
fn a_partitions_try_forms_of_broadcast_events_reach_every_channel_or_none() {
    let name = unique_name("partition-try-events");
    let mut gate = Gate::create(&name, geometry(2)).unwrap();
    let a = Producer::open_channel(&name, 0).unwrap();
    let b = Producer::open_channel(&name, 1).unwrap();
    let mut part = shmflow::Partition::new(vec![a, b], shmflow::Partitioner::RoundRobin).unwrap();
    // Channel 1's segments all hold records the gate has not read, and its lane is full.
    while part.try_send_to(1, &[7u8; 3000]).is_ok() {}
    while part.output(1).try_send_priority_event(1, b"p").is_ok() {}
    let r = part.try_send_event(9, b"all");
    assert!(matches!(r, Err(shmflow::TrySendError::Full)), "{r:?}");
    let r = part.try_send_priority_event(8, b"all");
    assert!(matches!(r, Err(shmflow::TrySendError::Full)), "{r:?}");
    let r = part.try_forward_barrier(3, Alignment::Aligned, 1, b"");
    assert!(matches!(r, Err(shmflow::TrySendError::Full)), "{r:?}");
    part.flush().unwrap();
    // Channel 0 got neither event (and the barrier, which goes channel by channel).
    let got = drain(&mut gate);
    assert!(
        !got.iter()
            .any(|m| m.contains("Event") && m.contains("kind: 9") || m.contains("kind: 8")),
        "{got:?}"
    );
    assert!(got.iter().all(|m| !m.starts_with("r0:")), "{got:?}");
    // Room again: both reach both channels, and the barrier the channel that lacked it.
    part.try_send_event(9, b"all").unwrap();
    part.try_send_priority_event(8, b"all").unwrap();
    part.forward_barrier_timeout(3, Alignment::Aligned, 1, b"", Duration::from_secs(5))
        .unwrap();
    part.flush().unwrap();
    let got = drain(&mut gate);
    let events = |kind: &str| got.iter().filter(|m| m.contains(kind)).count();
    assert_eq!((events("kind: 9"), events("kind: 8")), (2, 2), "{got:?}");
    assert_eq!(
        got.iter().filter(|m| *m == "B3:aligned").count(),
        1,
        "{got:?}"
    );
}
