//! Exactly once across real crashes: each test runs the word count pipeline
//! (`examples/pipeline_wordcount.rs`, 8 processes under a supervisor process), kills
//! instances from outside with SIGKILL (by the pids the supervisor publishes in its status
//! file) at moments drawn from a printed seed, and checks that the committed output equals a
//! single-process count (`--check`) and that nothing of the run is left in /dev/shm.
//! `SHMFLOW_TEST_SEED=S` replays a seed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The runs take both cores: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// The example, built once per test process when it is missing or older than this test:
/// `cargo test` builds the examples with the tests, a run of this test target alone does not,
/// and a stale one would test old code.
fn example() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().unwrap();
            let dir = exe.parent().unwrap().parent().unwrap();
            let bin = dir.join("examples").join("pipeline_wordcount");
            let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
            // `cargo test` builds both together; an example older than this test is stale.
            if modified(&bin).is_some_and(|b| modified(&exe).is_some_and(|t| b >= t)) {
                return bin;
            }
            let ok = Command::new(env!("CARGO"))
                .args([
                    "build",
                    "-p",
                    "shmflow-pipeline",
                    "--example",
                    "pipeline_wordcount",
                ])
                .args(["--profile", "test", "--manifest-path"])
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
                .status()
                .unwrap();
            assert!(
                ok.success() && bin.exists(),
                "{} could not be built",
                bin.display()
            );
            bin
        })
        .clone()
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A seed for this test, printed (or the one in SHMFLOW_TEST_SEED).
fn seed(test: &str) -> u64 {
    let s = std::env::var("SHMFLOW_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("{test}: seed {s} (replay with SHMFLOW_TEST_SEED={s})");
    s
}

struct Run {
    name: String,
    work: PathBuf,
    args: Vec<String>,
}

impl Run {
    fn new(name: &str, args: &[&str]) -> Run {
        let work =
            std::env::temp_dir().join(format!("shmflow-recovery-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&work);
        // What an earlier test process of the same name left, if it crashed.
        for e in std::fs::read_dir("/dev/shm").unwrap().flatten() {
            if e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&format!("shmflow-pl-{name}-")))
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let mut all: Vec<String> = vec![
            "--work".into(),
            work.display().to_string(),
            "--name".into(),
            name.into(),
            "--check".into(),
            "--quiet".into(),
            "--restart-delay-ms".into(),
            "20".into(),
        ];
        all.extend(args.iter().map(|s| s.to_string()));
        Run {
            name: name.into(),
            work,
            args: all,
        }
    }

    fn start(&self) -> Child {
        Command::new(example())
            .args(&self.args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn chk(&self) -> PathBuf {
        self.work.join("checkpoints")
    }

    /// The attempt and the instances' pids, from the status file.
    fn status(&self) -> Option<(u32, HashMap<String, u32>)> {
        let text = std::fs::read_to_string(self.chk().join("status")).ok()?;
        let mut lines = text.lines();
        let attempt = lines.next()?.strip_prefix("attempt ")?.parse().ok()?;
        let pids = lines
            .filter_map(|l| {
                let (n, p) = l.split_once(' ')?;
                Some((n.to_owned(), p.parse().ok()?))
            })
            .collect::<HashMap<_, _>>();
        (pids.len() == 8).then_some((attempt, pids))
    }

    fn metric(&self, name: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.chk().join("metrics")).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")).map(str::to_owned))
    }

    fn completed(&self) -> u64 {
        self.metric("lastCompletedCheckpointId")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Waits until `f` holds (panics after 60 s, or if the supervisor ended first).
    fn wait_until(&self, child: &mut Child, what: &str, mut f: impl FnMut(&Run) -> bool) {
        let start = Instant::now();
        while !f(self) {
            if let Some(st) = child.try_wait().unwrap() {
                panic!("the run ended ({st}) before {what}: raise --lines");
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no {what} within 60 s"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// SIGKILLs instance `name` of the current attempt.
    fn kill(&self, child: &mut Child, name: &str) -> u32 {
        let (_, pids) = self.status().expect("a status file");
        let pid = pids[name];
        if let Some(st) = child.try_wait().unwrap() {
            panic!("the run ended ({st}) before the kill of {name}: raise --lines");
        }
        // A victim that already ended (a source after the final checkpoint) proves nothing.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            !stat.is_empty() && !stat.contains(") Z"),
            "{name} (pid {pid}) had already ended before its kill: raise --lines"
        );
        // SAFETY: kill(2) on a pid read from the supervisor's status file.
        let r = unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        println!("killed {name} (pid {pid}): {r}");
        pid
    }

    /// Waits for the end: success, the check passed, nothing left in /dev/shm.
    fn finish(&self, child: Child) -> Output {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.contains("exactly-once OK"),
            "{}\nstdout:\n{stdout}\nstderr:\n{stderr}",
            out.status
        );
        let left: Vec<String> = std::fs::read_dir("/dev/shm")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with(&format!("shmflow-pl-{}-", self.name)))
            .collect();
        assert!(left.is_empty(), "left in /dev/shm: {left:?}");
        print!("{stdout}");
        out
    }

    /// Runs until `n` checkpoints completed, then SIGKILLs the supervisor and checks that
    /// every instance dies with it (parent-death signal) within 5 s.
    fn kill_supervisor_after(&self, n: u64) {
        let mut child = self.start();
        self.wait_until(&mut child, "checkpoints", |r| r.completed() >= n);
        let (_, pids) = self.status().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let start = Instant::now();
        for (name, pid) in &pids {
            // SAFETY: kill(2) with signal 0 only asks whether the pid exists.
            while unsafe { libc::kill(*pid as i32, 0) } == 0 {
                // A zombie is reaped by init; one still running is not.
                let state =
                    std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                if state.contains(") Z") {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "{name} (pid {pid}) outlived its supervisor"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    fn restarts(&self) -> u64 {
        self.metric("numRestarts")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.work);
        }
    }
}

/// Lines per source and busy work per word: runs of a few seconds on these machines.
const LONG: &[&str] = &["--lines", "120000", "--slow-ns", "1000"];

fn with(extra: &[&'static str]) -> Vec<&'static str> {
    LONG.iter().chain(extra).copied().collect()
}

#[test]
fn a_kill_of_every_kind_of_stage_at_a_random_moment_is_recovered_exactly_once() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut r = seed("every kind");
    let stages = [("read", 2), ("split", 3), ("count", 2), ("write", 1)];
    for (k, (stage, n)) in stages.into_iter().enumerate() {
        // Aligned and unaligned barriers in turn; heap and keyed state in turn.
        let mut extra = vec![if k % 2 == 0 {
            "--alignment=aligned"
        } else {
            "--alignment=unaligned"
        }];
        if k >= 2 {
            extra.push("--keyed");
        }
        let run = Run::new(&format!("kill-{stage}"), &with(&extra));
        let mut child = run.start();
        run.wait_until(&mut child, "the first checkpoint", |r| r.completed() >= 1);
        r = mix(r);
        std::thread::sleep(Duration::from_millis(r % 300));
        let victim = format!("{stage}-{}", (r >> 20) % n);
        run.kill(&mut child, &victim);
        let out = run.finish(child);
        assert_eq!(
            run.restarts(),
            1,
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cause = run.metric("lastFailureCause").unwrap();
        assert!(
            cause.contains(&victim) && cause.contains("SIGKILL"),
            "{cause}"
        );
    }
}

#[test]
fn two_kills_in_a_row_and_a_kill_during_the_restore() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut r = seed("two kills");
    let names = [
        "read-0", "read-1", "split-0", "split-1", "split-2", "count-0", "count-1", "write-0",
    ];
    // Two kills, the second after the pipeline recovered from the first.
    let run = Run::new(
        "twice",
        &[
            "--lines",
            "200000",
            "--slow-ns",
            "1000",
            "--alignment=unaligned",
        ],
    );
    let mut child = run.start();
    run.wait_until(&mut child, "the first checkpoint", |r| r.completed() >= 1);
    r = mix(r);
    run.kill(&mut child, names[r as usize % 8]);
    run.wait_until(&mut child, "the restart", |r| {
        r.status().is_some_and(|(a, _)| a == 2)
    });
    let after = run.completed();
    run.wait_until(&mut child, "a checkpoint after the restart", |r| {
        r.completed() > after
    });
    r = mix(r);
    run.kill(&mut child, names[r as usize % 8]);
    run.finish(child);
    assert_eq!(run.restarts(), 2);

    // A kill while the instances restore their checkpoint.
    let run = Run::new("restore", &with(&["--keyed"]));
    let mut child = run.start();
    run.wait_until(&mut child, "the first checkpoint", |r| r.completed() >= 1);
    r = mix(r);
    run.kill(&mut child, names[r as usize % 8]);
    run.wait_until(&mut child, "the restart", |r| {
        r.status().is_some_and(|(a, _)| a == 2)
    });
    r = mix(r);
    run.kill(&mut child, names[r as usize % 8]);
    run.finish(child);
    assert_eq!(run.restarts(), 2);
}

#[test]
fn a_kill_during_a_barriers_alignment() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let r = seed("alignment");
    // Slow counters: aligned barriers wait behind the queued words for a long time.
    let run = Run::new(
        "align",
        &[
            "--lines",
            "120000",
            "--slow-ns",
            "3000",
            "--alignment=aligned",
            "--interval-ms",
            "200",
        ],
    );
    let mut child = run.start();
    run.wait_until(&mut child, "the first checkpoint", |r| r.completed() >= 1);
    // A checkpoint in progress: the sources acknowledged it, a counter has not.
    let victim = format!("count-{}", r % 2);
    let mut chk = PathBuf::new();
    run.wait_until(&mut child, "an alignment in progress", |run| {
        let Ok(dir) = std::fs::read_dir(run.chk()) else {
            return false;
        };
        dir.flatten().any(|e| {
            let p = e.path();
            let in_progress = p.file_name().unwrap().to_str().unwrap().starts_with("chk-")
                && !p.join("_metadata").exists()
                && p.join("read-0").exists()
                && p.join("read-1").exists()
                && !p.join(&victim).exists();
            if in_progress {
                chk = p;
            }
            in_progress
        })
    });
    println!("killing {victim} during the alignment of {}", chk.display());
    run.kill(&mut child, &victim);
    run.finish(child);
    assert_eq!(run.restarts(), 1);
    assert!(!chk.join("_metadata").exists() || !chk.exists());
}

#[test]
fn a_stage_that_fails_by_itself_is_restarted_and_named_as_the_cause() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // An error returned by the stage's code, then a panic in it: the cause names counter 0,
    // not the instances that failed because it did.
    for (name, extra, expect) in [
        ("error", None, ["exited with code 1", "deliberate failure"]),
        ("panic", Some("--panic"), ["panicked", "deliberate panic"]),
    ] {
        let mut args = vec!["--lines", "60000", "--fail-once-after", "200000"];
        args.extend(extra);
        let run = Run::new(name, &args);
        run.finish(run.start());
        assert_eq!(run.restarts(), 1);
        let cause = run.metric("lastFailureCause").unwrap();
        assert!(
            cause.contains("count-0") && expect.iter().all(|e| cause.contains(e)),
            "{cause}"
        );
    }
}

#[test]
fn a_killed_supervisor_takes_its_instances_and_a_new_one_resumes() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let run = Run::new("supervisor", &with(&["--alignment=unaligned", "--keyed"]));
    run.kill_supervisor_after(2);
    let resumed_from = run.completed();
    // Started again on the same directory: from the last completed checkpoint, not afresh.
    let child = run.start();
    let out = run.finish(child);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(run.completed() > resumed_from);
    assert!(
        std::fs::read_to_string(run.chk().join("completed")).is_ok(),
        "{stderr}"
    );
    // And a third start finds it finished.
    let again = Command::new(example()).args(&run.args).output().unwrap();
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("already finished"));
}

#[test]
fn exhausted_restarts_keep_the_checkpoints_for_the_next_supervisor() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut run = Run::new("exhausted", &with(&["--restarts", "0"]));
    let mut child = run.start();
    run.wait_until(&mut child, "the first checkpoint", |r| r.completed() >= 1);
    run.kill(&mut child, "split-1");
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("allows no further restart") && stderr.contains("split-1"),
        "{stderr}"
    );
    let kept = run.completed();
    assert!(kept >= 1);
    let at = run.args.iter().position(|a| a == "--restarts").unwrap();
    run.args[at + 1] = "5".to_owned();
    let child = run.start();
    run.finish(child);
}

#[test]
fn a_directory_of_another_pipeline_is_refused_and_left_alone() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let run = Run::new("owner", &["--lines", "2000"]);
    run.finish(run.start());
    let before = std::fs::read_to_string(run.chk().join("PIPELINE")).unwrap();
    let out = Command::new(example())
        .args([
            "--work",
            run.work.to_str().unwrap(),
            "--name",
            "intruder",
            "--lines",
            "2000",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("holds the checkpoints of another pipeline"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(run.chk().join("PIPELINE")).unwrap(),
        before
    );
    assert!(Path::new(&run.chk().join("finished")).exists());
    // Each counter heard of every checkpoint's completion, the final one included, before
    // it ended.
    let last = run.completed();
    for i in 0..2 {
        let heard = std::fs::read_to_string(run.work.join(format!("notified-count-{i}"))).unwrap();
        assert_eq!(heard, last.to_string(), "counter {i}");
    }
}

#[test]
fn expired_checkpoints_are_aborted_everywhere_and_the_output_stays_exact() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // Slow counters and aligned barriers: most checkpoints take longer than 15 ms.
    let run = Run::new(
        "expire",
        &[
            "--lines",
            "60000",
            "--slow-ns",
            "2000",
            "--alignment=aligned",
            "--interval-ms",
            "30",
            "--timeout-ms",
            "15",
            "--tolerable-failures",
            "1000000",
        ],
    );
    let out = run.finish(run.start());
    let failed: u64 = run
        .metric("numberOfFailedCheckpoints")
        .unwrap()
        .parse()
        .unwrap();
    assert!(failed >= 1, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(run.restarts(), 0);
    // Nothing of an aborted checkpoint is left: every checkpoint directory is complete.
    for e in std::fs::read_dir(run.chk()).unwrap().flatten() {
        let name = e.file_name().into_string().unwrap();
        if name.starts_with("chk-") {
            assert!(
                e.path().join("_metadata").exists(),
                "{name} is left incomplete"
            );
        }
    }
}

#[test]
fn a_corrupt_checkpoint_is_set_aside_and_the_one_before_is_restored() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let run = Run::new("corrupt", &with(&["--keyed", "--alignment=unaligned"]));
    run.kill_supervisor_after(3);
    // Every instance is gone with the supervisor; flip a byte of the newest checkpoint.
    let newest: u64 = std::fs::read_to_string(run.chk().join("completed"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let victim = run.chk().join(format!("chk-{newest}")).join("count-1");
    let mut bytes = std::fs::read(&victim).unwrap();
    let at = bytes.len() - 1;
    bytes[at] ^= 0x55;
    std::fs::write(&victim, bytes).unwrap();
    let out = run.finish(run.start());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("checkpoint {newest} is corrupt and is set aside")),
        "{stderr}"
    );
    assert!(run
        .chk()
        .join(format!("corrupt-chk-{newest}"))
        .join("count-1")
        .exists());
    // Restored from the one before: a restore happened, and the output is exact (above).
    assert!(run.metric("lastCheckpointRestoreTimestamp").unwrap() != "0");
}

#[test]
fn latency_markers_from_every_source_reach_the_gates_of_every_later_stage() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let run = Run::new("latency", &with(&["--latency-ms", "1"]));
    let mut child = run.start();
    // Each stage's gates, by the suffix of their regions' names.
    let gates = |stage: &str| -> Vec<String> {
        std::fs::read_dir("/dev/shm")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with("shmflow-pl-latency-") && n.contains(&format!("-{stage}-")))
            .map(|n| format!("/{n}"))
            .collect()
    };
    // Every later stage's gates, together, have heard from both sources.
    let heard = |stage: &str| -> Vec<String> {
        let mut sources: Vec<String> = gates(stage)
            .iter()
            .filter_map(|g| shmflow::monitor::GateMonitor::open(g).ok())
            .flat_map(|m| m.latency())
            .filter(|l| l.count > 0 && l.max >= l.quantile(0.5))
            .map(|l| l.source)
            .collect();
        sources.sort();
        sources.dedup();
        sources
    };
    for stage in ["split", "count", "write"] {
        run.wait_until(&mut child, &format!("markers at {stage}"), |_| {
            heard(stage) == ["read-0", "read-1"]
        });
    }
    run.finish(child);
}
