//! The producer end: takes free segments from the return ring, frames records into them and
//! hands them to the consumer through the data ring.
//!
//! Claims and streamed records are in `writer.rs`, events in `events.rs`, ending the stream in
//! `close.rs`, the copy of a record's bytes in `copy.rs`.
//!
//! Protocol (the consumer's half is in `consumer.rs`):
//! 1. **Take** a segment: pop index `s` from the return ring, zero its first word (the end of
//!    its empty list of frames), then push `s` on the data ring (Release: the zero is visible
//!    before the index).
//! 2. **Write** frames at the private writer position. The first frame not yet published
//!    keeps a 0 in its header slot; later frames get their headers at once (unreachable).
//! 3. **Publish**: zero the word at the writer position, then store the first unpublished
//!    header with Release (every frame before the new 0 is visible to a consumer that loads
//!    that header with Acquire), then notify. See `frame.rs`.
//! 4. **Seal** when the next frame does not fit: a SEAL frame (none if the segment is full),
//!    published. The consumer returns a segment once it reads SEAL or its last byte.
//!
//! When a segment is needed and the return ring is empty, the producer waits (backpressure):
//! spin briefly, then park on `producer_park` until the consumer returns one or detaches.

#[cfg(not(shmflow_loom))]
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use crate::endpoint::metrics::Waiting;
#[cfg(not(shmflow_loom))]
use crate::error::RegionKind;
use crate::error::{
    closed, peer_lost, ClosedError, CorruptError, End, Halt, Lost, OpenError, PeerDeadError,
    SendError, SendTimeoutError, TrySendError,
};
use crate::protocol::abi::Geometry;
use crate::protocol::counters::Local;
use crate::protocol::debloat;
use crate::protocol::ends::EndState;
use crate::protocol::frame::{self, HEADER};
use crate::protocol::park::{self, Forever, Immediately, Look, Patience, Until, WaitStrategy};
use crate::protocol::pool::Supply;
use crate::protocol::ring::{Cursors, RingRx, RingTx};
#[cfg(not(shmflow_loom))]
use crate::region::handoff::PeerHandle;
use crate::region::liveness::{EndLock, Liveness};
use crate::region::os::Host;
use crate::region::view::Shared;
use crate::sync::Arc;

#[cfg(any(feature = "tokio", shmflow_loom))]
mod asynch;
#[cfg(all(feature = "net", not(shmflow_loom)))]
pub(crate) mod raw;
#[cfg(feature = "tokio")]
pub use asynch::SendAsync;
mod close;
mod copy;
use copy::copy_record;
mod events;
mod writer;
pub use writer::{Claim, RecordWriter};

/// When committed records become visible to the consumer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FlushPolicy {
    /// Only on [`Producer::flush`], or when a segment is full and sealed. Fewest shared-memory
    /// stores: the throughput setting, for a reader that reads whole segments.
    Explicit,
    /// The default: every record is visible as soon as it is committed (one store), and a
    /// consumer that announced that it sleeps is woken at once (one plain load of its park
    /// word per record; a read-modify-write and the system call only when it sleeps). A consumer that is awake
    /// costs the producer no system call, and one that wakes reads everything published
    /// meanwhile in one go: the stream batches itself as the consumer falls behind. With the
    /// default [`WaitStrategy::Block`] the consumer looks every few microseconds while it
    /// waits, so the producer fills whole cache lines between its looks.
    #[default]
    EveryRecord,
    /// Like Flink's buffer timeout: every record is visible as it is committed, and a flusher
    /// thread wakes a parked consumer at most this long after the first record it was not
    /// told about: at most one wake-up (a system call) per interval instead of one per
    /// sleep of the consumer. The flusher sleeps without a timer while nothing is pending.
    Timeout(Duration),
}

/// Under a policy that publishes every record, the per-record counters reach the region every
/// this many records (under every policy, at each flush and each segment end, which is also
/// before waiting for a segment): storing them
/// with every record costs a stream of small records about a quarter of its speed. A snapshot
/// never shows fewer records written than read.
const COUNTS_EVERY: u64 = 64;

/// Segments in flight from which a producer waiting for one to come back parks at once under
/// [`WaitStrategy::Block`] (see `Producer::take`).
const PARK_AT_ONCE: u64 = 8;

#[cfg(not(shmflow_loom))]
fn policy_interval(p: FlushPolicy) -> Duration {
    match p {
        FlushPolicy::Timeout(d) => d,
        _ => Duration::ZERO,
    }
}

/// The segment in the producer's hand.
#[derive(Clone, Copy, Debug)]
struct Current {
    seg: u32,
    /// Start of the segment in the mapping (cached per segment).
    base: *mut u8,
    /// Private writer position: end of the last frame written.
    wpos: usize,
    /// The first frame not yet published: its position and header word. Its header slot
    /// holds 0 until `store_commit` stores the word with Release (see `frame.rs`).
    pending: Option<(usize, u64)>,
}

#[derive(Default)]
struct Counters {
    records: Local,
    bytes: Local,
    committed: Local,
    acquired: Local,
    wakes: Local,
}

/// The writing path's result for a call with patience `P`: a blocking call's halt is a
/// [`SendError`], a `try_` call's adds "no segment now", a timed call's "out of time".
pub(crate) type Sent<T, P> = Result<T, Halt<<P as Patience>::Expired, SendError>>;

/// Why the consumer is gone: it detached, or it was a network bridge that lost its remote
/// peer.
pub(crate) enum Gone {
    Closed(Box<ClosedError>),
    PeerLost(Box<PeerDeadError>),
}

