//! Counters kept in the region header so that another process can read them live.
//!
//! Each side writes only its own lines, with plain (non-RMW) relaxed stores of values it keeps
//! locally: no contended counter, no locked instruction on the hot path. A reader may see a
//! slightly old value, never a torn one.

use crate::sync::{AtomicU64, Ordering};

/// Producer-side counters (one padded block, written only by the producer).
#[repr(C)]
#[derive(Default)]
pub(crate) struct ProducerCounters {
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    pub segments_committed: AtomicU64,
    pub wakes: AtomicU64,
    /// Nanoseconds spent blocked waiting for a free segment (backpressure).
    pub backpressured_ns: AtomicU64,
    /// Monotonic-clock nanoseconds when the current wait began, 0 when not waiting: lets a
    /// reader count a wait that is still going on.
    pub blocked_since_ns: AtomicU64,
    /// Wake-ups issued by the buffer-timeout flusher thread (its own line of writes).
    pub flusher_wakes: AtomicU64,
    /// Segments the producer has taken from the return ring.
    pub segments_acquired: AtomicU64,
}

/// Consumer-side counters.
#[repr(C)]
#[derive(Default)]
pub(crate) struct ConsumerCounters {
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    pub segments_returned: AtomicU64,
    pub wakes: AtomicU64,
    /// Nanoseconds spent waiting for data.
    pub idle_ns: AtomicU64,
    pub idle_since_ns: AtomicU64,
    /// Segments the consumer has taken from the data ring.
    pub segments_taken: AtomicU64,
}

/// A counter owned by one side: the local value is the truth, the shared one a mirror.
#[derive(Default, Clone, Copy)]
pub(crate) struct Local(pub u64);

impl Local {
    #[inline]
    pub(crate) fn add(&mut self, shared: &AtomicU64, v: u64) {
        self.0 = self.0.wrapping_add(v);
        // Relaxed: a statistic; readers need no ordering with the data.
        shared.store(self.0, Ordering::Relaxed);
    }
}

/// Nanoseconds on the monotonic clock, comparable between processes of one boot.
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
