//! `shmflow demo checkpoints`: how long a checkpoint barrier takes through a backpressured
//! channel, with aligned barriers, aligned barriers with buffer debloating, and unaligned
//! barriers, one mode after the other on one time axis.
//!
//! Producers (child processes, one per channel of a gate) write 1 KiB records flat out and a
//! barrier every `--interval-ms`, stamped with its send time; this process reads the gate at a
//! fixed rate (`--rate-mb`, by default 20 MB/s, paced by bytes: a slow operator), so the
//! channels are full and the producers backpressured. An aligned barrier waits behind all that
//! is queued: about the pool's bytes divided by the rate. With debloating (`--target-ms`) the
//! consumer caps what is in flight at what it reads in the target time, so the barrier waits
//! about that long. An unaligned barrier overtakes the queue through the priority lane; the
//! data it overtook is handed back as the checkpoint's in-flight data, and the checkpoint is
//! complete when that is read (Flink persists it with the checkpoint).
//!
//! Per checkpoint: the barrier delay (its send to its release at the gate, Flink's start delay
//! plus alignment) and the checkpoint duration (its send to the gate's last duty for it: the
//! release when aligned, the end of its in-flight data when unaligned). Every 100 ms: the
//! bytes in flight (written and not yet read) and the throughput read. Writes
//! `checkpoints.csv` (one row per checkpoint), `checkpoints-samples.csv`, `checkpoints.svg`
//! and `checkpoints.json` (the summary).

mod report;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use shmflow::metrics::monotonic_now_ns;
use shmflow::monitor::GateMonitor;
use shmflow::{Alignment, Gate, GateMessage, Producer, Released};

use super::Role;

/// Settings of `shmflow demo checkpoints`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct Args {
    /// Seconds per mode.
    #[arg(long, default_value_t = 12.0)]
    pub(crate) secs: f64,
    /// Seconds at the start of each mode not counted (the queue filling, the cap settling).
    #[arg(long, default_value_t = 2.0)]
    pub(crate) warmup_secs: f64,
    /// Channels of the gate, one producer process each.
    #[arg(long, default_value_t = 1)]
    pub(crate) channels: u32,
    /// Segments in all (split evenly between the channels, as exclusive segments).
    #[arg(long, default_value_t = 16)]
    pub(crate) segments: u32,
    /// Bytes per segment.
    #[arg(long, default_value_t = 1024 * 1024)]
    pub(crate) segment_size: u32,
    /// The rate this process reads at, MB/s.
    #[arg(long, default_value_t = 20.0)]
    pub(crate) rate_mb: f64,
    /// The debloating target, ms.
    #[arg(long, default_value_t = 100)]
    pub(crate) target_ms: u64,
    /// Time between barriers, ms (longer than an unaligned checkpoint's in-flight data takes
    /// to read, or a newer barrier cancels the one before).
    #[arg(long, default_value_t = 1000)]
    pub(crate) interval_ms: u64,
    /// Where the CSVs, the JSON and the SVG go.
    #[arg(long, default_value = ".")]
    pub(crate) out: PathBuf,
}

const RECORD: usize = 1024;

/// The three modes, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Mode {
    Aligned,
    Debloated,
    Unaligned,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Aligned, Mode::Debloated, Mode::Unaligned];

    fn label(self, target_ms: u64) -> String {
        match self {
            Mode::Aligned => "aligned".into(),
            Mode::Debloated => format!("aligned, debloated to {target_ms} ms"),
            Mode::Unaligned => "unaligned".into(),
        }
    }

    fn key(self) -> &'static str {
        match self {
            Mode::Aligned => "aligned",
            Mode::Debloated => "debloated",
            Mode::Unaligned => "unaligned",
        }
    }
}

/// One checkpoint as the gate saw it (times in seconds since the mode's start).
#[derive(Clone, Debug)]
struct Checkpoint {
    id: u64,
    sent_s: f64,
    delay_ms: f64,
    duration_ms: f64,
    unaligned: bool,
}

