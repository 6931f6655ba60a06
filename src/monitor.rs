//! Watching a channel from outside: a read-only mapping of a named region that never counts
//! as an attached end (the way AeronStat reads Aeron's counters file), and a listing of the
//! shmflow regions in `/dev/shm`.

use crate::error::Result;
use crate::layout::{Geometry, END_ATTACHED};
use crate::metrics::{snapshot, Snapshot};
use crate::shared::Shared;
use crate::sync::Arc;

/// A read-only view of a named channel's header: its mapping is `PROT_READ` and opening it
/// changes nothing in the region.
pub struct Monitor {
    shared: Arc<Shared>,
}

impl Monitor {
    /// Opens `/name` read-only after the same checks as an end (owner, mode, magic, version,
    /// geometry, size).
    pub fn open(name: &str) -> Result<Monitor> {
        Ok(Monitor {
            shared: crate::region::open_named(name, false)?,
        })
    }

    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        snapshot(&self.shared)
    }

    /// Segment size and count.
    pub fn geometry(&self) -> Geometry {
        self.shared.geometry
    }

    /// The region's name.
    pub fn region_name(&self) -> &str {
        &self.shared.name
    }

    /// Start of the read-only mapping (for tests that check it cannot be written).
    #[doc(hidden)]
    pub fn mapping_ptr(&self) -> *const u8 {
        self.shared.header() as *const _ as *const u8
    }
}

/// What `shmflow list` shows for one region.
#[derive(Clone, Debug)]
pub struct RegionInfo {
    /// `/name`.
    pub name: String,
    /// Segment size and count.
    pub geometry: Geometry,
    /// The snapshot taken while listing (attach states, pids, counters).
    pub snapshot: Snapshot,
}

impl RegionInfo {
    /// True if the end is attached and its recorded process still exists.
    pub fn end_alive(state: u32, pid: u32) -> bool {
        // SAFETY: kill with signal 0 only checks for existence and permission.
        state == END_ATTACHED && pid != 0 && unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
    }
}

/// The shmflow regions in `/dev/shm` that this user can open. Objects that are not shmflow
/// regions (wrong magic, other owner, …) are skipped.
pub fn list_regions() -> Result<Vec<RegionInfo>> {
    let dir =
        std::fs::read_dir("/dev/shm").map_err(|e| crate::Error::io("/dev/shm", "read_dir", e))?;
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Ok(ft) = entry.file_type() else { continue };
        if !ft.is_file() {
            continue;
        }
        let name = format!("/{}", entry.file_name().to_string_lossy());
        if let Ok(m) = Monitor::open(&name) {
            out.push(RegionInfo {
                name,
                geometry: m.geometry(),
                snapshot: m.snapshot(),
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}
