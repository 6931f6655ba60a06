//! Kill tests: a producer and a consumer in separate processes, one of them killed with
//! SIGKILL at a random moment (while blocked, mid-record, mid-spanning record, mid-flush — the
//! pool is small, records span segments, both sides stall at random). The survivor must get
//! `PeerDead` and not hang; the records the consumer got must be exactly a prefix of what was
//! sent, in order, no duplicate, each intact (sequence number + checksum).
//!
//! `SHMFLOW_KILL_TRIALS` sets the trials per side (default 200); `scripts/soak.sh` runs 1000
//! per side and the 10-minute soak (`soak_random_sizes_and_stalls`, ignored by default).

mod common;

use std::process::Child;
use std::time::{Duration, Instant};

use common::*;
use shmflow::{Consumer, End, Error, FlushPolicy, Geometry, Producer};

const SEG: u32 = 4096;

fn geometry() -> Geometry {
    Geometry {
        segment_size: SEG,
        segment_count: 4,
    }
}

/// Record lengths: mostly small, some near a segment, some spanning up to 3 segments.
fn next_len(rng: &mut Rng) -> usize {
    match rng.below(10) {
        0..=5 => rng.below(200) as usize,
        6..=7 => rng.below(SEG as u64) as usize,
        _ => rng.below(3 * SEG as u64) as usize,
    }
}

fn policy(rng: &mut Rng) -> FlushPolicy {
    match rng.below(3) {
        0 => FlushPolicy::Explicit,
        1 => FlushPolicy::EveryRecord,
        _ => FlushPolicy::Timeout(Duration::from_micros(200)),
    }
}

/// The producer role: sends forever (until killed or the consumer goes away).
/// Lengths come from `Rng::new(seed)` alone, so the consumer can replay them; stalls and
/// flushes from a second generator.
fn produce(mut p: Producer, seed: u64, timeout: Duration) -> Result<u64, Error> {
    let mut lens = Rng::new(seed);
    let mut ctl = Rng::new(seed ^ 0x5555);
    p.set_flush_policy(policy(&mut ctl));
    let mut buf = Vec::new();
    for seq in 0.. {
        make_record(seq, next_len(&mut lens), &mut buf);
        p.send_timeout(&buf, timeout)?;
        match ctl.below(200) {
            0 => std::thread::sleep(Duration::from_micros(ctl.below(2000))),
            1..=10 => p.flush()?,
            _ => {}
        }
    }
    unreachable!()
}

/// The consumer role: reads and checks until the stream ends or fails; returns how many
/// records were good and how it ended.
fn consume(c: &mut Consumer, seed: u64, timeout: Duration) -> (u64, Result<(), Error>) {
    let mut rng = Rng::new(seed ^ 0xAAAA);
    let mut lens = Rng::new(seed);
    let (mut buf, mut scratch) = (Vec::new(), Vec::new());
    let mut seq = 0u64;
    loop {
        let r = match c.recv_timeout(timeout) {
            Ok(Some(r)) => r,
            Ok(None) => return (seq, Ok(())),
            Err(e) => return (seq, Err(e.into())),
        };
        let len = next_len(&mut lens);
        buf.clear();
        if let Err(e) = r.read_all_into(&mut buf) {
            return (seq, Err(e.into()));
        }
        if let Err(msg) = check_record(seq, len, &buf, &mut scratch) {
            panic!("consumer got a bad record: {msg}");
        }
        seq += 1;
        if rng.below(300) == 0 {
            std::thread::sleep(Duration::from_micros(rng.below(3000)));
        }
    }
}

fn sigkill(child: &mut Child) {
    // SAFETY: kill(2) with a pid we spawned and have not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "the child must die by the kill, not earlier: {status}"
    );
}

#[test]
fn producer_killed_at_random_consumer_gets_a_clean_prefix_then_peer_dead() {
    if role().as_deref() == Some("producer") {
        let seed = env_u64("SEED", 1);
        let p = Producer::from_env(FD_VAR).unwrap();
        let _ = produce(p, seed, Duration::from_secs(3600));
        std::process::exit(3); // must not get here: it is killed first
    }
    let trials = env_u64("SHMFLOW_KILL_TRIALS", 200);
    let mut rng = Rng::new(0xC0FFEE);
    let (mut total_records, mut worst_detect) = (0u64, Duration::ZERO);
    for trial in 0..trials {
        let seed = rng.next();
        let (mut c, handle) = Consumer::create_anonymous(geometry()).unwrap();
        let mut child = spawn(
            "producer_killed_at_random_consumer_gets_a_clean_prefix_then_peer_dead",
            "producer",
            &[("SEED", seed.to_string())],
            Some(&handle),
        );
        drop(handle);
        // A peer killed before it attached is reported as never attached, not as dead after
        // a clean prefix: kill only after it attached.
        wait_attached(|| c.metrics().producer_state == shmflow::metrics::EndState::Attached);
        let delay = Duration::from_micros(rng.below(30_000));
        let killer = std::thread::spawn(move || {
            std::thread::sleep(delay);
            sigkill(&mut child);
            Instant::now()
        });
        let (got, end) = consume(&mut c, seed, Duration::from_secs(10));
        let killed_at = killer.join().unwrap();
        let detect = killed_at.elapsed();
        worst_detect = worst_detect.max(detect);
        match end {
            Err(Error::PeerDead(e)) if e.end() == End::Producer => {}
            other => panic!("trial {trial}: after {got} records the consumer ended with {other:?}, not PeerDead"),
        }
        total_records += got;
    }
    println!("{trials} producer kills: {total_records} records checked, consumer noticed within {worst_detect:?} of the kill (worst)");
}

