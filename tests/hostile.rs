//! Hostile memory: a real peer runs in another process while a third thread scribbles random
//! values anywhere in the region (header, cursors, ring slots, frame headers, segments). The
//! side under test must see only typed errors or garbled-but-bounded records: no panic, no
//! access outside the region (that would be a signal), no wait past its deadline. Seeded, so a
//! failure can be replayed with `SHMFLOW_HOSTILE_SEED`.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use shmflow::{Consumer, Error, FlushPolicy, Geometry, Producer};

const RUN: Duration = Duration::from_millis(1500);
const MAX_RECORD: u64 = 1 << 20;

fn geometry() -> Geometry {
    Geometry {
        segment_size: 4096,
        segment_count: 4,
    }
}

/// Writes random values at random places of the region until told to stop.
fn scribbler(name: &str, seed: u64, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    let mut map = common::map_region_mut(name);
    std::thread::spawn(move || {
        let mut rng = Rng::new(seed);
        let len = map.len() as u64;
        let mut writes = 0;
        while !stop.load(Ordering::Relaxed) {
            let at = (rng.below(len - 8) & !7) as usize;
            let v = match rng.below(4) {
                0 => rng.next(),
                1 => rng.below(16),
                2 => u64::MAX - rng.below(4),
                _ => rng.below(1 << 33),
            };
            map[at..at + 8].copy_from_slice(&v.to_le_bytes());
            writes += 1;
            if writes % 16 == 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        writes
    })
}

fn outcome(e: impl Into<Error>) -> &'static str {
    match e.into() {
        Error::Corrupt(_) => "corrupt",
        Error::Timeout | Error::WouldBlock => "timeout",
        Error::Closed(_) => "closed",
        Error::PeerDead(_) => "peer-dead",
        Error::ProducerFailed(_) => "failed",
        Error::RecordAborted(_) => "aborted",
        Error::RecordTooLarge(_) => "too-large",
        _ => "other",
    }
}

fn peer_exit_ok(status: std::process::ExitStatus) {
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        None,
        "the peer died of a signal (access outside the region?): {status}"
    );
    assert_eq!(
        status.code(),
        Some(0),
        "the peer panicked or failed: {status}"
    );
}

fn seeds() -> Vec<u64> {
    match std::env::var("SHMFLOW_HOSTILE_SEED") {
        Ok(s) => vec![s.parse().unwrap()],
        Err(_) => vec![1, 2, 3],
    }
}

