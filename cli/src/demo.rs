//! `shmflow demo backpressure`: Flink's backpressure experiment, across two processes.
//!
//! The producer (this process) and the consumer (a child) first run flat out for one phase to
//! find the full rate R. Then the producer runs at 60 % of R while the consumer goes
//! 100 % → 30 % → 100 % → 30 % → 100 % of R, one phase each. A sampler thread reads the region's
//! counters every 100 ms (as `shmflow stat` would) and writes `backpressure.csv` and
//! `backpressure.svg`: both sides' throughput as % of the maximum observed, over time. When the
//! consumer drops to 30 %, the producer must drop with it — blocked waiting for segments.
//!
//! With `--remote` the two processes share no region: the producer's channel is served over
//! TCP on loopback by a `shmflow::net::Server` in this process, and the consumer's channel is
//! fed by a `net::Client` in the child. The producer's rate is read from its channel, the
//! consumer's from the child's: the same picture, with credit carrying the backpressure.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use shmflow::{monotonic_now_ns, Consumer, Geometry, Monitor, Producer, Snapshot};

/// Settings of `shmflow demo backpressure` (see `shmflow demo backpressure --help`).
#[derive(Debug)]
pub(crate) struct DemoArgs {
    pub(crate) phase_secs: f64,
    pub(crate) segments: u32,
    pub(crate) segment_size: u32,
    pub(crate) record_size: usize,
    pub(crate) out: PathBuf,
    pub(crate) remote: bool,
}

/// Rates of each phase as fractions of the full rate: (name, producer, consumer). `None`
/// means unthrottled.
const PHASES: [(&str, Option<f64>, Option<f64>); 6] = [
    ("full speed (calibration)", None, None),
    ("producer 60%", Some(0.6), None),
    ("consumer slowed to 30%", Some(0.6), Some(0.3)),
    ("consumer released", Some(0.6), None),
    ("consumer slowed to 30% again", Some(0.6), Some(0.3)),
    ("consumer released again", Some(0.6), None),
];

struct Plan {
    start_ns: u64,
    phase_ns: u64,
}

impl Plan {
    fn phase_at(&self, now_ns: u64) -> Option<usize> {
        let i = (now_ns.saturating_sub(self.start_ns) / self.phase_ns) as usize;
        (i < PHASES.len()).then_some(i)
    }
    fn phase_start(&self, i: usize) -> u64 {
        self.start_ns + i as u64 * self.phase_ns
    }
}

/// Keeps a side at `fraction` of the rate it measured in phase 0.
struct Pacer {
    full_rate: f64,
    phase: usize,
    phase_start_count: u64,
    count: u64,
}

impl Pacer {
    fn new() -> Pacer {
        Pacer {
            full_rate: 0.0,
            phase: 0,
            phase_start_count: 0,
            count: 0,
        }
    }

