//! A region the system cannot back fails when it is created, with a typed error: on a small
//! tmpfs at /dev/shm (a private mount namespace) and in a memory cgroup with a low limit. Both
//! need root: they are ignored unless asked for (`--ignored`, as CI does as root); where the kernel
//! refuses the setup, the test says so and skips.

mod common;

use std::io::Write;
use std::process::Stdio;

use common::*;
use shmflow::{Geometry, OpenError, Producer};

const MIB: u32 = 1 << 20;

/// In a child: a private mount namespace with an 8 MiB tmpfs on /dev/shm.
fn small_dev_shm() -> Result<(), String> {
    // SAFETY: unshare(2) and mount(2) with valid arguments, in a child process of its own.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return Err(format!("unshare: {}", std::io::Error::last_os_error()));
        }
        let none = c"none";
        if libc::mount(
            none.as_ptr(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            return Err(format!(
                "mount --make-rprivate: {}",
                std::io::Error::last_os_error()
            ));
        }
        if libc::mount(
            c"tmpfs".as_ptr(),
            c"/dev/shm".as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            c"size=8m".as_ptr().cast(),
        ) != 0
        {
            return Err(format!("mount tmpfs: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs root (a private mount namespace with a small tmpfs): CI runs it as root"]
fn a_region_larger_than_the_tmpfs_fails_at_create() {
    if role().is_none() {
        require_root("a private mount namespace with a small tmpfs");
    }
    if role().as_deref() == Some("small-tmpfs") {
        if let Err(e) = small_dev_shm() {
            println!("SKIP: {e}");
            std::process::exit(0);
        }
        child_main(|| {
            let big = Geometry {
                segment_size: MIB,
                segment_count: 16,
            };
            match Producer::create("/limits-big", big) {
                Err(OpenError::NoMemory { bytes, .. }) if bytes >= 16 * MIB as u64 => {}
                Err(e) => return Err(format!("expected NoMemory, got {e}")),
                Ok(_) => return Err("a 16 MiB region was created on an 8 MiB tmpfs".into()),
            }
            // Nothing is left behind, and a region that fits still works.
            if std::fs::read_dir("/dev/shm").unwrap().count() != 0 {
                return Err("the failed create left a name in /dev/shm".into());
            }
            let small = Geometry {
                segment_size: 64 * 1024,
                segment_count: 16,
            };
            let mut p = Producer::create("/limits-small", small).map_err(|e| e.to_string())?;
            let mut c = shmflow::Consumer::open("/limits-small").map_err(|e| e.to_string())?;
            p.send(b"fits").map_err(|e| e.to_string())?;
            p.flush().map_err(|e| e.to_string())?;
            let got = match c.recv() {
                Ok(Some(r)) => r.as_bytes() == Some(&b"fits"[..]),
                _ => false,
            };
            if got {
                Ok(())
            } else {
                Err("the small region did not carry the record".into())
            }
        });
    }
    let child = spawn_with_stdin(
        "a_region_larger_than_the_tmpfs_fails_at_create",
        "small-tmpfs",
        &[],
        None,
        Stdio::null(),
    );
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the child failed: {:?}", out.status);
}

/// The memory cgroup (v1 or v2) this process is in, as a directory, if it can have children.
fn memory_cgroup() -> Option<(std::path::PathBuf, bool)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        if ctrl.split(',').any(|c| c == "memory") {
            let dir =
                std::path::Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
            return dir.is_dir().then_some((dir, false));
        }
        if ctrl.is_empty() {
            let dir = std::path::Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
            if dir.join("memory.max").exists() || dir.join("cgroup.subtree_control").exists() {
                return Some((dir, true));
            }
        }
    }
    None
}

#[test]
#[ignore = "needs root (a memory cgroup with a low limit): CI runs it as root"]
fn a_region_over_the_memory_cgroup_limit_fails_at_create_without_an_oom_kill() {
    if role().is_none() {
        require_root("a memory cgroup with a low limit");
    }
    if role().as_deref() == Some("in-cgroup") {
        // Wait until the parent has moved us into the cgroup.
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        child_main(|| {
            let big = Geometry {
                segment_size: MIB,
                segment_count: 256,
            };
            match Producer::create_anonymous(big) {
                Err(OpenError::NoMemory { .. }) => {}
                Err(e) => return Err(format!("expected NoMemory, got {e}")),
                Ok(_) => return Err("a 256 MiB region was created under a 64 MiB limit".into()),
            }
            // A region that fits under the limit is created and works.
            let fits = Geometry {
                segment_size: MIB,
                segment_count: 16,
            };
            let (mut p, mut c) = shmflow::pair(fits).map_err(|e| e.to_string())?;
            p.send(&[7u8; 100_000]).map_err(|e| e.to_string())?;
            p.flush().map_err(|e| e.to_string())?;
            let got = match c.recv() {
                Ok(Some(r)) => r.len() == Some(100_000),
                _ => false,
            };
            if got {
                Ok(())
            } else {
                Err("the region under the limit did not carry the record".into())
            }
        });
    }
    let Some((parent, v2)) = memory_cgroup() else {
        println!("SKIP: no memory cgroup to make a child of");
        return;
    };
    let dir = parent.join(format!("shmflow-test-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir(&dir) {
        println!(
            "SKIP: cannot create a memory cgroup under {}: {e}",
            parent.display()
        );
        return;
    }
    let limit = if v2 {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    if let Err(e) = std::fs::write(dir.join(limit), format!("{}", 64 * MIB)) {
        let _ = std::fs::remove_dir(&dir);
        println!("SKIP: cannot set {limit}: {e}");
        return;
    }
    if !v2 {
        // No swap either, where the kernel has the knob.
        let _ = std::fs::write(
            dir.join("memory.memsw.limit_in_bytes"),
            format!("{}", 64 * MIB),
        );
    }
    let mut child = spawn_with_stdin(
        "a_region_over_the_memory_cgroup_limit_fails_at_create_without_an_oom_kill",
        "in-cgroup",
        &[],
        None,
        Stdio::piped(),
    );
    let moved = std::fs::write(dir.join("cgroup.procs"), child.id().to_string());
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let status = child.wait().unwrap();
    let _ = std::fs::remove_dir(&dir);
    if let Err(e) = moved {
        println!("SKIP: cannot move the child into the cgroup: {e}");
        return;
    }
    use std::os::unix::process::ExitStatusExt;
    assert_ne!(
        status.signal(),
        Some(libc::SIGKILL),
        "the OOM killer struck"
    );
    assert_ne!(
        status.signal(),
        Some(libc::SIGBUS),
        "SIGBUS at a page touch"
    );
    assert!(status.success(), "the child failed: {status:?}");
}
