//! # shmflow
//!
//! Serialized records between processes on one machine through shared memory, with Flink-style
//! backpressure. A channel is one shared-memory region holding a pool of fixed-size
//! **segments** and two lock-free rings: the producer frames records into a free segment and
//! hands it to the consumer through the *data ring*; the consumer reads the records in place
//! and hands the segment back through the *return ring*. The producer can only write into a
//! segment that came back, so a slow consumer slows the producer down: nothing is dropped and
//! nothing is buffered without bound.
//!
//! ```no_run
//! use shmflow::{Consumer, Geometry, Producer};
//!
//! # fn main() -> shmflow::Result<()> {
//! // Process A
//! let mut tx = Producer::create("/demo", Geometry::default())?;
//! tx.send(b"hello")?;
//! let mut claim = tx.claim(8)?; // serialize in place
//! claim.copy_from_slice(&42u64.to_le_bytes());
//! claim.commit();
//! tx.flush()?;
//!
//! // Process B
//! let mut rx = Consumer::open("/demo")?;
//! while let Some(record) = rx.recv()? {
//!     println!("{:?}", record.as_bytes());
//! }
//! # Ok(()) }
//! ```
//!
//! # Guide
//!
//! **Making ends.** [`Producer::builder`] and [`Consumer::builder`] take the settings and make
//! an end in every way: `create` a named region (`/name`, mode 0600), `open` one,
//! `open_or_create` (either end may start first), `create_anonymous` (a sealed memfd handed to
//! a child with [`PeerHandle::pass_to`], taken there with `from_env`), `from_fd`. In one
//! process (threads, tests), [`pair`] gives both ends.
//!
//! **Flush policy** ([`FlushPolicy`]): when committed records become visible.
//! `EveryRecord` (the default) publishes each record as it is committed and wakes the consumer
//! at once if it sleeps (an awake consumer costs no system call, and one that falls behind
//! reads what piled up in one go); `Timeout(d)` (Flink's buffer timeout) publishes each record
//! too but lets a flusher thread wake a parked consumer at most once per `d`; `Explicit`
//! publishes on [`Producer::flush`] or a full segment (for readers of whole segments; records
//! after the last flush are lost if the producer dies).
//!
//! **Wait strategy** ([`WaitStrategy`]): how a blocking call waits. `Block` (the default)
//! looks continuously for 2 µs (unless the writer is streaming), then every 5 µs up to 50 µs,
//! then sleeps on a futex in the region; `BusyPoll(d)` spins up to `d` first (lowest latency,
//! one CPU burnt; keep `d` bounded on machines with few cores); `Park` sleeps at once (least
//! CPU). A side is woken only if it announced that it sleeps.
//!
//! **Async** (feature `tokio`): every waiting call has an `_async` form (`Consumer::recv_async`,
//! `Producer::send_async`, `Gate::recv_async`, …) that waits in the executor: the task
//! announces itself on the park word as a thread would, then sleeps in the tokio reactor on
//! the word's doorbell, which travels with an anonymous region (`PeerHandle::pass_to`), or,
//! on a named region, one opened from a bare descriptor, before the peer attached or under
//! another executor, through one thread per process that waits on every announced word with
//! `futex_waitv` and wakes the tasks. A tokio runtime that waits on a doorbell needs its IO and
//! time drivers (`#[tokio::main]` has them; a `Builder` needs `enable_all()`): without them the
//! wait panics, as tokio's own IO types do.
//! Sync and async ends mix on one region; the futures are `Send` and cancellation-safe (a dropped `recv_async` loses no record;
//! a dropped `send_async` sends nothing, or, for a record larger than the channel's own
//! segments, makes the consumer see it aborted).
//!
//! **Records.** A record is any byte sequence. One that fits in a segment never spans and is
//! read in place ([`Record::as_bytes`], [`Record::as_pod`]); a larger one spans segments and is
//! read part by part ([`Record::next_part`], no copy) or whole ([`Record::to_vec`]).
//! [`Consumer::set_max_record_len`] bounds every record. Every waiting call has `try_`,
//! `_timeout` and `_deadline` forms, each with its own error type ([`TryRecvError::Empty`],
//! [`TrySendError::Full`], …); all of them convert into [`Error`].
//!
//! **Events.** [`Producer::send_event`] sends a small typed message in order with the records;
//! [`Producer::send_priority_event`] one that overtakes the records queued before it (Flink's
//! unaligned checkpoint barriers). [`Consumer::recv_message`] receives both; [`Event`] states
//! the order exactly.
//!
//! **Gates and partitions.** A [`Gate`] is one consumer reading many channels, each written by
//! its own producer ([`Producer::open_channel`]), round-robin, with Flink's exclusive segments
//! per channel and floating segments the gate lends to channels that ask (credit-based flow
//! control). A [`Partition`] writes to many channels with Flink's partitioners (round-robin,
//! broadcast, by key).
//!
//! **Ends that go away.** Dropping the producer ends the stream (`Ok(None)` after every
//! committed record); [`Producer::fail`], or a drop while panicking, ends it as failed
//! ([`RecvError::ProducerFailed`]); a peer that dies is reported as `PeerDead` within about
//! 50 ms, and from then on by every call. A consumer that leaves makes the producer's calls
//! fail with [`SendError::Closed`].
//!
//! **Metrics.** Each side keeps counters in the region header, readable live by another
//! process without disturbing the channel ([`monitor::Monitor`], `shmflow stat`): [`Producer::metrics`]
//! and [`Consumer::metrics`] give a [`metrics::Snapshot`]; [`metrics::Snapshot::rates_since`] gives Flink's
//! `backPressuredTimeMsPerSecond`, `idleTimeMsPerSecond`, `busyTimeMsPerSecond`, pool usages
//! and the backpressure level ([`metrics::BackpressureLevel`]: OK < 0.10 ≤ LOW ≤ 0.50 < HIGH). A gate's
//! figures are a [`metrics::GateSnapshot`]. The fixed figures of waiting and fairness are in
//! [`tuning`].
//!
//! **Untrusted peers.** Everything read from shared memory is validated before use; a peer
//! that writes garbage gives a `Corrupt` error, never a panic or an access outside the region.
//! A borrowed payload is a view into shared memory that a hostile peer could rewrite while it
//! is held: copy it out ([`Record::to_vec`]) before trusting it. See `docs/THREAT_MODEL.md`.
//!
//! Invariants the code keeps (and the loom models in `src/loom_models/` check):
//! - every segment is in exactly one place: the return ring, the producer's hand, the data
//!   ring, or the consumer's hand; both rings have capacity N, so a push never fails;
//! - the consumer never reads a byte before the producer's Release store of the frame header
//!   that publishes it (a header is its own commit; a 0 word ends what is published), and the
//!   producer never writes a segment before the consumer's Release push that returned it;
//! - a side parks only after announcing it and re-checking, and the other side wakes it
//!   whenever it has announced: no lost wake-up;
//! - everything read from shared memory is validated before use ([`Error::Corrupt`]).
//!
//! `docs/PROTOCOL.md` names every ordering on both sides; `docs/DESIGN.md` explains the layers.

