//! How much memory a new shared-memory object can still get: the memory cgroup's limits (v1
//! or v2, every level up to the root of the hierarchy) and the machine's available memory.
//! Charging a tmpfs page to a memory cgroup at its limit invokes the OOM killer even from
//! `fallocate`, so a creator looks first and refuses what cannot fit.

use std::path::{Path, PathBuf};

/// Limits at or above this mean "no limit" (cgroup v1 writes `PAGE_COUNTER_MAX` pages).
const UNLIMITED: u64 = 1 << 62;

fn read_u64(p: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(p).ok()?;
    let s = s.trim();
    if s == "max" {
        return Some(u64::MAX);
    }
    s.parse().ok()
}

/// A key's value in a `memory.stat` file.
fn stat_field(dir: &Path, keys: &[&str]) -> u64 {
    let Ok(text) = std::fs::read_to_string(dir.join("memory.stat")) else {
        return 0;
    };
    for key in keys {
        for line in text.lines() {
            if let Some(v) = line.strip_prefix(key).and_then(|r| r.strip_prefix(' ')) {
                return v.trim().parse().unwrap_or(0);
            }
        }
    }
    0
}

/// This process's memory cgroup directory and whether it is cgroup v2.
fn own_cgroup() -> Option<(PathBuf, PathBuf, bool)> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut v2_path = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        if ctrl.split(',').any(|c| c == "memory") {
            let root = PathBuf::from("/sys/fs/cgroup/memory");
            return Some((root.join(rel), root, false));
        }
        if ctrl.is_empty() {
            v2_path = Some(rel.to_owned());
        }
    }
    let rel = v2_path?;
    for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        let root = PathBuf::from(root);
        if root.join("cgroup.controllers").exists() {
            return Some((root.join(&rel), root, true));
        }
    }
    None
}

/// Bytes that can still be charged to this process's memory cgroup, counting reclaimable file
/// cache as free: the smallest over the cgroup and its ancestors. `None` if there is no limit
/// (or no way to know).
fn cgroup_available() -> Option<u64> {
    let (mut dir, root, v2) = own_cgroup()?;
    let mut best: Option<u64> = None;
    loop {
        let (limit, usage) = if v2 {
            (
                read_u64(&dir.join("memory.max")),
                read_u64(&dir.join("memory.current")),
            )
        } else {
            (
                read_u64(&dir.join("memory.limit_in_bytes")),
                read_u64(&dir.join("memory.usage_in_bytes")),
            )
        };
        if let (Some(limit), Some(usage)) = (limit, usage) {
            if limit < UNLIMITED {
                // The file LRU lists (active and inactive) never hold shmem pages: the
                // kernel reclaims them before it refuses a charge.
                let reclaimable = stat_field(&dir, &["total_inactive_file", "inactive_file"])
                    + stat_field(&dir, &["total_active_file", "active_file"]);
                let free = limit.saturating_sub(usage.saturating_sub(reclaimable));
                best = Some(best.map_or(free, |b| b.min(free)));
            }
        }
        if dir == root || !dir.pop() || !dir.starts_with(&root) {
            break;
        }
    }
    best
}

/// The machine's available memory (`MemAvailable` plus free swap, where tmpfs pages can go),
/// if known.
fn machine_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |key: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(key))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib.saturating_mul(1024))
    };
    Some(field("MemAvailable:")?.saturating_add(field("SwapFree:").unwrap_or(0)))
}

/// An estimate of the bytes a new shared-memory object of this process can get now: the least
/// of what its memory cgroups and the machine have available. `None` if nothing bounds it.
pub(crate) fn available() -> Option<u64> {
    match (cgroup_available(), machine_available()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
