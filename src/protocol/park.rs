//! Waiting for the peer: spin briefly, then park on a futex word in the region; and waking it.
//!
//! The protocol, for a waiter W and a notifier N sharing a park word P. Every write to P is a
//! read-modify-write with AcqRel ordering:
//!
//! ```text
//! W: swap(P, 1); if condition() { swap(P, 0); done } else { futex_wait(P, 1); swap(P, 0) }
//! N: publish (Release); if swap(P, 0) != 0 { futex_wake(P) }
//! ```
//!
//! All writes to P are RMWs, so they are totally ordered and each reads the one before it.
//! If N's swap comes after W's announcement it reads 1 and wakes W. If it comes before, W's
//! announcing swap reads N's value (or a later RMW in its release sequence), synchronizes with
//! it, and W's re-check sees the publication. Either way no wake-up is lost. N writes 0 before
//! waking, so a W that has not gone to sleep yet finds `P != 1` in the kernel's atomic check
//! and returns at once. N makes a syscall only when W has announced itself.
//!
//! Why not the classic "store; SeqCst fence; load" on both sides (cheaper for N when nobody
//! waits)? It is correct in the C++ model, but loom 0.7 does not model SeqCst fences combined
//! with RMWs faithfully and reports a lost wake-up that C++ forbids (we reproduced it with a
//! four-line litmus test), so the models could not vouch for it. The RMW costs N about what
//! an `mfence` costs on x86, and the line stays in N's cache while W is busy.

use std::time::{Duration, Instant};

use crate::error::{CoreResult as Result, Error};
use crate::sync::{FutexWord, Ordering};

/// How often a waiting side looks at its peer's lock: detection takes at most this long plus
/// one wake-up.
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_millis(40);

/// How long [`WaitStrategy::Block`] keeps looking before it parks on the futex: longer than
/// the gaps of a busy stream, short enough that a quiet channel costs little CPU (a record
/// every millisecond keeps a reader looking 5 % of the time).
pub const BLOCK_SPIN: Duration = Duration::from_micros(50);

/// The time between two looks of [`WaitStrategy::Block`]: long enough that a writer fills
/// many cache lines undisturbed (a reader that looks more often keeps pulling the line the
/// writer is filling, and the stream slows several times), short enough to be "at once" for
/// anything that crosses a process boundary through the OS.
pub const BLOCK_GAP: Duration = Duration::from_micros(5);

/// How a blocking call waits before it parks on the futex.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WaitStrategy {
    /// Look again every [`BLOCK_GAP`](crate::BLOCK_GAP) (5 µs), yielding the CPU first and
    /// pausing for the rest, for up to [`BLOCK_SPIN`](crate::BLOCK_SPIN) (50 µs); then park.
    /// The default. A record is seen at most a gap after it is published, and a writer is
    /// left alone between looks: it fills whole cache lines while the reader waits, instead
    /// of having each line pulled away as it writes it. The yield lets a peer waiting for
    /// the same CPU run. A wake-up through the futex, after the spin, costs tens of
    /// microseconds when the peer sits on another CPU of a VM. For the lowest latency (a
    /// CPU burnt while waiting) use [`WaitStrategy::BusyPoll`].
    #[default]
    Block,
    /// Busy-poll for up to this long before parking: the lowest latency while the peer is
    /// active, one CPU burnt while waiting. Keep it bounded on machines with few cores.
    BusyPoll(Duration),
    /// Park at once, no spinning: the least CPU, every wait pays a futex wake-up.
    Park,
}

/// How closely a poll looks at the peer's liveness (a syscall, so never on the busy path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Look {
    /// Not at all: the busy path (a peer already known dead is still reported).
    Quick,
    /// Only if the last look is [`CHECK_INTERVAL`] old (one clock read otherwise): for `try_`
    /// calls, so a caller that only ever polls learns of a dead peer as fast as one that
    /// blocks, without a syscall on every poll.
    IfDue,
    /// Now: after a sleep.
    Now,
}

/// When a blocking call gives up.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Deadline {
    /// Never (blocking call).
    Never,
    /// Do not wait at all (`try_` call).
    Now,
    /// At this instant (`_timeout` call).
    At(Instant),
}

impl Deadline {
    pub(crate) fn after(d: Duration) -> Deadline {
        match Instant::now().checked_add(d) {
            Some(t) => Deadline::At(t),
            None => Deadline::Never,
        }
    }

    pub(crate) fn at(t: Instant) -> Deadline {
        Deadline::At(t)
    }

    fn remaining(&self) -> Option<Option<Duration>> {
        match self {
            Deadline::Never => Some(None),
            Deadline::Now => None,
            Deadline::At(t) => t
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
                .map(Some),
        }
    }

    fn expired_error(&self) -> Error {
        match self {
            Deadline::Now => Error::WouldBlock,
            _ => Error::Timeout,
        }
    }
}