#![warn(missing_docs)]
// Under `--cfg shmflow_loom` the library exists for its loom models (`cargo test --lib`): what
// only the public surface uses is unused there.
#![cfg_attr(shmflow_loom, allow(dead_code))]

#[cfg(not(target_os = "linux"))]
compile_error!("shmflow needs Linux: it uses futexes on shared memory, memfd seals and OFD locks");

// The layers, lowest first; a module refers only to its own layer and those below
// (`tests/layers.rs` checks it).
mod endpoint;
mod error;
#[cfg(all(feature = "net", not(shmflow_loom)))]
pub mod net;
mod protocol;
mod region;
mod sync;
mod sys;

pub use endpoint::builder::{ConsumerBuilder, GateBuilder, ProducerBuilder};
pub use endpoint::consumer::{Consumer, Message, Record, SegmentHold, DEFAULT_MAX_RECORD_LEN};
pub use endpoint::event::{
    Alignment, Barrier, Event, Released, MAX_BARRIER_PAYLOAD, MAX_EVENT_PAYLOAD,
};
pub use endpoint::gate::{Gate, GateMessage};
pub use endpoint::markers::{LatencyMarker, LatencyMarkers};
pub use endpoint::partition::{KeyFn, Partition, Partitioner};
pub use endpoint::producer::{
    Batch, Claim, DetachedClaim, FlushPolicy, Producer, RecordWriter, StaleClaimError,
};
#[cfg(feature = "tokio")]
pub use endpoint::{consumer::RecvAsync, producer::SendAsync};
pub use error::{
    CloseError, ClosedError, ConfigError, CorruptError, DeadEnd, End, Error, OpenError,
    PeerDeadError, ProducerFailedError, RecordAbortedError, RecordTooLargeError, RecvError,
    RecvTimeoutError, RegionKind, Result, SendError, SendTimeoutError, SysError, TryRecvError,
    TrySendError, WriteError,
};
pub use protocol::abi::{GateGeometry, Geometry, LAYOUT_VERSION};
pub use protocol::park::WaitStrategy;
pub use region::handoff::PeerHandle;

