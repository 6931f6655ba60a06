//! Creating, opening and mapping the shared-memory objects of channels and gates: one path
//! for both (a [`Shape`] says which), and one constructor of their views.
//!
//! Rules, in one place:
//! - A named region is created with `shm_open(O_CREAT | O_EXCL, 0600)`; an existing name is
//!   [`OpenError::AlreadyExists`]. Who removes the name, and when, is `region::name`'s rule (a
//!   gate's name goes with the gate); a peer's mapping stays valid after the name is gone, but
//!   nobody new can open it.
//! - Opening checks the owner (must be this effective user) and the mode (no group or other
//!   bits), then the magic, layout version, geometry and size before anything else is read.
//! - An anonymous region is a sealed `memfd` (it cannot shrink or grow under a peer).
//! - Each end attaches at most once: `FREE → ATTACHED → DETACHED`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use crate::error::{ConfigError, End, OpenError, RegionKind};
use crate::protocol::abi::{GateGeometry, GateHeader, GATE_MAGIC};

type Result<T, E = OpenError> = std::result::Result<T, E>;
use crate::protocol::abi::{Geometry, HEADER_SIZE, LAYOUT_VERSION, MAGIC};
use crate::region::liveness::{lock_byte, EndLock};
use crate::region::view::NameDuty;
use crate::region::view::{Bells, Mapping, Placement, Shared};
use crate::sync::Arc;

pub(crate) fn c_name(name: &str) -> Result<CString> {
    let ok = name.starts_with('/')
        && name.len() > 1
        && name.len() <= 255
        && !name[1..].contains('/')
        && !name.contains('\0')
        && name != "/."
        && name != "/..";
    if !ok {
        return Err(ConfigError::new(
            name,
            "region name",
            "'/' followed by 1 to 254 characters without '/' or NUL, and not /. or /..",
            format!("{name:?}"),
        )
        .into());
    }
    Ok(CString::new(name).expect("checked for NUL above"))
}

pub(crate) fn map(
    region: &str,
    fd: BorrowedFd<'_>,
    len: usize,
    writable: bool,
) -> Result<memmap2::MmapRaw> {
    crate::sys::shm::map(fd, len, writable).map_err(|e| OpenError::io(region, "mmap", e))
}

/// Sizes a fresh object and maps it writable; on failure a named object is unlinked again.
fn size_and_map(
    name: &str,
    fd: &OwnedFd,
    size: usize,
    unlink: Option<&CString>,
) -> Result<memmap2::MmapRaw> {
    let undo = |e: OpenError| {
        if let Some(n) = unlink {
            // We created this name a moment ago.
            let _ = crate::sys::shm::unlink(n);
        }
        e
    };
    crate::sys::shm::set_len(fd, size as u64)
        .map_err(|e| undo(OpenError::io(name, "ftruncate", e)))?;
    // Reserve the memory now: a region the system cannot back fails here, with a typed error,
    // not later with SIGBUS or the OOM killer. A memory cgroup at its limit answers a tmpfs
    // allocation with the OOM killer, even inside `fallocate`: look at what is available first.
    if let Some(available) = crate::sys::mem::available() {
        if size as u64 > available {
            return Err(undo(OpenError::NoMemory {
                region: name.to_owned(),
                bytes: size as u64,
                source: io::Error::new(
                    io::ErrorKind::OutOfMemory,
                    format!("about {available} bytes are available to this process's memory cgroup and machine"),
                ),
            }));
        }
    }
    crate::sys::shm::reserve(fd, size as u64).map_err(|e| {
        undo(if crate::sys::shm::out_of_memory(&e) {
            OpenError::NoMemory {
                region: name.to_owned(),
                bytes: size as u64,
                source: e,
            }
        } else {
            OpenError::io(name, "fallocate", e)
        })
    })?;
    map(name, fd.as_fd(), size, true).map_err(undo)
}

