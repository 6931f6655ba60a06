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

/// Why an existing name could not be opened as a shared-memory object.
#[derive(Debug)]
pub(crate) enum OpenExisting {
    /// No object of that name.
    NotFound,
    /// The name is something else: what it is.
    NotRegular(&'static str),
    /// The open failed otherwise.
    Io(io::Error),
}

fn kind_of(mode: libc::mode_t) -> Option<&'static str> {
    match mode & libc::S_IFMT {
        libc::S_IFREG => None,
        libc::S_IFDIR => Some("a directory"),
        libc::S_IFIFO => Some("a FIFO"),
        libc::S_IFSOCK => Some("a socket"),
        libc::S_IFCHR => Some("a character device"),
        libc::S_IFBLK => Some("a block device"),
        libc::S_IFLNK => Some("a symbolic link"),
        _ => Some("not a regular file"),
    }
}

/// Opens an existing `name`, read-write or read-only, close-on-exec, only if it is a regular
/// file (a shared-memory object). It first looks at the name without opening what it names
/// (`O_PATH | O_NOFOLLOW`: no blocking on a FIFO, no side effect of opening a device, no
/// following of a link), then opens it without blocking and checks that it is still the same
/// object.
pub(crate) fn open_existing(name: &CStr, writable: bool) -> Result<OwnedFd, OpenExisting> {
    let path = format!("/dev/shm{}", name.to_string_lossy());
    let probe = nix::fcntl::open(
        path.as_str(),
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        nix::errno::Errno::ENOENT => OpenExisting::NotFound,
        e => OpenExisting::Io(super::io(e)),
    })?;
    let before = fstat(probe.as_fd()).map_err(|e| OpenExisting::Io(super::io(e)))?;
    if let Some(kind) = kind_of(before.st_mode) {
        return Err(OpenExisting::NotRegular(kind));
    }
    let rw = if writable {
        OFlag::O_RDWR
    } else {
        OFlag::O_RDONLY
    };
    let fd = nix::sys::mman::shm_open(
        name,
        rw | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        nix::errno::Errno::ENOENT => OpenExisting::NotFound,
        nix::errno::Errno::ELOOP => OpenExisting::NotRegular("a symbolic link"),
        nix::errno::Errno::ENXIO => OpenExisting::NotRegular("a socket"),
        nix::errno::Errno::EISDIR => OpenExisting::NotRegular("a directory"),
        e => OpenExisting::Io(super::io(e)),
    })?;
    let after = fstat(fd.as_fd()).map_err(|e| OpenExisting::Io(super::io(e)))?;
    if let Some(kind) = kind_of(after.st_mode) {
        return Err(OpenExisting::NotRegular(kind));
    }
    if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino) {
        return Err(OpenExisting::NotRegular(
            "an object that was replaced while it was being opened",
        ));
    }
    Ok(fd)
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

/// True if the object is sealed against shrinking (a memfd made by `create_anonymous`); false
/// for an object that cannot be sealed or is not sealed.
pub(crate) fn sealed_against_shrinking(fd: impl AsFd) -> bool {
    match fcntl(fd.as_fd(), FcntlArg::F_GET_SEALS) {
        Ok(bits) => SealFlag::from_bits_truncate(bits).contains(SealFlag::F_SEAL_SHRINK),
        Err(_) => false,
    }
}

/// Sets the object's size.
pub(crate) fn set_len(fd: impl AsFd, len: u64) -> io::Result<()> {
    nix::unistd::ftruncate(fd, len as libc::off_t).map_err(super::io)
}

/// Reserves the object's first `len` bytes: the memory behind them is allocated now, so that
/// a tmpfs that is full or a memory cgroup at its limit fails here (`ENOSPC`, `ENOMEM`)
/// rather than with SIGBUS or the OOM killer at the first touch of a page later.
/// A file system without `fallocate` (not tmpfs) is left as it was: nothing to reserve there.
pub(crate) fn reserve(fd: impl AsFd, len: u64) -> io::Result<()> {
    loop {
        match nix::fcntl::fallocate(
            fd.as_fd(),
            nix::fcntl::FallocateFlags::empty(),
            0,
            len as libc::off_t,
        ) {
            Ok(()) => return Ok(()),
            // tmpfs stops when a signal is pending: the pages reserved so far stay, go on.
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EOPNOTSUPP) => return Ok(()),
            Err(e) => return Err(super::io(e)),
        }
    }
}

/// True if `reserve` failed for want of memory (`ENOSPC` from a full tmpfs, `ENOMEM` from a
/// memory cgroup at its limit), not for another reason.
pub(crate) fn out_of_memory(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::ENOMEM))
}

/// What `fstat` says about an object.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stat {
    pub(crate) size: u64,
    pub(crate) uid: u32,
    /// Permission bits (`& 0o777`).
    pub(crate) mode: u32,
    /// `None` for a regular file (or memfd), else what the object is.
    pub(crate) not_regular: Option<&'static str>,
}

pub(crate) fn stat(fd: impl AsFd) -> io::Result<Stat> {
    let st = fstat(fd.as_fd()).map_err(super::io)?;
    Ok(Stat {
        size: st.st_size as u64,
        uid: st.st_uid,
        mode: st.st_mode & 0o777,
        not_regular: kind_of(st.st_mode),
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
