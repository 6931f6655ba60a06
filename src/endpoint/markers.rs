//! Latency markers (Flink's `metrics.latency.interval`): what a user sets and receives, and
//! the process's marker clock.
//!
//! A producer (or a partition) with markers on emits one in band every interval; whoever
//! reads it (a consumer, a gate) counts its age in its region's latency table, per source
//! (`protocol::latency`), and hands it out as a message so that a stage passes it on.
//!
//! **The clock.** The hot path must not read the clock: a record costs a few nanoseconds, a
//! clock read about 25. One thread per process, started with the first producer that emits
//! markers and gone with the last, publishes a coarse monotonic clock (nanoseconds since the
//! process's marker epoch) once per the shortest interval asked for (at most once a second);
//! a producer compares it with the time its next marker is due at, a load of a line that
//! changes once per tick (`u64::MAX` when markers are off: never due). Being a time, not a
//! count of ticks, a due time stays right when the tick's length changes as producers come
//! and go. A marker that finds no room without waiting goes after the next record instead, so
//! a marker never makes a producer wait.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::protocol::latency::MAX_LABEL;

/// Markers on: how often, and the source's label. See
/// [`Producer::set_latency_markers`](crate::Producer::set_latency_markers).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LatencyMarkers {
    interval: Duration,
    source: String,
}

impl LatencyMarkers {
    /// One marker every `interval` (at least 100 µs; Flink's `metrics.latency.interval`),
    /// labelled `source` (at most 32 bytes: a longer label is cut at a character boundary).
    ///
    /// ```
    /// use std::time::Duration;
    /// let m = shmflow::LatencyMarkers::every(Duration::from_millis(1), "read-0");
    /// assert_eq!((m.interval(), m.source()), (Duration::from_millis(1), "read-0"));
    /// ```
    pub fn every(interval: Duration, source: &str) -> LatencyMarkers {
        let mut end = source.len().min(MAX_LABEL);
        while !source.is_char_boundary(end) {
            end -= 1;
        }
        LatencyMarkers {
            interval: interval.max(MIN_INTERVAL),
            source: source[..end].to_owned(),
        }
    }

    /// The interval between two markers.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The label of the source.
    pub fn source(&self) -> &str {
        &self.source
    }
}

/// A latency marker as received (Flink's `LatencyMarker`): its source and when it was sent.
/// Pass it on with [`Producer::forward_latency_marker`](crate::Producer::forward_latency_marker)
/// (or a partition's), so that the stages after this one measure from the same source.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LatencyMarker {
    emitted_ns: u64,
    label: [u8; MAX_LABEL],
    len: u8,
}

impl LatencyMarker {
    /// A marker from a received body: the emitter's clock and label (invalid UTF-8 in the
    /// label, from a foreign peer, is cut at the first bad byte).
    pub(crate) fn from_wire(emitted_ns: u64, label: &[u8]) -> LatencyMarker {
        let valid = match std::str::from_utf8(label) {
            Ok(s) => s.len(),
            Err(e) => e.valid_up_to(),
        };
        let mut l = [0u8; MAX_LABEL];
        l[..valid].copy_from_slice(&label[..valid]);
        LatencyMarker {
            emitted_ns,
            label: l,
            len: valid as u8,
        }
    }

    /// The label of the source that emitted it.
    pub fn source(&self) -> &str {
        std::str::from_utf8(&self.label[..self.len as usize]).unwrap_or("")
    }

    /// The label as bytes, for the wire.
    pub(crate) fn label(&self) -> &[u8] {
        &self.label[..self.len as usize]
    }

    /// When it was emitted: nanoseconds of the wall clock (`CLOCK_REALTIME`) since the Unix
    /// epoch, as Flink's markers carry the wall clock.
    pub fn emitted_ns(&self) -> u64 {
        self.emitted_ns
    }

    /// How long ago it was emitted, by this machine's wall clock (zero if the emitter's clock
    /// is ahead: a marker from another machine measures across the two clocks).
    pub fn age(&self) -> Duration {
        Duration::from_nanos(crate::sys::clock::realtime_ns().saturating_sub(self.emitted_ns))
    }
}

impl std::fmt::Debug for LatencyMarker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyMarker")
            .field("source", &self.source())
            .field("emitted_ns", &self.emitted_ns)
            .finish()
    }
}

/// The shortest interval between markers.
const MIN_INTERVAL: Duration = Duration::from_micros(100);

