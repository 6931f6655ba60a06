//! Doorbells: a connected pair of Unix datagram sockets per park word. A notifier rings by
//! sending a byte on one end; an async waiter sleeps, in its runtime's reactor, until the other
//! end is readable. Sockets rather than an eventfd because each call can be made non-blocking
//! by itself (`MSG_DONTWAIT`): the ends are shared with the peer process, which could clear
//! `O_NONBLOCK` on an eventfd's shared file and make a notifier's write wait forever.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::sys::socket::{
    getsockname, getsockopt, send, socketpair, sockopt, AddressFamily, MsgFlags, SockFlag,
    SockType, SockaddrLike, SockaddrStorage,
};

/// How many rings one wait reads at most (a peer that floods the socket costs the waiter a
/// bounded amount of work per wake-up).
#[cfg(feature = "tokio")]
const DRAIN_MAX: usize = 64;

/// A fresh doorbell: (the end a waiter watches, the end notifiers ring), close-on-exec and
/// non-blocking.
pub(crate) fn create() -> io::Result<(OwnedFd, OwnedFd)> {
    let (wait, ring) = socketpair(
        AddressFamily::Unix,
        SockType::Datagram,
        None,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
    )
    .map_err(super::io)?;
    Ok((wait, ring))
}

/// Rings: one byte on the ring end, never blocking. A full queue (`EAGAIN`) is already
/// readable, so it counts as a ring; any other failure leaves nothing to do.
pub(crate) fn ring(fd: BorrowedFd<'_>) {
    let _ = send(
        fd.as_raw_fd(),
        &[1],
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
    );
}

/// Takes the rings waiting on the wait end (at most [`DRAIN_MAX`]), never blocking: true if
/// there was one. Only async waiters read their doorbells.
#[cfg(feature = "tokio")]
pub(crate) fn drain(fd: BorrowedFd<'_>) -> bool {
    use nix::sys::socket::recv;
    let mut buf = [0u8; 8];
    let mut got = false;
    for _ in 0..DRAIN_MAX {
        match recv(fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            Ok(n) if n > 0 => got = true,
            // An empty read (the end shut down by the peer), `EAGAIN`, or an error.
            _ => break,
        }
    }
    got
}

/// True if `raw` is an open Unix datagram socket of this process.
pub(crate) fn is_bell(raw: RawFd) -> bool {
    crate::sys::fd::with_borrowed(raw, |fd| {
        getsockopt(&fd, sockopt::SockType).is_ok_and(|t| t == SockType::Datagram)
            && getsockname::<SockaddrStorage>(raw)
                .is_ok_and(|a| a.family() == Some(AddressFamily::Unix))
    })
    .unwrap_or(false)
}
