//! The one place that chooses between std and loom (the way tokio's `src/loom/` does).
//!
//! Everything concurrent in shmflow — ring cursors, frame headers, park words, spin hints and
//! the tracking of segment bytes — goes through this module's atomics, and every wait on the
//! OS through its [`Os`] trait (the futex and the rest: `region::os::Kernel` in production, a
//! model under loom), so the loom models in `src/loom_models/` drive exactly the code that runs
//! in production, over a region that lives on the heap instead of in a mapping.

#[cfg(not(shmflow_loom))]
mod real;
#[cfg(not(shmflow_loom))]
pub(crate) use real::*;

#[cfg(shmflow_loom)]
mod model;
#[cfg(shmflow_loom)]
pub(crate) use model::*;

pub(crate) use core::sync::atomic::Ordering;

/// The instant deadlines are measured against: the monotonic clock, or under loom the
/// modelled one (`sys::clock`), so that a `_timeout` call decides the same way in every
/// execution of a model.
#[inline]
pub(crate) fn now() -> std::time::Instant {
    crate::sys::clock::now()
}

/// What waiting needs from the operating system. The protocol layer's waits and wake-ups
/// (`protocol::park`) are written against this trait and make no OS call of their own: the
/// region layer supplies the real one (`region::os::Kernel`: futexes, doorbells, membarrier,
/// the clock, threads), the loom models a modelled one (`sync::model::Modelled`, under
/// `--cfg shmflow_loom`), so that the models drive the same spin and park code as production.
/// Every function is associated (no state): the choice is a type, `region::os::Host`.
pub(crate) trait Os {
    /// A doorbell: rung for a waiter asleep in its async runtime's reactor.
    type Bell: Send + Sync;
    /// Sleeps while `word` holds `expected` (checked atomically with going to sleep), until
    /// woken or `timeout` passes. Spurious returns are allowed: callers re-check.
    /// `deadline`: the caller gives up at a deadline of its own (a `_timeout` call), so the
    /// sleep may end by timing out; otherwise `timeout` is only the nap between two looks at
    /// the peer's liveness. The kernel treats both alike; the loom model lets only a sleep
    /// with a deadline time out (any other sleep that nobody ends is a lost wake-up, which
    /// loom reports as a deadlock).
    fn futex_wait(
        word: &FutexWord,
        expected: u32,
        timeout: Option<std::time::Duration>,
        deadline: bool,
    );
    /// Wakes every sleeper on `word`.
    fn futex_wake(word: &FutexWord);
    /// Rings `bell`. Never blocks.
    fn ring(bell: &Self::Bell);
    /// The heavy half of the asymmetric barrier (see `protocol::park`): a full barrier in
    /// every running thread of every registered process. False if it could not be issued.
    fn waiter_fence() -> bool;
    /// Whether this process may notify with the light half of the barrier: it registered for
    /// the heavy half that its peers issue.
    fn light_notify_available() -> bool;
    /// Lets another thread run on this CPU (a spinning waiter's peer may need it).
    fn yield_cpu();
    /// Whether the calling thread may run on a CPU other than the one it runs on.
    fn other_cpus() -> bool;
    /// Moves the calling thread to another CPU it may run on, leaving its affinity as it was.
    /// False if it may run on this CPU only, or the move failed.
    fn leave_cpu() -> bool;
    /// The monotonic clock that bounds the spin phases.
    fn now() -> std::time::Instant;
    /// Polls between two looks at the clock in a busy phase (a look costs about 25 ns).
    const POLLS_PER_CLOCK: u32;
}

/// The asynchronous half of [`Os`]: the executor a task waits in, and the doorbell's readiness
/// in its reactor.
#[cfg(any(feature = "tokio", shmflow_loom))]
pub(crate) trait AsyncOs: Os {
    /// True if an executor that can wait on a doorbell runs the caller (a tokio runtime).
    fn in_runtime() -> bool;
    /// Lets the executor run other tasks, then resumes.
    fn yield_now() -> impl std::future::Future<Output = ()> + Send;
    /// What one wait keeps between its looks at a bell (its registration with the reactor),
    /// so that a wait woken many times before it ends registers once: made by the first
    /// [`AsyncOs::rung`] of the wait, dropped with it.
    type Watch: Send;
    /// Waits until `bell` rings (a ring since the last wait counts) or `timeout` passes, and
    /// takes the rings; `watch` is the wait's (`None` at its first look).
    ///
    /// # Safety
    /// `watch` is dropped before `bell` is (it may name the bell's descriptor), and is used
    /// with `bell` only: it belongs to one wait, which borrows the bell throughout. (It stays
    /// registered with the runtime that ran the wait when it first slept: a wait moved to
    /// another runtime half-way sleeps its full nap between looks, or fails if that runtime
    /// is gone.)
    unsafe fn rung<'a>(
        bell: &'a Self::Bell,
        watch: &'a mut Option<Self::Watch>,
        timeout: std::time::Duration,
    ) -> impl std::future::Future<Output = std::io::Result<()>> + Send + 'a;
    /// Sleeps until one of `words` is woken or differs from its expected value, or `timeout`
    /// passes. Spurious returns are allowed. False if the kernel cannot (before Linux 5.16):
    /// the caller must then poll. The words go to the kernel only, never dereferenced, so a
    /// word unmapped since is harmless (see `sys::futex::waitv`).
    fn futex_waitv(words: &[(*const FutexWord, u32)], timeout: Option<std::time::Duration>)
        -> bool;
}