/// Creates the named object (`O_EXCL`, mode 0600) and write-locks `lock_byte` for `end` on it
/// before anything else, so that `shmflow clean` never sees it ownerless.
fn shm_create(name: &str, lock_byte: i64, end: End) -> Result<(OwnedFd, CString, EndLock)> {
    let cname = c_name(name)?;
    let fd = crate::sys::shm::create_excl(&cname, 0o600).map_err(|e| {
        if e.kind() == io::ErrorKind::AlreadyExists {
            exists_error(name)
        } else {
            OpenError::io(name, "shm_open(O_CREAT|O_EXCL)", e)
        }
    })?;
    match EndLock::acquire(&fd, lock_byte, end, name) {
        Ok(l) => Ok((fd, cname, l)),
        Err(e) => {
            // We created this name a moment ago.
            let _ = crate::sys::shm::unlink(&cname);
            Err(e)
        }
    }
}

/// Creates a named region (`O_EXCL`, mode 0600) for `end`, whose liveness lock is taken
/// before the magic is written, so that `shmflow clean` never sees it ownerless.
pub(crate) fn create_named(
    name: &str,
    geometry: Geometry,
    end: End,
) -> Result<(Arc<Shared>, std::sync::Arc<EndLock>)> {
    let (mut chans, lock) = create_named_shape(name, Shape::Channel(geometry), end)?;
    Ok((chans.swap_remove(0), lock))
}

/// `AlreadyExists`, or `Stale` if the region there is shmflow's (a channel or a gate) and none
/// of its ends is alive.
fn exists_error(name: &str) -> OpenError {
    // No grace: this looks at an object that exists, it does not wait for one being made.
    let found: Option<(Arc<Shared>, Vec<i64>)> =
        if let Ok(chans) = gate_open_named_grace(name, false, Duration::ZERO) {
            let m = chans.len() as i64;
            Some((
                chans[0].clone(),
                std::iter::once(1).chain(2..2 + m).collect(),
            ))
        } else {
            open_named_grace(name, false, Duration::ZERO)
                .ok()
                .map(|s| (s, vec![0, 1]))
        };
    if let Some((shared, bytes)) = found {
        let alive = |b| crate::region::liveness::end_locked(shared.fd(), b).unwrap_or(true);
        if !bytes.into_iter().any(alive) {
            if shared.gate.is_none() {
                use crate::protocol::ends::EndState;
                use crate::protocol::figures;
                let h = shared.header();
                // A look at a region nobody alive writes.
                if h.consumer_end().state() == EndState::Free
                    && h.producer_end().state() != EndState::Free
                    && (figures::read_segments_acquired(h) > 0
                        || crate::protocol::lane::lane_tail(h) > 0)
                {
                    return OpenError::AwaitsConsumer {
                        region: name.to_owned(),
                        unread_records: figures::read_records_written(h),
                    };
                }
            }
            return OpenError::Stale {
                region: name.to_owned(),
                dead: None,
            };
        }
    }
    OpenError::AlreadyExists {
        region: name.to_owned(),
    }
}

/// A fresh sealed memfd of `size` bytes (it can never shrink or grow under a peer), and the
/// name that messages use for it.
fn memfd_sealed(size: usize) -> Result<(OwnedFd, String)> {
    let fd = crate::sys::shm::memfd(c"shmflow")
        .map_err(|e| OpenError::io("memfd:shmflow", "memfd_create", e))?;
    let name = format!(
        "memfd:shmflow(fd {}, pid {})",
        fd.as_raw_fd(),
        std::process::id()
    );
    crate::sys::shm::set_len(&fd, size as u64).map_err(|e| OpenError::io(&name, "ftruncate", e))?;
    // Seal the size: a peer can then never truncate the object under our mapping (SIGBUS).
    crate::sys::shm::seal_size(&fd).map_err(|e| OpenError::io(&name, "fcntl(F_ADD_SEALS)", e))?;
    Ok((fd, name))
}

