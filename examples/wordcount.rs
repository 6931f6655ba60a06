//! Word count as a real multi-process pipeline over shmflow gates and partitions:
//!
//! ```text
//! 2 sources ──round-robin──▶ 3 tokenizers ──by word hash──▶ 2 counters ──▶ 1 sink
//! ```
//!
//! Every stage is its own process (this binary, re-executed with a role). Each tokenizer,
//! counter and the sink reads one [`Gate`] with a channel per upstream process; sources and
//! tokenizers write through a [`Partition`]. The sink checks the counts against a count of the
//! same generated corpus made in one process and exits non-zero on any mismatch, and so does
//! this program.
//!
//! ```text
//! cargo run --release --example wordcount                       # check the counts
//! cargo run --release --example wordcount -- --slow-counter 1   # counter 1 is slow: watch
//!                                                               # backpressure reach the sources
//! cargo run --release --example wordcount -- --skew             # one hot word: its counter's
//!                                                               # gate takes the floating segments
//! ```
//!
//! `--remote` splits the pipeline over TCP: the sources and tokenizers on one side, the
//! counters and the sink on the other, sharing no region. Each tokenizer writes its outputs
//! into channels of its own, which a bridge process serves (`shmflow::net::Server`); a bridge
//! on the other side requests them and writes them into the counters' gates
//! (`shmflow::net::Client`), over one loopback connection with credit-based flow control.
//! (Needs the `net` feature: `cargo run --release --features net --example wordcount --
//! --remote`.)
//!
//! Options: `--lines N` per source (default 200000), `--slow-counter K` and `--slow-ns N`
//! (busy work per word in counter K, default 3000 ns when slowed), `--skew`.
//!
//! `--barriers aligned|unaligned|timeout:MS` makes the sources send a checkpoint barrier every
//! `--barrier-interval-ms` (default 500): the tokenizers pass each on when their gate releases
//! it (`forward_barrier`, keeping the source's send time, so that the alignment timeout counts
//! from the source as Flink's checkpoint start delay does), and each counter reports, per
//! checkpoint, how it was released and how long the barrier took from its source to the
//! counter's release:
//!
//! ```text
//! cargo run --release --example wordcount -- --slow-counter 1 --barriers aligned
//! cargo run --release --example wordcount -- --slow-counter 1 --barriers unaligned
//! cargo run --release --example wordcount -- --slow-counter 1 --barriers timeout:100
//! cargo run --release --example wordcount -- --slow-counter 1 --barriers aligned --debloat-ms 20
//! ```
//!
//! `--debloat-ms N` turns buffer debloating on in every gate (`Gate::set_debloat_target`): what
//! is in flight to each stage is about what it reads in N ms, so an aligned barrier waits behind
//! that much instead of the whole pool.
//!
//! `--checkpoint-dir DIR` (with `--barriers`) makes the count exactly-once across a crash, as
//! Flink's checkpoints do, and shows it with a real one:
//!
//! ```text
//! cargo run --release --example wordcount -- --lines 300000 --slow-counter 1 \
//!     --barriers unaligned --barrier-interval-ms 100 --checkpoint-dir target/wc-chk --crash-seed random
//! ```
//!
//! The orchestrator writes each source's corpus to `DIR/input-S.txt` once; a source reads its
//! lines from there, and its replay position is its byte offset in that file (as Flink records
//! a Kafka offset). At each barrier every stage acknowledges the checkpoint by writing its
//! state atomically to `DIR/chk-ID/STAGE` (each stage's duty is told at its function): a source
//! its offset, a tokenizer the in-flight lines an unaligned release handed back, a counter its
//! count map and the in-flight words, the sink the results it has (none: the counters send
//! theirs only after their last barrier). The orchestrator's coordinator marks a checkpoint complete once every
//! stage acknowledged it (`DIR/completed`, written the same way) and removes the older ones; the
//! sources start a checkpoint only once the last is complete. At a moment drawn from the crash
//! seed (after the first complete checkpoint) it SIGKILLs a stage drawn from it, then fails over
//! as Flink's full restart does: it kills every other stage, removes the run's names from
//! `/dev/shm`, and starts the whole pipeline again from the last complete checkpoint — sources
//! seek to their offsets, tokenizers tokenize their in-flight lines again, counters load their
//! counts and count their in-flight words, before reading anything new. The sink's check then
//! tells whether a word was lost or counted twice. `--crash-seed random` (the default) prints
//! the seed it draws, to run the same crash again with `--crash-seed S`; `--crash-seed none`
//! kills nothing; `--crashes N` crashes N attempts in a row. (Not with `--remote`.)
//!
//! When a stage fails, the failure travels: a stage that gives up ends its outputs as failed
//! (`Producer::fail`), a stage downstream of a dead or failed one gives up in turn, and one
//! upstream of it finds its sends refused (`Closed`, `PeerDead`). Every stage then exits
//! non-zero with a message and removes the gate it created. `--kill-stage ROLE:INDEX` (e.g.
//! `tokenizer:1`) shows it: it SIGKILLs that stage mid-run, checks that every other stage
//! exits non-zero by itself, that `/dev/shm` holds nothing of the run but the killed stage's
//! own gate, and that `shmflow clean` (`remove_if_stale`) removes it; it exits 0 if all holds.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use shmflow::metrics::{BackpressureLevel, GateSnapshot};
use shmflow::monitor::GateMonitor;
use shmflow::{
    Alignment, Gate, GateGeometry, GateMessage, Partition, Partitioner, Producer, Released,
};

const SOURCES: usize = 2;
const TOKENIZERS: usize = 3;
const COUNTERS: usize = 2;
const VOCABULARY: u64 = 20_000;
const HOT_WORD: &str = "the";

#[derive(Clone)]
struct Opts {
    lines: u64,
    slow_counter: Option<usize>,
    slow_ns: u64,
    skew: bool,
    prefix: String,
    /// `--kill-stage ROLE:INDEX`: SIGKILL that stage mid-run and check what the others do.
    kill_stage: Option<(String, usize)>,
    /// `--remote`: tokenizers and counters talk through TCP on loopback, on this port.
    remote: Option<u16>,
    /// `--barriers`: how the sources' checkpoint barriers are aligned, and how often.
    barriers: Option<Alignment>,
    barrier_interval: Duration,
    /// `--debloat-ms`: buffer debloating on every gate, with this target.
    debloat: Option<Duration>,
    /// `--checkpoint-dir`: exactly-once mode, with the checkpoints kept in this directory.
    checkpoint_dir: Option<PathBuf>,
    /// `--crash-seed`: which stage the orchestrator kills, and when.
    crash_seed: CrashSeed,
    /// `--crashes`: how many attempts in a row get a crash.
    crashes: u32,
    /// `--restore ID` (given to the stages by the orchestrator): the checkpoint to start from.
    restore: Option<u64>,
}

/// `--crash-seed S|random|none`.
#[derive(Clone, Copy)]
enum CrashSeed {
    /// A seed drawn from the clock (and printed).
    Random,
    Seed(u64),
    /// No crash: checkpoints only.
    None,
}

