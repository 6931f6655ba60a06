//! `shmflow demo backpressure`: Flink's backpressure experiment, across two processes, as the
//! experiment is usually told: the producer runs at 60 % of full speed and the consumer keeps
//! up; the consumer is slowed to 30 % and the producer follows it down; the slowdown is removed
//! and both run at 100 %; the consumer is slowed to 30 % again and the producer follows at
//! once; the slowdown is removed and both finish at 100 %.
//!
//! The producer (this process) and the consumer (a child) first run flat out for one
//! calibration phase: 100 % is the median of the consumer's per-sample rate there (each side
//! paces itself against the median of its own). A sampler thread reads the region's counters
//! every 100 ms (as `shmflow stat` would) and writes `backpressure.csv` and `backpressure.svg`:
//! three panels on one time axis — throughput of both sides as % of the calibrated rate with
//! the producer's target dashed, backpressured ms/s with Flink's OK/LOW/HIGH bands, and the
//! pools' usage — with the phases shaded and labelled. `--phases` sets other phases.
//!
//! With `--remote` the two processes share no region: the producer's channel is served over
//! TCP on loopback by a `shmflow::net::Server` in this process, and the consumer's channel is
//! fed by a `net::Client` in the child. The producer's figures are read from its channel, the
//! consumer's from the child's: the same picture, with credit carrying the backpressure.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use shmflow::metrics::{monotonic_now_ns, Snapshot};
use shmflow::monitor::Monitor;
use shmflow::{Consumer, Geometry, Producer};

/// Settings of `shmflow demo backpressure` (see `shmflow demo backpressure --help`).
#[derive(Debug)]
pub(crate) struct DemoArgs {
    pub(crate) phase_secs: f64,
    pub(crate) segments: u32,
    pub(crate) segment_size: u32,
    pub(crate) record_size: usize,
    pub(crate) out: PathBuf,
    pub(crate) remote: bool,
    /// The phases after calibration, `PRODUCER:CONSUMER` percentages separated by commas.
    pub(crate) phases: String,
}

/// The experiment's phases after calibration, as the experiment is told:
/// `PRODUCER:CONSUMER` target percentages of the calibrated rate (100: unthrottled).
pub(crate) const DEFAULT_PHASES: &str = "60:100,60:30,100:100,100:30,100:100";

/// One phase: its label and each side's target as a fraction of the calibrated rate (`None`:
/// unthrottled).
#[derive(Clone, Debug, PartialEq)]
struct Phase {
    label: String,
    producer: Option<f64>,
    consumer: Option<f64>,
}

/// The calibration phase, then the phases `spec` lists (see [`DEFAULT_PHASES`]).
fn phases(spec: &str) -> Result<Vec<Phase>, String> {
    let mut out = vec![Phase {
        label: "calibration: both flat out".into(),
        producer: None,
        consumer: None,
    }];
    let mut prev_consumer: Option<f64> = None;
    for part in spec.split(',') {
        let bad =
            || format!("--phases: {part:?} is not PRODUCER:CONSUMER (percentages from 1 to 100)");
        let (p, c) = part.trim().split_once(':').ok_or_else(bad)?;
        let pct = |v: &str| -> Result<Option<f64>, String> {
            let x: f64 = v.trim().parse().map_err(|_| bad())?;
            if !(1.0..=100.0).contains(&x) {
                return Err(bad());
            }
            Ok((x < 100.0).then_some(x / 100.0))
        };
        let (producer, consumer) = (pct(p)?, pct(c)?);
        let show = |f: Option<f64>| format!("{:.0} %", 100.0 * f.unwrap_or(1.0));
        let label = match (producer, consumer) {
            (_, Some(_)) if consumer != prev_consumer => {
                format!("consumer slowed to {}", show(consumer))
            }
            (None, None) if prev_consumer.is_some() => "slowdown removed: both 100 %".into(),
            (None, None) => "both 100 %".into(),
            (Some(_), None) if prev_consumer.is_some() => {
                format!("consumer released, producer {}", show(producer))
            }
            _ => format!("producer {}, consumer {}", show(producer), show(consumer)),
        };
        prev_consumer = consumer;
        out.push(Phase {
            label,
            producer,
            consumer,
        });
    }
    Ok(out)
}

