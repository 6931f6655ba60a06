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

mod bridge;
mod report;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use shmflow::metrics::monotonic_now_ns;
use shmflow::monitor::Monitor;
use shmflow::{Consumer, Geometry, Producer};

use super::Role;

/// Settings of `shmflow demo backpressure`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Seconds per phase.
    #[arg(long, default_value_t = 3.0)]
    phase_secs: f64,
    /// Segments in the channel's pool.
    #[arg(long, default_value_t = 16)]
    segments: u32,
    /// Bytes per segment.
    #[arg(long, default_value_t = 32 * 1024)]
    segment_size: u32,
    /// Bytes per record.
    #[arg(long, default_value_t = 64)]
    record_size: usize,
    /// Where the CSV, the SVG and the run's output go.
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// Run it across a TCP connection on loopback: the producer's channel is served by a
    /// `shmflow::net` bridge, the consumer's channel fed by another, credit-based.
    #[arg(long)]
    remote: bool,
    /// The phases after calibration, as PRODUCER:CONSUMER target percentages of the
    /// calibrated rate (100: flat out), separated by commas.
    #[arg(long, default_value = DEFAULT_PHASES)]
    phases: String,
}

/// The experiment's phases after calibration, as the experiment is told:
/// `PRODUCER:CONSUMER` target percentages of the calibrated rate (100: unthrottled).
const DEFAULT_PHASES: &str = "60:100,60:30,100:100,100:30,100:100";

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

/// Runs the experiment, the consumer in a child process, and writes its output.
pub(crate) fn main(args: &Args) -> Result<(), String> {
    let Args {
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
        Some(bridge::serve(&name)?)
    } else {
        None
    };
    let mut child = Role::Consumer {
        name: if remote {
            in_name.clone()
        } else {
            name.clone()
        },
        start_ns: plan.start_ns,
        phase_ns: plan.phase_ns,
        phases: phases.clone(),
        port: bridge.as_ref().map(|b| b.port),
    }
    .spawn()?;
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
        Some(bridge::monitor(&in_name)?)
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
    let verdict = report::report(
        &plan,
        &samples,
        out,
        (segments, segment_size, record_size, remote),
    )?;
    // Exit 2: a phase missed its targets; 3: the host was too busy to judge (what CI, on a
    // shared machine, takes as a run that could not be judged, not a failure).
    match verdict {
        report::Verdict::Followed => Ok(()),
        report::Verdict::Missed(why) => {
            eprintln!("shmflow: {why}");
            std::process::exit(2)
        }
        report::Verdict::HostTooBusy(why) => {
            eprintln!("shmflow: {why}");
            std::process::exit(3)
        }
    }
}

/// The child: the consumer of the region `name` (or with `port`, of its own region `name`, fed
/// from the producer's channel served on that loopback port), paced by the plan of the phases
/// `spec` starting at `start_ns`, `phase_ns` each.
pub(super) fn consumer(
    name: &str,
    start_ns: u64,
    phase_ns: u64,
    spec: &str,
    port: Option<u16>,
) -> Result<(), String> {
    let plan = Plan {
        start_ns,
        phase_ns,
        phases: phases(spec)?,
    };
    let (mut rx, bridge) = match port {
        None => (Consumer::open(name).map_err(|e| e.to_string())?, None),
        Some(port) => {
            let rx = Consumer::create(name, bridge::geometry_of_demo(name)?)
                .map_err(|e| e.to_string())?;
            (rx, Some(bridge::receive(name, port)?))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_is_judged_by_its_slower_side() {
        use shmflow::metrics::BackpressureLevel::{High, Low, Ok};
        let ph = |p: f64, c: f64| Phase {
            label: format!("{p}:{c}"),
            producer: Some(p),
            consumer: Some(c),
        };
        assert_eq!(report::judge(&ph(1.0, 0.3), 31.0, High), None);
        assert!(
            report::judge(&ph(1.0, 0.3), 30.0, Ok).is_some(),
            "no backpressure"
        );
        assert_eq!(report::judge(&ph(0.6, 1.0), 58.0, Ok), None);
        assert!(
            report::judge(&ph(0.6, 1.0), 60.0, Low).is_some(),
            "a producer that waits"
        );
        assert!(
            report::judge(&ph(1.0, 1.0), 78.0, High).is_some(),
            "read far below 100 %"
        );
        assert_eq!(report::judge(&ph(1.0, 1.0), 95.0, High), None);
    }

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
