//! `shmflow stat`: a channel's, a gate's or a pipeline directory's figures every interval, as a
//! screen view or one JSON object per sample, until the ends have left.

use std::path::PathBuf;
use std::time::Duration;

use shmflow::metrics::{EndState, GateSnapshot, Snapshot};
use shmflow::monitor::{GateMonitor, Monitor};
use shmflow::{End, OpenError};

use super::{bytes_text, duration_ns, end, json, pipeline, released_name};

/// `shmflow stat`: the region `name`, or the pipeline directory `pipeline`; samples every
/// `interval_ms` (by default 1000, or 200 with `json`), `count` of them (by default unbounded,
/// or 1 with `json`).
pub(crate) fn stat(
    name: Option<String>,
    pipeline: Option<PathBuf>,
    json: bool,
    interval_ms: Option<u64>,
    count: Option<u64>,
) -> Result<(), String> {
    let interval = Duration::from_millis(interval_ms.unwrap_or(if json { 200 } else { 1000 }));
    let count = count.unwrap_or(if json { 1 } else { u64::MAX });
    match (name, pipeline) {
        (_, Some(dir)) => pipeline::stat(&dir, json, interval, count),
        (Some(name), None) => region(&name, json, interval, count),
        (None, None) => Err("name a region or --pipeline DIR".into()),
    }
}

/// A region's figures: a gate's, or else a channel's (whose open says what is wrong with
/// a region that is neither).
fn region(name: &str, json: bool, interval: Duration, count: u64) -> Result<(), String> {
    match GateMonitor::open(name) {
        Ok(g) => return stat_gate(name, &g, json, interval, count),
        // Not a gate: a channel, or the channel open says what is wrong.
        Err(OpenError::BadMagic { .. }) => {}
        Err(e) => return Err(e.to_string()),
    }
    let m = Monitor::open(name).map_err(|e| e.to_string())?;
    let mut prev = m.snapshot();
    let mut prev_latency = m.latency();
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    for _ in 0..count {
        std::thread::sleep(interval);
        let now = m.snapshot();
        let latency = m.latency();
        let alive = (m.end_alive(End::Producer), m.end_alive(End::Consumer));
        if json {
            println!("{}", json::snapshot(name, &prev, &now, &latency));
        } else {
            if tty {
                print!("\x1b[2J\x1b[H");
            }
            print_view(name, &prev, &now, alive);
            for line in crate::latency::lines(&prev_latency, &latency) {
                println!("{line}");
            }
        }
        prev_latency = latency;
        if channel_over(&now, alive) {
            if !json {
                println!("both ends have left: the figures above are final");
            }
            break;
        }
        prev = now;
    }
    Ok(())
}

/// Both ends came and went (detached, failed, lost or dead): nothing will change any more.
fn channel_over(s: &Snapshot, alive: (bool, bool)) -> bool {
    !alive.0 && !alive.1 && s.producer_state != EndState::Free && s.consumer_state != EndState::Free
}

/// `v` formatted, or "—" for an end that is not there.
fn fig(here: bool, v: f64, width: usize, prec: usize) -> String {
    if here {
        format!("{v:>width$.prec$}")
    } else {
        format!("{:>width$}", "—")
    }
}

