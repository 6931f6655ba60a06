//! Production side of the shim: std atomics and the Linux futex on shared memory.

use std::time::Duration;

use super::Ordering;

pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64};
pub(crate) use std::sync::Arc;
#[cfg(feature = "tokio")]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// A 32-bit word that a process can sleep on. `repr(transparent)` so that it can sit in the
/// mapped region exactly like an `AtomicU32`.
#[repr(transparent)]
#[derive(Default)]
pub(crate) struct FutexWord(pub(crate) AtomicU32);

impl FutexWord {
    #[inline]
    pub(crate) fn atomic(&self) -> &AtomicU32 {
        &self.0
    }

    /// Sleeps while the word equals `expected` (checked by the kernel atomically with going to
    /// sleep), until woken, a signal, or `timeout`. Spurious returns are allowed: callers re-check.
    pub(crate) fn wait(&self, expected: u32, timeout: Option<Duration>) {
        crate::sys::futex::wait(&self.0, expected, timeout);
    }

    /// Wakes every process sleeping on this word.
    pub(crate) fn wake(&self) {
        crate::sys::futex::wake(&self.0);
    }
}

/// A doorbell: a connected pair of Unix datagram sockets shared with the peer process
/// (`sys::bell`). A notifier rings it for a waiter that announced it sleeps on it rather than
/// on the futex word (an async task, asleep in its runtime's reactor).
#[derive(Debug)]
pub(crate) struct Bell {
    /// The end a waiter watches.
    wait: std::os::fd::OwnedFd,
    /// The end notifiers ring.
    ring: std::os::fd::OwnedFd,
}

impl Bell {
    /// A fresh doorbell.
    pub(crate) fn new() -> std::io::Result<Bell> {
        let (wait, ring) = crate::sys::bell::create()?;
        Ok(Bell { wait, ring })
    }

    /// A doorbell from the two ends handed over by the peer (checked by the caller).
    pub(crate) fn from_fds(wait: std::os::fd::OwnedFd, ring: std::os::fd::OwnedFd) -> Bell {
        Bell { wait, ring }
    }

    /// The two ends (wait, ring), to hand to a child.
    pub(crate) fn fds(&self) -> [std::os::fd::BorrowedFd<'_>; 2] {
        use std::os::fd::AsFd;
        [self.wait.as_fd(), self.ring.as_fd()]
    }

    /// Rings: the waiter's reactor sees the wait end readable. Never blocks.
    pub(crate) fn ring(&self) {
        use std::os::fd::AsFd;
        crate::sys::bell::ring(self.ring.as_fd());
    }

    /// Waits in the current tokio runtime's reactor until the bell rings (a ring since the
    /// last wait counts) or `timeout` passes, and takes the rings. The runtime needs its IO
    /// and time drivers (`enable_io`, `enable_time`; `#[tokio::main]` enables both).
    #[cfg(feature = "tokio")]
    pub(crate) async fn rung(&self, timeout: Duration) -> std::io::Result<()> {
        use std::os::fd::{AsFd, AsRawFd, RawFd};
        use tokio::io::unix::AsyncFd;
        use tokio::io::Interest;
        /// The wait end's number, registered for the length of one wait.
        struct Raw(RawFd);
        impl AsRawFd for Raw {
            fn as_raw_fd(&self) -> RawFd {
                self.0
            }
        }
        // SAFETY: the descriptor is `self.wait`, open as long as `self`, which outlives the
        // registration (dropped at the end of this call, which borrows `self`).
        let reg = unsafe {
            AsyncFd::register_with_interest(Raw(self.wait.as_raw_fd()), Interest::READABLE)
        }?;
        let wait = async {
            loop {
                let mut ready = reg.readable().await?;
                if crate::sys::bell::drain(self.wait.as_fd()) {
                    return Ok::<(), std::io::Error>(());
                }
                ready.clear_ready();
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(r) => r,
            Err(_) => Ok(()),
        }
    }
}

/// Sleeps until one of `words` is woken or differs from its expected value (checked by the
/// kernel atomically with going to sleep), or `timeout` passes; at most
/// [`WAITV_MAX`](crate::sys::futex::WAITV_MAX) words. Spurious returns are allowed. False if
/// the kernel cannot (before Linux 5.16): the caller must then poll.
///
/// The words are addresses that were valid when the caller took them and may have been
/// unmapped since: they go to the kernel only (see `sys::futex::waitv`), never dereferenced
/// here. (The loom model does read them; the models keep every word alive.)
#[cfg(feature = "tokio")]
pub(crate) fn futex_waitv(words: &[(*const FutexWord, u32)], timeout: Option<Duration>) -> bool {
    // `FutexWord` is `repr(transparent)` over the `AtomicU32`: same address.
    let raw: Vec<(*const AtomicU32, u32)> = words
        .iter()
        .map(|&(w, v)| (w as *const AtomicU32, v))
        .collect();
    crate::sys::futex::waitv(&raw, timeout) != crate::sys::futex::Waitv::Unsupported
}

/// Locks `m`, ignoring poisoning: every critical section of shmflow leaves its data
/// consistent at every point where it could panic.
#[cfg(feature = "tokio")]
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A hint inside busy-wait loops.
#[inline]
pub(crate) fn spin_loop() {
    std::hint::spin_loop();
}

/// Tracking of segment bytes for the race detector. In production these are no-ops.
#[derive(Default)]
pub(crate) struct ByteTracker;

impl ByteTracker {
    #[inline(always)]
    pub(crate) fn write(&self, _seg: usize, _off: usize, _len: usize) {}
    #[inline(always)]
    pub(crate) fn read(&self, _seg: usize, _off: usize, _len: usize) {}
}

/// Threads that park and unpark (the flusher).
pub(crate) mod thread {
    pub(crate) use std::thread::{park, Thread};
}

/// The light half of the asymmetric barrier (see `protocol::park`): only keeps the compiler
/// from moving the notifier's load of the park word above its publication. The hardware
/// reordering that remains is undone by the waiter's [`waiter_fence`].
#[inline(always)]
pub(crate) fn notifier_fence() {
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
}

/// The heavy half: a full barrier in every running thread of every process registered with
/// [`light_notify_available`]. False if it could not be issued.
pub(crate) fn waiter_fence() -> bool {
    crate::sys::membarrier::global_expedited()
}

/// Whether this process may notify with the light half: it is registered for the heavy half
/// of its peers.
pub(crate) fn light_notify_available() -> bool {
    crate::sys::membarrier::register()
}
