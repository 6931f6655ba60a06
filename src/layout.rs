//! The region layout: header, rings, segments — and the geometry that places
//! them. Offsets are always computed from a validated geometry, never read from the region.
//!
//! ```text
//! | header (4 KiB): identity, geometry, attach state, cursors, park words, counters |
//! | data ring slots   (N × u64, producer → consumer: segment index)                 |
//! | return ring slots (N × u64, consumer → producer: segment index)                 |
//! | segment 0 | segment 1 | ... | segment N-1   (segment_size bytes each, 4 KiB aligned) |
//! ```
//!
//! There are no commit words: a frame's header is its own commit (see `frame.rs`).

use crate::error::ConfigError;
use crate::metrics::{ConsumerCounters, ProducerCounters};
use crate::sync::{AtomicU32, AtomicU64, FutexWord};

/// First 8 bytes of every shmflow region ("SHMFLOW" + 0x01, little endian).
pub const MAGIC: u64 = u64::from_le_bytes(*b"SHMFLOW\x01");
/// Bumped whenever anything in this file changes meaning or place.
pub const LAYOUT_VERSION: u32 = 3;
/// Bytes reserved for the header page; rings start after it.
pub const HEADER_SIZE: usize = 4096;
/// Default segment size: Flink's network buffer size.
pub const DEFAULT_SEGMENT_SIZE: u32 = 32 * 1024;
/// Default segment count: 64 × 32 KiB = a 2 MiB pool, the size of the L2 cache of the machines
/// this was tuned on; fewer segments make each hand-off relatively more expensive, many more
/// make the pool fall out of cache.
pub const DEFAULT_SEGMENT_COUNT: u32 = 64;
/// Smallest segment: a page. (The loom models use tiny segments to keep the state space small.)
#[cfg(not(loom))]
pub const MIN_SEGMENT_SIZE: u32 = 4096;
/// Smallest segment under loom: tiny, to keep the models' state small.
#[cfg(loom)]
pub const MIN_SEGMENT_SIZE: u32 = 64;
/// Largest segment (frame lengths are 32-bit; 1 GiB keeps every offset well inside).
pub const MAX_SEGMENT_SIZE: u32 = 1 << 30;
/// Largest segment count, to keep a corrupt header from asking for absurd mappings.
pub const MAX_SEGMENT_COUNT: u32 = 1 << 20;

/// Cache-line padding with a C layout (two lines: x86 prefetches pairs). `CachePadded` would
/// do the same in one process, but the layout here is shared between separately built
/// binaries, so it must be `repr(C)`.
#[repr(C, align(128))]
#[derive(Default)]
pub(crate) struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Attach state of one end: `FREE` → `ATTACHED` → `DETACHED`, never back.
pub(crate) const END_FREE: u32 = 0;
pub(crate) const END_ATTACHED: u32 = 1;
pub(crate) const END_DETACHED: u32 = 2;

#[repr(C)]
#[derive(Default)]
pub(crate) struct EndState {
    pub state: AtomicU32,
    pub pid: AtomicU32,
}

/// Cursors written only by the producer (one line, written together when a segment is taken).
#[repr(C)]
#[derive(Default)]
pub(crate) struct ProducerCursors {
    /// Data ring: next slot the producer fills.
    pub data_tail: AtomicU64,
    /// Return ring: next slot the producer takes.
    pub ret_head: AtomicU64,
    /// Gate channels: segments asked for so far (monotonic). The producer adds one each time
    /// it runs out of segments; the gate lends floating segments while `demand > lent`, so
    /// `demand - lent` is the channel's backlog (segments wanted and not yet granted).
    pub demand: AtomicU64,
}

/// Cursors written only by the consumer.
#[repr(C)]
#[derive(Default)]
pub(crate) struct ConsumerCursors {
    /// Data ring: next slot the consumer takes.
    pub data_head: AtomicU64,
    /// Return ring: next slot the consumer fills.
    pub ret_tail: AtomicU64,
    /// Gate channels: floating segments granted to this channel so far (monotonic).
    pub lent: AtomicU64,
    /// Gate channels: floating segments the channel holds now.
    pub floating_held: AtomicU64,
    /// Priority lane: next slot the consumer reads.
    pub prio_head: AtomicU64,
}