/// A channel's screen view.
fn print_view(name: &str, prev: &Snapshot, now: &Snapshot, alive: (bool, bool)) {
    let r = now.rates_since(prev);
    // An end is there while it is attached and alive; figures of one that is not are "—".
    let (p, c) = (
        alive.0 && now.producer_state == EndState::Attached,
        alive.1 && now.consumer_state == EndState::Attached,
    );
    println!(
        "shmflow stat {name}   ({} × {} B segments, window {:.2} s)",
        now.segment_count, now.segment_size, r.window_s
    );
    println!(
        "  producer {:<18} consumer {}",
        end(now.producer_state, now.producer_pid, alive.0),
        end(now.consumer_state, now.consumer_pid, alive.1)
    );
    println!(
        "  backpressure level      {}",
        if p { r.level.as_str() } else { "—" }
    );
    println!(
        "  records/s   written {}   read {}",
        fig(p, r.records_written_per_s, 14, 0),
        fig(c, r.records_read_per_s, 14, 0)
    );
    println!(
        "  MB/s        written {}   read {}",
        fig(p, r.bytes_written_per_s / 1e6, 14, 2),
        fig(c, r.bytes_read_per_s / 1e6, 14, 2)
    );
    println!(
        "  producer    backPressuredTimeMsPerSecond {}   busyTimeMsPerSecond {}",
        fig(p, r.back_pressured_time_ms_per_second, 7, 1),
        fig(p, r.producer_busy_time_ms_per_second, 7, 1)
    );
    println!(
        "  consumer    idleTimeMsPerSecond          {}   busyTimeMsPerSecond {}",
        fig(c, r.idle_time_ms_per_second, 7, 1),
        fig(c, r.consumer_busy_time_ms_per_second, 7, 1)
    );
    println!(
        "  outPoolUsage {:.2}   inPoolUsage {:.2}",
        r.out_pool_usage, r.in_pool_usage
    );
    println!(
        "  totals: {} records written, {} read; segments {} committed, {} returned; wake-ups {} by producer, {} by consumer",
        now.records_written, now.records_read, now.segments_committed, now.segments_returned, now.producer_wakes, now.consumer_wakes
    );
    if let Some(line) = debloat_line(now) {
        println!("  {line}");
    }
    if let Some(l) = &now.link {
        let (who, in_flight) = if l.sending {
            (
                "consumer is a sending bridge",
                format!(", {} B in flight", l.in_flight_bytes),
            )
        } else {
            ("producer is a receiving bridge", String::new())
        };
        println!(
            "  remote      {who}: credit {} segments, backlog {} segments{in_flight}, {} B over the network",
            l.credit, l.backlog, l.wire_bytes
        );
    }
}

/// Buffer debloating's figures, if it is on: the target, the rate measured, the cap (Flink's
/// in-flight limit) and how long what is in flight takes to read.
fn debloat_line(s: &Snapshot) -> Option<String> {
    let limit = s.in_flight_limit_bytes()?;
    Some(format!(
        "debloating  target {}   rate {:.2} MB/s   in-flight limit {} segments × {} \
         (debloatedBufferSize) = {}   in flight {} segments   estimatedTimeToConsumeBuffersMs {}",
        duration_ns(s.debloat_target_ns),
        s.debloat_rate as f64 / 1e6,
        s.segment_cap,
        bytes_text(s.segment_fill),
        bytes_text(limit),
        s.segments_in_flight,
        s.estimated_time_to_consume_ms()
            .map_or("—".into(), |ms| format!("{ms:.1}")),
    ))
}

/// A gate's figures, and each of its channels'.
fn stat_gate(
    name: &str,
    g: &GateMonitor,
    json: bool,
    interval: Duration,
    count: u64,
) -> Result<(), String> {
    let mut prev = g.snapshot();
    let mut prev_latency = g.latency();
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    for _ in 0..count {
        std::thread::sleep(interval);
        let now = g.snapshot();
        let latency = g.latency();
        let alive: Vec<bool> = (0..g.channels()).map(|c| g.producer_alive(c)).collect();
        let consumer_alive = g.consumer_alive();
        if json {
            let line = json::gate(name, &prev, &now, &alive, consumer_alive, &latency);
            println!("{line}");
        } else {
            if tty {
                print!("\x1b[2J\x1b[H");
            }
            print_gate(name, &prev, &now, &alive);
            for line in crate::latency::lines(&prev_latency, &latency) {
                println!("{line}");
            }
        }
        prev_latency = latency;
        // The gate's consumer left and no channel has a live producer: nothing will change.
        if !consumer_alive && now.consumer_state != EndState::Free && !alive.iter().any(|&a| a) {
            if !json {
                println!("the gate and every producer have left: the figures above are final");
            }
            break;
        }
        prev = now;
    }
    Ok(())
}

