//! Watching a channel from outside: a read-only mapping of a named region that never counts
//! as an attached end (the way AeronStat reads Aeron's counters file), and a listing of the
//! shmflow regions in `/dev/shm`.

use std::time::Duration;

use crate::endpoint::metrics::{snapshot, Snapshot};

use crate::error::End;
use crate::error::{sys, Error, OpenError, Result};
use crate::protocol::abi::Geometry;
use crate::region::view::Shared;
use crate::sync::Arc;

/// A read-only view of a named channel's header: its mapping is `PROT_READ` and opening it
/// changes nothing in the region.
pub struct Monitor {
    shared: Arc<Shared>,
}

impl Monitor {
    /// Opens `/name` read-only after the same checks as an end (owner, mode, magic, version,
    /// geometry, size).
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::monitor::Monitor;
    /// use shmflow::{Geometry, Producer};
    ///
    /// let name = format!("/shmflow-doc-monitor-{}", std::process::id());
    /// let mut tx = Producer::create(&name, Geometry::default())?;
    /// let _rx = shmflow::Consumer::open(&name)?;
    /// tx.send(b"counted")?;
    /// tx.flush()?;
    /// let m = Monitor::open(&name)?; // read-only: never an end
    /// assert_eq!(m.snapshot().records_written, 1);
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`OpenError::NotFound`], [`OpenError::NotARegion`], [`OpenError::BadMagic`] (not this
    /// kind of shmflow region), and the other checks of an open: owner, mode, version, size
    /// ([`OpenError`]).
    pub fn open(name: &str) -> Result<Monitor, OpenError> {
        Ok(Monitor {
            shared: crate::region::object::open_named(name, false)?,
        })
    }

    /// As [`Monitor::open`], without waiting for a creator that is still writing the header
    /// (listings and clean-ups must never wait per object).
    fn open_now(name: &str) -> Result<Monitor, OpenError> {
        Ok(Monitor {
            shared: crate::region::object::open_named_grace(name, false, Duration::ZERO)?,
        })
    }

    /// The counters now.
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::monitor::Monitor;
    /// use shmflow::{Geometry, Producer};
    ///
    /// let name = format!("/shmflow-doc-snap-{}", std::process::id());
    /// let mut tx = Producer::create(&name, Geometry::default())?;
    /// let _rx = shmflow::Consumer::open(&name)?; // its leaving removes the name
    /// let m = Monitor::open(&name)?;
    /// let before = m.snapshot();
    /// tx.send(b"x")?;
    /// tx.flush()?;
    /// let rates = m.snapshot().rates_since(&before);
    /// assert!(rates.window_s >= 0.0);
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn snapshot(&self) -> Snapshot {
        snapshot(&self.shared)
    }

    /// The ages of the latency markers the channel's consumer read, per source (see
    /// [`Consumer::latency`](crate::Consumer::latency)): what `shmflow stat` shows.
    pub fn latency(&self) -> Vec<crate::endpoint::metrics::SourceLatency> {
        crate::endpoint::metrics::latency(&self.shared)
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
        crate::region::liveness::end_locked(
            self.shared.fd(),
            crate::region::liveness::lock_byte(None, end),
        )
        .unwrap_or(true)
    }
}

/// What `shmflow list` shows for one region.
#[derive(Clone, Debug)]
#[non_exhaustive]
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
    /// The ages of the latency markers the consumer read, per source (see
    /// [`Monitor::latency`]); empty while none came.
    pub latency: Vec<crate::endpoint::metrics::SourceLatency>,
    /// See [`RegionInfo::awaits_consumer`].
    awaits: bool,
}

impl RegionInfo {
    /// No end is alive: left behind by crashed processes, or a stream that ended and waits
    /// for its first consumer ([`RegionInfo::awaits_consumer`]).
    pub fn is_stale(&self) -> bool {
        !self.producer_alive && !self.consumer_alive
    }

    /// The producer has ended (or died) after publishing, and no consumer has attached yet:
    /// the region keeps its name so that a consumer that opens it later reads everything.
    /// [`remove_if_stale`] leaves such a region alone; [`remove_stale_and_unread`] removes it.
    pub fn awaits_consumer(&self) -> bool {
        self.awaits
    }

    /// Records published and not read (as far as the counters tell: records are counted when
    /// the producer keeps metrics, the default).
    pub fn unread_records(&self) -> u64 {
        self.snapshot
            .records_written
            .saturating_sub(self.snapshot.records_read)
    }
}

