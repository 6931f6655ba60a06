//! The monotonic clock.

use nix::time::{clock_gettime, ClockId};

/// Nanoseconds on the monotonic clock, comparable between processes of one boot (a vDSO call:
/// no system call on Linux).
pub(crate) fn monotonic_ns() -> u64 {
    // CLOCK_MONOTONIC always exists on Linux; a failure could only come from a bad clock id.
    let t = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC exists on Linux");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}