/// Bytes of payload a priority event can carry (the rest of its slot is kind and length).
pub const PRIO_PAYLOAD: usize = 31 * 8;
/// Slots in the priority lane.
pub(crate) const PRIO_SLOTS: usize = 4;

/// One priority event: `kind << 32 | len`, then the payload as words.
#[repr(C)]
#[derive(Default)]
pub(crate) struct PrioSlot {
    pub kind_len: AtomicU64,
    pub words: [AtomicU64; PRIO_PAYLOAD / 8],
}

/// The header page. Identity and geometry are written once by the creator, magic last.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Header {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub header_size: AtomicU32,
    pub segment_size: AtomicU32,
    pub segment_count: AtomicU32,
    pub total_size: AtomicU64,
    pub creator_pid: AtomicU32,
    pub _reserved: AtomicU32,
    pub producer: Padded<EndState>,
    pub consumer: Padded<EndState>,
    pub prod: Padded<ProducerCursors>,
    pub cons: Padded<ConsumerCursors>,
    /// Non-zero while the producer is (about to be) asleep waiting for a returned segment.
    pub producer_park: Padded<FutexWord>,
    /// Non-zero while the consumer is (about to be) asleep waiting for data.
    pub consumer_park: Padded<FutexWord>,
    pub producer_counters: Padded<ProducerCounters>,
    pub consumer_counters: Padded<ConsumerCounters>,
    /// Priority lane: next slot the producer fills (its own line, written only by priority
    /// sends, so the consumer's check before each message stays a cache hit).
    pub prio_tail: Padded<AtomicU64>,
    /// Priority events, outside the segments so that they can overtake queued records.
    pub prio: [PrioSlot; PRIO_SLOTS],
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_SIZE);

impl Header {
    pub(crate) fn end(&self, end: crate::End) -> &EndState {
        match end {
            crate::End::Producer => &self.producer,
            crate::End::Consumer => &self.consumer,
        }
    }
}

/// Size and number of segments: everything else in the layout follows from these two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes per segment (a multiple of 64, 4 KiB ..= 1 GiB).
    pub segment_size: u32,
    /// Segments in the pool (2 ..= 2^20).
    pub segment_count: u32,
}

impl Default for Geometry {
    fn default() -> Self {
        Geometry {
            segment_size: DEFAULT_SEGMENT_SIZE,
            segment_count: DEFAULT_SEGMENT_COUNT,
        }
    }
}

const fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

impl Geometry {
    /// Checks the limits; `region` names where the values came from.
    pub fn validate(&self, region: &str) -> Result<(), ConfigError> {
        let bad =
            |field, expected: String, found: u32| ConfigError::new(region, field, expected, found);
        let s = self.segment_size;
        if !(MIN_SEGMENT_SIZE..=MAX_SEGMENT_SIZE).contains(&s) || s % 64 != 0 {
            return Err(bad(
                "segment_size",
                format!("a multiple of 64 between {MIN_SEGMENT_SIZE} and {MAX_SEGMENT_SIZE}"),
                s,
            ));
        }
        let n = self.segment_count;
        if !(2..=MAX_SEGMENT_COUNT).contains(&n) {
            return Err(bad(
                "segment_count",
                format!("between 2 and {MAX_SEGMENT_COUNT}"),
                n,
            ));
        }
        if (s as u64) * (n as u64) > (1u64 << 44) {
            return Err(bad(
                "segment_size × segment_count",
                "at most 16 TiB".into(),
                n,
            ));
        }
        Ok(())
    }

    fn ring_bytes(&self) -> usize {
        align_up(self.segment_count as usize * 8, 4096)
    }

    pub(crate) fn data_ring_offset(&self) -> usize {
        HEADER_SIZE
    }

    pub(crate) fn return_ring_offset(&self) -> usize {
        self.data_ring_offset() + self.ring_bytes()
    }

    pub(crate) fn segments_offset(&self) -> usize {
        self.return_ring_offset() + self.ring_bytes()
    }

    /// Total bytes of a region with this geometry.
    pub fn region_size(&self) -> usize {
        self.segments_offset() + self.segment_count as usize * self.segment_size as usize
    }
}
