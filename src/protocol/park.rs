//! Waiting for the peer: spin briefly, then park on a futex word in the region; and waking it.
//!
//! The protocol, for a waiter W and a notifier N sharing a park word P. Bit 0 of P
//! (`PARKED`) says that W sleeps or is about to; bit 1 (`NO_FENCE`, sticky) that W cannot
//! issue the heavy barrier, or that N wakes with the RMW only and said so ([`rmw_notifier`]),
//! so N must not use the light notification and W skips the barrier. Every write to P is a
//! read-modify-write with AcqRel ordering:
//!
//! ```text
//! W: v = fetch_or(P, PARKED); [heavy barrier]; if condition() { fetch_and(P, !PARKED); done }
//!    else { futex_wait(P, v | PARKED); fetch_and(P, !PARKED) }
//! N (notify):       publish (Release); if fetch_and(P, !PARKED) & PARKED { futex_wake(P) }
//! N (notify_light): publish (Release); [light barrier]; if load(P) & (PARKED | NO_FENCE) != 0 { notify }
//! ```
//!
//! **notify.** All writes to P are RMWs, so they are totally ordered and each reads the one
//! before it. If N's RMW comes after W's announcement it reads `PARKED` and wakes W. If it
//! comes before, W's announcing RMW reads N's value (or a later RMW in its release sequence),
//! synchronizes with it, and W's re-check sees the publication. Either way no wake-up is lost.
//! N clears `PARKED` before waking, so a W that has not gone to sleep yet finds P changed in
//! the kernel's atomic check and returns at once. N makes a syscall only when W announced.
//! The RMW costs N a locked instruction per notification, which drains its store buffer: on
//! the per-record path, with the payload's stores waiting on cache lines the reader holds, that
//! halves a stream of small records.
//!
//! **notify_light** (the producer's per-record path) replaces the RMW with a plain load, and
//! the StoreLoad fence that this Dekker pattern needs on N's side with an asymmetric barrier:
//! W issues `membarrier(GLOBAL_EXPEDITED)` after announcing, which makes every running thread
//! of every registered process pass a full barrier (a thread not running passes one when it is
//! scheduled); N's process registered before using the light form (`Os::
//! light_notify_available`), and N's own half is only a compiler fence. SYNC POINT: W's
//! announcing RMW + heavy barrier ↔ N's publication + light barrier + load of P. Let X be the
//! point where N passes the barrier that W's call forces. If X lies between N's publication
//! and its load, this is Dekker's pattern with a full fence on both sides: W's re-check sees
//! the publication or N's load sees `PARKED`. If X precedes the publication, W's announcement
//! (before its call) is visible to everything N does after X, so N's load sees `PARKED`. If X
//! follows the load, N's publication precedes X, which precedes the end of W's call, so W's
//! re-check sees it. In every case W sleeps only if N will wake it. Loom cannot issue the
//! barrier; the models put a SeqCst fence on each side (the first case) and explore it (model
//! 9), and a variant without W's barrier is shown caught.
//!
//! If W cannot issue the barrier (an old kernel, a seccomp filter, a transient failure), it
//! sets `NO_FENCE` for good and N, which reads P on every record, takes the RMW path from then
//! on. A notification whose load of P came before W's announcement may still have been missed:
//! W's first sleep after setting the bit lasts at most 1 ms, after which it looks again. That
//! bound rests on N's store reaching W within the millisecond (true of every machine we know),
//! not on the protocol; at worst a record waits for the next 40 ms look.
//!
//! **The doorbell** (async waiters of anonymous regions). Each park word of a region created
//! anonymously has a doorbell, a connected pair of Unix datagram sockets, which travels with
//! the region's descriptor to the peer (`PeerHandle::pass_to`). Bit 2 (`DOORBELL`) goes with `PARKED` when the waiter
//! sleeps on the doorbell in its async runtime's reactor instead of on the futex; N's RMW clears
//! both and N rings the bell instead of waking the futex. Nothing else changes: the argument
//! above is about which RMW reads which, and holds whichever way W sleeps. SYNC POINT: W's
//! announcing RMW ↔ N's clearing RMW (as above), then N's ring (a datagram sent) ↔ the
//! reactor's readiness, which the kernel orders: a ring before W registers stays queued, so
//! W's registration finds the descriptor readable. A waiter uses the doorbell
//! only if every process that may notify the word can ring it: bit 3 (`RINGABLE`, sticky) is
//! set by a process that attached with the doorbells (and, for a gate, whose channels attach
//! only through their handles, by its creator); bit 4 (`BELL_LESS`, sticky) by one that opened
//! the region from a bare descriptor, which is refused where `RINGABLE` is already set (a
//! waiter may sleep on the bell it could not ring). A waiter whose announcing RMW reads
//! `BELL_LESS` sleeps through the bridge on the value it announced, which the bell-less
//! notifier's RMW changes. Model 10b explores the doorbell wait, and a variant whose notifier
//! ignores `DOORBELL` is shown caught.
//!
//! Why not "store; SeqCst fence; load" on both sides? It is correct in the C++ model, but loom
//! 0.7 does not model SeqCst fences combined with RMWs faithfully and reports a lost wake-up
//! that C++ forbids (we reproduced it with a four-line litmus test), and an `mfence` costs N
//! what the RMW costs.

use std::time::Duration;

use crate::error::Halt;
#[cfg(any(feature = "tokio", shmflow_loom))]
use crate::error::SysError;
use crate::protocol::abi::{GateHeader, Header};
#[cfg(any(feature = "tokio", shmflow_loom))]
use crate::sync::AsyncOs;
use crate::sync::{AtomicU32, FutexWord, Ordering, Os};

mod patience;
pub(crate) use patience::{Deadline, Forever, Immediately, Look, Patience, Sooner, Until};

/// How often a waiting side looks at its peer's lock: detection takes at most this long plus
/// one wake-up.
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_millis(40);

/// How long [`WaitStrategy::Block`] keeps looking before it parks on the futex: longer than
/// the gaps of a busy stream, short enough that a quiet channel costs little CPU (a record
/// every millisecond keeps a reader looking 5 % of the time).
pub const BLOCK_SPIN: Duration = Duration::from_micros(50);

/// How long [`WaitStrategy::Block`] looks without yielding its CPU, unless the peer was
/// streaming: a reply or a sparse record that comes within it is seen at once. Also how long
/// a [`WaitStrategy::BusyPoll`] whose peer may share its CPU looks before its first yield,
/// and how late a yield must give the CPU back for the CPU to count as shared.
pub const BLOCK_EAGER: Duration = Duration::from_micros(2);

/// The time between two yields of [`WaitStrategy::Block`] after [`BLOCK_EAGER`] (and of a
/// [`WaitStrategy::BusyPoll`] after a wake-up or a sleep), and between two looks when the peer is
/// streaming: long enough that a writer fills many cache lines undisturbed (a reader that
/// looks more often keeps pulling the line the writer is filling, and the stream slows
/// several times), short enough to be "at once" for anything that crosses a process boundary
/// through the OS.
pub const BLOCK_GAP: Duration = Duration::from_micros(5);

