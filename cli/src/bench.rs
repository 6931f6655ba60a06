//! `shmflow bench`: shmflow against the hardware floor and the OS, between two processes
//! every time (this binary re-executes itself as the peer: `__bench-role`, see
//! `bench/roles.rs`).
//!
//! Every ratio is measured as paired, adjacent short trials of its two sides (`bench/paired.rs`):
//! A then B, then B then A, `--pairs` times (10 by default), the baseline re-measured in
//! every pair; the report gives the median of the per-pair ratios and their spread, and flags
//! a baseline that moved more than 2× between pairs. A measure is the median of all its
//! trials. Latencies are exact percentiles of a trial's round trips after warm-up (all
//! samples kept and sorted: no histogram bucketing error); throughputs a trial's records over
//! its steady state (0.3 s; `--quick`: 0.05 s, 2 000 round trips, 2 pairs).
//!
//! Modes: `rtt_spin_*` busy-polls on both sides; `rtt_block_*` and `rtt_same_cpu_p50_ns` park
//! on the futex between messages without spinning (`WaitStrategy::Park`), which is what the
//! futex floor does; `rtt_default_wait_*` and `rtt_same_cpu_default_wait_p50_ns` use the
//! default `WaitStrategy::Block` (a look every 5 µs for 50 µs, then park). `small_rps` and
//! `bulk_gbps` are the tuned best: `FlushPolicy::Explicit`, `claim`, busy-polling on both
//! sides, `drain`, per-record counters off, like the raw floors, which spin on their atomics.
//! `small_batch_rps` is the tuned stream with records claimed 64 at a time (`claim_batch`).
//! `plain_rps` is every setting at its default: `send`, and `while let Some(r) = rx.recv()?`.
//! The sending loops of the shmflow streams (local, async, bridges, direct ends, and TCP's
//! framed 64 B baseline) and the raw ring's copy their record from the start of a cache line
//! (`bytes::LineBuf`, `harness::LineRec`) and look at the clock about once per 512 KiB, at least
//! every 64 records (`harness::records_per_look`; the ring every 8 slots of 64 KiB), so that
//! neither where the build put a buffer nor how often a loop reads the clock moves one side of
//! a ratio and not the other. The pipe and Unix socket baselines look every 1 024 records, raw
//! TCP every 64 KiB write; `netem`'s streams every record (their rates are the link's).
//! `--open-loop` measures latency at fixed offered rates instead (see `bench/openloop.rs`);
//! `--case` measures the user's own case (see `bench/case.rs`).
//!
//! The modules: `groups` (the trials of each `--only` group), `paired` (which trials run side
//! by side, and the per-pair ratios), `floors` (the raw shared-memory
//! floors; the raw ring's two sides run in a binary of their own,
//! `src/bin/shmflow-raw-ring.rs`), `local` (shmflow, pipes and Unix sockets between local processes), `asynch`, `remote` and `netem`
//! (the groups of those names), `openloop`, `report` (the ratios and the output), `roles`
//! (the peer processes' command line), `harness` (what they all share) and `bytes` (the
//! record a sending loop copies and the sum a reader takes, shared with the raw ring).

mod asynch;
mod bytes;
mod case;
mod floors;
mod groups;
mod harness;
mod local;
mod netem;
mod openloop;
mod paired;
mod remote;
mod report;
mod roles;

use std::time::Duration;

use shmflow::WaitStrategy;

pub(crate) use roles::Role;

/// Busy-polling, as the tuned measures wait.
const SPIN: WaitStrategy = WaitStrategy::BusyPoll(Duration::from_secs(1));
/// Bytes of a bulk record.
const BULK: usize = 64 * 1024;

/// How long each trial runs, and how many pairs of them.
struct Cfg {
    /// Round trips timed per trial.
    rounds: usize,
    /// Seconds per trial of a stream.
    secs: f64,
    /// Pairs of trials per ratio.
    pairs: usize,
}