impl From<Gone> for SendError {
    fn from(g: Gone) -> SendError {
        match g {
            Gone::Closed(b) => SendError::Closed(b),
            Gone::PeerLost(b) => SendError::PeerDead(b),
        }
    }
}

/// The writing end of a channel. Single-threaded (`Send`, not `Sync`).
pub struct Producer {
    shared: Arc<Shared>,
    data: RingTx,
    ret: RingRx,
    cur: Option<Current>,
    policy: FlushPolicy,
    wait: WaitStrategy,
    /// A spanning record was cut short without a segment to say so in: the next operation
    /// first writes an `ABORT` frame.
    pending_abort: bool,
    counters: Counters,
    /// Per-record counters on (segment counters and wait times are always kept).
    metrics: bool,
    /// The consumer's liveness, looked at only while waiting (None under loom).
    liveness: Option<Liveness>,
    #[cfg(not(shmflow_loom))]
    flusher: Option<crate::endpoint::flusher::Flusher>,
    closed: bool,
    /// The consumer was seen detached: every later call says so at once.
    gone: bool,
    /// How the producer gets more segments: supplied by the channel's owner.
    supply: Supply,
    /// Priority lane: next slot to fill.
    prio_tail: u64,
    /// Where a streamed record's bytes wait while it moves to a fresh segment.
    scratch: Vec<u8>,
    /// This process is registered for the consumer's heavy barrier: the per-record path
    /// notifies with a plain load of the park word (`park::notify_light`).
    light: bool,
    /// The segment size (fixed for the region's life; kept here so the hot path does not
    /// follow the `Arc`).
    seg_size: usize,
    /// No record starts in the segment in hand unless it ends by `seg_end`: the segment size,
    /// or less when the consumer debloats (its fill, set as each segment is taken, and widened
    /// to hold a longer record whole, and alone, in a fresh one). Parts of a record that spans
    /// segments may pass it, so the writer position may be past it: every test of room is
    /// written so that it cannot wrap.
    seg_end: usize,
    /// What a record's end does, from `policy` (a plain byte for the hot path to test).
    per_record: PerRecord,
    /// Async calls since the last look at the executor's budget.
    #[cfg(any(feature = "tokio", shmflow_loom))]
    coop: u8,
    /// A direct network end: what is published goes to the socket from this thread, and
    /// waits are for the peer (see `endpoint::remote`). `None` for a local end.
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    link: Option<crate::endpoint::remote::Link<dyn crate::endpoint::remote::Outbound>>,
    /// A receiving bridge's wake-ups of the consumer, one per batch of segments committed
    /// (see `raw_commit`).
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    owed: crate::endpoint::owed::Owed,
}

/// Whether taking a segment waits for the consumer's cap (buffer debloating).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bound {
    /// A record starts in it: within the cap.
    Capped,
    /// The rest of a record, or an abort notice: never held back by the cap.
    Free,
}

/// What [`FlushPolicy`] asks of the end of each record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PerRecord {
    Nothing,
    Publish,
    PublishMarked,
}

impl PerRecord {
    fn of(policy: FlushPolicy) -> PerRecord {
        match policy {
            FlushPolicy::Explicit => PerRecord::Nothing,
            FlushPolicy::EveryRecord => PerRecord::Publish,
            FlushPolicy::Timeout(_) => PerRecord::PublishMarked,
        }
    }
}

impl Producer {
    #[cfg(not(shmflow_loom))]
    pub(crate) fn create_with(name: &str, geometry: Geometry) -> Result<Producer, OpenError> {
        let (shared, lock) = crate::region::object::create_named(name, geometry, End::Producer)?;
        Producer::attach_with(shared, Some(lock), Supply::Own)
    }

    #[cfg(not(shmflow_loom))]
    pub(crate) fn open_with(name: &str) -> Result<Producer, OpenError> {
        Producer::attach(crate::region::object::open_named(name, true)?)
    }

    #[cfg(not(shmflow_loom))]
    pub(crate) fn create_anonymous_with(
        geometry: Geometry,
    ) -> Result<(Producer, PeerHandle), OpenError> {
        let (shared, lock) = crate::region::object::create_memfd(geometry, End::Producer)?;
        let handle = PeerHandle::new(&shared)?;
        Ok((
            Producer::attach_with(shared, Some(lock), Supply::Own)?,
            handle,
        ))
    }

    #[cfg(not(shmflow_loom))]
    pub(crate) fn from_fd_with(fd: BorrowedFd<'_>) -> Result<Producer, OpenError> {
        let (own, name) = crate::region::handoff::dup_region(fd, RegionKind::Channel)?;
        Producer::attach(crate::region::object::open_fd(name, own, true, None)?)
    }

    #[cfg(not(shmflow_loom))]
    pub(crate) fn from_env_with(var: &str) -> Result<Producer, OpenError> {
        use crate::region::handoff::{open_from_env, Handed};
        match open_from_env(var, true)? {
            Handed::Channel(shared) => Producer::attach(shared),
            Handed::GateChannel(shared) => Producer::attach_gate_channel(shared),
        }
    }

    #[cfg(not(shmflow_loom))]
    pub(crate) fn open_channel_with(name: &str, channel: u32) -> Result<Producer, OpenError> {
        let chans = crate::region::object::gate_open_named(name, true)?;
        Producer::attach_gate_channel(crate::region::object::pick_channel(chans, channel, name)?)
    }