/// A gate's screen view: its usage and checkpoints, then a line per channel.
fn print_gate(name: &str, prev: &GateSnapshot, now: &GateSnapshot, alive: &[bool]) {
    println!(
        "shmflow stat {name}   (gate: {} channels × {} exclusive + {} floating segments of {} B)",
        now.channels.len(),
        now.exclusive,
        now.floating,
        now.channels.first().map_or(0, |c| c.snapshot.segment_size)
    );
    println!(
        "  inputExclusiveBuffersUsage {:.2}   inputFloatingBuffersUsage {:.2}   idleTimeMsPerSecond {:.1}{}",
        now.input_exclusive_buffers_usage(),
        now.input_floating_buffers_usage(),
        now.idle_ratio_since(prev) * 1000.0,
        if now.likely_skew() {
            "   LIKELY SKEW (floating high, exclusive low)"
        } else {
            ""
        }
    );
    let k = &now.checkpoints;
    if k.released + k.cancelled > 0 || k.inflight_records > 0 {
        println!(
            "  checkpoints: {} released, {} cancelled; last #{} {}\n    checkpointAlignmentTime {}   \
             checkpointStartDelayNanos {}   held back {} records / {}   in flight (all) {} \
             records / {}",
            k.released,
            k.cancelled,
            k.last_id,
            released_name(k.last_released),
            duration_ns(k.checkpoint_alignment_time_ns),
            duration_ns(k.checkpoint_start_delay_nanos),
            k.last_held_records,
            bytes_text(k.last_held_bytes),
            k.inflight_records,
            bytes_text(k.inflight_bytes),
        );
    } else {
        println!("  checkpoints: none yet");
    }
    let debloat = now.channels.iter().any(|c| c.snapshot.segment_cap != 0);
    if let Some(c) = now.channels.first().filter(|_| debloat) {
        println!(
            "  debloating  target {}   per channel: in-flight limit (cap) and in flight, in segments",
            duration_ns(c.snapshot.debloat_target_ns)
        );
    }
    let checkpoints = now.checkpoints.released > 0;
    println!(
        "  {:>3} {:<18} {:>12} {:>12} {:>9} {:>5} {:>7} {:>6} {:>6}{}{}",
        "CH",
        "PRODUCER",
        "written/s",
        "read/s",
        "bp ms/s",
        "level",
        "backlog",
        "float",
        "excl",
        if checkpoints {
            "  held(last)  delay(last)  in flight"
        } else {
            ""
        },
        if debloat { "    MB/s  cap  now" } else { "" }
    );
    for (c, (p, n)) in prev.channels.iter().zip(&now.channels).enumerate() {
        let r = n.snapshot.rates_since(&p.snapshot);
        let a = alive.get(c).copied().unwrap_or(false);
        let here = a && n.snapshot.producer_state == EndState::Attached;
        // Per channel, for the last checkpoint: how long it was held, its barrier's delay;
        // and the records it handed back as in-flight data, in all.
        let ckpt = if checkpoints {
            format!(
                "  {:>10}  {:>11}  {:>9}",
                duration_ns(n.held_ns),
                duration_ns(n.barrier_delay_ns),
                n.inflight_records
            )
        } else {
            String::new()
        };
        let cap = if debloat {
            format!(
                "  {:>6.1} {:>4} {:>4}",
                n.snapshot.debloat_rate as f64 / 1e6,
                n.snapshot.segment_cap,
                n.snapshot.segments_in_flight
            )
        } else {
            String::new()
        };
        println!(
            "  {:>3} {:<18} {} {:>12.0} {} {:>5} {:>7} {:>6} {:>6}{}{}",
            c,
            end(n.snapshot.producer_state, n.snapshot.producer_pid, a),
            fig(here, r.records_written_per_s, 12, 0),
            r.records_read_per_s,
            fig(here, r.back_pressured_time_ms_per_second, 9, 1),
            if here { r.level.as_str() } else { "—" },
            n.backlog,
            n.floating_held,
            format!("{}/{}", n.exclusive_in_use, now.exclusive),
            ckpt,
            cap,
        );
    }
}
