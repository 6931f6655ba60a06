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
//! ```
//!
//! When a stage fails, the failure travels: a stage that gives up ends its outputs as failed
//! (`Producer::fail`), a stage downstream of a dead or failed one gives up in turn, and one
//! upstream of it finds its sends refused (`Closed`, `PeerDead`). Every stage then exits
//! non-zero with a message and removes the gate it created. `--kill-stage ROLE:INDEX` (e.g.
//! `tokenizer:1`) shows it: it SIGKILLs that stage mid-run, checks that every other stage
//! exits non-zero by itself, that `/dev/shm` holds nothing of the run but the killed stage's
//! own gate, and that `shmflow clean` (`remove_if_stale`) removes it; it exits 0 if all holds.

#[path = "support/args.rs"]
mod args;

use std::collections::HashMap;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

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
}

const USAGE: &str = "usage: wordcount [--lines N] [--slow-counter K [--slow-ns N]] [--skew] [--remote]
                 [--kill-stage ROLE:INDEX] [--prefix /NAME]

  --lines N              lines per source (default 200000)
  --slow-counter K       counter K does busy work per word: backpressure reaches the sources
  --slow-ns N            the slowed counter's work per word in ns (default 3000)
  --skew                 one hot word takes half the words (its counter's gate borrows floating segments)
  --remote               tokenizers and counters talk over TCP on loopback (needs the net feature)
  --kill-stage ROLE:I    SIGKILL stage ROLE:I (source, tokenizer, counter, sink) mid-run and check
                         that every other stage stops non-zero and only its gate is left
  --prefix /NAME         prefix of the gates' names (default /shmflow-wc-PID)
  --barriers MODE        the sources send checkpoint barriers: aligned, unaligned or timeout:MS
                         (aligned, switching to unaligned after MS ms); counters report their delay
  --barrier-interval-ms N  time between barriers (default 500)";

fn main() {
    let parsed = args::parse(
        USAGE,
        &[
            "--lines",
            "--slow-counter",
            "--slow-ns",
            "--prefix",
            "--kill-stage",
            "--port",
            "--role",
            "--index",
            "--barriers",
            "--barrier-interval-ms",
        ],
        &["--skew", "--remote"],
        0,
    );
    let args: Vec<String> = std::env::args().skip(1).collect();
    let get = |name: &str| parsed.get(name).map(str::to_owned);
    let opts = Opts {
        lines: parsed.num("--lines", 200_000),
        slow_counter: parsed
            .get("--slow-counter")
            .map(|_| parsed.num("--slow-counter", 0)),
        slow_ns: parsed.num("--slow-ns", 3000),
        skew: parsed.has("--skew"),
        prefix: get("--prefix").unwrap_or_else(|| format!("/shmflow-wc-{}", std::process::id())),
        kill_stage: get("--kill-stage").map(|v| {
            let parsed_stage = v
                .split_once(':')
                .and_then(|(r, i)| Some((r.to_owned(), i.parse().ok()?)));
            parsed_stage.unwrap_or_else(|| parsed.fail("--kill-stage takes ROLE:INDEX"))
        }),
        remote: match parsed.get("--port") {
            Some(_) => Some(parsed.num("--port", 0)),
            None if parsed.has("--remote") => Some(free_port()),
            None => None,
        },
        barriers: get("--barriers").map(|m| match m.as_str() {
            "aligned" => Alignment::Aligned,
            "unaligned" => Alignment::Unaligned,
            t => match t.strip_prefix("timeout:").and_then(|ms| ms.parse().ok()) {
                Some(ms) => Alignment::AlignedWithTimeout(Duration::from_millis(ms)),
                None => parsed.fail("--barriers takes aligned, unaligned or timeout:MS"),
            },
        }),
        barrier_interval: Duration::from_millis(parsed.num("--barrier-interval-ms", 500)),
    };
    let result = match get("--role").as_deref() {
        None if opts.kill_stage.is_some() => kill_and_check(&opts, &args),
        None => orchestrate(&opts, &args),
        Some(role) => {
            let index: usize = parsed.num("--index", 0);
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
        match get("--role") {
            Some(role) => eprintln!(
                "wordcount {role} {}: {e}",
                get("--index").unwrap_or_default()
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

fn source(opts: &Opts, s: usize) -> Result<(), String> {
    let outs = (0..TOKENIZERS)
        .map(|t| open_channel(&gate_name(opts, "tok", t), s))
        .collect::<Result<Vec<_>, _>>()?;
    let mut part = Partition::new(outs, Partitioner::RoundRobin).map_err(err)?;
    let mut l = String::new();
    let (mut next_barrier, mut id) = (Instant::now() + opts.barrier_interval, 0u64);
    let sent = (0..opts.lines).try_for_each(|i| {
        if let Some(alignment) = opts.barriers {
            if i % 64 == 0 && Instant::now() >= next_barrier {
                id += 1;
                part.send_barrier(id, alignment, b"").map_err(err)?;
                next_barrier += opts.barrier_interval;
            }
        }
        line(s, i, opts.skew, &mut l);
        part.send(l.as_bytes()).map_err(err)
    });
    // Dropping the producers ends each channel cleanly: the tokenizers see EndOfPartition.
    // A stage that gives up ends them as failed instead, so that the failure travels on.
    if sent.is_err() {
        part.fail();
    }
    sent
}

fn tokenizer(opts: &Opts, t: usize) -> Result<(), String> {
    let mut gate = Gate::create(&gate_name(opts, "tok", t), geometry(SOURCES)).map_err(err)?;
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
    let done = (|| {
        while let Some(m) = gate.recv().map_err(err)? {
            match m {
                // An in-flight record (overtaken by an unaligned barrier) is processed as any;
                // a stage with state would also store it with the checkpoint.
                GateMessage::Record { record, .. } | GateMessage::InFlight { record, .. } => {
                    let text = record.as_bytes().ok_or("a line spans segments")?;
                    for w in text.split(|&b| b == b' ').filter(|w| !w.is_empty()) {
                        part.send(w).map_err(err)?;
                    }
                }
                GateMessage::Barrier {
                    id,
                    emitted_ns,
                    payload,
                    ..
                } => {
                    // Released: pass it on, with the source's send time.
                    let alignment = opts.barriers.unwrap_or(Alignment::Aligned);
                    part.forward_barrier(id, alignment, emitted_ns, payload)
                        .map_err(err)?;
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

fn counter(opts: &Opts, k: usize) -> Result<(), String> {
    let mut gate = Gate::create(&gate_name(opts, "cnt", k), geometry(TOKENIZERS)).map_err(err)?;
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
    let mut counts: HashMap<Vec<u8>, u64> = HashMap::new();
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
            }
            GateMessage::Record { record, .. } | GateMessage::InFlight { record, .. } => {
                let w = record.as_bytes().ok_or("a word spans segments")?;
                words += 1;
                if words % 16384 == 0 {
                    // Nothing is sent before the end; a flush now and then tells a counter
                    // early that the sink is gone, so that the pipeline stops early too.
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

fn sink(opts: &Opts) -> Result<(), String> {
    let mut gate = Gate::create(&gate_name(opts, "sink", 0), geometry(COUNTERS)).map_err(err)?;
    let mut got: HashMap<String, u64> = HashMap::new();
    let mut per_counter = [0u64; COUNTERS];
    while let Some(m) = gate.recv().map_err(err)? {
        match m {
            GateMessage::Record { channel, record } => {
                let b = record.as_bytes().ok_or("a result spans segments")?;
                let n = u64::from_le_bytes(b[..8].try_into().map_err(|_| "short result")?);
                let w = String::from_utf8_lossy(&b[8..]).into_owned();
                per_counter[channel] += n;
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

fn spawn(opts: &Opts, args: &[String], role: &str, index: usize) -> Child {
    let mut cmd = Command::new(std::env::current_exe().expect("own path"));
    cmd.args(args)
        .args(["--role", role, "--index", &index.to_string()])
        .args(["--prefix", &opts.prefix]);
    if let Some(port) = opts.remote {
        cmd.args(["--port", &port.to_string()]);
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
                    let c = Consumer::builder()
                        .geometry(channel_geometry())
                        .open_or_create(&channel_name(opts, t, k))
                        .map_err(err)?;
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
