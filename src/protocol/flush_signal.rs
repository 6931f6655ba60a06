//! The hand-off between a producer and its buffer-timeout flusher (a thread of the producer's
//! process that wakes a parked consumer at most one interval after a record was published
//! without waking it). The flusher sleeps without a timer while nothing is pending.
//!
//! One word, three states: `IDLE` (nothing pending, flusher awake), `PENDING` (published
//! since the flusher last looked), `ASLEEP` (the flusher sleeps until something is pending).
//!
//! ```text
//! producer, after each publication:  if swap(S, PENDING) == ASLEEP { unpark(flusher) }
//! flusher, each interval:            if swap(S, IDLE) == PENDING { wake the consumer }
//!                                    else if cas(S, IDLE -> ASLEEP) { park while S == ASLEEP }
//! ```
//!
//! Every write to S is a read-modify-write, so the writes are totally ordered and each reads
//! the one before it. SYNC POINT (producer `swap` AcqRel ↔ flusher `swap`/`cas` AcqRel): if
//! the producer's swap comes after the flusher's cas, it reads `ASLEEP` and unparks it (an
//! unpark before the park is kept as a token, so it cannot be missed); if it comes before,
//! the cas fails (S is `PENDING`) and the flusher does not sleep. Either way no publication
//! is left without a wake-up. The swap is done for every publication, never skipped when S
//! is already `PENDING`: the flusher's Acquire must see the latest commit, or a consumer that
//! announced itself in between could miss the newest record until the next one.

use crate::sync::{AtomicU32, Ordering};

const IDLE: u32 = 0;
const PENDING: u32 = 1;
const ASLEEP: u32 = 2;

/// The state word shared by a producer and its flusher (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct FlushSignal {
    state: AtomicU32,
}

impl FlushSignal {
    /// Producer, after publishing: `unpark`s the flusher if it sleeps (the caller's thread
    /// handle: the protocol has no threads of its own).
    #[inline]
    pub(crate) fn mark(&self, unpark: impl FnOnce()) {
        // AcqRel RMW: pairs with the flusher's `take` and `sleep` (see the module docs).
        if self.state.swap(PENDING, Ordering::AcqRel) == ASLEEP {
            unpark();
        }
    }

    /// Flusher, once per interval: true if something was published since the last call
    /// (every publication before the one it saw happens before this returns).
    pub(crate) fn take(&self) -> bool {
        // AcqRel RMW: synchronizes with the producer's last `mark`.
        self.state.swap(IDLE, Ordering::AcqRel) == PENDING
    }

    /// Flusher, after an interval with nothing pending: sleeps (`park`, the caller's thread
    /// park, whose spurious returns are fine) until the producer marks a publication (or
    /// `stop` says so; the stopper unparks it).
    pub(crate) fn sleep(&self, stop: impl Fn() -> bool, park: impl Fn()) {
        // A cas, not a store: a store could overwrite a `PENDING` that the producer set just
        // now, after reading `IDLE` (so it did not unpark us), and we would sleep on it.
        #[cfg(not(shmflow_broken = "flusher_sleep_store"))]
        let asleep = self
            .state
            .compare_exchange(IDLE, ASLEEP, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        // Broken on purpose (loom only): the store that loses a publication.
        #[cfg(shmflow_broken = "flusher_sleep_store")]
        let asleep = {
            self.state.store(ASLEEP, Ordering::Release);
            true
        };
        if !asleep {
            return;
        }
        // Spurious returns of `park` are fine: the state says whether to sleep on.
        while self.state.load(Ordering::Acquire) == ASLEEP && !stop() {
            park();
        }
    }
}
