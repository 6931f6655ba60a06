//! Latency markers: off by default; emitted in band at the interval, counted per source by the
//! consumer (or the gate) that reads them, passed on by a stage, read by a monitor of another
//! process, never making a producer wait.

mod common;

use std::time::{Duration, Instant};

use shmflow::monitor::Monitor;
use shmflow::{
    Consumer, Gate, GateMessage, Geometry, LatencyMarkers, Message, Partition, Partitioner,
    Producer, TrySendError,
};

const MS: Duration = Duration::from_millis(1);

#[test]
fn markers_are_off_unless_asked_for() {
    let (mut tx, mut rx) = shmflow::pair(Geometry::default()).unwrap();
    for i in 0..1000u32 {
        tx.send(&i.to_le_bytes()).unwrap();
        if i % 100 == 0 {
            std::thread::sleep(MS);
        }
    }
    drop(tx);
    let mut n = 0;
    while let Some(m) = rx.recv_message().unwrap() {
        assert!(matches!(m, Message::Record(_)), "{m:?}");
        n += 1;
    }
    assert_eq!(n, 1000);
    assert!(rx.latency().is_empty());
}

/// Records sent for about `for_ms` milliseconds, one every 100 µs, with markers every ms.
fn send_for(tx: &mut Producer, for_ms: u64) -> u64 {
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < Duration::from_millis(for_ms) {
        tx.send(&sent.to_le_bytes()).unwrap();
        sent += 1;
        std::thread::sleep(Duration::from_micros(100));
    }
    sent
}

#[test]
fn markers_come_in_band_at_the_interval_and_are_counted_per_source() {
    let (mut tx, mut rx) = shmflow::pair(Geometry::default()).unwrap();
    tx.set_latency_markers(Some(LatencyMarkers::every(MS, "source-a")));
    assert_eq!(tx.latency_markers().unwrap().source(), "source-a");
    let writer = std::thread::spawn(move || send_for(&mut tx, 200)); // then drops `tx`
    let mut records = 0u64;
    let mut markers = Vec::new();
    while let Some(m) = rx.recv_message().unwrap() {
        match m {
            Message::Record(r) => {
                // In order: a marker never displaces a record.
                assert_eq!(r.as_pod::<u64>(), Some(&records));
                records += 1;
            }
            Message::LatencyMarker(m) => {
                assert_eq!(m.source(), "source-a");
                markers.push(m);
            }
            other => panic!("{other:?}"),
        }
    }
    let sent = writer.join().unwrap();
    assert_eq!(records, sent);
    // One a millisecond for 200 ms: fewer on a loaded host (a marker goes only with a record,
    // and a tick may be late), never more than one per record.
    assert!(
        (20..=sent).contains(&(markers.len() as u64)),
        "{} markers for {sent} records over 200 ms",
        markers.len()
    );
    let emitted: Vec<u64> = markers.iter().map(|m| m.emitted_ns()).collect();
    assert!(
        emitted.windows(2).all(|w| w[0] <= w[1]),
        "in the order sent"
    );
    let l = rx.latency();
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].source, "source-a");
    assert_eq!(l[0].count, markers.len() as u64);
    assert_eq!(l[0].buckets.iter().map(|b| b.1).sum::<u64>(), l[0].count);
    assert!(l[0].quantile(0.5) <= l[0].quantile(0.99));
    assert!(l[0].quantile(1.0) <= l[0].max);
    assert!(l[0].max >= l[0].last && l[0].max >= l[0].mean());
}

#[test]
fn a_plain_recv_counts_the_markers_it_passes() {
    let (mut tx, mut rx) = shmflow::pair(Geometry::default()).unwrap();
    tx.set_latency_markers(Some(LatencyMarkers::every(MS, "s")));
    let sent = send_for(&mut tx, 30);
    drop(tx);
    let mut n = 0;
    while rx.recv().unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, sent);
    assert!(rx.latency()[0].count >= 1);
}

