//! Three processes linked by two shmflow channels: source → transform → sink.
//!
//! ```text
//! cargo run --release --example pipeline -- [--records N] [--sink-rate R] [--named]
//! ```
//!
//! The source sends N records `[seq u64][value u64][filler…]` (16 to 256 bytes); the transform
//! doubles `value` and appends a checksum; the sink checks order, values and checksums and
//! prints one summary line with `verified=ok` (exit code 1 on any mismatch). `--sink-rate R`
//! caps the sink at R records/s: backpressure then slows the source to the same rate, which
//! the source's own line shows.
//!
//! Each process re-executes this binary with a role. By default the channels are anonymous
//! memfd regions handed to the child through an inherited descriptor (`PeerHandle::pass_to`):
//! nothing outside the three processes can see them. With `--named` they are named regions
//! (`/shmflow-pipeline-PID-a` and `-b`) that `shmflow list` shows and `shmflow stat NAME`
//! watches live, while the pipeline runs; the source prints the names and the commands.

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use clap::Parser;
use shmflow::{Consumer, FlushPolicy, Geometry, PeerHandle, Producer};

const FD_VAR: &str = "PIPELINE_FD";

struct Args {
    role: String,
    records: u64,
    sink_rate: Option<f64>,
    /// Named regions with this prefix instead of anonymous ones.
    named: Option<String>,
}

/// Three processes linked by two shmflow channels: source → transform → sink.
#[derive(Parser)]
#[command(name = "pipeline", args_override_self = true)]
struct Cli {
    /// Records the source sends.
    #[arg(long, value_name = "N", default_value_t = 10_000_000)]
    records: u64,
    /// Cap the sink at R records/s: backpressure slows the source to it.
    #[arg(long, value_name = "R")]
    sink_rate: Option<f64>,
    /// Use named regions that `shmflow list` and `shmflow stat` can watch.
    #[arg(long)]
    named: bool,
    /// The stage this process runs (the source starts the others).
    #[arg(long, hide = true, default_value = "source")]
    role: String,
    /// The named regions' prefix, given to the stages the source starts.
    #[arg(long, hide = true)]
    prefix: Option<String>,
}

fn parse_args() -> Args {
    let a = Cli::parse();
    let named = match a.prefix {
        Some(p) => Some(p),
        None if a.named => Some(format!("/shmflow-pipeline-{}", std::process::id())),
        None => None,
    };
    Args {
        role: a.role,
        records: a.records,
        sink_rate: a.sink_rate,
        named,
    }
}

/// How a stage hands its output channel to the next one.
enum Link {
    Handle(PeerHandle),
    Named,
}

fn spawn_next(role: &str, args: &Args, link: &Link) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().expect("own path"));
    cmd.args(["--role", role, "--records", &args.records.to_string()]);
    if let Some(r) = args.sink_rate {
        cmd.args(["--sink-rate", &r.to_string()]);
    }
    match link {
        Link::Handle(handle) => handle.pass_to(&mut cmd, FD_VAR),
        Link::Named => {
            cmd.args(["--prefix", args.named.as_deref().expect("named")]);
        }
    }
    cmd.spawn().expect("spawning the next stage")
}

/// A stage's output: a named region `PREFIX-which` with `--named`, else an anonymous one.
fn output(args: &Args, which: &str) -> Result<(Producer, Link), String> {
    let (mut tx, link) = match &args.named {
        Some(prefix) => {
            let name = format!("{prefix}-{which}");
            let tx = Producer::create(&name, geometry()).map_err(|e| e.to_string())?;
            (tx, Link::Named)
        }
        None => {
            let (tx, handle) = Producer::create_anonymous(geometry()).map_err(|e| e.to_string())?;
            (tx, Link::Handle(handle))
        }
    };
    tx.set_flush_policy(FlushPolicy::Timeout(Duration::from_millis(1)));
    Ok((tx, link))
}

/// A stage's input: the named region `PREFIX-which`, or the handed descriptor.
fn input(args: &Args, which: &str) -> Result<Consumer, String> {
    match &args.named {
        Some(prefix) => Consumer::open(&format!("{prefix}-{which}")),
        None => Consumer::from_env(FD_VAR),
    }
    .map_err(|e| e.to_string())
}

