//! Word count, exactly once across any crash, on `shmflow-pipeline`:
//!
//! ```text
//! read (2 sources) ──rebalance──▶ split (3) ──by word──▶ count (2) ──rebalance──▶ write (1 sink)
//! ```
//!
//! Each instance is a process. The sources read `WORK/input-S.txt` (written once, from a
//! seed); the counters keep their counts as heap state (a map snapshotted whole at each
//! barrier) or, with `--keyed`, as keyed state on disk (checkpointed incrementally); the
//! sink writes `word count` lines into `WORK/out` with two-phase commit. Kill any instance
//! (`kill -9 PID`, the pids are in `WORK/checkpoints/status`) or the supervisor itself and
//! start it again: `--check` compares the committed output with a count made in one process.
//!
//! ```text
//! cargo run --release -p shmflow-pipeline --example pipeline_wordcount -- --check
//! cargo run --release -p shmflow-pipeline --example pipeline_wordcount -- \
//!     --lines 300000 --slow-ns 2000 --alignment unaligned --check   # then kill something
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use shmflow_pipeline::{
    Alignment, CheckpointConfig, Context, FileSink, FileSource, Operator, Partitioning, Pipeline,
    RestartStrategy, StageError,
};

#[derive(Parser, Debug, Clone)]
#[command(about = "Word count over shmflow-pipeline, exactly once across crashes")]
struct Args {
    /// Working directory: inputs, checkpoints (WORK/checkpoints) and output (WORK/out).
    #[arg(long, default_value = "target/pipeline-wordcount")]
    work: PathBuf,
    /// The pipeline's name (its regions in /dev/shm start with shmflow-pl-NAME-).
    #[arg(long, default_value = "wordcount")]
    name: String,
    /// Lines per source.
    #[arg(long, default_value_t = 200_000)]
    lines: u64,
    /// Milliseconds between checkpoints.
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    /// aligned, unaligned, or timeout:MS (aligned, unaligned after MS).
    #[arg(long, default_value = "aligned")]
    alignment: String,
    /// Counters keep their counts in keyed state on disk instead of heap state.
    #[arg(long)]
    keyed: bool,
    /// Busy work per word in the counters, in ns: backpressure reaches the sources.
    #[arg(long, default_value_t = 0)]
    slow_ns: u64,
    /// Counter 0 fails with an error after this many words, once (the first time only).
    #[arg(long)]
    fail_once_after: Option<u64>,
    /// With --fail-once-after: counter 0 panics instead of returning an error.
    #[arg(long)]
    panic: bool,
    /// Milliseconds after which a checkpoint not complete is aborted.
    #[arg(long, default_value_t = 30_000)]
    timeout_ms: u64,
    /// Failed checkpoints in a row tolerated before a failover.
    #[arg(long, default_value_t = 0)]
    tolerable_failures: u32,
    /// Restarts the fixed-delay strategy allows.
    #[arg(long, default_value_t = 10)]
    restarts: u32,
    /// Milliseconds between a failure and the restart.
    #[arg(long, default_value_t = 50)]
    restart_delay_ms: u64,
    /// Discard the checkpoints and output of an earlier run first.
    #[arg(long)]
    fresh: bool,
    /// Every source emits a latency marker every this many milliseconds (the gates keep their
    /// age per source: `shmflow stat /shmflow-pl-NAME-…-write-0`).
    #[arg(long)]
    latency_ms: Option<u64>,
    /// No checkpoints (for a throughput baseline): any failure starts from the beginning.
    #[arg(long)]
    no_checkpoints: bool,
    /// Compare the committed output with a count made in one process (exit 1 if it differs).
    #[arg(long)]
    check: bool,
    /// Print nothing per checkpoint.
    #[arg(long)]
    quiet: bool,
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// Source `s`'s corpus: `lines` lines of 6 to 17 Zipf-ish words.
fn write_input(path: &Path, s: u64, lines: u64) -> std::io::Result<()> {
    use std::fmt::Write;
    let mut text = String::new();
    for i in 0..lines {
        let mut r = mix(s << 40 ^ i);
        for w in 0..6 + r % 12 {
            r = mix(r ^ w);
            let u = (r >> 11) as f64 / (1u64 << 53) as f64;
            if w > 0 {
                text.push(' ');
            }
            let _ = write!(text, "w{}", (u * u * u * 20_000.0) as u64);
        }
        text.push('\n');
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, path)
}

struct Split;

impl Operator for Split {
    fn process(&mut self, line: &[u8], ctx: &mut Context<'_>) -> Result<(), StageError> {
        for w in line.split(|&b| b == b' ').filter(|w| !w.is_empty()) {
            ctx.emit(w)?;
        }
        Ok(())
    }
}

/// Counts words; heap state (the whole map at each barrier) or keyed state.
struct Count {
    keyed: bool,
    counts: HashMap<Vec<u8>, u64>,
    slow: Duration,
    fail_after: Option<(u64, PathBuf)>,
    panic: bool,
    words: u64,
    /// Where it notes the last checkpoint it heard complete (`WORK/notified-count-I`).
    notified: PathBuf,
}

impl Operator for Count {
    fn process(&mut self, w: &[u8], ctx: &mut Context<'_>) -> Result<(), StageError> {
        self.words += 1;
        if let Some((n, mark)) = &self.fail_after {
            if self.words >= *n && !mark.exists() {
                std::fs::write(mark, b"failed once\n")?;
                if self.panic {
                    panic!("a deliberate panic after {n} words (--fail-once-after --panic)");
                }
                return Err(StageError::msg(format!(
                    "a deliberate failure after {n} words (--fail-once-after)"
                )));
            }
        }
        if self.keyed {
            ctx.keyed()?.add_u64(w, 1)?;
        } else {
            *self.counts.entry(w.to_vec()).or_insert(0) += 1;
        }
        if !self.slow.is_zero() {
            let t = Instant::now();
            while t.elapsed() < self.slow {
                std::hint::spin_loop();
            }
        }
        Ok(())
    }

