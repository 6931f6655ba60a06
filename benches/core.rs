//! criterion benchmarks of the public API. Run: `cargo bench`.
//!
//! - `frame/*`: one thread sends then receives one record (framing + hand-off cost, no
//!   cross-core traffic), by record size;
//! - `channel/*`: producer and consumer threads of one process, throughput by record size;
//! - `rtt/cross_process`: round trip of an 8-byte record to a child process and back
//!   (`iter_custom`, busy-poll and blocking).

use std::hint::black_box;
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use shmflow::{Consumer, FlushPolicy, Geometry, Producer, WaitStrategy};

const SIZES: [usize; 7] = [0, 8, 64, 512, 4096, 64 * 1024, 1024 * 1024];

fn pair(g: Geometry) -> (Producer, Consumer) {
    shmflow::pair(g).unwrap()
}

fn frame(c: &mut Criterion) {
    let mut group = c.benchmark_group("frame");
    for size in SIZES {
        let (mut p, mut rx) = pair(Geometry {
            segment_size: 64 * 1024,
            segment_count: 8,
        });
        p.set_flush_policy(FlushPolicy::EveryRecord);
        let data = vec![0x5Au8; size];
        group.throughput(Throughput::Bytes(size.max(1) as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, _| {
            b.iter(|| {
                p.send(black_box(&data)).unwrap();
                let r = rx.recv().unwrap().unwrap();
                match r.as_bytes() {
                    Some(bytes) => {
                        black_box(bytes);
                    }
                    None => {
                        black_box(r.to_vec().unwrap());
                    }
                }
            })
        });
    }
    group.finish();
}

fn channel(c: &mut Criterion) {
    let mut group = c.benchmark_group("channel");
    group.measurement_time(Duration::from_secs(3));
    for size in [8usize, 64, 512, 4096, 64 * 1024] {
        let per_iter: u64 = (4 << 20) / (size as u64 + 8);
        group.throughput(Throughput::Elements(per_iter));
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter_custom(|iters| {
                let (mut p, mut rx) = pair(Geometry::default());
                p.set_flush_policy(FlushPolicy::Explicit);
                let total = iters * per_iter;
                let reader = std::thread::spawn(move || {
                    let mut n = 0u64;
                    while let Some(r) = rx.recv().unwrap() {
                        black_box(r.len());
                        n += 1;
                    }
                    assert_eq!(n, total);
                });
                let data = vec![1u8; size];
                let start = Instant::now();
                for _ in 0..total {
                    p.send(&data).unwrap();
                }
                drop(p);
                reader.join().unwrap();
                start.elapsed()
            })
        });
    }
    group.finish();
}

const ROLE: &str = "SHMFLOW_BENCH_ROLE";

/// Child side of the round trip: echo every 8-byte record back.
fn echo_child() {
    let mut ping = Consumer::from_env("PING_FD").unwrap();
    let mut pong = Producer::from_env("PONG_FD").unwrap();
    pong.set_flush_policy(FlushPolicy::EveryRecord);
    let wait = if std::env::var(ROLE).unwrap() == "echo-spin" {
        WaitStrategy::BusyPoll(Duration::from_millis(10))
    } else {
        WaitStrategy::Block
    };
    ping.set_wait_strategy(wait);
    pong.set_wait_strategy(wait);
    while let Some(r) = ping.recv().unwrap() {
        let v = *r.as_pod::<u64>().unwrap();
        drop(r);
        pong.send_pod(&v).unwrap();
    }
}

fn rtt(c: &mut Criterion) {
    let mut group = c.benchmark_group("rtt");
    for mode in ["spin", "block"] {
        let g = Geometry {
            segment_size: 4096,
            segment_count: 4,
        };
        let (mut ping, ping_peer) = Producer::create_anonymous(g).unwrap();
        let (mut pong, pong_peer) = Consumer::create_anonymous(g).unwrap();
        ping.set_flush_policy(FlushPolicy::EveryRecord);
        let wait = if mode == "spin" {
            WaitStrategy::BusyPoll(Duration::from_millis(10))
        } else {
            WaitStrategy::Block
        };
        ping.set_wait_strategy(wait);
        pong.set_wait_strategy(wait);
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.env(ROLE, format!("echo-{mode}"));
        ping_peer.pass_to(&mut cmd, "PING_FD");
        pong_peer.pass_to(&mut cmd, "PONG_FD");
        let mut child = cmd.spawn().unwrap();
        drop((ping_peer, pong_peer));
        group.bench_function(BenchmarkId::new("cross_process", mode), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for i in 0..iters {
                    ping.send_pod(&i).unwrap();
                    let r = pong.recv().unwrap().unwrap();
                    black_box(r.as_pod::<u64>());
                }
                start.elapsed()
            })
        });
        drop(ping);
        while pong.recv().unwrap().is_some() {}
        child.wait().unwrap();
    }
    group.finish();
}

criterion_group!(benches, frame, channel, rtt);

fn main() {
    if std::env::var(ROLE).is_ok() {
        echo_child();
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
