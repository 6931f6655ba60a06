//! The producer end: takes free segments from the return ring, frames records into them and
//! hands them to the consumer through the data ring.
//!
//! Protocol (the consumer's half is in `reader.rs`):
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

use std::io;
#[cfg(not(loom))]
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use crate::endpoint::metrics::Waiting;
#[cfg(not(loom))]
use crate::error::RegionKind;
use crate::error::{
    op, CloseError, End, Error, OpenError, Result, SendError, SendTimeoutError, TrySendError,
    WriteError,
};
use crate::protocol::abi::Geometry;
use crate::protocol::counters::Local;
use crate::protocol::ends::EndState;
use crate::protocol::frame::{self, HEADER};
use crate::protocol::park::{self, Deadline, Look, WaitStrategy};
use crate::protocol::pool::Supply;
use crate::protocol::ring::{RingRx, RingTx};
#[cfg(not(loom))]
use crate::region::handoff::PeerHandle;
use crate::region::liveness::{EndLock, Liveness};
use crate::region::view::Shared;
use crate::sync::{Arc, Ordering};

#[cfg(any(feature = "tokio", loom))]
mod asynch;
#[cfg(all(feature = "net", not(loom)))]
pub(crate) mod raw;
#[cfg(feature = "tokio")]
pub use asynch::SendAsync;

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

