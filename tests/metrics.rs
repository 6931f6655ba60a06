//! Counters in the region header: exact for a deterministic run, backpressured time as a lower
//! bound, and the read-only monitor (cannot write, does not attach).

mod common;

use std::time::Duration;

use common::*;
use shmflow::metrics::{BackpressureLevel, Snapshot};
use shmflow::monitor::Monitor;
use shmflow::{Consumer, FlushPolicy, Geometry, Producer};

#[test]
fn counters_are_exact_for_a_deterministic_run() {
    let name = unique_name("counters");
    let mut p = Producer::create(
        &name,
        Geometry {
            segment_size: 4096,
            segment_count: 4,
        },
    )
    .unwrap();
    let mut c = Consumer::open(&name).unwrap();
    let monitor = Monitor::open(&name).unwrap();
    p.set_flush_policy(FlushPolicy::EveryRecord);
    // 100-byte records take 112 bytes with header and padding: 36 per 4 KiB segment.
    let rec = [3u8; 100];
    let t = std::thread::spawn(move || {
        for _ in 0..1000 {
            p.send(&rec).unwrap();
        }
        p // keep it attached until the consumer has read everything
    });
    for _ in 0..1000 {
        assert_eq!(c.recv().unwrap().unwrap().len(), Some(100));
    }
    let p = t.join().unwrap();
    // Finding nothing more publishes the consumer's counts (it batches them by 16 otherwise).
    assert!(matches!(c.try_recv(), Err(shmflow::TryRecvError::Empty)));
    let s = monitor.snapshot();
    assert_eq!((s.records_written, s.bytes_written), (1000, 100_000));
    assert_eq!((s.records_read, s.bytes_read), (1000, 100_000));
    assert_eq!(
        s.segments_acquired, 28,
        "ceil(1000 / 36) segments taken by the producer"
    );
    assert_eq!(
        s.segments_committed, 27,
        "all but the one still being written were sealed"
    );
    assert_eq!(s.segments_taken, 28);
    assert_eq!(
        s.segments_returned, 27,
        "the consumer still holds the unsealed last one"
    );
    assert_eq!((s.segments_not_free, s.segments_at_consumer), (1, 1));
    drop(p);
    assert!(c.recv().unwrap().is_none());
    let s = monitor.snapshot();
    assert_eq!((s.segments_committed, s.segments_returned), (28, 28));
    assert_eq!((s.segments_not_free, s.segments_at_consumer), (0, 0));
    assert_eq!(
        (s.producer_state, s.consumer_state),
        (
            shmflow::metrics::EndState::Detached,
            shmflow::metrics::EndState::Attached
        )
    );
}

#[test]
fn holding_every_segment_shows_as_backpressured_time() {
    const HOLD: Duration = Duration::from_millis(300);
    let (mut p, mut c) = shmflow::pair(Geometry {
        segment_size: 4096,
        segment_count: 2,
    })
    .unwrap();
    p.set_flush_policy(FlushPolicy::EveryRecord);
    let rec = [0u8; 3000];
    p.send(&rec).unwrap();
    p.send(&rec).unwrap();
    let before = c.metrics();
    let t = std::thread::spawn(move || {
        p.send(&rec).unwrap(); // blocks: the consumer holds both segments
        p
    });
    // Wait until the producer is inside its wait (the snapshot counts an ongoing wait).
    while c.metrics().backpressured_ns == before.backpressured_ns {
        std::thread::yield_now();
    }
    std::thread::sleep(HOLD);
    for _ in 0..3 {
        c.recv().unwrap().unwrap();
    }
    let p = t.join().unwrap();
    let after = p.metrics();
    let blocked = Duration::from_nanos(after.backpressured_ns - before.backpressured_ns);
    assert!(blocked >= HOLD, "backpressured {blocked:?}, held {HOLD:?}");
    let r = after.rates_since(&before);
    assert!(r.back_pressured_time_ms_per_second > 100.0, "{r:?}");
}

#[test]
fn levels_and_rates_follow_flinks_definitions() {
    assert_eq!(BackpressureLevel::from_ratio(0.0), BackpressureLevel::Ok);
    assert_eq!(BackpressureLevel::from_ratio(0.0999), BackpressureLevel::Ok);
    assert_eq!(BackpressureLevel::from_ratio(0.10), BackpressureLevel::Low);
    assert_eq!(BackpressureLevel::from_ratio(0.50), BackpressureLevel::Low);
    assert_eq!(
        BackpressureLevel::from_ratio(0.5001),
        BackpressureLevel::High
    );
    // Snapshots are `#[non_exhaustive]`: built from the default, field by field.
    let mut a = Snapshot::default();
    (a.at_ns, a.segment_count) = (1_000_000_000, 8);
    let mut b = Snapshot::default();
    (b.at_ns, b.segment_count) = (3_000_000_000, 8);
    (b.records_written, b.records_read) = (2000, 1000);
    (b.backpressured_ns, b.idle_ns) = (1_200_000_000, 200_000_000);
    (b.segments_not_free, b.segments_at_consumer) = (6, 4);
    let r = b.rates_since(&a);
    assert_eq!(
        (r.records_written_per_s, r.records_read_per_s),
        (1000.0, 500.0)
    );
    assert_eq!(r.back_pressured_time_ms_per_second, 600.0);
    assert_eq!(r.producer_busy_time_ms_per_second, 400.0);
    assert_eq!(r.idle_time_ms_per_second, 100.0);
    assert_eq!(r.consumer_busy_time_ms_per_second, 900.0);
    assert_eq!((r.out_pool_usage, r.in_pool_usage), (0.75, 0.5));
    assert_eq!(r.level, BackpressureLevel::High);
}

#[test]
fn the_monitor_is_read_only_and_never_attaches() {
    if role().as_deref() == Some("scribbler") {
        child_main(|| {
            let name = std::env::var("NAME").unwrap();
            let m = Monitor::open(&name).map_err(|e| e.to_string())?;
            // Find the monitor's mapping of the object in this process's map.
            let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
            let line = maps
                .lines()
                .find(|l| l.ends_with(&format!("/dev/shm{name}")))
                .ok_or("the monitor's mapping is not in /proc/self/maps")?;
            let perms = line.split_whitespace().nth(1).unwrap();
            if perms != "r--s" {
                return Err(format!("the monitor's mapping is {perms}, not r--s"));
            }
            let start = usize::from_str_radix(line.split('-').next().unwrap(), 16).unwrap();
            let ptr = start as *mut u64;
            // SAFETY: deliberately invalid: the mapping is PROT_READ, this must fault (SIGSEGV).
            unsafe { ptr.add(100).write_volatile(0xDEAD) };
            drop(m);
            Err("a write through the monitor's mapping succeeded".into())
        });
    }
    let name = unique_name("monitor");
    let _p = Producer::create(&name, Geometry::default()).unwrap();
    let m = Monitor::open(&name).unwrap();
    let s = m.snapshot();
    assert_eq!(
        (s.producer_state, s.consumer_state),
        (
            shmflow::metrics::EndState::Attached,
            shmflow::metrics::EndState::Free
        ),
        "the monitor is not an end"
    );
    let child = spawn(
        "the_monitor_is_read_only_and_never_attaches",
        "scribbler",
        &[("NAME", name.clone())],
        None,
    );
    let out = child.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "the write must fault: {:?}",
        out.status
    );
    // The consumer end is still free.
    let _c = Consumer::open(&name).unwrap();
    assert_eq!(
        m.snapshot().consumer_state,
        shmflow::metrics::EndState::Attached
    );
}
