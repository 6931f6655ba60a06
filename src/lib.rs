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
//! Invariants the code keeps (and the loom models in `loom-tests/` check):
//! - every segment is in exactly one place: the return ring, the producer's hand, the data
//!   ring, or the consumer's hand; both rings have capacity N, so a push never fails;
//! - the consumer never reads a byte before the producer's Release store of the frame header
//!   that publishes it (a header is its own commit; a 0 word ends what is published), and the
//!   producer never writes a segment before the consumer's Release push that returned it;
//! - a side parks only after announcing it and re-checking, and the other side wakes it
//!   whenever it has announced (see `wait.rs`): no lost wake-up;
//! - everything read from shared memory is validated before use ([`Error::Corrupt`]).

#![warn(missing_docs)]

#[cfg(not(target_os = "linux"))]
compile_error!("shmflow needs Linux: it uses futexes on shared memory, memfd seals and OFD locks");

// The layers, lowest first; a module refers only to its own layer and those below
// (`scripts/check-layers.py` checks it in CI).
mod endpoint;
mod error;
mod protocol;
mod region;
mod sync;
mod sys;

#[cfg(not(loom))]
pub use endpoint::builder::{ConsumerBuilder, ProducerBuilder};
pub use endpoint::consumer::{Consumer, Message, Record, DEFAULT_MAX_RECORD_LEN};
pub use endpoint::event::{Event, MAX_EVENT_PAYLOAD};
pub use endpoint::gate::{Gate, GateMessage, QUANTUM};
pub use endpoint::gate_stats::{ChannelStats, GateSnapshot};
pub use endpoint::metrics::{monotonic_now_ns, BackpressureLevel, EndState, Rates, Snapshot};
#[cfg(not(loom))]
pub use endpoint::monitor::{
    list_gates, list_other_objects, list_regions, remove_if_stale, GateMonitor, Monitor, RegionInfo,
};
pub use endpoint::partition::{KeyFn, Partition, Partitioner};
pub use endpoint::producer::{Claim, FlushPolicy, Producer, RecordWriter};
pub use error::{
    ClosedError, ConfigError, CorruptError, End, Error, OpenError, PeerDeadError,
    ProducerFailedError, RecordAbortedError, RecordTooLargeError, RecvError, RecvTimeoutError,
    RegionKind, Result, SendError, SendTimeoutError, SysError, TryRecvError, TrySendError,
    WriteError,
};
pub use protocol::abi::{GateGeometry, Geometry, LAYOUT_VERSION};
pub use protocol::park::WaitStrategy;
#[cfg(not(loom))]
pub use region::handoff::PeerHandle;

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
/// # Errors
/// [`OpenError::InvalidConfig`] for a geometry out of range, [`OpenError::Io`] if the
/// system cannot make or map the region.
#[cfg(not(loom))]
pub fn pair(geometry: Geometry) -> Result<(Producer, Consumer), OpenError> {
    let (p, handle) = Producer::create_anonymous(geometry)?;
    let c = Consumer::from_fd(handle.into_fd())?;
    Ok((p, c))
}

/// Hooks for the loom models in `loom-tests/`: the library's real ring, producer and consumer
/// over a region on the heap. Only built with `--cfg loom`.
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_api;

/// The README's quick start, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