    pub(crate) fn attach(shared: Arc<Shared>) -> Result<Producer, OpenError> {
        Producer::attach_with(shared, None, Supply::Own)
    }

    /// Attaches to channel `c` of a gate: its supply includes the gate's floating segments.
    pub(crate) fn attach_gate_channel(shared: Arc<Shared>) -> Result<Producer, OpenError> {
        Producer::attach_with(shared, None, Supply::lent())
    }

    /// Attaches, with the liveness lock already taken (creators) or taking it now.
    pub(crate) fn attach_with(
        shared: Arc<Shared>,
        lock: Option<std::sync::Arc<EndLock>>,
        supply: Supply,
    ) -> Result<Producer, OpenError> {
        let liveness = crate::region::view::attach_end(&shared, End::Producer, lock)?;
        // The producer's own cursors are private truth: taken from the header once, at
        // attach (those of a fresh region only: a producer cannot take over a half-used stream).
        let cursors = Cursors::at_attach(shared.header());
        let (data, ret) = match cursors.producer_rings(shared.n() as u64) {
            Ok(rings) => rings,
            Err(found) => {
                crate::region::view::give_up_attach(&shared, End::Producer);
                return Err(OpenError::corrupt(
                    &shared.name,
                    "producer cursors at attach",
                    "those of a fresh region".into(),
                    found,
                ));
            }
        };
        let shared_seg_size = shared.segment_size();
        Ok(Producer {
            data,
            ret,
            shared,
            cur: None,
            policy: FlushPolicy::default(),
            wait: WaitStrategy::default(),
            pending_abort: false,
            counters: Counters::default(),
            metrics: true,
            liveness,
            #[cfg(not(shmflow_loom))]
            flusher: None,
            closed: false,
            gone: false,
            supply,
            prio_tail: 0,
            scratch: Vec::new(),
            light: <crate::region::os::Host as crate::sync::Os>::light_notify_available(),
            seg_size: shared_seg_size,
            seg_end: shared_seg_size,
            per_record: PerRecord::of(FlushPolicy::default()),
            #[cfg(any(feature = "tokio", shmflow_loom))]
            coop: 0,
            #[cfg(all(feature = "net", not(shmflow_loom)))]
            link: None,
            #[cfg(all(feature = "net", not(shmflow_loom)))]
            owed: Default::default(),
        })
    }

    /// Makes this producer a direct network end: `link` forwards what it publishes and
    /// stands in for the consumer's wake-ups (the region is private to this process).
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(crate) fn set_link(&mut self, link: Box<dyn crate::endpoint::remote::Outbound>) {
        // Every publication goes through `notify_consumer`, which forwards: the per-record
        // path's light notification (a load of the consumer's park word) would skip it.
        self.light = false;
        self.link = Some(crate::endpoint::remote::Link(link));
    }

    /// Name of the region (for messages and `shmflow stat`).
    pub fn region_name(&self) -> &str {
        &self.shared.name
    }

    /// Segment size and count of the channel.
    pub fn geometry(&self) -> Geometry {
        self.shared.geometry
    }

    /// The largest record that fits in one segment (and so can be claimed in place).
    pub fn max_unspanned_len(&self) -> usize {
        self.seg_size - HEADER
    }

    /// Sets when committed records become visible (see [`FlushPolicy`]).
    pub fn set_flush_policy(&mut self, policy: FlushPolicy) {
        self.policy = policy;
        self.per_record = PerRecord::of(policy);
        // The flusher thread starts with the first record published under `Timeout` (see
        // `after_frame_end`); any other policy stops it.
        #[cfg(not(shmflow_loom))]
        if !matches!(policy, FlushPolicy::Timeout(_)) {
            self.flusher = None;
        } else if let Some(f) = &self.flusher {
            if f.interval() != policy_interval(policy) {
                self.flusher = None;
            }
        }
    }

    /// The current flush policy.
    pub fn flush_policy(&self) -> FlushPolicy {
        self.policy
    }

    /// Sets how blocking calls wait (see [`WaitStrategy`]).
    pub fn set_wait_strategy(&mut self, wait: WaitStrategy) {
        self.wait = wait;
    }

    fn consumer_detached(&self) -> bool {
        // Acquire (in `state`): pairs with the consumer's `leave`.
        matches!(
            self.shared.header().consumer.state(),
            EndState::Detached | EndState::Lost
        )
    }

    /// `Closed` (or `PeerDead` if the consumer was a network bridge that lost its remote
    /// peer), remembered: every later call fails at once.
    fn closed_error(&mut self) -> SendError {
        self.closed_end().into()
    }

    /// As [`Producer::closed_error`], saying only what it found.
    fn closed_end(&mut self) -> Gone {
        self.gone = true;
        self.forget_segment();
        self.gone_error()
    }

    /// Why the consumer is gone.
    fn gone_error(&self) -> Gone {
        let c = &self.shared.header().consumer;
        if c.state() == EndState::Lost {
            let pid = c.pid();
            #[cfg(all(feature = "net", not(shmflow_loom)))]
            let cause = self.link.as_ref().and_then(|l| l.cause());
            #[cfg(not(all(feature = "net", not(shmflow_loom))))]
            let cause = None;
            return Gone::PeerLost(peer_lost(&self.shared.name, End::Consumer, pid, cause));
        }
        Gone::Closed(closed(&self.shared.name))
    }

    /// The consumer is gone or dead: nobody reads the segment in hand any more. Forgetting it
    /// sends every later call through the slow path, which reports the peer at once.
    fn forget_segment(&mut self) {
        self.cur = None;
        self.pending_abort = false;
    }