/// How a blocking call waits before it parks on the futex.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WaitStrategy {
    /// The default. Look continuously for up to [`BLOCK_SPIN`](crate::tuning::BLOCK_SPIN)
    /// (50 µs), yielding the CPU after the first [`BLOCK_EAGER`](crate::tuning::BLOCK_EAGER)
    /// (2 µs) and then every [`BLOCK_GAP`](crate::tuning::BLOCK_GAP) (5 µs); then park. A
    /// reader that has just read a large batch (the writer is streaming) looks only once per
    /// gap instead: a record is then seen at most a gap after it is published, and the writer
    /// is left alone between looks, filling whole cache lines while the reader waits instead
    /// of having each line pulled away as it writes it. The yields let a peer waiting for the
    /// same CPU run. A wake-up through the futex, after the spin, costs tens of
    /// microseconds when the peer sits on another CPU of a VM. For the lowest latency (a
    /// CPU burnt while waiting) that keeps looking through longer gaps, use
    /// [`WaitStrategy::BusyPoll`]. A direct network consumer, each of whose looks is a read
    /// of its socket that does not wait, looks continuously for the first 2 µs and then once
    /// per gap, and after a large batch reads blocking at once. A producer that waits for a segment to come back
    /// with 8 or more of its segments in flight (not held back by a debloating cap) parks at
    /// once: its consumer has all of them to read before a late wake-up could leave it idle,
    /// and looks would only take CPU time from the consumer (or from a bridge forwarding the
    /// channel).
    #[default]
    Block,
    /// Busy-poll for up to this long before parking: the lowest latency while the peer is
    /// active, one CPU burnt while waiting. Keep it bounded on machines with few cores.
    ///
    /// When the peer may be queued on this thread's CPU, the next busy phase of a blocking
    /// call yields the CPU after [`BLOCK_EAGER`](crate::tuning::BLOCK_EAGER) (2 µs) and then
    /// every [`BLOCK_GAP`](crate::tuning::BLOCK_GAP) (5 µs), since a poll that never yielded
    /// would keep the peer from running for the whole budget. That is after its thread has
    /// - woken a sleeping end (of any channel: a record, an event or a returned segment for
    ///   an end that had parked): the scheduler may have put the woken thread on its waker's
    ///   CPU (on a VM a sleeping virtual CPU often counts as unavailable);
    /// - slept in a wait of a local end itself (a direct network end's blocking read of its
    ///   socket does not count): while it slept its CPU was idle, and an idle CPU takes over
    ///   a runnable thread from a busy one, such as a peer that another program had
    ///   displaced, which then stays beside it.
    ///
    /// Otherwise it polls without a break. A yield with nothing else to run costs a system
    /// call (about 0.4 µs). A yield that gets the CPU back only after something else ran
    /// (2 µs or more) shows the CPU shared. The thread looks once more, and then, if it may
    /// run on another CPU and its gap since it last did so has passed, yields once more: back
    /// at once, what ran has gone (or has used its time slice), and polling goes on; still
    /// shared, the thread moves itself to another CPU it may run on (the kernel chooses
    /// which) and polls on there. The move narrows the thread's affinity to leave this CPU
    /// and widens it again at once: a thread that may run on every online CPU gets them all
    /// back, any other the CPUs in effect before the move (so that a later widening of its
    /// cpuset no longer reaches it), and an affinity that another thread sets for it in
    /// between is undone. On a VM the scheduler seldom makes that move by itself: its
    /// wake-ups land on the waker's CPU, and two ends that wake each other have stayed on one
    /// CPU for 8 ms while the other one idled, each round trip paying two wake-ups (about
    /// 6 µs). Such a try (the second yield, and the move if that one comes back late too;
    /// or the move alone, when the reply came during the first yield) comes at most once a
    /// gap: 1 ms at first, doubled (up to 64 ms) by each try that comes
    /// less than four gaps after the one before, and 1 ms again for a try that comes later.
    /// Where busy-polling threads outnumber the CPUs, each would otherwise move a thousand
    /// times a second and, moved, poll on beside another busy thread for the rest of its
    /// time slice. A thread that stays (it may run on this CPU only, its move failed, or its gap
    /// has not passed) ends the busy phase, and its next wait parks without one. On a CPU
    /// that other programs keep busy this makes a busy-poll after a sleep behave much like
    /// [`WaitStrategy::Park`], but for one busy phase a gap. The note is
    /// one per thread: a thread that waits on several ends takes it in whichever wait comes
    /// next. The async forms yield to their executor instead.
    BusyPoll(Duration),
    /// Park at once, no spinning: the least CPU, every wait pays a futex wake-up.
    Park,
}

/// `PARKED`: the waiter sleeps or is about to.
pub(crate) const PARKED: u32 = 1;
/// `NO_FENCE` (sticky): the waiter cannot issue the heavy barrier; notify with the RMW.
const NO_FENCE: u32 = 2;
/// `DOORBELL`, only with `PARKED`: the waiter sleeps on the word's doorbell (a socket, in
/// its async runtime's reactor), not on the futex: the notifier rings the bell.
pub(crate) const DOORBELL: u32 = 4;
/// `RINGABLE` (sticky): a process that notifies the word attached holding its doorbell (the
/// region's creator holds them all): a waiter holding it too may sleep on it.
const RINGABLE: u32 = 8;
/// `BELL_LESS` (sticky): a process that may notify holds no doorbell for the word (it opened
/// the region from a bare descriptor): waiters sleep on the futex.
pub(crate) const BELL_LESS: u32 = 16;

/// Wakes the peer parked on `word` if it announced itself: rings `bell` (the word's doorbell,
/// if this process holds it) for a waiter that sleeps on it, wakes the futex otherwise.
/// Returns true if a wake was issued. Call after the publication (a Release store) that the
/// peer may be waiting for.
#[inline]
pub(crate) fn notify<O: Os>(word: &FutexWord, bell: Option<&O::Bell>) -> bool {
    let p = word.atomic();
    // AcqRel RMW: takes its place in P's total order after our publication (see above).
    #[cfg(not(shmflow_broken = "notify_load_first"))]
    let was = p.fetch_and(!(PARKED | DOORBELL), Ordering::AcqRel);
    // Broken on purpose (loom only): a plain load first lets the announcement slip by.
    #[cfg(shmflow_broken = "notify_load_first")]
    let was = if p.load(Ordering::Relaxed) & PARKED != 0 {
        p.fetch_and(!(PARKED | DOORBELL), Ordering::AcqRel)
    } else {
        0
    };
    if was & PARKED != 0 {
        wake::<O>(word, was, bell);
        return true;
    }
    false
}

/// Marks sources outside the region that have something for the waiter on `word` (a gate's
/// remote channels whose sockets got bytes: `marks[c]` for each `c` in `which`), then wakes
/// the waiter as [`notify`] does: the step of a gate's socket watcher.
///
/// SYNC POINT (marks → waiter): the marks' stores (Relaxed) come before the notify's AcqRel
/// RMW on `word`; pairs with the waiter's announce (an AcqRel RMW on `word`) and its re-check,
/// which takes the marks ([`take_mark`], Relaxed). If the notify's RMW comes first in the
/// word's order, the announce reads from its release sequence and the re-check sees the
/// marks; if the announce comes first, the notify sees it and wakes the waiter, which looks
/// again. (Model: `a_gate_waiting_for_a_marked_socket_always_wakes`.)
#[cfg_attr(any(not(feature = "net"), shmflow_loom), allow(dead_code))]
pub(crate) fn mark_then_notify<O: Os>(
    marks: &[AtomicU32],
    which: &[u64],
    word: &FutexWord,
    bell: Option<&O::Bell>,
) {
    // Broken on purpose (loom only): the wake before the marks.
    #[cfg(shmflow_broken = "mark_after_notify")]
    notify::<O>(word, bell);
    for &c in which {
        if let Some(m) = marks.get(c as usize) {
            m.store(1, Ordering::Relaxed);
        }
    }
    #[cfg(not(shmflow_broken = "mark_after_notify"))]
    notify::<O>(word, bell);
}