/// Creates an anonymous, sealed memfd region for `end`.
pub(crate) fn create_memfd(
    geometry: Geometry,
    end: End,
) -> Result<(Arc<Shared>, std::sync::Arc<EndLock>)> {
    let (mut chans, lock) = create_memfd_shape(Shape::Channel(geometry), end)?;
    Ok((chans.swap_remove(0), lock))
}

/// Opens an existing named region.
pub(crate) fn open_named(name: &str, writable: bool) -> Result<Arc<Shared>> {
    open_named_grace(name, writable, INIT_GRACE)
}

/// As [`open_named`], waiting at most `grace` for a creator that is still writing the header
/// (zero for listings, which must never wait per object).
pub(crate) fn open_named_grace(name: &str, writable: bool, grace: Duration) -> Result<Arc<Shared>> {
    let fd = shm_open_existing(name, writable)?;
    // An end that opens a named channel may have to remove its name (a read-only view never).
    let duty = if writable {
        NameDuty::Opener(c_name(name)?)
    } else {
        NameDuty::None
    };
    let mut chans = open_mapped(
        name.to_owned(),
        fd,
        writable,
        grace,
        RegionKind::Channel,
        Some(Default::default()),
        duty,
    )?;
    Ok(chans.swap_remove(0))
}

/// Opens an existing named object that belongs to this user and nobody else.
fn shm_open_existing(name: &str, writable: bool) -> Result<OwnedFd> {
    let cname = c_name(name)?;
    use crate::sys::shm::OpenExisting;
    let fd = crate::sys::shm::open_existing(&cname, writable).map_err(|e| match e {
        OpenExisting::NotFound => OpenError::NotFound {
            region: name.to_owned(),
        },
        OpenExisting::NotRegular(found) => OpenError::NotARegion {
            region: name.to_owned(),
            found,
        },
        OpenExisting::Io(e) => OpenError::io(name, "shm_open", e),
    })?;
    check_owner_and_mode(name, &fd)?;
    Ok(fd)
}

/// A named region must belong to this user and be closed to everyone else.
fn check_owner_and_mode(name: &str, fd: &OwnedFd) -> Result<()> {
    let st = crate::sys::shm::stat(fd).map_err(|e| OpenError::io(name, "fstat", e))?;
    let euid = crate::sys::shm::euid();
    if st.uid != euid {
        return Err(OpenError::NotOwner {
            region: name.to_owned(),
            expected: euid,
            found: st.uid,
        });
    }
    if st.mode & 0o077 != 0 {
        return Err(OpenError::BadMode {
            region: name.to_owned(),
            mode: st.mode,
        });
    }
    Ok(())
}

/// Maps and validates a region from a descriptor (named or inherited memfd).
/// How long `open` by name waits for a creator that is between `shm_open` and writing the
/// magic. A descriptor handed over (memfd) is always complete: no wait.
const INIT_GRACE: Duration = Duration::from_millis(500);

///
/// `bells`: the doorbells handed with the descriptor, `None` for a bare descriptor (the region's
/// park words are then marked bell-less: waiters of the peer sleep on the futex).
pub(crate) fn open_fd(
    name: String,
    fd: OwnedFd,
    writable: bool,
    bells: Option<std::sync::Arc<Bells>>,
) -> Result<Arc<Shared>> {
    let mut chans = open_mapped(
        name,
        fd,
        writable,
        Duration::ZERO,
        RegionKind::Channel,
        bells,
        NameDuty::None,
    )?;
    Ok(chans.swap_remove(0))
}

/// How soon `open` looks again at a region its creator is still setting up: a small region
/// is made in about 0.1 ms, a large one in milliseconds. Each wait is twice the one before, up
/// to [`SETTLE_LOOK_MAX`], so that a creator that died half-way costs ~250 looks over the
/// grace, not thousands.
const SETTLE_LOOK: Duration = Duration::from_micros(200);

/// The longest wait between two looks at a region being set up.
const SETTLE_LOOK_MAX: Duration = Duration::from_millis(2);