    /// Called after each record; returns false when the experiment is over.
    fn tick(&mut self, plan: &Plan, pick: impl Fn(usize) -> Option<f64>) -> bool {
        self.count += 1;
        if !self.count.is_multiple_of(64) {
            return true;
        }
        let now = monotonic_now_ns();
        let Some(phase) = plan.phase_at(now) else {
            return false;
        };
        if phase != self.phase {
            if self.phase == 0 {
                self.full_rate = self.count as f64 * 1e9 / plan.phase_ns as f64;
            }
            self.phase = phase;
            self.phase_start_count = self.count;
        }
        if let Some(f) = pick(phase) {
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
    } = *args;
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
    let sample = move || {
        let mut s = monitor.snapshot();
        if let Some(f) = &far {
            let r = f.snapshot();
            s.records_read = r.records_read;
            s.bytes_read = r.bytes_read;
            s.idle_ns = r.idle_ns;
        }
        s
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
        if !pacer.tick(&plan, |p| PHASES[p].1) {
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
    report(&plan, &samples, out, segments, segment_size)
}

/// The child: the consumer, paced by the same plan.
pub(crate) fn role(args: &[String]) -> Result<(), String> {
    let (role, name, start, phase, port) = match args {
        [r, n, s, p] => (r, n, s, p, None),
        [r, n, s, p, port] => (r, n, s, p, Some(port.parse().map_err(|_| "port")?)),
        _ => return Err("bad __demo-role arguments".into()),
    };
    if role != "consumer" {
        return Err(format!("unknown role {role}"));
    }
    let plan = Plan {
        start_ns: start.parse().map_err(|_| "start")?,
        phase_ns: phase.parse().map_err(|_| "phase")?,
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
        if !pacer.tick(&plan, |p| PHASES[p].2) {
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

fn report(
    plan: &Plan,
    samples: &[Snapshot],
    out: &std::path::Path,
    segments: u32,
    segment_size: u32,
) -> Result<(), String> {
    // Per-sample rates.
    let t0 = plan.start_ns;
    let rows: Vec<(f64, shmflow::Rates)> = samples
        .windows(2)
        .filter(|w| w[1].at_ns > t0 && w[1].at_ns <= plan.phase_start(PHASES.len()))
        .map(|w| ((w[1].at_ns - t0) as f64 / 1e9, w[1].rates_since(&w[0])))
        .collect();
    let max = rows
        .iter()
        .map(|(_, r)| r.records_written_per_s.max(r.records_read_per_s))
        .fold(1.0, f64::max);
    let mut csv = String::from("t_s,producer_records_per_s,consumer_records_per_s,producer_pct_of_max,consumer_pct_of_max,backPressuredTimeMsPerSecond,idleTimeMsPerSecond,outPoolUsage,inPoolUsage,level\n");
    for (t, r) in &rows {
        let _ = writeln!(
            csv,
            "{t:.2},{:.0},{:.0},{:.1},{:.1},{:.1},{:.1},{:.3},{:.3},{}",
            r.records_written_per_s,
            r.records_read_per_s,
            100.0 * r.records_written_per_s / max,
            100.0 * r.records_read_per_s / max,
            r.back_pressured_time_ms_per_second,
            r.idle_time_ms_per_second,
            r.out_pool_usage,
            r.in_pool_usage,
            r.level.as_str()
        );
    }
    let csv_path = out.join("backpressure.csv");
    std::fs::write(&csv_path, csv).map_err(|e| format!("{}: {e}", csv_path.display()))?;

    // Per phase, from the snapshots nearest to its boundaries (skipping its first 10 %, while
    // the pool fills or drains).
    println!(
        "{:<30} {:>16} {:>16} {:>18} {:>6}",
        "phase", "producer rec/s", "consumer rec/s", "backpressured ms/s", "level"
    );
    for (i, (label, _, _)) in PHASES.iter().enumerate() {
        let from = plan.phase_start(i) + plan.phase_ns / 10;
        let to = plan.phase_start(i + 1);
        let a = samples.iter().find(|s| s.at_ns >= from);
        let b = samples.iter().rev().find(|s| s.at_ns <= to);
        if let (Some(a), Some(b)) = (a, b) {
            if b.at_ns > a.at_ns {
                let r = b.rates_since(a);
                println!(
                    "{label:<30} {:>16.0} {:>16.0} {:>18.1} {:>6}",
                    r.records_written_per_s,
                    r.records_read_per_s,
                    r.back_pressured_time_ms_per_second,
                    r.level.as_str()
                );
            }
        }
    }
    let svg_path = out.join("backpressure.svg");
    plot(&rows, max, &svg_path, segments, segment_size)
        .map_err(|e| format!("{}: {e}", svg_path.display()))?;
    println!("wrote {} and {}", csv_path.display(), svg_path.display());
    Ok(())
}

fn plot(
    rows: &[(f64, shmflow::Rates)],
    max: f64,
    path: &std::path::Path,
    segments: u32,
    segment_size: u32,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (960, 440)).into_drawing_area();
    root.fill(&WHITE)?;
    let t_max = rows.last().map(|r| r.0).unwrap_or(1.0);
    let caption = format!(
        "shmflow backpressure: {segments} × {} KiB segments, max {:.2} M records/s",
        segment_size / 1024,
        max / 1e6
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(0f64..t_max, 0f64..110f64)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("throughput, % of max observed")
        .draw()?;
    // The producer's line is drawn wide and light under the consumer's: where they coincide
    // (backpressure doing its job) both stay visible.
    let series = [
        ("producer (sent)", RGBColor(240, 120, 120), 6, true),
        ("consumer (read)", BLUE, 2, false),
    ];
    for (label, color, width, producer) in series {
        let pts: Vec<(f64, f64)> = rows
            .iter()
            .map(|(t, r)| {
                (
                    *t,
                    100.0
                        * if producer {
                            r.records_written_per_s
                        } else {
                            r.records_read_per_s
                        }
                        / max,
                )
            })
            .collect();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(width)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(width))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
