//! The monotonic clock; under `--cfg shmflow_loom`, a modelled one.
//!
//! Under loom every execution of a model must make the same decisions for the same schedule,
//! so no decision may rest on the real clock (a spin budget, a deadline, a debloating rate, an
//! alignment timeout). The modelled clock is a counter that moves [`STEP`] at every look and by
//! a whole nap when a timed wait times out ([`advance`]). It is per OS thread: loom runs every
//! thread of a model on the thread that called `loom::model`, so the models that a test
//! harness runs side by side do not move each other's clocks. Only differences between looks
//! mean anything.

#[cfg(not(shmflow_loom))]
use nix::time::{clock_gettime, ClockId};

/// Nanoseconds on the monotonic clock, comparable between processes of one boot (a vDSO call:
/// no system call on Linux).
#[cfg(not(shmflow_loom))]
pub(crate) fn monotonic_ns() -> u64 {
    // CLOCK_MONOTONIC always exists on Linux; a failure could only come from a bad clock id.
    let t = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC exists on Linux");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

/// Nanoseconds of the wall clock (`CLOCK_REALTIME`) since the Unix epoch: what latency
/// markers carry, as Flink's carry the wall clock (a vDSO call).
#[cfg(not(shmflow_loom))]
pub(crate) fn realtime_ns() -> u64 {
    // CLOCK_REALTIME always exists on Linux; a clock set before 1970 reads as 0.
    let t = clock_gettime(ClockId::CLOCK_REALTIME).expect("CLOCK_REALTIME exists on Linux");
    (t.tv_sec().max(0) as u64) * 1_000_000_000 + t.tv_nsec() as u64
}

/// The instant deadlines are measured against.
#[cfg(not(shmflow_loom))]
#[inline]
pub(crate) fn now() -> std::time::Instant {
    std::time::Instant::now()
}

/// How far the modelled clock moves at each look: past every spin budget of the wait
/// strategies at once (each look is a scheduling point for loom).
#[cfg(shmflow_loom)]
pub(crate) const STEP: std::time::Duration = std::time::Duration::from_millis(1);

#[cfg(shmflow_loom)]
thread_local! {
    /// The modelled clock's nanoseconds, and the real instant it counts from.
    static MODELLED: (std::cell::Cell<u64>, std::time::Instant) =
        (std::cell::Cell::new(1 << 30), std::time::Instant::now());
}

/// The modelled clock, moved one [`STEP`]: nanoseconds.
#[cfg(shmflow_loom)]
pub(crate) fn monotonic_ns() -> u64 {
    MODELLED.with(|(ns, _)| {
        let v = ns.get() + STEP.as_nanos() as u64;
        ns.set(v);
        v
    })
}

/// The modelled clock, moved one [`STEP`]: an instant.
#[cfg(shmflow_loom)]
pub(crate) fn now() -> std::time::Instant {
    let ns = monotonic_ns();
    MODELLED.with(|(_, base)| *base + std::time::Duration::from_nanos(ns))
}

/// Under loom the wall clock is the modelled clock too.
#[cfg(shmflow_loom)]
pub(crate) fn realtime_ns() -> u64 {
    monotonic_ns()
}

/// Moves the modelled clock by `d`: a timed wait that timed out.
#[cfg(shmflow_loom)]
pub(crate) fn advance(d: std::time::Duration) {
    MODELLED.with(|(ns, _)| ns.set(ns.get().saturating_add(d.as_nanos() as u64)));
}
