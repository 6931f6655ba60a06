//! Is the peer process alive? Each attached end holds an open-file-description (OFD) write
//! lock on one byte of the region's object — the producer byte 0, the consumer byte 1 — on a
//! descriptor it opened for itself and never shares. The kernel drops the lock when the last
//! descriptor of that open file description closes, which happens when the process dies,
//! however it dies. So "state says attached, but nobody holds the lock" means the peer died
//! without detaching. Unlike a pid, a lock cannot be fooled by pid reuse.
//!
//! The check is a syscall, made only by a side that is already waiting for its peer (at most
//! every [`CHECK_INTERVAL`]), never on the hot path.

#![cfg_attr(shmflow_loom, allow(dead_code))]

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use crate::error::{peer_dead, peer_never_attached, sys, End, Lost, OpenError};
use crate::protocol::ends::EndState;

pub(crate) use crate::protocol::park::CHECK_INTERVAL;

/// The byte `end` locks: in a single channel the producer 0 and the consumer 1; in a gate the
/// consumer 1 and the producer of channel `c` byte `2 + c`.
pub(crate) fn lock_byte(channel: Option<u32>, end: End) -> i64 {
    match (end, channel) {
        (End::Consumer, _) => 1,
        (End::Producer, None) => 0,
        (End::Producer, Some(c)) => 2 + c as i64,
    }
}

/// Where the handle of an anonymous region locks for the peer end whose byte is `end_byte`
/// (far past the end bytes, which run from 0 up to 2 + the gate's channels).
pub(crate) fn handle_byte(end_byte: i64) -> i64 {
    (1 << 40) + end_byte
}

/// A descriptor for a [`PeerHandle`](crate::PeerHandle) of the object behind `fd`: a new open
/// file description that write-locks [`handle_byte`]`(end_byte)`. The lock lives as long as
/// some process holds a descriptor of it: the handle, and the copies a child inherits or a
/// socket carries. The creator's end, whose peer has not attached, looks at it: once it is
/// gone, no peer can come.
pub(crate) fn handle_fd(fd: &OwnedFd, end_byte: i64, region: &str) -> Result<OwnedFd, OpenError> {
    match reopen_locked(
        fd,
        handle_byte(end_byte),
        "reopening the region for its handle",
        region,
    )? {
        Some(own) => Ok(own),
        // Each end's handle is made once, by the process that created the region, which
        // holds nothing else there: another holder would be a second handle of the end.
        None => Err(OpenError::io(
            region,
            "locking the handle of a fresh region",
            std::io::Error::from(std::io::ErrorKind::AlreadyExists),
        )),
    }
}

/// A new open file description of the object behind `fd`, with `byte` write-locked on it
/// (`None`: another open file description holds the lock). `reopening` names the step in
/// errors.
fn reopen_locked(
    fd: &OwnedFd,
    byte: i64,
    reopening: &'static str,
    region: &str,
) -> Result<Option<OwnedFd>, OpenError> {
    let own =
        crate::sys::lock::reopen(fd.as_fd()).map_err(|e| OpenError::io(region, reopening, e))?;
    match crate::sys::lock::try_lock(own.as_fd(), byte) {
        Ok(true) => Ok(Some(own)),
        Ok(false) => Ok(None),
        Err(e) => Err(OpenError::io(region, "fcntl(F_OFD_SETLK)", e)),
    }
}

/// The lock that says "this end is alive", on a private open file description.
pub(crate) struct EndLock {
    fd: OwnedFd,
    byte: i64,
}

impl EndLock {
    /// Opens a new open file description of the object behind `fd` and write-locks `byte`
    /// (see [`lock_byte`]) for `end`. If another live process holds it, that end is taken.
    pub(crate) fn acquire(
        fd: &OwnedFd,
        byte: i64,
        end: End,
        region: &str,
    ) -> Result<EndLock, OpenError> {
        match reopen_locked(
            fd,
            byte,
            "reopening the region for its liveness lock",
            region,
        )? {
            Some(own) => Ok(EndLock { fd: own, byte }),
            None => Err(OpenError::AlreadyAttached {
                region: region.to_owned(),
                end,
                pid: 0,
            }),
        }
    }

    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.fd
    }
}

