//! Keyed state larger than memory: a child process in a memory cgroup of 96 MiB writes 150 MB
//! of values (a state file of several hundred MB) through `KeyedState`, checkpointing as it
//! goes, restores an earlier
//! checkpoint, and reads every key back. A backend that kept the state in memory would be
//! killed by the cgroup's limit. Needs root and the cgroup v1 memory controller; says SKIP
//! where the kernel refuses.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

use shmflow_pipeline::KeyedState;

const LIMIT: u64 = 96 << 20;
const KEYS: u64 = 750_000;
const VALUE: usize = 200;

fn value(k: u64, round: u64) -> Vec<u8> {
    let mut v = vec![0u8; VALUE];
    v[..8].copy_from_slice(&k.to_le_bytes());
    v[8..16].copy_from_slice(&round.to_le_bytes());
    v
}

/// The work, in the child: write, checkpoint, overwrite some, restore, read back.
fn workload(path: &std::path::Path) {
    let mut s = KeyedState::open(path, 16 << 20).unwrap();
    let mut savepoint = 0;
    for k in 0..KEYS {
        s.put(&k.to_be_bytes(), &value(k, 1)).unwrap();
        if (k + 1) % 150_000 == 0 {
            let id = (k + 1) / 150_000;
            let sp = s.checkpoint(id).unwrap();
            s.set_oldest_retained(id);
            if k + 1 == KEYS {
                savepoint = sp;
            }
        }
    }
    let last = KEYS / 150_000;
    // Changes after the last checkpoint, then a restore that discards them.
    for k in (0..KEYS).step_by(7) {
        s.put(&k.to_be_bytes(), &value(k, 2)).unwrap();
    }
    s.checkpoint(last + 1).unwrap();
    drop(s);
    let mut s = KeyedState::open(path, 16 << 20).unwrap();
    s.restore(last, savepoint).unwrap();
    for k in 0..KEYS {
        assert_eq!(
            s.get(&k.to_be_bytes()).unwrap(),
            Some(value(k, 1)),
            "key {k}"
        );
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM"))
        .unwrap_or("");
    println!("child: {KEYS} keys of {VALUE} B written, restored and read back; {hwm}");
}

#[test]
#[ignore = "needs root (a memory cgroup with a low limit): CI runs it as root"]
fn keyed_state_larger_than_its_memory_limit() {
    if let Ok(path) = std::env::var("SHMFLOW_LARGE_STATE_CHILD") {
        if let Ok(procs) = std::env::var("SHMFLOW_LARGE_STATE_CGROUP") {
            // Into the cgroup before the work begins.
            std::fs::write(procs, std::process::id().to_string()).unwrap();
        }
        workload(&PathBuf::from(path));
        return;
    }
    // SAFETY: geteuid(2) has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test needs root (a memory cgroup); run it as root, as CI does with --ignored"
    );
    let cg = PathBuf::from(format!(
        "/sys/fs/cgroup/memory/shmflow-large-state-{}",
        std::process::id()
    ));
    if let Err(e) = std::fs::create_dir(&cg)
        .and_then(|()| std::fs::write(cg.join("memory.limit_in_bytes"), LIMIT.to_string()))
    {
        println!("SKIP: no memory cgroup of {LIMIT} bytes could be made here ({e})");
        let _ = std::fs::remove_dir(&cg);
        return;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("large-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "keyed_state_larger_than_its_memory_limit",
            "--exact",
            "--nocapture",
            "--include-ignored",
        ])
        .env("SHMFLOW_LARGE_STATE_CHILD", dir.join("state.redb"))
        .env("SHMFLOW_LARGE_STATE_CGROUP", cg.join("cgroup.procs"))
        .output()
        .unwrap();
    let max = std::fs::read_to_string(cg.join("memory.max_usage_in_bytes")).unwrap_or_default();
    let failcnt = std::fs::read_to_string(cg.join("memory.failcnt")).unwrap_or_default();
    let file = std::fs::metadata(dir.join("state.redb"))
        .map(|m| m.len())
        .unwrap_or(0);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir(&cg);
    std::io::stdout().write_all(&out.stdout).unwrap();
    println!(
        "cgroup limit {LIMIT} B, peak usage {} B (page cache included, reclaimed at the limit), \
         {} hits of the limit; state file {file} B",
        max.trim(),
        failcnt.trim()
    );
    assert!(
        out.status.success(),
        "the child failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        file > 3 * LIMIT,
        "the state ({file} B) is not larger than the limit"
    );
}