    fn finish(&mut self, ctx: &mut Context<'_>) -> Result<(), StageError> {
        let mut lines = Vec::new();
        if self.keyed {
            ctx.keyed()?.for_each(|w, n| {
                let n = u64::from_le_bytes(n.try_into().unwrap_or_default());
                lines.push(format!("{} {n}", String::from_utf8_lossy(w)));
                Ok(())
            })?;
        } else {
            for (w, n) in &self.counts {
                lines.push(format!("{} {n}", String::from_utf8_lossy(w)));
            }
        }
        for l in lines {
            ctx.emit(l.as_bytes())?;
        }
        Ok(())
    }

    fn notify_checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), StageError> {
        std::fs::write(&self.notified, checkpoint.to_string())?;
        Ok(())
    }

    fn snapshot(&mut self) -> Result<Vec<u8>, StageError> {
        let mut out = Vec::new();
        for (w, n) in &self.counts {
            out.extend_from_slice(&(w.len() as u32).to_le_bytes());
            out.extend_from_slice(w);
            out.extend_from_slice(&n.to_le_bytes());
        }
        Ok(out)
    }

    fn restore(&mut self, mut state: &[u8]) -> Result<(), StageError> {
        let bad = || StageError::msg("a counter's state is cut short");
        while !state.is_empty() {
            let len = u32::from_le_bytes(state.get(..4).ok_or_else(bad)?.try_into()?) as usize;
            let w = state.get(4..4 + len).ok_or_else(bad)?.to_vec();
            let n = u64::from_le_bytes(state.get(4 + len..12 + len).ok_or_else(bad)?.try_into()?);
            self.counts.insert(w, n);
            state = &state[12 + len..];
        }
        Ok(())
    }
}