/// Two sources, each through a stage of its own that passes markers on, into a gate: the
/// gate counts each source apart, measured from the source (not from the stage).
#[test]
fn a_stage_passes_markers_on_and_a_gate_counts_them_per_source() {
    let (mut gate, handles) = Gate::builder().channels(2).create_anonymous().unwrap();
    let mut threads = Vec::new();
    for (i, h) in handles.into_iter().enumerate() {
        let (mut src, mut stage_in) = shmflow::pair(Geometry::default()).unwrap();
        let mut stage_out = Producer::from_handle(h).unwrap();
        threads.push(std::thread::spawn(move || {
            src.set_latency_markers(Some(LatencyMarkers::every(MS, &format!("src-{i}"))));
            send_for(&mut src, 50)
        }));
        threads.push(std::thread::spawn(move || {
            let mut n = 0;
            while let Some(m) = stage_in.recv_message().unwrap() {
                match m {
                    Message::Record(r) => {
                        stage_out.send(r.as_bytes().unwrap()).unwrap();
                        n += 1;
                    }
                    Message::LatencyMarker(m) => {
                        // A stage that takes 1 ms per marker: the gate sees older markers.
                        std::thread::sleep(MS);
                        stage_out.forward_latency_marker(&m).unwrap()
                    }
                    other => panic!("{other:?}"),
                }
            }
            n
        }));
    }
    let mut markers = [0u64; 2];
    let mut records = 0;
    while let Some(m) = gate.recv().unwrap() {
        match m {
            GateMessage::Record { .. } => records += 1,
            GateMessage::LatencyMarker { channel, marker } => {
                assert_eq!(marker.source(), format!("src-{channel}"));
                assert!(marker.age() >= MS, "measured from the source: {marker:?}");
                markers[channel as usize] += 1;
            }
            GateMessage::EndOfPartition { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    let counts: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(records, counts.iter().sum::<u64>() / 2);
    let mut l = gate.latency();
    l.sort_by(|a, b| a.source.cmp(&b.source));
    assert_eq!(l.len(), 2);
    for (i, s) in l.iter().enumerate() {
        assert_eq!(s.source, format!("src-{i}"));
        assert_eq!(s.count, markers[i]);
        assert!(s.count >= 1);
        assert!(
            s.quantile(0.5) >= MS,
            "the stage's millisecond is in the age"
        );
    }
}

/// A partition emits about one marker per interval across its channels, and forwards markers
/// to its channels in turn.
#[test]
fn a_partition_spreads_its_markers_over_its_channels() {
    let mut outs = Vec::new();
    let mut ins = Vec::new();
    for _ in 0..2 {
        let (p, c) = shmflow::pair(Geometry::default()).unwrap();
        outs.push(p);
        ins.push(c);
    }
    let mut part = Partition::new(outs, Partitioner::RoundRobin).unwrap();
    part.set_latency_markers(Some(LatencyMarkers::every(MS, "p")));
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(60) {
        part.send(b"r").unwrap();
        std::thread::sleep(Duration::from_micros(100));
    }
    drop(part);
    let counts: Vec<u64> = ins
        .iter_mut()
        .map(|c| {
            while c.recv().unwrap().is_some() {}
            c.latency().first().map_or(0, |l| l.count)
        })
        .collect();
    assert!(
        counts.iter().all(|&n| n >= 1),
        "every channel carried some: {counts:?}"
    );
    assert!(counts.iter().sum::<u64>() <= 60 * 2, "{counts:?}");
}

/// A marker never makes `send` wait: a producer whose pool is full gets `Full` from
/// `try_send` as without markers, and every record arrives in order once the reader reads.
#[test]
fn a_marker_never_holds_a_send() {
    let g = Geometry {
        segment_size: 4096,
        segment_count: 2,
    };
    let (mut tx, mut rx) = shmflow::pair(g).unwrap();
    tx.set_latency_markers(Some(LatencyMarkers::every(Duration::from_micros(100), "s")));
    let mut sent = 0u64;
    loop {
        match tx.try_send(&[7u8; 1000]) {
            Ok(()) => sent += 1,
            Err(TrySendError::Full) => break,
            Err(e) => panic!("{e}"),
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    assert!(sent >= 4, "the pool holds about eight records: {sent}");
    drop(tx);
    let mut n = 0;
    while rx.recv().unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, sent);
}

/// A producer process emits markers into a named channel; this process reads it, and a
/// monitor (what `shmflow stat` uses) sees the same figures as the consumer.
#[test]
fn a_marker_that_finds_the_consumer_gone_leaves_the_answer_to_the_producers_own_calls() {
    // A segment of 4 KiB: after the second record only 8 bytes are left, too few for the
    // marker that is due after it, which takes a fresh segment and finds the consumer gone.
    let (mut tx, mut rx) = shmflow::pair(Geometry {
        segment_size: 4096,
        segment_count: 8,
    })
    .unwrap();
    tx.send(&[1u8; 8]).unwrap();
    assert!(rx.recv().unwrap().is_some());
    drop(rx);
    tx.set_latency_markers(Some(LatencyMarkers::every(MS, "gone")));
    // The record fits the segment in hand: accepted, as a send is until it takes a segment.
    tx.send(&[2u8; 4096 - 16 - 8 - 8]).unwrap();
    // The consumer left with that record unread: `Closed`, the consumer's answer; not
    // `AlreadyClosed`, which says that an earlier call of the producer's had returned it.
    match tx.close_timeout(Duration::from_secs(5)) {
        Err(shmflow::CloseError::Closed { .. }) => {}
        other => panic!("expected CloseError::Closed, got {other:?}"),
    }
}

#[test]
fn a_monitor_reads_the_figures_of_another_process() {
    if common::role().as_deref() == Some("marker-producer") {
        let name = std::env::var("NAME").unwrap();
        let mut tx = Producer::open(&name).unwrap();
        tx.set_latency_markers(Some(LatencyMarkers::every(MS, "child")));
        send_for(&mut tx, 50);
        tx.close_timeout(Duration::from_secs(30)).unwrap();
        return;
    }
    let name = format!("/shmflow-test-latency-{}", std::process::id());
    let mut rx = Consumer::create(&name, Geometry::default()).unwrap();
    let mut child = common::spawn(
        "a_monitor_reads_the_figures_of_another_process",
        "marker-producer",
        &[("NAME", name.clone())],
        None,
    );
    let monitor = Monitor::open(&name).unwrap();
    while rx.recv().unwrap().is_some() {}
    assert!(child.wait().unwrap().success());
    let mine = rx.latency();
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].source, "child");
    assert!(mine[0].count >= 1);
    assert_eq!(monitor.latency(), mine);
}

/// A producer's interval holds when the process's marker clock changes pace: a producer with
/// 20 ms markers keeps emitting about every 20 ms after a producer with 100 µs markers (which
/// set the clock's pace) has gone. In a child process of its own, so that no other test's
/// markers set the pace.
#[test]
fn an_interval_holds_when_a_faster_producer_leaves() {
    if common::role().as_deref() == Some("pace-change") {
        let (mut fast, mut fast_rx) = shmflow::pair(Geometry::default()).unwrap();
        let (mut slow, mut slow_rx) = shmflow::pair(Geometry::default()).unwrap();
        fast.set_latency_markers(Some(LatencyMarkers::every(Duration::from_micros(100), "f")));
        slow.set_latency_markers(Some(LatencyMarkers::every(20 * MS, "s")));
        for i in 0..20u64 {
            fast.send_pod(&i).unwrap();
            slow.send_pod(&i).unwrap();
            std::thread::sleep(MS);
        }
        drop(fast);
        while fast_rx.recv().unwrap().is_some() {}
        // 400 ms of records, one a millisecond: about 20 markers at 20 ms.
        let start = Instant::now();
        let mut i = 0u64;
        while start.elapsed() < 400 * MS {
            slow.send_pod(&i).unwrap();
            i += 1;
            std::thread::sleep(MS);
        }
        drop(slow);
        while slow_rx.recv().unwrap().is_some() {}
        let count = slow_rx.latency()[0].count;
        assert!(count >= 8, "{count} markers in about 420 ms at 20 ms");
        assert!(count <= 30, "{count} markers in about 420 ms at 20 ms");
        return;
    }
    let status = common::spawn(
        "an_interval_holds_when_a_faster_producer_leaves",
        "pace-change",
        &[],
        None,
    )
    .wait()
    .unwrap();
    assert!(status.success(), "the child failed: {status}");
}

/// A producer with markers on, inherited by a child made by `fork`, goes on sending them
/// there: the child has no copy of the ticker thread, and its first marker check starts one.
#[test]
fn an_inherited_producer_goes_on_sending_markers_in_a_forked_child() {
    // Runs in a child of its own, so that the fork below copies no thread of the harness.
    if !common::in_a_process_of_its_own(
        "an_inherited_producer_goes_on_sending_markers_in_a_forked_child",
        "fork-inherited",
    ) {
        return;
    }
    let (mut tx, mut rx) = shmflow::pair(Geometry::default()).unwrap();
    tx.set_latency_markers(Some(LatencyMarkers::every(MS, "inherited")));
    assert!(send_for(&mut tx, 20) > 0);
    while let Ok(Some(_)) = rx.try_recv() {}
    let before = rx.latency().first().map_or(0, |s| s.count);
    assert!(before > 0, "markers before the fork");
    // SAFETY: this process runs one thread of its own (the ticker's aside); the forked
    // child runs the code below and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = send_for(&mut tx, 100);
            drop(tx);
            while rx.recv().unwrap().is_some() {}
            rx.latency().first().map_or(0, |s| s.count) - before
        }));
        // About 100 at 1 ms; none with the parent's clock, which stands still in the child.
        let code = match ok {
            Ok(n) if n >= 10 => 0,
            Ok(_) => 2,
            Err(_) => 1,
        };
        // SAFETY: ends the child at once (no destructors, no harness).
        unsafe { libc::_exit(code) };
    }
    // Both ends are the child's now.
    std::mem::forget(tx);
    std::mem::forget(rx);
    let status = common::wait_forked(pid, Duration::from_secs(60)).expect("the forked child ended");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the forked child's inherited producer sent fewer than 10 markers in 100 ms at 1 ms \
         (status {status:#x}; exit code 2: too few, 1: a panic)"
    );
}