    /// Fails at once if the consumer was already seen gone or dead.
    fn check_gone(&mut self) -> Result<(), SendError> {
        if self.gone {
            return Err(self.gone_error().into());
        }
        Ok(self.check_peer(Look::Quick)?)
    }

    // ----- segment hand-off ------------------------------------------------------------------

    /// Takes a free segment if one is there, and hands it to the consumer at once.
    fn try_take(&mut self) -> Result<Option<Current>, Box<CorruptError>> {
        let Some(seg) = self.ret.pop(&self.shared.return_ring())? else {
            return Ok(None);
        };
        self.supply.got();
        // The segment's first word ends its (empty) list of frames. Relaxed: published by the
        // Release push below; the consumer's last look at this word happened before it
        // returned the segment (its Release push, our Acquire pop).
        frame::clear(self.shared.word(seg, 0));
        self.data.push(&self.shared.data_ring(), seg)?;
        let h = self.shared.header();
        self.seg_end = debloat::end_of(debloat::fill(h), self.seg_size);
        self.counters
            .acquired
            .add(&h.producer_counters.segments_acquired, 1);
        Ok(Some(Current {
            seg,
            base: self.shared.segment_ptr(seg),
            wpos: 0,
            pending: None,
        }))
    }

    /// Segments taken and not yet finished by the consumer (the one in hand included).
    #[inline]
    fn in_flight(&self) -> u64 {
        debloat::in_flight(self.shared.header(), self.counters.acquired.0)
    }

    /// Buffer debloating: true while as many segments are in flight as the consumer's cap
    /// allows, so that a record may not start a new one.
    #[inline]
    fn capped(&self) -> bool {
        let cap = debloat::cap(self.shared.header());
        cap != 0 && self.in_flight() >= cap
    }

    /// Segments the consumer's cap lets the producer take now (`u64::MAX` without a cap).
    #[cfg_attr(any(not(feature = "net"), shmflow_loom), allow(dead_code))]
    pub(crate) fn cap_room(&self) -> u64 {
        match debloat::cap(self.shared.header()) {
            0 => u64::MAX,
            cap => cap.saturating_sub(self.in_flight()),
        }
    }

    /// Segments a record could take now: the free ones, as far as the consumer's cap allows.
    #[cfg_attr(any(not(feature = "net"), shmflow_loom), allow(dead_code))]
    pub(crate) fn free_now(&mut self) -> Result<u64, Box<CorruptError>> {
        let ready = self.ret.ready(&self.shared.return_ring())?;
        Ok(ready.min(self.cap_room()))
    }

    /// Takes a segment, waiting for the consumer to return one (this wait is backpressure).
    /// `Bound::Capped`: a record that starts here waits for the consumer's cap too (buffer
    /// debloating); the rest of a record that spans segments, and an abort notice, do not, so
    /// the cap never cuts a record.
    fn take<P: Patience>(&mut self, patience: P, bound: Bound) -> Sent<(), P> {
        debug_assert!(self.cur.is_none());
        let capped = bound == Bound::Capped && self.capped();
        if !capped {
            if let Some(c) = self.try_take()? {
                self.cur = Some(c);
                return Ok(());
            }
        }
        if self.consumer_detached() {
            return Err(self.closed_error().into());
        }
        if !capped {
            self.ask_for_segment();
        }
        let shared = self.shared.clone();
        let h = shared.header();
        let blocked = Waiting::start(
            &h.producer_counters.blocked_since_ns,
            &h.producer_counters.backpressured_ns,
        );
        // `PARK_AT_ONCE` segments or more of this producer's are in flight (no cap holds it
        // back: it waits for a segment to come back): the consumer has all of them to read
        // before a late wake-up of this producer could leave it idle, so `Block` parks at
        // once instead of looking (its looks would only take CPU time from the consumer, or
        // from a bridge forwarding the channel, on a machine with few CPUs).
        let wait = match self.wait {
            WaitStrategy::Block if !capped && self.in_flight() >= PARK_AT_ONCE => {
                WaitStrategy::Park
            }
            w => w,
        };
        let got = self.wait_producer_as::<P, _, SendError>(wait, patience, |p, look| {
            if !(bound == Bound::Capped && p.capped()) {
                if let Some(c) = p.try_take()? {
                    return Ok(Some(c));
                }
                // (Once per wait: a cap that lifted may leave the producer short.)
                p.ask_for_segment();
            }
            if p.consumer_detached() {
                return Err(p.closed_error());
            }
            p.check_peer(look)?;
            Ok(None)
        });
        drop(blocked);
        self.cur = Some(got?);
        Ok(())
    }

    /// Out of segments: asks the channel's owner for more (a gate lends a floating segment;
    /// a channel of its own has nobody to ask). This is the channel's backlog, in Flink's terms.
    fn ask_for_segment(&mut self) {
        if self.supply.ask(self.shared.header()) {
            self.notify_consumer();
        }
    }

    /// Waits until at least `k` segments are free, and the consumer's cap lets a record start
    /// (for `try_`/`_timeout` sends of spanning records, so that they either go whole or not
    /// at all).
    fn wait_free<P: Patience>(&mut self, k: u64, patience: P) -> Sent<(), P> {
        let mut last_ready = None;
        self.wait_producer(patience, |p, look| {
            p.poll_free(k, Bound::Capped, &mut last_ready, look)
        })
    }

