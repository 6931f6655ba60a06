//! `shmflow bench --open-loop`: latency at a fixed offered rate, the way Aeron's load-test rig
//! measures it. The sender (this process) schedules message `i` at `start + i / rate` and
//! sends it at that instant, or at once if it is late; the message carries its *scheduled*
//! time, and the receiver (a child process) records `now - scheduled` in an HdrHistogram. A
//! sender that is held up (backpressure, a full socket buffer) therefore shows as latency of
//! every message that should have gone meanwhile: no coordinated omission. Both clocks are the
//! host's `CLOCK_MONOTONIC`.
//!
//! A run is *sustained* when the sender kept to its schedule: at the end of the measured
//! seconds it was less than [`LAG_LIMIT`] behind. A transport that cannot carry the rate is
//! reported as such, with the rate it reached, not averaged with the others.

use std::io::{BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::process::Child;
use std::time::Duration;

use hdrhistogram::Histogram;
use shmflow::{Consumer, FlushPolicy, Geometry, Producer, WaitStrategy};

use super::harness::{child, env_fd, finish, machine, pipe_pair, RawFdOf};
use super::roles::Role;

/// A sender this far behind its schedule at the end has not sustained the rate.
const LAG_LIMIT: Duration = Duration::from_millis(1);

/// Percentiles of the table and the JSON.
const PERCENTILES: [(&str, f64); 5] = [
    ("p50", 50.0),
    ("p90", 90.0),
    ("p99", 99.0),
    ("p99.9", 99.9),
    ("p99.99", 99.99),
];

/// The transports compared in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Transport {
    /// shmflow with every setting at its default (`EveryRecord`, `WaitStrategy::Block`).
    ShmflowDefault,
    /// shmflow tuned for latency: the receiver busy-polls (`WaitStrategy::BusyPoll`).
    ShmflowBusyPoll,
    /// A Unix stream socket, one `write` per message, blocking reads.
    #[value(name = "unix-socket")]
    Uds,
    /// A pipe, one `write` per message, blocking reads.
    Pipe,
}

impl Transport {
    const ALL: [Transport; 4] = [
        Transport::ShmflowDefault,
        Transport::ShmflowBusyPoll,
        Transport::Uds,
        Transport::Pipe,
    ];

    fn name(self) -> &'static str {
        match self {
            Transport::ShmflowDefault => "shmflow-default",
            Transport::ShmflowBusyPoll => "shmflow-busy-poll",
            Transport::Uds => "unix-socket",
            Transport::Pipe => "pipe",
        }
    }
}

/// Settings of an open-loop run.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) lengths: Vec<usize>,
    pub(crate) rates: Vec<u64>,
    pub(crate) warmup: Duration,
    pub(crate) measure: Duration,
}

/// What one (transport, length, rate) run measured.
#[derive(Debug)]
struct Outcome {
    transport: Transport,
    len: usize,
    rate: u64,
    /// Messages sent during the measured seconds, per second.
    achieved: f64,
    /// How far behind its schedule the sender was at the end.
    final_lag: Duration,
    sustained: bool,
    /// Nanoseconds at each of `PERCENTILES`, then the max.
    at: Vec<u64>,
    count: u64,
    /// (percentile, ns) points of the whole distribution, for the plot.
    curve: Vec<(f64, u64)>,
}

/// `clock`'s time in nanoseconds.
pub(super) fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; the callers pass clocks that always exist on Linux
    // (CLOCK_MONOTONIC, CLOCK_PROCESS_CPUTIME_ID).
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The host's monotonic clock, in nanoseconds (the same in every process).
pub(super) fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// An open loop's schedule: message `i` at `start + i × interval_ns`, until `end`; those
/// scheduled at `from` or later are measured.
pub(super) struct Schedule {
    pub(super) start: u64,
    pub(super) interval_ns: f64,
    pub(super) end: u64,
    pub(super) from: u64,
}

/// What a sender did with its schedule.
pub(super) struct Paced {
    /// Messages sent that were scheduled in the measured part.
    pub(super) sent: u64,
    /// How far behind its schedule the last send was, in ns.
    pub(super) lag: u64,
    /// When the last measured message went.
    pub(super) last: u64,
}