struct Plan {
    start_ns: u64,
    phase_ns: u64,
    phases: Vec<Phase>,
}

impl Plan {
    fn phase_at(&self, now_ns: u64) -> Option<usize> {
        let i = (now_ns.saturating_sub(self.start_ns) / self.phase_ns) as usize;
        (i < self.phases.len()).then_some(i)
    }
    fn phase_start(&self, i: usize) -> u64 {
        self.start_ns + i as u64 * self.phase_ns
    }
}

/// The median of `v` (0 for none).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Keeps a side at a fraction of the median rate it measured in the calibration phase.
struct Pacer {
    full_rate: f64,
    phase: usize,
    phase_start_count: u64,
    count: u64,
    /// Calibration: the start of the current 100 ms window (ns, count), and each window's rate.
    window: (u64, u64),
    window_rates: Vec<f64>,
}

impl Pacer {
    fn new() -> Pacer {
        Pacer {
            full_rate: 0.0,
            phase: 0,
            phase_start_count: 0,
            count: 0,
            window: (0, 0),
            window_rates: Vec::new(),
        }
    }

    /// Called after each record; returns false when the experiment is over.
    fn tick(&mut self, plan: &Plan, pick: impl Fn(&Phase) -> Option<f64>) -> bool {
        self.count += 1;
        if !self.count.is_multiple_of(64) {
            return true;
        }
        let now = monotonic_now_ns();
        let Some(phase) = plan.phase_at(now) else {
            return false;
        };
        if phase == 0 {
            // The first window starts a tenth into the phase, past the start-up.
            if self.window.0 == 0 && now >= plan.start_ns + plan.phase_ns / 10 {
                self.window = (now, self.count);
            } else if self.window.0 != 0 && now - self.window.0 >= 100_000_000 {
                let rate = (self.count - self.window.1) as f64 * 1e9 / (now - self.window.0) as f64;
                self.window_rates.push(rate);
                self.window = (now, self.count);
            }
        }
        if phase != self.phase {
            if self.phase == 0 {
                self.full_rate = median(std::mem::take(&mut self.window_rates));
                if self.full_rate == 0.0 {
                    self.full_rate = self.count as f64 * 1e9 / plan.phase_ns as f64;
                }
            }
            self.phase = phase;
            self.phase_start_count = self.count;
        }
        if let Some(f) = pick(&plan.phases[phase]) {
            let rate = f * self.full_rate;
            let due = plan.phase_start(phase)
                + ((self.count - self.phase_start_count) as f64 / rate * 1e9) as u64;
            if due > now + 50_000 {
                std::thread::sleep(Duration::from_nanos(due - now));
            }
        }
        true
    }
}

