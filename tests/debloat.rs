//! Buffer debloating across processes: a producer in a child process streams records while
//! this process reads them at a chosen pace with a debloating target. The cap falls to what
//! the consumer reads in the target time, keeps the producer's in-flight segments within it,
//! rises again when the consumer speeds up, lets a held-back producer go when it lifts, and a
//! dead consumer still reads as dead to a producer it holds back. Every record arrives whole
//! and in order throughout. (Figures, never timings, are asserted: the bounds below are loose
//! enough for a loaded machine.)

mod common;

use std::time::{Duration, Instant};

use common::{check_record, child_main, make_record, role, spawn, FD_VAR};
use shmflow::{Consumer, Gate, GateMessage, Geometry, Producer, SendError};

const LEN: usize = 1000;
const SEG: u32 = 64 * 1024;

fn geometry() -> Geometry {
    Geometry {
        segment_size: SEG,
        segment_count: 16,
    }
}

/// The producer child: sends numbered records until the consumer leaves.
fn stream(mut p: Producer) -> Result<(), String> {
    let mut buf = Vec::new();
    for seq in 0.. {
        make_record(seq, LEN, &mut buf);
        match p.send(&buf) {
            Ok(()) => {}
            Err(SendError::Closed(_)) => return Ok(()),
            Err(e) => return Err(format!("record {seq}: {e}")),
        }
    }
    Ok(())
}

/// Reads records in order, spending `work` per record (busy, as a costly operator would);
/// returns when `until` says so (looked at every record).
fn read(
    c: &mut Consumer,
    next: &mut u64,
    work: Duration,
    mut until: impl FnMut(&Consumer, u64) -> bool,
) -> Result<(), String> {
    let mut scratch = Vec::new();
    loop {
        let r = c
            .recv()
            .map_err(|e| e.to_string())?
            .ok_or("the stream ended")?;
        let bytes = r.as_bytes().ok_or("a record spans segments")?;
        check_record(*next, LEN, bytes, &mut scratch)?;
        drop(r);
        *next += 1;
        let t = Instant::now();
        while t.elapsed() < work {
            std::hint::spin_loop();
        }
        if until(c, *next) {
            return Ok(());
        }
    }
}

/// Reads slowly (about 5 MB/s: 200 µs per 1000-byte record) for at least `at_least`, then
/// until the cap has settled low for 300 ms; returns the most segments seen in flight while
/// it was settled, from the first look that found the in-flight segments within it (those
/// taken under an earlier, higher cap are read first).
fn read_slowly(c: &mut Consumer, next: &mut u64, at_least: Duration) -> Result<u64, String> {
    let start = Instant::now();
    // (since, cap, the in-flight segments came within it)
    let mut settled: Option<(Instant, u64, bool)> = None;
    let mut worst = 0;
    read(c, next, Duration::from_micros(200), |c, _| {
        let m = c.metrics();
        if start.elapsed() < at_least || m.segment_cap > 6 {
            return start.elapsed() > Duration::from_secs(20);
        }
        match &mut settled {
            Some((_, cap, within)) if *cap == m.segment_cap => {
                *within |= m.segments_in_flight <= m.segment_cap;
                if *within {
                    worst = worst.max(m.segments_in_flight);
                }
            }
            _ => {
                settled = Some((Instant::now(), m.segment_cap, false));
                worst = 0;
            }
        }
        let (since, _, within) = settled.expect("set above");
        within && since.elapsed() > Duration::from_millis(300)
    })?;
    let m = c.metrics();
    if m.segment_cap > 6 {
        return Err(format!(
            "after 20 s of reading at about 5 MB/s with a 10 ms target the cap is {} segments \
             of 64 KiB (rate {} B/s)",
            m.segment_cap, m.debloat_rate
        ));
    }
    Ok(worst)
}

fn producer_child(test: &str) -> Option<(Consumer, std::process::Child)> {
    if role().is_some() {
        child_main(|| stream(Producer::from_env(FD_VAR).map_err(|e| e.to_string())?));
    }
    let (c, handle) = Consumer::builder()
        .geometry(geometry())
        .debloat_target(Duration::from_millis(10))
        .create_anonymous()
        .unwrap();
    let child = spawn(test, "producer", &[], Some(&handle));
    drop(handle);
    Some((c, child))
}