/// The object's size and a read-only mapping of its first page, once its creator has written
/// the magic (waiting up to `grace` for a creator that is still setting it up).
pub(crate) fn identity(
    name: &str,
    fd: BorrowedFd<'_>,
    grace: Duration,
) -> Result<(u64, u64, memmap2::MmapRaw)> {
    let size_of = || {
        crate::sys::shm::stat(fd)
            .map(|st| st.size)
            .map_err(|e| OpenError::io(name, "fstat", e))
    };
    let mut size = size_of()?;
    // A creator that is still between shm_open and ftruncate shows size 0: give it a moment.
    let start = Instant::now();
    let mut nap = SETTLE_LOOK;
    let mut settle = || {
        // (Never past the grace by more than the look after it.)
        std::thread::sleep(nap.min(grace.saturating_sub(start.elapsed())));
        nap = (nap * 2).min(SETTLE_LOOK_MAX);
    };
    while size == 0 && start.elapsed() < grace {
        settle();
        size = size_of()?;
    }
    if size < HEADER_SIZE as u64 {
        return Err(OpenError::SizeMismatch {
            region: name.to_owned(),
            expected: HEADER_SIZE as u64,
            found: size,
        });
    }
    // Map only the first page: what it says decides how much of the rest to trust.
    let head = map(name, fd, HEADER_SIZE, false)?;
    // SAFETY: the page is mapped, aligned and at least 8 bytes; we only read it atomically.
    let magic_word = unsafe { &*(head.as_ptr() as *const crate::sync::AtomicU64) };
    let mut magic = crate::protocol::abi::load_magic(magic_word);
    while magic == 0 && start.elapsed() < grace {
        settle();
        magic = crate::protocol::abi::load_magic(magic_word);
    }
    Ok((size, magic, head))
}

/// The layout version and header size a header records must be this build's.
fn check_version(name: &str, version: u32, header_size: u32) -> Result<()> {
    if version != LAYOUT_VERSION {
        return Err(OpenError::VersionMismatch {
            region: name.to_owned(),
            expected: LAYOUT_VERSION,
            found: version,
        });
    }
    if header_size as usize != HEADER_SIZE {
        return Err(OpenError::corrupt(
            name,
            "header_size",
            HEADER_SIZE.to_string(),
            header_size as u64,
        ));
    }
    Ok(())
}

/// Checks what a header says against itself and the object: its geometry is within the limits
/// (`validated`; a header's bad value is `Corrupt`, not a configuration error), its recorded
/// total size is what the geometry needs (`size_of`), and the object is that large. Returns
/// the size to map.
fn check_geometry(
    name: &str,
    validated: Result<(), ConfigError>,
    size_of: impl FnOnce() -> usize,
    recorded: u64,
    size: u64,
) -> Result<u64> {
    // A header's bad value is corruption, not a configuration error.
    validated.map_err(|e| {
        OpenError::Corrupt(Box::new(crate::error::CorruptError {
            region: e.region,
            field: e.field,
            expected: e.expected,
            found: e.found.parse().unwrap_or(u64::MAX),
        }))
    })?;
    let expected = size_of() as u64;
    if recorded != expected {
        return Err(OpenError::corrupt(
            name,
            "total_size",
            expected.to_string(),
            recorded,
        ));
    }
    if size != expected {
        return Err(OpenError::SizeMismatch {
            region: name.to_owned(),
            expected,
            found: size,
        });
    }
    Ok(expected)
}

/// `BadMagic` for a region that should be `expected`, naming what `magic` says it is.
fn bad_magic(region: String, expected: crate::error::RegionKind, magic: u64) -> OpenError {
    let found_kind = match magic {
        MAGIC => Some(crate::error::RegionKind::Channel),
        crate::protocol::abi::GATE_MAGIC => Some(crate::error::RegionKind::Gate),
        _ => None,
    };
    OpenError::BadMagic {
        region,
        expected,
        found_kind,
        found: magic,
    }
}

// ----- one path for channels and gates ---------------------------------------------------

