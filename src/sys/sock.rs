//! Sockets: a read that does not wait.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::sys::socket::{recv, MsgFlags};

/// Reads what the socket holds now into `buf`, without waiting: `Ok(0)` is the end of the
/// stream, `ErrorKind::WouldBlock` means nothing is there yet.
pub(crate) fn recv_now(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    recv(fd.as_raw_fd(), buf, MsgFlags::MSG_DONTWAIT).map_err(super::io)
}