#[test]
fn the_cap_follows_a_consumer_that_slows_down_and_speeds_up() {
    let (mut c, child) =
        producer_child("the_cap_follows_a_consumer_that_slows_down_and_speeds_up").unwrap();
    let mut next = 0;
    // Fast at first: the cap stays at every segment.
    read(&mut c, &mut next, Duration::ZERO, |_, n| n >= 20_000).unwrap();
    let fast = c.metrics();
    assert_eq!(fast.debloat_target_ns, 10_000_000);
    // Slow: about 5 MB/s × 10 ms = 50 KB, less than two segments of 64 KiB (by more than the
    // quarter the limit may lag the rate by).
    let worst = read_slowly(&mut c, &mut next, Duration::from_millis(500)).unwrap();
    let slow = c.metrics();
    assert!(
        (2..=6).contains(&slow.segment_cap),
        "cap {} (rate {} B/s)",
        slow.segment_cap,
        slow.debloat_rate
    );
    assert!(
        worst <= slow.segment_cap,
        "{worst} segments in flight under a cap of {}",
        slow.segment_cap
    );
    // Records start only in part of each segment (`debloatedBufferSize`), about 25 KB.
    assert!(
        slow.segment_fill < u64::from(SEG) && slow.segment_fill >= 4096,
        "fill {} of {SEG}",
        slow.segment_fill
    );
    println!(
        "reading fast: cap {} (rate {:.0} MB/s); slowly: cap {} × {} B (rate {:.1} MB/s), at most {worst} segments in flight",
        fast.segment_cap,
        fast.debloat_rate as f64 / 1e6,
        slow.segment_cap,
        slow.segment_fill,
        slow.debloat_rate as f64 / 1e6
    );
    // Fast again: the cap rises back (the rate is measured over the time the consumer
    // works, so the waits for a held-back producer do not keep it low).
    let start = Instant::now();
    read(&mut c, &mut next, Duration::ZERO, |c, _| {
        c.metrics().segment_cap >= 12 || start.elapsed() > Duration::from_secs(20)
    })
    .unwrap();
    let again = c.metrics();
    assert_eq!(again.segment_fill, u64::from(SEG), "whole segments again");
    assert!(
        again.segment_cap >= 12,
        "reading at full speed for 20 s left the cap at {} (rate {} B/s)",
        again.segment_cap,
        again.debloat_rate
    );
    println!(
        "fast again: cap {} after {:?} (rate {:.0} MB/s)",
        again.segment_cap,
        start.elapsed(),
        again.debloat_rate as f64 / 1e6
    );
    drop(c);
    common::expect_success(child, "producer");
}

#[test]
fn a_producer_held_back_by_the_cap_goes_on_when_it_lifts() {
    let (mut c, child) =
        producer_child("a_producer_held_back_by_the_cap_goes_on_when_it_lifts").unwrap();
    let mut next = 0;
    read_slowly(&mut c, &mut next, Duration::from_millis(300)).unwrap();
    let capped = c.metrics();
    // The producer is held back now (it streams as fast as it can): stop reading and lift
    // the cap. It fills the free segments at once.
    c.set_debloat_target(None);
    let start = Instant::now();
    let mut m = c.metrics();
    while m.segments_in_flight < 16 && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
        m = c.metrics();
    }
    assert_eq!(
        (m.segment_cap, m.segments_in_flight),
        (0, 16),
        "after the cap of {} lifted, the producer took {} of 16 segments in {:?}",
        capped.segment_cap,
        m.segments_in_flight,
        start.elapsed()
    );
    // What it sent arrives, in order (more than the 16 segments it filled).
    let until = next + 2000;
    read(&mut c, &mut next, Duration::ZERO, |_, n| n >= until).unwrap();
    drop(c);
    common::expect_success(child, "producer");
}