    /// The producer's wait (for segments, lane room, the cap): parked on its own word, woken
    /// by the consumer's read-modify-write notify, `poll` looking at each wake-up.
    pub(super) fn wait_producer<P: Patience, T, F>(
        &mut self,
        patience: P,
        poll: impl FnMut(&mut Producer, Look) -> Result<Option<T>, F>,
    ) -> Result<T, Halt<P::Expired, F>> {
        self.wait_producer_as(self.wait, patience, poll)
    }

    /// [`Producer::wait_producer`] with the strategy `wait`.
    fn wait_producer_as<P: Patience, T, F>(
        &mut self,
        wait: WaitStrategy,
        patience: P,
        mut poll: impl FnMut(&mut Producer, Look) -> Result<Option<T>, F>,
    ) -> Result<T, Halt<P::Expired, F>> {
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if self.link.is_some() {
            return self.wait_link(patience, poll);
        }
        let shared = self.shared.clone();
        park::wait_for::<Host, _, _, F>(
            &shared.header().producer_park,
            wait,
            patience,
            park::Notifier::Rmw,
            park::Pace::Sparse,
            |look| poll(self, look),
        )
    }

    /// A direct network end's wait: between looks, the link reads what the peer sent
    /// (credit frees the segments waiting for it) instead of parking.
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    fn wait_link<P: Patience, T, F>(
        &mut self,
        patience: P,
        mut poll: impl FnMut(&mut Producer, Look) -> Result<Option<T>, F>,
    ) -> Result<T, Halt<P::Expired, F>> {
        let mut looked = false;
        loop {
            if let Some(t) = poll(self, Look::IfDue).map_err(Halt::Failed)? {
                return Ok(t);
            }
            let until = if let Some(e) = patience.immediate() {
                // A `try_` call: one look at what the peer sent already.
                if looked {
                    return Err(Halt::Expired(e));
                }
                looked = true;
                Some(Instant::now())
            } else {
                match patience.remaining() {
                    Ok(left) => left.and_then(|d| Instant::now().checked_add(d)),
                    Err(e) => return Err(Halt::Expired(e)),
                }
            };
            if let Some(l) = &mut self.link {
                l.wait(until);
            }
        }
    }

    /// What a producer waiting for `k` free segments looks at (`last_ready`: what the last
    /// look found, `None` at first); `Bound::Capped` when a record is to start in them, so the
    /// consumer's cap must allow it too.
    pub(super) fn poll_free(
        &mut self,
        k: u64,
        bound: Bound,
        last_ready: &mut Option<u64>,
        look: Look,
    ) -> Result<Option<()>, SendError> {
        let ready = self.ret.ready(&self.shared.return_ring())?;
        // Held back by the consumer's cap: wait for it, without asking for more segments.
        let capped = bound == Bound::Capped && self.capped();
        if ready >= k && !capped {
            return Ok(Some(()));
        }
        if !capped {
            if last_ready.is_some_and(|last| ready > last) {
                // The last ask was granted and it is not enough yet: ask again.
                self.supply.got();
            }
            *last_ready = Some(ready);
            self.ask_for_segment();
        }
        if self.consumer_detached() {
            return Err(self.closed_error());
        }
        self.check_peer(look)?;
        Ok(None)
    }

    /// `Err(PeerDead)` if the consumer's process is gone (a syscall: only while waiting).
    fn check_peer(&mut self, look: Look) -> Result<(), Lost> {
        let res = match &mut self.liveness {
            Some(l) => l.check(self.shared.header(), &self.shared.name, look),
            None => Ok(()),
        };
        // Only a dead consumer makes the segment in hand worthless; a failed look (a syscall
        // error) leaves it, and any pending abort, for the next call.
        if let Err(Lost::PeerDead(_)) = res {
            self.forget_segment();
        }
        res
    }

    #[inline]
    fn notify_consumer(&mut self) {
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if let Some(l) = &mut self.link {
            // A direct network end: the socket is the consumer.
            l.pump();
            return;
        }
        if park::notify::<Host>(self.shared.consumer_park(), self.shared.consumer_bell()) {
            self.count_wake();
        }
    }

    #[cold]
    fn count_wake(&mut self) {
        let h = self.shared.header();
        self.counters.wakes.add(&h.producer_counters.wakes, 1);
    }

    /// Makes everything written to the current segment visible and wakes the consumer.
    fn publish(&mut self) {
        self.publish_counts();
        if self.store_commit() {
            self.notify_consumer();
        }
    }

    /// Publishes every frame written to the current segment: zeroes the word at the write
    /// position (the new end of the list) and stores the first unpublished header with
    /// Release. True if there was something to publish. The wake-up is the caller's business
    /// (`publish` now, the flusher later).
    #[inline]
    fn store_commit(&mut self) -> bool {
        self.store_commit_inner(true)
    }

    /// As `store_commit`; `terminate` false after a SEAL frame, which ends the segment by
    /// itself (and past which a streamed record being moved may still lie).
    #[inline(always)]
    fn store_commit_inner(&mut self, terminate: bool) -> bool {
        let Some(c) = &mut self.cur else { return false };
        let Some((at, word)) = c.pending.take() else {
            return false;
        };
        let seg_size = self.seg_size;
        let end = (terminate && c.wpos + HEADER <= seg_size).then(|| {
            // SAFETY: `base` is the segment's start (cached at take); `wpos` is a frame
            // boundary (8-aligned) and `wpos + 8 <= segment_size` (checked above).
            unsafe { self.shared.word_in(c.base, c.seg, c.wpos) }
        });
        assert!(at + HEADER <= seg_size);
        // SAFETY: `at` is the 8-aligned start of a frame written in this segment, inside it
        // (asserted).
        let slot = unsafe { self.shared.word_in(c.base, c.seg, at) };
        frame::commit(slot, word, end);
        true
    }

