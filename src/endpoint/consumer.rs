//! The consumer end: takes segments from the data ring in order, reads the frames published in
//! each (a frame is there when its header word, loaded with Acquire, is not 0: see
//! `frame.rs`), and returns a segment to the producer once it has read its SEAL frame or its
//! last byte.
//!
//! Everything read from the region is untrusted: the segment index (ring) and every frame
//! header (known kind, length within the segment, spanning parts in a valid order and place)
//! are checked before use; a violation is [`RecvError::Corrupt`].
//! Loops are bounded: one call moves past at most `N + 1` segments before it reports "nothing
//! yet", so a peer that floods empty segments cannot trap the reader.

use std::convert::Infallible;
#[cfg(not(shmflow_loom))]
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use crate::endpoint::event::{Alignment, Barrier, Event};
use crate::endpoint::metrics::Waiting;
#[cfg(not(shmflow_loom))]
use crate::error::RegionKind;
use crate::error::{
    corrupt, peer_lost, producer_failed, too_large, CorruptError, End, Halt, OpenError,
    PeerDeadError, ProducerFailedError, RecordTooLargeError, RecvError, RecvTimeoutError,
    TryRecvError,
};
#[cfg(not(shmflow_loom))]
use crate::protocol::abi::Geometry;
use crate::protocol::barrier;
use crate::protocol::counters::Local;
use crate::protocol::debloat::{self, Debloat};
use crate::protocol::ends::EndState;
use crate::protocol::frame::{self, HEADER};
use crate::protocol::park::{self, Forever, Immediately, Look, Patience, Until, WaitStrategy};
use crate::protocol::pool::Recycler;
use crate::protocol::ring::{Cursors, RingRx, RingTx};
#[cfg(not(shmflow_loom))]
use crate::region::handoff::PeerHandle;
use crate::region::liveness::{EndLock, Liveness};
use crate::region::os::Host;
use crate::region::view::Shared;
use crate::sync::Arc;
use crate::sys::clock::monotonic_ns;

#[cfg(any(feature = "tokio", shmflow_loom))]
mod asynch;
#[cfg(all(feature = "net", not(shmflow_loom)))]
pub(crate) mod raw;
#[cfg(feature = "tokio")]
pub use asynch::RecvAsync;
mod gate_hooks;
pub(crate) use gate_hooks::Ready;
mod record;
pub use record::{Message, Record};
use record::{RecordKind, Span};

/// Default limit on a record's total length for the reader (spanning records are otherwise
/// unbounded): 4 GiB.
pub const DEFAULT_MAX_RECORD_LEN: u64 = 4 << 30;

#[derive(Clone, Copy, Debug)]
struct ReadSeg {
    seg: u32,
    /// Start of the segment in the mapping (cached: computed once per segment, not per record).
    base: *const u8,
    /// Next frame to read.
    rd: usize,
    /// The producer had already moved on to a later segment when this one was taken, so
    /// every line of it is written: prefetching ahead cannot pull a line the producer is
    /// still writing (which would cost it a cache-line transfer per line).
    complete: bool,
}

#[derive(Clone, Copy, Debug)]
struct Frame {
    at: usize,
    len: usize,
    kind: u32,
}

#[derive(Default)]
struct Counters {
    records: Local,
    bytes: Local,
    taken: Local,
    returned: Local,
    wakes: Local,
}

/// The reading end of a channel. Single-threaded (`Send`, not `Sync`).
pub struct Consumer {
    pub(crate) shared: Arc<Shared>,
    data: RingRx,
    ret: RingTx,
    cur: Option<ReadSeg>,
    /// Between a FIRST frame and its LAST (or ABORT).
    in_span: bool,
    /// The end of the stream was reached: every record was read and the producer detached
    /// cleanly (set where `next_slow` reports it; it never goes back).
    ended: bool,
    /// A spanning record was dropped unread: skip its remaining parts first.
    skipping: bool,
    wait: WaitStrategy,
    max_record_len: u64,
    /// `max_record_len` as a `usize` (saturating), for the fast path.
    fast_max: usize,
    /// The segment size (fixed for the region's life; kept here so the hot path does not
    /// follow the `Arc`).
    seg_size: usize,
    /// Where the reader was when its last wait ended (segment, offset): how far it got since
    /// tells a streaming writer from sparse records (see `pace`).
    wait_mark: Option<(u32, usize)>,
    counters: Counters,
    /// Per-record counters on.
    metrics: bool,
    /// The producer's liveness, looked at only while waiting (None under loom).
    liveness: Option<Liveness>,
    /// Where finished segments go and which segments the data ring may carry: supplied by
    /// the channel's owner (its own, or a gate's).
    recycler: Recycler,
    /// Priority lane: next slot to read, and the payload of the last one read.
    prio_head: u64,
    prio_buf: [u8; crate::protocol::abi::PRIO_PAYLOAD],
    /// The spanning record handed out last.
    span: Span,
    /// The state this end leaves in when dropped: `DETACHED`, or `LOST` for a network bridge
    /// that lost its remote peer.
    detach_as: crate::protocol::ends::Leave,
    /// Buffer debloating, when on: sets the producer's segment cap from the rate this end
    /// reads at (see `protocol::debloat`).
    debloat: Option<Debloat>,
    /// Async calls since the last look at the executor's budget.
    #[cfg(any(feature = "tokio", shmflow_loom))]
    coop: u8,
    /// The last `drain_async` caught up with the writer without having waited: the writer
    /// streams, and the next call leaves it alone for a gap first (see `drain_async`).
    #[cfg(any(feature = "tokio", shmflow_loom))]
    caught_up: bool,
    /// A direct network end: its waits read the socket into free segments, and segments
    /// handed back become credit (see `endpoint::remote`). `None` for a local end.
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    link: Option<crate::endpoint::remote::Link<dyn crate::endpoint::remote::Inbound>>,
    /// A sending bridge's wake-ups of the producer, one per batch of segments given back
    /// (see `give`).
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    owed: crate::endpoint::owed::Owed,
}

/// The reading path's result for a call with patience `P`: a blocking call's halt is a
/// [`RecvError`], a `try_` call's adds "nothing yet", a timed call's "out of time".
type Got<T, P> = Result<T, Halt<<P as Patience>::Expired, RecvError>>;

/// What the slow path found next, before anything borrows the consumer. `S` comes with an
/// event: `()` for a caller that takes events, `Infallible` for one that skips them (so it
/// needs no arm for them).
enum Next<S> {
    Record(RecordKind),
    Event { at: usize, len: usize, seen: S },
    Priority(S),
    End,
}

/// What a wait for the next frame found.
enum Waited<S> {
    Frame(Frame),
    /// A pending priority event (only for a read that takes events: `S` is its witness).
    Priority(S),
    End,
}

/// How a stream ended other than cleanly: the producer failed, or it was a network bridge
/// that lost its remote peer.
pub(crate) enum UncleanEnd {
    Failed(Box<ProducerFailedError>),
    Lost(Box<PeerDeadError>),
}

impl From<UncleanEnd> for RecvError {
    fn from(e: UncleanEnd) -> RecvError {
        match e {
            UncleanEnd::Failed(b) => RecvError::ProducerFailed(b),
            UncleanEnd::Lost(b) => RecvError::PeerDead(b),
        }
    }
}

