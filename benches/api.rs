//! criterion benchmarks of the calls users make, between two threads of one process (the
//! cross-process figures are `shmflow bench`'s). Run: `cargo bench --bench api` (with
//! `--features tokio` for `async/*`); one group: `cargo bench --bench api -- gate`.
//!
//! - `send_recv/{bytes}`: `send` on one thread, `recv` on the other, records per second;
//! - `claim_commit/{bytes}`: the record written in place (`claim`, `commit`) and read with
//!   `recv`;
//! - `drain/{bytes}`: `send`, and the reader takes everything there with `drain`;
//! - `gate/{n}`: `n` producer threads into one gate, read by one thread;
//! - `barrier/{none,every_1000}`: 64 B records with an aligned barrier after every 1000, read
//!   with `recv_message` (the cost of a barrier is the difference over 1000 records);
//! - `markers/{off,1ms}`: 64 B records with latency markers off and at one per millisecond;
//! - `open_or_create/race`: a producer and a consumer on two threads call `open_or_create`
//!   on one fresh name at once (64 segments of 4 KiB), timed until both have their end;
//! - `async/{recv,send}` (feature `tokio`): the same stream with `recv_async` on a
//!   current-thread runtime against a blocking producer, and `send_async` against a blocking
//!   consumer.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use shmflow::{
    Alignment, Consumer, FlushPolicy, Gate, GateGeometry, GateMessage, Geometry, LatencyMarkers,
    Message, Producer,
};

const SIZES: [usize; 4] = [8, 64, 512, 4096];
/// Records per timed iteration of a stream.
const BATCH: u64 = 1024;

fn pair() -> (Producer, Consumer) {
    let (mut p, c) = shmflow::pair(Geometry::default()).unwrap();
    p.set_flush_policy(FlushPolicy::Explicit);
    (p, c)
}

/// Times `iters × BATCH` records of `len` bytes: `write` sends each (then the producer is
/// dropped), `read` on its own thread reads to the end and returns the count.
fn stream(
    iters: u64,
    len: usize,
    mut p: Producer,
    c: Consumer,
    mut write: impl FnMut(&mut Producer, &[u8], u64),
    read: impl FnOnce(Consumer) -> u64 + Send + 'static,
) -> Duration {
    let total = iters * BATCH;
    let reader = std::thread::spawn(move || read(c));
    let data = vec![0x5Au8; len];
    let start = Instant::now();
    for i in 0..total {
        write(&mut p, &data, i);
    }
    drop(p);
    let n = reader.join().unwrap();
    let t = start.elapsed();
    assert_eq!(n, total, "every record read");
    t
}

fn recv_all(mut c: Consumer) -> u64 {
    let mut n = 0;
    while let Some(r) = c.recv().unwrap() {
        black_box(r.as_bytes());
        n += 1;
    }
    n
}

fn send_recv(c: &mut Criterion) {
    let mut group = c.benchmark_group("send_recv");
    group.throughput(Throughput::Elements(BATCH));
    for len in SIZES {
        group.bench_with_input(BenchmarkId::from_parameter(len), &len, |b, &len| {
            b.iter_custom(|iters| {
                let (p, c) = pair();
                stream(iters, len, p, c, |p, d, _| p.send(d).unwrap(), recv_all)
            })
        });
    }
    group.finish();
}

fn claim_commit(c: &mut Criterion) {
    let mut group = c.benchmark_group("claim_commit");
    group.throughput(Throughput::Elements(BATCH));
    for len in SIZES {
        group.bench_with_input(BenchmarkId::from_parameter(len), &len, |b, &len| {
            b.iter_custom(|iters| {
                let (p, c) = pair();
                let write = |p: &mut Producer, d: &[u8], _| {
                    let mut claim = p.claim(d.len()).unwrap();
                    claim.copy_from_slice(d);
                    claim.commit();
                };
                stream(iters, len, p, c, write, recv_all)
            })
        });
    }
    group.finish();
}

fn drain(c: &mut Criterion) {
    let mut group = c.benchmark_group("drain");
    group.throughput(Throughput::Elements(BATCH));
    for len in SIZES {
        group.bench_with_input(BenchmarkId::from_parameter(len), &len, |b, &len| {
            b.iter_custom(|iters| {
                let (p, c) = pair();
                let read = |mut c: Consumer| {
                    let mut n = 0u64;
                    loop {
                        let got = c
                            .drain(usize::MAX, |r| {
                                black_box(r.as_bytes());
                                Ok::<_, shmflow::RecvError>(())
                            })
                            .unwrap();
                        if got == 0 {
                            return n;
                        }
                        n += got as u64;
                    }
                };
                stream(iters, len, p, c, |p, d, _| p.send(d).unwrap(), read)
            })
        });
    }
    group.finish();
}