impl Drop for EndLock {
    /// Unlocks explicitly rather than relying on the close: a child forked by another thread
    /// of this process shares the open file description until it execs (or for good, if it
    /// never execs), and the lock lives as long as any descriptor of it. An explicit unlock
    /// through any of them releases it, so a clean detach is seen at once.
    fn drop(&mut self) {
        crate::sys::lock::unlock(self.fd.as_fd(), self.byte);
    }
}

/// True if some open file description other than `fd`'s holds the lock on `byte`.
pub(crate) fn end_locked(fd: &OwnedFd, byte: i64) -> io::Result<bool> {
    crate::sys::lock::locked_by_other(fd, byte)
}

/// What an end knows about its peer's life.
pub(crate) struct Liveness {
    /// Our own lock (shared by the channels of a gate's consumer); its descriptor asks about
    /// the peer's.
    lock: std::sync::Arc<EndLock>,
    peer: End,
    peer_byte: i64,
    /// Set once the peer was found dead: every later call fails at once.
    dead: bool,
    /// Set once the peer was found never to have attached, its handle gone: every later
    /// call fails at once.
    never_attached: bool,
    /// The creator of an anonymous region: a peer that has not attached can still come only
    /// while some process holds its handle's lock ([`handle_byte`]).
    handed: bool,
    /// When the lock was last looked at (monotonic ns).
    last_look_ns: u64,
}

impl Liveness {
    pub(crate) fn new(lock: std::sync::Arc<EndLock>, me: End, channel: Option<u32>) -> Liveness {
        let peer = match me {
            End::Producer => End::Consumer,
            End::Consumer => End::Producer,
        };
        Liveness {
            lock,
            peer,
            peer_byte: lock_byte(channel, peer),
            dead: false,
            never_attached: false,
            handed: false,
            last_look_ns: 0,
        }
    }

    /// This end created its region anonymously and made the handle of its peer: a peer that
    /// has not attached is gone once the handle's lock is.
    pub(crate) fn expect_handle(&mut self) {
        self.handed = true;
    }

    /// `Err(PeerDead)` if the peer attached and its process is gone without detaching, or (a
    /// creator that made its handle) never attached and its handle is gone, looking at the
    /// locks as closely as `look` says (a peer already found gone fails at once).
    pub(crate) fn check(
        &mut self,
        header: &crate::protocol::abi::Header,
        region: &str,
        look: crate::protocol::park::Look,
    ) -> Result<(), Lost> {
        use crate::protocol::park::Look;

        let st = header.end(self.peer);
        if self.never_attached {
            return Err(Lost::PeerDead(peer_never_attached(region, self.peer)));
        }
        if !self.dead {
            match look {
                Look::Quick => return Ok(()),
                Look::IfDue => {
                    let now = crate::sys::clock::monotonic_ns();
                    if now.saturating_sub(self.last_look_ns) < CHECK_INTERVAL.as_nanos() as u64 {
                        return Ok(());
                    }
                    self.last_look_ns = now;
                }
                Look::Now => self.last_look_ns = crate::sys::clock::monotonic_ns(),
            }
        }
        let dead = self.dead
            || {
                // Acquire (in `state`): a peer that detached cleanly set DETACHED before its
                // lock went away.
                st.state() == EndState::Attached
                && !end_locked(self.lock.fd(), self.peer_byte).map_err(|e| Lost::Io(sys(region, "fcntl(F_OFD_GETLK)", e)))?
                // Re-read: it may have detached between the two looks.
                && st.state() == EndState::Attached
            };
        if dead {
            self.dead = true;
            return Err(Lost::PeerDead(peer_dead(region, self.peer, st.pid())));
        }
        // A peer that never attached: its handle's lock lives in every process that holds a
        // descriptor of the handle, and the peer attaches (its state Attached, with Release)
        // before it closes its copy; so a state still Free after the lock was seen gone (the
        // state re-read after the syscall) means no process can attach any more.
        if self.handed
            && st.state() == EndState::Free
            && !end_locked(self.lock.fd(), handle_byte(self.peer_byte))
                .map_err(|e| Lost::Io(sys(region, "fcntl(F_OFD_GETLK)", e)))?
            && st.state() == EndState::Free
        {
            self.never_attached = true;
            return Err(Lost::PeerDead(peer_never_attached(region, self.peer)));
        }
        Ok(())
    }
}