#[test]
fn a_dead_consumer_still_reads_as_dead_to_a_producer_it_holds_back() {
    if role().is_some() {
        child_main(|| {
            let mut c = Consumer::from_env(FD_VAR).map_err(|e| e.to_string())?;
            c.set_debloat_target(Some(Duration::from_millis(20)));
            let mut next = 0;
            // Reads slowly until killed.
            read(&mut c, &mut next, Duration::from_micros(200), |_, _| false)
        });
    }
    let (mut p, handle) = Producer::builder()
        .geometry(geometry())
        .create_anonymous()
        .unwrap();
    let mut child = spawn(
        "a_dead_consumer_still_reads_as_dead_to_a_producer_it_holds_back",
        "consumer",
        &[],
        Some(&handle),
    );
    drop(handle);
    let mut buf = Vec::new();
    let start = Instant::now();
    let mut killed = None;
    let mut seq = 0;
    let err = loop {
        if killed.is_none() {
            let m = p.metrics();
            if m.segment_cap != 0
                && m.segment_cap <= 6
                && start.elapsed() > Duration::from_millis(300)
            {
                // SAFETY: kill(2) with a pid we spawned and have not reaped.
                unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
                killed = Some((Instant::now(), m.segment_cap));
            }
        }
        make_record(seq, LEN, &mut buf);
        if let Err(e) = p.send(&buf) {
            break e;
        }
        seq += 1;
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no low cap and no error after 60 s"
        );
    };
    let (at, cap) = killed.expect("the consumer died before it was killed");
    assert!(matches!(err, SendError::PeerDead(_)), "got {err:?}");
    println!(
        "held back at a cap of {cap} segments, the producer saw its consumer dead {:?} after the kill",
        at.elapsed()
    );
    child.wait().unwrap();
}