fn gate(c: &mut Criterion) {
    let mut group = c.benchmark_group("gate");
    for n in [1u32, 2, 4, 8] {
        group.throughput(Throughput::Elements(BATCH * n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let (mut gate, handles) = Gate::create_anonymous(GateGeometry::new(n)).unwrap();
                let per = iters * BATCH;
                let writers: Vec<_> = handles
                    .into_iter()
                    .map(|h| {
                        std::thread::spawn(move || {
                            let mut p = Producer::from_handle(h).unwrap();
                            p.set_flush_policy(FlushPolicy::Explicit);
                            let rec = [0x5Au8; 64];
                            for _ in 0..per {
                                p.send(&rec).unwrap();
                            }
                        })
                    })
                    .collect();
                let start = Instant::now();
                let mut got = 0u64;
                while let Some(m) = gate.recv().unwrap() {
                    if let GateMessage::Record { record, .. } = m {
                        black_box(record.as_bytes());
                        got += 1;
                    }
                }
                let t = start.elapsed();
                for w in writers {
                    w.join().unwrap();
                }
                assert_eq!(got, per * n as u64);
                t
            })
        });
    }
    group.finish();
}

fn barrier(c: &mut Criterion) {
    let mut group = c.benchmark_group("barrier");
    group.throughput(Throughput::Elements(BATCH));
    for every in [0u64, 1000] {
        let name = if every == 0 { "none" } else { "every_1000" };
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let (p, c) = pair();
                let write = move |p: &mut Producer, d: &[u8], i: u64| {
                    p.send(d).unwrap();
                    if every > 0 && i % every == every - 1 {
                        p.send_barrier(i / every + 1, Alignment::Aligned, b"")
                            .unwrap();
                    }
                };
                let read = |mut c: Consumer| {
                    let mut n = 0u64;
                    while let Some(m) = c.recv_message().unwrap() {
                        if let Message::Record(r) = m {
                            black_box(r.as_bytes());
                            n += 1;
                        }
                    }
                    n
                };
                stream(iters, 64, p, c, write, read)
            })
        });
    }
    group.finish();
}

fn markers(c: &mut Criterion) {
    let mut group = c.benchmark_group("markers");
    group.throughput(Throughput::Elements(BATCH));
    for (name, every) in [("off", None), ("1ms", Some(Duration::from_millis(1)))] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let (mut p, c) = pair();
                p.set_latency_markers(every.map(|e| LatencyMarkers::every(e, "bench")));
                stream(iters, 64, p, c, |p, d, _| p.send(d).unwrap(), recv_all)
            })
        });
    }
    group.finish();
}

fn open_or_create(c: &mut Criterion) {
    let mut group = c.benchmark_group("open_or_create");
    let geometry = Geometry {
        segment_size: 4096,
        segment_count: 64,
    };
    let mut round = 0u64;
    group.bench_function("race", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                round += 1;
                let name = format!("/shmflow-bench-race-{}-{round}", std::process::id());
                let go = std::sync::Arc::new(std::sync::Barrier::new(2));
                let (go2, name2) = (go.clone(), name.clone());
                let other = std::thread::spawn(move || {
                    go2.wait();
                    let start = Instant::now();
                    let c = Consumer::builder()
                        .geometry(geometry)
                        .open_or_create(&name2)
                        .unwrap();
                    (start.elapsed(), c)
                });
                go.wait();
                let start = Instant::now();
                let p = Producer::builder()
                    .geometry(geometry)
                    .open_or_create(&name)
                    .unwrap();
                let mine = start.elapsed();
                let (theirs, c) = other.join().unwrap();
                total += mine.max(theirs);
                drop((p, c));
                // Both ends are gone; the last one removes the name (this is a no-op then).
                let _ = nix::sys::mman::shm_unlink(name.as_str());
            }
            total
        })
    });
    group.finish();
}

#[cfg(feature = "tokio")]
fn asynch(c: &mut Criterion) {
    let mut group = c.benchmark_group("async");
    group.throughput(Throughput::Elements(BATCH));
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    group.bench_function("recv", |b| {
        b.iter_custom(|iters| {
            let (p, c) = pair();
            let read = move |mut c: Consumer| {
                rt().block_on(async {
                    let mut n = 0u64;
                    while let Some(r) = c.recv_async().await.unwrap() {
                        black_box(r.as_bytes());
                        n += 1;
                    }
                    n
                })
            };
            stream(iters, 64, p, c, |p, d, _| p.send(d).unwrap(), read)
        })
    });
    group.bench_function("send", |b| {
        b.iter_custom(|iters| {
            let (mut p, c) = pair();
            let total = iters * BATCH;
            let reader = std::thread::spawn(move || recv_all(c));
            let start = Instant::now();
            rt().block_on(async {
                let rec = [0x5Au8; 64];
                for _ in 0..total {
                    p.send_async(&rec).await.unwrap();
                }
            });
            drop(p);
            assert_eq!(reader.join().unwrap(), total);
            start.elapsed()
        })
    });
    group.finish();
}

#[cfg(not(feature = "tokio"))]
fn asynch(_: &mut Criterion) {}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = send_recv, claim_commit, drain, gate, barrier, markers, open_or_create, asynch
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
