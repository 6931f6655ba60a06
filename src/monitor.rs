//! Watching a channel from outside: a read-only mapping of a named region that never counts
//! as an attached end (the way AeronStat reads Aeron's counters file), and a listing of the
//! shmflow regions in `/dev/shm`.

use crate::error::End;
use crate::error::Result;
use crate::layout::Geometry;
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

    /// True while a live process holds `end`'s liveness lock (attached and not dead).
    pub fn end_alive(&self, end: End) -> bool {
        crate::liveness::end_locked(self.shared.fd(), end).unwrap_or(true)
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
    /// A live process holds the producer's liveness lock.
    pub producer_alive: bool,
    /// A live process holds the consumer's liveness lock.
    pub consumer_alive: bool,
}

impl RegionInfo {
    /// No end is alive: left behind by crashed processes (or by ends that detached without the
    /// creator unlinking it, which only a crash causes).
    pub fn is_stale(&self) -> bool {
        !self.producer_alive && !self.consumer_alive
    }
}

/// Removes the named region if it is a shmflow region with no live end; returns whether it
/// did. A region with a live end is never removed.
pub fn remove_if_stale(name: &str) -> Result<bool> {
    let m = Monitor::open(name)?;
    if m.end_alive(End::Producer) || m.end_alive(End::Consumer) {
        return Ok(false);
    }
    let c = std::ffi::CString::new(name).map_err(|_| crate::Error::NotFound {
        region: name.to_owned(),
    })?;
    // SAFETY: valid C string.
    if unsafe { libc::shm_unlink(c.as_ptr()) } != 0 {
        return Err(crate::Error::io(
            name,
            "shm_unlink",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(true)
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
                geometry: m.geometry(),
                snapshot: m.snapshot(),
                producer_alive: m.end_alive(End::Producer),
                consumer_alive: m.end_alive(End::Consumer),
                name,
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}