/// Flink's metrics of a channel's ends and of a gate: what [`Producer::metrics`],
/// [`Consumer::metrics`], [`Gate::metrics`] and a [`monitor::Monitor`] give.
///
/// A [`Snapshot`](metrics::Snapshot) is the raw counters of one end at one moment;
/// [`Snapshot::rates_since`](metrics::Snapshot::rates_since) turns two of them into Flink's
/// per-second figures ([`Rates`](metrics::Rates)) and the backpressure level. The structs are
/// `#[non_exhaustive]`: new figures can be added without breaking a caller (build one with
/// `Default::default()` and set its fields, in tests).
pub mod metrics {
    pub use crate::endpoint::gate_stats::{ChannelStats, CheckpointStats, GateSnapshot};
    pub use crate::endpoint::metrics::{
        monotonic_now_ns, BackpressureLevel, EndState, LinkSnapshot, Rates, Snapshot, SourceLatency,
    };
}

/// Looking at channels and gates from outside, without disturbing them: [`Monitor`](monitor::Monitor)
/// and [`GateMonitor`](monitor::GateMonitor) read an object's metrics live (as `shmflow stat`
/// does); [`list_regions`](monitor::list_regions) and [`list_gates`](monitor::list_gates) find
/// them (as `shmflow list`); [`remove_if_stale`](monitor::remove_if_stale) and
/// [`remove_stale_and_unread`](monitor::remove_stale_and_unread) remove what dead processes
/// left behind (as `shmflow clean`).
///
/// Not under `--cfg shmflow_loom`: it reads the regions of other processes, by name, from the
/// system's shared memory, which a loom model has none of.
#[cfg(not(shmflow_loom))]
pub mod monitor {
    pub use crate::endpoint::monitor::{
        list_gates, list_other_objects, list_regions, remove_if_stale, remove_stale_and_unread,
        GateMonitor, Monitor, RegionInfo,
    };
}

/// The fixed figures that shape waiting and fairness, for callers that tune around them: how
/// long [`WaitStrategy::Block`] looks before it parks, and how many records a [`Gate`] takes
/// from one channel before it moves to the next.
pub mod tuning {
    pub use crate::endpoint::gate::QUANTUM;
    pub use crate::protocol::park::{BLOCK_EAGER, BLOCK_GAP, BLOCK_SPIN};
}

/// Both ends of a fresh anonymous channel in this process: for threads, tests and benches.
/// The region is a sealed memfd that disappears with the last end.
///
/// # Examples
///
/// ```
/// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
/// tx.send(b"hello")?;
/// tx.flush()?;
/// assert_eq!(rx.recv()?.unwrap().as_bytes(), Some(&b"hello"[..]));
/// # Ok::<(), shmflow::Error>(())
/// ```
///
/// Under `--cfg shmflow_loom` the region lives on the heap, with loom's atomics, and the ends
/// are for the threads of a loom model (see `docs/LOOM.md`).
///
/// # Errors
/// [`OpenError::InvalidConfig`] for a geometry out of range, [`OpenError::Io`] if the
/// system cannot make or map the region.
pub fn pair(geometry: Geometry) -> Result<(Producer, Consumer), OpenError> {
    let (p, handle) = Producer::create_anonymous(geometry)?;
    let c = Consumer::from_handle(handle)?;
    Ok((p, c))
}

/// The loom models: the library's real ring, producer, consumer and gate over a region on the
/// heap. Only built for tests with `--cfg shmflow_loom`.
#[cfg(all(test, shmflow_loom))]
mod loom_models;

/// The README's examples, compiled and run as doctests (its async example needs the `tokio`
/// feature, so they run with it: `cargo test --all-features`).
#[cfg(all(doctest, feature = "tokio"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