impl Monitor {
    /// See [`RegionInfo::awaits_consumer`]: published segments or priority events, a producer
    /// that is not alive, and no consumer ever.
    fn awaits_consumer(&self, s: &Snapshot, producer_alive: bool) -> bool {
        use crate::endpoint::metrics::EndState;
        let events = crate::protocol::lane::lane_tail(self.shared.header());
        s.consumer_state == EndState::Free
            && !producer_alive
            && s.producer_state != EndState::Free
            && (s.segments_acquired > 0 || events > 0)
    }
}

/// Removes the named region (a channel or a gate) if it is shmflow's and no end of it is
/// alive; returns whether it did. A region with a live end is never removed, nor is anything
/// that is not a shmflow region ([`OpenError::NotARegion`], [`OpenError::BadMagic`], …). It
/// never waits: a region whose creator is still writing its header is not shmflow's yet.
///
/// # Errors
/// [`OpenError::NotFound`], or [`OpenError::NotARegion`] / [`OpenError::BadMagic`] for what is
/// not a shmflow region (never removed); [`OpenError::Io`] if the unlink fails.
///
/// A channel whose stream ended and waits for its first consumer
/// ([`RegionInfo::awaits_consumer`]) is kept too: its records were accepted by `send` and
/// nobody has read them. [`remove_stale_and_unread`] removes it.
pub fn remove_if_stale(name: &str) -> Result<bool, OpenError> {
    remove_unless_alive(name, false)
}

/// As [`remove_if_stale`], and also removes a channel whose stream ended and waits for its
/// first consumer, discarding its unread records (`shmflow clean --unread`).
///
/// # Errors
/// As [`remove_if_stale`].
pub fn remove_stale_and_unread(name: &str) -> Result<bool, OpenError> {
    remove_unless_alive(name, true)
}

fn remove_unless_alive(name: &str, unread_too: bool) -> Result<bool, OpenError> {
    let keep = match GateMonitor::open_now(name) {
        Ok(g) => g.consumer_alive() || (0..g.channels()).any(|c| g.producer_alive(c)),
        Err(OpenError::BadMagic { .. }) => {
            let m = Monitor::open_now(name)?;
            let producer = m.end_alive(End::Producer);
            producer
                || m.end_alive(End::Consumer)
                || (!unread_too && m.awaits_consumer(&m.snapshot(), producer))
        }
        Err(e) => return Err(e),
    };
    if keep {
        return Ok(false);
    }
    let c = crate::region::object::c_name(name)?;
    crate::sys::shm::unlink(&c).map_err(|e| OpenError::io(name, "shm_unlink", e))?;
    Ok(true)
}

