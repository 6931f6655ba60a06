//! `shmflow`: look at live shmflow regions, clean up after crashed processes, measure, and run
//! the backpressure experiment. `shmflow --help` and `shmflow COMMAND --help` say how.
//!
//! Exit codes: 0 on success; 1 when the command failed (the message says why: a region that
//! does not exist or is not shmflow's, an I/O error, a failed demo); 2 for a command line that
//! does not parse (clap's usage message).

mod asyncbench;
mod bench;
mod checkpoints;
mod demo;
mod export;
mod harness;
mod json;
mod netembench;
mod openloop;
mod pipeline;
mod remote;
mod remotebench;
mod top;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use shmflow::metrics::{EndState, GateSnapshot, Snapshot};
use shmflow::monitor::{
    list_gates, list_other_objects, list_regions, remove_if_stale, remove_stale_and_unread,
    GateMonitor, Monitor,
};
use shmflow::{End, OpenError};

/// Look at and manage shmflow's shared-memory regions in /dev/shm.
#[derive(Parser, Debug)]
#[command(name = "shmflow", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// The shmflow regions in /dev/shm with geometry and ends, then any other object there.
    List,
    /// Remove every shmflow region whose ends are all dead (never one with a live end). A
    /// channel whose stream ended with records no consumer has read yet is kept for its
    /// consumer unless --unread is given.
    Clean {
        /// Also remove ended channels whose records no consumer has read, discarding them.
        #[arg(long)]
        unread: bool,
        /// Only these regions (e.g. /orders); every region in /dev/shm if none is named.
        names: Vec<String>,
    },
    /// Watch a region (channel or gate) live, read-only: it never attaches as an end. Stops
    /// by itself (exit 0) once every end has come and gone, after printing the final state.
    Stat {
        /// The region's name, e.g. /orders.
        #[arg(required_unless_present = "pipeline")]
        name: Option<String>,
        /// A shmflow-pipeline checkpoint directory instead: its supervisor's figures
        /// (numRestarts, numberOfCompletedCheckpoints, lastCheckpointDuration, ...).
        #[arg(long, conflicts_with = "name")]
        pipeline: Option<PathBuf>,
        /// One JSON object per sample instead of the screen view.
        #[arg(long)]
        json: bool,
        /// Milliseconds between samples [default: 1000, or 200 with --json].
        #[arg(long)]
        interval_ms: Option<u64>,
        /// Samples to take [default: unbounded, or 1 with --json].
        #[arg(long)]
        count: Option<u64>,
    },
    /// A live view of every channel and gate on the machine, sorted by backpressure: levels in
    /// colour, pool usage as bars, rates with sparklines, credit and backlog of remote links;
    /// Enter opens a gate's channels, / filters, q quits. Read-only, like stat.
    Top {
        /// Milliseconds between refreshes.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// Also a line per shmflow-pipeline checkpoint directory (repeatable): its state,
        /// restarts, checkpoints and last failure.
        #[arg(long)]
        pipeline: Vec<PathBuf>,
    },
    /// Serve every channel's and gate's metrics to Prometheus at http://LISTEN/metrics, with
    /// Flink's names (backPressuredTimeMsPerSecond, outPoolUsage, numRecordsOut, ...) and
    /// labels region, channel and end. Read-only, like stat.
    Export {
        /// Address to listen on (port 0: any free port; the address is printed).
        #[arg(long, default_value = "127.0.0.1:9187")]
        listen: std::net::SocketAddr,
        /// Also a shmflow-pipeline checkpoint directory's figures (repeatable).
        #[arg(long)]
        pipeline: Vec<PathBuf>,
        /// Milliseconds between the exporter's own samples: each rate gauge covers the last
        /// interval, whoever scrapes and however often.
        #[arg(long, default_value_t = 1000)]
        sample_ms: u64,
    },
    /// Measure shmflow against the hardware floor and the OS, between two processes.
    Bench(bench::BenchArgs),
    /// Wire local channels to a remote peer over TCP, with credit-based flow control.
    Remote {
        #[command(subcommand)]
        cmd: remote::RemoteCmd,
    },
    /// Run a demonstration.
    Demo {
        #[command(subcommand)]
        demo: DemoCmd,
    },
    /// Internal: the peer process of `bench`.
    #[command(name = "__bench-role", hide = true)]
    BenchRole {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Internal: the peer process of `demo`.
    #[command(name = "__demo-role", hide = true)]
    DemoRole {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
enum DemoCmd {
    /// Flink's backpressure experiment between two processes: after a calibration phase, the
    /// producer at 60 % with the consumer keeping up, the consumer slowed to 30 %, both at
    /// 100 %, the consumer at 30 % again, both at 100 %; a CSV and an SVG of throughput,
    /// backpressure and pool usage.
    Backpressure {
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
        #[arg(long, default_value = demo::DEFAULT_PHASES)]
        phases: String,
    },
    /// Checkpoint barriers through a backpressured gate, read at a fixed rate by this process
    /// from producer processes writing flat out: aligned barriers, aligned barriers with
    /// buffer debloating, and unaligned ones, one mode after the other. Reports each mode's
    /// barrier delay and checkpoint duration (p50/p99), bytes in flight and throughput, with
    /// the expected shape as goals; writes CSVs, a JSON summary and an SVG.
    Checkpoints(checkpoints::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.command {
        Cmd::List => list(),
        Cmd::Clean { unread, names } => clean(unread, &names),
        Cmd::Stat {
            name,
            pipeline,
            json,
            interval_ms,
            count,
        } => {
            let interval =
                Duration::from_millis(interval_ms.unwrap_or(if json { 200 } else { 1000 }));
            let count = count.unwrap_or(if json { 1 } else { u64::MAX });
            match (name, pipeline) {
                (_, Some(dir)) => pipeline::stat(&dir, json, interval, count),
                (Some(name), None) => stat(&name, json, interval, count),
                (None, None) => Err("name a region or --pipeline DIR".into()),
            }
        }
        Cmd::Top {
            interval_ms,
            pipeline,
        } => top::main(Duration::from_millis(interval_ms.max(50)), pipeline),
        Cmd::Export {
            listen,
            pipeline,
            sample_ms,
        } => export::main(listen, pipeline, Duration::from_millis(sample_ms.max(10))),
        Cmd::Bench(args) => bench::main(&args),
        Cmd::Demo {
            demo:
                DemoCmd::Backpressure {
                    phase_secs,
                    segments,
                    segment_size,
                    record_size,
                    out,
                    remote,
                    phases,
                },
        } => demo::main(&demo::DemoArgs {
            phase_secs,
            segments,
            segment_size,
            record_size,
            out,
            remote,
            phases,
        }),
        Cmd::Demo {
            demo: DemoCmd::Checkpoints(args),
        } => checkpoints::main(&args),
        Cmd::Remote { cmd } => remote::main(cmd),
        Cmd::BenchRole { args } => bench::role(&args),
        Cmd::DemoRole { args } if args.first().is_some_and(|r| r == "checkpoint-producer") => {
            checkpoints::role(&args)
        }
        Cmd::DemoRole { args } => demo::role(&args),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shmflow: {e}");
            ExitCode::FAILURE
        }
    }
}

fn end(state: EndState, pid: u32, alive: bool) -> String {
    match state {
        EndState::Free => "-".into(),
        EndState::Attached if alive => format!("pid {pid}"),
        EndState::Attached => format!("pid {pid} (dead)"),
        EndState::Detached => "detached".into(),
        EndState::Failed => "failed".into(),
        EndState::Lost => "lost (remote)".into(),
        EndState::Invalid(s) => format!("state {s}?"),
    }
}

fn list() -> Result<(), String> {
    let regions = list_regions().map_err(|e| e.to_string())?;
    println!(
        "{:<32} {:>10} {:>9} {:<18} {:<18}",
        "NAME", "SEG_SIZE", "SEGMENTS", "PRODUCER", "CONSUMER"
    );
    for r in &regions {
        let s = &r.snapshot;
        println!(
            "{:<32} {:>10} {:>9} {:<18} {:<18}{}",
            r.name,
            r.geometry.segment_size,
            r.geometry.segment_count,
            end(s.producer_state, s.producer_pid, r.producer_alive),
            end(s.consumer_state, s.consumer_pid, r.consumer_alive),
            match (r.awaits_consumer(), s.producer_state) {
                (true, EndState::Attached) => format!(" producer died, {} unread", unread(r)),
                (true, _) => format!(" ended, {} unread", unread(r)),
                _ => String::new(),
            }
        );
    }
    let gates = list_gates().map_err(|e| e.to_string())?;
    for (name, g) in &gates {
        let gg = g.geometry();
        let s = g.snapshot();
        let alive = (0..g.channels()).filter(|&c| g.producer_alive(c)).count();
        println!(
            "{:<32} {:>10} {:>9} {:<18} {:<18}",
            name,
            gg.segment_size,
            gg.total_segments(),
            format!("{alive}/{} alive", gg.channels),
            end(s.consumer_state, 0, g.consumer_alive()).replace("pid 0", "attached"),
        );
        println!(
            "{:<32} gate: {} channels × {} exclusive + {} floating",
            "", gg.channels, gg.exclusive, gg.floating
        );
    }
    if regions.is_empty() && gates.is_empty() {
        println!("(no shmflow regions)");
    }
    let others = list_other_objects().map_err(|e| e.to_string())?;
    if !others.is_empty() {
        println!("\nother objects in /dev/shm:");
        for (name, why) in &others {
            println!("{:<32} {}", name, describe(why));
        }
    }
    Ok(())
}

/// A short word on an object that is not a region this user can open.
fn describe(e: &OpenError) -> String {
    match e {
        OpenError::SizeMismatch { found: 0, .. } | OpenError::BadMagic { found: 0, .. } => {
            "empty: being created, or left by a creator that died while setting it up".into()
        }
        OpenError::BadMagic {
            found_kind: None, ..
        } => "not a shmflow region".into(),
        OpenError::VersionMismatch { found, .. } => format!("shmflow layout version {found}"),
        OpenError::NotOwner { found, .. } => format!("another user's (uid {found})"),
        OpenError::BadMode { mode, .. } => format!("mode {mode:o}: not trusted"),
        OpenError::NotARegion { found, .. } => (*found).to_owned(),
        other => other.to_string(),
    }
}

/// What an ended channel still holds for its consumer.
fn unread(r: &shmflow::monitor::RegionInfo) -> String {
    match r.unread_records() {
        0 => format!(
            "{} segment(s)",
            r.snapshot
                .segments_acquired
                .saturating_sub(r.snapshot.segments_returned)
        ),
        n => format!("{n} record(s)"),
    }
}

/// Removes every shmflow region whose ends are all dead; never one with a live end, and a
/// channel waiting for its consumer only with `unread`.
fn clean(unread_too: bool, names: &[String]) -> Result<(), String> {
    let mut removed = 0;
    let wanted = |n: &str| names.is_empty() || names.iter().any(|w| w == n);
    let mut channels = list_regions().map_err(|e| e.to_string())?;
    channels.retain(|r| wanted(&r.name));
    let mut gates = list_gates().map_err(|e| e.to_string())?;
    gates.retain(|g| wanted(&g.0));
    let mut errors = 0;
    for n in names {
        if !channels.iter().any(|r| &r.name == n) && !gates.iter().any(|g| &g.0 == n) {
            eprintln!("shmflow: {n}: not a shmflow region in /dev/shm (see `shmflow list`)");
            errors += 1;
        }
    }
    // Why each live region stays.
    for r in channels.iter().filter(|r| !r.is_stale()) {
        let s = &r.snapshot;
        let who: Vec<String> = [
            (r.producer_alive, "producer", s.producer_pid),
            (r.consumer_alive, "consumer", s.consumer_pid),
        ]
        .iter()
        .filter(|(alive, _, _)| *alive)
        .map(|(_, end, pid)| format!("its {end} (pid {pid}) is alive"))
        .collect();
        println!("kept {} ({})", r.name, who.join(", "));
    }
    for (name, g) in gates.iter().filter(|g| !g.1.is_stale()) {
        let live = (0..g.channels()).filter(|&c| g.producer_alive(c)).count();
        let consumer = match g.consumer_alive() {
            true => "its consumer is alive, ",
            false => "",
        };
        println!("kept {name} ({consumer}{live} producer(s) alive)");
    }
    for r in channels.iter().filter(|r| r.is_stale()) {
        if r.awaits_consumer() && !unread_too {
            println!(
                "kept {} (ended, {} unread, waiting for its consumer; --unread discards them)",
                r.name,
                unread(r)
            );
        }
    }
    let stale = channels
        .iter()
        .filter(|r| r.is_stale() && (unread_too || !r.awaits_consumer()))
        .map(|r| r.name.clone())
        .chain(gates.iter().filter(|g| g.1.is_stale()).map(|g| g.0.clone()));
    for name in stale {
        let res = if unread_too {
            remove_stale_and_unread(&name)
        } else {
            remove_if_stale(&name)
        };
        match res {
            Ok(true) => {
                println!("removed {name} (no live end)");
                removed += 1;
            }
            Ok(false) => println!("kept {name} (an end came alive)"),
            // Removed by someone else meanwhile: what was wanted.
            Err(OpenError::NotFound { .. }) => println!("{name} is gone already"),
            Err(e) => {
                eprintln!("shmflow: {e}");
                errors += 1;
            }
        }
    }
    println!("{removed} stale region(s) removed");
    match errors {
        0 => Ok(()),
        n => Err(format!("{n} error(s), above")),
    }
}

fn stat(name: &str, json: bool, interval: Duration, count: u64) -> Result<(), String> {
    match GateMonitor::open(name) {
        Ok(g) => return stat_gate(name, &g, json, interval, count),
        // Not a gate: a channel, or the channel open says what is wrong.
        Err(OpenError::BadMagic { .. }) => {}
        Err(e) => return Err(e.to_string()),
    }
    let m = Monitor::open(name).map_err(|e| e.to_string())?;
    let mut prev = m.snapshot();
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    for _ in 0..count {
        std::thread::sleep(interval);
        let now = m.snapshot();
        let alive = (m.end_alive(End::Producer), m.end_alive(End::Consumer));
        if json {
            println!("{}", json::snapshot(name, &prev, &now));
        } else {
            if tty {
                print!("\x1b[2J\x1b[H");
            }
            print_view(name, &prev, &now, alive);
        }
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

fn stat_gate(
    name: &str,
    g: &GateMonitor,
    json: bool,
    interval: Duration,
    count: u64,
) -> Result<(), String> {
    let mut prev = g.snapshot();
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    for _ in 0..count {
        std::thread::sleep(interval);
        let now = g.snapshot();
        let alive: Vec<bool> = (0..g.channels()).map(|c| g.producer_alive(c)).collect();
        let consumer_alive = g.consumer_alive();
        if json {
            println!("{}", json::gate(name, &prev, &now, &alive, consumer_alive));
        } else {
            if tty {
                print!("\x1b[2J\x1b[H");
            }
            print_gate(name, &prev, &now, &alive);
        }
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

/// How a checkpoint was released, as `stat` says it.
pub(crate) fn released_name(r: Option<shmflow::Released>) -> &'static str {
    match r {
        None => "none",
        Some(shmflow::Released::Aligned) => "aligned",
        Some(shmflow::Released::Unaligned { timed_out: true }) => "unaligned (alignment timed out)",
        Some(shmflow::Released::Unaligned { .. }) => "unaligned",
        Some(_) => "other",
    }
}

fn duration_ns(ns: u64) -> String {
    match ns {
        0..=9_999 => format!("{ns} ns"),
        10_000..=9_999_999 => format!("{:.1} µs", ns as f64 / 1e3),
        10_000_000..=9_999_999_999 => format!("{:.1} ms", ns as f64 / 1e6),
        _ => format!("{:.2} s", ns as f64 / 1e9),
    }
}

fn bytes_text(b: u64) -> String {
    match b {
        0..=9_999 => format!("{b} B"),
        10_000..=9_999_999 => format!("{:.1} KiB", b as f64 / 1024.0),
        _ => format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0)),
    }
}

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
