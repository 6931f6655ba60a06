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

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use shmflow::metrics::monotonic_now_ns;
use shmflow::monitor::GateMonitor;
use shmflow::{Alignment, Gate, GateMessage, Producer, Released};

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
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
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

fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

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
    report(args, &runs)
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
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut kids = (0..args.channels)
        .map(|c| {
            Command::new(&exe)
                .args([
                    "__demo-role",
                    "checkpoint-producer",
                    &name,
                    &c.to_string(),
                    &start_ns.to_string(),
                    &end_ns.to_string(),
                    &(args.interval_ms * 1_000_000).to_string(),
                    mode.key(),
                ])
                .spawn()
                .map_err(|e| e.to_string())
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

/// The producer child: records flat out into its channel, a barrier every interval, until the
/// end time.
pub(crate) fn role(args: &[String]) -> Result<(), String> {
    let [_, name, channel, start, end, interval, mode] = args else {
        return Err("bad checkpoint-producer arguments".into());
    };
    let num = |s: &str, what: &str| s.parse::<u64>().map_err(|_| format!("bad {what}: {s}"));
    let channel = num(channel, "channel")? as u32;
    let (start, end, interval) = (
        num(start, "start")?,
        num(end, "end")?,
        num(interval, "interval")?,
    );
    let alignment = match mode.as_str() {
        "unaligned" => Alignment::Unaligned,
        _ => Alignment::Aligned,
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

struct Summary {
    delay_p50: f64,
    delay_p99: f64,
    duration_p50: f64,
    duration_p99: f64,
    in_flight_mib: f64,
    read_mb_s: f64,
    cap: f64,
    counted: usize,
}

fn summarize(args: &Args, r: &Run) -> Summary {
    let steady: Vec<&Checkpoint> = r
        .checkpoints
        .iter()
        .filter(|c| c.sent_s >= args.warmup_secs)
        .collect();
    let d: Vec<f64> = steady.iter().map(|c| c.delay_ms).collect();
    let du: Vec<f64> = steady.iter().map(|c| c.duration_ms).collect();
    let s: Vec<&Sample> = r
        .samples
        .iter()
        .filter(|s| s.t_s >= args.warmup_secs && s.t_s <= args.secs)
        .collect();
    let med =
        |f: &dyn Fn(&Sample) -> f64| quantile(&s.iter().map(|x| f(x)).collect::<Vec<_>>(), 0.5);
    Summary {
        delay_p50: quantile(&d, 0.5),
        delay_p99: quantile(&d, 0.99),
        duration_p50: quantile(&du, 0.5),
        duration_p99: quantile(&du, 0.99),
        in_flight_mib: med(&|x| x.in_flight_bytes as f64 / 1048576.0),
        read_mb_s: med(&|x| x.read_mb_s),
        cap: med(&|x| x.cap as f64),
        counted: steady.len(),
    }
}

fn report(args: &Args, runs: &[Run]) -> Result<(), String> {
    let sums: Vec<Summary> = runs.iter().map(|r| summarize(args, r)).collect();
    println!();
    println!(
        "{:<32} {:>5} {:>18} {:>22} {:>14} {:>12} {:>8}",
        "mode (past the warm-up)",
        "ckpts",
        "delay p50/p99 ms",
        "duration p50/p99 ms",
        "in flight MiB",
        "read MB/s",
        "vs first"
    );
    let base = sums[0].read_mb_s;
    for (r, s) in runs.iter().zip(&sums) {
        println!(
            "{:<32} {:>5} {:>8.1} / {:>7.1} {:>10.1} / {:>9.1} {:>14.2} {:>12.2} {:>8.2}",
            r.mode.label(args.target_ms),
            s.counted,
            s.delay_p50,
            s.delay_p99,
            s.duration_p50,
            s.duration_p99,
            s.in_flight_mib,
            s.read_mb_s,
            s.read_mb_s / base
        );
    }
    let pool = (args.segments / args.channels * args.channels) as f64 * args.segment_size as f64;
    let expected_aligned = pool / (args.rate_mb * 1e6) * 1e3;
    let (a, d, u) = (&sums[0], &sums[1], &sums[2]);
    let goals = [
        (
            format!(
                "aligned delay p50 {:.0} ms is about pool / rate = {expected_aligned:.0} ms (within 30 %)",
                a.delay_p50
            ),
            (a.delay_p50 / expected_aligned - 1.0).abs() <= 0.3,
        ),
        (
            format!(
                "debloated delay p50 {:.0} ms is close to the {} ms target (within 2×)",
                d.delay_p50, args.target_ms
            ),
            d.delay_p50 <= 2.0 * args.target_ms as f64,
        ),
        (
            format!(
                "debloated throughput {:.2}× the aligned run's (at least 0.9×)",
                d.read_mb_s / a.read_mb_s
            ),
            d.read_mb_s >= 0.9 * a.read_mb_s,
        ),
        (
            format!(
                "unaligned delay p50 {:.1} ms is below the debloated one",
                u.delay_p50
            ),
            u.delay_p50 < d.delay_p50,
        ),
    ];
    println!();
    for (text, ok) in &goals {
        println!("  [{}] {text}", if *ok { "met" } else { "NOT MET" });
    }

    // CSVs and the JSON summary.
    let mut csv = String::from("mode,id,sent_s,delay_ms,duration_ms,released\n");
    let mut samples = String::from("mode,t_s,in_flight_bytes,read_mb_s,segment_cap\n");
    for r in runs {
        for c in &r.checkpoints {
            let _ = writeln!(
                csv,
                "{},{},{:.3},{:.3},{:.3},{}",
                r.mode.key(),
                c.id,
                c.sent_s,
                c.delay_ms,
                c.duration_ms,
                if c.unaligned { "unaligned" } else { "aligned" }
            );
        }
        for s in &r.samples {
            let _ = writeln!(
                samples,
                "{},{:.2},{},{:.3},{}",
                r.mode.key(),
                s.t_s,
                s.in_flight_bytes,
                s.read_mb_s,
                s.cap
            );
        }
    }
    let write = |file: &str, text: &str| {
        let path = args.out.join(file);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
    };
    write("checkpoints.csv", &csv)?;
    write("checkpoints-samples.csv", &samples)?;
    let json = serde_json::json!({
        "channels": args.channels,
        "segments": args.segments,
        "segment_size": args.segment_size,
        "rate_mb_s": args.rate_mb,
        "target_ms": args.target_ms,
        "interval_ms": args.interval_ms,
        "secs_per_mode": args.secs,
        "warmup_secs": args.warmup_secs,
        "expected_aligned_ms": expected_aligned,
        "modes": runs.iter().zip(&sums).map(|(r, s)| serde_json::json!({
            "mode": r.mode.key(),
            "checkpoints": s.counted,
            "delay_ms_p50": s.delay_p50,
            "delay_ms_p99": s.delay_p99,
            "duration_ms_p50": s.duration_p50,
            "duration_ms_p99": s.duration_p99,
            "in_flight_mib_median": s.in_flight_mib,
            "read_mb_s_median": s.read_mb_s,
            "segment_cap_median": s.cap,
        })).collect::<Vec<_>>(),
        "goals": goals.iter().map(|(t, ok)| serde_json::json!({"goal": t, "met": ok})).collect::<Vec<_>>(),
    });
    write("checkpoints.json", &format!("{json:#}\n"))?;
    let svg = args.out.join("checkpoints.svg");
    plot(args, runs, expected_aligned, &svg).map_err(|e| format!("{}: {e}", svg.display()))?;
    println!(
        "\nwrote checkpoints.csv, checkpoints-samples.csv, checkpoints.json and checkpoints.svg in {}",
        args.out.display()
    );
    Ok(())
}

/// Three panels on one time axis, one shaded phase per mode: each checkpoint's barrier delay
/// (log scale, with the expected aligned delay and the target), the bytes in flight, and the
/// throughput read.
fn plot(
    args: &Args,
    runs: &[Run],
    expected_aligned: f64,
    path: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1200, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "Checkpoint barriers under backpressure: {} x {} KiB segments read at {} MB/s, a barrier every {} ms",
        args.segments,
        args.segment_size / 1024,
        args.rate_mb,
        args.interval_ms
    );
    let root = root.titled(&title, ("sans-serif", 20))?;
    let (top, rest) = root.split_vertically(430);
    let (mid, bottom) = rest.split_vertically(220);
    let phase = args.secs;
    let t_max = phase * runs.len() as f64;
    let colors = [mode_color(0), mode_color(1), mode_color(2)];
    let x_of = |i: usize, t: f64| i as f64 * phase + t.clamp(0.0, phase);

    // Barrier delay, log scale from 0.01 ms to past the slowest.
    let worst = runs
        .iter()
        .flat_map(|r| r.checkpoints.iter().map(|c| c.delay_ms))
        .fold(expected_aligned, f64::max);
    let y_max = worst * 2.0;
    let mut c = ChartBuilder::on(&top)
        .margin_left(12)
        .margin_right(24)
        .margin_top(8)
        .x_label_area_size(10)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..t_max, (0.01f64..y_max).log_scale())?;
    c.draw_series((0..runs.len()).map(|i| {
        Rectangle::new(
            [(i as f64 * phase, 0.01), ((i + 1) as f64 * phase, y_max)],
            phase_shade(i).filled(),
        )
    }))?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("barrier delay, ms (log scale)")
        .y_label_formatter(&|v| {
            if *v >= 1.0 {
                format!("{v:.0}")
            } else if *v >= 0.1 {
                format!("{v:.1}")
            } else {
                format!("{v:.2}")
            }
        })
        .light_line_style(TRANSPARENT)
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()?;
    let center = plotters::style::text_anchor::Pos::new(
        plotters::style::text_anchor::HPos::Center,
        plotters::style::text_anchor::VPos::Top,
    );
    for (i, r) in runs.iter().enumerate() {
        c.draw_series([Text::new(
            format!("phase {}: {}", i + 1, r.mode.label(args.target_ms)),
            ((i as f64 + 0.5) * phase, y_max * 0.8),
            ("sans-serif", 16)
                .into_font()
                .style(FontStyle::Bold)
                .color(&colors[i])
                .pos(center),
        )])?;
        // The warm-up, not counted, is hatched off by a lighter marker.
        c.draw_series(r.checkpoints.iter().map(|k| {
            let style = if k.sent_s >= args.warmup_secs {
                colors[i].filled()
            } else {
                colors[i].mix(0.3).filled()
            };
            Circle::new((x_of(i, k.sent_s), k.delay_ms.max(0.011)), 4, style)
        }))?
        .label(format!(
            "{}: barrier delay (pale: warm-up)",
            r.mode.label(args.target_ms)
        ))
        .legend(move |(x, y)| Circle::new((x + 10, y), 4, colors[i].filled()));
        // A checkpoint that lasts longer than its barrier's delay (unaligned: until its
        // in-flight data is read) also shows its duration, as a ring.
        let longer: Vec<&Checkpoint> = r
            .checkpoints
            .iter()
            .filter(|k| k.duration_ms > 2.0 * k.delay_ms.max(0.01))
            .collect();
        if !longer.is_empty() {
            c.draw_series(longer.iter().map(|k| {
                Circle::new(
                    (x_of(i, k.sent_s), k.duration_ms),
                    6,
                    colors[i].stroke_width(2),
                )
            }))?
            .label(format!(
                "{}: checkpoint duration (in-flight data read)",
                r.mode.label(args.target_ms)
            ))
            .legend(move |(x, y)| Circle::new((x + 10, y), 6, colors[i].stroke_width(2)));
        }
    }
    let dashed = |y: f64| {
        DashedLineSeries::new([(0.0, y), (t_max, y)], 8, 6, BLACK.mix(0.6).stroke_width(1))
    };
    c.draw_series(dashed(expected_aligned))?
        .label(format!("pool / rate = {expected_aligned:.0} ms"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.6)));
    c.draw_series(DashedLineSeries::new(
        [(0.0, args.target_ms as f64), (t_max, args.target_ms as f64)],
        3,
        4,
        RGBColor(20, 110, 60).stroke_width(2),
    ))?
    .label(format!("debloating target {} ms", args.target_ms))
    .legend(|(x, y)| {
        PathElement::new(
            vec![(x, y), (x + 20, y)],
            RGBColor(20, 110, 60).stroke_width(2),
        )
    });
    c.configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.92))
        .border_style(RGBColor(180, 180, 180))
        .label_font(("sans-serif", 14))
        .draw()?;

    // Bytes in flight, and throughput read.
    let mib = |s: &Sample| s.in_flight_bytes as f64 / 1048576.0;
    let mib_max = runs
        .iter()
        .flat_map(|r| r.samples.iter().map(mib))
        .fold(1.0, f64::max);
    samples_panel(
        &mid,
        runs,
        phase,
        mib_max * 1.15,
        "in flight, MiB",
        &mib,
        false,
    )?;
    let mb = |s: &Sample| s.read_mb_s;
    let mb_max = runs
        .iter()
        .flat_map(|r| r.samples.iter().map(mb))
        .fold(args.rate_mb, f64::max);
    samples_panel(&bottom, runs, phase, mb_max * 1.2, "read, MB/s", &mb, true)?;
    root.present()?;
    Ok(())
}

