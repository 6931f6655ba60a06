//! Tumbling-window aggregation per sensor in keyed state, exactly once across crashes:
//!
//! ```text
//! read (2 sources) ──by sensor──▶ window (2, keyed state) ──rebalance──▶ write (1 sink)
//! ```
//!
//! Each source reads `WORK/readings-S.txt` (`sensor time value` lines, in time order; a
//! sensor belongs to one source, so its readings reach its window instance in order). The
//! window operator keeps, per sensor, the open window's count, sum, minimum and maximum in
//! keyed state on disk; a reading of a later window closes the open one and emits it as a
//! line `sensor start count sum min max`, and the end of the input closes the rest. Windows
//! are emitted all along the run, so the sink's two-phase commit is what keeps each one
//! exactly once across a crash. `--check` compares the committed windows with the same
//! aggregation made in one process.
//!
//! ```text
//! cargo run --release -p shmflow-pipeline --example pipeline_windows -- --check
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use shmflow_pipeline::{
    CheckpointConfig, Context, FileSink, FileSource, Operator, Partitioning, Pipeline,
    RestartStrategy, StageError,
};

#[derive(Parser, Debug)]
#[command(about = "Windowed aggregation in keyed state over shmflow-pipeline")]
struct Args {
    /// Working directory: inputs, checkpoints (WORK/checkpoints) and output (WORK/out).
    #[arg(long, default_value = "target/pipeline-windows")]
    work: PathBuf,
    /// The pipeline's name.
    #[arg(long, default_value = "windows")]
    name: String,
    /// Readings per source.
    #[arg(long, default_value_t = 300_000)]
    readings: u64,
    /// Sensors in all.
    #[arg(long, default_value_t = 5_000)]
    sensors: u64,
    /// Window length in time units (readings are 1 unit apart per source).
    #[arg(long, default_value_t = 10_000)]
    window: u64,
    /// Milliseconds between checkpoints.
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    /// Discard the checkpoints and output of an earlier run first.
    #[arg(long)]
    fresh: bool,
    /// Compare the committed output with the aggregation made in one process.
    #[arg(long)]
    check: bool,
    /// Print nothing per checkpoint.
    #[arg(long)]
    quiet: bool,
}

const SOURCES: u64 = 2;

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Source `s`'s readings: time `t` from 0, a sensor of its own (`sensor % SOURCES == s`).
fn readings(s: u64, n: u64, sensors: u64) -> impl Iterator<Item = (u64, u64, i64)> {
    let own = (sensors / SOURCES).max(1);
    (0..n).map(move |t| {
        let r = mix(s << 48 ^ t);
        let sensor = (r % own) * SOURCES + s;
        (sensor, t, (r >> 32) as i64 % 1000 - 500)
    })
}

/// One window's aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Agg {
    start: u64,
    count: u64,
    sum: i64,
    min: i64,
    max: i64,
}

impl Agg {
    fn new(start: u64, v: i64) -> Agg {
        Agg {
            start,
            count: 1,
            sum: v,
            min: v,
            max: v,
        }
    }
    fn add(&mut self, v: i64) {
        self.count += 1;
        self.sum += v;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }
    fn line(&self, sensor: u64) -> String {
        format!(
            "{sensor} {} {} {} {} {}",
            self.start, self.count, self.sum, self.min, self.max
        )
    }
    fn encode(&self) -> [u8; 40] {
        let mut b = [0u8; 40];
        b[..8].copy_from_slice(&self.start.to_le_bytes());
        b[8..16].copy_from_slice(&self.count.to_le_bytes());
        b[16..24].copy_from_slice(&self.sum.to_le_bytes());
        b[24..32].copy_from_slice(&self.min.to_le_bytes());
        b[32..].copy_from_slice(&self.max.to_le_bytes());
        b
    }
    fn decode(b: &[u8]) -> Result<Agg, StageError> {
        let f = |i: usize| -> Result<[u8; 8], StageError> {
            Ok(b.get(i..i + 8)
                .ok_or_else(|| StageError::msg("a window's state is not 40 bytes"))?
                .try_into()?)
        };
        Ok(Agg {
            start: u64::from_le_bytes(f(0)?),
            count: u64::from_le_bytes(f(8)?),
            sum: i64::from_le_bytes(f(16)?),
            min: i64::from_le_bytes(f(24)?),
            max: i64::from_le_bytes(f(32)?),
        })
    }
}

fn parse(line: &[u8]) -> Result<(u64, u64, i64), StageError> {
    let text = std::str::from_utf8(line)?;
    let mut f = text.split(' ');
    let mut next = || {
        f.next()
            .ok_or_else(|| StageError::msg(format!("a short reading {text:?}")))
    };
    Ok((next()?.parse()?, next()?.parse()?, next()?.parse()?))
}