impl Schedule {
    /// Waits (spinning) for each message's time, or not at all when late, and calls `send`
    /// with its scheduled time.
    pub(super) fn run(
        &self,
        mut send: impl FnMut(u64) -> Result<(), String>,
    ) -> Result<Paced, String> {
        while now_ns() < self.start {
            std::hint::spin_loop();
        }
        let mut p = Paced {
            sent: 0,
            lag: 0,
            last: 0,
        };
        for i in 0u64.. {
            let sched = self.start + (i as f64 * self.interval_ns) as u64;
            if sched >= self.end {
                break;
            }
            let mut now = now_ns();
            while now < sched {
                std::hint::spin_loop();
                now = now_ns();
            }
            p.lag = now - sched;
            send(sched)?;
            if sched >= self.from {
                p.sent += 1;
                p.last = now;
            }
        }
        Ok(p)
    }
}

/// Sends one message on the transport under test.
type Sender = Box<dyn FnMut(&[u8]) -> Result<(), String>>;

/// Runs the sender of one (transport, length, rate) case and collects the receiver's report.
fn run_one(t: Transport, len: usize, rate: u64, plan: &Plan) -> Result<Outcome, String> {
    let interval_ns = 1e9 / rate as f64;
    let warm = plan.warmup.as_nanos() as u64;
    let total = warm + plan.measure.as_nanos() as u64;
    // The receiver counts what was scheduled from `measure_from` on.
    let start = now_ns() + 50_000_000;
    let measure_from = start + warm;
    let sink = Role::OlSink {
        transport: t,
        len,
        from: measure_from,
    };
    let mut msg = vec![0x5Au8; len];
    let (mut send, c): (Sender, Child) = match t {
        Transport::ShmflowDefault | Transport::ShmflowBusyPoll => {
            let g = Geometry::default();
            let (mut p, peer) = Producer::create_anonymous(g).map_err(|e| e.to_string())?;
            // The sender keeps the defaults in both cases; only the receiver's wait differs.
            p.set_flush_policy(FlushPolicy::default());
            let c = child(&sink, &[("CH", peer.as_fd_raw())], |_| {});
            drop(peer);
            (
                Box::new(move |m: &[u8]| p.send(m).map_err(|e| e.to_string())),
                c,
            )
        }
        Transport::Uds => {
            let (mut mine, theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
            let c = child(&sink, &[("IN", theirs.as_raw_fd())], |_| {});
            drop(theirs);
            (
                Box::new(move |m: &[u8]| mine.write_all(m).map_err(|e| e.to_string())),
                c,
            )
        }
        Transport::Pipe => {
            let (r, w) = pipe_pair();
            let c = child(&sink, &[("IN", r.as_raw_fd())], |_| {});
            drop(r);
            let mut w = std::fs::File::from(w);
            (
                Box::new(move |m: &[u8]| w.write_all(m).map_err(|e| e.to_string())),
                c,
            )
        }
    };
    let paced = Schedule {
        start,
        interval_ns,
        end: start + total,
        from: measure_from,
    }
    .run(|sched| {
        msg[..8].copy_from_slice(&sched.to_le_bytes());
        send(&msg)
    });
    drop(send);
    // The receiver is waited for before a failed send is reported.
    let report = finish(c);
    let Paced {
        sent: sent_measured,
        lag,
        last: last_sent,
    } = paced?;
    let report = report?;
    let mut it = report.split_whitespace();
    let mut next = || -> Result<u64, String> {
        it.next()
            .ok_or("short report from the open-loop receiver")?
            .parse::<u64>()
            .map_err(|e| e.to_string())
    };
    let count = next()?;
    let mut at = Vec::new();
    for _ in 0..=PERCENTILES.len() {
        at.push(next()?);
    }
    let points = next()?;
    let mut curve = Vec::new();
    for _ in 0..points {
        let p = next()? as f64 / 1e6;
        curve.push((p, next()?));
    }
    if count != sent_measured {
        return Err(format!(
            "{}: sent {sent_measured} measured messages, the receiver counted {count}",
            t.name()
        ));
    }
    let final_lag = Duration::from_nanos(lag);
    Ok(Outcome {
        transport: t,
        len,
        rate,
        // Over the time the sends took, which exceeds the measured seconds when it fell behind.
        achieved: sent_measured as f64
            / (last_sent.saturating_sub(measure_from) as f64 / 1e9)
                .max(plan.measure.as_secs_f64() * 0.999),
        final_lag,
        sustained: final_lag < LAG_LIMIT,
        at,
        count,
        curve,
    })
}

/// The receiving process: messages of `len` bytes over `transport`, the latency of those
/// scheduled at `from` (monotonic nanoseconds) or later counted. Prints the count, the
/// percentiles and max, then the distribution's points (percentile × 1e6, ns).
pub(crate) fn sink(transport: Transport, len: usize, from: u64) -> Result<(), String> {
    let mut h =
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).map_err(|e| e.to_string())?;
    let mut take = |b: &[u8]| {
        let now = now_ns();
        let sched = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
        if sched >= from {
            h.saturating_record(now.saturating_sub(sched).max(1));
        }
    };
    match transport {
        Transport::ShmflowDefault | Transport::ShmflowBusyPoll => {
            let mut c = Consumer::from_env("CH").map_err(|e| e.to_string())?;
            if transport == Transport::ShmflowBusyPoll {
                c.set_wait_strategy(WaitStrategy::BusyPoll(Duration::from_millis(100)));
            }
            // The loop a user writes.
            while let Some(r) = c.recv().map_err(|e| e.to_string())? {
                take(r.as_bytes().ok_or("a record in one segment")?);
            }
        }
        Transport::Uds | Transport::Pipe => {
            let mut r = BufReader::with_capacity(64 * 1024, std::fs::File::from(env_fd("IN")));
            let mut buf = vec![0u8; len];
            while r.read_exact(&mut buf).is_ok() {
                take(&buf);
            }
        }
    }
    let mut out = format!("{}", h.len());
    for (_, p) in PERCENTILES {
        out += &format!(" {}", h.value_at_percentile(p));
    }
    out += &format!(" {}", h.max());
    let curve: Vec<(f64, u64)> = h
        .iter_quantiles(2)
        .map(|v| (v.percentile(), v.value_iterated_to()))
        .collect();
    out += &format!(" {}", curve.len());
    for (p, v) in curve {
        out += &format!(" {} {v}", (p * 1e6) as u64);
    }
    println!("{out}");
    Ok(())
}