/// What a region holds: one channel, or a gate of M channels. Everything else in its layout
/// follows from this.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Shape {
    Channel(Geometry),
    Gate(GateGeometry),
}

impl Shape {
    fn validate(&self, name: &str) -> std::result::Result<(), ConfigError> {
        match self {
            Shape::Channel(g) => g.validate(name),
            Shape::Gate(gg) => gg.validate(name),
        }
    }

    fn region_size(&self) -> usize {
        match self {
            Shape::Channel(g) => g.region_size(),
            Shape::Gate(gg) => gg.region_size(),
        }
    }

    /// Where each channel of the region sits.
    fn placements(&self) -> Vec<Placement> {
        match *self {
            Shape::Channel(g) => vec![Placement::channel(g)],
            Shape::Gate(gg) => (0..gg.channels)
                .map(|c| Placement::gate_channel(gg, c))
                .collect(),
        }
    }

    /// The shape a header page records, for a region whose magic said `kind`.
    fn read(kind: RegionKind, head: &memmap2::MmapRaw) -> (Shape, u32, u32, u64) {
        match kind {
            RegionKind::Channel => {
                // SAFETY: the page is mapped, aligned, and `Header` fits in it (asserted in
                // the ABI); only atomics are read while `head` lives.
                let h = unsafe { &*(head.as_ptr() as *const crate::protocol::abi::Header) };
                let (g, r) = h.recorded();
                (Shape::Channel(g), r.version, r.header_size, r.total_size)
            }
            RegionKind::Gate => {
                // SAFETY: as above, for `GateHeader`.
                let g = unsafe { &*(head.as_ptr() as *const GateHeader) };
                let (gg, r) = g.recorded();
                (Shape::Gate(gg), r.version, r.header_size, r.total_size)
            }
        }
    }
}

fn magic_of(kind: RegionKind) -> u64 {
    match kind {
        RegionKind::Channel => MAGIC,
        RegionKind::Gate => GATE_MAGIC,
    }
}

/// One `Shared` per channel of a region, over one mapping.
fn views(
    name: &str,
    shape: Shape,
    map: memmap2::MmapRaw,
    fd: OwnedFd,
    duty: NameDuty,
    bells: std::sync::Arc<Bells>,
) -> Vec<Arc<Shared>> {
    let base = NonNull::new(map.as_mut_ptr()).expect("mmap never returns null");
    let mapping = std::sync::Arc::new(Mapping {
        _map: map,
        fd,
        name: duty,
        name_settled: Default::default(),
        bells,
    });
    shape
        .placements()
        .into_iter()
        .map(|p| {
            // SAFETY: the mapping is `shape.region_size()` bytes (created or validated so),
            // page aligned, kept alive by `mapping`; the placements come from the same shape.
            Arc::new(unsafe { Shared::new(name.to_owned(), p, base, mapping.clone()) })
        })
        .collect()
}

/// Sizes, maps and initializes a fresh object (creator only, before anyone can see it).
fn create_mapped(
    name: String,
    fd: OwnedFd,
    shape: Shape,
    unlink: Option<CString>,
    bells: std::sync::Arc<Bells>,
) -> Result<Vec<Arc<Shared>>> {
    let map = size_and_map(&name, &fd, shape.region_size(), unlink.as_ref())?;
    let duty = match unlink {
        Some(n) => NameDuty::Creator(n),
        None => NameDuty::None,
    };
    let chans = views(&name, shape, map, fd, duty, bells);
    let pid = std::process::id();
    match shape {
        Shape::Channel(_) => chans[0].init_header(pid),
        Shape::Gate(gg) => crate::region::view::init_gate(
            chans[0].gate.as_ref().expect("gate channel").gate_header(),
            &chans,
            gg,
            pid,
        ),
    }
    Ok(chans)
}

