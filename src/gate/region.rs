//! Creating and opening gate regions (the layout is in `layout.rs`). The rules are a channel's
//! (see `crate::region`): `O_EXCL` and mode 0600, the creator unlinks the name, everything is
//! validated before use. The gate's consumer creates it; each channel's producer opens it.

use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::time::Duration;

use super::layout::{GateGeometry, GateHeader, GATE_MAGIC};
use crate::error::{End, OpenError, RegionKind};

type Result<T, E = OpenError> = std::result::Result<T, E>;
use crate::layout::MAGIC;
use crate::liveness::{lock_byte, EndLock};
use crate::region::{self, Mapping};
use crate::shared::Shared;
use crate::sync::{Arc, Ordering};

/// One `Shared` per channel over one mapping.
fn channels(
    name: &str,
    gg: GateGeometry,
    map: memmap2::MmapRaw,
    fd: OwnedFd,
    unlink: Option<std::ffi::CString>,
) -> Vec<Arc<Shared>> {
    let base = NonNull::new(map.as_mut_ptr()).expect("mmap never returns null");
    let mapping = std::sync::Arc::new(Mapping {
        _map: map,
        fd,
        unlink,
    });
    (0..gg.channels)
        .map(|c| {
            // SAFETY: the mapping is `gg.region_size()` bytes (created or validated so),
            // page aligned, kept alive by `mapping`; c < channels.
            Arc::new(unsafe { Shared::gate_channel(name.to_owned(), gg, c, base, mapping.clone()) })
        })
        .collect()
}

fn create(
    name: String,
    fd: OwnedFd,
    gg: GateGeometry,
    unlink: Option<std::ffi::CString>,
) -> Result<Vec<Arc<Shared>>> {
    let map = region::size_and_map(&name, &fd, gg.region_size(), unlink.as_ref())?;
    let chans = channels(&name, gg, map, fd, unlink);
    super::init(
        chans[0].gate.as_ref().expect("gate channel").gate_header(),
        &chans,
        gg,
        std::process::id(),
    );
    Ok(chans)
}

/// Creates a named gate and takes the consumer's liveness lock on it.
pub(crate) fn create_named(
    name: &str,
    gg: GateGeometry,
) -> Result<(Vec<Arc<Shared>>, std::sync::Arc<EndLock>)> {
    gg.validate(name)?;
    let (fd, cname, lock) =
        region::shm_create(name, lock_byte(None, End::Consumer), End::Consumer)?;
    Ok((
        create(name.to_owned(), fd, gg, Some(cname))?,
        std::sync::Arc::new(lock),
    ))
}

/// Creates an anonymous (sealed memfd) gate and takes the consumer's liveness lock on it.
pub(crate) fn create_memfd(
    gg: GateGeometry,
) -> Result<(Vec<Arc<Shared>>, std::sync::Arc<EndLock>)> {
    gg.validate("memfd:shmflow")?;
    let (fd, name) = region::memfd_sealed(gg.region_size())?;
    let lock = EndLock::acquire(&fd, lock_byte(None, End::Consumer), End::Consumer, &name)?;
    Ok((create(name, fd, gg, None)?, std::sync::Arc::new(lock)))
}

/// Opens a named gate (every channel).
pub(crate) fn open_named(name: &str, writable: bool) -> Result<Vec<Arc<Shared>>> {
    let fd = region::shm_open_existing(name, writable)?;
    open_inner(name.to_owned(), fd, writable, region::INIT_GRACE)
}

/// Opens a gate from an inherited descriptor (every channel).
pub(crate) fn open_fd(name: String, fd: OwnedFd, writable: bool) -> Result<Vec<Arc<Shared>>> {
    open_inner(name, fd, writable, Duration::ZERO)
}

fn open_inner(
    name: String,
    fd: OwnedFd,
    writable: bool,
    grace: Duration,
) -> Result<Vec<Arc<Shared>>> {
    let (size, magic, head) = region::identity(&name, &fd, grace)?;
    if magic != GATE_MAGIC {
        return Err(region::bad_magic(name, RegionKind::Gate, magic));
    }
    // SAFETY: the first page is mapped and `GateHeader` fits in it; only atomics are read.
    let g = unsafe { &*(head.as_ptr() as *const GateHeader) };
    region::check_version(
        &name,
        g.version.load(Ordering::Relaxed),
        g.header_size.load(Ordering::Relaxed),
    )?;
    let gg = GateGeometry {
        channels: g.channels.load(Ordering::Relaxed),
        exclusive: g.exclusive.load(Ordering::Relaxed),
        floating: g.floating.load(Ordering::Relaxed),
        segment_size: g.segment_size.load(Ordering::Relaxed),
    };
    let recorded = g.total_size.load(Ordering::Relaxed);
    drop(head);
    let expected = region::check_geometry(
        &name,
        gg.validate(&name),
        || gg.region_size(),
        recorded,
        size,
    )?;
    let map = region::map(&name, &fd, expected as usize, writable)?;
    Ok(channels(&name, gg, map, fd, None))
}

/// Never a channel's magic: a gate's channel headers carry the gate's.
const _: () = assert!(MAGIC != GATE_MAGIC);