/// The colour of mode `i`'s points and lines.
fn mode_color(i: usize) -> plotters::style::RGBColor {
    use plotters::style::RGBColor;
    [
        RGBColor(200, 60, 40),
        RGBColor(20, 110, 60),
        RGBColor(30, 70, 170),
    ][i % 3]
}

/// The shade of mode `i`'s phase.
fn phase_shade(i: usize) -> plotters::style::RGBColor {
    use plotters::style::RGBColor;
    if i.is_multiple_of(2) {
        RGBColor(236, 240, 247)
    } else {
        RGBColor(250, 250, 250)
    }
}

/// A panel of one figure of the 100 ms samples, one line per mode, each mode a shaded phase of
/// `phase` seconds; `bottom` carries the time axis.
fn samples_panel(
    area: &plotters::drawing::DrawingArea<
        plotters::backend::SVGBackend<'_>,
        plotters::coord::Shift,
    >,
    runs: &[Run],
    phase: f64,
    y_max: f64,
    y_desc: &str,
    value: &dyn Fn(&Sample) -> f64,
    bottom: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let t_max = phase * runs.len() as f64;
    let mut c = ChartBuilder::on(area)
        .margin_left(12)
        .margin_right(24)
        .margin_bottom(if bottom { 8 } else { 0 })
        .x_label_area_size(if bottom { 40 } else { 10 })
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..t_max, 0f64..y_max)?;
    c.draw_series((0..runs.len()).map(|i| {
        Rectangle::new(
            [(i as f64 * phase, 0.0), ((i + 1) as f64 * phase, y_max)],
            phase_shade(i).filled(),
        )
    }))?;
    let formatter = |v: &f64| {
        // A boundary ends one mode and starts the next; the last ends the last.
        let t = if *v >= t_max - 1e-9 { phase } else { v % phase };
        format!("{:.0}", t.round())
    };
    let mut mesh = c.configure_mesh();
    mesh.disable_x_mesh()
        .y_desc(y_desc)
        .light_line_style(TRANSPARENT)
        .bold_line_style(RGBColor(215, 215, 215));
    if bottom {
        mesh.x_desc("seconds (each mode from its own start)")
            .x_labels(t_max as usize + 1)
            .x_label_formatter(&formatter);
    } else {
        mesh.x_labels(0);
    }
    mesh.draw()?;
    for (i, r) in runs.iter().enumerate() {
        c.draw_series(LineSeries::new(
            r.samples
                .iter()
                .filter(|s| s.t_s >= 0.0 && s.t_s <= phase)
                .map(|s| (i as f64 * phase + s.t_s, value(s))),
            mode_color(i).stroke_width(2),
        ))?;
    }
    Ok(())
}
