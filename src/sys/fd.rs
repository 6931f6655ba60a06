//! Descriptors handed between processes.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::fcntl::{fcntl, FcntlArg, FdFlag};

/// True if `raw` is an open descriptor of this process.
pub(crate) fn is_open(raw: RawFd) -> bool {
    fd_flags(raw).is_some()
}

/// The descriptor flags of `raw`, `None` if it is not open.
fn fd_flags(raw: RawFd) -> Option<libc::c_int> {
    if raw < 0 {
        return None;
    }
    // SAFETY: F_GETFD on a plain number reads no memory and changes nothing; a number that is
    // not open fails with EBADF, which is the answer. (No `BorrowedFd` is made for a number
    // that may not be open.)
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFD) };
    (flags >= 0).then_some(flags)
}

/// True if `raw` is open and was handed to this process across an exec: its close-on-exec
/// flag is clear, as `PeerHandle::pass_to` leaves it. Everything shmflow and Rust's std open
/// has the flag set, so a number that names one of them is refused (taking it would make two
/// owners of one descriptor).
pub(crate) fn is_inherited(raw: RawFd) -> bool {
    fd_flags(raw).is_some_and(|f| f & libc::FD_CLOEXEC == 0)
}

/// Runs `f` with `raw` borrowed, if `raw` is an open descriptor of this process (`None` if
/// not). Nothing is taken: `raw` stays open whatever `f` returns.
pub(crate) fn with_borrowed<R>(raw: RawFd, f: impl FnOnce(BorrowedFd<'_>) -> R) -> Option<R> {
    if !is_open(raw) {
        return None;
    }
    // SAFETY: `raw` is open (just checked) and nothing in this function closes it; the borrow
    // does not outlive `f`.
    let fd = unsafe { BorrowedFd::borrow_raw(raw) };
    Some(f(fd))
}

/// A descriptor of our own for the object behind `fd` (`F_DUPFD_CLOEXEC`).
pub(crate) fn dup(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    fd.try_clone_to_owned()
}

/// Takes ownership of an inherited descriptor and marks it close-on-exec, so that it leaks
/// into no child of ours.
///
/// # Safety
/// `raw` must be open and owned by nobody else in this process (inherited, not opened here).
pub(crate) unsafe fn adopt(raw: RawFd) -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: the caller's promise.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    fcntl(&fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).map_err(super::io)?;
    Ok(fd)
}

/// Makes the child that `cmd` spawns inherit `fd`, which `cmd` now owns (it is closed when
/// `cmd` is dropped): returns its number.
pub(crate) fn inherit_owned_in_child(cmd: &mut Command, fd: OwnedFd) -> RawFd {
    use std::os::fd::AsRawFd;
    let raw = fd.as_raw_fd();
    // SAFETY: as in `inherit_in_child`; the closure owns `fd`, so it stays open until `cmd`
    // (which owns the closure) is dropped, after any spawn.
    unsafe {
        cmd.pre_exec(move || {
            fcntl(&fd, FcntlArg::F_SETFD(FdFlag::empty()))
                .map(|_| ())
                .map_err(super::io)
        });
    }
    raw
}

/// Makes the child that `cmd` spawns inherit `raw` (its close-on-exec flag is cleared between
/// fork and exec, in that child only). `raw` must stay open in this process until the spawn.
pub(crate) fn inherit_in_child(cmd: &mut Command, raw: RawFd) {
    // SAFETY: the closure runs in the child between fork and exec and calls only fcntl, which
    // is async-signal-safe, on a descriptor the child inherited open.
    unsafe {
        cmd.pre_exec(move || {
            let fd = BorrowedFd::borrow_raw(raw);
            fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty()))
                .map(|_| ())
                .map_err(super::io)
        });
    }
}