    /// Seals the current segment: a SEAL frame at the writer position (none if the segment
    /// is full), everything published; the consumer returns it once read.
    fn seal(&mut self) {
        let Some(c) = &mut self.cur else { return };
        let sealed = c.wpos + HEADER <= self.seg_size;
        if sealed {
            let at = c.wpos;
            c.wpos += HEADER;
            self.write_header(at, 0, frame::SEAL);
        }
        self.store_commit_inner(!sealed);
        self.publish_counts();
        self.cur = None;
        let h = self.shared.header();
        self.counters
            .committed
            .add(&h.producer_counters.segments_committed, 1);
        self.notify_consumer();
    }

    /// Makes sure `need` bytes are free in the current segment, sealing it and taking the next
    /// if not.
    #[inline]
    fn ensure_room<P: Patience>(&mut self, need: usize, patience: P) -> Sent<(), P> {
        // Fast path (almost every record): room left in the segment in hand.
        // (A pending abort comes only with no segment in hand: it goes the slow way.)
        if self.fits_in_hand(need) {
            return Ok(());
        }
        self.ensure_room_slow(need, patience)
    }

    #[cold]
    #[inline(never)]
    fn ensure_room_slow<P: Patience>(&mut self, need: usize, patience: P) -> Sent<(), P> {
        self.check_gone()?;
        if self.pending_abort {
            self.write_pending_abort(patience)?;
        }
        if let Some(c) = &self.cur {
            if c.wpos + need <= self.seg_end {
                return Ok(());
            }
            self.seal();
        }
        self.take(patience, Bound::Capped)?;
        // A record longer than a debloated segment's fill goes whole in the fresh one, and
        // alone: the next record starts in the next segment.
        if let Some(c) = &self.cur {
            if c.wpos + need > self.seg_end {
                self.seg_end = frame::align8(c.wpos + need).min(self.seg_size);
            }
        }
        Ok(())
    }

    fn write_pending_abort<P: Patience>(&mut self, patience: P) -> Sent<(), P> {
        debug_assert!(self.cur.is_none());
        self.take(patience, Bound::Free)?;
        let c = self.cur.as_mut().expect("just taken");
        let at = c.wpos;
        c.wpos = frame::next_frame(at, 0);
        self.write_header(at, 0, frame::ABORT);
        self.pending_abort = false;
        self.after_frame_end();
        Ok(())
    }

    // ----- writing bytes ---------------------------------------------------------------------

    #[inline]
    fn seg_ptr(&self) -> *mut u8 {
        self.cur.as_ref().expect("a segment in hand").base
    }

    /// Writes the header of the frame at `at`: held back if it is the first unpublished frame
    /// (its slot stays 0 until `store_commit`), else stored at once — the consumer cannot
    /// reach it before the first one is published.
    #[inline]
    fn write_header(&mut self, at: usize, len: u32, kind: u32) {
        let c = self.cur.as_mut().expect("a segment in hand");
        debug_assert!(at % 8 == 0 && at + HEADER <= self.seg_size);
        let word = frame::encode(len, kind);
        if c.pending.is_none() {
            c.pending = Some((at, word));
        } else {
            assert!(at + HEADER <= self.seg_size);
            // SAFETY: `base` is the segment's start (cached at take), `at` is 8-aligned and
            // inside (asserted). Relaxed: published by the Release store of the first pending
            // header.
            frame::write_unpublished(unsafe { self.shared.word_in(c.base, c.seg, at) }, word);
        }
    }

    #[inline]
    fn write_bytes(&self, at: usize, bytes: &[u8]) {
        let c = self.cur.as_ref().expect("a segment in hand");
        assert!(at + bytes.len() <= self.seg_size);
        self.shared.tracker.write(c.seg as usize, at, bytes.len());
        // SAFETY: in bounds (asserted), the segment is ours (see `write_header`), and `bytes`
        // cannot overlap shared memory that we are writing.
        unsafe { copy_record(bytes, self.seg_ptr().add(at)) };
    }

    /// A frame ended (record, or abort): publish according to the policy.
    #[inline(always)]
    fn after_frame_end(&mut self) {
        match self.per_record {
            // The throughput setting does nothing per record.
            PerRecord::Nothing => {}
            // The default: two stores and a load (see `publish_record`), kept inline.
            PerRecord::Publish => self.publish_record(),
            PerRecord::PublishMarked => self.publish_per_policy(),
        }
    }

    /// Publishes the frame just ended and wakes the consumer if it announced that it sleeps
    /// (the counters go out every `COUNTS_EVERY` records, at segment ends and flushes).
    #[inline(always)]
    fn publish_record(&mut self) {
        if self.metrics && self.counters.records.0 % COUNTS_EVERY == 0 {
            self.publish_counts();
        }
        if self.store_commit_inner(true) {
            if self.light {
                if park::notify_light::<Host>(self.shared.consumer_park(), || {
                    self.shared.consumer_bell()
                }) {
                    self.count_wake();
                }
            } else {
                self.notify_consumer();
            }
        }
    }