/// Takes a mark set by [`mark_then_notify`]: true if it was set (a plain load first, so that
/// an unmarked source costs no read-modify-write).
#[inline]
#[cfg_attr(any(not(feature = "net"), shmflow_loom), allow(dead_code))]
pub(crate) fn take_mark(mark: &AtomicU32) -> bool {
    // Relaxed: see the SYNC POINT on `mark_then_notify` (a mark is a hint to read a socket,
    // whose own bytes the kernel orders).
    mark.load(Ordering::Relaxed) != 0 && mark.swap(0, Ordering::Relaxed) != 0
}

/// Wakes a waiter that announced `was`: through the doorbell it sleeps on, or the futex.
#[cold]
fn wake<O: Os>(word: &FutexWord, was: u32, bell: Option<&O::Bell>) {
    note_cpu_share(CpuShare::Maybe);
    // Broken on purpose (loom only): the doorbell bit ignored, the futex woken instead.
    #[cfg(shmflow_broken = "doorbell_unrung")]
    let was = was & !DOORBELL;
    match bell {
        Some(b) if was & DOORBELL != 0 => O::ring(b),
        // A bell-less notifier that sees `DOORBELL` set its `BELL_LESS` after the waiter
        // looked: the waiter's sleep ends at its nap (see the module docs).
        _ => O::futex_wake(word),
    }
}

/// As [`notify`], without a read-modify-write unless the peer sleeps (or cannot issue the
/// heavy barrier): for a notifier whose process is registered for it (see the module docs).
/// `bell` is looked up only then: the per-record path reads nothing but the word.
#[inline(always)]
pub(crate) fn notify_light<'a, O: Os>(
    word: &FutexWord,
    bell: impl FnOnce() -> Option<&'a O::Bell>,
) -> bool
where
    O::Bell: 'a,
{
    crate::sync::notifier_fence();
    #[cfg(not(shmflow_broken = "light_ignores_no_fence"))]
    let look = PARKED | NO_FENCE;
    #[cfg(shmflow_broken = "light_ignores_no_fence")]
    let look = PARKED;
    // Relaxed: ordered after the publication by the asymmetric barrier (SYNC POINT above).
    if word.atomic().load(Ordering::Relaxed) & look != 0 {
        return notify::<O>(word, bell());
    }
    false
}

/// Tells the waiters on `word` that its notifier wakes them with the read-modify-write only
/// ([`notify`], never [`notify_light`]): sets `NO_FENCE`, so that they announce without the
/// heavy barrier. SYNC POINT: this RMW precedes every notification of the caller (program
/// order), each an RMW; a waiter whose announcing RMW reads the bit relies on the RMW argument
/// of the module docs alone, and one that does not read it issues the barrier as before. Only
/// for a word whose every notifier uses [`notify`] (a light notifier would read the bit and
/// take the RMW path too, but may have loaded the word before it was set).
#[cfg(any(feature = "net", shmflow_loom))]
pub(crate) fn rmw_notifier(word: &FutexWord) {
    word.atomic().fetch_or(NO_FENCE, Ordering::AcqRel);
}

/// The park words of a channel's header.
impl Header {
    /// The producer's park word: it sleeps on it waiting for a returned segment (or room in
    /// the priority lane, or its consumer's reads at close); the consumer notifies it.
    #[inline]
    pub(crate) fn producer_park(&self) -> &FutexWord {
        &self.producer_park.0
    }

    /// A single channel's consumer's park word; the producer notifies it. (A gate's consumer
    /// sleeps on its gate's word, [`GateHeader::park`], for all its channels.)
    #[inline]
    pub(crate) fn consumer_park(&self) -> &FutexWord {
        &self.consumer_park.0
    }
}

impl GateHeader {
    /// The gate consumer's park word: every channel's producer notifies it.
    #[inline]
    pub(crate) fn park(&self) -> &FutexWord {
        &self.park.0
    }
}

/// True if `word` no longer holds `expected`, what a waiter announced (the bridge's look at a
/// word it watches). Acquire: pairs with the notifier's AcqRel RMW on the word.
#[cfg(any(feature = "tokio", shmflow_loom))]
pub(crate) fn changed(word: &FutexWord, expected: u32) -> bool {
    word.atomic().load(Ordering::Acquire) != expected
}

/// Marks `word` as notified by a process that attached holding its doorbell: waiters that
/// hold it too may sleep on it from now on.
pub(crate) fn mark_ringable(word: &FutexWord) {
    // An RMW, as every write to P (see the module docs).
    word.atomic().fetch_or(RINGABLE, Ordering::AcqRel);
}

/// True if a process holding `word`'s doorbell attached (see [`mark_ringable`]).
#[cfg_attr(shmflow_loom, allow(dead_code))]
pub(crate) fn ringable(word: &FutexWord) -> bool {
    // Relaxed: a hint (a refusal without side effects); `mark_bell_less` decides.
    word.atomic().load(Ordering::Relaxed) & RINGABLE != 0
}

/// Marks `word` as notified by a process that holds no doorbell for it (one that opened the
/// region from a bare descriptor): its waiters sleep on the futex from now on. False if a
/// process holding the doorbell attached before (a waiter may sleep on the bell, which this
/// process could not ring): the caller must not attach.
#[cfg_attr(shmflow_loom, allow(dead_code))]
pub(crate) fn mark_bell_less(word: &FutexWord) -> bool {
    // RMWs, as every write to P (see the module docs): either a waiter's announcement comes
    // after the one that sets the bit and sees `BELL_LESS`, or the compare reads the
    // `RINGABLE` that the waiter saw, and the bit is not set (a refused attachment leaves the
    // word as it was).
    let p = word.atomic();
    let mut v = p.load(Ordering::Relaxed);
    loop {
        if v & RINGABLE != 0 {
            return false;
        }
        match p.compare_exchange_weak(v, v | BELL_LESS, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(now) => v = now,
        }
    }
}

/// What the waiter last saw of its peer: decides how [`WaitStrategy::Block`] looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pace {
    /// The peer is streaming (the waiter read a large batch since it last waited): look only
    /// every [`BLOCK_GAP`], so that the writer fills whole cache lines between looks.
    Stream,
    /// Sparse traffic, or a request and its reply: look continuously for [`BLOCK_EAGER`]
    /// first, then go on looking, with a yield every [`BLOCK_GAP`].
    Sparse,
    /// Sparse traffic whose looks cost more than a load of the waiter's own line: a system
    /// call (a direct network end reads its socket), or lines other writers are filling (a
    /// gate looks at the frame each of its producers is writing): continuous looks for
    /// [`BLOCK_EAGER`], then one look per [`BLOCK_GAP`].
    SparseSpaced,
}

/// Who may wake a waiter: decides whether the waiter issues the heavy barrier after it
/// announces itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Notifier {
    /// Every notifier uses [`notify`]: the announcement alone suffices.
    Rmw,
    /// A notifier may use [`notify_light`]: the waiter issues the heavy barrier.
    Light,
}