fn us(ns: u64) -> String {
    let us = ns as f64 / 1e3;
    if us < 10.0 {
        format!("{us:.2}")
    } else if us < 1000.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.0}")
    }
}

/// Runs every (length, rate) with every transport, alternating the transports within each
/// case; prints the table (or JSON), and writes the SVG plot if asked.
pub(crate) fn main(plan: &Plan, json: bool, svg: Option<&str>) -> Result<(), String> {
    let mut all = Vec::new();
    for &len in &plan.lengths {
        if len < 8 {
            return Err(format!(
                "message length {len}: at least 8 bytes (the scheduled time)"
            ));
        }
        for &rate in &plan.rates {
            if rate == 0 {
                return Err("a rate of 0 messages per second".into());
            }
            for t in Transport::ALL {
                let o = run_one(t, len, rate, plan)?;
                if !json {
                    eprintln!(
                        "  {:<18} {len:>5} B {rate:>8}/s  p50 {:>8} µs  p99 {:>8} µs  max {:>8} µs{}",
                        t.name(),
                        us(o.at[0]),
                        us(o.at[2]),
                        us(o.at[5]),
                        if o.sustained { "" } else { "  NOT SUSTAINED" }
                    );
                }
                all.push(o);
            }
        }
    }
    let (cpu, cores, kernel) = machine();
    if json {
        let runs: Vec<serde_json::Value> = all
            .iter()
            .map(|o| {
                let mut lat = serde_json::Map::new();
                for (i, (name, _)) in PERCENTILES.iter().enumerate() {
                    lat.insert(format!("{name}_ns"), o.at[i].into());
                }
                lat.insert("max_ns".into(), o.at[PERCENTILES.len()].into());
                serde_json::json!({
                    "transport": o.transport.name(),
                    "length": o.len,
                    "rate": o.rate,
                    "achieved_rate": o.achieved.round(),
                    "final_lag_ns": o.final_lag.as_nanos() as u64,
                    "sustained": o.sustained,
                    "count": o.count,
                    "latency": lat,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "machine": { "cpu": cpu, "cores": cores, "kernel": kernel },
                "warmup_secs": plan.warmup.as_secs_f64(),
                "measure_secs": plan.measure.as_secs_f64(),
                "runs": runs,
            })
        );
    } else {
        println!(
            "machine: {cpu}, {cores} cores, Linux {kernel}; warm-up {:?}, measured {:?} per case; latency in µs from each message's scheduled send time",
            plan.warmup, plan.measure
        );
        println!(
            "{:<18} {:>6} {:>9} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9}  sustained",
            "transport",
            "bytes",
            "rate/s",
            "achieved",
            "p50",
            "p90",
            "p99",
            "p99.9",
            "p99.99",
            "max"
        );
        for o in &all {
            print!(
                "{:<18} {:>6} {:>9} {:>10.0}",
                o.transport.name(),
                o.len,
                o.rate,
                o.achieved
            );
            for v in &o.at {
                print!(" {:>8}", us(*v));
            }
            if o.sustained {
                println!("  yes");
            } else {
                println!(
                    "  NO (sender {:.1} ms behind its schedule at the end)",
                    o.final_lag.as_secs_f64() * 1e3
                );
            }
        }
    }
    if let Some(path) = svg {
        plot(&all, plan, path, &cpu)?;
        if !json {
            println!("plot: {path}");
        }
    }
    Ok(())
}

/// The percentile distributions, HdrHistogram-style: x is the percentile on a "nines" scale
/// (1 / (1 - p), log), y the latency in µs (log); one panel per (length, rate).
fn plot(all: &[Outcome], plan: &Plan, path: &str, cpu: &str) -> Result<(), String> {
    use plotters::prelude::*;
    let rows = plan.lengths.len();
    let cols = plan.rates.len();
    let root =
        SVGBackend::new(path, (420 * cols as u32, 320 * rows as u32 + 40)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (title, body) = root.split_vertically(40);
    title
        .titled(
            &format!(
                "Open-loop latency by percentile, {cpu}: shmflow against a Unix socket and a pipe"
            ),
            ("sans-serif", 22),
        )
        .map_err(|e| e.to_string())?;
    let panels = body.split_evenly((rows, cols));
    // The palette of the backpressure demo's picture: shmflow's two modes in its blue and
    // orange, the OS baselines in grey and black.
    let colors = [
        RGBColor(20, 60, 160),
        RGBColor(235, 120, 95),
        RGBColor(120, 150, 120),
        RGBColor(40, 40, 40),
    ];
    let xmax = 1e6f64; // up to p99.9999
    for (pi, panel) in panels.iter().enumerate() {
        let (len, rate) = (plan.lengths[pi / cols], plan.rates[pi % cols]);
        let case: Vec<&Outcome> = all
            .iter()
            .filter(|o| o.len == len && o.rate == rate)
            .collect();
        let ymax = case
            .iter()
            .map(|o| o.at[PERCENTILES.len()] as f64 / 1e3)
            .fold(1.0f64, f64::max)
            * 2.0;
        let ymin = case
            .iter()
            .flat_map(|o| o.curve.first().map(|c| c.1 as f64 / 1e3))
            .fold(f64::INFINITY, f64::min)
            .clamp(0.01, 1.0)
            / 2.0;
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("{len} B records at {rate}/s"), ("sans-serif", 15))
            .margin(8)
            .margin_right(36)
            .x_label_area_size(28)
            .y_label_area_size(48)
            .build_cartesian_2d((1f64..xmax).log_scale(), (ymin..ymax).log_scale())
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("percentile")
            .y_desc("latency from the scheduled send, µs")
            .light_line_style(RGBColor(238, 238, 238))
            .bold_line_style(RGBColor(205, 205, 205))
            .x_label_formatter(&|x| {
                // x = 1 / (1 - p): 10 is 90 %, 100 is 99 %, 1000 is 99.9 % …
                let nines = x.log10().round() as i32;
                let p = 100.0 * (1.0 - 1.0 / x);
                format!("{p:.*}%", (nines - 2).max(0) as usize)
            })
            .y_label_formatter(&|y| {
                if *y >= 1.0 {
                    format!("{y:.0}")
                } else {
                    format!("{y:.1}")
                }
            })
            .draw()
            .map_err(|e| e.to_string())?;
        for (ci, t) in Transport::ALL.iter().enumerate() {
            let Some(o) = case.iter().find(|o| o.transport == *t) else {
                continue;
            };
            let color = colors[ci % colors.len()];
            let pts: Vec<(f64, f64)> = o
                .curve
                .iter()
                .filter(|(p, _)| *p < 100.0)
                .map(|(p, v)| {
                    (
                        (1.0 / (1.0 - p / 100.0)).min(xmax),
                        (*v as f64 / 1e3).max(ymin),
                    )
                })
                .collect();
            let label = if o.sustained {
                t.name().to_string()
            } else {
                format!("{} (not sustained)", t.name())
            };
            chart
                .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.92))
            .border_style(RGBColor(180, 180, 180))
            .position(SeriesLabelPosition::LowerRight)
            .label_font(("sans-serif", 11))
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}