#[cfg(all(test, not(shmflow_loom)))]
mod tests {
    use super::*;
    use crate::protocol::abi::{Header, END_ATTACHED, END_DETACHED};
    use crate::protocol::park::Look;
    use crate::sync::Ordering;

    fn region() -> OwnedFd {
        crate::sys::shm::memfd(c"liveness-test").unwrap()
    }

    #[test]
    fn every_end_has_its_own_byte() {
        let bytes = [
            lock_byte(None, End::Producer),
            lock_byte(None, End::Consumer),
            lock_byte(Some(0), End::Producer),
            lock_byte(Some(7), End::Producer),
            lock_byte(Some(7), End::Consumer),
        ];
        assert_eq!(bytes, [0, 1, 2, 9, 1]);
    }

    #[test]
    fn an_end_is_held_once_and_free_again_when_its_lock_goes() {
        let fd = region();
        let first = EndLock::acquire(&fd, 0, End::Producer, "/t").unwrap();
        match EndLock::acquire(&fd, 0, End::Producer, "/t") {
            Err(OpenError::AlreadyAttached { end, .. }) => assert_eq!(end, End::Producer),
            other => panic!("{:?}", other.map(|_| ())),
        }
        let other = EndLock::acquire(&fd, 1, End::Consumer, "/t").unwrap();
        assert!(end_locked(other.fd(), 0).unwrap(), "seen from another end");
        drop(first);
        assert!(!end_locked(other.fd(), 0).unwrap());
        EndLock::acquire(&fd, 0, End::Producer, "/t").unwrap();
    }

    #[test]
    fn a_peer_attached_without_its_lock_is_dead_and_stays_dead() {
        let fd = region();
        let h = Header::default();
        let me = std::sync::Arc::new(EndLock::acquire(&fd, 1, End::Consumer, "/t").unwrap());
        let mut l = Liveness::new(me, End::Consumer, None);
        // Not attached (yet, or any more): not dead, whatever the lock says.
        assert!(l.check(&h, "/t", Look::Now).is_ok());
        h.producer.state.store(END_ATTACHED, Ordering::Relaxed);
        h.producer.pid.store(4242, Ordering::Relaxed);
        // Attached and holding its lock: alive.
        let peer = EndLock::acquire(&fd, 0, End::Producer, "/t").unwrap();
        assert!(l.check(&h, "/t", Look::Now).is_ok());
        drop(peer);
        // The busy path does not look; a look finds it dead.
        assert!(l.check(&h, "/t", Look::Quick).is_ok());
        let e = l.check(&h, "/t", Look::Now).unwrap_err();
        assert!(matches!(e, Lost::PeerDead(_)), "{e:?}");
        assert!(e.to_string().contains("4242"), "{e}");
        // Known dead: reported by every look, the busy one too, even if the state changes.
        h.producer.state.store(END_DETACHED, Ordering::Relaxed);
        assert!(l.check(&h, "/t", Look::Quick).is_err());
    }

    #[test]
    fn a_poller_looks_at_most_once_per_interval() {
        let fd = region();
        let h = Header::default();
        let me = std::sync::Arc::new(EndLock::acquire(&fd, 1, End::Consumer, "/t").unwrap());
        let mut l = Liveness::new(me, End::Consumer, None);
        let looked = std::time::Instant::now();
        assert!(
            l.check(&h, "/t", Look::IfDue).is_ok(),
            "looked: nothing attached"
        );
        h.producer.state.store(END_ATTACHED, Ordering::Relaxed);
        // Within the interval, `IfDue` does not look again (the death goes unseen for now);
        // asserted only if this thread was not held up for the interval meanwhile.
        let again = l.check(&h, "/t", Look::IfDue);
        if looked.elapsed() < CHECK_INTERVAL {
            assert!(again.is_ok());
        }
        std::thread::sleep(CHECK_INTERVAL + std::time::Duration::from_millis(5));
        assert!(l.check(&h, "/t", Look::IfDue).is_err(), "due: looked");
    }
}