/// Busy phase: polls a bounded number of times. `None` if nothing turned up. The clock and the
/// yield are the OS's (`O`), so that the loom models run this same code. A direct network end
/// runs it too, with a poll that reads its socket without waiting.
pub(crate) fn spin_phase<O: Os, T, F>(
    strategy: WaitStrategy,
    pace: Pace,
    poll: &mut impl FnMut(Look) -> Result<Option<T>, F>,
) -> Result<Option<T>, F> {
    match strategy {
        WaitStrategy::Block => {
            let start = O::now();
            if pace != Pace::Stream {
                // A reply or a sparse record: look continuously for a moment, as a
                // busy-poller would (nobody is filling lines for us to disturb).
                if let Some(v) = busy_poll::<O, T, F>(BLOCK_EAGER, poll, false)? {
                    return Ok(Some(v));
                }
            }
            // Then a yield every `BLOCK_GAP` (a peer waiting for this CPU runs). A streaming
            // writer is looked at only after each gap (first after a gap: the caller has just
            // looked), so that it fills whole lines undisturbed; sparse traffic is looked at
            // throughout the gap too, so that a reply late by more than `BLOCK_EAGER` is seen
            // at once rather than at the next gap's end.
            let mut last = O::now();
            loop {
                O::yield_cpu();
                let mut now = O::now();
                while now.duration_since(last) < BLOCK_GAP {
                    if pace == Pace::Sparse {
                        if let Some(v) = poll(Look::Quick)? {
                            return Ok(Some(v));
                        }
                    }
                    crate::sync::spin_loop();
                    now = O::now();
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
        WaitStrategy::Park => {}
        WaitStrategy::BusyPoll(budget) => {
            return match took_cpu_share_note() {
                CpuShare::Unknown => busy_poll::<O, T, F>(budget, poll, false),
                CpuShare::Maybe => busy_poll::<O, T, F>(budget, poll, true),
                CpuShare::Shared => Ok(None),
            };
        }
    }
    Ok(None)
}

/// What this thread knows of its CPU's sharing since its last `BusyPoll` busy phase (see
/// `WaitStrategy::BusyPoll`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum CpuShare {
    /// Nothing: poll without a break.
    Unknown,
    /// The peer may be queued on it: the thread woke a sleeping peer, or slept itself. Yield
    /// now and then.
    Maybe,
    /// It is shared: a yield of the last busy phase got the CPU back only after something
    /// else ran. Park at once.
    Shared,
}

// Not under loom: loom runs every modelled thread on one OS thread, which would share the
// note, and the yields would add schedule points to the models.
#[cfg(not(shmflow_loom))]
thread_local! {
    static CPU_SHARE: std::cell::Cell<CpuShare> = const { std::cell::Cell::new(CpuShare::Unknown) };
}

/// Notes what this thread learnt of its CPU's sharing (the stronger note stays).
#[inline]
fn note_cpu_share(share: CpuShare) {
    #[cfg(not(shmflow_loom))]
    CPU_SHARE.with(|w| w.set(w.get().max(share)));
    #[cfg(shmflow_loom)]
    let _ = share;
}

/// What this thread has noted of its CPU's sharing since the last call; clears the note.
#[inline]
fn took_cpu_share_note() -> CpuShare {
    #[cfg(not(shmflow_loom))]
    let share = CPU_SHARE.with(|w| w.replace(CpuShare::Unknown));
    #[cfg(shmflow_loom)]
    let share = CpuShare::Unknown;
    share
}

/// Polls continuously for `budget`. `None` if nothing turned up. `yields`: the CPU is given
/// up after [`BLOCK_EAGER`] and then every [`BLOCK_GAP`] (the peer may be queued on it, see
/// `WaitStrategy::BusyPoll`); a yield that gets the CPU back only after [`BLOCK_EAGER`] or
/// more (something else ran on it) is followed by a second one, and if that one too comes
/// back late, the thread leaves the CPU or, if it cannot, ends the phase and notes the CPU
/// shared.
fn busy_poll<O: Os, T, F>(
    budget: Duration,
    poll: &mut impl FnMut(Look) -> Result<Option<T>, F>,
    yields: bool,
) -> Result<Option<T>, F> {
    let start = O::now();
    // The time since `start` at which to yield next.
    let mut yield_at = BLOCK_EAGER;
    let mut i = 0u32;
    loop {
        if let Some(v) = poll(Look::Quick)? {
            return Ok(Some(v));
        }
        i = i.wrapping_add(1);
        if i % O::POLLS_PER_CLOCK == 0 {
            let now = O::now();
            let waited = now.duration_since(start);
            if waited >= budget {
                return Ok(None);
            }
            if yields && waited >= yield_at {
                O::yield_cpu();
                let back = O::now();
                if back.duration_since(now) >= BLOCK_EAGER {
                    // Something else ran here meanwhile. A thread that may move elsewhere
                    // (at most once a gap, see `may_leave_cpu`) and has budget left does, or
                    // tests first.
                    let may = back.duration_since(start) < budget && may_leave_cpu::<O>(back);
                    if let Some(v) = poll(Look::Quick)? {
                        // The peer wrote it meanwhile: it ran on this CPU, and will be waited
                        // for here again. The thread moves if it may; if not, the next wait
                        // parks at once, which lets the peer run.
                        let moved = may && O::leave_cpu();
                        note_cpu_share(if moved {
                            CpuShare::Maybe
                        } else {
                            CpuShare::Shared
                        });
                        return Ok(Some(v));
                    }
                    // Nothing came: it yields once more to tell whether what ran still wants
                    // this CPU. Back at once, it has gone (of two peers that find their CPU
                    // shared at once, the one that yields second sees the first gone) or has
                    // used its time slice, and polling goes on; still shared, the thread
                    // moves to another CPU and polls on there.
                    if may {
                        O::yield_cpu();
                        let again = O::now();
                        if again.duration_since(back) < BLOCK_EAGER || O::leave_cpu() {
                            // The CPU may be shared still: the next busy phase yields too.
                            note_cpu_share(CpuShare::Maybe);
                            yield_at = again.duration_since(start) + BLOCK_GAP;
                            continue;
                        }
                    }
                    // Shared, and this thread stays (it may run here only, its move failed,
                    // or it tried less than its gap ago). The next wait parks at once
                    // (this one re-checks first): the peer runs, and the wake-up it sends may
                    // let the scheduler place this thread on an idle CPU.
                    note_cpu_share(CpuShare::Shared);
                    return Ok(None);
                }
                yield_at = back.duration_since(start) + BLOCK_GAP;
            }
        }
        crate::sync::spin_loop();
    }
}

/// How soon after a busy phase found its CPU shared and yielded a second time (and perhaps
/// moved) a busy phase that finds its CPU shared parks instead, at first: where every CPU is
/// busy, a thread that kept moving would only trade one shared CPU for another, each move
/// costing a migration, and one that kept polling beside a program that gives a second yield
/// back at once would keep its CPU from that program.
const LEAVE_GAP: Duration = Duration::from_millis(1);

/// The longest gap between two such second yields: a thread that finds its CPU shared again
/// and again (within [`LEAVE_QUIET`] gaps of its last try each time) doubles its gap up to
/// this, so that many busy-polling threads on a machine with fewer CPUs than they need do
/// not each move a thousand times a second.
const LEAVE_GAP_MAX: Duration = Duration::from_millis(64);

/// A try that comes this many gaps or more after the last one sets the gap back to
/// [`LEAVE_GAP`]: the thread found no shared CPU worth a try for that long.
const LEAVE_QUIET: u32 = 4;

// Not under loom (see `CPU_SHARE`).
#[cfg(not(shmflow_loom))]
thread_local! {
    /// When this thread last yielded a second time on a CPU found shared, and the gap before
    /// it may do so again.
    static LEFT_AT: std::cell::Cell<Option<(std::time::Instant, Duration)>> = const { std::cell::Cell::new(None) };
}

/// Whether this thread, finding its CPU shared at `now`, yields a second time and may move
/// to another: it may run on another CPU, and its last try was at least its gap ago (noted
/// now if it does, with the gap before the next: twice the last, up to [`LEAVE_GAP_MAX`], if
/// the last try was less than [`LEAVE_QUIET`] gaps ago, else [`LEAVE_GAP`]).
fn may_leave_cpu<O: Os>(now: std::time::Instant) -> bool {
    #[cfg(not(shmflow_loom))]
    {
        let gap = match LEFT_AT.with(std::cell::Cell::get) {
            None => LEAVE_GAP,
            Some((at, gap)) => {
                let since = now.duration_since(at);
                if since < gap {
                    return false;
                }
                if since < gap * LEAVE_QUIET {
                    (gap * 2).min(LEAVE_GAP_MAX)
                } else {
                    LEAVE_GAP
                }
            }
        };
        if O::other_cpus() {
            LEFT_AT.with(|l| l.set(Some((now, gap))));
            return true;
        }
        false
    }
    #[cfg(shmflow_loom)]
    {
        let _ = now;
        false
    }
}

/// Announces on `word` that the waiter sleeps (an RMW, so that it synchronizes with the
/// notifier's RMW), with the heavy barrier if the notifier may use the light form: the value
/// to sleep on, and how long to sleep at most before looking again.
fn announce<O: Os>(
    word: &FutexWord,
    light: Notifier,
    timeout: Option<Duration>,
    doorbell: bool,
) -> (u32, Duration) {
    let p = word.atomic();
    let bits = if doorbell { PARKED | DOORBELL } else { PARKED };
    let mut now = p.fetch_or(bits, Ordering::AcqRel) | bits;
    let mut nap = match timeout {
        Some(t) => t.min(CHECK_INTERVAL),
        None => CHECK_INTERVAL,
    };
    if light == Notifier::Light && now & NO_FENCE == 0 {
        // SYNC POINT: the heavy half of the asymmetric barrier (see the module docs).
        #[cfg(not(shmflow_broken = "no_waiter_fence"))]
        let fenced = O::waiter_fence();
        #[cfg(shmflow_broken = "no_waiter_fence")]
        let fenced = true;
        if !fenced {
            // From now on the notifier reads the bit and uses the RMW; the one that may have
            // read P just before is covered by a short first sleep.
            now = p.fetch_or(NO_FENCE, Ordering::AcqRel) | NO_FENCE | PARKED;
            nap = nap.min(Duration::from_millis(1));
        }
    }
    (now, nap)
}

/// Waits until `poll` yields a value: first a bounded busy phase, then parking on `word` until
/// the peer notifies (or the deadline passes). `poll` must also report the peer's closing,
/// so that a closed peer ends the wait. `poll(Look::Now)` is called after each sleep, at least every
/// [`CHECK_INTERVAL`]: that is when it should also check that the peer is alive (a syscall,
/// so never on the busy path).
pub(crate) fn wait_for<O: Os, T, P: Patience, F>(
    word: &FutexWord,
    strategy: WaitStrategy,
    patience: P,
    light: Notifier,
    pace: Pace,
    mut poll: impl FnMut(Look) -> Result<Option<T>, F>,
) -> Result<T, Halt<P::Expired, F>> {
    // `Block` looks again in its own time (see `spin_phase`).
    if strategy != WaitStrategy::Block || !patience.waits() {
        if let Some(v) = poll(Look::Quick)? {
            return Ok(v);
        }
    }
    if let Some(x) = patience.immediate() {
        if let Some(v) = poll(Look::IfDue)? {
            return Ok(v);
        }
        return Err(Halt::Expired(x));
    }
    if let Some(v) = spin_phase::<O, T, F>(strategy, pace, &mut poll)? {
        return Ok(v);
    }
    let p = word.atomic();
    loop {
        let timeout = match patience.remaining() {
            Ok(t) => t,
            Err(x) => {
                // A caller that loops on short deadlines learns of a dead peer too.
                if let Some(v) = poll(Look::IfDue)? {
                    return Ok(v);
                }
                return Err(Halt::Expired(x));
            }
        };
        let (now, nap) = announce::<O>(word, light, timeout, false);
        #[cfg(not(shmflow_broken = "no_recheck"))]
        let ready = poll(Look::Quick);
        #[cfg(shmflow_broken = "no_recheck")]
        let ready: Result<Option<T>, F> = Ok(None);
        match ready {
            Ok(Some(v)) => {
                p.fetch_and(!PARKED, Ordering::AcqRel);
                return Ok(v);
            }
            Err(e) => {
                p.fetch_and(!PARKED, Ordering::AcqRel);
                return Err(Halt::Failed(e));
            }
            Ok(None) => {}
        }
        O::futex_wait(word, now, Some(nap), timeout.is_some());
        // An RMW, not a store: keeps every write to P in the notifier's release sequence.
        p.fetch_and(!PARKED, Ordering::AcqRel);
        // This CPU was idle meanwhile and may have taken over the peer (see `BusyPoll`).
        note_cpu_share(CpuShare::Maybe);
        if let Some(v) = poll(Look::Now)? {
            return Ok(v);
        }
    }
}

/// What an async waiter sleeps on: its park word, and the word's doorbell if this process
/// holds it.
#[cfg(any(feature = "tokio", shmflow_loom))]
pub(crate) struct WaitOn<'a, O: Os> {
    pub(crate) word: &'a FutexWord,
    pub(crate) bell: Option<&'a O::Bell>,
}

/// What watches a park word for a task that cannot sleep on a doorbell: the bridge thread
/// (`region::bridge`), which the region layer runs.
#[cfg(any(feature = "tokio", shmflow_loom))]
pub(crate) trait Watcher {
    /// Completes when `word` no longer holds `expected`, or `nap` has passed, without blocking
    /// the thread. Dropping the future withdraws the request. `Err` if the watcher could not
    /// be started.
    ///
    /// # Safety
    /// The watcher reads `word` until the future completes or is dropped; a future that is
    /// leaked (`mem::forget`) is never withdrawn. `word` must stay in memory that long.
    unsafe fn watch<'a>(
        &'a self,
        word: &'a FutexWord,
        expected: u32,
        nap: Duration,
    ) -> impl std::future::Future<Output = std::io::Result<()>> + Send + 'a;
}

