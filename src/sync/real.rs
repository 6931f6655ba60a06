//! Production side of the shim: std atomics and mutexes. The futex and the rest of the OS that
//! waits need are `region::os::Kernel`'s.

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

/// The light half of the asymmetric barrier (see `protocol::park`): only keeps the compiler
/// from moving the notifier's load of the park word above its publication. The hardware
/// reordering that remains is undone by the waiter's heavy barrier (`Os::waiter_fence`).
#[inline(always)]
pub(crate) fn notifier_fence() {
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
}