#[test]
fn reader_survives_a_scribbled_region() {
    if role().as_deref() == Some("producer") {
        // The real peer: writes until its deadline, whatever the region says.
        let mut p = match Producer::open(&std::env::var("NAME").unwrap()) {
            Ok(p) => p,
            Err(e) => {
                println!("peer could not attach: {e}"); // a typed error is a fine outcome
                std::process::exit(0);
            }
        };
        p.set_flush_policy(FlushPolicy::EveryRecord);
        let mut rng = Rng::new(9);
        let end = Instant::now() + RUN;
        let mut buf = Vec::new();
        let mut seq = 0;
        while Instant::now() < end {
            make_record(seq, rng.below(10_000) as usize, &mut buf);
            seq += 1;
            let _ = p.send_timeout(&buf, Duration::from_millis(50));
        }
        std::process::exit(0);
    }
    for seed in seeds() {
        let name = unique_name(&format!("hostile-r{seed}"));
        let mut c = Consumer::create(&name, geometry()).unwrap();
        c.set_max_record_len(MAX_RECORD);
        let child = spawn(
            "reader_survives_a_scribbled_region",
            "producer",
            &[("NAME", name.clone())],
            None,
        );
        wait_attached(|| c.metrics().producer_state == shmflow::metrics::EndState::Attached);
        let stop = Arc::new(AtomicBool::new(false));
        let scrib = scribbler(&name, seed, stop.clone());
        let start = Instant::now();
        let mut seen = std::collections::BTreeMap::new();
        while start.elapsed() < RUN + Duration::from_millis(500) {
            let call = Instant::now();
            let key = match c.recv_timeout(Duration::from_millis(100)) {
                // The parts of a (possibly scribbled) spanning record are waited for with a
                // bound too: the call as a whole must end near its deadlines.
                Ok(Some(r)) => match r.to_vec_timeout(Duration::from_millis(100)) {
                    Ok(v) => {
                        assert!(v.len() as u64 <= MAX_RECORD);
                        "record"
                    }
                    Err(e) => outcome(e),
                },
                Ok(None) => "end",
                Err(e) => outcome(e),
            };
            assert!(
                call.elapsed() < Duration::from_secs(2),
                "recv_timeout(100 ms) + to_vec_timeout(100 ms) took {:?}",
                call.elapsed()
            );
            *seen.entry(key).or_insert(0u64) += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let writes = scrib.join().unwrap();
        drop(c);
        peer_exit_ok(child.wait_with_output().unwrap().status);
        forget_name(&name);
        println!("seed {seed}: {writes} scribbles, reader saw {seen:?}");
    }
}

#[test]
fn writer_survives_a_scribbled_region() {
    if role().as_deref() == Some("consumer") {
        let mut c = match Consumer::open(&std::env::var("NAME").unwrap()) {
            Ok(c) => c,
            Err(e) => {
                println!("peer could not attach: {e}");
                std::process::exit(0);
            }
        };
        c.set_max_record_len(MAX_RECORD);
        let end = Instant::now() + RUN;
        while Instant::now() < end {
            if let Ok(Some(r)) = c.recv_timeout(Duration::from_millis(50)) {
                let _ = r.to_vec_timeout(Duration::from_millis(50));
            }
        }
        std::process::exit(0);
    }
    for seed in seeds() {
        let name = unique_name(&format!("hostile-w{seed}"));
        let mut p = Producer::create(&name, geometry()).unwrap();
        let child = spawn(
            "writer_survives_a_scribbled_region",
            "consumer",
            &[("NAME", name.clone())],
            None,
        );
        wait_attached(|| p.metrics().consumer_state == shmflow::metrics::EndState::Attached);
        let stop = Arc::new(AtomicBool::new(false));
        let scrib = scribbler(&name, seed ^ 0xFF, stop.clone());
        let mut rng = Rng::new(seed);
        let mut buf = Vec::new();
        let start = Instant::now();
        let mut seen = std::collections::BTreeMap::new();
        let mut seq = 0;
        while start.elapsed() < RUN {
            make_record(seq, rng.below(10_000) as usize, &mut buf);
            seq += 1;
            let call = Instant::now();
            let res = match rng.below(3) {
                0 => p
                    .send_timeout(&buf, Duration::from_millis(50))
                    .map_err(Error::from),
                1 => p.try_send(&buf).map_err(Error::from),
                _ => p.flush().map_err(Error::from),
            };
            assert!(
                call.elapsed() < Duration::from_secs(2),
                "a 50 ms send took {:?}",
                call.elapsed()
            );
            let key = match res {
                Ok(()) => "ok",
                Err(e) => outcome(e),
            };
            *seen.entry(key).or_insert(0u64) += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let writes = scrib.join().unwrap();
        drop(p);
        peer_exit_ok(child.wait_with_output().unwrap().status);
        forget_name(&name);
        println!("seed {seed}: {writes} scribbles, writer saw {seen:?}");
    }
}

#[test]
fn gate_and_its_producers_survive_a_scribbled_region() {
    if role().as_deref() == Some("gate-producer") {
        let c: u32 = std::env::var("CHANNEL").unwrap().parse().unwrap();
        let mut p = match Producer::open_channel(&std::env::var("NAME").unwrap(), c) {
            Ok(p) => p,
            Err(e) => {
                println!("peer could not attach: {e}");
                std::process::exit(0);
            }
        };
        let mut rng = Rng::new(c as u64);
        let end = Instant::now() + RUN;
        let mut buf = Vec::new();
        let mut seq = 0;
        let t = Duration::from_millis(50);
        while Instant::now() < end {
            make_record(seq, rng.below(10_000) as usize, &mut buf);
            seq += 1;
            let call = Instant::now();
            let _ = match rng.below(10) {
                0 => p
                    .try_send_event(1, &buf[..buf.len().min(100)])
                    .map_err(Error::from),
                1 => p
                    .send_priority_event_timeout(2, &buf[..buf.len().min(200)], t)
                    .map_err(Error::from),
                2 => p.flush().map_err(Error::from),
                _ => p.send_timeout(&buf, t).map_err(Error::from),
            };
            assert!(
                call.elapsed() < Duration::from_secs(2),
                "a 50 ms call took {:?}",
                call.elapsed()
            );
        }
        std::process::exit(0);
    }
    for seed in seeds() {
        let name = unique_name(&format!("hostile-g{seed}"));
        let gg = shmflow::GateGeometry::new(3)
            .with_exclusive(2)
            .with_floating(2)
            .with_segment_size(4096);
        let mut gate = shmflow::Gate::create(&name, gg).unwrap();
        gate.set_max_record_len(MAX_RECORD);
        let kids: Vec<_> = (0..3)
            .map(|c| {
                spawn(
                    "gate_and_its_producers_survive_a_scribbled_region",
                    "gate-producer",
                    &[("NAME", name.clone()), ("CHANNEL", c.to_string())],
                    None,
                )
            })
            .collect();
        wait_attached(|| {
            gate.metrics()
                .channels
                .iter()
                .all(|c| c.snapshot.producer_state == shmflow::metrics::EndState::Attached)
        });
        let stop = Arc::new(AtomicBool::new(false));
        let scrib = scribbler(&name, seed ^ 0x6A7E, stop.clone());
        let start = Instant::now();
        let mut seen = std::collections::BTreeMap::new();
        while start.elapsed() < RUN + Duration::from_millis(500) {
            let call = Instant::now();
            let key = match gate.recv_timeout(Duration::from_millis(100)) {
                Ok(Some(shmflow::GateMessage::Record { record, .. })) => {
                    match record.to_vec_timeout(Duration::from_millis(100)) {
                        Ok(v) => {
                            assert!(v.len() as u64 <= MAX_RECORD);
                            "record"
                        }
                        Err(e) => outcome(e),
                    }
                }
                Ok(Some(shmflow::GateMessage::Event { event, .. })) => {
                    assert!(event.payload.len() <= shmflow::MAX_EVENT_PAYLOAD);
                    "event"
                }
                Ok(Some(shmflow::GateMessage::EndOfPartition { .. })) => "end",
                Ok(Some(shmflow::GateMessage::ChannelDead { .. })) => "dead",
                Ok(Some(shmflow::GateMessage::ChannelFailed { .. })) => "failed",
                // (Scribbles that happen to form a barrier and its checkpoint's messages.)
                Ok(Some(
                    shmflow::GateMessage::Barrier { .. }
                    | shmflow::GateMessage::BarrierCancelled { .. }
                    | shmflow::GateMessage::InFlightEnd { .. },
                )) => "barrier",
                Ok(Some(shmflow::GateMessage::InFlight { .. })) => "record",
                Ok(Some(other)) => panic!("unexpected message {other:?}"),
                Ok(None) => "all-ended",
                Err(e) => outcome(e),
            };
            assert!(
                call.elapsed() < Duration::from_secs(2),
                "recv_timeout(100 ms) + to_vec_timeout(100 ms) took {:?}",
                call.elapsed()
            );
            *seen.entry(key).or_insert(0u64) += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let writes = scrib.join().unwrap();
        drop(gate);
        for k in kids {
            peer_exit_ok(k.wait_with_output().unwrap().status);
        }
        forget_name(&name);
        println!("seed {seed}: {writes} scribbles, gate saw {seen:?}");
    }
}

/// Removes the test's own name once both ends are gone: a scribbled header can say anything
/// about who removes it, or make it no shmflow region at all (which `shmflow clean` leaves).
fn forget_name(name: &str) {
    let _ = shmflow::monitor::remove_stale_and_unread(name);
    let _ = std::fs::remove_file(format!("/dev/shm{name}"));
}