/// One 100 ms sample of the gate.
#[derive(Clone, Copy, Debug)]
struct Sample {
    t_s: f64,
    in_flight_bytes: u64,
    read_mb_s: f64,
    cap: u64,
}

/// What one mode measured.
struct Run {
    mode: Mode,
    checkpoints: Vec<Checkpoint>,
    samples: Vec<Sample>,
}

/// Runs the three modes, one after the other, and writes their output.
pub(crate) fn main(args: &Args) -> Result<(), String> {
    if args.channels == 0 || args.segments < args.channels {
        return Err("each channel needs a segment at least (--segments ≥ --channels)".into());
    }
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let per_channel = args.segments / args.channels;
    let pool = args.channels as u64 * per_channel as u64 * args.segment_size as u64;
    let rate = args.rate_mb * 1e6;
    println!(
        "gate of {} channel(s) × {per_channel} segments of {} KiB ({:.1} MiB in all), read at {} MB/s; \
         a barrier every {} ms; {} s per mode, the first {} s not counted",
        args.channels,
        args.segment_size / 1024,
        pool as f64 / 1048576.0,
        args.rate_mb,
        args.interval_ms,
        args.secs,
        args.warmup_secs
    );
    println!(
        "expected: aligned ≈ pool / rate = {:.0} ms; debloated ≈ the target, {} ms (at least two \
         segments per channel: {:.0} ms); unaligned ≈ the lane's latency",
        pool as f64 / rate * 1e3,
        args.target_ms,
        (2 * args.channels as u64 * args.segment_size as u64) as f64 / rate * 1e3
    );
    let mut runs = Vec::new();
    for mode in Mode::ALL {
        println!("running: {}", mode.label(args.target_ms));
        runs.push(run(args, mode, per_channel)?);
    }
    report::report(args, &runs)
}