/// A word count over 8 processes (2 sources, 3 tokenizers, 2 counters, a sink) linked by
/// shmflow gates; exits non-zero if a count differs.
#[derive(Parser)]
#[command(name = "wordcount", args_override_self = true)]
struct Args {
    /// Lines per source.
    #[arg(long, value_name = "N", default_value_t = 200_000)]
    lines: u64,
    /// Counter K does busy work per word: backpressure reaches the sources.
    #[arg(long, value_name = "K")]
    slow_counter: Option<usize>,
    /// The slowed counter's work per word in ns.
    #[arg(long, value_name = "N", default_value_t = 3000)]
    slow_ns: u64,
    /// One hot word takes half the words (its counter's gate borrows floating segments).
    #[arg(long)]
    skew: bool,
    /// Tokenizers and counters talk over TCP on loopback (needs the net feature).
    #[arg(long)]
    remote: bool,
    /// SIGKILL stage ROLE:I (source, tokenizer, counter, sink) mid-run and check that every
    /// other stage stops non-zero and only its gate is left.
    #[arg(long, value_name = "ROLE:I", value_parser = kill_stage)]
    kill_stage: Option<(String, usize)>,
    /// Prefix of the gates' names [default: /shmflow-wc-PID].
    #[arg(long, value_name = "/NAME")]
    prefix: Option<String>,
    /// The sources send checkpoint barriers: aligned, unaligned or timeout:MS (aligned,
    /// switching to unaligned after MS ms); counters report their delay.
    #[arg(long, value_name = "MODE", value_parser = barriers)]
    barriers: Option<Alignment>,
    /// Time between barriers.
    #[arg(long, value_name = "N", default_value_t = 500)]
    barrier_interval_ms: u64,
    /// Buffer debloating on every gate: what is in flight to a stage is what it reads in N ms
    /// (a barrier waits behind about that much).
    #[arg(long, value_name = "N")]
    debloat_ms: Option<u64>,
    /// Exactly-once: the sources read their input from files in DIR, every stage acknowledges
    /// each checkpoint there with its state, and after a crash the whole pipeline restarts
    /// from the last complete checkpoint (needs --barriers).
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// With --checkpoint-dir: kill the stage drawn from seed S at a moment drawn from it, then
    /// recover; `random` (the default) draws a seed and prints it, `none` kills nothing.
    #[arg(long, value_name = "S|random|none", value_parser = crash_seed)]
    crash_seed: Option<CrashSeed>,
    /// Crash that many attempts in a row [default: 1].
    #[arg(long, value_name = "N")]
    crashes: Option<u32>,
    /// The port of the TCP link (given to the stages by the orchestrator).
    #[arg(long, hide = true)]
    port: Option<u16>,
    /// The stage this process runs (given by the orchestrator).
    #[arg(long, hide = true)]
    role: Option<String>,
    /// The stage's index among its kind.
    #[arg(long, hide = true)]
    index: Option<usize>,
    /// The checkpoint to start from (given to the stages by the orchestrator).
    #[arg(long, hide = true)]
    restore: Option<u64>,
}

/// `--kill-stage ROLE:INDEX`.
fn kill_stage(v: &str) -> Result<(String, usize), String> {
    v.split_once(':')
        .and_then(|(r, i)| Some((r.to_owned(), i.parse().ok()?)))
        .ok_or_else(|| "--kill-stage takes ROLE:INDEX".to_owned())
}

/// `--barriers aligned|unaligned|timeout:MS`.
fn barriers(m: &str) -> Result<Alignment, String> {
    match m {
        "aligned" => Ok(Alignment::Aligned),
        "unaligned" => Ok(Alignment::Unaligned),
        t => match t.strip_prefix("timeout:").and_then(|ms| ms.parse().ok()) {
            Some(ms) => Ok(Alignment::AlignedWithTimeout(Duration::from_millis(ms))),
            None => Err("--barriers takes aligned, unaligned or timeout:MS".to_owned()),
        },
    }
}

/// `--crash-seed S|random|none`.
fn crash_seed(v: &str) -> Result<CrashSeed, String> {
    match v {
        "random" => Ok(CrashSeed::Random),
        "none" => Ok(CrashSeed::None),
        s => s
            .parse()
            .map(CrashSeed::Seed)
            .map_err(|_| format!("{s:?} is not a seed, `random` or `none`")),
    }
}

/// Prints `msg` with the usage and exits 2, as for a command line that does not parse.
fn usage_error(msg: &str) -> ! {
    Args::command()
        .error(ErrorKind::ArgumentConflict, msg)
        .exit()
}

fn main() {
    let parsed = Args::parse();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = Opts {
        lines: parsed.lines,
        slow_counter: parsed.slow_counter,
        slow_ns: parsed.slow_ns,
        skew: parsed.skew,
        prefix: parsed
            .prefix
            .clone()
            .unwrap_or_else(|| format!("/shmflow-wc-{}", std::process::id())),
        kill_stage: parsed.kill_stage.clone(),
        remote: match parsed.port {
            Some(port) => Some(port),
            None if parsed.remote => Some(free_port()),
            None => None,
        },
        barriers: parsed.barriers,
        barrier_interval: Duration::from_millis(parsed.barrier_interval_ms),
        debloat: parsed.debloat_ms.map(Duration::from_millis),
        checkpoint_dir: parsed.checkpoint_dir.clone(),
        crash_seed: parsed.crash_seed.unwrap_or(CrashSeed::Random),
        crashes: parsed.crashes.unwrap_or(1),
        restore: parsed.restore,
    };
    if opts.checkpoint_dir.is_some() {
        if opts.barriers.is_none() {
            usage_error("--checkpoint-dir needs --barriers aligned|unaligned|timeout:MS");
        }
        if opts.kill_stage.is_some() || parsed.remote {
            usage_error("--checkpoint-dir goes with neither --kill-stage nor --remote");
        }
    } else if parsed.crash_seed.is_some() || parsed.crashes.is_some() {
        usage_error("--crash-seed and --crashes need --checkpoint-dir");
    }
    let result = match parsed.role.as_deref() {
        None if opts.kill_stage.is_some() => kill_and_check(&opts, &args),
        None if opts.checkpoint_dir.is_some() => exactly_once(&opts, &args),
        None => orchestrate(&opts, &args),
        Some(role) => {
            let index = parsed.index.unwrap_or(0);
            match role {
                "source" => source(&opts, index),
                "tokenizer" => tokenizer(&opts, index),
                "counter" => counter(&opts, index),
                "sink" => sink(&opts),
                "bridge-out" => remote::bridge_out(&opts),
                "bridge-in" => remote::bridge_in(&opts),
                _ => Err(format!("unknown role {role}")),
            }
        }
    };
    if let Err(e) = result {
        match &parsed.role {
            Some(role) => eprintln!(
                "wordcount {role} {}: {e}",
                parsed.index.map(|i| i.to_string()).unwrap_or_default()
            ),
            None => eprintln!("wordcount: {e}"),
        }
        std::process::exit(1);
    }
}

// ----- the corpus ------------------------------------------------------------------------------