/// Clears `PARKED` when dropped: an async waiter's announcement is withdrawn however its wait
/// ends (a value, an error, or the future dropped).
#[cfg(any(feature = "tokio", shmflow_loom))]
struct Announced<'a>(&'a FutexWord);

#[cfg(any(feature = "tokio", shmflow_loom))]
impl Drop for Announced<'_> {
    fn drop(&mut self) {
        // An RMW, not a store: keeps every write to P in the notifier's release sequence.
        self.0
            .atomic()
            .fetch_and(!(PARKED | DOORBELL), Ordering::AcqRel);
    }
}

/// The async form of [`wait_for`], with no deadline (a caller that wants one drops the
/// future: nothing is lost, see below). The protocol is the same — announce, heavy barrier if
/// the notifier may be light, re-check, sleep, withdraw — but the task sleeps in its executor:
/// on the word's doorbell, registered with the runtime's reactor, where this process holds it
/// and every notifier does (`RINGABLE` without `BELL_LESS`; the announcement then carries
/// `DOORBELL`, and the notifier rings instead of waking the futex); otherwise in a
/// [`Watcher::watch`] (the bridge thread watches the word).
///
/// The busy phase is the blocking one's, with a yield to the executor where a thread would
/// yield its CPU: `Park` skips it, `Block` looks as `spin_phase` does (by `pace`), `BusyPoll(d)`
/// polls between yields for `d`. `poll(Look::Now)` runs after each sleep, which
/// lasts at most [`CHECK_INTERVAL`]: the peer's liveness is looked at as often as a thread's.
///
/// Cancellation: dropping the future withdraws the announcement (both bits), the reactor
/// registration and the bridge entry; a ring that comes after is a spurious wake-up of the
/// next wait, which looks again. `poll`
/// must leave the caller's state consistent whenever it returns (it does: every poll closure
/// is also a `try_` call).
///
/// # Safety
/// As [`Watcher::watch`]: `word` must stay in memory until the future completes or is dropped,
/// or for good if it is leaked.
#[cfg(any(feature = "tokio", shmflow_loom))]
pub(crate) async unsafe fn wait_async<O: AsyncOs, T, F: From<Box<SysError>>>(
    on: WaitOn<'_, O>,
    region: &str,
    watcher: &impl Watcher,
    strategy: WaitStrategy,
    light: Notifier,
    pace: Pace,
    mut poll: impl FnMut(Look) -> Result<Option<T>, F>,
) -> Result<T, F> {
    let WaitOn { word, bell } = on;
    // What `poll` gave: a value or an error ends the wait.
    macro_rules! done {
        ($r:expr) => {
            match $r {
                Ok(None) => {}
                Ok(Some(v)) => return Ok(v),
                Err(e) => return Err(e),
            }
        };
    }
    // `Block` looks again in its own time (as `wait_for`): a streaming writer is left alone
    // for a gap first (see `spin_phase`).
    if strategy != WaitStrategy::Block {
        done!(poll(Look::Quick));
    }
    match strategy {
        WaitStrategy::Park => {}
        WaitStrategy::BusyPoll(budget) => {
            // Polls between yields to the executor, so that other tasks run.
            let start = O::now();
            loop {
                O::yield_now().await;
                done!(poll(Look::Quick));
                if O::now().duration_since(start) >= budget {
                    break;
                }
            }
        }
        WaitStrategy::Block => {
            // As `spin_phase`: continuous looks first unless the peer streams, then a yield to
            // the executor every `BLOCK_GAP` (other tasks run), looking after each gap (a
            // streaming peer) or throughout it (sparse traffic), up to `BLOCK_SPIN`.
            let start = O::now();
            if pace != Pace::Stream {
                done!(busy_poll::<O, T, F>(BLOCK_EAGER, &mut poll, false));
            }
            let mut last = O::now();
            loop {
                O::yield_now().await;
                let mut now = O::now();
                while now.duration_since(last) < BLOCK_GAP {
                    if pace == Pace::Sparse {
                        done!(poll(Look::Quick));
                    }
                    crate::sync::spin_loop();
                    now = O::now();
                }
                last = now;
                done!(poll(Look::Quick));
                if now.duration_since(start) >= BLOCK_SPIN {
                    break;
                }
            }
        }
    }
    // The doorbell's registration with the reactor, kept while the wait goes on.
    let mut watch = None;
    loop {
        // The doorbell if this process holds it, so does every notifier (`RINGABLE`, no
        // `BELL_LESS`), and a tokio runtime runs this task (its reactor waits on the bell;
        // another executor's task sleeps through the bridge, which needs only a waker).
        let ring = bell.filter(|_| {
            word.atomic().load(Ordering::Relaxed) & (RINGABLE | BELL_LESS) == RINGABLE
                && O::in_runtime()
        });
        let (now, nap) = announce::<O>(word, light, None, ring.is_some());
        let announced = Announced(word);
        #[cfg(not(shmflow_broken = "async_no_recheck"))]
        done!(poll(Look::Quick));
        match ring {
            // `BELL_LESS` came with the announcement: the futex, through the bridge (a
            // bell-less notifier's RMW changes the word the bridge watches).
            Some(b) if now & BELL_LESS == 0 => {
                // SAFETY: `watch` is this wait's, dropped at its end, and `b` is borrowed for
                // the whole wait.
                unsafe { O::rung(b, &mut watch, nap) }.await.map_err(|e| {
                    crate::error::sys(
                        region,
                        "wait for the doorbell in the tokio runtime's reactor (the runtime needs \
                     its IO and time drivers: `enable_all` on its builder)",
                        e,
                    )
                })?
            }
            // SAFETY: the caller's contract is `watch`'s.
            _ => unsafe { watcher.watch(word, now, nap) }
                .await
                .map_err(|e| {
                    crate::error::sys(region, "start the thread that wakes async waiters", e)
                })?,
        }
        drop(announced);
        done!(poll(Look::Now));
    }
}