fn alignment(text: &str) -> Result<Alignment, String> {
    match text {
        "aligned" => Ok(Alignment::Aligned),
        "unaligned" => Ok(Alignment::Unaligned),
        t => t
            .strip_prefix("timeout:")
            .and_then(|ms| ms.parse().ok())
            .map(|ms| Alignment::AlignedWithTimeout(Duration::from_millis(ms)))
            .ok_or_else(|| format!("--alignment {t:?}: aligned, unaligned or timeout:MS")),
    }
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("pipeline_wordcount: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    const SOURCES: u64 = 2;
    let work = args.work.clone();
    let out = work.join("out");
    if !shmflow_pipeline::is_instance() {
        std::fs::create_dir_all(&work)?;
        for s in 0..SOURCES {
            let p = work.join(format!("input-{s}.txt"));
            // Written afresh with --fresh (--lines may have changed), else kept.
            if args.fresh || !p.exists() {
                write_input(&p, s, args.lines)?;
            }
        }
        if args.fresh {
            let _ = std::fs::remove_dir_all(&out);
            let _ = std::fs::remove_file(work.join("failed-once"));
        }
    }
    let interval = match args.no_checkpoints {
        // A checkpoint only at the end of the input (one a year otherwise).
        true => Duration::from_secs(365 * 86_400),
        false => Duration::from_millis(args.interval_ms),
    };
    let (keyed, slow, panic) = (args.keyed, Duration::from_nanos(args.slow_ns), args.panic);
    let fail_after = args.fail_once_after.map(|n| (n, work.join("failed-once")));
    let (w1, w2, w3) = (work.clone(), out.clone(), work.clone());
    let started = Instant::now();
    let summary = Pipeline::new(&args.name, work.join("checkpoints"))
        .source("read", SOURCES as usize, move |i| {
            Box::new(FileSource::lines(w1.join(format!("input-{i}.txt"))))
        })
        .operator("split", 3, |_| Box::new(Split))
        .operator("count", 2, move |i| {
            Box::new(Count {
                keyed,
                counts: HashMap::new(),
                slow,
                fail_after: fail_after.clone().filter(|_| i == 0),
                panic,
                words: 0,
                notified: w3.join(format!("notified-count-{i}")),
            })
        })
        .sink("write", 1, move |i| Box::new(FileSink::new(&w2, i)))
        .edge("read", "split", Partitioning::Rebalance)
        .edge("split", "count", Partitioning::key(fnv))
        .edge("count", "write", Partitioning::Rebalance)
        .checkpoints(
            CheckpointConfig::every(interval)
                .alignment(alignment(&args.alignment)?)
                .timeout(Duration::from_millis(args.timeout_ms))
                .tolerable_failures(args.tolerable_failures)
                .retained(2),
        )
        .restart(RestartStrategy::fixed_delay(
            args.restarts,
            Duration::from_millis(args.restart_delay_ms),
        ))
        .latency_markers(args.latency_ms.map(Duration::from_millis))
        .fresh_start(args.fresh)
        .quiet(args.quiet)
        .run()?;
    let secs = started.elapsed().as_secs_f64();
    println!("{summary} in {secs:.2} s");
    if args.check {
        check(&work, &out, SOURCES)?;
    }
    Ok(())
}

/// The committed output against a count of the inputs made here.
fn check(work: &Path, out: &Path, sources: u64) -> Result<(), String> {
    let mut want: HashMap<String, u64> = HashMap::new();
    for s in 0..sources {
        let text = std::fs::read_to_string(work.join(format!("input-{s}.txt")))
            .map_err(|e| e.to_string())?;
        for w in text.split_ascii_whitespace() {
            *want.entry(w.to_owned()).or_insert(0) += 1;
        }
    }
    let output = FileSink::read_committed(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut got: HashMap<String, u64> = HashMap::new();
    for line in String::from_utf8_lossy(&output).lines() {
        let (w, n) = line
            .split_once(' ')
            .and_then(|(w, n)| Some((w, n.parse::<u64>().ok()?)))
            .ok_or_else(|| format!("a malformed output line {line:?}"))?;
        if got.insert(w.to_owned(), n).is_some() {
            return Err(format!("exactly-once FAILED: {w:?} is in the output twice"));
        }
    }
    let wrong = want.iter().filter(|(w, n)| got.get(*w) != Some(n)).count()
        + got.keys().filter(|w| !want.contains_key(*w)).count();
    if wrong > 0 {
        return Err(format!(
            "exactly-once FAILED: {wrong} of {} words differ from the single-process count",
            want.len()
        ));
    }
    println!(
        "exactly-once OK: {} distinct words, {} words, equal to the single-process count",
        want.len(),
        want.values().sum::<u64>()
    );
    Ok(())
}