/// Wakes the peer parked on `word` if it announced itself. Returns true if a wake was issued.
/// Call after the publication (a Release store) that the peer may be waiting for.
#[inline]
pub(crate) fn notify(word: &FutexWord) -> bool {
    let p = word.atomic();
    // AcqRel RMW: takes its place in P's total order after our publication (see above).
    #[cfg(not(shmflow_broken = "notify_load_first"))]
    let was = p.swap(0, Ordering::AcqRel);
    // Broken on purpose (loom only): a plain load first lets the announcement slip by.
    #[cfg(shmflow_broken = "notify_load_first")]
    let was = if p.load(Ordering::Relaxed) != 0 {
        p.swap(0, Ordering::AcqRel)
    } else {
        0
    };
    if was != 0 {
        word.wake();
        return true;
    }
    false
}

/// Busy phase: polls a bounded number of times. `None` if nothing turned up.
fn spin_phase<T>(
    strategy: WaitStrategy,
    poll: &mut impl FnMut(Look) -> Result<Option<T>>,
) -> Result<Option<T>> {
    match strategy {
        WaitStrategy::Block => {
            #[cfg(not(loom))]
            {
                // Look first after a gap, not at once: the caller has just looked.
                let start = Instant::now();
                let mut last = start;
                loop {
                    // The gap: a yield (a peer waiting for this CPU runs), then pauses.
                    std::thread::yield_now();
                    let mut now = Instant::now();
                    while now.duration_since(last) < BLOCK_GAP {
                        crate::sync::spin_loop();
                        now = Instant::now();
                    }
                    last = now;
                    if let Some(v) = poll(Look::Quick)? {
                        return Ok(Some(v));
                    }
                    if now.duration_since(start) >= BLOCK_SPIN {
                        break;
                    }
                }
            }
            #[cfg(loom)]
            for _ in 0..crate::sync::SPIN_CHECKS {
                if let Some(v) = poll(Look::Quick)? {
                    return Ok(Some(v));
                }
                crate::sync::spin_loop();
            }
        }
        WaitStrategy::Park => {}
        WaitStrategy::BusyPoll(budget) => {
            let start = Instant::now();
            let mut i = 0u32;
            loop {
                if let Some(v) = poll(Look::Quick)? {
                    return Ok(Some(v));
                }
                i = i.wrapping_add(1);
                // Reading the clock costs ~25 ns; look at it every 64 polls.
                if i % 64 == 0 && start.elapsed() >= budget {
                    break;
                }
                crate::sync::spin_loop();
            }
        }
    }
    Ok(None)
}

/// Waits until `poll` yields a value: first a bounded busy phase, then parking on `word` until
/// the peer notifies (or the deadline passes). `poll` must also report the peer's closing,
/// so that a closed peer ends the wait. `poll(Look::Now)` is called after each sleep, at least every
/// [`CHECK_INTERVAL`]: that is when it should also check that the peer is alive (a syscall,
/// so never on the busy path).
pub(crate) fn wait_for<T>(
    word: &FutexWord,
    strategy: WaitStrategy,
    deadline: Deadline,
    mut poll: impl FnMut(Look) -> Result<Option<T>>,
) -> Result<T> {
    // `Block` looks again only after its first yield (see `spin_phase`).
    if strategy != WaitStrategy::Block || matches!(deadline, Deadline::Now) {
        if let Some(v) = poll(Look::Quick)? {
            return Ok(v);
        }
    }
    if let Deadline::Now = deadline {
        if let Some(v) = poll(Look::IfDue)? {
            return Ok(v);
        }
        return Err(Error::WouldBlock);
    }
    if let Some(v) = spin_phase(strategy, &mut poll)? {
        return Ok(v);
    }
    let p = word.atomic();
    loop {
        let Some(timeout) = deadline.remaining() else {
            // A caller that loops on short deadlines learns of a dead peer too.
            if let Some(v) = poll(Look::IfDue)? {
                return Ok(v);
            }
            return Err(deadline.expired_error());
        };
        // Announce (RMW, so it synchronizes with the notifier's swap), then re-check.
        p.swap(1, Ordering::AcqRel);
        #[cfg(not(shmflow_broken = "no_recheck"))]
        let ready = poll(Look::Quick);
        #[cfg(shmflow_broken = "no_recheck")]
        let ready: Result<Option<T>> = Ok(None);
        match ready {
            Ok(Some(v)) => {
                p.swap(0, Ordering::AcqRel);
                return Ok(v);
            }
            Err(e) => {
                p.swap(0, Ordering::AcqRel);
                return Err(e);
            }
            Ok(None) => {}
        }
        let nap = match timeout {
            Some(t) => t.min(CHECK_INTERVAL),
            None => CHECK_INTERVAL,
        };
        word.wait(1, Some(nap));
        // An RMW, not a store: keeps every write to P in the notifier's release sequence.
        p.swap(0, Ordering::AcqRel);
        if let Some(v) = poll(Look::Now)? {
            return Ok(v);
        }
    }
}
