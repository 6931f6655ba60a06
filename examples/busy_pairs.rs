//! Ping-pong pairs of threads in one process, every end waiting with
//! `WaitStrategy::BusyPoll`: each pair's first thread sends a 64 B record at a fixed interval
//! and waits for the second to send it back. Prints each pair's round trips (p50, p99,
//! p99.9) and the process's CPU time and context switches: what busy-polling ends do when
//! they are more than the machine has CPUs for.
//!
//! ```text
//! cargo build --release --example busy_pairs
//! target/release/examples/busy_pairs --pairs 4 --interval-us 100
//! perf stat -e syscalls:sys_enter_sched_setaffinity,cpu-migrations target/release/examples/busy_pairs --pairs 4
//! ```

use std::time::{Duration, Instant};

use clap::Parser;

use shmflow::{Geometry, WaitStrategy};

/// Ping-pong pairs of threads, every end busy-polling: round trips by pair.
#[derive(Parser)]
#[command(name = "busy_pairs", args_override_self = true)]
struct Args {
    /// Pairs of threads (each pair's echo polls after every record it sends back).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pairs: u32,
    /// How long each pair runs.
    #[arg(long, value_name = "S", default_value_t = 3.0, value_parser = seconds)]
    secs: f64,
    /// Time from one round trip's start to the next (the sender sleeps in between).
    #[arg(long, value_name = "US", default_value_t = 100)]
    interval_us: u64,
    /// Every end's `BusyPoll` duration.
    #[arg(long, value_name = "US", default_value_t = 200)]
    busy_poll_us: u64,
}

/// A positive, finite number of seconds.
fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 1e9 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number of seconds")),
    }
}

/// Round trips of one pair, in nanoseconds, sorted.
fn run_pair(args: &Args) -> Vec<u64> {
    let wait = WaitStrategy::BusyPoll(Duration::from_micros(args.busy_poll_us));
    let (mut there, mut arrives) = shmflow::pair(Geometry::default()).expect("a channel");
    let (mut back, mut returns) = shmflow::pair(Geometry::default()).expect("a channel");
    there.set_wait_strategy(wait);
    back.set_wait_strategy(wait);
    arrives.set_wait_strategy(wait);
    returns.set_wait_strategy(wait);
    let echo = std::thread::spawn(move || {
        while let Some(r) = arrives.recv().expect("a record") {
            let record = r.to_vec().expect("a whole record");
            back.send(&record).expect("room");
        }
    });
    let interval = Duration::from_micros(args.interval_us);
    let end = Instant::now() + Duration::from_secs_f64(args.secs);
    let mut next = Instant::now();
    let mut took = Vec::new();
    while Instant::now() < end {
        let now = Instant::now();
        if now < next {
            std::thread::sleep(next - now);
        }
        next += interval;
        let start = Instant::now();
        there.send(&[7u8; 64]).expect("room");
        let r = returns.recv().expect("a record").expect("not the end");
        assert_eq!(r.to_vec().expect("a whole record").len(), 64);
        took.push(start.elapsed().as_nanos() as u64);
    }
    drop(there);
    echo.join().expect("the echo thread");
    took.sort_unstable();
    took
}

fn at(sorted: &[u64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len() - 1);
    sorted[i] as f64 / 1e3
}

fn main() {
    let args = Args::parse();
    let took: Vec<Vec<u64>> = std::thread::scope(|s| {
        let pairs: Vec<_> = (0..args.pairs)
            .map(|_| s.spawn(|| run_pair(&args)))
            .collect();
        pairs
            .into_iter()
            .map(|p| p.join().expect("a pair"))
            .collect()
    });
    for (i, t) in took.iter().enumerate() {
        if t.is_empty() {
            println!("pair {i}: no round trip in the time given");
            continue;
        }
        println!(
            "pair {i}: {} round trips, p50 {:.2} µs, p99 {:.2} µs, p99.9 {:.2} µs",
            t.len(),
            at(t, 0.5),
            at(t, 0.99),
            at(t, 0.999)
        );
    }
    // SAFETY: `getrusage` fills the zeroed struct it is given and reads nothing else.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    println!(
        "CPU {:.2} s user, {:.2} s system; context switches {} voluntary, {} involuntary",
        secs(u.ru_utime),
        secs(u.ru_stime),
        u.ru_nvcsw,
        u.ru_nivcsw
    );
}
