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
use crate::protocol::figures;
use crate::protocol::frame::{self, HEADER};
use crate::protocol::park::{self, Forever, Immediately, Look, Patience, Until, WaitStrategy};
use crate::protocol::pool::Supply;
use crate::protocol::ring::{Cursors, RingRx, RingTx};
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
mod markers;
mod writer;
pub use writer::{Batch, Claim, DetachedClaim, RecordWriter, StaleClaimError};

mod attach;
mod frames;
mod handoff;
mod send;
mod waiting;

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
    /// Under `--cfg shmflow_loom` there is no flusher thread (a thread of the system, which
    /// loom does not schedule): the producer wakes the consumer as under `EveryRecord`.
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
    /// This producer's number among the ends of the process (what a detached claim names).
    end_id: u64,
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
    /// The tick of the marker clock at which the next latency marker is due (`u64::MAX`:
    /// markers off), compared with the clock after every record.
    #[cfg(not(shmflow_loom))]
    marker_at: u64,
    /// Latency markers, when on: the label and the interval.
    #[cfg(not(shmflow_loom))]
    markers: Option<Box<crate::endpoint::markers::Schedule>>,
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
            self.shared.header().consumer_end().state(),
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
        let c = self.shared.header().consumer_end();
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
