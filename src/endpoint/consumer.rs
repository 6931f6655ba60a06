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
use crate::protocol::figures;
use crate::protocol::frame::{self, HEADER};
use crate::protocol::park::{self, Forever, Immediately, Look, Patience, Until, WaitStrategy};
use crate::protocol::pool::Recycler;
use crate::protocol::ring::{Cursors, RingRx, RingTx};
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

mod attach;
mod debloating;
mod fast;
mod holds;
pub use holds::SegmentHold;
mod lane;
mod latency;
mod recv;
mod segments;
mod waiting;

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
    /// `max_record_len` as a `u32` (saturating: a frame's length is a `u32`), for the fast
    /// path.
    fast_max: u32,
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
    /// Segments kept out of the pool by [`SegmentHold`]s (few: one per segment that views
    /// of its records still reach).
    holds: holds::Holds,
    /// The state this end leaves in when dropped: `DETACHED`, or `LOST` for a network bridge
    /// that lost its remote peer.
    detach_as: crate::protocol::ends::Leave,
    /// Buffer debloating, when on: sets the producer's segment cap from the rate this end
    /// reads at (see `protocol::debloat`).
    debloat: Option<Debloat>,
    /// Latency markers: the labels of the sources given a slot of the region's table, in slot
    /// order (a channel of its own; a gate counts its channels' markers itself).
    marker_sources: Vec<crate::protocol::latency::Label>,
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
        self.fast_max = u32::try_from(max).unwrap_or(u32::MAX);
    }

    fn producer_detached(&self) -> bool {
        // Acquire (in `state`): pairs with the producer's `leave`, after its last seal.
        matches!(
            self.shared.header().producer_end().state(),
            EndState::Detached | EndState::Failed | EndState::Lost
        )
    }

    /// `Some(ProducerFailed)` if the producer ended the stream as failed (it was dropped while
    /// its thread unwound from a panic), `Some(PeerDead)` if it was a network bridge that lost
    /// its remote peer.
    pub(crate) fn producer_end(&self) -> Option<UncleanEnd> {
        let p = self.shared.header().producer_end();
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
                // A priority event pushed before this frame was committed goes first (see
                // `message_inner`): the frame, not yet moved past, is read by the next call.
                Waited::Frame(_) if S::TAKE.is_some() && self.prio_pending() => {
                    continue;
                }
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
                    // A reader of records counts a latency marker and goes on.
                    None => {
                        self.count_marker_at(f.at + HEADER, f.len);
                        continue;
                    }
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
    prefetch_from(c.base, c.rd, c.complete, seg_size);
}

/// [`prefetch_ahead`] from the segment at `base` read up to `rd`, `complete` as
/// [`ReadSeg::complete`].
#[inline(always)]
fn prefetch_from(base: *const u8, rd: usize, complete: bool, seg_size: usize) {
    #[cfg(all(target_arch = "x86_64", not(shmflow_loom)))]
    {
        let ahead = rd + PREFETCH_AHEAD;
        if complete && ahead < seg_size {
            // SAFETY: `ahead < segment_size`: inside the segment in hand. A
            // prefetch never faults and changes no state anyone can see.
            unsafe {
                std::arch::x86_64::_mm_prefetch(
                    base.add(ahead) as *const i8,
                    std::arch::x86_64::_MM_HINT_T0,
                )
            };
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(shmflow_loom))))]
    let _ = (base, rd, complete, seg_size, PREFETCH_AHEAD);
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
        h.consumer_end().leave(self.detach_as);
        // Broken on purpose (loom only): a producer parked for a segment is not told.
        #[cfg(not(shmflow_broken = "drop_silent"))]
        park::notify::<Host>(h.producer_park(), self.shared.producer_bell());
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