struct Window {
    length: u64,
}

impl Operator for Window {
    fn process(&mut self, line: &[u8], ctx: &mut Context<'_>) -> Result<(), StageError> {
        let (sensor, t, v) = parse(line)?;
        let start = t / self.length * self.length;
        let key = sensor.to_be_bytes();
        let state = ctx.keyed()?;
        let agg = match state.get(&key)? {
            None => Agg::new(start, v),
            Some(b) => {
                let mut a = Agg::decode(&b)?;
                if a.start == start {
                    a.add(v);
                    a
                } else {
                    // A later window: the open one is complete.
                    ctx.emit(a.line(sensor).as_bytes())?;
                    Agg::new(start, v)
                }
            }
        };
        ctx.keyed()?.put(&key, &agg.encode())?;
        Ok(())
    }

    fn finish(&mut self, ctx: &mut Context<'_>) -> Result<(), StageError> {
        let mut open = Vec::new();
        ctx.keyed()?.for_each(|k, v| {
            let sensor = u64::from_be_bytes(k.try_into().unwrap_or_default());
            open.push((sensor, v.to_vec()));
            Ok(())
        })?;
        for (sensor, v) in open {
            ctx.emit(Agg::decode(&v)?.line(sensor).as_bytes())?;
        }
        Ok(())
    }
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("pipeline_windows: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let work = args.work.clone();
    let out = work.join("out");
    if !shmflow_pipeline::is_instance() {
        std::fs::create_dir_all(&work)?;
        for s in 0..SOURCES {
            let p = work.join(format!("readings-{s}.txt"));
            // Written afresh with --fresh (the sizes may have changed), else kept.
            if args.fresh || !p.exists() {
                let mut text = String::new();
                for (sensor, t, v) in readings(s, args.readings, args.sensors) {
                    text.push_str(&format!("{sensor} {t} {v}\n"));
                }
                std::fs::write(&p, text)?;
            }
        }
        if args.fresh {
            let _ = std::fs::remove_dir_all(&out);
        }
    }
    let (w1, w2, length) = (work.clone(), out.clone(), args.window);
    let summary = Pipeline::new(&args.name, work.join("checkpoints"))
        .source("read", SOURCES as usize, move |i| {
            Box::new(FileSource::lines(w1.join(format!("readings-{i}.txt"))))
        })
        .operator("window", 2, move |_| Box::new(Window { length }))
        .sink("write", 1, move |i| Box::new(FileSink::new(&w2, i)))
        .edge(
            "read",
            "window",
            Partitioning::key(|line| {
                let sensor = line.split(|&b| b == b' ').next().unwrap_or_default();
                std::str::from_utf8(sensor)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .map_or(0, mix)
            }),
        )
        .edge("window", "write", Partitioning::Rebalance)
        .checkpoints(CheckpointConfig::every(Duration::from_millis(args.interval_ms)).retained(2))
        .restart(RestartStrategy::exponential_delay(
            Duration::from_millis(20),
            Duration::from_secs(2),
        ))
        .fresh_start(args.fresh)
        .quiet(args.quiet)
        .run()?;
    println!("{summary}");
    if args.check {
        check(args, &out)?;
    }
    Ok(())
}

fn check(args: &Args, out: &Path) -> Result<(), String> {
    let mut open: HashMap<u64, Agg> = HashMap::new();
    let mut want: BTreeMap<String, u32> = BTreeMap::new();
    for s in 0..SOURCES {
        for (sensor, t, v) in readings(s, args.readings, args.sensors) {
            let start = t / args.window * args.window;
            match open.get_mut(&sensor) {
                Some(a) if a.start == start => a.add(v),
                Some(a) => {
                    *want.entry(a.line(sensor)).or_insert(0) += 1;
                    *a = Agg::new(start, v);
                }
                None => {
                    open.insert(sensor, Agg::new(start, v));
                }
            }
        }
    }
    for (sensor, a) in &open {
        *want.entry(a.line(*sensor)).or_insert(0) += 1;
    }
    let output = FileSink::read_committed(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut got: BTreeMap<String, u32> = BTreeMap::new();
    for line in String::from_utf8_lossy(&output).lines() {
        *got.entry(line.to_owned()).or_insert(0) += 1;
    }
    if got != want {
        let missing = want.keys().filter(|k| !got.contains_key(*k)).count();
        let extra = got.iter().filter(|(k, n)| want.get(*k) != Some(n)).count();
        return Err(format!(
            "exactly-once FAILED: {missing} windows missing, {extra} wrong or repeated, of {}",
            want.len()
        ));
    }
    println!(
        "exactly-once OK: {} windows, equal to the single-process aggregation",
        want.len()
    );
    Ok(())
}