/// The coarse clock the producers compare with (on a line of its own: the ticker writes it,
/// every producer of the process reads it on every record).
static TICKS: CachePadded<AtomicU64> = CachePadded::new(AtomicU64::new(0));

/// The ticker's period, in nanoseconds.
static PERIOD_NS: AtomicU64 = AtomicU64::new(u64::MAX);

/// The longest tick: a long interval alone still gets a clock that moves.
const MAX_PERIOD_NS: u64 = 1_000_000_000;

/// The coarse clock: nanoseconds since the marker epoch, as of the ticker's last tick.
/// Relaxed: a producer only compares it with its own due time; a late view makes a marker a
/// tick late.
#[inline(always)]
pub(crate) fn ticks() -> u64 {
    TICKS.load(Ordering::Relaxed)
}

/// Nanoseconds since the marker epoch (the first call), read from the system's clock.
fn now_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(std::time::Instant::now);
    epoch.elapsed().as_nanos().min(u64::MAX as u128 / 2) as u64
}

/// Moves the coarse clock to now (never backwards: two writers may race).
fn tick() {
    TICKS.fetch_max(now_ns(), Ordering::Relaxed);
}

/// The ticker thread's bookkeeping: who needs it, and how fast.
struct Ticker {
    /// Producers (and partitions) with markers on, by interval in nanoseconds.
    users: Vec<u64>,
    /// The running thread's generation (a thread whose generation is not the current one
    /// ends), and whether one runs.
    generation: u64,
    running: bool,
    /// The process whose thread `running` speaks of: a child made by `fork` inherits the
    /// flag but not the thread, and starts its own.
    pid: u32,
}

static TICKER: Mutex<Ticker> = Mutex::new(Ticker {
    users: Vec::new(),
    generation: 0,
    running: false,
    pid: 0,
});

fn ticker() -> MutexGuard<'static, Ticker> {
    TICKER.lock().unwrap_or_else(|e| e.into_inner())
}

/// Set in a child made by `fork` (by [`on_fork_child`]), whose copy of the process has no
/// ticker thread; the coarse clock is then at its end, so that the next marker check of every
/// producer finds a marker due and comes to [`resume_after_fork`], which starts one.
static FORKED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The ticker's lock, held by the forking thread across a `fork` ([`on_fork_prepare`]).
    static HELD_FOR_FORK: RefCell<Option<MutexGuard<'static, Ticker>>> =
        const { RefCell::new(None) };
}

/// Before a `fork`: the ticker thread takes the lock once a period, and a fork while it held
/// it would leave the child a lock that nobody can release. The forking thread holds it
/// across the fork instead.
/// (A thread whose locals are gone, forking from a destructor, takes no part: the fork goes
/// on as without the handlers.)
extern "C" fn on_fork_prepare() {
    let _ = HELD_FOR_FORK.try_with(|h| *h.borrow_mut() = Some(ticker()));
}

/// After a `fork`, in the parent: the lock is released.
extern "C" fn on_fork_parent() {
    let _ = HELD_FOR_FORK.try_with(|h| drop(h.borrow_mut().take()));
}

/// After a `fork`, in the child (its only thread): the lock is released, and the clock moved
/// to its end (see [`FORKED`]). Only atomic stores and the unlock: what a child of a threaded
/// process may do.
extern "C" fn on_fork_child() {
    let _ = HELD_FOR_FORK.try_with(|h| drop(h.borrow_mut().take()));
    // Relaxed: the child has one thread now; threads it starts later see these through
    // their spawn. One short of the end: a producer with markers off waits for `u64::MAX`,
    // which never comes.
    FORKED.store(true, Ordering::Relaxed);
    TICKS.store(FORKED_TICKS, Ordering::Relaxed);
}

/// The clock in a child made by `fork` until [`settle_fork`]: beyond every due time a
/// producer with markers on can hold, short of a producer's "never" (`u64::MAX`).
const FORKED_TICKS: u64 = u64::MAX - 1;

/// In a child made by `fork`, once: the clock is set to now (the caller holds the ticker's
/// lock). The clock is stored before the flag is cleared: SYNC POINT, the Release store of
/// the flag pairs with the Acquire load in [`resume_after_fork`], so a thread that finds the
/// flag cleared finds the clock set (a marker computed from the end of the clock would make
/// its producer's next one due never).
fn settle_fork(_t: &mut Ticker) {
    if FORKED.load(Ordering::Acquire) {
        TICKS.store(now_ns(), Ordering::Relaxed);
        FORKED.store(false, Ordering::Release);
    }
}