/// Creates a named region (`O_EXCL`, mode 0600) whose `end` liveness lock is taken before
/// the magic is written, so that `shmflow clean` never sees it ownerless.
fn create_named_shape(
    name: &str,
    shape: Shape,
    end: End,
) -> Result<(Vec<Arc<Shared>>, std::sync::Arc<EndLock>)> {
    shape.validate(name)?;
    let (fd, cname, lock) = shm_create(name, lock_byte(None, end), end)?;
    Ok((
        create_mapped(name.to_owned(), fd, shape, Some(cname), Default::default())?,
        std::sync::Arc::new(lock),
    ))
}

/// Creates an anonymous, sealed memfd region for `end`.
fn create_memfd_shape(
    shape: Shape,
    end: End,
) -> Result<(Vec<Arc<Shared>>, std::sync::Arc<EndLock>)> {
    shape.validate("memfd:shmflow")?;
    let (fd, name) = memfd_sealed(shape.region_size())?;
    let lock = EndLock::acquire(&fd, lock_byte(None, end), end, &name)?;
    // Two descriptors per park word; where the process has none to spare (a gate of hundreds
    // of channels under a low descriptor limit), the region goes without doorbells and its
    // async waiters use the bridge thread.
    let bells = Bells::fresh(shape.placements().len()).ok();
    let rings = bells.is_some();
    let bells = std::sync::Arc::new(bells.unwrap_or_default());
    let chans = create_mapped(name, fd, shape, None, bells)?;
    if let (Shape::Gate(_), true) = (shape, rings) {
        // A gate's channels are attached only through their handles, which carry the
        // doorbells (a bare descriptor is refused): its waiters may sleep on them at once. A
        // channel's peer marks its words when it attaches with them.
        for c in &chans {
            crate::protocol::park::mark_ringable(c.consumer_park());
            crate::protocol::park::mark_ringable(c.header().producer_park());
        }
    }
    Ok((chans, std::sync::Arc::new(lock)))
}

/// Maps and validates an existing object that must be a region of `kind`: magic, layout
/// version, geometry and size are checked before anything past the first page is trusted.
fn open_mapped(
    name: String,
    fd: OwnedFd,
    writable: bool,
    grace: Duration,
    kind: RegionKind,
    bells: Option<std::sync::Arc<Bells>>,
    duty: NameDuty,
) -> Result<Vec<Arc<Shared>>> {
    let (size, magic, head) = identity(&name, fd.as_fd(), grace)?;
    if magic != magic_of(kind) {
        return Err(bad_magic(name, kind, magic));
    }
    let (shape, version, header_size, recorded) = Shape::read(kind, &head);
    drop(head);
    check_version(&name, version, header_size)?;
    let expected = check_geometry(
        &name,
        shape.validate(&name),
        || shape.region_size(),
        recorded,
        size,
    )?;
    let map = map(&name, fd.as_fd(), expected as usize, writable)?;
    let bare = bells.is_none();
    let chans = views(&name, shape, map, fd, duty, bells.unwrap_or_default());
    if writable {
        mark_notified_words(&name, &chans, bare)?;
    }
    Ok(chans)
}

/// Tells the peer's async waiters whether this process, which just opened the region from a
/// descriptor, can ring the doorbells of the words it notifies: with its doorbells (`bare`
/// false) they may sleep on them from now on; without, they sleep on the futex. A bare
/// descriptor is refused where a process with the doorbells attached before.
fn mark_notified_words(name: &str, chans: &[Arc<Shared>], bare: bool) -> Result<()> {
    use crate::protocol::park::{mark_bell_less, mark_ringable, ringable};
    let words = || {
        chans
            .iter()
            .flat_map(|c| [c.consumer_park(), c.header().producer_park()])
    };
    if !bare {
        // Only the words whose bells came with the descriptor (a gate's child holds those of
        // its own channel).
        for c in chans.iter().filter(|c| c.producer_bell().is_some()) {
            mark_ringable(c.consumer_park());
            mark_ringable(c.header().producer_park());
        }
        return Ok(());
    }
    // Looked at first, so that a refused descriptor leaves the words as they were (but in a
    // race with the peer's attachment).
    if words().any(ringable) || !words().all(mark_bell_less) {
        return Err(ConfigError::new(
            name,
            "descriptor",
            "the region's handle with its doorbells (PeerHandle::pass_to): a peer that holds \
             them attached before, and may sleep on them",
            "a bare descriptor",
        )
        .into());
    }
    Ok(())
}