#[test]
fn a_gate_caps_each_channel_and_leaves_the_floating_segments_alone() {
    if role().is_some() {
        child_main(|| {
            let name = std::env::var("GATE").unwrap();
            let c: u32 = std::env::var("CHANNEL").unwrap().parse().unwrap();
            stream(Producer::open_channel(&name, c).map_err(|e| e.to_string())?)
        });
    }
    let name = format!("/shmflow-test-debloat-gate-{}", std::process::id());
    let mut gate = Gate::builder()
        .channels(2)
        .exclusive(2)
        .floating(12)
        .segment_size(16 * 1024)
        .debloat_target(Duration::from_millis(10))
        .create(&name)
        .unwrap();
    let kids: Vec<_> = (0..2)
        .map(|c| {
            spawn(
                "a_gate_caps_each_channel_and_leaves_the_floating_segments_alone",
                "producer",
                &[("GATE", name.clone()), ("CHANNEL", c.to_string())],
                None,
            )
        })
        .collect();
    let mut next = [0u64; 2];
    let mut scratch = Vec::new();
    let start = Instant::now();
    let (mut worst_floating, mut worst_in_flight, mut caps) = (0, [0u64; 2], [0u64; 2]);
    // About 4 MB/s in all (250 µs per 1000-byte record), so 40 KB in 10 ms: a few 16 KiB
    // segments over both channels, where the pool has 2 × 2 + 12.
    while start.elapsed() < Duration::from_millis(2500) {
        match gate.recv().unwrap().expect("producers stream") {
            GateMessage::Record { channel, record } => {
                let bytes = record.as_bytes().expect("whole");
                check_record(next[channel as usize], LEN, bytes, &mut scratch).unwrap();
                next[channel as usize] += 1;
            }
            other => panic!("{other:?}"),
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(250) {
            std::hint::spin_loop();
        }
        if start.elapsed() > Duration::from_millis(1500) {
            let m = gate.metrics();
            worst_floating = worst_floating.max(m.channels.iter().map(|c| c.floating_held).sum());
            for (c, ch) in m.channels.iter().enumerate() {
                worst_in_flight[c] = worst_in_flight[c].max(ch.snapshot.segments_in_flight);
                caps[c] = ch.snapshot.segment_cap;
            }
        }
    }
    println!(
        "caps {caps:?}, at most {worst_in_flight:?} segments in flight, {worst_floating} floating segments held (of 12)"
    );
    for c in 0..2 {
        assert!((2..=6).contains(&caps[c]), "channel {c}: cap {}", caps[c]);
        assert!(
            worst_in_flight[c] <= 6,
            "channel {c}: {} segments in flight",
            worst_in_flight[c]
        );
    }
    // Capped at two segments, within their two exclusive ones, the channels ask for no
    // floating segment (one lent before the first measurement may still be held).
    assert!(
        worst_floating <= 2,
        "the capped channels held {worst_floating} floating segments"
    );
    drop(gate);
    for k in kids {
        common::expect_success(k, "producer");
    }
}

#[test]
fn records_longer_than_a_debloated_fill_still_go_whole() {
    // A zero target: two segments, each filled with at most 4 KiB of records, once the first
    // rate is measured. Records of 20 000 bytes then start in fresh segments of 64 KiB and go
    // whole; 70 000 bytes span segments; every one arrives intact and in order.
    let (mut tx, mut rx) = shmflow::pair(geometry()).unwrap();
    rx.set_debloat_target(Some(Duration::ZERO));
    let sizes = |seq: u64| match seq % 10 {
        3 => 20_000,
        7 if seq % 100 == 7 => 70_000,
        _ => LEN,
    };
    let writer = std::thread::spawn(move || {
        let mut buf = Vec::new();
        for seq in 0..3000u64 {
            make_record(seq, sizes(seq), &mut buf);
            tx.send(&buf).unwrap();
        }
    });
    let mut scratch = Vec::new();
    let mut fill = u64::MAX;
    for seq in 0..3000u64 {
        let r = rx.recv().unwrap().expect("a record");
        let bytes = r.to_vec().expect("whole");
        check_record(seq, sizes(seq), &bytes, &mut scratch).unwrap();
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(100) {
            std::hint::spin_loop();
        }
        fill = fill.min(rx.metrics().segment_fill);
    }
    writer.join().unwrap();
    assert_eq!(fill, 4096, "the fill never came down to its least");
    // About 10.5 MB: some 170 whole segments of 64 KiB; sealed at 4 KiB for most of the run,
    // several times as many.
    let m = rx.metrics();
    assert!(
        m.segments_acquired > 400,
        "{} segments for 10.5 MB: the producer did not seal at the fill",
        m.segments_acquired
    );
}

#[test]
fn a_try_send_under_a_cap_sends_a_spanning_record_whole_or_not_at_all() {
    use shmflow::{GateMessage, TrySendError};
    // A gate channel of two 64 KiB segments (Flink's two exclusive buffers), debloated to a
    // zero target: a cap of two, records starting only in the first 4 KiB of a segment.
    let name = format!("/shmflow-test-debloat-span-{}", std::process::id());
    let mut gate = Gate::builder()
        .channels(1)
        .exclusive(2)
        .floating(0)
        .segment_size(SEG)
        .debloat_target(Duration::ZERO)
        .create(&name)
        .unwrap();
    let mut tx = Producer::open_channel(&name, 0).unwrap();
    let mut buf = Vec::new();
    let mut scratch = Vec::new();
    let (mut sent, mut got) = (0u64, 0u64);
    let mut next = move |gate: &mut Gate, got: &mut u64, len: usize| match gate.recv().unwrap() {
        Some(GateMessage::Record { record, .. }) => {
            let bytes = record.to_vec().expect("whole");
            check_record(*got, len, &bytes, &mut scratch).unwrap();
            *got += 1;
        }
        other => panic!("record {got}: {other:?}"),
    };
    // Written and read in turn, with work per record, until the fill is measured.
    let start = Instant::now();
    while gate.metrics().channels[0].snapshot.segment_fill != 4096 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no fill after 20 s"
        );
        make_record(sent, LEN, &mut buf);
        tx.send(&buf).unwrap();
        sent += 1;
        next(&mut gate, &mut got, LEN);
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(100) {
            std::hint::spin_loop();
        }
    }
    // A record of 70 000 bytes spans two segments; its last part ends past the fill of the
    // second. Read, it leaves one segment free and one in flight.
    make_record(sent, 70_000, &mut buf);
    tx.send(&buf).unwrap();
    sent += 1;
    next(&mut gate, &mut got, 70_000);
    // Another such record needs both segments: `try_send` must refuse it whole, not send a
    // first part and abort it for want of the second.
    make_record(sent, 70_000, &mut buf);
    assert!(matches!(tx.try_send(&buf), Err(TrySendError::Full)));
    match gate.try_recv() {
        Err(shmflow::TryRecvError::Empty) => {}
        other => panic!("after a refused try_send the gate holds {other:?}"),
    }
    // Sent blocking, it goes whole once the consumer reads.
    let reader = std::thread::spawn(move || {
        next(&mut gate, &mut got, 70_000);
        got
    });
    tx.send(&buf).unwrap();
    assert_eq!(reader.join().unwrap(), sent + 1);
}
