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