/// Whether a read takes events: `Some` of the witness that comes with one, or `None`.
trait Seen: Sized {
    const TAKE: Option<Self>;
    /// A read that takes no events skips priority events, while it waits too: a producer
    /// waiting for room in the lane (or a direct end holding one back) is never left
    /// waiting for a reader of records. Only a reader of records skips them: the parts of a
    /// record leave them for the next message.
    const SKIP: bool = false;
}

impl Seen for () {
    const TAKE: Option<()> = Some(());
}

impl Seen for Infallible {
    const TAKE: Option<Self> = None;
}

/// A reader of records: takes no events, and skips priority events (see [`Seen::SKIP`]).
enum Skip {}

impl Seen for Skip {
    const TAKE: Option<Self> = None;
    const SKIP: bool = true;
}

impl Consumer {
    #[cfg(not(shmflow_loom))]
    pub(crate) fn create_with(name: &str, geometry: Geometry) -> Result<Consumer, OpenError> {
        let (shared, lock) = crate::region::object::create_named(name, geometry, End::Consumer)?;
        Consumer::attach_with(shared, Some(lock))
    }

    #[cfg(not(shmflow_loom))]
    pub(crate) fn open_with(name: &str) -> Result<Consumer, OpenError> {
        Consumer::attach(crate::region::object::open_named(name, true)?)
    }

    #[cfg(not(shmflow_loom))]
    pub(crate) fn create_anonymous_with(
        geometry: Geometry,
    ) -> Result<(Consumer, PeerHandle), OpenError> {
        let (shared, lock) = crate::region::object::create_memfd(geometry, End::Consumer)?;
        let handle = PeerHandle::new(&shared)?;
        Ok((Consumer::attach_with(shared, Some(lock))?, handle))
    }

    #[cfg(not(shmflow_loom))]
    pub(crate) fn from_fd_with(fd: BorrowedFd<'_>) -> Result<Consumer, OpenError> {
        let (own, name) = crate::region::handoff::dup_region(fd, RegionKind::Channel)?;
        Consumer::attach(crate::region::object::open_fd(name, own, true, None)?)
    }

    /// The consumer of the region of `handle`, in this process, with its doorbells.
    #[cfg(not(shmflow_loom))]
    pub(crate) fn from_handle(
        mut handle: crate::region::handoff::PeerHandle,
    ) -> Result<Consumer, OpenError> {
        let bells = handle.take_bells();
        let fd = handle.into_fd();
        let name = crate::region::handoff::fd_region_name(&fd);
        Consumer::attach(crate::region::object::open_fd(name, fd, true, bells)?)
    }

    #[cfg(not(shmflow_loom))]
    pub(crate) fn from_env_with(var: &str) -> Result<Consumer, OpenError> {
        use crate::region::handoff::{open_from_env, Handed};
        match open_from_env(var, false)? {
            Handed::Channel(shared) => Consumer::attach(shared),
            // (Refused before anything was taken; kept for the match.)
            Handed::GateChannel(s) => Err(crate::region::handoff::gate_handle_refused(
                var,
                s.gate.as_ref().map_or(0, |g| g.index),
            )),
        }
    }

    pub(crate) fn attach(shared: Arc<Shared>) -> Result<Consumer, OpenError> {
        Consumer::attach_with(shared, None)
    }

    /// Attaches, with the liveness lock already taken (creators) or taking it now.
    pub(crate) fn attach_with(
        shared: Arc<Shared>,
        lock: Option<std::sync::Arc<EndLock>>,
    ) -> Result<Consumer, OpenError> {
        Consumer::attach_as(shared, lock, Recycler::Own)
    }

    /// Attaches with the recycler the channel's owner supplies (a gate supplies its own).
    pub(crate) fn attach_as(
        shared: Arc<Shared>,
        lock: Option<std::sync::Arc<EndLock>>,
        recycler: Recycler,
    ) -> Result<Consumer, OpenError> {
        let liveness = crate::region::view::attach_end(&shared, End::Consumer, lock)?;
        let n = shared.initial_free;
        let (data, ret) = match Cursors::at_attach(shared.header()).consumer_rings(n) {
            Ok(rings) => rings,
            Err(found) => {
                crate::region::view::give_up_attach(&shared, End::Consumer);
                return Err(OpenError::corrupt(
                    &shared.name,
                    "consumer cursors at attach",
                    format!("data head 0 and return tail {n}"),
                    found,
                ));
            }
        };
        let shared_seg_size = shared.segment_size();
        Ok(Consumer {
            data,
            ret,
            shared,
            cur: None,
            in_span: false,
            skipping: false,
            ended: false,
            wait: WaitStrategy::default(),
            max_record_len: DEFAULT_MAX_RECORD_LEN,
            counters: Counters::default(),
            metrics: true,
            liveness,
            recycler,
            prio_head: 0,
            prio_buf: [0; crate::protocol::abi::PRIO_PAYLOAD],
            detach_as: crate::protocol::ends::Leave::Clean,
            debloat: None,
            span: Span::default(),
            seg_size: shared_seg_size,
            fast_max: usize::try_from(DEFAULT_MAX_RECORD_LEN).unwrap_or(usize::MAX),
            wait_mark: None,
            #[cfg(any(feature = "tokio", shmflow_loom))]
            coop: 0,
            #[cfg(any(feature = "tokio", shmflow_loom))]
            caught_up: false,
            #[cfg(all(feature = "net", not(shmflow_loom)))]
            link: None,
            #[cfg(all(feature = "net", not(shmflow_loom)))]
            owed: Default::default(),
        })
    }

    /// Makes this consumer a direct network end: `link` fills its (private) region from the
    /// socket where a local consumer would park.
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(crate) fn set_link(&mut self, link: Box<dyn crate::endpoint::remote::Inbound>) {
        self.link = Some(crate::endpoint::remote::Link(link));
    }

    /// A gate's channel whose producer is a direct network end: reads what arrived (and
    /// announces credit) without waiting. False if the channel has no link.
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(crate) fn link_fill_now(&mut self) -> bool {
        match &mut self.link {
            Some(l) => {
                l.fill(Some(std::time::Instant::now()));
                true
            }
            None => false,
        }
    }

    /// The link has work that needs no new bytes from the socket (see [`Inbound::due`]).
    ///
    /// [`Inbound::due`]: crate::endpoint::remote::Inbound::due
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(crate) fn link_due(&mut self) -> bool {
        self.link.as_mut().is_some_and(|l| l.due())
    }