#[cfg(not(loom))]
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
    #[cfg(not(loom))]
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
    /// What a record's end does, from `policy` (a plain byte for the hot path to test).
    per_record: PerRecord,
    /// Async calls since the last look at the executor's budget.
    #[cfg(any(feature = "tokio", loom))]
    coop: u8,
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
    #[cfg(not(loom))]
    pub(crate) fn create_with(name: &str, geometry: Geometry) -> Result<Producer, OpenError> {
        let (shared, lock) = crate::region::object::create_named(name, geometry, End::Producer)?;
        Producer::attach_with(shared, Some(lock), Supply::Own)
    }

    #[cfg(not(loom))]
    pub(crate) fn open_with(name: &str) -> Result<Producer, OpenError> {
        Producer::attach(crate::region::object::open_named(name, true)?)
    }

    #[cfg(not(loom))]
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

    #[cfg(not(loom))]
    pub(crate) fn from_fd_with(fd: BorrowedFd<'_>) -> Result<Producer, OpenError> {
        let (own, name) = crate::region::handoff::dup_region(fd, RegionKind::Channel)?;
        Producer::attach(crate::region::object::open_fd(name, own, true, None)?)
    }

    #[cfg(not(loom))]
    pub(crate) fn from_env_with(var: &str) -> Result<Producer, OpenError> {
        use crate::region::handoff::{open_from_env, Handed};
        match open_from_env(var, true)? {
            Handed::Channel(shared) => Producer::attach(shared),
            Handed::GateChannel(shared) => Producer::attach_gate_channel(shared),
        }
    }

    #[cfg(not(loom))]
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
        let h = shared.header();
        // The producer's own cursors are private truth: take them from the header once, at
        // attach (they are 0 for a fresh region; the consumer's cursors start the rings).
        let data_head = h.cons.data_head.load(Ordering::Acquire);
        let data_tail = h.prod.data_tail.load(Ordering::Acquire);
        let ret_head = h.prod.ret_head.load(Ordering::Acquire);
        let ret_tail = h.cons.ret_tail.load(Ordering::Acquire);
        let n = shared.n() as u64;
        if data_tail != 0 || ret_head != 0 || ret_tail > n || data_head != 0 {
            // A fresh region only: a producer cannot take over a half-used stream.
            crate::region::view::give_up_attach(&shared, End::Producer);
            return Err(OpenError::corrupt(
                &shared.name,
                "producer cursors at attach",
                "those of a fresh region".into(),
                data_tail | ret_head,
            ));
        }
        let shared_seg_size = shared.segment_size();
        Ok(Producer {
            data: RingTx::new(data_head, data_tail),
            ret: RingRx::new(ret_head, ret_tail),
            shared,
            cur: None,
            policy: FlushPolicy::default(),
            wait: WaitStrategy::default(),
            pending_abort: false,
            counters: Counters::default(),
            metrics: true,
            liveness,
            #[cfg(not(loom))]
            flusher: None,
            closed: false,
            gone: false,
            supply,
            prio_tail: 0,
            scratch: Vec::new(),
            light: crate::sync::light_notify_available(),
            seg_size: shared_seg_size,
            per_record: PerRecord::of(FlushPolicy::default()),
            #[cfg(any(feature = "tokio", loom))]
            coop: 0,
        })
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
        #[cfg(not(loom))]
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
    fn closed_error(&mut self) -> Error {
        self.gone = true;
        self.forget_segment();
        self.gone_error()
    }

    /// Why the consumer is gone.
    fn gone_error(&self) -> Error {
        let c = &self.shared.header().consumer;
        if c.state() == EndState::Lost {
            let pid = c.pid.load(Ordering::Relaxed);
            return Error::peer_lost(&self.shared.name, crate::error::End::Consumer, pid);
        }
        Error::closed(&self.shared.name)
    }

    /// The consumer is gone or dead: nobody reads the segment in hand any more. Forgetting it
    /// sends every later call through the slow path, which reports the peer at once.
    fn forget_segment(&mut self) {
        self.cur = None;
        self.pending_abort = false;
    }

    /// Fails at once if the consumer was already seen gone or dead.
    fn check_gone(&mut self) -> Result<()> {
        if self.gone {
            return Err(self.gone_error());
        }
        self.check_peer(Look::Quick)
    }

    // ----- segment hand-off ------------------------------------------------------------------

    /// Takes a free segment if one is there, and hands it to the consumer at once.
    fn try_take(&mut self) -> Result<Option<Current>> {
        let Some(seg) = self.ret.pop(&self.shared.return_ring())? else {
            return Ok(None);
        };
        self.supply.got();
        // The segment's first word ends its (empty) list of frames. Relaxed: published by the
        // Release push below; the consumer's last look at this word happened before it
        // returned the segment (its Release push, our Acquire pop).
        self.shared.word(seg, 0).store(0, Ordering::Relaxed);
        self.data.push(&self.shared.data_ring(), seg)?;
        let h = self.shared.header();
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

    /// Takes a segment, waiting for the consumer to return one (this wait is backpressure).
    fn take(&mut self, deadline: Deadline) -> Result<()> {
        debug_assert!(self.cur.is_none());
        if let Some(c) = self.try_take()? {
            self.cur = Some(c);
            return Ok(());
        }
        if self.consumer_detached() {
            return Err(self.closed_error());
        }
        self.ask_for_segment();
        let shared = self.shared.clone();
        let h = shared.header();
        let blocked = Waiting::start(
            &h.producer_counters.blocked_since_ns,
            &h.producer_counters.backpressured_ns,
        );
        let got = park::wait_for(
            &h.producer_park,
            self.wait,
            deadline,
            park::Notifier::Rmw,
            park::Pace::Sparse,
            |look| {
                if let Some(c) = self.try_take()? {
                    return Ok(Some(c));
                }
                if self.consumer_detached() {
                    return Err(self.closed_error());
                }
                self.check_peer(look)?;
                Ok(None)
            },
        );
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

    /// Waits until at least `k` segments are free (for `try_`/`_timeout` sends of spanning
    /// records, so that they either go whole or not at all).
    fn wait_free(&mut self, k: u64, deadline: Deadline) -> Result<()> {
        let shared = self.shared.clone();
        let mut last_ready = u64::MAX;
        park::wait_for(
            &shared.header().producer_park,
            self.wait,
            deadline,
            park::Notifier::Rmw,
            park::Pace::Sparse,
            |look| self.poll_free(k, &mut last_ready, look),
        )
    }

    /// What a producer waiting for `k` free segments looks at (`last_ready`: what the last
    /// look found, `u64::MAX` at first).
    fn poll_free(&mut self, k: u64, last_ready: &mut u64, look: Look) -> Result<Option<()>> {
        let ready = self.ret.ready(&self.shared.return_ring())?;
        if ready >= k {
            return Ok(Some(()));
        }
        if ready > *last_ready {
            // The last ask was granted and it is not enough yet: ask again.
            self.supply.got();
        }
        *last_ready = ready;
        self.ask_for_segment();
        if self.consumer_detached() {
            return Err(self.closed_error());
        }
        self.check_peer(look)?;
        Ok(None)
    }

    /// `Err(PeerDead)` if the consumer's process is gone (a syscall: only while waiting).
    fn check_peer(&mut self, look: Look) -> Result<()> {
        let res = match &mut self.liveness {
            Some(l) => l.check(self.shared.header(), &self.shared.name, look),
            None => Ok(()),
        };
        // Only a dead consumer makes the segment in hand worthless; a failed look (a syscall
        // error) leaves it, and any pending abort, for the next call.
        if let Err(Error::PeerDead(_)) = res {
            self.forget_segment();
        }
        res
    }

    #[inline]
    fn notify_consumer(&mut self) {
        if park::notify(self.shared.consumer_park(), self.shared.consumer_bell()) {
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
    fn ensure_room(&mut self, need: usize, deadline: Deadline) -> Result<()> {
        // Fast path (almost every record): room left in the segment in hand.
        // (A pending abort comes only with no segment in hand: it goes the slow way.)
        debug_assert!(!(self.pending_abort && self.cur.is_some()));
        if let Some(c) = &self.cur {
            if self.seg_size - c.wpos >= need {
                return Ok(());
            }
        }
        self.ensure_room_slow(need, deadline)
    }

    #[cold]
    #[inline(never)]
    fn ensure_room_slow(&mut self, need: usize, deadline: Deadline) -> Result<()> {
        self.check_gone()?;
        if self.pending_abort {
            self.write_pending_abort(deadline)?;
        }
        if let Some(c) = &self.cur {
            if self.seg_size - c.wpos >= need {
                return Ok(());
            }
            self.seal();
        }
        self.take(deadline)
    }

    fn write_pending_abort(&mut self, deadline: Deadline) -> Result<()> {
        debug_assert!(self.cur.is_none());
        self.take(deadline)?;
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
            unsafe { self.shared.word_in(c.base, c.seg, at) }.store(word, Ordering::Relaxed);
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
                if park::notify_light(self.shared.consumer_park(), || self.shared.consumer_bell()) {
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
            FlushPolicy::Timeout(_) => {
                #[cfg(not(loom))]
                {
                    // Publish the frame now (one Release store) and leave the wake-up to the
                    // flusher, which makes at most one per interval.
                    if self.store_commit() {
                        let interval = policy_interval(self.policy);
                        self.flusher
                            .get_or_insert_with(|| {
                                crate::endpoint::flusher::Flusher::start(
                                    self.shared.clone(),
                                    interval,
                                )
                            })
                            .mark_pending();
                    }
                }
                #[cfg(loom)]
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
    fn send_inner(&mut self, bytes: &[u8], deadline: Deadline) -> Result<()> {
        let seg_size = self.seg_size;
        if HEADER + bytes.len() <= seg_size {
            self.ensure_room(HEADER + bytes.len(), deadline)?;
            let c = self
                .cur
                .as_mut()
                .expect("ensure_room leaves a segment in hand");
            let at = c.wpos;
            c.wpos = frame::next_frame(at, bytes.len());
            self.write_header(at, bytes.len() as u32, frame::WHOLE);
            self.write_bytes(at + HEADER, bytes);
            self.record_done(bytes.len() as u64);
            return Ok(());
        }
        self.send_spanning(bytes, deadline)
    }

    /// How many free segments a spanning record of `len` bytes needs to go whole (counting
    /// a pending abort), or `None` if that is more than can be free at once: at most `n - 1`
    /// while a segment is in hand (it sits in the data ring).
    fn spanning_needs(&self, len: usize) -> Option<u64> {
        let seg_size = self.seg_size;
        let per_segment = (seg_size - HEADER) as u64;
        // A spanning record starts where it is if at least one word of payload fits there.
        let room_here = match &self.cur {
            Some(c) if !self.pending_abort && seg_size - c.wpos >= 2 * HEADER => {
                (seg_size - c.wpos - HEADER) as u64
            }
            _ => 0,
        };
        let needed = (len as u64).saturating_sub(room_here).div_ceil(per_segment)
            + self.pending_abort as u64;
        let most = self.shared.n() as u64 - self.cur.is_some() as u64;
        (needed <= most).then_some(needed)
    }

    fn send_spanning(&mut self, bytes: &[u8], deadline: Deadline) -> Result<()> {
        let seg_size = self.seg_size;
        if !matches!(deadline, Deadline::Never) {
            // Go whole or not at all when the pool can hold the record's segments at once.
            if let Some(needed) = self.spanning_needs(bytes.len()) {
                self.wait_free(needed, deadline)?;
            }
        }
        self.ensure_room(2 * HEADER, deadline)?;
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
            if let Err(e) = self.take(deadline) {
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
    // Every operation has one deadline-taking core (`*_inner`); the blocking, `try_`,
    // `_timeout` and `_deadline` forms below are one-line wrappers that pick the deadline and
    // the error type.

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
        op(self.send_inner(bytes, Deadline::Never))
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
    /// [`TrySendError::Full`] if no segment is free now; otherwise as [`Producer::send`].
    pub fn try_send(&mut self, bytes: &[u8]) -> Result<(), TrySendError> {
        op(self.send_inner(bytes, Deadline::Now))
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
        op(self.send_inner(bytes, Deadline::after(timeout)))
    }

    /// As [`Producer::send_timeout`], with the deadline as an instant.
    pub fn send_deadline(
        &mut self,
        bytes: &[u8],
        deadline: Instant,
    ) -> Result<(), SendTimeoutError> {
        op(self.send_inner(bytes, Deadline::at(deadline)))
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

    #[inline]
    fn claim_inner(&mut self, len: usize, deadline: Deadline) -> Result<Claim<'_>> {
        // Room in the segment in hand implies that the record fits a segment: test that first.
        // (Written so that no sum can wrap, whatever `len` is.)
        let fits_here = matches!(&self.cur,
            Some(c) if self.seg_size - c.wpos >= HEADER && len <= self.seg_size - c.wpos - HEADER);
        if !fits_here && len > self.seg_size - HEADER {
            return Err(Error::too_large(
                &self.shared.name,
                "a claimed record",
                len as u64,
                self.max_unspanned_len() as u64,
            ));
        }
        if !fits_here {
            self.ensure_room_slow(HEADER + len, deadline)?;
        }
        let c = self.cur.as_ref().expect("a segment in hand");
        let at = c.wpos;
        self.shared.tracker.write(c.seg as usize, at + HEADER, len);
        Ok(Claim {
            producer: self,
            at,
            len,
        })
    }

    /// Claims `len` bytes inside shared memory for one record, to serialize into in place
    /// (zero copy). The record is sent by [`Claim::commit`]; dropping the claim sends nothing.
    /// `len` must be at most [`Producer::max_unspanned_len`].
    ///
    /// # Errors
    /// [`SendError::RecordTooLarge`] if `len` does not fit in one segment; otherwise as
    /// [`Producer::send`].
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// let mut claim = tx.claim(16)?; // 16 bytes in shared memory
    /// claim[..8].copy_from_slice(&7u64.to_le_bytes());
    /// claim[8..].copy_from_slice(&9u64.to_le_bytes());
    /// claim.commit();
    /// tx.flush()?;
    /// let r = rx.recv()?.unwrap();
    /// assert_eq!(r.as_pod::<[u64; 2]>(), Some(&[7, 9]));
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    #[inline]
    pub fn claim(&mut self, len: usize) -> Result<Claim<'_>, SendError> {
        op(self.claim_inner(len, Deadline::Never))
    }

    /// [`Producer::claim`] without waiting ([`TrySendError::Full`]).
    ///
    /// # Errors
    /// [`TrySendError::Full`] if no segment is free now; otherwise as [`Producer::claim`].
    pub fn try_claim(&mut self, len: usize) -> Result<Claim<'_>, TrySendError> {
        op(self.claim_inner(len, Deadline::Now))
    }

    /// [`Producer::claim`] waiting at most `timeout` ([`SendTimeoutError::Timeout`]).
    ///
    /// # Errors
    /// [`SendTimeoutError::Timeout`] if no segment comes back in time; otherwise as
    /// [`Producer::claim`].
    pub fn claim_timeout(
        &mut self,
        len: usize,
        timeout: Duration,
    ) -> Result<Claim<'_>, SendTimeoutError> {
        op(self.claim_inner(len, Deadline::after(timeout)))
    }

    /// [`Producer::claim`] waiting until `deadline` at most.
    ///
    /// # Errors
    /// [`SendTimeoutError::Timeout`] if no segment comes back by `deadline`; otherwise as
    /// [`Producer::claim`].
    pub fn claim_deadline(
        &mut self,
        len: usize,
        deadline: Instant,
    ) -> Result<Claim<'_>, SendTimeoutError> {
        op(self.claim_inner(len, Deadline::at(deadline)))
    }

    /// Starts a record whose length is not known up front, written through `std::io::Write`
    /// and ended by [`RecordWriter::finish`]. If it outgrows its segment it moves to a fresh
    /// one, and spans segments only if it is larger than a segment. Dropping the writer without
    /// `finish` discards the record (the consumer never sees it, or sees
    /// [`Error::RecordAborted`] if parts were already handed over). Waits block like `send`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::io::Write;
    ///
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// let mut w = tx.stream()?;
    /// write!(w, "{} and {}", "a length", "not known up front")?;
    /// w.finish()?;
    /// tx.flush()?;
    /// assert_eq!(rx.recv()?.unwrap().to_vec()?, b"a length and not known up front");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`Producer::send`]; the writer's own writes fail with a [`WriteError`].
    pub fn stream(&mut self) -> Result<RecordWriter<'_>, SendError> {
        op(self.stream_inner(Deadline::Never))
    }

    /// [`Producer::stream`] whose waits (for the first segment and for every further segment
    /// the record grows into) all end at `timeout` from now: a write that would wait longer
    /// fails with [`WriteError::Timeout`] and the record is discarded (or aborted, if parts of
    /// it were already handed over).
    ///
    /// # Errors
    /// [`SendTimeoutError::Timeout`] if no segment comes back in time; otherwise as
    /// [`Producer::stream`].
    pub fn stream_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<RecordWriter<'_>, SendTimeoutError> {
        op(self.stream_inner(Deadline::after(timeout)))
    }

    /// As [`Producer::stream_timeout`], with the deadline as an instant.
    pub fn stream_deadline(
        &mut self,
        deadline: Instant,
    ) -> Result<RecordWriter<'_>, SendTimeoutError> {
        op(self.stream_inner(Deadline::at(deadline)))
    }

    /// [`Producer::stream`] that never waits: [`TrySendError::Full`] (and later
    /// [`WriteError::Full`]) wherever a segment would have to be waited for, with the record
    /// discarded (or aborted) as for `stream_timeout`.
    ///
    /// # Errors
    /// [`TrySendError::Full`] if no segment is free now; otherwise as [`Producer::stream`].
    pub fn try_stream(&mut self) -> Result<RecordWriter<'_>, TrySendError> {
        op(self.stream_inner(Deadline::Now))
    }

    fn stream_inner(&mut self, deadline: Deadline) -> Result<RecordWriter<'_>> {
        self.ensure_room(HEADER, deadline)?;
        let c = self.cur.as_mut().expect("a segment in hand");
        let frag_start = c.wpos;
        Ok(RecordWriter {
            producer: self,
            frag_start,
            pos: frag_start + HEADER,
            total: 0,
            spanning: false,
            finished: false,
            failed: false,
            interrupted: false,
            deadline,
        })
    }

    fn send_event_inner(&mut self, kind: u32, payload: &[u8], deadline: Deadline) -> Result<()> {
        crate::endpoint::event::check_payload(&self.shared.name, payload)?;
        if self.closed {
            return Err(self.closed_error());
        }
        let len = 8 + payload.len();
        self.ensure_room(HEADER + len, deadline)?;
        let c = self
            .cur
            .as_mut()
            .expect("ensure_room leaves a segment in hand");
        let at = c.wpos;
        c.wpos = frame::next_frame(at, len);
        self.write_header(at, len as u32, frame::EVENT);
        self.write_bytes(at + HEADER, &(kind as u64).to_le_bytes());
        self.write_bytes(at + 2 * HEADER, payload);
        self.after_frame_end();
        Ok(())
    }

    /// Sends an event in order with the records: the consumer's
    /// [`Consumer::recv_message`](crate::Consumer::recv_message) returns it after every
    /// record sent before it and before every record sent after it (plain `recv` skips it).
    /// `payload` is at most [`crate::MAX_EVENT_PAYLOAD`] bytes. Blocks like `send`.
    ///
    /// # Errors
    /// [`SendError::RecordTooLarge`] for a payload over the limit; otherwise as
    /// [`Producer::send`].
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::Message;
    ///
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// tx.send(b"before")?;
    /// tx.send_event(1, b"checkpoint")?;
    /// tx.send(b"after")?;
    /// drop(tx);
    /// let mut seen = Vec::new();
    /// while let Some(m) = rx.recv_message()? {
    ///     seen.push(match m {
    ///         Message::Record(r) => String::from_utf8(r.to_vec()?).unwrap(),
    ///         Message::Event(e) => format!("event {}", e.kind),
    ///     });
    /// }
    /// assert_eq!(seen, ["before", "event 1", "after"]);
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn send_event(&mut self, kind: u32, payload: &[u8]) -> Result<(), SendError> {
        op(self.send_event_inner(kind, payload, Deadline::Never))
    }

    /// As [`Producer::send_event`], or [`TrySendError::Full`] without a free segment.
    pub fn try_send_event(&mut self, kind: u32, payload: &[u8]) -> Result<(), TrySendError> {
        op(self.send_event_inner(kind, payload, Deadline::Now))
    }

    /// As [`Producer::send_event`], waiting at most `timeout` for a free segment.
    pub fn send_event_timeout(
        &mut self,
        kind: u32,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(), SendTimeoutError> {
        op(self.send_event_inner(kind, payload, Deadline::after(timeout)))
    }

    /// As [`Producer::send_event`], waiting until `deadline` at most.
    pub fn send_event_deadline(
        &mut self,
        kind: u32,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), SendTimeoutError> {
        op(self.send_event_inner(kind, payload, Deadline::at(deadline)))
    }

    /// Sends a priority event: it overtakes the records and events already sent and not yet
    /// received (see [`Event`](crate::Event) for exactly which), the way Flink's unaligned checkpoint
    /// barriers do. It is visible at once (no flush needed). At most four can be in flight:
    /// the fifth waits until the consumer has received one.
    ///
    /// # Errors
    /// [`SendError::RecordTooLarge`] for a payload over
    /// [`MAX_EVENT_PAYLOAD`](crate::MAX_EVENT_PAYLOAD); otherwise as [`Producer::send`].
    pub fn send_priority_event(&mut self, kind: u32, payload: &[u8]) -> Result<(), SendError> {
        op(self.priority_inner(kind, payload, Deadline::Never))
    }

    /// As [`Producer::send_priority_event`], or [`TrySendError::Full`] if four are in flight.
    pub fn try_send_priority_event(
        &mut self,
        kind: u32,
        payload: &[u8],
    ) -> Result<(), TrySendError> {
        op(self.priority_inner(kind, payload, Deadline::Now))
    }

    /// As [`Producer::send_priority_event`], waiting at most `timeout` for room.
    pub fn send_priority_event_timeout(
        &mut self,
        kind: u32,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(), SendTimeoutError> {
        op(self.priority_inner(kind, payload, Deadline::after(timeout)))
    }

    /// As [`Producer::send_priority_event`], waiting until `deadline` at most.
    pub fn send_priority_event_deadline(
        &mut self,
        kind: u32,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), SendTimeoutError> {
        op(self.priority_inner(kind, payload, Deadline::at(deadline)))
    }

    fn priority_inner(&mut self, kind: u32, payload: &[u8], deadline: Deadline) -> Result<()> {
        crate::endpoint::event::check_payload(&self.shared.name, payload)?;
        if self.closed {
            return Err(self.closed_error());
        }
        self.check_gone()?;
        let shared = self.shared.clone();
        park::wait_for(
            &shared.header().producer_park,
            self.wait,
            deadline,
            park::Notifier::Rmw,
            park::Pace::Sparse,
            |look| self.poll_priority(kind, payload, look),
        )
    }

    /// Pushes a priority event if the lane has room (and then wakes the consumer); else what
    /// a producer waiting for room looks at.
    fn poll_priority(&mut self, kind: u32, payload: &[u8], look: Look) -> Result<Option<()>> {
        let h = self.shared.header();
        if crate::protocol::lane::lane_push(h, self.prio_tail, kind, payload, &self.shared.name)? {
            self.prio_tail += 1;
            self.notify_consumer();
            return Ok(Some(()));
        }
        if self.consumer_detached() {
            return Err(self.closed_error());
        }
        self.check_peer(look)?;
        Ok(None)
    }

    /// Makes every record sent so far visible to the consumer and wakes it if it is parked.
    ///
    /// # Errors
    /// [`SendError::Closed`] if the consumer has detached, [`SendError::PeerDead`] once its
    /// death has been seen.
    pub fn flush(&mut self) -> Result<(), SendError> {
        op(self.flush_inner())
    }

    fn flush_inner(&mut self) -> Result<()> {
        self.check_gone()?;
        // A producer that only flushes learns of a dead consumer too (a clock read; the
        // liveness syscall at most every `CHECK_INTERVAL`).
        self.check_peer(Look::IfDue)?;
        if self.pending_abort {
            // Best effort: if no segment is free the abort stays pending.
            match self.write_pending_abort(Deadline::Now) {
                Ok(()) | Err(Error::WouldBlock) => {}
                Err(e) => return Err(e),
            }
        }
        self.publish();
        if self.consumer_detached() {
            self.gone = true;
            return Err(self.closed_error());
        }
        Ok(())
    }

    /// Publishes everything, marks the stream ended and wakes the consumer, which reads what
    /// was committed and then gets end-of-stream. Dropping the producer does the same.
    pub fn close(mut self) {
        self.close_inner(false);
    }

    /// Ends the stream as [`close`](Producer::close) does, then waits up to `timeout` until the
    /// consumer has read everything published: the one way for a producer to know that every
    /// record it sent arrived. See [`close_deadline`](Producer::close_deadline).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// tx.send(b"last words")?;
    /// let reader = std::thread::spawn(move || {
    ///     while let Some(r) = rx.recv()? {
    ///         assert_eq!(r.as_bytes(), Some(&b"last words"[..]));
    ///     }
    ///     Ok::<_, shmflow::RecvError>(())
    /// });
    /// tx.close_timeout(Duration::from_secs(10))?; // returns once the record was read
    /// reader.join().unwrap()?;
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`close_deadline`](Producer::close_deadline).
    pub fn close_timeout(self, timeout: Duration) -> Result<(), CloseError> {
        let deadline = Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(1 << 32));
        self.close_deadline(deadline)
    }

    /// Ends the stream as [`close`](Producer::close) does, then waits until `deadline` for
    /// the consumer to read everything published, that is, to hand back every segment it was
    /// given and take every priority event, or to detach after reading every record (counted
    /// when both ends keep metrics, the default). Returning a gate's floating segment wakes
    /// nobody: for a gate channel the wait may look again only every 40 ms. It sleeps on the producer's futex word, woken as segments come back.
    ///
    /// Whatever it returns, the stream is ended, and what was published stays readable: a
    /// named channel that no consumer opened keeps its name for one that opens it later.
    ///
    /// # Errors
    /// - [`CloseError::NotOpened`]: no consumer attached before the deadline;
    /// - [`CloseError::Timeout`]: the consumer is attached and alive but not done;
    /// - [`CloseError::Closed`]: the consumer detached with records unread;
    /// - [`CloseError::PeerDead`]: the consumer died before reading everything;
    /// - [`CloseError::AlreadyClosed`]: a call before this one had already found the consumer
    ///   gone (it returned `Closed`);
    /// - [`CloseError::Corrupt`], [`CloseError::Io`].
    pub fn close_deadline(mut self, deadline: Instant) -> Result<(), CloseError> {
        if self.gone {
            return Err(CloseError::from_wait(self.gone_error()));
        }
        // A consumer already seen dead is reported at once.
        self.check_peer(Look::Quick)
            .map_err(CloseError::from_wait)?;
        self.close_inner(false);
        let shared = self.shared.clone();
        let h = shared.header();
        let region = shared.name.clone();
        let acquired = self.counters.acquired.0;
        let written = self.metrics.then_some(self.counters.records.0);
        let prio_sent = self.prio_tail;
        // Segments handed over and not handed back, plus priority events not taken. The
        // counter is a statistic the consumer stores (Relaxed) as it releases each segment;
        // nothing is read through it, so no ordering is needed beyond seeing it eventually
        // (a lagging value only makes this wait longer).
        let unread = || {
            let segments = acquired.saturating_sub(
                h.consumer_counters
                    .segments_returned
                    .load(Ordering::Relaxed),
            );
            // Acquire: pairs with the consumer's Release store of its lane cursor.
            let events = prio_sent.saturating_sub(h.cons.prio_head.load(Ordering::Acquire));
            segments + events
        };
        let waited = park::wait_for(
            &h.producer_park,
            WaitStrategy::Park,
            Deadline::at(deadline),
            park::Notifier::Rmw,
            park::Pace::Sparse,
            |look| {
                let left = unread();
                if left == 0 {
                    return Ok(Some(Ok(())));
                }
                // Acquire (in `state`): pairs with the consumer's `leave`; its counters were
                // stored before it.
                match h.consumer.state() {
                    EndState::Free => Ok(None),
                    EndState::Attached => {
                        self.check_peer(look)?;
                        Ok(None)
                    }
                    EndState::Lost => Err(self.gone_error()),
                    _ => {
                        // Detached (its counters were stored before its state): it may have
                        // returned the last segment just before, or read every record and
                        // left the last segment in hand (a reader that knew how many
                        // records to expect).
                        let left = unread();
                        let read = h.consumer_counters.records.load(Ordering::Relaxed);
                        Ok(Some(match written {
                            _ if left == 0 => Ok(()),
                            Some(w) if w > 0 && read >= w && prio_sent == 0 => Ok(()),
                            _ => Err(CloseError::Closed {
                                region: region.clone(),
                                unread_segments: left,
                            }),
                        }))
                    }
                }
            },
        );
        match waited {
            Ok(outcome) => outcome,
            Err(Error::Timeout) => {
                let unread_segments = unread();
                Err(match h.consumer.state() {
                    EndState::Free => CloseError::NotOpened {
                        region,
                        unread_segments,
                    },
                    _ => CloseError::Timeout {
                        region,
                        unread_segments,
                    },
                })
            }
            Err(e) => Err(CloseError::from_wait(e)),
        }
    }

    /// Ends the stream as failed: the consumer reads every record committed so far, then gets
    /// [`RecvError::ProducerFailed`](crate::RecvError::ProducerFailed) (a gate:
    /// [`GateMessage::ChannelFailed`](crate::GateMessage::ChannelFailed)) instead of a clean
    /// end of stream. For a stage that gives up, so that the failure travels down the pipeline;
    /// dropping a producer while its thread panics does the same.
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// tx.send(b"partial")?;
    /// tx.fail();
    /// assert!(rx.recv()?.is_some());
    /// assert!(matches!(rx.recv(), Err(shmflow::RecvError::ProducerFailed(_))));
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn fail(mut self) {
        self.close_inner(true);
    }

    /// Ends the stream: cleanly, or as failed (`failed`: dropped while unwinding).
    fn close_inner(&mut self, failed: bool) {
        if self.closed {
            return;
        }
        self.closed = true;
        #[cfg(not(loom))]
        {
            self.flusher = None;
        }
        // A pending abort needs no frame here: end-of-stream in the middle of a spanning
        // record is reported to the consumer as RecordAborted.
        self.seal();
        let h = self.shared.header();
        // Everything sealed above is visible to a consumer that sees the end gone (see
        // `EndSlot::leave`).
        h.producer.leave(if failed {
            crate::protocol::ends::Leave::Failed
        } else {
            crate::protocol::ends::Leave::Clean
        });
        self.notify_consumer();
        self.settle_name();
    }

    /// A named channel's name stays for a consumer that has not come yet if anything was
    /// published, and is removed otherwise (see `region::name`).
    pub(crate) fn settle_name(&self) {
        #[cfg(not(loom))]
        {
            use crate::region::name::{settle, Left};
            let left = if self.data.pushed() > 0 || self.prio_tail > 0 {
                Left::Published
            } else {
                Left::Nothing
            };
            settle(&self.shared, End::Producer, left);
        }
    }

    /// True if the consumer has detached.
    pub fn is_closed(&self) -> bool {
        self.consumer_detached()
    }
}

