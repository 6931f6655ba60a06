//! The layout of a gate region: one consumer, `M` channels, each with its own producer.
//!
//! ```text
//! | gate header (4 KiB): identity, geometry, consumer state, the gate's park word, pool figures |
//! | channel 0: header (4 KiB, as a single channel's) | data ring | return ring  (E + F slots each) |
//! | channel 1: ...                                                                                |
//! | segments 0 .. T-1, T = M × E + F: channel c owns [c×E, c×E + E); floating are [M×E, T)      |
//! ```
//!
//! Every ring still has one writer: a channel's return ring is written only by the consumer,
//! which is the sole owner of the floating pool (it lends a floating segment by pushing it into
//! that channel's return ring, and takes it back when it comes out of the data ring). A ring
//! holds `E + F` slots, the most segments one channel can ever own.

use crate::error::ConfigError;
use crate::layout::{EndState, Padded, HEADER_SIZE};
use crate::sync::{AtomicU32, AtomicU64, FutexWord};

/// First 8 bytes of a gate region ("SHMGATE" + 0x01): a single-channel open of a gate is
/// `BadMagic`, and the other way round.
pub const GATE_MAGIC: u64 = u64::from_le_bytes(*b"SHMGATE\x01");
/// Default exclusive segments per channel (Flink's `buffers-per-channel`).
pub const DEFAULT_EXCLUSIVE: u32 = 2;
/// Default floating segments per gate (Flink's `floating-buffers-per-gate`).
pub const DEFAULT_FLOATING: u32 = 8;
/// Most channels in one gate (each producer's liveness lock takes one byte of the object).
pub const MAX_CHANNELS: u32 = 1024;

/// Figures the consumer publishes about the gate as a whole (for `shmflow stat`).
#[repr(C)]
#[derive(Default)]
pub(crate) struct GateFigures {
    /// Floating segments in the pool, lent to nobody.
    pub floating_free: AtomicU64,
    /// Nanoseconds the gate spent waiting for any channel.
    pub idle_ns: AtomicU64,
    /// When the current wait started (0 if not waiting).
    pub idle_since_ns: AtomicU64,
}

/// The gate header page.
#[repr(C)]
#[derive(Default)]
pub(crate) struct GateHeader {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub header_size: AtomicU32,
    pub channels: AtomicU32,
    pub exclusive: AtomicU32,
    pub floating: AtomicU32,
    pub segment_size: AtomicU32,
    pub total_size: AtomicU64,
    pub creator_pid: AtomicU32,
    pub _reserved: AtomicU32,
    /// The gate's consumer (each channel header repeats it, for that channel's producer).
    pub consumer: Padded<EndState>,
    /// Non-zero while the consumer is (about to be) asleep waiting for any channel. Every
    /// channel's producer wakes this one word.
    pub park: Padded<FutexWord>,
    pub pool: Padded<GateFigures>,
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<GateHeader>() <= HEADER_SIZE);

/// The shape of a gate: how many channels, how many segments each owns, how many float.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateGeometry {
    /// Channels (one producer each), 1 ..= [`MAX_CHANNELS`].
    pub channels: u32,
    /// Segments each channel owns (default 2, at least 1).
    pub exclusive: u32,
    /// Segments the gate lends to channels with a backlog (default 8).
    pub floating: u32,
    /// Bytes per segment (as for a channel: a multiple of 64, at least 4 KiB).
    pub segment_size: u32,
}

impl GateGeometry {
    /// `channels` channels with the defaults: 2 exclusive each, 8 floating, 32 KiB segments.
    pub fn new(channels: u32) -> GateGeometry {
        GateGeometry {
            channels,
            exclusive: DEFAULT_EXCLUSIVE,
            floating: DEFAULT_FLOATING,
            segment_size: crate::layout::DEFAULT_SEGMENT_SIZE,
        }
    }

    /// Checks the limits; `region` names where the values came from.
    pub fn validate(&self, region: &str) -> Result<(), ConfigError> {
        let bad =
            |field, expected: &str, found: u32| ConfigError::new(region, field, expected, found);
        if !(1..=MAX_CHANNELS).contains(&self.channels) {
            return Err(bad("channels", "between 1 and 1024", self.channels));
        }
        if self.exclusive == 0 {
            return Err(bad("exclusive", "at least 1 segment per channel", 0));
        }
        if (self.exclusive as u64 + self.floating as u64) < 2 {
            return Err(bad(
                "exclusive + floating",
                "at least 2 (a producer needs a second segment while the first is read)",
                self.exclusive + self.floating,
            ));
        }
        let total = self.total_segments();
        if total > crate::layout::MAX_SEGMENT_COUNT as u64 {
            return Err(bad(
                "channels × exclusive + floating",
                "at most 2^20 segments",
                total.min(u32::MAX as u64) as u32,
            ));
        }
        // The segment size has the channel's limits.
        crate::layout::Geometry {
            segment_size: self.segment_size,
            segment_count: 2,
        }
        .validate(region)?;
        if self.segment_size as u64 * total > 1 << 44 {
            return Err(bad(
                "segments × segment_size",
                "at most 16 TiB",
                self.segment_size,
            ));
        }
        Ok(())
    }

    /// All segments: `channels × exclusive + floating`.
    pub fn total_segments(&self) -> u64 {
        self.channels as u64 * self.exclusive as u64 + self.floating as u64
    }

    /// Slots per ring: the most segments one channel can hold.
    pub(crate) fn ring_cap(&self) -> usize {
        (self.exclusive + self.floating) as usize
    }

    fn ring_bytes(&self) -> usize {
        (self.ring_cap() * 8).div_ceil(4096) * 4096
    }

    fn channel_block(&self) -> usize {
        HEADER_SIZE + 2 * self.ring_bytes()
    }

    /// Offset of channel `c`'s header.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn channel_offset(&self, c: u32) -> usize {
        HEADER_SIZE + c as usize * self.channel_block()
    }

    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn data_ring_offset(&self, c: u32) -> usize {
        self.channel_offset(c) + HEADER_SIZE
    }

    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn return_ring_offset(&self, c: u32) -> usize {
        self.data_ring_offset(c) + self.ring_bytes()
    }

    pub(crate) fn segments_offset(&self) -> usize {
        HEADER_SIZE + self.channels as usize * self.channel_block()
    }

    /// Total bytes of a gate region with this geometry.
    pub fn region_size(&self) -> usize {
        self.segments_offset() + self.total_segments() as usize * self.segment_size as usize
    }

    /// Channel `c`'s own segments.
    pub(crate) fn exclusive_range(&self, c: u32) -> std::ops::Range<u32> {
        c * self.exclusive..(c + 1) * self.exclusive
    }

    /// The floating segments.
    pub(crate) fn floating_range(&self) -> std::ops::Range<u32> {
        let first = self.channels * self.exclusive;
        first..first + self.floating
    }
}