/// Arguments of `shmflow bench`.
#[derive(clap::Args, Debug)]
pub(crate) struct BenchArgs {
    /// Short: 2 pairs of trials of 0.05 s or 2 000 round trips (a check that everything runs,
    /// not figures).
    #[arg(long)]
    quick: bool,
    /// One JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Run one group only (for profiling). `netem` (remote channels across a delayed link
    /// between two network namespaces; needs root) runs only when named here.
    #[arg(long, value_parser = ["spin", "block", "same_cpu", "small", "bulk", "pool", "markers", "async", "remote", "netem"])]
    only: Option<String>,
    /// Pairs of adjacent trials per ratio (A B, then B A, ...): the report gives the median
    /// and the spread (min..max) of the per-pair ratios, and of each measure over its trials
    /// [default: 10; --quick: 2; --case: 5, its round trips against the floor's].
    #[arg(long)]
    pairs: Option<usize>,
    /// Latency at fixed offered rates instead (Aeron's load-test method): for every length and
    /// rate, shmflow (default and busy-poll), a Unix socket and a pipe in turn.
    #[arg(long)]
    open_loop: bool,
    /// Open loop: message lengths in bytes (at least 8).
    #[arg(long, value_delimiter = ',', default_values_t = [32usize, 288, 1344])]
    lengths: Vec<usize>,
    /// Open loop: offered rates in messages per second.
    #[arg(long, value_delimiter = ',', default_values_t = [100_000u64, 500_000, 1_000_000])]
    rates: Vec<u64>,
    /// Open loop: seconds sent before measuring.
    #[arg(long, default_value_t = 1.0)]
    warmup_secs: f64,
    /// Open loop: seconds measured per case (`--quick`: 0.2 s, warm-up 0.1 s).
    #[arg(long, default_value_t = 3.0)]
    secs: f64,
    /// Open loop: write the percentile plot (SVG) here.
    #[arg(long)]
    svg: Option<String>,
    /// Your own case instead: round trips at --rate (beside the floor: the same round trips on
    /// raw shared memory, both sides spinning), one-way latency at --rate (open loop) and the
    /// receiver's idle CPU, for records of --len bytes, each side waiting as --send-wait and
    /// --recv-wait say, over a pool of --pool.
    #[arg(long)]
    case: bool,
    /// Case: bytes per record (at least 8).
    #[arg(long, default_value_t = 64)]
    len: usize,
    /// Case: records per second: the pace of the round trips (the case's and the floor's)
    /// and the rate offered in the one-way measure.
    #[arg(long, default_value_t = 100_000)]
    rate: u64,
    /// Case: how the sending process waits (for a free segment, for the reply): block, park,
    /// or busy-poll:DURATION (e.g. busy-poll:50us).
    #[arg(long, default_value = "block")]
    send_wait: String,
    /// Case: how the receiving process waits for records (block, park, busy-poll:DURATION).
    #[arg(long, default_value = "block")]
    recv_wait: String,
    /// Case: the pool, SEGMENT_SIZE:COUNT (e.g. 32KiB:16) [default: the default geometry].
    #[arg(long)]
    pool: Option<String>,
    /// Case: pin the sending process to one CPU and the receiving one to another,
    /// SENDER,RECEIVER (e.g. 0,1), the floor's processes alike [default: wherever the
    /// scheduler puts them].
    #[arg(long)]
    pin: Option<String>,
}

/// Runs the selected groups (or the open loop) and prints the report.
pub(crate) fn main(args: &BenchArgs) -> Result<(), String> {
    let quick = args.quick;
    let json = args.json;
    if args.pairs == Some(0) {
        return Err("--pairs 0: at least one pair is needed".into());
    }
    harness::fail_on_panic();
    if args.case {
        let c = case::Case {
            len: args.len,
            rate: args.rate,
            send_wait: args.send_wait.clone(),
            recv_wait: args.recv_wait.clone(),
            pool: match &args.pool {
                Some(p) => case::parse_pool(p)?,
                None => shmflow::Geometry::default(),
            },
            pin: args.pin.as_deref().map(case::parse_pin).transpose()?,
            // The measured seconds' worth at the rate (3 s, 0.3 s with --quick), at least
            // 1 000 where that takes no more than 20 s (5 s with --quick) of each side.
            rounds: {
                let rate = args.rate as f64;
                let (secs, most, cap) = if quick {
                    (0.3, 5.0, 20_000.0)
                } else {
                    (3.0, 20.0, 100_000.0)
                };
                (rate * secs)
                    .max((rate * most).min(1000.0))
                    .min(cap)
                    .max(1.0) as usize
            },
            pairs: args.pairs.unwrap_or(if quick { 2 } else { 5 }),
            warmup: Duration::from_millis(if quick { 100 } else { 500 }),
            measure: Duration::from_millis(if quick { 300 } else { 3000 }),
            quiet: Duration::from_millis(if quick { 300 } else { 1000 }),
        };
        return case::main(&c, json);
    }
    if args.open_loop {
        let secs = |s: f64, what: &str| {
            Duration::try_from_secs_f64(s).map_err(|_| format!("--{what} {s}: not a duration"))
        };
        let plan = openloop::Plan {
            lengths: args.lengths.clone(),
            rates: args.rates.clone(),
            warmup: if quick {
                Duration::from_millis(100)
            } else {
                secs(args.warmup_secs, "warmup-secs")?
            },
            measure: if quick {
                Duration::from_millis(200)
            } else {
                secs(args.secs, "secs")?
            },
        };
        return openloop::main(&plan, json, args.svg.as_deref());
    }
    let pairs = args.pairs.unwrap_or(if quick { 2 } else { 10 });
    let cfg = if quick {
        Cfg {
            rounds: 2_000,
            secs: 0.05,
            pairs,
        }
    } else {
        Cfg {
            rounds: 10_000,
            secs: 0.3,
            pairs,
        }
    };
    let outcome = paired::run(groups::trials(&cfg, args.only.as_deref()), cfg.pairs, !json);
    report::print(&outcome, quick, json);
    Ok(())
}