// SAFETY: the only non-Send field is the cached segment pointer, which points into the mapping
// kept alive by `shared` (an `Arc` of a Send + Sync region).
unsafe impl Send for Producer {}

impl Drop for Producer {
    fn drop(&mut self) {
        // Under loom a failed model unwinds through here; more loom operations would abort.
        #[cfg(loom)]
        if std::thread::panicking() {
            return;
        }
        // A producer dropped while its thread unwinds ends the stream as failed, so that the
        // consumer can tell a crash by panic from a finished producer.
        let failed = std::thread::panicking();
        self.close_inner(failed);
    }
}

/// `len` bytes claimed in a segment for one record (see [`Producer::claim`]).
#[must_use = "dropping a claim without `commit` sends nothing"]
pub struct Claim<'a> {
    producer: &'a mut Producer,
    at: usize,
    len: usize,
}

impl Claim<'_> {
    /// Sends the record with all `len` bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// let mut c = tx.claim(4)?;
    /// c.copy_from_slice(b"abcd");
    /// c.commit(); // dropping the claim instead would send nothing
    /// tx.flush()?;
    /// assert_eq!(rx.recv()?.unwrap().as_bytes(), Some(&b"abcd"[..]));
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    #[inline]
    pub fn commit(self) {
        let len = self.len;
        self.commit_len(len);
    }

    /// Sends the record with only its first `len` bytes (`len` at most the claimed length):
    /// for serializers that reserve a bound and use less.
    ///
    /// # Panics
    /// If `len` is more than the claimed length.
    #[inline]
    pub fn commit_len(self, len: usize) {
        assert!(
            len <= self.len,
            "commit_len({len}) is more than the {} bytes claimed",
            self.len
        );
        let p = self.producer;
        let c = p.cur.as_mut().expect("a claim holds a segment");
        debug_assert_eq!(c.wpos, self.at);
        c.wpos = frame::next_frame(self.at, len);
        p.write_header(self.at, len as u32, frame::WHOLE);
        p.record_done(len as u64);
    }
}

