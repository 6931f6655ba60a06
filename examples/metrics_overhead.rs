//! What the per-record counters cost: one-way throughput of 64-byte records between two
//! threads, metrics on and off, alternating runs in one process; prints the medians, the
//! spread and the ratio.
//!
//! ```text
//! cargo run --release --example metrics_overhead [-- ROUNDS]
//! ```

use std::time::Instant;

use clap::Parser;
use shmflow::{FlushPolicy, Geometry};

const RECORDS: u64 = 5_000_000;

fn run(metrics: bool) -> f64 {
    let (mut p, mut c) = shmflow::pair(Geometry::default()).unwrap();
    p.set_flush_policy(FlushPolicy::Explicit);
    p.set_metrics(metrics);
    c.set_metrics(metrics);
    let reader = std::thread::spawn(move || {
        let mut n = 0u64;
        while let Some(r) = c.recv().unwrap() {
            std::hint::black_box(r.as_bytes());
            n += 1;
        }
        n
    });
    let rec = [7u8; 64];
    let start = Instant::now();
    for _ in 0..RECORDS {
        p.send(&rec).unwrap();
    }
    drop(p);
    assert_eq!(reader.join().unwrap(), RECORDS);
    RECORDS as f64 / start.elapsed().as_secs_f64()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// What the per-record counters cost: one-way throughput of 64-byte records between two
/// threads, metrics on and off.
#[derive(Parser)]
#[command(name = "metrics_overhead")]
struct Args {
    /// Alternating runs with the per-record counters on and off.
    #[arg(default_value_t = 11)]
    rounds: usize,
}

fn main() {
    let rounds = Args::parse().rounds;
    let (mut on, mut off) = (Vec::new(), Vec::new());
    run(true); // warm-up
    for _ in 0..rounds {
        on.push(run(true));
        off.push(run(false));
    }
    let (mon, moff) = (median(&mut on), median(&mut off));
    let spread = |v: &[f64]| (v[0] / 1e6, v[v.len() - 1] / 1e6);
    println!("64 B records, 2 threads, {RECORDS} per run, {rounds} alternating runs each");
    println!(
        "metrics on : median {:.1} M records/s (min {:.1}, max {:.1})",
        mon / 1e6,
        spread(&on).0,
        spread(&on).1
    );
    println!(
        "metrics off: median {:.1} M records/s (min {:.1}, max {:.1})",
        moff / 1e6,
        spread(&off).0,
        spread(&off).1
    );
    println!("on / off = {:.3}", mon / moff);
}