/// A child made by `fork` after this process's markers started the ticker thread inherits
/// the ticker's bookkeeping but not the thread: its own markers still come (it starts a
/// ticker of its own).
#[test]
fn a_forked_child_ticks_with_a_ticker_of_its_own() {
    // Runs in a child of its own, so that the fork below copies no thread of the harness.
    if !common::in_a_process_of_its_own(
        "a_forked_child_ticks_with_a_ticker_of_its_own",
        "fork-ticker",
    ) {
        return;
    }
    let (mut tx, mut rx) = shmflow::pair(Geometry::default()).unwrap();
    tx.set_latency_markers(Some(LatencyMarkers::every(MS, "parent")));
    assert!(send_for(&mut tx, 20) > 0);
    // SAFETY: this process runs one thread of its own (the ticker's aside); the forked
    // child runs the code below and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let ok = std::panic::catch_unwind(|| {
            let (mut tx, mut rx) = shmflow::pair(Geometry::default()).unwrap();
            tx.set_latency_markers(Some(LatencyMarkers::every(MS, "child")));
            let _ = send_for(&mut tx, 100);
            drop(tx);
            while rx.recv().unwrap().is_some() {}
            rx.latency().first().map_or(0, |s| s.count)
        });
        // About 100; the first marker alone (due at once) comes without a ticker.
        let code = match ok {
            Ok(n) if n >= 10 => 0,
            _ => 1,
        };
        // SAFETY: ends the child at once (no destructors, no harness).
        unsafe { libc::_exit(code) };
    }
    drop(tx);
    while rx.recv().unwrap().is_some() {}
    let status = common::wait_forked(pid, Duration::from_secs(60)).expect("the forked child ended");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the forked child sent fewer than 10 markers in 100 ms at 1 ms (status {status:#x})"
    );
}
