//! Nothing to do means no work: an idle pair makes (almost) no wake-ups, the buffer-timeout
//! flusher sleeps without a timer, and a producer that exits right after its last send has
//! that record delivered by its own wake-up, not by the consumer's dead-peer check.
//!
//! Wake-ups are counted from the kernel's context-switch counters of the threads involved
//! (`/proc/self/task/<tid>/status`): counts, not timings.

mod common;

use std::time::Duration;

use common::{role, spawn, wait_for, FD_VAR};
use shmflow::{Consumer, FlushPolicy, Geometry, Producer, RecvError};

const G: Geometry = Geometry {
    segment_size: 4096,
    segment_count: 4,
};

/// Voluntary context switches of thread `tid` of this process: each is the thread going to
/// sleep, so a thread that wakes up N times shows N (preemptions of a busy machine, the
/// involuntary ones, are left out).
fn switches(tid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    s.lines()
        .filter(|l| l.starts_with("voluntary_ctxt_switches"))
        .map(|l| l.split(':').nth(1).unwrap().trim().parse::<u64>().unwrap())
        .sum()
}

/// The kernel's id of the thread named `name` in this process.
fn thread_named(name: &str) -> Option<i32> {
    std::fs::read_dir("/proc/self/task").unwrap().find_map(|e| {
        let e = e.unwrap();
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (comm.trim() == name).then(|| e.file_name().to_str().unwrap().parse().unwrap())
    })
}

/// `look()`'s first `Some` within about a second (looking every millisecond), else `None`.
fn eventually<T>(mut look: impl FnMut() -> Option<T>) -> Option<T> {
    (0..1000).find_map(|_| {
        let v = look();
        if v.is_none() {
            std::thread::sleep(Duration::from_millis(1));
        }
        v
    })
}

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

#[test]
fn the_flusher_of_an_idle_producer_sleeps_without_a_timer() {
    let (mut p, mut c) = shmflow::pair(G).unwrap();
    p.set_flush_policy(FlushPolicy::Timeout(Duration::from_millis(1)));
    p.send(b"one").unwrap();
    assert_eq!(c.recv().unwrap().unwrap().as_bytes(), Some(&b"one"[..]));
    // The thread names itself once it runs.
    let tid = eventually(|| thread_named("shmflow-flusher"))
        .expect("the flusher runs once a record was sent");
    // Let it notice that nothing is pending, then count over 300 intervals.
    std::thread::sleep(Duration::from_millis(20));
    let before = switches(tid);
    std::thread::sleep(Duration::from_millis(300));
    let idle = switches(tid) - before;
    println!("flusher context switches in 300 ms idle: {idle}");
    assert!(
        idle <= 3,
        "a flusher ticking every interval would show ~300; got {idle}"
    );
    // It wakes again for the next record, and the record is delivered.
    p.send(b"two").unwrap();
    let r = c.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(r.as_bytes(), Some(&b"two"[..]));
    drop(r);
    let woke = eventually(|| (switches(tid) > before + idle).then_some(()));
    assert!(woke.is_some(), "the flusher woke for the new record");
}

#[test]
fn an_idle_default_pair_wakes_only_for_the_dead_peer_check() {
    let (p, mut c) = shmflow::pair(G).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        tx.send(gettid()).unwrap();
        let got = c.recv().map(|r| r.is_some());
        (c, got)
    });
    let tid = rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let before = switches(tid);
    std::thread::sleep(Duration::from_millis(1000));
    let idle = switches(tid) - before;
    // One look at the producer's liveness every 40 ms: about 25 in a second.
    println!("blocked consumer context switches in 1 s idle: {idle}");
    assert!(
        idle <= 60,
        "expected about 25 (one per liveness look), got {idle}"
    );
    drop(p);
    let (_c, got) = reader.join().unwrap();
    assert!(!got.unwrap(), "end of stream once the producer is dropped");
}

#[test]
fn a_producer_that_exits_right_after_its_last_send_has_it_delivered_by_its_own_wake_up() {
    if let Some(r) = role() {
        assert_eq!(r, "send-and-exit");
        let mut p = Producer::from_env(FD_VAR).unwrap();
        // Once the parent has waited in `recv` long enough to have parked (past any spin), send
        // and leave without detaching.
        wait_for("the consumer to park", || p.metrics().idle_ns > 50_000_000);
        p.send(b"last words").unwrap();
        // SAFETY: _exit ends the process at once; nothing of ours needs to run.
        unsafe { libc::_exit(0) };
    }
    // The consumer may be between two naps (it looks at the producer's liveness every
    // 40 ms) at the instant of the send, and then it needs no wake-up: try a few times, and
    // require the send's own wake-up in at least one.
    let mut woken_by_send = 0;
    for attempt in 0..5 {
        let (mut c, handle) = Consumer::create_anonymous(G).unwrap();
        let mut child = spawn(
            "a_producer_that_exits_right_after_its_last_send_has_it_delivered_by_its_own_wake_up",
            "send-and-exit",
            &[],
            Some(&handle),
        );
        drop(handle);
        let start = std::time::Instant::now();
        let r = c.recv().unwrap().expect("the record");
        let took = start.elapsed();
        assert_eq!(r.as_bytes(), Some(&b"last words"[..]));
        drop(r);
        let wakes = c.metrics().producer_wakes;
        println!("attempt {attempt}: delivered after {took:?} of waiting; wake-ups by the producer: {wakes}");
        child.wait().unwrap();
        assert!(matches!(c.recv(), Err(RecvError::PeerDead(_))));
        if wakes >= 1 {
            woken_by_send += 1;
            break;
        }
    }
    assert!(
        woken_by_send >= 1,
        "the send itself wakes a parked consumer, whatever happens to the process next"
    );
}