    #[inline(never)]
    fn publish_per_policy(&mut self) {
        if self.metrics && self.counters.records.0 % COUNTS_EVERY == 0 {
            self.publish_counts();
        }
        match self.policy {
            FlushPolicy::Explicit => {}
            FlushPolicy::EveryRecord => self.publish(),
            // A direct network end: published into its region now, forwarded with the next
            // segment or flush, or by its keeper thread within the interval.
            #[cfg(all(feature = "net", not(shmflow_loom)))]
            FlushPolicy::Timeout(d) if self.link.is_some() => {
                if self.store_commit() {
                    if let Some(l) = &mut self.link {
                        l.defer(d);
                    }
                }
            }
            FlushPolicy::Timeout(_) => {
                #[cfg(not(shmflow_loom))]
                {
                    // Publish the frame now (one Release store) and leave the wake-up to the
                    // flusher, which makes at most one per interval.
                    if self.store_commit() {
                        let interval = policy_interval(self.policy);
                        let marked = self
                            .flusher
                            .get_or_insert_with(|| {
                                crate::endpoint::flusher::Flusher::start(
                                    self.shared.clone(),
                                    interval,
                                )
                            })
                            .mark_pending();
                        if !marked {
                            // No flusher thread could be started: wake now.
                            self.notify_consumer();
                        }
                    }
                }
                #[cfg(shmflow_loom)]
                self.publish();
            }
        }
    }

    #[inline(always)]
    fn record_done(&mut self, len: u64) {
        if self.metrics {
            self.counters.records.bump(1);
            self.counters.bytes.bump(len);
        }
        self.after_frame_end();
    }

    /// Publishes the per-record counters.
    fn publish_counts(&self) {
        let h = self.shared.header();
        self.counters.records.publish(&h.producer_counters.records);
        self.counters.bytes.publish(&h.producer_counters.bytes);
    }

    /// Turns the per-record counters (records and bytes written) on or off; segment counts
    /// and backpressured time are always kept. On by default: they cost two stores per record
    /// to a line only this side writes.
    pub fn set_metrics(&mut self, on: bool) {
        self.metrics = on;
    }

    /// The channel's counters now (both sides', as the region shows them; the peer publishes
    /// its per-record counts at segment boundaries, flushes and waits).
    pub fn metrics(&self) -> crate::endpoint::metrics::Snapshot {
        self.publish_counts();
        crate::endpoint::metrics::snapshot(&self.shared)
    }

    // Always inline: the copy of a record whose length the caller knows becomes a few moves
    // (the blocking and the async `send` alike).
    #[inline(always)]
    fn send_inner<P: Patience>(&mut self, bytes: &[u8], patience: P) -> Sent<(), P> {
        let seg_size = self.seg_size;
        if HEADER + bytes.len() <= seg_size {
            self.ensure_room(HEADER + bytes.len(), patience)?;
            self.write_whole(bytes);
            return Ok(());
        }
        self.send_spanning(bytes, patience)
    }

    /// True if a frame of `need` bytes goes into the segment in hand (`ensure_room`'s fast
    /// path: a pending abort comes only with no segment in hand).
    #[inline(always)]
    fn fits_in_hand(&self, need: usize) -> bool {
        debug_assert!(!(self.pending_abort && self.cur.is_some()));
        matches!(&self.cur, Some(c) if c.wpos + need <= self.seg_end)
    }

    /// Writes `bytes` as a whole record into the segment in hand, which has room for it
    /// ([`Producer::fits_in_hand`], or `ensure_room` just made it).
    #[inline(always)]
    fn write_whole(&mut self, bytes: &[u8]) {
        let c = self
            .cur
            .as_mut()
            .expect("a segment in hand with room for the record");
        let at = c.wpos;
        c.wpos = frame::next_frame(at, bytes.len());
        self.write_header(at, bytes.len() as u32, frame::WHOLE);
        self.write_bytes(at + HEADER, bytes);
        self.record_done(bytes.len() as u64);
    }

    /// How many free segments a spanning record of `len` bytes needs to go whole (counting
    /// a pending abort), or `None` if that is more than can be free at once: at most `n - 1`
    /// while a segment is in hand (it sits in the data ring).
    fn spanning_needs(&self, len: usize) -> Option<u64> {
        let seg_size = self.seg_size;
        let per_segment = (seg_size - HEADER) as u64;
        // A spanning record starts where it is if at least one word of payload fits there.
        let room_here = match &self.cur {
            Some(c) if !self.pending_abort && c.wpos + 2 * HEADER <= self.seg_end => {
                (seg_size - c.wpos - HEADER) as u64
            }
            _ => 0,
        };
        let needed = (len as u64).saturating_sub(room_here).div_ceil(per_segment)
            + self.pending_abort as u64;
        let most = self.shared.n() as u64 - self.cur.is_some() as u64;
        (needed <= most).then_some(needed)
    }