pub(crate) fn main(args: &DemoArgs) -> Result<(), String> {
    let DemoArgs {
        phase_secs,
        segments,
        segment_size,
        record_size,
        ref out,
        remote,
        ref phases,
    } = *args;
    let phase_list = self::phases(phases)?;
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let name = format!("/shmflow-demo-{}", std::process::id());
    let mut tx = Producer::create(
        &name,
        Geometry {
            segment_size,
            segment_count: segments,
        },
    )
    .map_err(|e| e.to_string())?;
    let plan = Plan {
        start_ns: monotonic_now_ns() + 300_000_000,
        phase_ns: (phase_secs * 1e9) as u64,
        phases: phase_list,
    };
    let in_name = format!("{name}-in");
    let bridge = if remote {
        Some(remote::serve(&name)?)
    } else {
        None
    };
    let mut child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
        .args([
            "__demo-role",
            "consumer",
            if remote { &in_name } else { &name },
            &plan.start_ns.to_string(),
            &plan.phase_ns.to_string(),
            phases,
        ])
        .args(bridge.as_ref().map(|b| b.port.to_string()))
        .spawn()
        .map_err(|e| e.to_string())?;
    println!("region {name}: {segments} × {segment_size} B segments, {record_size} B records, phases of {phase_secs} s");
    if let Some(b) = &bridge {
        println!(
            "across TCP: {name} is served on 127.0.0.1:{} and arrives in {in_name} in the consumer's process",
            b.port
        );
    }
    println!("watch it live: shmflow stat {name}");

    // Sampler: every 100 ms, from a read-only view of the region (and of the consumer's, when
    // it is across the network: its reads are counted there).
    let monitor = Monitor::open(&name).map_err(|e| e.to_string())?;
    let far = if remote {
        Some(remote::monitor(&in_name)?)
    } else {
        None
    };
    // The producer's side, and the consumer's where it reads (its own region when remote).
    let sample = move || {
        let near = monitor.snapshot();
        let far = far.as_ref().map_or(near, |f| f.snapshot());
        (near, far)
    };
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let sampler = std::thread::spawn(move || {
        let mut samples = vec![sample()];
        while !d2.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            samples.push(sample());
        }
        samples
    });

    while monotonic_now_ns() < plan.start_ns {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut pacer = Pacer::new();
    let payload = vec![0xA5u8; record_size];
    loop {
        tx.send(&payload).map_err(|e| e.to_string())?;
        if !pacer.tick(&plan, |p| p.producer) {
            break;
        }
    }
    drop(tx);
    let status = child.wait().map_err(|e| e.to_string())?;
    if let Some(b) = bridge {
        b.thread
            .join()
            .map_err(|_| "the bridge panicked".to_string())??;
    }
    done.store(true, Ordering::Relaxed);
    let samples = sampler.join().map_err(|_| "sampler panicked")?;
    if !status.success() {
        return Err(format!("consumer failed: {status}"));
    }
    report(
        &plan,
        &samples,
        out,
        (segments, segment_size, record_size, remote),
    )
}

/// The child: the consumer, paced by the same plan.
pub(crate) fn role(args: &[String]) -> Result<(), String> {
    let (role, name, start, phase, spec, port) = match args {
        [r, n, s, p, f] => (r, n, s, p, f, None),
        [r, n, s, p, f, port] => (r, n, s, p, f, Some(port.parse().map_err(|_| "port")?)),
        _ => return Err("bad __demo-role arguments".into()),
    };
    if role != "consumer" {
        return Err(format!("unknown role {role}"));
    }
    let plan = Plan {
        start_ns: start.parse().map_err(|_| "start")?,
        phase_ns: phase.parse().map_err(|_| "phase")?,
        phases: phases(spec)?,
    };
    let (mut rx, bridge) = match port {
        None => (Consumer::open(name).map_err(|e| e.to_string())?, None),
        Some(port) => {
            let rx = Consumer::create(name, remote::geometry_of_demo(name)?)
                .map_err(|e| e.to_string())?;
            (rx, Some(remote::receive(name, port)?))
        }
    };
    let mut pacer = Pacer::new();
    loop {
        match rx.recv().map_err(|e| e.to_string())? {
            Some(r) => {
                std::hint::black_box(r.as_bytes());
            }
            None => break,
        }
        if !pacer.tick(&plan, |p| p.consumer) {
            // Past the last phase: drain what is left without pacing.
            while rx.recv().map_err(|e| e.to_string())?.is_some() {}
            break;
        }
    }
    if let Some(b) = bridge {
        b.join().map_err(|_| "the bridge panicked".to_string())??;
    }
    Ok(())
}

/// `--remote`: the two bridges.
mod remote {
    use super::*;
    use shmflow::net::{Client, Config, Server};

    pub(super) struct Bridge {
        pub(super) port: u16,
        pub(super) thread: std::thread::JoinHandle<Result<(), String>>,
    }

