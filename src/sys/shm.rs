//! POSIX shared-memory objects, sealed memfds, their size and owner, and mappings.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::fcntl::{fcntl, FcntlArg, OFlag, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::stat::{fchmod, fstat, Mode};

/// Creates `name` (`O_CREAT | O_EXCL`, read-write, close-on-exec) with exactly `mode` (the
/// umask may have removed bits; `fchmod` makes the mode exact). `ErrorKind::AlreadyExists` if
/// the name is taken.
pub(crate) fn create_excl(name: &CStr, mode: u32) -> io::Result<OwnedFd> {
    let m = Mode::from_bits_truncate(mode as libc::mode_t);
    let fd = nix::sys::mman::shm_open(
        name,
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR | OFlag::O_CLOEXEC,
        m,
    )
    .map_err(super::io)?;
    fchmod(fd.as_fd(), m).map_err(super::io)?;
    Ok(fd)
}

/// Opens an existing `name`, read-write or read-only, close-on-exec.
pub(crate) fn open_existing(name: &CStr, writable: bool) -> io::Result<OwnedFd> {
    let rw = if writable {
        OFlag::O_RDWR
    } else {
        OFlag::O_RDONLY
    };
    nix::sys::mman::shm_open(name, rw | OFlag::O_CLOEXEC, Mode::empty()).map_err(super::io)
}

/// Removes `name`.
pub(crate) fn unlink(name: &CStr) -> io::Result<()> {
    nix::sys::mman::shm_unlink(name).map_err(super::io)
}

/// A fresh memfd that can be sealed, close-on-exec.
pub(crate) fn memfd(name: &CStr) -> io::Result<OwnedFd> {
    memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING).map_err(super::io)
}

/// Seals a memfd's size: it can never shrink or grow under a peer's mapping (no SIGBUS).
pub(crate) fn seal_size(fd: impl AsFd) -> io::Result<()> {
    fcntl(
        fd.as_fd(),
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
        ),
    )
    .map(|_| ())
    .map_err(super::io)
}

/// Sets the object's size.
pub(crate) fn set_len(fd: impl AsFd, len: u64) -> io::Result<()> {
    nix::unistd::ftruncate(fd, len as libc::off_t).map_err(super::io)
}

/// What `fstat` says about an object.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stat {
    pub(crate) size: u64,
    pub(crate) uid: u32,
    /// Permission bits (`& 0o777`).
    pub(crate) mode: u32,
}

pub(crate) fn stat(fd: impl AsFd) -> io::Result<Stat> {
    let st = fstat(fd.as_fd()).map_err(super::io)?;
    Ok(Stat {
        size: st.st_size as u64,
        uid: st.st_uid,
        mode: st.st_mode & 0o777,
    })
}

/// This process's effective uid.
pub(crate) fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Maps `len` bytes of `fd` shared, prefaulted (the first touch of each page would otherwise
/// happen on the hot path), read-write or read-only.
pub(crate) fn map(fd: impl AsFd, len: usize, writable: bool) -> io::Result<memmap2::MmapRaw> {
    let mut opts = memmap2::MmapOptions::new();
    opts.len(len);
    opts.populate();
    let raw = fd.as_fd().as_raw_fd();
    if writable {
        opts.map_raw(raw)
    } else {
        opts.map_raw_read_only(raw)
    }
}