/// Registers the `fork` handlers, once per process, before the lock is first taken for a
/// ticker (a fork between the two would copy the lock held). Refused, `fork` goes on as
/// without them: a child's clock stands still and it may inherit the lock held.
fn register_fork_handlers() {
    static AT_FORK: std::sync::Once = std::sync::Once::new();
    AT_FORK.call_once(|| {
        let _ = crate::sys::fork::at_fork(on_fork_prepare, on_fork_parent, on_fork_child);
    });
}

/// Starts a ticker thread for this process if none runs here (none was started, or this is a
/// child made by `fork`, which inherits the bookkeeping but not the thread). `false` if the
/// system refused the thread.
fn ensure_running(t: &mut Ticker) -> bool {
    if t.running && t.pid == std::process::id() {
        return true;
    }
    t.generation += 1;
    let generation = t.generation;
    let spawned = std::thread::Builder::new()
        .name("shmflow-markers".into())
        .spawn(move || run(generation));
    if spawned.is_err() {
        return false;
    }
    t.running = true;
    t.pid = std::process::id();
    true
}

/// Called by a producer whose marker check found a marker due: in a child made by `fork`
/// (the clock at its end), sets the clock to now and starts the child's ticker if producers
/// here still emit markers. One Relaxed load otherwise.
#[cold]
pub(crate) fn resume_after_fork() {
    // Acquire: pairs with the Release in `settle_fork` (the clock is set once it is clear).
    if !FORKED.load(Ordering::Acquire) {
        return;
    }
    let mut t = ticker();
    settle_fork(&mut t);
    if !t.users.is_empty() {
        // (Refused: the clock stands still, and markers stop until a thread can be had.)
        let _ = ensure_running(&mut t);
    }
}

/// A producer's (or partition's) registration with the ticker, and when its next marker is
/// due. Dropped, it leaves the ticker (which stops with its last user).
#[derive(Debug)]
pub(crate) struct Schedule {
    interval_ns: u64,
    label: String,
}

impl Schedule {
    /// Registers `m` with the ticker (starting it if needed). `None` if the system refused the
    /// ticker thread: markers stay off.
    pub(crate) fn start(m: &LatencyMarkers) -> Option<Schedule> {
        let interval_ns = m.interval.as_nanos().min(u64::MAX as u128) as u64;
        register_fork_handlers();
        let mut t = ticker();
        settle_fork(&mut t);
        t.users.push(interval_ns);
        let period = (*t.users.iter().min().expect("a user")).min(MAX_PERIOD_NS);
        PERIOD_NS.store(period, Ordering::Relaxed);
        // The clock is current from the first marker on, whether the ticker was asleep or not.
        tick();
        if !ensure_running(&mut t) {
            t.users.pop();
            return None;
        }
        Some(Schedule {
            interval_ns,
            label: m.source.clone(),
        })
    }

    /// When the marker after one emitted now is due, on the coarse clock.
    pub(crate) fn next_due(&self) -> u64 {
        ticks().saturating_add(self.interval_ns)
    }

    pub(crate) fn label(&self) -> &[u8] {
        self.label.as_bytes()
    }

    /// The settings it was started with.
    pub(crate) fn markers(&self) -> LatencyMarkers {
        LatencyMarkers {
            interval: Duration::from_nanos(self.interval_ns),
            source: self.label.clone(),
        }
    }
}

impl Drop for Schedule {
    fn drop(&mut self) {
        let mut t = ticker();
        if let Some(i) = t.users.iter().position(|&u| u == self.interval_ns) {
            t.users.swap_remove(i);
        }
        if let Some(&p) = t.users.iter().min() {
            PERIOD_NS.store(p.min(MAX_PERIOD_NS), Ordering::Relaxed);
        }
    }
}

/// The ticker thread: a tick per period while anyone needs it.
fn run(generation: u64) {
    loop {
        let period = PERIOD_NS.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_nanos(period.min(MAX_PERIOD_NS)));
        let mut t = ticker();
        if t.users.is_empty() || t.generation != generation {
            if t.generation == generation {
                t.running = false;
            }
            return;
        }
        tick();
    }
}