impl std::ops::Deref for Claim<'_> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: `at + 8 + len <= segment_size` (checked by `claim`), the segment is in the
        // producer's hand and past the published offset, so the consumer does not read it.
        unsafe {
            std::slice::from_raw_parts(self.producer.seg_ptr().add(self.at + HEADER), self.len)
        }
    }
}

impl std::ops::DerefMut for Claim<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only view.
        unsafe {
            std::slice::from_raw_parts_mut(self.producer.seg_ptr().add(self.at + HEADER), self.len)
        }
    }
}

/// A record being streamed (see [`Producer::stream`]).
#[must_use = "dropping a record writer without `finish` discards the record"]
pub struct RecordWriter<'a> {
    producer: &'a mut Producer,
    /// Where the current frame's header goes.
    frag_start: usize,
    /// Where the next byte goes.
    pos: usize,
    total: u64,
    spanning: bool,
    finished: bool,
    failed: bool,
    /// A `write_async` was dropped part-way: how much of its bytes went in is unknown, so the
    /// record can only be discarded (later writes and `finish` fail; dropping cleans up).
    interrupted: bool,
    /// When waits for further segments give up.
    deadline: Deadline,
}

impl RecordWriter<'_> {
    fn overflow(&mut self) -> Result<()> {
        let p = &mut *self.producer;
        let seg_size = p.shared.segment_size();
        if !self.spanning && self.frag_start > 0 {
            // Still fits a fresh segment perhaps: move it there (records that fit never span).
            // The bytes written so far are copied out *before* the seal: once sealed, the
            // consumer may return the segment, and a gate may lend a floating segment to
            // another channel whose producer then writes it. One scratch buffer per producer,
            // grown on the first move, keeps this rare path from allocating per record.
            let old = p.cur.expect("a segment in hand");
            let partial = self.pos - self.frag_start - HEADER;
            p.shared
                .tracker
                .read(old.seg as usize, self.frag_start + HEADER, partial);
            p.scratch.clear();
            // SAFETY: `frag_start + 8 + partial <= segment_size` (the writer's positions stay
            // inside the segment in hand), and the segment is the producer's until the seal
            // below publishes it: nobody else writes these bytes now.
            p.scratch.extend_from_slice(unsafe {
                std::slice::from_raw_parts(old.base.add(self.frag_start + HEADER), partial)
            });
            p.cur.as_mut().expect("in hand").wpos = self.frag_start;
            p.seal();
            if let Err(e) = p.take(self.deadline) {
                // Nothing of it was published (the seal stopped before it): just lost.
                self.failed = true;
                return Err(e);
            }
            let new = p.cur.expect("just taken");
            p.shared.tracker.write(new.seg as usize, HEADER, partial);
            // SAFETY: `8 + partial <= segment_size`: inside the fresh segment, which is ours
            // (just taken); the scratch buffer is ours too and does not overlap the mapping.
            unsafe {
                std::ptr::copy_nonoverlapping(p.scratch.as_ptr(), new.base.add(HEADER), partial);
            }
            self.frag_start = 0;
            self.pos = HEADER + partial;
            return Ok(());
        }
        // Larger than a segment: this frame is a part, continue in the next segment.
        let kind = if self.spanning {
            frame::MIDDLE
        } else {
            frame::FIRST
        };
        p.write_header(
            self.frag_start,
            (seg_size - self.frag_start - HEADER) as u32,
            kind,
        );
        p.cur.as_mut().expect("in hand").wpos = seg_size;
        self.spanning = true;
        p.seal();
        if let Err(e) = p.take(self.deadline) {
            p.pending_abort = true;
            self.failed = true;
            return Err(e);
        }
        self.frag_start = 0;
        self.pos = HEADER;
        Ok(())
    }

    /// Appends bytes to the record.
    ///
    /// # Errors
    /// As the call that started the record waits ([`WriteError`]); after a failure every
    /// further write is [`WriteError::RecordAborted`].
    pub fn write_bytes(&mut self, bytes: &[u8]) -> Result<(), WriteError> {
        op(self.write_checked(bytes))
    }

    /// A write from outside (`write_bytes`, `io::Write`): refused once an async write was
    /// dropped part-way.
    fn write_checked(&mut self, bytes: &[u8]) -> Result<()> {
        if self.interrupted {
            return Err(Error::aborted(&self.producer.shared.name));
        }
        self.write_inner(bytes)
    }

    fn write_inner(&mut self, mut bytes: &[u8]) -> Result<()> {
        if self.failed {
            return Err(Error::aborted(&self.producer.shared.name));
        }
        let seg_size = self.producer.shared.segment_size();
        while !bytes.is_empty() {
            if self.pos == seg_size {
                self.overflow()?;
            }
            let take = bytes.len().min(seg_size - self.pos);
            self.producer.write_bytes(self.pos, &bytes[..take]);
            self.pos += take;
            self.total += take as u64;
            bytes = &bytes[take..];
        }
        Ok(())
    }

    /// Ends the record and sends it (according to the flush policy).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::io::Write;
    ///
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// let mut w = tx.stream()?;
    /// w.write_all(b"part one, ")?;
    /// w.write_all(b"part two")?;
    /// w.finish()?; // dropping the writer instead would discard the record
    /// tx.flush()?;
    /// assert_eq!(rx.recv()?.unwrap().to_vec()?, b"part one, part two");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`WriteError::RecordAborted`] if an earlier write failed.
    pub fn finish(mut self) -> Result<(), WriteError> {
        if self.failed || self.interrupted {
            return Err(WriteError::RecordAborted(Box::new(
                crate::error::RecordAbortedError {
                    region: self.producer.shared.name.clone(),
                },
            )));
        }
        self.finished = true;
        let p = &mut *self.producer;
        let len = self.pos - self.frag_start - HEADER;
        let kind = if self.spanning {
            frame::LAST
        } else {
            frame::WHOLE
        };
        p.write_header(self.frag_start, len as u32, kind);
        p.cur.as_mut().expect("in hand").wpos = frame::align8(self.pos);
        p.record_done(self.total);
        Ok(())
    }
}