fn run(args: &Args, mode: Mode, per_channel: u32) -> Result<Run, String> {
    let name = format!("/shmflow-demo-ckpt-{}-{}", std::process::id(), mode.key());
    let mut b = Gate::builder()
        .channels(args.channels)
        .exclusive(per_channel)
        .floating(0)
        .segment_size(args.segment_size);
    if mode == Mode::Debloated {
        b = b.debloat_target(Duration::from_millis(args.target_ms));
    }
    let mut gate = b.create(&name).map_err(|e| e.to_string())?;
    let start_ns = monotonic_now_ns() + 200_000_000;
    let end_ns = start_ns + (args.secs * 1e9) as u64;
    let mut kids = (0..args.channels)
        .map(|channel| {
            Role::CheckpointProducer {
                name: name.clone(),
                channel,
                start_ns,
                end_ns,
                interval_ns: args.interval_ms * 1_000_000,
                mode,
            }
            .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;

    // Sampler: every 100 ms, from a read-only view of the gate.
    let monitor = GateMonitor::open(&name).map_err(|e| e.to_string())?;
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let sampler = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut prev = monitor.snapshot();
        while !d2.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            let now = monitor.snapshot();
            let dt = now.at_ns.saturating_sub(prev.at_ns).max(1) as f64 / 1e9;
            let (mut written, mut read, mut read_before, mut cap) = (0, 0, 0, 0);
            for (c, p) in now.channels.iter().zip(&prev.channels) {
                written += c.snapshot.bytes_written;
                read += c.snapshot.bytes_read;
                read_before += p.snapshot.bytes_read;
                cap += c.snapshot.segment_cap;
            }
            out.push(Sample {
                t_s: now.at_ns.saturating_sub(start_ns) as f64 / 1e9,
                in_flight_bytes: written.saturating_sub(read),
                read_mb_s: read.saturating_sub(read_before) as f64 / 1e6 / dt,
                cap,
            });
            prev = now;
        }
        out
    });

    let rate = args.rate_mb * 1e6;
    let mut read_bytes = 0u64;
    let mut pace_from: Option<u64> = None;
    let mut checkpoints = Vec::new();
    // Unaligned checkpoints waiting for the end of their in-flight data: (id, sent, delay).
    let mut open: Vec<(u64, u64, f64)> = Vec::new();
    let rel = |ns: u64| ns.saturating_sub(start_ns) as f64 / 1e9;
    let result = (|| -> Result<(), String> {
        while let Some(m) = gate.recv().map_err(|e| e.to_string())? {
            let now = monotonic_now_ns();
            match m {
                GateMessage::Record { record, .. } | GateMessage::InFlight { record, .. } => {
                    let n = record.as_bytes().map_or(0, <[u8]>::len) as u64;
                    drop(record);
                    // Paced by bytes from the first record on: a consumer of `rate` bytes/s.
                    let from = *pace_from.get_or_insert(now);
                    read_bytes += n;
                    let due = from + (read_bytes as f64 / rate * 1e9) as u64;
                    pace_until(due);
                }
                GateMessage::Barrier {
                    id,
                    released,
                    emitted_ns,
                    ..
                } => {
                    let delay = now.saturating_sub(emitted_ns) as f64 / 1e6;
                    match released {
                        Released::Aligned => checkpoints.push(Checkpoint {
                            id,
                            sent_s: rel(emitted_ns),
                            delay_ms: delay,
                            duration_ms: delay,
                            unaligned: false,
                        }),
                        _ => open.push((id, emitted_ns, delay)),
                    }
                }
                GateMessage::InFlightEnd { id } => {
                    if let Some(i) = open.iter().position(|o| o.0 == id) {
                        let (id, sent, delay) = open.remove(i);
                        checkpoints.push(Checkpoint {
                            id,
                            sent_s: rel(sent),
                            delay_ms: delay,
                            duration_ms: now.saturating_sub(sent) as f64 / 1e6,
                            unaligned: true,
                        });
                    }
                }
                GateMessage::ChannelDead { channel, error } => {
                    return Err(format!("producer {channel}: {error}"))
                }
                GateMessage::ChannelFailed { channel, error } => {
                    return Err(format!("producer {channel}: {error}"))
                }
                _ => {}
            }
        }
        Ok(())
    })();
    done.store(true, Ordering::Relaxed);
    let samples = sampler.join().map_err(|_| "the sampler panicked")?;
    for k in &mut kids {
        let status = k.wait().map_err(|e| e.to_string())?;
        if !status.success() && result.is_ok() {
            return Err(format!("a producer failed: {status}"));
        }
    }
    result?;
    Ok(Run {
        mode,
        checkpoints,
        samples,
    })
}

/// Waits until the monotonic clock reaches `due`: sleeps while far, spins the last stretch.
fn pace_until(due: u64) {
    loop {
        let now = monotonic_now_ns();
        if now >= due {
            return;
        }
        let left = due - now;
        if left > 2_000_000 {
            std::thread::sleep(Duration::from_nanos(left - 1_000_000));
        } else {
            std::hint::spin_loop();
        }
    }
}

/// The producer child: records flat out into the channel `channel` of the gate `name` from
/// `start` to `end` (monotonic nanoseconds), a barrier every `interval` nanoseconds, unaligned
/// in the mode `Unaligned` and aligned otherwise.
pub(super) fn producer(
    name: &str,
    channel: u32,
    start: u64,
    end: u64,
    interval: u64,
    mode: Mode,
) -> Result<(), String> {
    let alignment = match mode {
        Mode::Unaligned => Alignment::Unaligned,
        Mode::Aligned | Mode::Debloated => Alignment::Aligned,
    };
    let mut p = Producer::open_channel(name, channel).map_err(|e| e.to_string())?;
    while monotonic_now_ns() < start {
        std::thread::sleep(Duration::from_millis(1));
    }
    let record = [0x5Au8; RECORD];
    let mut id = 0u64;
    let mut next = start + interval;
    loop {
        let now = monotonic_now_ns();
        if now >= end {
            break;
        }
        if now >= next {
            id += 1;
            p.send_barrier(id, alignment, b"")
                .map_err(|e| e.to_string())?;
            next += interval;
        }
        p.send(&record).map_err(|e| e.to_string())?;
    }
    Ok(())
}