/// splitmix64: the corpus is a pure function of (source, line).
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Line `i` of source `s`: 6 to 17 words; skewed, half the words are the hot one.
fn line(s: usize, i: u64, skew: bool, out: &mut String) {
    out.clear();
    let mut r = mix((s as u64) << 40 ^ i);
    let words = 6 + r % 12;
    for w in 0..words {
        r = mix(r ^ w);
        if w > 0 {
            out.push(' ');
        }
        if skew && r % 2 == 0 {
            out.push_str(HOT_WORD);
        } else {
            // Zipf-ish: small indices are much more common.
            let u = (r >> 11) as f64 / (1u64 << 53) as f64;
            let idx = (u * u * u * VOCABULARY as f64) as u64;
            use std::fmt::Write;
            let _ = write!(out, "w{idx}");
        }
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

fn expected(opts: &Opts) -> HashMap<String, u64> {
    let mut counts = HashMap::new();
    let mut l = String::new();
    for s in 0..SOURCES {
        for i in 0..opts.lines {
            line(s, i, opts.skew, &mut l);
            for w in l.split_ascii_whitespace() {
                *counts.entry(w.to_owned()).or_insert(0) += 1;
            }
        }
    }
    counts
}

// ----- wiring ----------------------------------------------------------------------------------

fn gate_name(opts: &Opts, stage: &str, i: usize) -> String {
    format!("{}-{stage}{i}", opts.prefix)
}

fn geometry(channels: usize) -> GateGeometry {
    GateGeometry::new(channels as u32)
}

/// Creates a stage's gate, debloated with `--debloat-ms`.
fn create_gate(opts: &Opts, name: &str, channels: usize) -> Result<Gate, String> {
    let mut gate = Gate::create(name, geometry(channels)).map_err(err)?;
    gate.set_debloat_target(opts.debloat);
    Ok(gate)
}

/// Opens channel `c` of a gate its consumer may not have created yet.
fn open_channel(name: &str, c: usize) -> Result<Producer, String> {
    let start = Instant::now();
    loop {
        match Producer::open_channel(name, c as u32) {
            Ok(p) => return Ok(p),
            Err(shmflow::OpenError::NotFound { .. })
                if start.elapsed() < Duration::from_secs(20) =>
            {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => return Err(format!("opening {name} channel {c}: {e}")),
        }
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

// ----- the stages ------------------------------------------------------------------------------

/// Where a source's lines come from: generated as it goes, or (with checkpoints) read from its
/// input file, whose byte offset is its replay position (as Flink records a Kafka offset).
enum Input {
    Generated {
        next: u64,
        lines: u64,
    },
    File {
        reader: BufReader<File>,
        offset: u64,
    },
}

impl Input {
    /// The next line into `out` (without its newline); false at the end.
    fn next_line(&mut self, opts: &Opts, s: usize, out: &mut String) -> Result<bool, String> {
        match self {
            Input::Generated { next, lines } => {
                if next == lines {
                    return Ok(false);
                }
                line(s, *next, opts.skew, out);
                *next += 1;
            }
            Input::File { reader, offset } => {
                out.clear();
                let n = reader.read_line(out).map_err(err)?;
                if n == 0 {
                    return Ok(false);
                }
                *offset += n as u64;
                if out.ends_with('\n') {
                    out.pop();
                }
            }
        }
        Ok(true)
    }
}

/// A source sends its lines round-robin to the tokenizers, and with `--barriers` a barrier
/// every interval, its ids counting up from the checkpoint restored (or 0), so that the two
/// sources' ids agree.
///
/// Its checkpoint duty: it reads its input file from the offset of the checkpoint it restores,
/// and before it sends barrier `id` it acknowledges checkpoint `id` with the offset of the
/// next line to send: every line before that offset goes before the barrier. It sends the
/// next barrier once the interval has passed since the last *and* the last checkpoint is
/// complete (`DIR/completed`), one checkpoint at a time as Flink's default
/// (`max-concurrent-checkpoints` 1): so both sources send the same ids, and no checkpoint is
/// cancelled by the next. (Barriers every interval regardless would, under backpressure,
/// complete no unaligned checkpoint: the next barrier's announcement would overtake each
/// one's in-flight data before its barrier had drained, and a gate cancels a checkpoint for
/// a newer one.)
fn source(opts: &Opts, s: usize) -> Result<(), String> {
    let outs = (0..TOKENIZERS)
        .map(|t| open_channel(&gate_name(opts, "tok", t), s))
        .collect::<Result<Vec<_>, _>>()?;
    let mut part = Partition::new(outs, Partitioner::RoundRobin).map_err(err)?;
    let ack_name = format!("source-{s}");
    let mut input = match &opts.checkpoint_dir {
        None => Input::Generated {
            next: 0,
            lines: opts.lines,
        },
        Some(dir) => {
            let offset = match opts.restore {
                Some(id) => {
                    let mut state = checkpoint::load(dir, id, &ack_name)?;
                    let offset = state.u64()?;
                    state.end()?;
                    offset
                }
                None => 0,
            };
            let path = checkpoint::input(dir, s);
            let mut file = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            file.seek(SeekFrom::Start(offset)).map_err(err)?;
            Input::File {
                reader: BufReader::new(file),
                offset,
            }
        }
    };
    let mut l = String::new();
    let mut next_barrier = Instant::now() + opts.barrier_interval;
    let mut id = opts.restore.unwrap_or(0);
    let mut i = 0u64;
    let sent = (|| loop {
        // The offset before the line read: where a restore starts if the barrier goes first.
        let offset = match &input {
            Input::File { offset, .. } => *offset,
            Input::Generated { .. } => 0,
        };
        if !input.next_line(opts, s, &mut l)? {
            return Ok(());
        }
        if let Some(alignment) = opts.barriers {
            if i % 64 == 0 && Instant::now() >= next_barrier {
                match &opts.checkpoint_dir {
                    None => {
                        id += 1;
                        part.send_barrier(id, alignment, b"").map_err(err)?;
                        next_barrier += opts.barrier_interval;
                    }
                    // One checkpoint at a time: the next once the last is complete.
                    Some(dir) if checkpoint::completed(dir)?.unwrap_or(0) >= id => {
                        id += 1;
                        let mut state = checkpoint::Enc::new();
                        state.u64(offset);
                        checkpoint::ack(dir, id, &ack_name, &state)?;
                        part.send_barrier(id, alignment, b"").map_err(err)?;
                        next_barrier = Instant::now() + opts.barrier_interval;
                    }
                    Some(_) => {}
                }
            }
        }
        part.send(l.as_bytes()).map_err(err)?;
        i += 1;
    })();
    // Dropping the producers ends each channel cleanly: the tokenizers see EndOfPartition.
    // A stage that gives up ends them as failed instead, so that the failure travels on.
    if sent.is_err() {
        part.fail();
    }
    sent
}

/// A tokenizer splits lines into words and sends each to its counter by word hash.
///
/// Its checkpoint duty: it has no state of its own, but a barrier released unaligned hands it
/// back the in-flight lines (queued before the barrier, so before the sources' offsets, and
/// their words sent after the barrier it forwarded): it keeps them, and acknowledges the
/// checkpoint with them at `InFlightEnd` (a checkpoint cancelled before is not acknowledged);
/// a barrier released aligned it acknowledges at once, with none. Restored, it tokenizes the
/// checkpoint's in-flight lines again before it reads its gate.
fn tokenizer(opts: &Opts, t: usize) -> Result<(), String> {
    let mut gate = create_gate(opts, &gate_name(opts, "tok", t), SOURCES)?;
    let outs = (0..COUNTERS)
        .map(|k| match opts.remote {
            // Across the network: a channel of its own, served by the outgoing bridge.
            Some(_) => Producer::builder()
                .geometry(remote::channel_geometry())
                .open_or_create(&remote::channel_name(opts, t, k))
                .map_err(err),
            None => open_channel(&gate_name(opts, "cnt", k), t),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut part = Partition::new(outs, Partitioner::Key(Box::new(fnv))).map_err(err)?;
    let tokenize = |part: &mut Partition, text: &[u8]| -> Result<(), String> {
        for w in text.split(|&b| b == b' ').filter(|w| !w.is_empty()) {
            part.send(w).map_err(err)?;
        }
        Ok(())
    };
    let ack_name = format!("tokenizer-{t}");
    let done = (|| {
        if let (Some(dir), Some(id)) = (&opts.checkpoint_dir, opts.restore) {
            let mut state = checkpoint::load(dir, id, &ack_name)?;
            let mut lines = 0;
            while !state.at_end() {
                tokenize(&mut part, state.bytes()?)?;
                lines += 1;
            }
            println!("tokenizer {t}: restored checkpoint {id}: {lines} in-flight lines again");
        }
        // The checkpoint released unaligned whose in-flight lines are still coming, and them.
        let mut pending: Option<(u64, checkpoint::Enc)> = None;
        while let Some(m) = gate.recv().map_err(err)? {
            match m {
                GateMessage::Record { record, .. } => {
                    tokenize(&mut part, record.as_bytes().ok_or("a line spans segments")?)?;
                }
                // An in-flight line (overtaken by an unaligned barrier) is processed as any,
                // and kept with its checkpoint.
                GateMessage::InFlight {
                    checkpoint: of,
                    record,
                    ..
                } => {
                    let text = record.as_bytes().ok_or("a line spans segments")?;
                    if let Some((id, lines)) = &mut pending {
                        if *id == of {
                            lines.bytes(text);
                        }
                    }
                    tokenize(&mut part, text)?;
                }
                GateMessage::Barrier {
                    id,
                    released,
                    emitted_ns,
                    payload,
                    ..
                } => {
                    // Released: pass it on, with the source's send time.
                    let alignment = opts.barriers.unwrap_or(Alignment::Aligned);
                    part.forward_barrier(id, alignment, emitted_ns, payload)
                        .map_err(err)?;
                    if let Some(dir) = &opts.checkpoint_dir {
                        match released {
                            Released::Aligned => {
                                checkpoint::ack(dir, id, &ack_name, &checkpoint::Enc::new())?
                            }
                            _ => pending = Some((id, checkpoint::Enc::new())),
                        }
                    }
                }
                GateMessage::InFlightEnd { id } => {
                    if let (Some(dir), Some((p, lines))) = (&opts.checkpoint_dir, &pending) {
                        if *p == id {
                            checkpoint::ack(dir, id, &ack_name, lines)?;
                            pending = None;
                        }
                    }
                }
                // Abandoned for a newer one: never acknowledged.
                GateMessage::BarrierCancelled { id }
                    if pending.as_ref().is_some_and(|(p, _)| *p == id) =>
                {
                    pending = None;
                }
                GateMessage::ChannelDead { channel, error } => {
                    return Err(format!("source {channel} died: {error}"))
                }
                GateMessage::ChannelFailed { channel, error } => {
                    return Err(format!("source {channel} failed: {error}"))
                }
                // The end of a partition, events, and kinds of message a later version may add.
                _ => {}
            }
        }
        Ok(())
    })();
    if done.is_err() {
        part.fail();
    }
    done
}

/// A counter counts the words of its share of the hash range and sends every count to the
/// sink at the end of its input.
///
/// Its checkpoint duty: at a barrier's release it takes its whole count map. Released aligned,
/// it acknowledges the checkpoint with it at once; released unaligned, it counts the in-flight
/// words the gate hands back as any and keeps them too, and acknowledges the checkpoint with
/// the map and them at `InFlightEnd` (a checkpoint cancelled before is not acknowledged).
/// Restored, it loads the map and counts the in-flight words before it reads its gate. It
/// passes each released barrier on to the sink (its counts go there only at the end, after
/// every barrier).
fn counter(opts: &Opts, k: usize) -> Result<(), String> {
    let mut gate = create_gate(opts, &gate_name(opts, "cnt", k), TOKENIZERS)?;
    // The output is attached from the start, so that a failure here reaches the sink.
    let mut out = open_channel(&gate_name(opts, "sink", 0), k)?;
    let done = count(opts, k, &mut gate, &mut out);
    if done.is_err() {
        out.fail();
    }
    done
}

fn count(opts: &Opts, k: usize, gate: &mut Gate, out: &mut Producer) -> Result<(), String> {
    let slow = (opts.slow_counter == Some(k)).then(|| Duration::from_nanos(opts.slow_ns));
    let ack_name = format!("counter-{k}");
    let mut counts: HashMap<Vec<u8>, u64> = HashMap::new();
    if let (Some(dir), Some(id)) = (&opts.checkpoint_dir, opts.restore) {
        let mut state = checkpoint::load(dir, id, &ack_name)?;
        for _ in 0..state.u64()? {
            let w = state.bytes()?.to_vec();
            counts.insert(w, state.u64()?);
        }
        // Then the in-flight words, to the end.
        let mut in_flight = 0;
        while !state.at_end() {
            *counts.entry(state.bytes()?.to_vec()).or_insert(0) += 1;
            in_flight += 1;
        }
        println!(
            "counter {k}: restored checkpoint {id}: {} words counted, {in_flight} of them in flight",
            counts.values().sum::<u64>()
        );
    }
    // The checkpoint released unaligned whose in-flight words are still coming: the count map
    // as released, and those words after it.
    let mut pending: Option<(u64, checkpoint::Enc)> = None;
    let mut words = 0u64;
    let mut delays = Vec::new();
    let mut last_id = None;
    while let Some(m) = gate.recv().map_err(err)? {
        match m {
            GateMessage::Barrier {
                id,
                released,
                alignment_ns,
                emitted_ns,
                payload,
                ..
            } => {
                // Each checkpoint is released once, in order; an aligned one only aligned.
                if last_id.is_some_and(|l| id <= l) {
                    return Err(format!("checkpoint {id} released after {last_id:?}"));
                }
                last_id = Some(id);
                if opts.barriers == Some(Alignment::Aligned) && released != Released::Aligned {
                    return Err(format!("aligned checkpoint {id} released as {released:?}"));
                }
                // From the source's send to this counter's release: every queue and alignment
                // on the way (the sources' and this process's clocks are the same clock).
                let delay = shmflow::metrics::monotonic_now_ns().saturating_sub(emitted_ns);
                delays.push(delay);
                println!(
                    "counter {k}: checkpoint {id:>3} {:<9} delay {:>7.1} ms   alignment {:>7.1} ms",
                    match released {
                        Released::Aligned => "aligned",
                        Released::Unaligned { timed_out: true } => "timed out",
                        _ => "unaligned",
                    },
                    delay as f64 / 1e6,
                    alignment_ns as f64 / 1e6,
                );
                if let Some(dir) = &opts.checkpoint_dir {
                    let mut state = checkpoint::Enc::new();
                    state.u64(counts.len() as u64);
                    for (w, n) in &counts {
                        state.bytes(w);
                        state.u64(*n);
                    }
                    match released {
                        Released::Aligned => checkpoint::ack(dir, id, &ack_name, &state)?,
                        _ => pending = Some((id, state)),
                    }
                    let alignment = opts.barriers.unwrap_or(Alignment::Aligned);
                    out.forward_barrier(id, alignment, emitted_ns, payload)
                        .map_err(err)?;
                }
            }
            GateMessage::Record { record, .. } => {
                let w = record.as_bytes().ok_or("a word spans segments")?;
                tally(&mut counts, &mut words, w, slow, out)?;
            }
            // An in-flight word (overtaken by an unaligned barrier) is counted as any, and
            // kept with its checkpoint.
            GateMessage::InFlight {
                checkpoint: of,
                record,
                ..
            } => {
                let w = record.as_bytes().ok_or("a word spans segments")?;
                if let Some((id, state)) = &mut pending {
                    if *id == of {
                        state.bytes(w);
                    }
                }
                tally(&mut counts, &mut words, w, slow, out)?;
            }
            GateMessage::InFlightEnd { id } => {
                if let (Some(dir), Some((p, state))) = (&opts.checkpoint_dir, &pending) {
                    if *p == id {
                        checkpoint::ack(dir, id, &ack_name, state)?;
                        pending = None;
                    }
                }
            }
            // Abandoned for a newer one: never acknowledged.
            GateMessage::BarrierCancelled { id }
                if pending.as_ref().is_some_and(|(p, _)| *p == id) =>
            {
                pending = None;
            }
            GateMessage::ChannelDead { channel, error } => {
                return Err(format!("tokenizer {channel} died: {error}"))
            }
            GateMessage::ChannelFailed { channel, error } => {
                return Err(format!("tokenizer {channel} failed: {error}"))
            }
            // The end of a partition, events, and kinds of message a later version may add.
            _ => {}
        }
    }
    if !delays.is_empty() {
        delays.sort_unstable();
        let q = |p: f64| delays[((delays.len() - 1) as f64 * p).round() as usize] as f64 / 1e6;
        println!(
            "counter {k}: {} checkpoints, barrier delay p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
            delays.len(),
            q(0.5),
            q(0.99),
            q(1.0)
        );
    }
    let mut rec = Vec::new();
    for (w, n) in counts {
        rec.clear();
        rec.extend_from_slice(&n.to_le_bytes());
        rec.extend_from_slice(&w);
        out.send(&rec).map_err(err)?;
    }
    Ok(())
}

/// Counts word `w`, the `words`th one read (the slowed counter does its busy work here).
fn tally(
    counts: &mut HashMap<Vec<u8>, u64>,
    words: &mut u64,
    w: &[u8],
    slow: Option<Duration>,
    out: &mut Producer,
) -> Result<(), String> {
    *words += 1;
    if *words % 16384 == 0 {
        // Nothing is sent before the end; a flush now and then tells a counter early that the
        // sink is gone, so that the pipeline stops early too.
        out.flush().map_err(err)?;
    }
    match counts.get_mut(w) {
        Some(n) => *n += 1,
        None => {
            counts.insert(w.to_vec(), 1);
        }
    }
    if let Some(d) = slow {
        // Busy work, like a costly aggregation (sleeping is far too coarse).
        let t = Instant::now();
        while t.elapsed() < d {
            std::hint::spin_loop();
        }
    }
    Ok(())
}

/// The sink checks the counts against a count of the same corpus made in one process.
///
/// Its checkpoint duty: at a barrier's release it acknowledges the checkpoint with the results
/// it holds. It holds none then: a counter sends its results only after its last barrier, so
/// a result before a barrier (or handed back as in-flight data) fails the run; the state it
/// acknowledges and restores is that empty set, checked.
fn sink(opts: &Opts) -> Result<(), String> {
    let mut gate = Gate::create(&gate_name(opts, "sink", 0), geometry(COUNTERS)).map_err(err)?;
    let mut got: HashMap<String, u64> = HashMap::new();
    let mut per_counter = [0u64; COUNTERS];
    if let (Some(dir), Some(id)) = (&opts.checkpoint_dir, opts.restore) {
        let mut state = checkpoint::load(dir, id, "sink-0")?;
        if state.u64()? != 0 {
            return Err(format!("checkpoint {id} of the sink holds results"));
        }
        state.end()?;
    }
    while let Some(m) = gate.recv().map_err(err)? {
        match m {
            GateMessage::Barrier { id, .. } => {
                if let Some(dir) = &opts.checkpoint_dir {
                    if !got.is_empty() {
                        return Err(format!("results arrived before checkpoint {id}"));
                    }
                    let mut state = checkpoint::Enc::new();
                    state.u64(0);
                    checkpoint::ack(dir, id, "sink-0", &state)?;
                }
            }
            GateMessage::InFlight { checkpoint, .. } => {
                return Err(format!(
                    "a result handed back as in-flight data of checkpoint {checkpoint}"
                ))
            }
            GateMessage::Record { channel, record } => {
                let b = record.as_bytes().ok_or("a result spans segments")?;
                let n = u64::from_le_bytes(b[..8].try_into().map_err(|_| "short result")?);
                let w = String::from_utf8_lossy(&b[8..]).into_owned();
                per_counter[channel as usize] += n;
                if got.insert(w.clone(), n).is_some() {
                    return Err(format!("word {w:?} counted by two counters"));
                }
            }
            GateMessage::ChannelDead { channel, error } => {
                return Err(format!("counter {channel} died: {error}"))
            }
            GateMessage::ChannelFailed { channel, error } => {
                return Err(format!("counter {channel} failed: {error}"))
            }
            // The end of a partition, events, and kinds of message a later version may add.
            _ => {}
        }
    }
    let want = expected(opts);
    let total: u64 = want.values().sum();
    let mut wrong = 0;
    for (w, n) in &want {
        if got.get(w) != Some(n) {
            if wrong < 5 {
                eprintln!("mismatch: {w:?} expected {n}, got {:?}", got.get(w));
            }
            wrong += 1;
        }
    }
    wrong += got.keys().filter(|w| !want.contains_key(*w)).count();
    if wrong > 0 {
        return Err(format!(
            "{wrong} word counts differ from the single-process count"
        ));
    }
    println!(
        "sink: OK, {} distinct words, {total} words, per counter {per_counter:?} (matches the single-process count)",
        want.len()
    );
    Ok(())
}

// ----- checkpoints -----------------------------------------------------------------------------

/// What `--checkpoint-dir DIR` keeps in `DIR`:
///
/// ```text
/// input-0.txt, input-1.txt     each source's corpus, one line per line, written once
/// chk-ID/source-S              checkpoint ID: source S's offset in its input file
/// chk-ID/tokenizer-T           tokenizer T's in-flight lines (none if released aligned)
/// chk-ID/counter-K             counter K's count map at the release, then its in-flight words
/// chk-ID/sink-0                the sink's results at the release (none, checked)
/// completed                    the id of the newest complete checkpoint, as text
/// ```
///
/// Each file is written atomically: into a temporary file in the same directory (`.NAME.tmp`),
/// synced, renamed to its name, and the directory synced, so that a name present always holds
/// the whole file. Its contents: 8 bytes of magic, then little-endian `u64`s and byte strings
/// (a `u32` length, then the bytes); the in-flight records are byte strings up to the end.
mod checkpoint {
    use super::*;
    use std::fs;
    use std::io::Write;

    const MAGIC: &[u8; 8] = b"wcchk-1\n";

    /// The stages that acknowledge a checkpoint: it is complete once every one has.
    pub(super) fn stages() -> impl Iterator<Item = String> {
        (0..SOURCES)
            .map(|s| format!("source-{s}"))
            .chain((0..TOKENIZERS).map(|t| format!("tokenizer-{t}")))
            .chain((0..COUNTERS).map(|k| format!("counter-{k}")))
            .chain(std::iter::once("sink-0".to_owned()))
    }

    pub(super) fn input(dir: &Path, s: usize) -> PathBuf {
        dir.join(format!("input-{s}.txt"))
    }

    fn chk(dir: &Path, id: u64) -> PathBuf {
        dir.join(format!("chk-{id}"))
    }

    fn io(path: &Path) -> impl Fn(std::io::Error) -> String + '_ {
        move |e| format!("{}: {e}", path.display())
    }

    /// Writes `bytes` as `dir/name`: a temporary file, synced, renamed, and the directory
    /// synced.
    fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), String> {
        let tmp = dir.join(format!(".{name}.tmp"));
        let mut f = File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(bytes).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        drop(f);
        fs::rename(&tmp, dir.join(name)).map_err(io(&tmp))?;
        sync_dir(dir)
    }

    fn sync_dir(dir: &Path) -> Result<(), String> {
        File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
    }

    /// Stage `stage` acknowledges checkpoint `id` with its state.
    pub(super) fn ack(dir: &Path, id: u64, stage: &str, state: &Enc) -> Result<(), String> {
        let d = chk(dir, id);
        match fs::create_dir(&d) {
            Ok(()) => sync_dir(dir)?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(&d)(e)),
        }
        write_atomic(&d, stage, &state.0)
    }

    /// Stage `stage`'s state in checkpoint `id`.
    pub(super) fn load(dir: &Path, id: u64, stage: &str) -> Result<Dec, String> {
        let path = chk(dir, id).join(stage);
        let buf = fs::read(&path).map_err(io(&path))?;
        if !buf.starts_with(MAGIC) {
            return Err(format!("{}: not a checkpoint file", path.display()));
        }
        Ok(Dec {
            buf,
            at: MAGIC.len(),
            path,
        })
    }

    /// A checkpoint file's contents, as written.
    pub(super) struct Enc(Vec<u8>);

    impl Enc {
        pub(super) fn new() -> Enc {
            Enc(MAGIC.to_vec())
        }

        pub(super) fn u64(&mut self, v: u64) {
            self.0.extend_from_slice(&v.to_le_bytes());
        }

        pub(super) fn bytes(&mut self, b: &[u8]) {
            self.0.extend_from_slice(&(b.len() as u32).to_le_bytes());
            self.0.extend_from_slice(b);
        }
    }

    /// A checkpoint file's contents, as read.
    pub(super) struct Dec {
        buf: Vec<u8>,
        at: usize,
        path: PathBuf,
    }

    impl Dec {
        fn take(&mut self, n: usize) -> Result<&[u8], String> {
            let b = self
                .buf
                .get(self.at..self.at + n)
                .ok_or_else(|| format!("{}: cut short", self.path.display()))?;
            self.at += n;
            Ok(b)
        }

        pub(super) fn u64(&mut self) -> Result<u64, String> {
            Ok(u64::from_le_bytes(
                self.take(8)?.try_into().expect("8 bytes"),
            ))
        }

        pub(super) fn bytes(&mut self) -> Result<&[u8], String> {
            let n = u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes"));
            self.take(n as usize)
        }

        pub(super) fn at_end(&self) -> bool {
            self.at == self.buf.len()
        }

        /// Nothing may follow.
        pub(super) fn end(&self) -> Result<(), String> {
            match self.at_end() {
                true => Ok(()),
                false => Err(format!("{}: bytes after the end", self.path.display())),
            }
        }
    }

    /// Empties `dir` of what an earlier run left there, and writes the sources' inputs.
    pub(super) fn prepare(dir: &Path, opts: &Opts) -> Result<(), String> {
        fs::create_dir_all(dir).map_err(io(dir))?;
        discard_after(dir, None)?;
        for name in ["completed", ".completed.tmp"] {
            let path = dir.join(name);
            match fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&path)(e)),
                _ => {}
            }
        }
        let mut text = String::new();
        let mut l = String::new();
        for s in 0..SOURCES {
            text.clear();
            for i in 0..opts.lines {
                line(s, i, opts.skew, &mut l);
                text.push_str(&l);
                text.push('\n');
            }
            write_atomic(dir, &format!("input-{s}.txt"), text.as_bytes())?;
        }
        Ok(())
    }

    /// The checkpoint directories in `dir`, by id.
    fn list(dir: &Path) -> Result<Vec<u64>, String> {
        let mut ids: Vec<u64> = fs::read_dir(dir)
            .map_err(io(dir))?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_prefix("chk-")?.parse().ok())
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    fn remove(dir: &Path, id: u64) -> Result<(), String> {
        let d = chk(dir, id);
        match fs::remove_dir_all(&d) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&d)(e)),
            _ => Ok(()),
        }
    }

    /// Removes the checkpoints after `id` (all without one): what a failed attempt
    /// acknowledged of checkpoints that never completed, so that no acknowledgement of theirs
    /// counts towards the next attempt's checkpoints of the same ids.
    pub(super) fn discard_after(dir: &Path, id: Option<u64>) -> Result<(), String> {
        for c in list(dir)? {
            if id.is_none_or(|id| c > id) {
                remove(dir, c)?;
            }
        }
        Ok(())
    }

    /// The newest complete checkpoint, if any.
    pub(super) fn completed(dir: &Path) -> Result<Option<u64>, String> {
        let path = dir.join("completed");
        match fs::read_to_string(&path) {
            Ok(text) => text
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| format!("{}: not a checkpoint id", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path)(e)),
        }
    }

    /// The checkpoint coordinator (Flink's `CheckpointCoordinator`, reduced to its ledger): a
    /// checkpoint is complete once every stage acknowledged it.
    pub(super) struct Coordinator<'a> {
        dir: &'a Path,
        completed: Option<u64>,
    }

    impl<'a> Coordinator<'a> {
        pub(super) fn new(dir: &'a Path, completed: Option<u64>) -> Coordinator<'a> {
            Coordinator { dir, completed }
        }

        /// Looks for checkpoints complete since the last look: records the newest in
        /// `completed`, removes the older ones, and returns them with the sources' offsets.
        pub(super) fn poll(&mut self) -> Result<Vec<(u64, Vec<u64>)>, String> {
            let mut done = Vec::new();
            for id in list(self.dir)? {
                if self.completed.is_some_and(|c| id <= c) {
                    continue;
                }
                if stages().all(|s| chk(self.dir, id).join(s).exists()) {
                    let offsets = (0..SOURCES)
                        .map(|s| load(self.dir, id, &format!("source-{s}"))?.u64())
                        .collect::<Result<_, _>>()?;
                    done.push((id, offsets));
                }
            }
            if let Some(&(newest, _)) = done.last() {
                write_atomic(self.dir, "completed", format!("{newest}\n").as_bytes())?;
                self.completed = Some(newest);
                // No stage writes into an older one any more: each acknowledged this one
                // after whatever it did of the older ones.
                for id in list(self.dir)?.into_iter().filter(|&id| id < newest) {
                    remove(self.dir, id)?;
                }
            }
            Ok(done)
        }
    }
}