    fn send_spanning<P: Patience>(&mut self, bytes: &[u8], patience: P) -> Sent<(), P> {
        let seg_size = self.seg_size;
        if !patience.forever() {
            // The segment in hand cannot take the start (full, or past a debloated fill): seal
            // it now, so that it can come back while the record waits for its segments.
            if matches!(&self.cur, Some(c) if c.wpos + 2 * HEADER > self.seg_end) {
                self.seal();
            }
            // Go whole or not at all when the pool can hold the record's segments at once.
            if let Some(needed) = self.spanning_needs(bytes.len()) {
                self.wait_free(needed, patience)?;
            }
        }
        self.ensure_room(2 * HEADER, patience)?;
        let mut rest = bytes;
        let mut first = true;
        loop {
            let c = self.cur.as_mut().expect("a segment in hand");
            let at = c.wpos;
            let take = rest.len().min(seg_size - at - HEADER);
            let last = take == rest.len();
            c.wpos = frame::next_frame(at, take);
            let kind = match (first, last) {
                (true, _) => frame::FIRST,
                (false, false) => frame::MIDDLE,
                (false, true) => frame::LAST,
            };
            self.write_header(at, take as u32, kind);
            self.write_bytes(at + HEADER, &rest[..take]);
            rest = &rest[take..];
            first = false;
            if last {
                break;
            }
            self.seal();
            if let Err(e) = self.take(patience, Bound::Free) {
                // Parts are out; the consumer must learn that no more will come.
                self.pending_abort = true;
                return Err(e);
            }
        }
        self.record_done(bytes.len() as u64);
        Ok(())
    }

    // ----- public writing API ----------------------------------------------------------------
    //
    // Every operation has one core (`*_inner`) that takes its patience as a type; the
    // blocking, `try_`, `_timeout` and `_deadline` forms below are one-line wrappers that pick
    // it (`Forever`, `Immediately`, `Until`), and the error type follows from it.

    /// Sends one record, blocking while no segment is free (backpressure).
    ///
    /// # Errors
    /// [`SendError::Closed`] if the consumer has detached, [`SendError::PeerDead`] if its
    /// process died, [`SendError::Corrupt`] if it broke the protocol.
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// tx.send(b"a record")?;
    /// tx.flush()?; // visible now (the default policy also publishes as it goes)
    /// assert_eq!(rx.recv()?.unwrap().as_bytes(), Some(&b"a record"[..]));
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    #[inline]
    pub fn send(&mut self, bytes: &[u8]) -> Result<(), SendError> {
        self.send_inner(bytes, Forever).map_err(Into::into)
    }

    /// Sends one record if that needs no waiting, else [`TrySendError::Full`] with nothing
    /// sent. A spanning record that needs more segments than the pool has cannot be
    /// guaranteed: if the pool runs dry half-way it is aborted (the consumer sees
    /// [`RecvError::RecordAborted`](crate::RecvError::RecordAborted)).
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::{Geometry, TrySendError};
    ///
    /// let (mut tx, _rx) = shmflow::pair(Geometry { segment_size: 4096, segment_count: 2 })?;
    /// // Nobody reads: the pool fills up, and `try_send` says so instead of waiting.
    /// let full = loop {
    ///     match tx.try_send(&[0u8; 1000]) {
    ///         Ok(()) => continue,
    ///         Err(TrySendError::Full) => break true,
    ///         Err(e) => return Err(e.into()),
    ///     }
    /// };
    /// assert!(full);
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`TrySendError::Full`] if no segment is free now, or the consumer's buffer-debloating
    /// cap holds the record back ([`Consumer::set_debloat_target`](crate::Consumer::set_debloat_target));
    /// otherwise as [`Producer::send`].
    pub fn try_send(&mut self, bytes: &[u8]) -> Result<(), TrySendError> {
        self.send_inner(bytes, Immediately).map_err(Into::into)
    }

    /// Sends one record, waiting at most `timeout` for free segments
    /// ([`SendTimeoutError::Timeout`]). Same all-or-nothing rule as [`Producer::try_send`].
    ///
    /// # Errors
    /// [`SendTimeoutError::Timeout`] if no segment comes back in time; otherwise as
    /// [`Producer::send`].
    pub fn send_timeout(
        &mut self,
        bytes: &[u8],
        timeout: Duration,
    ) -> Result<(), SendTimeoutError> {
        self.send_inner(bytes, Until::after(timeout))
            .map_err(Into::into)
    }

    /// As [`Producer::send_timeout`], with the deadline as an instant.
    pub fn send_deadline(
        &mut self,
        bytes: &[u8],
        deadline: Instant,
    ) -> Result<(), SendTimeoutError> {
        self.send_inner(bytes, Until::at(deadline))
            .map_err(Into::into)
    }

    /// Sends a `Pod` value as a record of `size_of::<T>()` bytes; the consumer can view it in
    /// place with [`crate::Record::as_pod`].
    pub fn send_pod<T: bytemuck::Pod>(&mut self, value: &T) -> Result<(), SendError> {
        self.send(bytemuck::bytes_of(value))
    }

    /// [`Producer::send_pod`] without waiting ([`TrySendError::Full`]).
    pub fn try_send_pod<T: bytemuck::Pod>(&mut self, value: &T) -> Result<(), TrySendError> {
        self.try_send(bytemuck::bytes_of(value))
    }

    /// [`Producer::send_pod`] waiting at most `timeout` ([`SendTimeoutError::Timeout`]).
    pub fn send_pod_timeout<T: bytemuck::Pod>(
        &mut self,
        value: &T,
        timeout: Duration,
    ) -> Result<(), SendTimeoutError> {
        self.send_timeout(bytemuck::bytes_of(value), timeout)
    }
}

// SAFETY: the only non-Send field is the cached segment pointer, which points into the mapping
// kept alive by `shared` (an `Arc` of a Send + Sync region).
unsafe impl Send for Producer {}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("region", &self.shared.name)
            .field("geometry", &self.shared.geometry)
            .field("policy", &self.policy)
            .field("wait", &self.wait)
            .field("segment_in_hand", &self.cur.map(|c| c.seg))
            .field("consumer_gone", &self.gone)
            .finish_non_exhaustive()
    }
}
