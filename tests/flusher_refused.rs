//! A producer under `FlushPolicy::Timeout` whose flusher thread the system refuses (a pids
//! cgroup at its limit) neither panics nor leaves its records unseen: it wakes its consumer
//! itself. Needs root and the cgroup v1 pids controller: ignored unless asked for (`--ignored`, as
//! CI does as root); says SKIP where the kernel refuses.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use shmflow::{FlushPolicy, Geometry};

/// In the child, inside the cgroup: no thread can be started, and the producer still works.
fn at_the_limit(cgroup: &str) {
    std::fs::write(
        format!("{cgroup}/cgroup.procs"),
        std::process::id().to_string(),
    )
    .unwrap();
    let current = std::fs::read_to_string(format!("{cgroup}/pids.current")).unwrap();
    std::fs::write(format!("{cgroup}/pids.max"), current.trim()).unwrap();
    assert!(
        std::thread::Builder::new().spawn(|| ()).is_err(),
        "the cgroup at its limit still let a thread start"
    );
    let (mut tx, mut rx) = shmflow::pair(Geometry::default()).unwrap();
    tx.set_flush_policy(FlushPolicy::Timeout(Duration::from_millis(1)));
    for i in 0..100u64 {
        tx.send_pod(&i).unwrap();
    }
    // Every record is visible now, without a flush and without a flusher.
    let mut n = 0u64;
    while let Ok(Some(r)) = rx.try_recv() {
        assert_eq!(r.as_pod::<u64>(), Some(&n));
        n += 1;
    }
    assert_eq!(n, 100);
    println!("child: no thread could start; 100 records sent under Timeout and read");
}

#[test]
#[ignore = "needs root (a pids cgroup at its limit): CI runs it as root"]
fn a_refused_flusher_thread_neither_panics_nor_hides_records() {
    if let Ok(cg) = std::env::var("SHMFLOW_FLUSHER_CGROUP") {
        at_the_limit(&cg);
        return;
    }
    // SAFETY: geteuid(2) has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test needs root (a pids cgroup); run it as root, as CI does with --ignored"
    );
    let cg = PathBuf::from(format!(
        "/sys/fs/cgroup/pids/shmflow-flusher-{}",
        std::process::id()
    ));
    if let Err(e) = std::fs::create_dir(&cg) {
        println!("SKIP: no pids cgroup could be made here ({e})");
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "a_refused_flusher_thread_neither_panics_nor_hides_records",
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "--include-ignored",
        ])
        .env("SHMFLOW_FLUSHER_CGROUP", &cg)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir(&cg);
    print!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