// ----- the orchestrator ------------------------------------------------------------------------

/// Waits for every child to exit, at most `bound` in all; kills the ones still running then and
/// returns their positions.
fn wait_all(kids: &mut [Child], bound: Duration) -> Vec<usize> {
    let start = Instant::now();
    loop {
        let running: Vec<usize> = kids
            .iter_mut()
            .enumerate()
            .filter_map(|(i, k)| matches!(k.try_wait(), Ok(None)).then_some(i))
            .collect();
        if running.is_empty() {
            return running;
        }
        if start.elapsed() > bound {
            for &i in &running {
                let _ = kids[i].kill();
                let _ = kids[i].wait();
            }
            return running;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The names in `/dev/shm` that belong to this run.
fn run_names(opts: &Opts) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .map(|n| format!("/{n}"))
                .filter(|n| n.starts_with(&opts.prefix))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// `--kill-stage`: SIGKILLs one stage mid-run, then checks that the failure travelled and that
/// nothing of the run is left but the killed stage's own gate, which `shmflow clean` removes.
fn kill_and_check(opts: &Opts, args: &[String]) -> Result<(), String> {
    let (role, index) = opts.kill_stage.clone().expect("--kill-stage");
    let own_gate = match role.as_str() {
        "tokenizer" => Some(gate_name(opts, "tok", index)),
        "counter" => Some(gate_name(opts, "cnt", index)),
        "sink" => Some(gate_name(opts, "sink", 0)),
        "source" => None,
        other => return Err(format!("--kill-stage: unknown role {other}")),
    };
    let mut stages = vec![("sink".to_owned(), 0)];
    stages.extend((0..COUNTERS).map(|k| ("counter".to_owned(), k)));
    stages.extend((0..TOKENIZERS).map(|t| ("tokenizer".to_owned(), t)));
    stages.extend((0..SOURCES).map(|s| ("source".to_owned(), s)));
    let victim = stages
        .iter()
        .position(|(r, i)| *r == role && *i == index)
        .ok_or_else(|| format!("--kill-stage: no stage {role}:{index}"))?;
    let mut kids: Vec<Child> = stages
        .iter()
        .map(|(r, i)| spawn(opts, args, r, *i))
        .collect();
    // Let records flow first: every gate exists and every stage is busy.
    let start = Instant::now();
    while stages.iter().filter(|(r, _)| r != "source").any(|(r, i)| {
        let g = match r.as_str() {
            "tokenizer" => gate_name(opts, "tok", *i),
            "counter" => gate_name(opts, "cnt", *i),
            _ => gate_name(opts, "sink", 0),
        };
        GateMonitor::open(&g).is_err()
    }) {
        if start.elapsed() > Duration::from_secs(20) {
            return Err("the gates did not all appear".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    let _ = kids[victim].kill();
    let _ = kids[victim].wait();
    let killed_at = Instant::now();
    let stuck = wait_all(&mut kids, Duration::from_secs(20));
    if !stuck.is_empty() {
        return Err(format!(
            "stages {stuck:?} did not stop by themselves after the kill"
        ));
    }
    let mut problems = Vec::new();
    for (i, k) in kids.iter_mut().enumerate() {
        if i == victim {
            continue;
        }
        let status = k.wait().map_err(|e| e.to_string())?;
        if status.success() {
            problems.push(format!("{}:{} exited 0", stages[i].0, stages[i].1));
        }
    }
    let left = run_names(opts);
    let expected: Vec<String> = own_gate.iter().cloned().collect();
    if left != expected {
        problems.push(format!(
            "/dev/shm holds {left:?}, expected only {expected:?}"
        ));
    }
    for name in &left {
        match shmflow::monitor::remove_if_stale(name) {
            Ok(true) => {}
            other => problems.push(format!("clean did not remove {name}: {other:?}")),
        }
    }
    if !run_names(opts).is_empty() {
        problems.push("names of the run are still in /dev/shm after clean".into());
    }
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    println!(
        "wordcount: killed {role}:{index}; every other stage exited non-zero within {:.1} s, \
         /dev/shm held only {expected:?}, and clean removed it",
        killed_at.elapsed().as_secs_f64()
    );
    Ok(())
}

/// How long after an attempt's first complete checkpoint its crash may come, at most.
const CRASH_WINDOW: Duration = Duration::from_millis(4000);

/// A crash drawn from the seed: the stage killed, and how long after the attempt's first
/// complete checkpoint (so that there is usually a checkpoint to restore, and work left).
struct Crash {
    role: &'static str,
    index: usize,
    after: Duration,
}

impl Crash {
    fn draw(seed: u64, attempt: u32) -> Crash {
        let r = mix(seed ^ mix(u64::from(attempt)));
        // Each kind of stage as likely as another, however many of it there are.
        let (role, n) = [
            ("source", SOURCES),
            ("tokenizer", TOKENIZERS),
            ("counter", COUNTERS),
            ("sink", 1),
        ][(r % 4) as usize];
        Crash {
            role,
            index: ((r >> 8) % n as u64) as usize,
            after: Duration::from_millis((r >> 16) % CRASH_WINDOW.as_millis() as u64),
        }
    }
}

/// How an attempt of the exactly-once run ended.
enum Attempt {
    /// Every stage exited 0 (the sink's counts matched).
    Done,
    /// The crash came.
    Crashed,
    /// A stage exited non-zero by itself (this one).
    Failed(usize),
}

/// `--checkpoint-dir`: the pipeline survives a crash with its counts exact. The orchestrator
/// writes the sources' inputs, coordinates the checkpoints (`checkpoint::Coordinator`), kills
/// the stage drawn from the seed at the moment drawn from it, and then fails over as Flink's
/// full restart does: it kills every other stage of the attempt, waits for them, removes the
/// run's names from `/dev/shm`, discards what the attempt acknowledged of checkpoints that did
/// not complete, and starts the whole pipeline again from the last complete checkpoint (from
/// the start if none). `--crashes N` attempts crash in a row; the one after them runs to the
/// end, and the sink's check decides.
fn exactly_once(opts: &Opts, args: &[String]) -> Result<(), String> {
    let dir = opts.checkpoint_dir.as_deref().expect("--checkpoint-dir");
    let seed = match opts.crash_seed {
        CrashSeed::Random => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            Some(mix(now.as_nanos() as u64 ^ u64::from(std::process::id())))
        }
        CrashSeed::Seed(s) => Some(s),
        CrashSeed::None => None,
    };
    println!(
        "wordcount: exactly-once, {SOURCES} sources × {} lines read from {}, checkpoint every {} ms ({}){}, crash seed {}",
        opts.lines,
        dir.display(),
        opts.barrier_interval.as_millis(),
        match opts.barriers {
            Some(Alignment::Aligned) => "aligned".to_owned(),
            Some(Alignment::AlignedWithTimeout(t)) => format!("aligned, unaligned after {t:?}"),
            _ => "unaligned".to_owned(),
        },
        opts.slow_counter
            .map_or(String::new(), |k| format!(", counter {k} slowed by {} ns/word", opts.slow_ns)),
        seed.map_or("none (no crash)".to_owned(), |s| format!("{s} (replay with --crash-seed {s})")),
    );
    let seed_text = seed.map_or("none".to_owned(), |s| s.to_string());
    checkpoint::prepare(dir, opts)?;
    let start = Instant::now();
    // What each attempt did, for the last line.
    let mut story: Vec<String> = Vec::new();
    let stages: Vec<(&str, usize)> = std::iter::once(("sink", 0))
        .chain((0..COUNTERS).map(|k| ("counter", k)))
        .chain((0..TOKENIZERS).map(|t| ("tokenizer", t)))
        .chain((0..SOURCES).map(|s| ("source", s)))
        .collect();
    for attempt in 1..=opts.crashes + 1 {
        let restore = checkpoint::completed(dir)?;
        checkpoint::discard_after(dir, restore)?;
        let from = restore.map_or("from the start".to_owned(), |id| {
            format!("restoring checkpoint {id}")
        });
        println!("attempt {attempt}: {from}");
        let crash = seed
            .filter(|_| attempt <= opts.crashes)
            .map(|s| Crash::draw(s, attempt));
        let run = Opts {
            restore,
            ..opts.clone()
        };
        // Consumers first (they create their gates), then producers (which wait for them).
        let mut kids: Vec<Child> = stages
            .iter()
            .map(|(r, i)| spawn(&run, args, r, *i))
            .collect();
        let began = Instant::now();
        let mut coordinator = checkpoint::Coordinator::new(dir, restore);
        let mut first_complete: Option<Instant> = None;
        let mut pending = crash.as_ref();
        let mut what = format!("attempt {attempt} ({from})");
        let outcome = loop {
            std::thread::sleep(Duration::from_millis(10));
            for (id, offsets) in coordinator.poll()? {
                println!("checkpoint {id} complete: sources at bytes {offsets:?}");
                first_complete.get_or_insert_with(Instant::now);
            }
            if let (Some(c), Some(t)) = (pending, first_complete) {
                if t.elapsed() >= c.after {
                    pending = None;
                    let v = stages
                        .iter()
                        .position(|&(r, i)| r == c.role && i == c.index)
                        .expect("a stage");
                    let killed = matches!(kids[v].try_wait(), Ok(None)) && {
                        let _ = kids[v].kill();
                        // SIGKILL, unless it exited just before.
                        use std::os::unix::process::ExitStatusExt;
                        kids[v].wait().is_ok_and(|st| st.signal() == Some(9))
                    };
                    let moment = format!(
                        "{}:{} at {:.2} s ({} ms after the attempt's first complete checkpoint)",
                        c.role,
                        c.index,
                        began.elapsed().as_secs_f64(),
                        c.after.as_millis()
                    );
                    if killed {
                        println!(
                            "crash: killed {moment}; last complete checkpoint: {}",
                            checkpoint::completed(dir)?
                                .map_or("none".to_owned(), |c| c.to_string())
                        );
                        what += &format!(": killed {moment}");
                        break Attempt::Crashed;
                    }
                    println!(
                        "crash: {}:{} had ended before the moment drawn",
                        c.role, c.index
                    );
                    what += &format!(": {moment} had ended before it could be killed");
                }
            }
            let mut running = false;
            let mut failed = None;
            for (i, k) in kids.iter_mut().enumerate() {
                match k.try_wait().map_err(err)? {
                    None => running = true,
                    Some(st) if !st.success() => failed = Some(i),
                    Some(_) => {}
                }
            }
            if let Some(i) = failed {
                break Attempt::Failed(i);
            }
            if !running {
                break Attempt::Done;
            }
        };
        match outcome {
            Attempt::Crashed => {
                story.push(what);
                failover(&mut kids, opts).map_err(|e| {
                    format!(
                        "exactly-once FAILED, seed {seed_text}: {}; {e}",
                        story.join("; ")
                    )
                })?;
            }
            Attempt::Done => {
                if let Some(c) = pending {
                    what += &format!(
                        ": ended before the crash moment ({}:{}, {} ms after the first complete checkpoint{})",
                        c.role,
                        c.index,
                        c.after.as_millis(),
                        if first_complete.is_none() { ", and none completed" } else { "" }
                    );
                }
                story.push(what + ": ran to the end");
                println!(
                    "wordcount: exactly-once OK in {:.1} s, seed {}: {}; the sink's counts match the single-process count",
                    start.elapsed().as_secs_f64(),
                    seed_text,
                    story.join("; ")
                );
                return Ok(());
            }
            Attempt::Failed(i) => {
                // The failure travels through the pipeline: every stage stops by itself.
                let stuck = wait_all(&mut kids, Duration::from_secs(20));
                story.push(format!(
                    "{what}: {}:{} failed{}",
                    stages[i].0,
                    stages[i].1,
                    if stuck.is_empty() {
                        ""
                    } else {
                        " and some stages had to be killed"
                    }
                ));
                return Err(format!(
                    "exactly-once FAILED, seed {seed_text}: {}",
                    story.join("; ")
                ));
            }
        }
    }
    unreachable!("the last attempt has no crash")
}

/// Global failover: kills every stage of the attempt still running, waits for them, and
/// removes their gates, which nobody else removes, from `/dev/shm`.
fn failover(kids: &mut [Child], opts: &Opts) -> Result<(), String> {
    for k in kids.iter_mut() {
        if matches!(k.try_wait(), Ok(None)) {
            let _ = k.kill();
        }
    }
    let stuck = wait_all(kids, Duration::from_secs(20));
    if !stuck.is_empty() {
        return Err(format!("stages {stuck:?} did not stop after SIGKILL"));
    }
    for name in run_names(opts) {
        match shmflow::monitor::remove_if_stale(&name) {
            Ok(true) => {}
            other => return Err(format!("failover could not remove {name}: {other:?}")),
        }
    }
    Ok(())
}

fn spawn(opts: &Opts, args: &[String], role: &str, index: usize) -> Child {
    let mut cmd = Command::new(std::env::current_exe().expect("own path"));
    cmd.args(args)
        .args(["--role", role, "--index", &index.to_string()])
        .args(["--prefix", &opts.prefix]);
    if let Some(port) = opts.remote {
        cmd.args(["--port", &port.to_string()]);
    }
    if let Some(id) = opts.restore {
        cmd.args(["--restore", &id.to_string()]);
    }
    cmd.spawn().expect("spawning a stage")
}

/// One line per gate: what flowed through it and how its producers fared.
fn report(stage: &str, prev: &GateSnapshot, now: &GateSnapshot) {
    let mut written = 0.0;
    let mut read = 0.0;
    let mut bp = 0.0f64;
    let mut level = BackpressureLevel::Ok;
    for (p, n) in prev.channels.iter().zip(&now.channels) {
        let r = n.snapshot.rates_since(&p.snapshot);
        written += r.records_written_per_s;
        read += r.records_read_per_s;
        bp = bp.max(r.back_pressured_time_ms_per_second);
        if r.level as u8 > level as u8 {
            level = r.level;
        }
    }
    println!(
        "  {stage:<6} in {:>10.0} rec/s  read {:>10.0} rec/s  upstream backpressure {:<4} ({:>5.0} ms/s)  exclusive {:.2} floating {:.2}{}",
        written,
        read,
        level.as_str(),
        bp,
        now.input_exclusive_buffers_usage(),
        now.input_floating_buffers_usage(),
        if now.likely_skew() { "  SKEW" } else { "" },
    );
}

fn orchestrate(opts: &Opts, args: &[String]) -> Result<(), String> {
    if opts.remote.is_some() && cfg!(not(feature = "net")) {
        return Err(
            "--remote needs the net feature (cargo run --features net --example wordcount)".into(),
        );
    }
    println!(
        "wordcount: {SOURCES} sources × {} lines → {TOKENIZERS} tokenizers {}→ {COUNTERS} counters → sink{}{}",
        opts.lines,
        opts.remote.map_or(String::new(), |p| format!("─TCP 127.0.0.1:{p}─")),
        opts.slow_counter
            .map_or(String::new(), |k| format!(", counter {k} slowed by {} ns/word", opts.slow_ns)),
        if opts.skew { ", skewed words" } else { "" }
    );
    let start = Instant::now();
    // Consumers first (they create their gates), then producers (which wait for them).
    let mut kids = vec![spawn(opts, args, "sink", 0)];
    kids.extend((0..COUNTERS).map(|k| spawn(opts, args, "counter", k)));
    kids.extend((0..TOKENIZERS).map(|t| spawn(opts, args, "tokenizer", t)));
    kids.extend((0..SOURCES).map(|s| spawn(opts, args, "source", s)));
    if opts.remote.is_some() {
        kids.push(spawn(opts, args, "bridge-out", 0));
        kids.push(spawn(opts, args, "bridge-in", 0));
    }
    let stages: Vec<(String, String)> = (0..TOKENIZERS)
        .map(|t| (format!("tok{t}"), gate_name(opts, "tok", t)))
        .chain((0..COUNTERS).map(|k| (format!("cnt{k}"), gate_name(opts, "cnt", k))))
        .collect();
    let mut monitors: Vec<Option<(GateMonitor, GateSnapshot)>> =
        stages.iter().map(|_| None).collect();
    let mut failed = false;
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let mut lines = Vec::new();
        for (i, (stage, name)) in stages.iter().enumerate() {
            if monitors[i].is_none() {
                if let Ok(m) = GateMonitor::open(name) {
                    let s = m.snapshot();
                    monitors[i] = Some((m, s));
                }
                continue;
            }
            let (m, prev) = monitors[i].as_mut().expect("opened");
            let now = m.snapshot();
            if now.consumer_state == shmflow::metrics::EndState::Detached {
                continue; // that stage is done
            }
            lines.push((stage.clone(), prev.clone(), now.clone()));
            *prev = now;
        }
        if !lines.is_empty() {
            println!("t={:>4.1}s", start.elapsed().as_secs_f64());
            for (stage, prev, now) in &lines {
                report(stage, prev, now);
            }
        }
        let mut running = false;
        for k in kids.iter_mut() {
            match k.try_wait().map_err(|e| e.to_string())? {
                None => running = true,
                Some(st) if !st.success() => failed = true,
                Some(_) => {}
            }
        }
        if !running || failed {
            break;
        }
    }
    if failed {
        // The failure travels through the pipeline: every stage stops by itself and removes
        // what it created. Only one that is still running after a while is killed.
        let stuck = wait_all(&mut kids, Duration::from_secs(20));
        return Err(if stuck.is_empty() {
            "a stage failed (see above); every stage stopped".into()
        } else {
            format!("a stage failed (see above); stages {stuck:?} did not stop by themselves")
        });
    }
    let words: u64 = expected(opts).values().sum();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "wordcount: done in {secs:.1} s, {:.2} M words/s end to end",
        words as f64 / secs / 1e6
    );
    Ok(())
}

/// A loopback port nobody listens on (the outgoing bridge binds it).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("its address").port()
}

/// The tokenizer → counter hop over TCP.
#[cfg(feature = "net")]
mod remote {
    use super::*;
    use shmflow::net::{Client, Config, Ended, Server};
    use shmflow::{Consumer, Geometry};

    /// The channels a tokenizer writes into: the counters' gates' segment size (both ends of
    /// a remote channel need the same).
    pub(super) fn channel_geometry() -> Geometry {
        Geometry {
            segment_size: geometry(1).segment_size,
            segment_count: 4,
        }
    }

    pub(super) fn channel_name(opts: &Opts, t: usize, k: usize) -> String {
        format!("{}-x{t}-{k}", opts.prefix)
    }

    fn addr(opts: &Opts) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], opts.remote.expect("--port")))
    }

    fn runtime() -> Result<tokio::runtime::Runtime, String> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(err)
    }

    fn check(outcomes: &[shmflow::net::ChannelOutcome]) -> Result<(), String> {
        for c in outcomes {
            match &c.result {
                Ok(Ended::Clean) => {}
                Ok(other) => return Err(format!("channel {} ended {other:?}", c.name)),
                Err(e) => return Err(format!("channel {}: {e}", c.name)),
            }
        }
        Ok(())
    }

    /// Serves every tokenizer's outputs.
    pub(super) fn bridge_out(opts: &Opts) -> Result<(), String> {
        runtime()?.block_on(async {
            let mut server = Server::bind(addr(opts), Config::default())
                .await
                .map_err(err)?;
            for t in 0..TOKENIZERS {
                for k in 0..COUNTERS {
                    let mut c = Consumer::builder()
                        .geometry(channel_geometry())
                        .open_or_create(&channel_name(opts, t, k))
                        .map_err(err)?;
                    // The sending side debloats too: what waits for the link is what the
                    // bridge sends in the target time.
                    c.set_debloat_target(opts.debloat);
                    server.export(&format!("x{t}-{k}"), c).map_err(err)?;
                }
            }
            let report = server.run().await;
            check(&report.channels)
        })
    }

    /// Requests them and writes each into its counter's gate.
    pub(super) fn bridge_in(opts: &Opts) -> Result<(), String> {
        runtime()?.block_on(async {
            let start = Instant::now();
            let mut client = loop {
                match Client::connect(addr(opts), Config::default()).await {
                    Ok(c) => break c,
                    Err(_) if start.elapsed() < Duration::from_secs(20) => {
                        tokio::time::sleep(Duration::from_millis(20)).await
                    }
                    Err(e) => return Err(err(e)),
                }
            };
            for t in 0..TOKENIZERS {
                for k in 0..COUNTERS {
                    let p = open_channel(&gate_name(opts, "cnt", k), t)?;
                    client.import(&format!("x{t}-{k}"), p).map_err(err)?;
                }
            }
            check(&client.run().await)
        })
    }
}

#[cfg(not(feature = "net"))]
mod remote {
    use super::*;

    pub(super) fn channel_geometry() -> shmflow::Geometry {
        unreachable!("--remote needs the net feature")
    }

    pub(super) fn channel_name(_: &Opts, _: usize, _: usize) -> String {
        unreachable!("--remote needs the net feature")
    }

    pub(super) fn bridge_out(_: &Opts) -> Result<(), String> {
        Err("--remote needs the net feature (cargo run --features net --example wordcount)".into())
    }

    pub(super) fn bridge_in(opts: &Opts) -> Result<(), String> {
        bridge_out(opts)
    }
}