/// The shmflow regions in `/dev/shm` that this user can open. Objects that are not shmflow
/// regions (wrong magic, other owner, …) are skipped.
///
/// # Errors
/// [`Error::Io`] if `/dev/shm` cannot be read.
pub fn list_regions() -> Result<Vec<RegionInfo>> {
    let mut out = Vec::new();
    for name in shm_names()? {
        if let Ok(m) = Monitor::open_now(&name) {
            let (snapshot, producer_alive) = (m.snapshot(), m.end_alive(End::Producer));
            out.push(RegionInfo {
                geometry: m.geometry(),
                snapshot,
                producer_alive,
                consumer_alive: m.end_alive(End::Consumer),
                latency: m.latency(),
                awaits: m.awaits_consumer(&snapshot, producer_alive),
                name,
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// A read-only view of a named gate (see [`crate::Gate`]): `PROT_READ`, never an end.
pub struct GateMonitor {
    chans: Vec<Arc<Shared>>,
}

impl GateMonitor {
    /// Opens `/name` read-only after the same checks as an end.
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::monitor::GateMonitor;
    /// use shmflow::{Gate, GateGeometry};
    ///
    /// let name = format!("/shmflow-doc-gmon-{}", std::process::id());
    /// let _gate = Gate::create(&name, GateGeometry::new(3))?;
    /// let m = GateMonitor::open(&name)?; // read-only: never an end
    /// assert_eq!(m.channels(), 3);
    /// assert_eq!(m.snapshot().floating_free, GateGeometry::new(3).floating as u64);
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn open(name: &str) -> Result<GateMonitor, OpenError> {
        Ok(GateMonitor {
            chans: crate::region::object::gate_open_named(name, false)?,
        })
    }

    /// As [`GateMonitor::open`], without waiting (see `Monitor::open_now`).
    fn open_now(name: &str) -> Result<GateMonitor, OpenError> {
        Ok(GateMonitor {
            chans: crate::region::object::gate_open_named_grace(name, false, Duration::ZERO)?,
        })
    }

    /// The gate's figures now.
    pub fn snapshot(&self) -> crate::endpoint::gate_stats::GateSnapshot {
        crate::endpoint::gate_stats::snapshot(&self.chans)
    }

    /// The ages of the latency markers the gate's consumer handed out, per source (see
    /// [`Gate::latency`](crate::Gate::latency)).
    pub fn latency(&self) -> Vec<crate::endpoint::metrics::SourceLatency> {
        crate::endpoint::metrics::latency(&self.chans[0])
    }

    /// The gate's shape.
    pub fn geometry(&self) -> crate::protocol::abi::GateGeometry {
        self.chans[0].gate.as_ref().expect("gate").geometry
    }

    /// Number of channels.
    pub fn channels(&self) -> u32 {
        self.chans.len() as u32
    }

    /// The region's name.
    pub fn region_name(&self) -> &str {
        &self.chans[0].name
    }

    /// True while a live process holds the gate consumer's liveness lock.
    pub fn consumer_alive(&self) -> bool {
        self.locked(crate::region::liveness::lock_byte(None, End::Consumer))
    }

    /// True while a live process holds channel `c`'s producer lock.
    pub fn producer_alive(&self, c: u32) -> bool {
        self.locked(crate::region::liveness::lock_byte(Some(c), End::Producer))
    }

    fn locked(&self, byte: i64) -> bool {
        crate::region::liveness::end_locked(self.chans[0].fd(), byte).unwrap_or(true)
    }

    /// Which gates are stale: no live consumer and no live producer.
    pub fn is_stale(&self) -> bool {
        !self.consumer_alive() && !(0..self.channels()).any(|c| self.producer_alive(c))
    }
}

/// The shmflow gates in `/dev/shm` that this user can open, by name.
///
/// # Errors
/// [`Error::Io`] if `/dev/shm` cannot be read.
pub fn list_gates() -> Result<Vec<(String, GateMonitor)>> {
    let mut out = Vec::new();
    for name in shm_names()? {
        if let Ok(m) = GateMonitor::open_now(&name) {
            out.push((name, m));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The objects in `/dev/shm` that are neither a channel nor a gate this process can open, with
/// what each is: a name whose creator is still setting it up (`SizeMismatch` with a size of 0,
/// or `BadMagic` with a magic of 0), another program's object (`BadMagic`), another user's
/// (`NotOwner`, `BadMode`), or not a shared-memory object at all (`NotARegion`). Nothing waits
/// and nothing is opened past the first page.
///
/// # Errors
/// [`Error::Io`] if `/dev/shm` cannot be read.
pub fn list_other_objects() -> Result<Vec<(String, OpenError)>> {
    let dir =
        std::fs::read_dir("/dev/shm").map_err(|e| Error::Io(sys("/dev/shm", "read_dir", e)))?;
    let mut out = Vec::new();
    for e in dir.flatten() {
        let name = format!("/{}", e.file_name().to_string_lossy());
        let as_channel = match Monitor::open_now(&name) {
            Ok(_) => continue,
            Err(e) => e,
        };
        match GateMonitor::open_now(&name) {
            Ok(_) => continue,
            // A gate-sized look tells nothing new about a non-gate: keep the channel's answer,
            // unless the object turned out to be a gate of another kind of trouble.
            Err(OpenError::BadMagic { .. }) | Err(OpenError::NotFound { .. }) => {
                out.push((name, as_channel))
            }
            Err(e) => out.push((name, e)),
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The names (`/name`) of the regular files in `/dev/shm`.
fn shm_names() -> Result<Vec<String>> {
    let dir =
        std::fs::read_dir("/dev/shm").map_err(|e| Error::Io(sys("/dev/shm", "read_dir", e)))?;
    Ok(dir
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| format!("/{}", e.file_name().to_string_lossy()))
        .collect())
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("region", &self.shared.name)
            .field("geometry", &self.shared.geometry)
            .finish()
    }
}

impl std::fmt::Debug for GateMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GateMonitor")
            .field("region", &self.region_name())
            .field("geometry", &self.geometry())
            .finish()
    }
}
