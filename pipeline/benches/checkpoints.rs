//! What checkpoints cost, measured (not asserted):
//!
//! 1. **State size**: the time of one checkpoint of 1 M and 10 M keys (`u64` → `u64`) after
//!    1 000, 10 000 and a tenth of them changed (random keys), for the heap backend (the whole map serialized and written
//!    atomically, as `Operator::snapshot` does) and the keyed backend (redb: changed pages and
//!    a savepoint), in alternating pairs.
//! 2. **Throughput**: the word count pipeline (8 processes) with a checkpoint every 100 ms
//!    against none, in alternating pairs: the ratio of their rates per pair.
//! 3. **Recovery**: the word count, one instance SIGKILLed after the first checkpoint; the
//!    time from the kill to the first record processed after the restore (the supervisor's
//!    `lastRecoveredTimestamp`), restart delay 0.
//!
//! ```text
//! cargo bench -p shmflow-pipeline --bench checkpoints                 # all, 5 pairs each
//! cargo bench -p shmflow-pipeline --bench checkpoints -- --quick      # 1 M keys, 2 pairs
//! cargo bench -p shmflow-pipeline --bench checkpoints -- --only state  # or throughput, recovery
//! cargo bench -p shmflow-pipeline --bench checkpoints -- --pairs 10     # pairs (runs) per figure
//! ```

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use shmflow_pipeline::KeyedState;

fn cpu() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn spread(v: &[f64]) -> String {
    let (lo, hi) = v
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
    format!("[{lo:.3}..{hi:.3}]")
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 31)
}

/// The heap backend's checkpoint: serialize the whole map, write it atomically.
fn heap_checkpoint(map: &HashMap<u64, u64>, dir: &Path) -> f64 {
    let t = Instant::now();
    let mut buf = Vec::with_capacity(map.len() * 16);
    for (k, v) in map {
        buf.extend_from_slice(&k.to_le_bytes());
        buf.extend_from_slice(&v.to_le_bytes());
    }
    let tmp = dir.join(".heap.tmp");
    let mut f = std::fs::File::create(&tmp).unwrap();
    f.write_all(&buf).unwrap();
    f.sync_all().unwrap();
    std::fs::rename(&tmp, dir.join("heap")).unwrap();
    std::fs::File::open(dir).unwrap().sync_all().unwrap();
    t.elapsed().as_secs_f64() * 1e3
}

fn state_size(keys: u64, pairs: usize, dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let mut map: HashMap<u64, u64> = HashMap::with_capacity(keys as usize);
    let mut keyed = KeyedState::open(&dir.join("keyed.redb"), 64 << 20).unwrap();
    let load = Instant::now();
    for k in 0..keys {
        map.insert(k, k);
        keyed.put(&k.to_be_bytes(), &k.to_le_bytes()).unwrap();
    }
    let first = Instant::now();
    keyed.checkpoint(1).unwrap();
    let first_ms = first.elapsed().as_secs_f64() * 1e3;
    println!(
        "  {keys} keys loaded in {:.1} s; the keyed backend's first (full) checkpoint {first_ms:.0} ms",
        load.elapsed().as_secs_f64()
    );
    let mut r = 7u64;
    let mut id = 1;
    for changed in [1_000u64, 10_000, keys / 10] {
        let (mut heap, mut inc) = (Vec::new(), Vec::new());
        for p in 0..pairs {
            id += 1;
            // `changed` random keys change, in both backends.
            for _ in 0..changed {
                r = mix(r);
                let k = r % keys;
                map.insert(k, r);
                keyed.put(&k.to_be_bytes(), &r.to_le_bytes()).unwrap();
            }
            let mut run_inc = || {
                let t = Instant::now();
                keyed.checkpoint(id).unwrap();
                keyed.set_oldest_retained(id - 1);
                t.elapsed().as_secs_f64() * 1e3
            };
            if p % 2 == 0 {
                heap.push(heap_checkpoint(&map, dir));
                inc.push(run_inc());
            } else {
                inc.push(run_inc());
                heap.push(heap_checkpoint(&map, dir));
            }
        }
        let ratios: Vec<f64> = inc.iter().zip(&heap).map(|(i, h)| i / h).collect();
        let (hs, is, rs) = (spread(&heap), spread(&inc), spread(&ratios));
        let (hm, im, rm) = (
            median(&mut heap),
            median(&mut inc),
            median(&mut ratios.clone()),
        );
        println!("  | {keys} | {changed} | {hm:.1} ms {hs} | {im:.1} ms {is} | {rm:.3} {rs} |");
    }
    drop(keyed);
    let _ = std::fs::remove_dir_all(dir);
}

fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir.join("examples").join("pipeline_wordcount");
    // Built (or found up to date) every time: a stale binary would measure an old build.
    {
        let ok = Command::new(env!("CARGO"))
            .args([
                "build",
                "--release",
                "-p",
                "shmflow-pipeline",
                "--example",
                "pipeline_wordcount",
            ])
            .args(["--manifest-path"])
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .status()
            .unwrap();
        assert!(
            ok.success() && bin.exists(),
            "{} could not be built",
            bin.display()
        );
    }
    bin
}

/// One word count run; its wall time in seconds (from its own report).
fn wordcount(work: &Path, extra: &[&str]) -> f64 {
    let out = Command::new(example())
        .args([
            "--work",
            work.to_str().unwrap(),
            "--fresh",
            "--quiet",
            "--lines",
            "400000",
        ])
        .args(extra)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.split(" in ")
        .nth(1)
        .and_then(|s| s.trim().strip_suffix(" s"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no time in {text:?}"))
}

fn throughput(pairs: usize, dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    let mut ratios = Vec::new();
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for p in 0..pairs {
        let a = || wordcount(dir, &["--interval-ms", "100"]);
        let b = || wordcount(dir, &["--no-checkpoints"]);
        let (ta, tb) = if p % 2 == 0 {
            (a(), b())
        } else {
            let tb = b();
            (a(), tb)
        };
        with.push(ta);
        without.push(tb);
        // Same work: the rate ratio is the inverse of the time ratio.
        ratios.push(tb / ta);
    }
    let words = 2.0 * 400_000.0 * 11.5;
    let rs = spread(&ratios);
    println!(
        "  | every 100 ms | {:.2} s ({:.1} M words/s) |\n  | none | {:.2} s ({:.1} M words/s) |\n  | rate with / without per pair | {:.3} {rs} |",
        median(&mut with.clone()),
        words / median(&mut with) / 1e6,
        median(&mut without.clone()),
        words / median(&mut without) / 1e6,
        median(&mut ratios),
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn recovery(runs: usize, dir: &Path) {
    let mut times = Vec::new();
    for i in 0..runs {
        let _ = std::fs::remove_dir_all(dir);
        let mut child = Command::new(example())
            .args([
                "--work",
                dir.to_str().unwrap(),
                "--fresh",
                "--quiet",
                "--lines",
                "300000",
            ])
            .args([
                "--slow-ns",
                "500",
                "--restart-delay-ms",
                "0",
                "--interval-ms",
                "100",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let chk = dir.join("checkpoints");
        let metric = |name: &str| -> Option<u64> {
            std::fs::read_to_string(chk.join("metrics"))
                .ok()?
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name} "))?.parse().ok())
        };
        let start = Instant::now();
        while metric("lastCompletedCheckpointId").unwrap_or(0) < 1 {
            assert!(start.elapsed() < Duration::from_secs(60));
            std::thread::sleep(Duration::from_millis(2));
        }
        let status = std::fs::read_to_string(chk.join("status")).unwrap();
        let victim = ["count-0", "split-1", "read-0", "write-0"][i % 4];
        let pid: i32 = status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{victim} "))?.parse().ok())
            .unwrap();
        let killed_at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
            * 1e3;
        // SAFETY: kill(2) on a pid read from the supervisor's status file.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let status = child.wait().unwrap();
        assert!(status.success());
        let recovered = metric("lastRecoveredTimestamp").unwrap() as f64;
        times.push(recovered - killed_at);
        println!("  {victim}: {:.0} ms", recovered - killed_at);
    }
    let s = spread(&times);
    println!(
        "  | kill to first record after the restore | {:.0} ms {s} |",
        median(&mut times)
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let pairs = args
        .iter()
        .position(|a| a == "--pairs")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(if quick { 2 } else { 5 });
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str);
    let wanted = |part: &str| only.is_none_or(|o| o == part);
    let base = std::env::temp_dir().join(format!("shmflow-pipeline-bench-{}", std::process::id()));
    let date = Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    println!(
        "CPU: {} ({} cores), {date}",
        cpu(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if wanted("state") {
        println!("checkpoint duration against state size (median [min..max] of {pairs} alternating pairs):");
        println!("  | keys | changed since the last | heap (full) | keyed (incremental) | keyed / heap per pair |");
        let keys: &[u64] = if quick {
            &[1_000_000]
        } else {
            &[1_000_000, 10_000_000]
        };
        for &k in keys {
            state_size(k, pairs, &base.join("state"));
        }
    }
    if wanted("throughput") {
        println!("word count throughput, checkpoints every 100 ms against none ({pairs} alternating pairs):");
        throughput(pairs, &base.join("throughput"));
    }
    if wanted("recovery") {
        println!("recovery time ({} runs):", pairs.max(4));
        recovery(pairs.max(4), &base.join("recovery"));
    }
    let _ = std::fs::remove_dir_all(&base);
}