    /// The link's socket (for a readiness watch).
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(crate) fn link_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.link.as_ref().map(|l| l.as_fd())
    }

    /// Drops the link (the channel ended: its socket is closed, and the producer it wrote
    /// with is gone). True if there was one.
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(crate) fn drop_link(&mut self) -> bool {
        self.link.take().is_some()
    }

    /// Name of the region.
    pub fn region_name(&self) -> &str {
        &self.shared.name
    }

    /// Segment size and count of the channel.
    pub fn geometry(&self) -> crate::protocol::abi::Geometry {
        self.shared.geometry
    }

    /// Sets how blocking calls wait (see [`WaitStrategy`]).
    pub fn set_wait_strategy(&mut self, wait: WaitStrategy) {
        self.wait = wait;
    }

    /// Longest record (in total, over its parts) the reader accepts: every record, in one
    /// segment or spanning, is bounded by it. A longer one is skipped and reported as
    /// [`RecvError::RecordTooLarge`]; the next call goes on with the next record. The producer
    /// is not trusted to bound it.
    pub fn set_max_record_len(&mut self, max: u64) {
        self.max_record_len = max;
        self.fast_max = usize::try_from(max).unwrap_or(usize::MAX);
    }

    fn producer_detached(&self) -> bool {
        // Acquire (in `state`): pairs with the producer's `leave`, after its last seal.
        matches!(
            self.shared.header().producer.state(),
            EndState::Detached | EndState::Failed | EndState::Lost
        )
    }

    /// `Some(ProducerFailed)` if the producer ended the stream as failed (it was dropped while
    /// its thread unwound from a panic), `Some(PeerDead)` if it was a network bridge that lost
    /// its remote peer.
    pub(crate) fn producer_end(&self) -> Option<UncleanEnd> {
        let p = &self.shared.header().producer;
        let pid = || p.pid();
        match p.state() {
            EndState::Failed => Some(UncleanEnd::Failed(producer_failed(
                &self.shared.name,
                pid(),
            ))),
            EndState::Lost => {
                #[cfg(all(feature = "net", not(shmflow_loom)))]
                let cause = self.link.as_ref().and_then(|l| l.cause());
                #[cfg(not(all(feature = "net", not(shmflow_loom))))]
                let cause = None;
                Some(UncleanEnd::Lost(peer_lost(
                    &self.shared.name,
                    End::Producer,
                    pid(),
                    cause,
                )))
            }
            _ => None,
        }
    }

    fn corrupt(&self, field: &'static str, expected: String, found: u64) -> Box<CorruptError> {
        corrupt(&self.shared.name, field, expected, found)
    }

    // ----- segments ------------------------------------------------------------------------

    fn release_current(&mut self) -> Result<(), Box<CorruptError>> {
        let Some(c) = self.cur.take() else {
            return Ok(());
        };
        self.publish_counts();
        let h = self.shared.header();
        let back = self.recycler.release(h, c.seg);
        self.counters
            .returned
            .add(&h.consumer_counters.segments_returned, 1);
        // Before the wake-up below (see `publish_done`).
        #[cfg(not(shmflow_broken = "debloat_done_late"))]
        debloat::publish_done(h, self.counters.returned.0);
        match back {
            Some(seg) => self.give(seg)?,
            // Back to the gate: a producer held back by the cap still learns of it.
            None if self.debloat.is_some() => self.wake_producer(),
            None => {}
        }
        #[cfg(shmflow_broken = "debloat_done_late")]
        debloat::publish_done(self.shared.header(), self.counters.returned.0);
        if self.debloat.is_some() {
            self.debloat_sample(c.rd.min(self.seg_size) as u64);
        }
        Ok(())
    }

    /// Buffer debloating: counts a finished segment of `bytes` into the rate, and publishes
    /// a new cap when the rule says so.
    #[cold]
    fn debloat_sample(&mut self, bytes: u64) {
        let idle = self.idle_total();
        let Some(d) = &mut self.debloat else {
            return;
        };
        let Some(s) = d.finished(bytes, monotonic_ns(), idle) else {
            return;
        };
        crate::protocol::counters::set(
            &self.shared.header().consumer_counters.debloat_rate,
            s.rate,
        );
        if let Some(l) = s.limit {
            self.publish_limit(l);
        }
    }

    /// Publishes a limit: the fill first (it is read as each segment is taken), then the cap.
    fn publish_limit(&mut self, l: debloat::Limit) {
        let fill = if l.fill >= self.seg_size as u64 {
            0
        } else {
            l.fill
        };
        debloat::publish_fill(self.shared.header(), fill);
        self.publish_cap(l.cap);
    }

    /// Publishes the producer's segment cap (0: none) and wakes it if the cap rose or went.
    pub(crate) fn publish_cap(&mut self, cap: u64) {
        let wake = debloat::publish_cap(self.shared.header(), cap);
        #[cfg(not(shmflow_broken = "debloat_silent_raise"))]
        if wake {
            self.wake_producer();
        }
        #[cfg(shmflow_broken = "debloat_silent_raise")]
        let _ = wake;
    }

    /// What this end has waited for data in all: its own idle time, or its gate's for a
    /// channel of a gate (the gate waits for all its channels at once).
    fn idle_total(&self) -> u64 {
        match &self.shared.gate {
            Some(g) => crate::protocol::counters::read(&g.gate_header().pool.idle_ns),
            None => {
                crate::protocol::counters::read(&self.shared.header().consumer_counters.idle_ns)
            }
        }
    }

    /// Turns buffer debloating on with a target time (Flink's
    /// `taskmanager.network.memory.buffer-debloat.target`), or off with `None`.
    ///
    /// When on, this end measures the rate at which it reads (bytes per second of the time it
    /// is not waiting for data) and lets its producer have in flight only the segments that
    /// hold what it reads in `target`: a record starts a new segment only while fewer are
    /// taken and not yet read. A checkpoint barrier then waits behind about `target` of data
    /// instead of the whole pool. The cap follows the rate, smoothed (a change of less than a
    /// quarter is ignored), is never below two segments (one read while one is written) nor
    /// above the channel's, and is every segment until the first measurement (50 ms of
    /// reading). A record larger than what the cap leaves still goes whole, and a producer
    /// across the network gets no more credit than the cap leaves. The figures are in
    /// [`Snapshot`](crate::metrics::Snapshot) (`debloat_*`, `segment_cap`) and `shmflow stat`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// rx.set_debloat_target(Some(Duration::from_millis(100)));
    /// tx.send(b"x")?;
    /// tx.flush()?;
    /// assert!(rx.recv()?.is_some());
    /// assert_eq!(rx.metrics().debloat_target_ns, 100_000_000);
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn set_debloat_target(&mut self, target: Option<std::time::Duration>) {
        let h = self.shared.header();
        match target {
            Some(t) => {
                let d = Debloat::new(
                    t,
                    self.seg_size as u64,
                    self.shared.n() as u64,
                    monotonic_ns(),
                    self.idle_total(),
                );
                crate::protocol::counters::set(
                    &h.consumer_counters.debloat_target_ns,
                    d.target_ns(),
                );
                crate::protocol::counters::set(&h.consumer_counters.debloat_rate, 0);
                let limit = d.limit();
                self.debloat = Some(d);
                self.publish_limit(limit);
            }
            None => {
                crate::protocol::counters::set(&h.consumer_counters.debloat_target_ns, 0);
                crate::protocol::counters::set(&h.consumer_counters.debloat_rate, 0);
                self.debloat = None;
                debloat::publish_fill(h, 0);
                self.publish_cap(0);
            }
        }
    }

    /// The debloating target in force (`None`: off).
    pub fn debloat_target(&self) -> Option<std::time::Duration> {
        self.debloat
            .as_ref()
            .map(|d| std::time::Duration::from_nanos(d.target_ns()))
    }

    /// Wakes the producer if it waits.
    fn wake_producer(&mut self) {
        let h = self.shared.header();
        if park::notify::<Host>(&h.producer_park, self.shared.producer_bell()) {
            self.counters.wakes.add(&h.consumer_counters.wakes, 1);
        }
    }

    /// Pushes a segment into the return ring and wakes the producer (a sending bridge: once
    /// per batch, and before it waits, `raw_wake_owed`).
    fn give(&mut self, seg: u32) -> Result<(), Box<CorruptError>> {
        // Release (inside push): our reads of the segment happen before the producer reuses it.
        self.ret.push(&self.shared.return_ring(), seg)?;
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if !self.owed.now() {
            return Ok(());
        }
        self.wake_producer();
        Ok(())
    }

    /// Checks the published header `word` of the frame at `c.rd`.
    fn parse(&self, c: ReadSeg, word: u64) -> Result<Frame, Box<CorruptError>> {
        match frame::check(c.rd, word, self.seg_size, self.in_span) {
            Ok(f) => Ok(Frame {
                at: c.rd,
                len: f.len,
                kind: f.kind,
            }),
            Err(v) => Err(self.corrupt(v.field, v.expected, v.found)),
        }
    }

    /// The next published frame, if any, without waiting. Does not move past it.
    fn poll_frame(&mut self) -> Result<Option<Frame>, Box<CorruptError>> {
        let mut hops = 0;
        let seg_size = self.seg_size;
        loop {
            let Some(c) = self.cur else {
                if !self.take_next()? {
                    return Ok(None);
                }
                continue;
            };
            if c.rd + HEADER <= seg_size {
                // Acquire: pairs with the producer's Release store of the first header of
                // what it publishes, so every frame up to the next 0 is visible.
                let word = frame::load(self.shared.word(c.seg, c.rd));
                if word == 0 {
                    return Ok(None);
                }
                let f = self.parse(c, word)?;
                if f.kind != frame::SEAL {
                    if !c.complete && self.data.ready(&self.shared.data_ring())? > 0 {
                        // The producer has moved on since we took this segment: it is
                        // complete now, and prefetching ahead in it is safe.
                        if let Some(cur) = &mut self.cur {
                            cur.complete = true;
                        }
                    }
                    return Ok(Some(f));
                }
            }
            // Read to its end, or sealed: the producer writes nothing more in it.
            self.release_current()?;
            hops += 1;
            if hops > self.shared.n() {
                return Ok(None);
            }
        }
    }

    /// Takes the next segment off the data ring into hand, if there is one.
    fn take_next(&mut self) -> Result<bool, Box<CorruptError>> {
        debug_assert!(self.cur.is_none());
        let Some(seg) = self.data.pop(&self.shared.data_ring())? else {
            return Ok(false);
        };
        if let Err(e) = self.recycler.check(seg) {
            return Err(self.corrupt(
                "segment index in data ring",
                format!(
                    "one of the channel's segments {:?} or a floating segment lent to it",
                    e.exclusive
                ),
                seg as u64,
            ));
        }
        let complete = self.data.ready(&self.shared.data_ring())? > 0;
        self.cur = Some(ReadSeg {
            seg,
            base: self.shared.segment_ptr(seg),
            rd: 0,
            complete,
        });
        let h = self.shared.header();
        self.counters
            .taken
            .add(&h.consumer_counters.segments_taken, 1);
        Ok(true)
    }

    fn advance(&mut self, f: Frame) {
        let c = self.cur.as_mut().expect("a segment in hand");
        c.rd = frame::next_frame(f.at, f.len);
    }

    /// The next frame (or, if `S` takes them, a pending priority event), waiting as
    /// `patience` allows; `Waited::End` at end of stream.
    fn wait_frame<P: Patience, S: Seen>(&mut self, patience: P) -> Got<Waited<S>, P> {
        if let Some(seen) = S::TAKE.filter(|_| self.prio_pending()) {
            return Ok(Waited::Priority(seen));
        }
        if let Some(f) = self.poll_frame()? {
            return Ok(Waited::Frame(f));
        }
        // Nothing to read: a good moment to publish what was read so far.
        self.publish_counts();
        let timed = patience.waits();
        // (Not under loom: the spin path is covered by `wait_for`, and the models stay small.)
        #[cfg(not(shmflow_loom))]
        if timed && matches!(self.wait, WaitStrategy::BusyPoll(_)) {
            // Most waits of a busy channel are short: look a few more times before reading
            // the clock (waits shorter than this burst, well under a microsecond, are not
            // counted as idle time).
            for _ in 0..FAST_POLLS {
                crate::sync::spin_loop();
                if let Some(f) = self.poll_frame()? {
                    return Ok(Waited::Frame(f));
                }
            }
        }
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if self.link.is_some() {
            return self.wait_link(patience);
        }
        let pace = self.pace();
        // SAFETY: `self.shared` is an `Arc` that is never replaced while `self` lives, so the
        // region it points to outlives this call; only the closure's `&mut self` is used to
        // change `self`, and it never touches the `Arc`. (Cloning the `Arc` instead would cost
        // two atomic read-modify-writes per wait.)
        let shared: &Shared = unsafe { &*Arc::as_ptr(&self.shared) };
        let h = shared.header();
        // A `try_` look is no wait: neither idle time nor a pace mark.
        let idle = timed.then(|| {
            Waiting::start(
                &h.consumer_counters.idle_since_ns,
                &h.consumer_counters.idle_ns,
            )
        });
        // A receiving bridge writes what a socket read brought, a segment at a time, as the
        // network delivers it: after a large batch the next one is a network delivery away,
        // and `Block`'s looks would only burn CPU time the bridge and its peers need (as a
        // direct network end reads blocking at once after a large batch).
        let strategy = match (self.wait, pace) {
            (WaitStrategy::Block, park::Pace::Stream) if h.link.fed_by_bridge() => {
                WaitStrategy::Park
            }
            (w, _) => w,
        };
        let got = park::wait_for::<Host, _, _, _>(
            shared.consumer_park(),
            strategy,
            patience,
            park::Notifier::Light,
            pace,
            |look| self.poll_wait::<S>(look),
        );
        drop(idle);
        if timed {
            self.wait_mark = self.cur.map(|c| (c.seg, c.rd));
        }
        got
    }

    /// A direct network end's wait: between looks, the link reads from the socket into the
    /// region (and announces credit) instead of parking.
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    fn wait_link<P: Patience, S: Seen>(&mut self, patience: P) -> Got<Waited<S>, P> {
        let timed = patience.waits();
        let shared = self.shared.clone();
        let h = shared.header();
        let idle = timed.then(|| {
            Waiting::start(
                &h.consumer_counters.idle_since_ns,
                &h.consumer_counters.idle_ns,
            )
        });
        let got = self.wait_link_looks(patience);
        drop(idle);
        if timed {
            self.wait_mark = self.cur.map(|c| (c.seg, c.rd));
        }
        got
    }

    /// [`Consumer::wait_link`] without the idle time and the pace mark.
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    fn wait_link_looks<P: Patience, S: Seen>(&mut self, patience: P) -> Got<Waited<S>, P> {
        let mut looked = false;
        if patience.waits() {
            // The bounded look of the wait strategy, as a local end's: each look reads the
            // socket without waiting (one system call), so that a reply arriving within the
            // look is taken at once rather than through a wake-up of this thread, which
            // costs tens of microseconds when the sender runs on another CPU of a VM. After a
            // large batch (a streaming sender) `Block` reads blocking at once: the next read
            // brings a batch too, so its wake-up is shared by many records, and looks would
            // only burn CPU time the stream's other side needs.
            let pace = self.pace();
            let wait = match (self.wait, pace) {
                (WaitStrategy::Block, park::Pace::Stream) => WaitStrategy::Park,
                (w, _) => w,
            };
            let spun = park::spin_phase::<Host, _, _>(wait, pace, &mut |look| {
                if let Some(w) = self.poll_wait::<S>(look)? {
                    return Ok(Some(w));
                }
                if let Some(l) = &mut self.link {
                    l.fill(Some(Instant::now()));
                }
                self.poll_wait::<S>(Look::Quick)
            })?;
            if let Some(w) = spun {
                return Ok(w);
            }
        }
        loop {
            if let Some(w) = self.poll_wait::<S>(Look::IfDue)? {
                return Ok(w);
            }
            let until = if let Some(e) = patience.immediate() {
                // A `try_` call: one look at what arrived already.
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
                l.fill(until);
            }
        }
    }

    /// What a waiting reader looks at: a frame (or a pending priority event, if `S` takes
    /// them), the end of the stream, or the producer's death once nothing it committed is
    /// left. `None`: nothing yet.
    fn poll_wait<S: Seen>(&mut self, look: Look) -> Result<Option<Waited<S>>, RecvError> {
        if let Some(seen) = S::TAKE.filter(|_| self.prio_pending()) {
            return Ok(Some(Waited::Priority(seen)));
        }
        if S::SKIP {
            // (Each pop wakes a producer waiting for room in the lane.)
            while self.pop_priority().map_err(RecvError::Corrupt)?.is_some() {}
        }
        if let Some(f) = self.poll_frame()? {
            return Ok(Some(Waited::Frame(f)));
        }
        if self.producer_detached() {
            // Everything sealed before the detach is visible now: look once more.
            return Ok(Some(match self.poll_frame()? {
                Some(f) => Waited::Frame(f),
                None => Waited::End,
            }));
        }
        if let Some(l) = &mut self.liveness {
            if let Err(e) = l.check(self.shared.header(), &self.shared.name, look) {
                // Drain first: whatever it committed before dying is delivered.
                return match self.poll_frame()? {
                    Some(f) => Ok(Some(Waited::Frame(f))),
                    None => Err(e.into()),
                };
            }
        }
        Ok(None)
    }

    /// How the last batch looked: `Stream` if the reader moved on by at least
    /// `STREAM_BYTES`, or to another segment, since its last wait.
    fn pace(&self) -> park::Pace {
        match (self.cur, self.wait_mark) {
            (Some(c), Some((seg, rd))) if c.seg == seg && c.rd < rd + STREAM_BYTES => {
                park::Pace::Sparse
            }
            _ => park::Pace::Stream,
        }
    }

    /// Turns the per-record counters (records and bytes read) on or off; segment counts and
    /// idle time are always kept.
    pub fn set_metrics(&mut self, on: bool) {
        self.metrics = on;
    }

    /// The channel's counters now (both sides', as the region shows them). Record and byte
    /// counts are published in batches: the producer's every 64 records (under per-record
    /// policies) and at flushes and segment ends, the consumer's every 16 records, after each `drain`, and
    /// whenever it finds nothing to read. Records written are shown as at least records read.
    pub fn metrics(&self) -> crate::endpoint::metrics::Snapshot {
        self.publish_counts();
        crate::endpoint::metrics::snapshot(&self.shared)
    }

    #[inline]
    fn count_record(&mut self, len: u64) {
        if !self.metrics {
            return;
        }
        self.counters.records.bump(1);
        self.counters.bytes.bump(len);
        // Published every 16 records, and whenever the consumer moves to another segment or
        // finds nothing to read: two shared stores per record cost 10–15 % at 100 M records/s.
        if self.counters.records.0 % 16 == 0 {
            self.publish_counts();
        }
    }

    /// Publishes the per-record counters.
    fn publish_counts(&self) {
        let h = self.shared.header();
        self.counters.records.publish(&h.consumer_counters.records);
        self.counters.bytes.publish(&h.consumer_counters.bytes);
    }

    /// Moves past the rest of a spanning record that was dropped unread.
    fn skip_rest<P: Patience>(&mut self, patience: P) -> Got<(), P> {
        while self.skipping {
            let f = match self.wait_frame::<P, Infallible>(patience)? {
                Waited::Frame(f) => f,
                Waited::End => {
                    self.skipping = false;
                    self.in_span = false;
                    return Ok(());
                }
                Waited::Priority(never) => match never {},
            };
            self.advance(f);
            if f.kind != frame::MIDDLE {
                self.skipping = false;
                self.in_span = false;
            }
        }
        Ok(())
    }

    /// Fast path (almost every record): a whole-record frame already committed in the segment
    /// in hand. Anything else — a span, the end of the segment, or a header that does not
    /// check out — goes through `poll_frame`, which validates it fully and names the error.
    #[inline]
    fn fast_whole(&mut self) -> Option<(usize, *const u8)> {
        if self.skipping || self.in_span {
            return None;
        }
        self.fast_whole_inner()
    }

    /// [`Consumer::fast_whole`] for a caller that knows it is neither in a span nor skipping.
    #[inline(always)]
    fn fast_whole_inner(&mut self) -> Option<(usize, *const u8)> {
        let (seg_size, max) = (self.seg_size, self.fast_max);
        let c = self.cur.as_mut()?;
        let at = c.rd;
        if at + HEADER > seg_size {
            return None;
        }
        // SAFETY: `base` is the segment's start (cached at pop), `at + 8 <= segment_size`
        // (checked above), `at` 8-aligned (a frame boundary). Acquire: as in `poll_frame`.
        let word = frame::load(unsafe { self.shared.word_in(c.base, c.seg, at) });
        let (len, kind) = frame::decode(word);
        let len = len as usize;
        // (No overflow: `at + 8 <= segment_size` was checked above.)
        if kind != frame::WHOLE || len > seg_size - at - HEADER || len > max {
            return None;
        }
        c.rd = frame::next_frame(at, len);
        prefetch_ahead(c, seg_size);
        // SAFETY: `at + 8 + len <= segment_size` (checked above).
        Some((len, unsafe { c.base.add(at + HEADER) }))
    }

    /// A record within the segment in hand, at `at`.
    fn single(&self, at: usize, len: usize) -> RecordKind {
        let c = self.cur.as_ref().expect("a segment in hand");
        RecordKind::Single {
            len,
            // SAFETY: `at + len <= segment_size` (validated by `parse`).
            ptr: unsafe { c.base.add(at) },
        }
    }

    /// The receiving core. Generic over the caller's error `E`, so that the fast path (almost
    /// every record) builds the caller's own result, with no conversion on its way.
    #[inline]
    fn recv_inner<P: Patience, E: From<Halt<P::Expired, RecvError>>>(
        &mut self,
        patience: P,
    ) -> Result<Option<Record<'_>>, E> {
        // (`RecvAsync::poll` has the same fast path: keep them alike.)
        if let Some((len, ptr)) = self.fast_whole() {
            self.count_record(len as u64);
            return Ok(Some(Record::single(self, ptr, len)));
        }
        self.recv_slow(patience).map_err(E::from)
    }

    #[inline(never)]
    fn recv_slow<P: Patience>(&mut self, patience: P) -> Got<Option<Record<'_>>, P> {
        match self.next_slow::<P, Skip>(patience)? {
            Next::Record(kind) => Ok(Some(Record::new(self, kind))),
            Next::End => Ok(None),
            Next::Event { seen, .. } | Next::Priority(seen) => match seen {},
        }
    }

    /// The next record or (if `S` takes them) event, waiting as `patience` allows. Events are
    /// skipped otherwise (and the priority lane drained), so that a plain `recv` never stalls
    /// a producer that sends them.
    fn next_slow<P: Patience, S: Seen>(&mut self, patience: P) -> Got<Next<S>, P> {
        loop {
            // Skipping the rest of a record never stops at a priority event.
            if self.skipping {
                self.skip_rest(patience)?;
            }
            if S::TAKE.is_none() {
                while self.pop_priority()?.is_some() {}
            }
            let f = match self.wait_frame::<P, S>(patience)? {
                Waited::Frame(f) => f,
                Waited::Priority(seen) => return Ok(Next::Priority(seen)),
                Waited::End => {
                    return match self.producer_end() {
                        Some(e) => Err(RecvError::from(e).into()),
                        None => {
                            self.ended = true;
                            Ok(Next::End)
                        }
                    }
                }
            };
            self.advance(f);
            match f.kind {
                frame::EVENT => match S::TAKE {
                    Some(seen) => {
                        return Ok(Next::Event {
                            at: f.at + HEADER,
                            len: f.len,
                            seen,
                        })
                    }
                    None => continue,
                },
                frame::WHOLE if f.len as u64 > self.max_record_len => {
                    // Over the reader's limit: skipped (the consumer has moved past it).
                    return Err(self.too_large(f.len as u64).into());
                }
                frame::WHOLE => {
                    self.count_record(f.len as u64);
                    return Ok(Next::Record(self.single(f.at + HEADER, f.len)));
                }
                _ => {
                    debug_assert_eq!(f.kind, frame::FIRST);
                    self.in_span = true;
                    if f.len as u64 > self.max_record_len {
                        self.skipping = true;
                        return Err(self.too_large(f.len as u64).into());
                    }
                    return Ok(Next::Record(RecordKind::Span(Span {
                        next: Some((f.at + HEADER, f.len)),
                        ended: false,
                        total: f.len as u64,
                    })));
                }
            }
        }
    }

    #[inline]
    fn prio_pending(&self) -> bool {
        crate::protocol::lane::lane_pending(self.shared.header(), self.prio_head)
    }

    /// Reads the next priority event into `prio_buf`: `(kind, len)`.
    fn pop_priority(
        &mut self,
    ) -> Result<Option<(crate::protocol::lane::Entry, usize)>, Box<CorruptError>> {
        let h = self.shared.header();
        let got = crate::protocol::lane::lane_pop(
            h,
            self.prio_head,
            &mut self.prio_buf,
            &self.shared.name,
        )?;
        if got.is_some() {
            self.prio_head += 1;
            // The producer may wait for room in the lane.
            park::notify::<Host>(&h.producer_park, self.shared.producer_bell());
        }
        Ok(got)
    }

    /// The priority event or barrier announcement at the lane's head, which `prio_pending`
    /// said is there.
    pub(crate) fn lane_message(&mut self) -> Result<Message<'_>, Box<CorruptError>> {
        match self.pop_priority()? {
            Some((e, len)) if e.barrier => {
                Ok(Message::Barrier(self.barrier(&self.prio_buf[..len], true)?))
            }
            Some((e, len)) => Ok(Message::Event(Event {
                kind: e.kind,
                payload: &self.prio_buf[..len],
                priority: true,
            })),
            // Only a producer that moves its tail back makes a pending event vanish.
            None => Err(self.corrupt(
                "priority lane tail",
                "a tail that never moves back".into(),
                crate::protocol::lane::lane_tail(self.shared.header()),
            )),
        }
    }

    /// A barrier's body (past the kind word), checked.
    fn barrier<'b>(
        &self,
        body: &'b [u8],
        priority: bool,
    ) -> Result<Barrier<'b>, Box<CorruptError>> {
        match barrier::Head::decode(body) {
            Some((h, payload)) => Ok(Barrier {
                id: h.id,
                emitted_ns: h.emitted_ns,
                alignment: Alignment::from_wire(h.timeout_ns),
                payload,
                priority,
            }),
            None => Err(self.corrupt(
                "barrier length",
                format!("at least {} bytes", barrier::HEAD),
                body.len() as u64,
            )),
        }
    }

    #[inline]
    fn message_inner<P: Patience>(&mut self, patience: P) -> Got<Option<Message<'_>>, P> {
        let next = if self.prio_pending() {
            Next::Priority(())
        } else if let Some((len, ptr)) = self.fast_whole() {
            self.count_record(len as u64);
            Next::Record(RecordKind::Single { len, ptr })
        } else {
            self.next_slow::<P, ()>(patience)?
        };
        Ok(match next {
            Next::Record(kind) => Some(Message::Record(Record::new(self, kind))),
            Next::Event { at, len, .. } => {
                let bytes = self.view(at, len);
                let word = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
                match barrier::kind_word(word) {
                    barrier::KindWord::Event(kind) => Some(Message::Event(Event {
                        kind,
                        payload: &bytes[8..],
                        priority: false,
                    })),
                    barrier::KindWord::Barrier => {
                        Some(Message::Barrier(self.barrier(&bytes[8..], false)?))
                    }
                    barrier::KindWord::Bad => {
                        return Err(self
                            .corrupt(
                                "event kind word",
                                "a kind in the low half and 0 (an event) or the barrier tag \
                                 in the high half"
                                    .into(),
                                word,
                            )
                            .into())
                    }
                }
            }
            Next::Priority(()) => Some(self.lane_message()?),
            Next::End => None,
        })
    }

    /// Receives the next record or event (see [`Event`] for the order), blocking.
    /// `Ok(None)` is end of stream, as for [`Consumer::recv`].
    ///
    /// # Errors
    /// As [`Consumer::recv`].
    pub fn recv_message(&mut self) -> Result<Option<Message<'_>>, RecvError> {
        self.message_inner(Forever).map_err(Into::into)
    }

    /// As [`Consumer::recv_message`], or [`TryRecvError::Empty`] if nothing is there.
    pub fn try_recv_message(&mut self) -> Result<Option<Message<'_>>, TryRecvError> {
        self.message_inner(Immediately).map_err(Into::into)
    }

    /// As [`Consumer::recv_message`], waiting at most `timeout`
    /// ([`RecvTimeoutError::Timeout`]).
    pub fn recv_message_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<Message<'_>>, RecvTimeoutError> {
        self.message_inner(Until::after(timeout))
            .map_err(Into::into)
    }

    /// As [`Consumer::recv_message`], waiting until `deadline` at most.
    pub fn recv_message_deadline(
        &mut self,
        deadline: Instant,
    ) -> Result<Option<Message<'_>>, RecvTimeoutError> {
        self.message_inner(Until::at(deadline)).map_err(Into::into)
    }

    fn too_large(&self, len: u64) -> Box<RecordTooLargeError> {
        too_large(&self.shared.name, "a record", len, self.max_record_len)
    }

    // Every receiving operation has one core (`recv_inner`, `message_inner`) that takes its
    // patience as a type; the blocking, `try_`, `_timeout` and `_deadline` forms are
    // one-line wrappers that pick it (`Forever`, `Immediately`, `Until`), and the error type
    // follows from it.

    /// Receives the next record, blocking until one is committed. `Ok(None)` is end of
    /// stream: the producer detached and every record it committed has been read.
    ///
    /// # Errors
    /// [`RecvError::PeerDead`] once the producer died and everything it committed was read;
    /// [`RecvError::Corrupt`] if it broke the protocol; [`RecvError::RecordTooLarge`] for a
    /// spanning record over [`Consumer::set_max_record_len`] (the record is skipped).
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// for i in 0..3u64 {
    ///     tx.send_pod(&i)?;
    /// }
    /// drop(tx); // ends the stream
    /// let mut sum = 0;
    /// while let Some(r) = rx.recv()? {
    ///     sum += r.as_pod::<u64>().copied().unwrap_or(0);
    /// }
    /// assert_eq!(sum, 3);
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    #[inline]
    pub fn recv(&mut self) -> Result<Option<Record<'_>>, RecvError> {
        self.recv_inner(Forever)
    }

    /// Receives the next record if one is committed, else [`TryRecvError::Empty`].
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::TryRecvError;
    ///
    /// let (_tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`TryRecvError::Empty`] if nothing is committed yet; otherwise as [`Consumer::recv`].
    #[inline]
    pub fn try_recv(&mut self) -> Result<Option<Record<'_>>, TryRecvError> {
        self.recv_inner(Immediately)
    }

    /// Receives the next record, waiting at most `timeout` ([`RecvTimeoutError::Timeout`]).
    ///
    /// # Errors
    /// [`RecvTimeoutError::Timeout`] if nothing arrives in time; otherwise as
    /// [`Consumer::recv`].
    pub fn recv_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<Record<'_>>, RecvTimeoutError> {
        self.recv_inner(Until::after(timeout))
    }

    /// Receives the next record, waiting until `deadline` at most.
    ///
    /// # Errors
    /// [`RecvTimeoutError::Timeout`] if nothing arrives by `deadline`; otherwise as
    /// [`Consumer::recv`].
    pub fn recv_deadline(
        &mut self,
        deadline: Instant,
    ) -> Result<Option<Record<'_>>, RecvTimeoutError> {
        self.recv_inner(Until::at(deadline))
    }

    /// Hands the records that are available (at most `max`) to `f`, waiting for the first
    /// one if none is there; returns how many. 0 means the stream has ended (or `max` is 0).
    /// Stops early at end of stream or when `f` fails, with `f`'s error. Each record is built
    /// in place for `f`, never moved through a `Result`, so its speed does not depend on how
    /// the caller's loop compiles.
    ///
    /// # Errors
    /// `f`'s error, or what [`Consumer::recv`] would return (converted with
    /// `From<RecvError>`).
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// for _ in 0..100 {
    ///     tx.send(b"x")?;
    /// }
    /// drop(tx);
    /// let mut bytes = 0;
    /// loop {
    ///     let n = rx.drain(usize::MAX, |r| {
    ///         bytes += r.len().unwrap_or(0);
    ///         Ok::<_, shmflow::Error>(())
    ///     })?;
    ///     if n == 0 {
    ///         break; // the end of the stream
    ///     }
    /// }
    /// assert_eq!(bytes, 100);
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn drain<F, E>(&mut self, max: usize, f: F) -> Result<usize, E>
    where
        F: FnMut(Record<'_>) -> Result<(), E>,
        E: From<RecvError>,
    {
        self.drain_core(max, f, Forever)
    }

    /// As [`Consumer::drain`], waiting at most `timeout` for the first record; 0 when
    /// nothing came in time or the stream has ended ([`is_ended`](Consumer::is_ended) tells
    /// them apart).
    ///
    /// # Errors
    /// As [`Consumer::drain`].
    pub fn drain_timeout<F, E>(&mut self, max: usize, timeout: Duration, f: F) -> Result<usize, E>
    where
        F: FnMut(Record<'_>) -> Result<(), E>,
        E: From<RecvError>,
    {
        self.drain_core(max, f, Until::after(timeout))
    }

    /// As [`Consumer::drain_timeout`], waiting until `deadline` at most.
    ///
    /// # Errors
    /// As [`Consumer::drain`].
    pub fn drain_deadline<F, E>(&mut self, max: usize, deadline: Instant, f: F) -> Result<usize, E>
    where
        F: FnMut(Record<'_>) -> Result<(), E>,
        E: From<RecvError>,
    {
        self.drain_core(max, f, Until::at(deadline))
    }

    /// The waiting forms' core: the records there now, else one as `patience` allows and
    /// then the rest of those there.
    fn drain_core<F, E, P: Patience>(
        &mut self,
        max: usize,
        mut f: F,
        patience: P,
    ) -> Result<usize, E>
    where
        F: FnMut(Record<'_>) -> Result<(), E>,
        E: From<RecvError>,
    {
        let n = self.try_drain(max, &mut f)?;
        if n > 0 || max == 0 {
            return Ok(n);
        }
        match self.recv_inner::<_, Halt<_, _>>(patience) {
            Ok(Some(r)) => f(r)?,
            Ok(None) | Err(Halt::Expired(_)) => return Ok(0),
            Err(Halt::Failed(e)) => return Err(E::from(e)),
        }
        Ok(1 + self.try_drain(max - 1, &mut f)?)
    }

    /// Hands every record that is available now (at most `max`) to `f`, without waiting;
    /// returns how many. Stops early at end of stream or when `f` fails, with `f`'s error.
    /// A count of 0 means nothing was there yet or the stream has ended:
    /// [`is_ended`](Consumer::is_ended) tells them apart.
    ///
    /// # Errors
    /// `f`'s error, or what `try_recv` would return other than `Empty` (converted with
    /// `From<RecvError>`).
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// for _ in 0..100 {
    ///     tx.send(b"x")?;
    /// }
    /// tx.flush()?;
    /// let mut bytes = 0;
    /// let n = rx.try_drain(usize::MAX, |r| {
    ///     bytes += r.len().unwrap_or(0);
    ///     Ok::<_, shmflow::Error>(())
    /// })?;
    /// assert_eq!((n, bytes), (100, 100));
    /// assert_eq!(rx.try_drain(usize::MAX, |_| Ok::<_, shmflow::Error>(()))?, 0); // none now
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn try_drain<F, E>(&mut self, max: usize, mut f: F) -> Result<usize, E>
    where
        F: FnMut(Record<'_>) -> Result<(), E>,
        E: From<RecvError>,
    {
        let mut n = 0;
        while n < max {
            if !self.skipping && !self.in_span {
                // Whole records in the segment in hand: nothing in this loop can start a span
                // or a skip, so the flags are tested once, and the counts are kept in locals
                // and added once.
                let (mut k, mut bytes) = (0u64, 0u64);
                let mut failed = None;
                while n < max {
                    let Some((len, ptr)) = self.fast_whole_inner() else {
                        break;
                    };
                    k += 1;
                    bytes += len as u64;
                    n += 1;
                    if let Err(e) = f(Record::single(self, ptr, len)) {
                        failed = Some(e);
                        break;
                    }
                }
                if self.metrics && k > 0 {
                    self.counters.records.bump(k);
                    self.counters.bytes.bump(bytes);
                    self.publish_counts();
                }
                if let Some(e) = failed {
                    return Err(e);
                }
                if n >= max {
                    break;
                }
            }
            match self.recv_inner::<_, Halt<_, _>>(Immediately) {
                Ok(Some(r)) => {
                    f(r)?;
                    n += 1;
                }
                Ok(None) | Err(Halt::Expired(_)) => break,
                Err(Halt::Failed(e)) => return Err(E::from(e)),
            }
        }
        Ok(n)
    }

    /// Detaches: the producer's next blocking call returns [`SendError::Closed`](crate::SendError::Closed). Dropping the
    /// consumer does the same.
    pub fn close(self) {}

    /// True once the producer has detached (records may still be waiting to be read).
    pub fn is_closed(&self) -> bool {
        self.producer_detached()
    }

    /// True once this consumer has reached the end of the stream: it has read every record
    /// and the producer has detached cleanly, as `recv` returning `Ok(None)` or
    /// [`try_drain`](Consumer::try_drain) stopping there says. Unlike [`is_closed`](Consumer::is_closed),
    /// it is never true while records remain; a producer that failed or died ends the stream
    /// with an error instead, and this stays false.
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// tx.send(b"one")?;
    /// tx.flush()?;
    /// assert_eq!(rx.try_drain(usize::MAX, |_| Ok::<_, shmflow::Error>(()))?, 1);
    /// assert_eq!(rx.try_drain(usize::MAX, |_| Ok::<_, shmflow::Error>(()))?, 0);
    /// assert!(!rx.is_ended()); // nothing yet: the producer is still there
    /// drop(tx);
    /// assert_eq!(rx.try_drain(usize::MAX, |_| Ok::<_, shmflow::Error>(()))?, 0);
    /// assert!(rx.is_ended()); // the end of the stream
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// Tells the loom byte tracker that `len` bytes at `at` of the segment in hand are read.
    #[cfg(shmflow_loom)]
    #[inline(always)]
    fn track(&self, at: usize, len: usize) {
        if let Some(c) = &self.cur {
            self.shared.tracker.read(c.seg as usize, at, len);
        }
    }

    /// View of `len` bytes at `at` in the segment in hand.
    #[inline]
    fn view(&self, at: usize, len: usize) -> &[u8] {
        let c = self
            .cur
            .as_ref()
            .expect("a record's segment is in hand while the record lives");
        debug_assert!(at + len <= self.seg_size);
        self.shared.tracker.read(c.seg as usize, at, len);
        // SAFETY: `at + len <= segment_size` (validated in `parse`), the segment
        // is in our hand and is not returned while the borrow lives (returning needs `&mut`).
        // A hostile producer could still change the bytes under us: the slice is then garbled
        // but stays inside the mapping.
        unsafe { std::slice::from_raw_parts(c.base.add(at), len) }
    }
}

/// Polls of a waiting consumer before it reads the clock to account idle time.
#[cfg(not(shmflow_loom))]
const FAST_POLLS: u32 = 8;

/// Read this far or farther since the last wait, the writer is taken to be streaming (see
/// `Consumer::pace`): about 14 records of 64 bytes, or one record of a few kilobytes.
const STREAM_BYTES: usize = 1024;

/// How far ahead of the read position the consumer prefetches.
const PREFETCH_AHEAD: usize = 1024;

/// Asks for the line `PREFETCH_AHEAD` bytes ahead, if in the segment. Without it, finding the
/// next frame waits for this frame's header (its length says where the next one starts), so
/// each record would pay a whole cross-core cache miss in turn; with it, the misses overlap.
#[inline(always)]
fn prefetch_ahead(c: &ReadSeg, seg_size: usize) {
    #[cfg(all(target_arch = "x86_64", not(shmflow_loom)))]
    {
        let ahead = c.rd + PREFETCH_AHEAD;
        if c.complete && ahead < seg_size {
            // SAFETY: `ahead < segment_size`: inside the segment in hand. A
            // prefetch never faults and changes no state anyone can see.
            unsafe {
                std::arch::x86_64::_mm_prefetch(
                    c.base.add(ahead) as *const i8,
                    std::arch::x86_64::_MM_HINT_T0,
                )
            };
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(shmflow_loom))))]
    let _ = (c.complete, seg_size, PREFETCH_AHEAD);
}

// SAFETY: the only non-Send field is the cached segment pointer, which points into the mapping
// kept alive by `shared` (an `Arc` of a Send + Sync region); moving the consumer to another
// thread moves the pointer with the Arc that keeps it valid.
unsafe impl Send for Consumer {}

impl Drop for Consumer {
    fn drop(&mut self) {
        // Under loom a failed model unwinds through here; more loom operations would abort.
        #[cfg(shmflow_loom)]
        if std::thread::panicking() {
            return;
        }
        self.publish_counts();
        let h = self.shared.header();
        // Our last reads of the region happen before the producer sees us gone.
        h.consumer.leave(self.detach_as);
        park::notify::<Host>(&h.producer_park, self.shared.producer_bell());
        // The only reader leaves: a named channel's name goes (see `region::name`).
        #[cfg(not(shmflow_loom))]
        crate::region::name::settle(
            &self.shared,
            End::Consumer,
            crate::region::name::Left::Nothing,
        );
    }
}

// SAFETY: `ptr` points into the segment the borrowed consumer holds, in the mapping that the
// consumer's `Arc<Shared>` keeps alive; the record is only read through `&self`/`&mut self`,
// and the consumer it borrows mutably is `Send`. Moving the record (with that borrow) to
// another thread is moving the consumer, as a task that awaits while holding one does.
unsafe impl Send for Record<'_> {}

#[cfg(shmflow_loom)]
impl Consumer {
    /// The segment in the consumer's hand (for the loom census).
    pub fn held_segment(&self) -> Option<u32> {
        self.cur.map(|c| c.seg)
    }
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("region", &self.shared.name)
            .field("geometry", &self.shared.geometry)
            .field("wait", &self.wait)
            .field("max_record_len", &self.max_record_len)
            .field("segment_in_hand", &self.cur.map(|c| c.seg))
            .finish_non_exhaustive()
    }
}