    fn runtime() -> Result<tokio::runtime::Runtime, String> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    }

    /// Serves the producer's channel `name` on a loopback port.
    pub(super) fn serve(name: &str) -> Result<Bridge, String> {
        let consumer = Consumer::open(name).map_err(|e| e.to_string())?;
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let port = std_listener.local_addr().map_err(|e| e.to_string())?.port();
        drop(std_listener);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            runtime()?.block_on(async move {
                let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
                let mut s = match Server::bind(addr, Config::default()).await {
                    Ok(s) => {
                        let _ = ready_tx.send(None);
                        s
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Some(e.to_string()));
                        return Err(e.to_string());
                    }
                };
                s.export("demo", consumer).map_err(|e| e.to_string())?;
                for o in s.run().await.channels {
                    o.result.map_err(|e| format!("{}: {e}", o.name))?;
                }
                Ok(())
            })
        });
        if let Ok(Some(e)) = ready_rx.recv() {
            return Err(e);
        }
        Ok(Bridge { port, thread })
    }

    /// The geometry of the producer's region (the consumer's must have the same segments).
    pub(super) fn geometry_of_demo(in_name: &str) -> Result<Geometry, String> {
        let out = in_name
            .strip_suffix("-in")
            .ok_or("a region name ending in -in")?;
        Ok(Monitor::open(out).map_err(|e| e.to_string())?.geometry())
    }

    /// Feeds the local channel `name` from the channel served on `port`.
    pub(super) fn receive(
        name: &str,
        port: u16,
    ) -> Result<std::thread::JoinHandle<Result<(), String>>, String> {
        let producer = Producer::open(name).map_err(|e| e.to_string())?;
        Ok(std::thread::spawn(move || {
            runtime()?.block_on(async move {
                let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
                let start = std::time::Instant::now();
                let mut c = loop {
                    match Client::connect(addr, Config::default()).await {
                        Ok(c) => break c,
                        Err(e) if start.elapsed() > Duration::from_secs(10) => {
                            return Err(e.to_string())
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                };
                c.import("demo", producer).map_err(|e| e.to_string())?;
                for o in c.run().await {
                    o.result.map_err(|e| format!("{}: {e}", o.name))?;
                }
                Ok(())
            })
        }))
    }

    /// A read-only view of the consumer's region, once the child has made it.
    pub(super) fn monitor(name: &str) -> Result<Monitor, String> {
        let start = std::time::Instant::now();
        loop {
            match Monitor::open(name) {
                Ok(m) => return Ok(m),
                Err(_) if start.elapsed() < Duration::from_secs(10) => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }
}

/// One sample of the experiment: rates over the last 100 ms and the state at its end.
struct Row {
    /// Seconds since the first phase started.
    t: f64,
    phase: usize,
    produced: f64,
    consumed: f64,
    back_pressured_ms: f64,
    out_pool: f64,
    in_pool: f64,
    level: shmflow::metrics::BackpressureLevel,
}

fn report(
    plan: &Plan,
    samples: &[(Snapshot, Snapshot)],
    out: &std::path::Path,
    (segments, segment_size, record_size, remote): (u32, u32, usize, bool),
) -> Result<(), String> {
    let t0 = plan.start_ns;
    let end = plan.phase_start(plan.phases.len());
    let rows: Vec<Row> = samples
        .windows(2)
        .filter(|w| w[1].0.at_ns > t0 && w[1].0.at_ns <= end)
        .map(|w| {
            let (near, far) = (w[1].0.rates_since(&w[0].0), w[1].1.rates_since(&w[0].1));
            Row {
                t: (w[1].0.at_ns - t0) as f64 / 1e9,
                phase: plan.phase_at(w[1].0.at_ns).unwrap_or(plan.phases.len() - 1),
                produced: near.records_written_per_s,
                consumed: far.records_read_per_s,
                back_pressured_ms: near.back_pressured_time_ms_per_second,
                out_pool: near.out_pool_usage,
                in_pool: far.in_pool_usage,
                level: near.level,
            }
        })
        .collect();
    // 100 %: the median of the consumer's rate in the calibration phase, past its first tenth.
    let settle = plan.phase_ns as f64 / 1e9 / 10.0;
    let full = median(
        rows.iter()
            .filter(|r| r.phase == 0 && r.t > settle)
            .map(|r| r.consumed)
            .collect(),
    )
    .max(1.0);
    let target = |r: &Row| 100.0 * plan.phases[r.phase].producer.unwrap_or(1.0);
    let mut csv = String::from(
        "t_s,phase,producer_records_per_s,consumer_records_per_s,producer_pct,consumer_pct,\
         producer_target_pct,backPressuredTimeMsPerSecond,outPoolUsage,inPoolUsage,level\n",
    );
    for r in &rows {
        let _ = writeln!(
            csv,
            "{:.2},{},{:.0},{:.0},{:.1},{:.1},{:.0},{:.1},{:.3},{:.3},{}",
            r.t,
            r.phase,
            r.produced,
            r.consumed,
            100.0 * r.produced / full,
            100.0 * r.consumed / full,
            target(r),
            r.back_pressured_ms,
            r.out_pool,
            r.in_pool,
            r.level.as_str()
        );
    }
    let csv_path = out.join("backpressure.csv");
    std::fs::write(&csv_path, csv).map_err(|e| format!("{}: {e}", csv_path.display()))?;

    println!(
        "100 % = {:.2} M records/s (median of the calibration phase)",
        full / 1e6
    );
    println!(
        "{:<36} {:>9} {:>9} {:>9} {:>12} {:>6}",
        "phase (medians past its first tenth)", "target %", "sent %", "read %", "bp ms/s", "level"
    );
    for (i, phase) in plan.phases.iter().enumerate() {
        let in_phase: Vec<&Row> = rows
            .iter()
            .filter(|r| r.phase == i && r.t > i as f64 * plan.phase_ns as f64 / 1e9 + settle)
            .collect();
        if in_phase.is_empty() {
            continue;
        }
        let m = |f: &dyn Fn(&Row) -> f64| median(in_phase.iter().map(|r| f(r)).collect());
        let bp = m(&|r| r.back_pressured_ms);
        println!(
            "{:<36} {:>9.0} {:>9.0} {:>9.0} {:>12.0} {:>6}",
            phase.label,
            100.0 * phase.producer.unwrap_or(1.0),
            100.0 * m(&|r| r.produced) / full,
            100.0 * m(&|r| r.consumed) / full,
            bp,
            shmflow::metrics::BackpressureLevel::from_ratio(bp / 1000.0).as_str()
        );
    }
    let svg_path = out.join("backpressure.svg");
    let title = format!(
        "Backpressure {}: {segments} x {} KiB segments, {record_size} B records, 100 % = {:.2} M records/s",
        if remote {
            "across TCP (two bridges on loopback)"
        } else {
            "between two processes"
        },
        segment_size / 1024,
        full / 1e6
    );
    plot(plan, &rows, full, &title, &svg_path)
        .map_err(|e| format!("{}: {e}", svg_path.display()))?;
    println!("wrote {} and {}", csv_path.display(), svg_path.display());
    Ok(())
}

/// Three panels on one time axis, phases shaded and labelled: throughput (% of the calibrated
/// rate, the producer's target dashed), backpressured ms/s over Flink's OK/LOW/HIGH bands, and
/// the pools' usage.
fn plot(
    plan: &Plan,
    rows: &[Row],
    full: f64,
    title: &str,
    path: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1200, 920)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 22))?;
    let (strip, rest) = root.split_vertically(64);
    let (top, rest) = rest.split_vertically(400);
    let (mid, bottom) = rest.split_vertically(240);
    let t_max = plan.phases.len() as f64 * plan.phase_ns as f64 / 1e9;
    let phase_s = plan.phase_ns as f64 / 1e9;
    let producer_color = RGBColor(235, 120, 95);
    let consumer_color = RGBColor(20, 60, 160);
    let whole = |v: &f64| format!("{v:.0}");

    // The phases' labels, in a strip of their own above the panels (same x scale).
    let mut c = ChartBuilder::on(&strip)
        .margin_left(12)
        .margin_right(24)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..t_max, 0f64..3f64)?;
    shade_phases(&mut c, plan, 3.0)?;
    let center = plotters::style::text_anchor::Pos::new(
        plotters::style::text_anchor::HPos::Center,
        plotters::style::text_anchor::VPos::Center,
    );
    for (i, phase) in plan.phases.iter().enumerate() {
        let x = (i as f64 + 0.5) * phase_s;
        let (first, second) = match phase.label.split_once(": ") {
            Some((a, b)) => (format!("{a}:"), b.to_owned()),
            None => match phase.label.split_once(", ") {
                Some((a, b)) => (format!("{a},"), b.to_owned()),
                None => (phase.label.clone(), String::new()),
            },
        };
        let font = ("sans-serif", 14).into_font().color(&BLACK).pos(center);
        c.draw_series([
            Text::new(
                format!("phase {i}"),
                (x, 2.5),
                ("sans-serif", 14)
                    .into_font()
                    .style(FontStyle::Bold)
                    .color(&BLACK)
                    .pos(center),
            ),
            Text::new(first, (x, 1.5), font.clone()),
            Text::new(second, (x, 0.6), font),
        ])?;
    }

    // Throughput (the scale grows past 140 % for a noisy run rather than clipping it).
    let pct = |v: f64| 100.0 * v / full;
    let y_max = rows
        .iter()
        .map(|r| pct(r.produced).max(pct(r.consumed)) * 1.05)
        .fold(140.0, f64::max);
    let mut c = ChartBuilder::on(&top)
        .margin_left(12)
        .margin_right(24)
        .x_label_area_size(10)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..t_max, 0f64..y_max)?;
    shade_phases(&mut c, plan, y_max)?;
    c.configure_mesh()
        .disable_x_mesh()
        .y_desc("throughput, % of calibrated rate")
        .x_labels(0)
        .y_labels(8)
        .y_label_formatter(&whole)
        .light_line_style(TRANSPARENT)
        .bold_line_style(RGBColor(210, 210, 210))
        .draw()?;
    c.draw_series(DashedLineSeries::new(
        step_points(plan, |p| 100.0 * p.producer.unwrap_or(1.0)),
        10,
        6,
        BLACK.stroke_width(2),
    ))?
    .label("producer target")
    .legend(|(x, y)| {
        plotters::element::DashedPathElement::new(
            vec![(x, y), (x + 24, y)],
            6,
            3,
            BLACK.stroke_width(2),
        )
    });
    line(
        &mut c,
        rows.iter().map(|r| (r.t, pct(r.produced))),
        producer_color,
        7,
        "producer: records sent",
    )?;
    line(
        &mut c,
        rows.iter().map(|r| (r.t, pct(r.consumed))),
        consumer_color,
        2,
        "consumer: records read",
    )?;
    legend(&mut c, SeriesLabelPosition::LowerLeft)?;

    // Backpressured time, over Flink's bands.
    let mut c = ChartBuilder::on(&mid)
        .margin_left(12)
        .margin_right(24)
        .x_label_area_size(10)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..t_max, 0f64..1000f64)?;
    let bands = [
        (0.0, 100.0, RGBColor(214, 240, 214), "OK"),
        (100.0, 500.0, RGBColor(250, 236, 200), "LOW"),
        (500.0, 1000.0, RGBColor(248, 214, 210), "HIGH"),
    ];
    c.draw_series(
        bands
            .iter()
            .map(|&(lo, hi, color, _)| Rectangle::new([(0.0, lo), (t_max, hi)], color.filled())),
    )?;
    c.draw_series((1..plan.phases.len()).map(|i| {
        PathElement::new(
            vec![(i as f64 * phase_s, 0.0), (i as f64 * phase_s, 1000.0)],
            RGBColor(150, 150, 150).stroke_width(1),
        )
    }))?;
    c.configure_mesh()
        .disable_x_mesh()
        .disable_y_mesh()
        .y_desc("backpressured ms/s")
        .x_labels(0)
        .y_labels(6)
        .y_label_formatter(&whole)
        .draw()?;
    c.draw_series(bands.iter().map(|&(lo, hi, _, name)| {
        Text::new(
            name,
            (t_max * 0.995, (lo + hi) / 2.0),
            ("sans-serif", 14)
                .into_font()
                .color(&RGBColor(90, 90, 90))
                .pos(plotters::style::text_anchor::Pos::new(
                    plotters::style::text_anchor::HPos::Right,
                    plotters::style::text_anchor::VPos::Center,
                )),
        )
    }))?;
    line(
        &mut c,
        rows.iter().map(|r| (r.t, r.back_pressured_ms.min(1000.0))),
        RGBColor(150, 20, 20),
        2,
        "producer: backPressuredTimeMsPerSecond",
    )?;
    legend(&mut c, SeriesLabelPosition::UpperLeft)?;

    // The pools.
    let mut c = ChartBuilder::on(&bottom)
        .margin_left(12)
        .margin_right(24)
        .margin_bottom(8)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..t_max, 0f64..1.05f64)?;
    shade_phases(&mut c, plan, 1.05)?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_desc("time (s)")
        .y_desc("pool usage")
        .y_labels(6)
        .x_label_formatter(&whole)
        .light_line_style(TRANSPARENT)
        .bold_line_style(RGBColor(210, 210, 210))
        .draw()?;
    line(
        &mut c,
        rows.iter().map(|r| (r.t, r.out_pool)),
        producer_color,
        7,
        "outPoolUsage (producer: segments not free)",
    )?;
    line(
        &mut c,
        rows.iter().map(|r| (r.t, r.in_pool)),
        consumer_color,
        2,
        "inPoolUsage (consumer: segments queued or held)",
    )?;
    legend(&mut c, SeriesLabelPosition::UpperLeft)?;
    root.present()?;
    Ok(())
}