#[test]
fn consumer_killed_at_random_producer_gets_peer_dead() {
    if role().as_deref() == Some("consumer") {
        let seed = env_u64("SEED", 1);
        let mut c = Consumer::from_env(FD_VAR).unwrap();
        let _ = consume(&mut c, seed, Duration::from_secs(3600));
        std::process::exit(3);
    }
    let trials = env_u64("SHMFLOW_KILL_TRIALS", 200);
    let mut rng = Rng::new(0xBEEF);
    let mut worst_detect = Duration::ZERO;
    for trial in 0..trials {
        let seed = rng.next();
        let (p, handle) = Producer::create_anonymous(geometry()).unwrap();
        let mut child = spawn(
            "consumer_killed_at_random_producer_gets_peer_dead",
            "consumer",
            &[("SEED", seed.to_string())],
            Some(&handle),
        );
        drop(handle);
        wait_attached(|| p.metrics().consumer_state == shmflow::metrics::EndState::Attached);
        let delay = Duration::from_micros(rng.below(30_000));
        let killer = std::thread::spawn(move || {
            std::thread::sleep(delay);
            sigkill(&mut child);
            Instant::now()
        });
        let end = produce(p, seed, Duration::from_secs(10));
        let killed_at = killer.join().unwrap();
        worst_detect = worst_detect.max(killed_at.elapsed());
        match end {
            Err(Error::PeerDead(e)) if e.end() == End::Consumer => {}
            other => panic!("trial {trial}: the producer ended with {other:?}, not PeerDead"),
        }
    }
    println!(
        "{trials} consumer kills: the producer noticed within {worst_detect:?} of the kill (worst)"
    );
}

#[test]
#[ignore = "10-minute soak: run with scripts/soak.sh"]
fn soak_random_sizes_and_stalls() {
    let secs = env_u64("SHMFLOW_SOAK_SECS", 600);
    if role().as_deref() == Some("soak-producer") {
        let seed = env_u64("SEED", 1);
        let mut p = Producer::from_env(FD_VAR).unwrap();
        let (mut lens, mut ctl) = (Rng::new(seed), Rng::new(seed ^ 0x5555));
        p.set_flush_policy(policy(&mut ctl));
        let mut buf = Vec::new();
        let end = Instant::now() + Duration::from_secs(secs);
        let mut seq = 0;
        while Instant::now() < end {
            for _ in 0..1000 {
                make_record(seq, next_len(&mut lens), &mut buf);
                p.send(&buf).unwrap();
                seq += 1;
                if ctl.below(200) == 0 {
                    std::thread::sleep(Duration::from_micros(ctl.below(2000)));
                } else if ctl.below(20) == 0 {
                    p.flush().unwrap();
                }
            }
        }
        drop(p);
        std::process::exit(0);
    }
    let seed = 0x50A4;
    let (mut c, handle) = Consumer::create_anonymous(Geometry {
        segment_size: SEG,
        segment_count: 8,
    })
    .unwrap();
    let mut child = spawn(
        "soak_random_sizes_and_stalls",
        "soak-producer",
        &[
            ("SEED", seed.to_string()),
            ("SHMFLOW_SOAK_SECS", secs.to_string()),
        ],
        Some(&handle),
    );
    drop(handle);
    let mut lens = Rng::new(seed);
    let mut stall = Rng::new(seed ^ 1);
    let (mut buf, mut scratch) = (Vec::new(), Vec::new());
    let (mut seq, mut bytes) = (0u64, 0u64);
    let start = Instant::now();
    while let Some(r) = c.recv().unwrap() {
        let len = next_len(&mut lens);
        buf.clear();
        r.read_all_into(&mut buf).unwrap();
        check_record(seq, len, &buf, &mut scratch).unwrap();
        seq += 1;
        bytes += len as u64;
        if stall.below(300) == 0 {
            std::thread::sleep(Duration::from_micros(stall.below(3000)));
        }
    }
    assert!(child.wait().unwrap().success());
    println!(
        "soak: {seq} records, {bytes} bytes in {:.0?}, all in order and intact",
        start.elapsed()
    );
}