impl io::Write for RecordWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_checked(buf)?;
        Ok(buf.len())
    }

    /// A record becomes visible only when finished; this does nothing.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for RecordWriter<'_> {
    fn drop(&mut self) {
        if self.finished || self.failed {
            return;
        }
        let p = &mut *self.producer;
        if !self.spanning {
            // Nothing of it was published: forget it.
            p.cur.as_mut().expect("in hand").wpos = self.frag_start;
            return;
        }
        // Parts are out: replace the frame in progress with ABORT.
        p.write_header(self.frag_start, 0, frame::ABORT);
        p.cur.as_mut().expect("in hand").wpos = frame::next_frame(self.frag_start, 0);
        p.after_frame_end();
    }
}

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

impl std::fmt::Debug for Claim<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claim")
            .field("region", &self.producer.shared.name)
            .field("at", &self.at)
            .field("len", &self.len)
            .finish()
    }
}

impl std::fmt::Debug for RecordWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordWriter")
            .field("region", &self.producer.shared.name)
            .field("written", &self.total)
            .field("spanning", &self.spanning)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// Copies `src` to `dst`: up to 64 bytes inline, as two overlapping unaligned loads and stores
/// of the widest integer that fits. The length is often known only at run time here (an
/// async sender's future keeps it in memory), and a call into the C library's copy for a few
/// dozen bytes costs more than the copy.
///
/// # Safety
/// `dst` is valid for `src.len()` bytes of writes and does not overlap `src`.
#[inline(always)]
unsafe fn copy_record(src: &[u8], dst: *mut u8) {
    /// Copies `[0, w)` and `[len - w, len)`, `w` being `T`'s size.
    ///
    /// # Safety
    /// `size_of::<T>() <= len`, and both buffers are valid for `len` bytes.
    #[inline(always)]
    unsafe fn ends<T: Copy>(src: *const u8, dst: *mut u8, len: usize) {
        let w = std::mem::size_of::<T>();
        // SAFETY: `w <= len` (the caller's contract), so both ranges are in bounds of both
        // buffers; unaligned reads and writes of plain integers.
        unsafe {
            let a = std::ptr::read_unaligned(src as *const T);
            let b = std::ptr::read_unaligned(src.add(len - w) as *const T);
            std::ptr::write_unaligned(dst as *mut T, a);
            std::ptr::write_unaligned(dst.add(len - w) as *mut T, b);
        }
    }
    let (s, len) = (src.as_ptr(), src.len());
    // SAFETY: each arm's width is at most `len`; the caller's contract covers `dst`.
    unsafe {
        match len {
            33..=64 => ends::<[u128; 2]>(s, dst, len),
            17..=32 => ends::<u128>(s, dst, len),
            8..=16 => ends::<u64>(s, dst, len),
            _ => std::ptr::copy_nonoverlapping(s, dst, len),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod copy_tests {
    /// Every length up to past the widest arm: the bytes land where they belong and nothing
    /// after them is touched.
    #[test]
    fn copy_record_copies_exactly_len_bytes() {
        for len in 0..=80usize {
            let src: Vec<u8> = (0..len).map(|i| i as u8 ^ 0xA5).collect();
            let mut dst = [0xEEu8; 96];
            // SAFETY: `dst` holds 96 >= `len` bytes and is not `src`.
            unsafe { super::copy_record(&src, dst.as_mut_ptr()) };
            assert_eq!(&dst[..len], &src[..], "length {len}");
            assert!(
                dst[len..].iter().all(|&b| b == 0xEE),
                "length {len}: wrote past the end"
            );
        }
    }
}