/// The chart of one panel: time on x, a linear y.
type Panel<'a, 'b> = plotters::chart::ChartContext<
    'a,
    plotters::backend::SVGBackend<'b>,
    plotters::coord::cartesian::Cartesian2d<
        plotters::coord::types::RangedCoordf64,
        plotters::coord::types::RangedCoordf64,
    >,
>;

/// Every other phase shaded, from 0 to `top` on the panel's y axis.
fn shade_phases(
    c: &mut Panel<'_, '_>,
    plan: &Plan,
    top: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let phase_s = plan.phase_ns as f64 / 1e9;
    c.draw_series((0..plan.phases.len()).map(|i| {
        let fill = if i.is_multiple_of(2) {
            RGBColor(232, 237, 245).filled()
        } else {
            WHITE.filled()
        };
        Rectangle::new(
            [(i as f64 * phase_s, 0.0), ((i + 1) as f64 * phase_s, top)],
            fill,
        )
    }))?;
    Ok(())
}

/// A labelled line of `width` pixels in `color`.
fn line(
    c: &mut Panel<'_, '_>,
    points: impl IntoIterator<Item = (f64, f64)>,
    color: plotters::style::RGBColor,
    width: u32,
    label: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    c.draw_series(LineSeries::new(points, color.stroke_width(width)))?
        .label(label)
        .legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(width))
        });
    Ok(())
}

