//! Sockets: a read that does not wait, a write that raises no `SIGPIPE`.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::sys::socket::{recv, sendmsg, MsgFlags};

/// Writes what the socket takes of `bufs` now or as its send timeout allows (as `writev` does),
/// without `SIGPIPE` when the peer has gone: that is `EPIPE` here, an error like any other,
/// whatever the process does with the signal (a host that has not ignored it would be killed
/// by `writev`).
pub(crate) fn send_vectored(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    sendmsg::<()>(fd.as_raw_fd(), bufs, &[], MsgFlags::MSG_NOSIGNAL, None).map_err(super::io)
}

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

/// Tells which of many sockets got something to read since it last said so (edge-triggered
/// `epoll`), and can be woken to stop.
pub(crate) struct Edges {
    epoll: nix::sys::epoll::Epoll,
    stop: nix::sys::eventfd::EventFd,
}

/// The token [`Edges::wait`] never gives for a socket: the stop.
const STOP: u64 = u64::MAX;

impl Edges {
    pub(crate) fn new() -> io::Result<Edges> {
        use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
        use nix::sys::eventfd::{EfdFlags, EventFd};
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(super::io)?;
        let stop = EventFd::from_flags(EfdFlags::EFD_CLOEXEC).map_err(super::io)?;
        epoll
            .add(&stop, EpollEvent::new(EpollFlags::EPOLLIN, STOP))
            .map_err(super::io)?;
        Ok(Edges { epoll, stop })
    }

    /// Watches `fd`: [`Edges::wait`] gives `token` each time bytes arrive on it, or it is
    /// closed or fails. The watch ends when the socket is closed (by every descriptor).
    pub(crate) fn add(&self, fd: BorrowedFd<'_>, token: u64) -> io::Result<()> {
        use nix::sys::epoll::{EpollEvent, EpollFlags};
        debug_assert_ne!(token, STOP);
        let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLET;
        self.epoll
            .add(fd, EpollEvent::new(flags, token))
            .map_err(super::io)
    }

    /// Waits until sockets got something, and puts their tokens in `out` (cleared first).
    /// `Ok(false)`: [`Edges::stop`] was called.
    pub(crate) fn wait(&self, out: &mut Vec<u64>) -> io::Result<bool> {
        use nix::sys::epoll::{EpollEvent, EpollTimeout};
        out.clear();
        let mut events = [EpollEvent::empty(); 16];
        let n = match self.epoll.wait(&mut events, EpollTimeout::NONE) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => return Ok(true),
            Err(e) => return Err(super::io(e)),
        };
        for e in &events[..n] {
            if e.data() == STOP {
                return Ok(false);
            }
            out.push(e.data());
        }
        Ok(true)
    }

    /// Makes every [`Edges::wait`], now or later, return `Ok(false)`.
    pub(crate) fn stop(&self) {
        let _ = self.stop.write(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    /// Runs `write` on a socket whose peer has gone, with `SIGPIPE` blocked in this thread so
    /// that one raised stays pending where it can be seen (a blocked signal is never
    /// discarded, even when ignored): its result, and whether it raised the signal (taken
    /// back before the mask is restored).
    fn raises_sigpipe(
        write: impl FnOnce(BorrowedFd<'_>) -> io::Result<usize>,
    ) -> (io::Result<usize>, bool) {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        drop(b);
        // SAFETY: signal sets are plain data, initialised by `sigemptyset` before use; the
        // mask changed is this thread's, and restored below.
        unsafe {
            let mut pipe: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            let mut pending: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut pipe);
            libc::sigaddset(&mut pipe, libc::SIGPIPE);
            assert_eq!(libc::pthread_sigmask(libc::SIG_BLOCK, &pipe, &mut old), 0);
            let r = write(a.as_fd());
            libc::sigemptyset(&mut pending);
            assert_eq!(libc::sigpending(&mut pending), 0);
            let raised = libc::sigismember(&pending, libc::SIGPIPE) == 1;
            if raised {
                let zero = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                libc::sigtimedwait(&pipe, std::ptr::null_mut(), &zero);
            }
            assert_eq!(
                libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()),
                0
            );
            (r, raised)
        }
    }

    #[test]
    fn a_write_to_a_peer_that_has_gone_is_an_error_not_a_signal() {
        let bufs = [IoSlice::new(b"head"), IoSlice::new(b"frames")];
        let (r, raised) = raises_sigpipe(|fd| send_vectored(fd, &bufs));
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EPIPE));
        assert!(!raised, "send_vectored raised SIGPIPE");
        // What it replaces does raise it (so the look above can see one).
        let (r, raised) = raises_sigpipe(|fd| {
            let f = std::fs::File::from(fd.try_clone_to_owned().unwrap());
            (&f).write_vectored(&bufs)
        });
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EPIPE));
        assert!(
            raised,
            "writev to a closed socket raised no SIGPIPE: the look cannot see one"
        );
    }

    #[test]
    fn edges_tell_which_socket_got_bytes_and_stop_when_told() {
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (mut c, d) = std::os::unix::net::UnixStream::pair().unwrap();
        let edges = std::sync::Arc::new(Edges::new().unwrap());
        edges.add(b.as_fd(), 7).unwrap();
        edges.add(d.as_fd(), 9).unwrap();
        let mut got = Vec::new();
        c.write_all(b"x").unwrap();
        assert!(edges.wait(&mut got).unwrap());
        assert_eq!(got, [9]);
        // Edge-triggered: the unread byte is not told again, a new one is.
        a.write_all(b"y").unwrap();
        assert!(edges.wait(&mut got).unwrap());
        assert_eq!(got, [7]);
        let e = edges.clone();
        let waiter = std::thread::spawn(move || e.wait(&mut Vec::new()).unwrap());
        edges.stop();
        assert!(!waiter.join().unwrap());
        drop((b, d));
    }
}