#[cfg(all(test, not(shmflow_loom)))]
mod cpu_shared_note_tests {
    //! When a `BusyPoll` busy phase yields its CPU, driven by a scripted OS whose clock moves
    //! only when the code under test polls, yields or sleeps.
    use super::*;
    use std::cell::Cell;
    use std::sync::OnceLock;
    use std::time::Instant;

    thread_local! {
        static CLOCK: Cell<Duration> = const { Cell::new(Duration::ZERO) };
        static YIELD_TAKES: Cell<Duration> = const { Cell::new(Duration::ZERO) };
        static YIELDS: Cell<u32> = const { Cell::new(0) };
        static SLEEPS: Cell<u32> = const { Cell::new(0) };
        static YIELDED_AT: std::cell::RefCell<Vec<Duration>> = const { std::cell::RefCell::new(Vec::new()) };
        /// How long the next yields take, before `YIELD_TAKES` again.
        static YIELD_SCRIPT: std::cell::RefCell<Vec<Duration>> = const { std::cell::RefCell::new(Vec::new()) };
        static CAN_LEAVE: Cell<bool> = const { Cell::new(false) };
        static MOVE_FAILS: Cell<bool> = const { Cell::new(false) };
        static LEAVES: Cell<u32> = const { Cell::new(0) };
        static LEFT_WHEN: std::cell::RefCell<Vec<Duration>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    fn advance(d: Duration) {
        CLOCK.with(|c| c.set(c.get() + d));
    }

    /// A yield that gets the CPU back after `d`: 0.4 µs is a system call with nothing else
    /// to run, 30 µs a peer that ran meanwhile.
    fn yields_take(d: Duration) {
        YIELD_TAKES.with(|y| y.set(d));
    }

    fn yields() -> u32 {
        YIELDS.with(|y| y.replace(0))
    }

    struct Scripted;

    impl Os for Scripted {
        type Bell = ();
        fn futex_wait(_: &FutexWord, _: u32, _: Option<Duration>, _: bool) {
            SLEEPS.with(|s| s.set(s.get() + 1));
            advance(Duration::from_millis(1));
        }
        fn futex_wake(_: &FutexWord) {}
        fn ring(_: &()) {}
        fn waiter_fence() -> bool {
            true
        }
        fn light_notify_available() -> bool {
            false
        }
        fn yield_cpu() {
            YIELDS.with(|y| y.set(y.get() + 1));
            YIELDED_AT.with(|v| v.borrow_mut().push(CLOCK.with(Cell::get)));
            let scripted = YIELD_SCRIPT.with(|v| {
                let mut v = v.borrow_mut();
                (!v.is_empty()).then(|| v.remove(0))
            });
            advance(scripted.unwrap_or_else(|| YIELD_TAKES.with(Cell::get)));
        }
        fn other_cpus() -> bool {
            CAN_LEAVE.with(Cell::get)
        }
        fn leave_cpu() -> bool {
            LEAVES.with(|l| l.set(l.get() + 1));
            LEFT_WHEN.with(|v| v.borrow_mut().push(CLOCK.with(Cell::get)));
            CAN_LEAVE.with(Cell::get) && !MOVE_FAILS.with(Cell::get)
        }
        fn now() -> Instant {
            static BASE: OnceLock<Instant> = OnceLock::new();
            *BASE.get_or_init(Instant::now) + CLOCK.with(Cell::get)
        }
        const POLLS_PER_CLOCK: u32 = 1;
    }

    /// One busy phase of `BusyPoll(100 µs)` in which nothing turns up (each look 0.1 µs).
    fn empty_busy_phase() {
        let mut poll = |_: Look| -> Result<Option<()>, ()> {
            advance(Duration::from_nanos(100));
            Ok(None)
        };
        let strategy = WaitStrategy::BusyPoll(Duration::from_micros(100));
        assert_eq!(
            spin_phase::<Scripted, (), ()>(strategy, Pace::Sparse, &mut poll),
            Ok(None)
        );
    }

    fn fresh() {
        took_cpu_share_note();
        yields();
        yields_take(Duration::from_nanos(400));
        LEFT_AT.with(|l| l.set(None));
        CAN_LEAVE.with(|c| c.set(false));
        MOVE_FAILS.with(|m| m.set(false));
        LEAVES.with(|l| l.set(0));
        LEFT_WHEN.with(|v| v.borrow_mut().clear());
        YIELD_SCRIPT.with(|v| v.borrow_mut().clear());
    }

    fn leaves() -> u32 {
        LEAVES.with(|l| l.replace(0))
    }

    /// Notes that the thread woke a sleeping peer: the next busy phase yields.
    fn woke_a_peer() {
        let word = FutexWord(AtomicU32::new(PARKED));
        assert!(notify::<Scripted>(&word, None));
    }

    #[test]
    fn a_busy_phase_polls_without_a_break_unless_its_cpu_may_be_shared() {
        fresh();
        let began = Scripted::now();
        empty_busy_phase();
        assert_eq!(
            (yields(), Scripted::now() - began),
            (0, Duration::from_micros(100))
        );
    }

    #[test]
    fn waking_a_sleeping_peer_makes_the_next_busy_phase_yield_every_gap() {
        fresh();
        let word = FutexWord(AtomicU32::new(PARKED));
        assert!(notify::<Scripted>(&word, None));
        YIELDED_AT.with(|v| v.borrow_mut().clear());
        let began = CLOCK.with(Cell::get);
        empty_busy_phase();
        // 100 µs of looks at 0.1 µs each, a yield of 0.4 µs after 2 µs and then after every 5
        // µs of looks: 19.
        assert_eq!(yields(), 19);
        let at: Vec<Duration> =
            YIELDED_AT.with(|v| v.borrow().iter().map(|t| *t - began).collect());
        assert_eq!(at[0], Duration::from_micros(2));
        assert_eq!(at[1], Duration::from_nanos(7_400));
        assert_eq!(at[18], Duration::from_nanos(99_200));
        // Each yield came back at once: nothing else wanted the CPU, so the next phase
        // polls without a break again.
        empty_busy_phase();
        assert_eq!(yields(), 0);
    }

    #[test]
    fn a_yield_that_gave_the_cpu_away_ends_the_busy_phase_of_a_thread_that_cannot_leave() {
        fresh();
        woke_a_peer();
        yields_take(Duration::from_micros(30));
        let began = Scripted::now();
        empty_busy_phase();
        assert_eq!((yields(), leaves()), (1, 0));
        // 2 µs of looks, the yield, one more look: the phase ended long before its 100 µs.
        assert_eq!(Scripted::now() - began, Duration::from_nanos(32_100));
        // The CPU is shared: the next wait parks without a busy phase.
        let began = Scripted::now();
        empty_busy_phase();
        assert_eq!((yields(), Scripted::now()), (0, began));
        // Nothing noted since: the one after polls without a break.
        empty_busy_phase();
        assert_eq!(
            (yields(), Scripted::now() - began),
            (0, Duration::from_micros(100))
        );
    }

    #[test]
    fn a_cpu_shared_for_one_yield_only_keeps_the_busy_phase_going() {
        fresh();
        CAN_LEAVE.with(|c| c.set(true));
        woke_a_peer();
        // The first yield comes back late, the second at once: what ran has gone.
        YIELD_SCRIPT.with(|v| *v.borrow_mut() = vec![Duration::from_micros(30)]);
        let began = Scripted::now();
        empty_busy_phase();
        assert_eq!(leaves(), 0);
        assert!(Scripted::now() - began >= Duration::from_micros(100));
        // The CPU may be shared still: the next phase yields every gap.
        yields();
        empty_busy_phase();
        assert_eq!(yields(), 19);
    }

    #[test]
    fn a_second_yield_back_at_once_excuses_a_shared_cpu_at_most_once_a_gap() {
        fresh();
        CAN_LEAVE.with(|c| c.set(true));
        woke_a_peer();
        // Late, at once (excused: polling goes on), then late again within the first gap (1 ms):
        // as a program that has used its time slice gives the second yield back at once.
        yields_take(Duration::from_micros(30));
        YIELD_SCRIPT
            .with(|v| *v.borrow_mut() = vec![Duration::from_micros(30), Duration::from_nanos(400)]);
        let began = Scripted::now();
        empty_busy_phase();
        assert_eq!((yields(), leaves()), (3, 0));
        assert!(Scripted::now() - began < Duration::from_micros(100));
        // The phase ended: the next wait parks without one.
        let began = Scripted::now();
        empty_busy_phase();
        assert_eq!((yields(), Scripted::now()), (0, began));
    }

    #[test]
    fn a_reply_written_while_the_cpu_was_away_ends_the_wait_at_once() {
        fresh();
        CAN_LEAVE.with(|c| c.set(true));
        woke_a_peer();
        yields_take(Duration::from_micros(30));
        reply_while_away();
        // No second yield: the peer ran here, the thread moves at once, and its next busy
        // phase yields.
        assert_eq!((yields(), leaves()), (1, 1));
        yields_take(Duration::from_nanos(400));
        empty_busy_phase();
        assert_eq!(yields(), 19);
    }

    /// A busy phase in which the reply is written during the first yield (which the peer,
    /// on this CPU, took): the phase returns it.
    fn reply_while_away() {
        let mut poll = |_: Look| -> Result<Option<()>, ()> {
            advance(Duration::from_nanos(100));
            Ok((YIELDS.with(Cell::get) > 0).then_some(()))
        };
        let strategy = WaitStrategy::BusyPoll(Duration::from_micros(100));
        assert_eq!(
            spin_phase::<Scripted, (), ()>(strategy, Pace::Sparse, &mut poll),
            Ok(Some(()))
        );
    }

    #[test]
    fn a_reply_written_while_the_cpu_was_away_on_a_thread_that_cannot_move_makes_the_next_wait_park(
    ) {
        fresh();
        woke_a_peer();
        yields_take(Duration::from_micros(30));
        reply_while_away();
        assert_eq!((yields(), leaves()), (1, 0));
        // The peer shares this CPU: the next wait parks without a busy phase.
        let began = Scripted::now();
        empty_busy_phase();
        assert_eq!((yields(), Scripted::now()), (0, began));
    }

    #[test]
    fn a_move_that_fails_ends_the_busy_phase() {
        fresh();
        CAN_LEAVE.with(|c| c.set(true));
        MOVE_FAILS.with(|m| m.set(true));
        woke_a_peer();
        yields_take(Duration::from_micros(30));
        let began = Scripted::now();
        empty_busy_phase();
        assert_eq!((yields(), leaves()), (2, 1));
        assert!(Scripted::now() - began < Duration::from_micros(100));
        let began = Scripted::now();
        empty_busy_phase();
        assert_eq!((yields(), Scripted::now()), (0, began));
    }

    #[test]
    fn a_thread_whose_cpu_stays_shared_leaves_it_at_most_once_a_gap() {
        fresh();
        CAN_LEAVE.with(|c| c.set(true));
        woke_a_peer();
        yields_take(Duration::from_micros(30));
        let began = Scripted::now();
        empty_busy_phase();
        // Shared at 2 µs (two late yields): it leaves and polls on; shared again a gap later
        // (a late yield at 67 µs), less than a millisecond after leaving: the phase ends.
        assert_eq!((yields(), leaves()), (3, 1));
        assert_eq!(Scripted::now() - began, Duration::from_nanos(97_200));
        // The next wait parks without a busy phase.
        let began = Scripted::now();
        empty_busy_phase();
        assert_eq!((yields(), Scripted::now()), (0, began));
        // A first gap (1 ms) after it left, a thread that finds its CPU shared leaves again.
        advance(Duration::from_millis(1));
        woke_a_peer();
        empty_busy_phase();
        assert_eq!(leaves(), 1);
    }

    #[test]
    fn a_try_less_than_four_gaps_after_the_last_doubles_the_gap_and_a_later_one_resets_it() {
        fresh();
        CAN_LEAVE.with(|c| c.set(true));
        advance(Duration::from_secs(1));
        let now = Scripted::now();
        let g = Duration::from_millis(8);
        let last_try = |since: Duration| LEFT_AT.with(|l| l.set(Some((now - since, g))));
        let noted = || LEFT_AT.with(Cell::get);
        // Within the gap: no try, nothing noted.
        last_try(g - Duration::from_nanos(1));
        assert!(!may_leave_cpu::<Scripted>(now));
        assert_eq!(noted(), Some((now - g + Duration::from_nanos(1), g)));
        // A gap after: a try, and the gap doubles; so it does just under four gaps after.
        last_try(g);
        assert!(may_leave_cpu::<Scripted>(now));
        assert_eq!(noted(), Some((now, g * 2)));
        last_try(g * LEAVE_QUIET - Duration::from_nanos(1));
        assert!(may_leave_cpu::<Scripted>(now));
        assert_eq!(noted(), Some((now, g * 2)));
        // Four gaps after: a try, and the gap is the first one again.
        last_try(g * LEAVE_QUIET);
        assert!(may_leave_cpu::<Scripted>(now));
        assert_eq!(noted(), Some((now, LEAVE_GAP)));
        // The gap stops doubling at its longest.
        LEFT_AT.with(|l| l.set(Some((now - LEAVE_GAP_MAX, LEAVE_GAP_MAX))));
        assert!(may_leave_cpu::<Scripted>(now));
        assert_eq!(noted(), Some((now, LEAVE_GAP_MAX)));
        // A thread that may run on this CPU only makes no try, and nothing is noted.
        CAN_LEAVE.with(|c| c.set(false));
        last_try(g * 2);
        assert!(!may_leave_cpu::<Scripted>(now));
        assert_eq!(noted(), Some((now - g * 2, g)));
    }

    #[test]
    fn a_thread_whose_cpu_stays_shared_tries_to_leave_less_often_until_a_cpu_is_spared() {
        fresh();
        CAN_LEAVE.with(|c| c.set(true));
        yields_take(Duration::from_micros(30));
        // A busy phase that finds its CPU shared every millisecond or so (as on a machine with
        // more busy-polling threads than CPUs), for half a second.
        let shared_phase = || {
            took_cpu_share_note();
            woke_a_peer();
            empty_busy_phase();
            advance(Duration::from_millis(1));
        };
        let began = CLOCK.with(Cell::get);
        while CLOCK.with(Cell::get) - began < Duration::from_millis(500) {
            shared_phase();
        }
        let when = LEFT_WHEN.with(|v| std::mem::take(&mut *v.borrow_mut()));
        let gaps: Vec<Duration> = when.windows(2).map(|w| w[1] - w[0]).collect();
        // Each try comes at least twice the last gap after it (the first 1 ms), at most 64 ms,
        // and within the phase after that (1.1 ms apart).
        let mut least = LEAVE_GAP;
        for g in &gaps {
            assert!(
                *g >= least && *g < least + Duration::from_micros(1_200),
                "{gaps:?}"
            );
            least = (least * 2).min(LEAVE_GAP_MAX);
        }
        // 1, 2, 4, 8, 16, 32 ms, then 64 ms apart (each a little more): 13 tries in half a
        // second, against some 450 with a fixed gap.
        assert_eq!(when.len(), 13, "{gaps:?}");
        // Four gaps of 64 ms (and the time since the last try) without a try: the next
        // finding of a shared CPU tries at once, and the gap is a millisecond again.
        advance(LEAVE_GAP_MAX * LEAVE_QUIET);
        shared_phase();
        shared_phase();
        let when = LEFT_WHEN.with(|v| std::mem::take(&mut *v.borrow_mut()));
        assert_eq!(when.len(), 2);
        assert!(when[1] - when[0] < Duration::from_millis(2));
    }

    #[test]
    fn a_sleep_in_a_wait_makes_the_next_busy_phase_yield() {
        fresh();
        let word = FutexWord(AtomicU32::new(0));
        SLEEPS.with(|s| s.set(0));
        let got = wait_for::<Scripted, u32, _, ()>(
            &word,
            WaitStrategy::BusyPoll(Duration::from_micros(50)),
            Forever,
            Notifier::Rmw,
            Pace::Sparse,
            |_| {
                advance(Duration::from_nanos(100));
                Ok(SLEEPS.with(Cell::get).checked_sub(1).map(|_| 7))
            },
        );
        assert!(matches!(got, Ok(7)));
        assert_eq!(SLEEPS.with(Cell::get), 1);
        // The wait's own busy phase had no reason to yield.
        assert_eq!(yields(), 0);
        empty_busy_phase();
        assert_eq!(yields(), 19);
    }
}
