//! Sockets: a read that does not wait.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::sys::socket::{recv, MsgFlags};

/// Reads what the socket holds now into `buf`, without waiting: `Ok(0)` is the end of the
/// stream, `ErrorKind::WouldBlock` means nothing is there yet.
pub(crate) fn recv_now(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    recv(fd.as_raw_fd(), buf, MsgFlags::MSG_DONTWAIT).map_err(super::io)
}

/// Waits up to `timeout` until one of `fds` has something to read (or is closed or failed,
/// or, for a listening socket, has a connection to accept): which ones have (all false when
/// the time ran out or a signal came).
pub(crate) fn wait_any_readable(
    fds: &[BorrowedFd<'_>],
    timeout: std::time::Duration,
) -> io::Result<Vec<bool>> {
    let mut ps: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: `ps` holds `ps.len()` valid `pollfd`s, for descriptors the caller borrows for
    // the call.
    let n = unsafe { libc::poll(ps.as_mut_ptr(), ps.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(vec![false; fds.len()])
        } else {
            Err(e)
        };
    }
    Ok(ps.iter().map(|p| p.revents != 0).collect())
}

/// Waits up to `timeout` until the socket has something to read (or is closed or failed):
/// true if it has.
pub(crate) fn wait_readable(fd: BorrowedFd<'_>, timeout: std::time::Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: one valid `pollfd`, for a descriptor the caller borrows for the call.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(n > 0)
}