fn mix(x: u64) -> u64 {
    let x = (x ^ (x >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 29)
}

fn record_len(seq: u64) -> usize {
    16 + (mix(seq) % 241) as usize
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

fn geometry() -> Geometry {
    Geometry {
        segment_size: 32 * 1024,
        segment_count: 32,
    }
}

fn source(args: &Args) -> Result<(), String> {
    let (mut tx, link) = output(args, "a")?;
    if let Some(prefix) = &args.named {
        println!(
            "source: channels {prefix}-a (source -> transform) and {prefix}-b (transform -> \
             sink); watch them with `shmflow stat {prefix}-a` or `shmflow list`"
        );
    }
    let mut transform = spawn_next("transform", args, &link);
    drop(link);
    let start = Instant::now();
    let sent = (|| {
        for seq in 0..args.records {
            let len = record_len(seq);
            let mut claim = tx.claim(len)?;
            claim[..8].copy_from_slice(&seq.to_le_bytes());
            claim[8..16].copy_from_slice(&mix(seq).to_le_bytes());
            claim[16..].fill(seq as u8);
            claim.commit();
        }
        Ok::<(), shmflow::Error>(())
    })();
    drop(tx);
    let el = start.elapsed().as_secs_f64();
    let status = transform.wait().map_err(|e| e.to_string())?;
    sent.map_err(|e| e.to_string())?;
    println!("source: records={} records_per_sec={:.0} (blocked by backpressure whenever the pool was full)", args.records, args.records as f64 / el);
    if !status.success() {
        return Err(format!("transform/sink failed: {status}"));
    }
    Ok(())
}

fn transform(args: &Args) -> Result<(), String> {
    let mut rx = input(args, "a")?;
    let (mut tx, link) = output(args, "b")?;
    let mut sink = spawn_next("sink", args, &link);
    drop(link);
    let res = forward(&mut rx, &mut tx);
    // A transform that gives up ends its output as failed: the sink is told, not left to
    // count missing records.
    if res.is_err() {
        tx.fail();
    } else {
        drop(tx);
    }
    let status = sink.wait().map_err(|e| e.to_string())?;
    res?;
    if !status.success() {
        return Err(format!("sink failed: {status}"));
    }
    Ok(())
}

/// The transform's loop: double the value, append a checksum.
fn forward(rx: &mut Consumer, tx: &mut Producer) -> Result<(), String> {
    while let Some(r) = rx.recv().map_err(|e| e.to_string())? {
        let b = r.as_bytes().ok_or("unexpected spanning record")?;
        if b.len() < 16 {
            return Err(format!("record of {} bytes", b.len()));
        }
        let mut claim = tx.claim(b.len() + 8).map_err(|e| e.to_string())?;
        claim[..8].copy_from_slice(&b[..8]);
        let v = u64::from_le_bytes(b[8..16].try_into().unwrap()).wrapping_mul(2);
        claim[8..16].copy_from_slice(&v.to_le_bytes());
        claim[16..b.len()].copy_from_slice(&b[16..]);
        let sum = checksum(&claim[..b.len()]);
        claim[b.len()..].copy_from_slice(&sum.to_le_bytes());
        claim.commit();
    }
    Ok(())
}

fn sink(args: &Args) -> Result<(), String> {
    let mut rx = input(args, "b")?;
    let start = Instant::now();
    let mut seq = 0u64;
    while let Some(r) = rx.recv().map_err(|e| e.to_string())? {
        let b = r.as_bytes().ok_or("unexpected spanning record")?;
        let len = record_len(seq);
        let ok = b.len() == len + 8
            && u64::from_le_bytes(b[..8].try_into().unwrap()) == seq
            && u64::from_le_bytes(b[8..16].try_into().unwrap()) == mix(seq).wrapping_mul(2)
            && b[16..len].iter().all(|&x| x == seq as u8)
            && u64::from_le_bytes(b[len..].try_into().unwrap()) == checksum(&b[..len]);
        if !ok {
            println!("sink: records={seq} verified=MISMATCH at record {seq}");
            return Err(format!("record {seq} is wrong"));
        }
        seq += 1;
        if let Some(rate) = args.sink_rate {
            // Pace: never ahead of `rate` records per second.
            let due = Duration::from_secs_f64(seq as f64 / rate);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                if wait > Duration::from_micros(200) {
                    std::thread::sleep(wait);
                }
            }
        }
    }
    let el = start.elapsed().as_secs_f64();
    let verified = if seq == args.records { "ok" } else { "MISSING" };
    println!(
        "sink: records={seq} records_per_sec={:.0} seconds={el:.2} verified={verified}",
        seq as f64 / el
    );
    if seq != args.records {
        return Err(format!("{seq} of {} records arrived", args.records));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = parse_args();
    let res = match args.role.as_str() {
        "source" => source(&args),
        "transform" => transform(&args),
        "sink" => sink(&args),
        other => Err(format!("unknown role {other}")),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}: {e}", args.role);
            ExitCode::FAILURE
        }
    }
}