/// The panel's legend, in the picture's one style.
fn legend<'a, 'b: 'a>(
    c: &mut Panel<'a, 'b>,
    position: plotters::chart::SeriesLabelPosition,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    c.configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.92))
        .border_style(RGBColor(180, 180, 180))
        .label_font(("sans-serif", 14))
        .draw()?;
    Ok(())
}

/// A step line through each phase's value of `f`.
fn step_points(plan: &Plan, f: impl Fn(&Phase) -> f64) -> Vec<(f64, f64)> {
    let phase_s = plan.phase_ns as f64 / 1e9;
    plan.phases
        .iter()
        .enumerate()
        .flat_map(|(i, p)| {
            let v = f(p);
            [(i as f64 * phase_s, v), ((i + 1) as f64 * phase_s, v)]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_phases_are_the_experiment_as_told() {
        let p = phases(DEFAULT_PHASES).unwrap();
        let targets: Vec<(Option<f64>, Option<f64>)> =
            p.iter().map(|p| (p.producer, p.consumer)).collect();
        assert_eq!(
            targets,
            [
                (None, None),
                (Some(0.6), None),
                (Some(0.6), Some(0.3)),
                (None, None),
                (None, Some(0.3)),
                (None, None)
            ]
        );
        let labels: Vec<&str> = p.iter().map(|p| p.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "calibration: both flat out",
                "producer 60 %, consumer 100 %",
                "consumer slowed to 30 %",
                "slowdown removed: both 100 %",
                "consumer slowed to 30 %",
                "slowdown removed: both 100 %"
            ]
        );
        assert!(phases("60").is_err() && phases("0:50").is_err() && phases("50:101").is_err());
    }
}
