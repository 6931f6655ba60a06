//! Production side of the shim: std atomics and the Linux futex on shared memory.

use std::time::Duration;

pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64};
pub(crate) use std::sync::Arc;

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
        let ts;
        let ts_ptr = match timeout {
            Some(d) => {
                ts = libc::timespec {
                    tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
                    tv_nsec: d.subsec_nanos() as libc::c_long,
                };
                &ts as *const libc::timespec
            }
            None => std::ptr::null(),
        };
        // SAFETY: the address is a valid, aligned u32 inside a live mapping for the duration of
        // the call; FUTEX_WAIT (not _PRIVATE) because the peer is another process mapping the
        // same object. The kernel only reads the word and the timespec.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.0.as_ptr(),
                libc::FUTEX_WAIT,
                expected,
                ts_ptr,
                std::ptr::null::<u32>(),
                0u32,
            );
        }
        // EAGAIN (value changed), EINTR and ETIMEDOUT all mean "go and look again".
    }

    /// Wakes every process sleeping on this word.
    pub(crate) fn wake(&self) {
        // SAFETY: as in `wait`; FUTEX_WAKE only uses the address as a key.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.0.as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }
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

pub(crate) use std::sync::{Mutex, MutexGuard};
