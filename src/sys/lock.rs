//! Open-file-description (OFD) byte locks: the kernel drops them when the last descriptor of
//! the open file description closes, however the process dies.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::stat::Mode;

fn flock(kind: i32, byte: i64) -> libc::flock {
    // SAFETY: flock is plain data; zero is a valid value for every field.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = byte;
    fl.l_len = 1;
    fl
}

/// A new open file description of the object behind `fd` (through `/proc/self/fd`), so that
/// its locks are its own.
pub(crate) fn reopen(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    nix::fcntl::open(
        path.as_str(),
        OFlag::O_RDWR | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(super::io)
}

/// Write-locks `byte`; `Ok(false)` if another open file description holds it.
pub(crate) fn try_lock(fd: BorrowedFd<'_>, byte: i64) -> io::Result<bool> {
    let fl = flock(libc::F_WRLCK, byte);
    match fcntl(fd, FcntlArg::F_OFD_SETLK(&fl)) {
        Ok(_) => Ok(true),
        Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EACCES) => Ok(false),
        Err(e) => Err(super::io(e)),
    }
}

/// Releases `byte` (failure leaves the close to release it).
pub(crate) fn unlock(fd: BorrowedFd<'_>, byte: i64) {
    let fl = flock(libc::F_UNLCK, byte);
    let _ = fcntl(fd, FcntlArg::F_OFD_SETLK(&fl));
}

/// True if an open file description other than `fd`'s holds the lock on `byte`.
pub(crate) fn locked_by_other(fd: impl AsFd, byte: i64) -> io::Result<bool> {
    let mut fl = flock(libc::F_WRLCK, byte);
    fcntl(fd.as_fd(), FcntlArg::F_OFD_GETLK(&mut fl)).map_err(super::io)?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}
