//! Each side's counters: kept locally, mirrored into its own lines of the header (the
//! `ProducerCounters` and `ConsumerCounters` of the ABI) with plain (non-RMW) relaxed stores,
//! so that another process can read them live. No contended counter, no locked instruction on
//! the hot path; a reader may see a slightly old value, never a torn one.

use crate::sync::{AtomicU64, Ordering};

/// A counter owned by one side: the local value is the truth, the shared one a mirror.
#[derive(Default, Clone, Copy)]
pub(crate) struct Local(pub u64);

impl Local {
    /// Counts without publishing (per-record counters: published by [`Local::publish`] at
    /// segment boundaries and flushes, and every few records under per-record policies, so
    /// the hot path stores nothing shared).
    #[inline]
    pub(crate) fn bump(&mut self, v: u64) {
        self.0 = self.0.wrapping_add(v);
    }

    /// Publishes the local value.
    #[inline]
    pub(crate) fn publish(&self, shared: &AtomicU64) {
        // Relaxed: a statistic; readers need no ordering with the data.
        shared.store(self.0, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn add(&mut self, shared: &AtomicU64, v: u64) {
        self.0 = self.0.wrapping_add(v);
        // Relaxed: a statistic; readers need no ordering with the data.
        shared.store(self.0, Ordering::Relaxed);
    }

    /// As [`Local::add`], for a counter that a reader also waits on ([`read_acquire`]): a
    /// Release store, so that everything this side did before happens before what the reader
    /// does after it sees the count (a plain store on x86, as Relaxed).
    #[inline]
    pub(crate) fn add_release(&mut self, shared: &AtomicU64, v: u64) {
        self.0 = self.0.wrapping_add(v);
        shared.store(self.0, Ordering::Release);
    }
}

/// Reads a counter published with [`Local::add_release`]: Acquire, paired with its Release.
#[inline]
pub(crate) fn read_acquire(shared: &AtomicU64) -> u64 {
    shared.load(Ordering::Acquire)
}

/// Reads a figure of the header: a counter, a gauge, a timestamp. Relaxed: a statistic, read
/// for a snapshot or a listing, ordered with nothing (a reader may see a slightly old value).
#[inline]
pub(crate) fn read(shared: &AtomicU64) -> u64 {
    shared.load(Ordering::Relaxed)
}

/// Sets a gauge or a timestamp of the header that only this side writes. Relaxed, as above.
#[inline]
pub(crate) fn set(shared: &AtomicU64, v: u64) {
    shared.store(v, Ordering::Relaxed);
}

/// Adds `v` to a counter that only this side writes and keeps in shared memory alone (wait
/// times: a wait may end in a dropped future, where no local copy can be reached).
pub(crate) fn add_owned(shared: &AtomicU64, v: u64) {
    // Relaxed: a statistic, and this side is its only writer.
    let total = shared.load(Ordering::Relaxed);
    shared.store(total.wrapping_add(v), Ordering::Relaxed);
}