/// Creates a named gate and takes the consumer's liveness lock on it.
pub(crate) fn gate_create_named(
    name: &str,
    gg: GateGeometry,
) -> Result<(Vec<Arc<Shared>>, std::sync::Arc<EndLock>)> {
    create_named_shape(name, Shape::Gate(gg), End::Consumer)
}

/// Creates an anonymous (sealed memfd) gate and takes the consumer's liveness lock on it.
pub(crate) fn gate_create_memfd(
    gg: GateGeometry,
) -> Result<(Vec<Arc<Shared>>, std::sync::Arc<EndLock>)> {
    create_memfd_shape(Shape::Gate(gg), End::Consumer)
}

/// Opens a named gate (every channel).
pub(crate) fn gate_open_named(name: &str, writable: bool) -> Result<Vec<Arc<Shared>>> {
    gate_open_named_grace(name, writable, INIT_GRACE)
}

/// As [`gate_open_named`], waiting at most `grace` (see [`open_named_grace`]).
pub(crate) fn gate_open_named_grace(
    name: &str,
    writable: bool,
    grace: Duration,
) -> Result<Vec<Arc<Shared>>> {
    let fd = shm_open_existing(name, writable)?;
    open_mapped(
        name.to_owned(),
        fd,
        writable,
        grace,
        RegionKind::Gate,
        Some(Default::default()),
        NameDuty::None,
    )
}

/// Opens a gate from an inherited descriptor (every channel).
/// `bells` as for [`open_fd`].
pub(crate) fn gate_open_fd(
    name: String,
    fd: OwnedFd,
    writable: bool,
    bells: Option<std::sync::Arc<Bells>>,
) -> Result<Vec<Arc<Shared>>> {
    open_mapped(
        name,
        fd,
        writable,
        Duration::ZERO,
        RegionKind::Gate,
        bells,
        NameDuty::None,
    )
}

/// Picks channel `c` out of a gate's channels.
pub(crate) fn pick_channel(
    mut chans: Vec<Arc<Shared>>,
    c: u32,
    name: &str,
) -> Result<Arc<Shared>, OpenError> {
    if c as usize >= chans.len() {
        return Err(ConfigError::new(
            name,
            "channel",
            format!("below {} (the gate's channel count)", chans.len()),
            c,
        )
        .into());
    }
    Ok(chans.swap_remove(c as usize))
}

/// Checks, without taking it, that a descriptor handed to this process is a shmflow region of
/// `kind`: a regular file (or memfd) with the right magic. Nothing of it is changed; on an
/// error the descriptor stays the caller's, open and usable.
pub(crate) fn probe(name: &str, fd: BorrowedFd<'_>, kind: RegionKind) -> Result<()> {
    let st = crate::sys::shm::stat(fd).map_err(|e| OpenError::io(name, "fstat", e))?;
    if let Some(found) = st.not_regular {
        return Err(OpenError::NotARegion {
            region: name.to_owned(),
            found,
        });
    }
    // A region handed over by descriptor is a memfd sealed against shrinking: one its creator
    // could still shrink would make this end's reads fail with SIGBUS.
    if !crate::sys::shm::sealed_against_shrinking(fd) {
        return Err(OpenError::NotARegion {
            region: name.to_owned(),
            found: "an object that is not sealed against shrinking (a region handed over by \
                    descriptor is a sealed memfd)",
        });
    }
    let (_, magic, _head) = identity(name, fd, Duration::ZERO)?;
    if magic != magic_of(kind) {
        return Err(bad_magic(name.to_owned(), kind, magic));
    }
    Ok(())
}

/// Never a channel's magic: a gate's channel headers carry the gate's.
const _: () = assert!(MAGIC != GATE_MAGIC);
