//! The region layout: header, rings, segments — and the geometry that places
//! them. Offsets are always computed from a validated geometry, never read from the region.
//!
//! ```text
//! | header (4 KiB): identity, geometry, attach state, cursors, park words, counters |
//! | data ring slots   (N × u64, producer → consumer: segment index)                 |
//! | return ring slots (N × u64, consumer → producer: segment index)                 |
//! | segment 0 | segment 1 | ... | segment N-1   (segment_size bytes each, 4 KiB aligned) |
//! | latency table (`protocol::latency`: the ages of latency markers, per source)       |
//! ```
//!
//! There are no commit words: a frame's header is its own commit (see `frame.rs`).

use crate::error::ConfigError;
use crate::sync::{AtomicU32, AtomicU64, FutexWord, Ordering};

/// First 8 bytes of every shmflow region ("SHMFLOW" + 0x01, little endian).
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"SHMFLOW\x01");
/// Bumped whenever anything in this file changes meaning or place.
pub const LAYOUT_VERSION: u32 = 11;
/// Bytes reserved for the header page; rings start after it.
pub(crate) const HEADER_SIZE: usize = 4096;
/// Bytes of a frame's header in a segment, before its payload (see `frame`, which frames
/// records with it).
pub(crate) const FRAME_HEADER: usize = 8;
/// Default segment size: Flink's network buffer size.
const DEFAULT_SEGMENT_SIZE: u32 = 32 * 1024;
/// Default segment count: 64 × 32 KiB = a 2 MiB pool, the size of the L2 cache of the machines
/// this was tuned on; fewer segments make each hand-off relatively more expensive, many more
/// make the pool fall out of cache.
const DEFAULT_SEGMENT_COUNT: u32 = 64;
/// Smallest segment: a page; under `--cfg shmflow_loom`, 64 bytes (eight words: a record's
/// 8-byte header and up to 56 bytes), so that a model's state space stays small.
#[cfg(not(shmflow_loom))]
const MIN_SEGMENT_SIZE: u32 = 4096;
#[cfg(shmflow_loom)]
const MIN_SEGMENT_SIZE: u32 = 64;
/// Under `--cfg shmflow_loom`: the most bytes of segments in one region. loom follows every
/// 8-byte word of a segment as an atomic of its own, so a model stays to a few segments of a
/// few words.
#[cfg(shmflow_loom)]
pub(crate) const LOOM_MAX_POOL: u64 = 4096;
/// Largest segment (frame lengths are 32-bit; 1 GiB keeps every offset well inside).
const MAX_SEGMENT_SIZE: u32 = 1 << 30;
/// Largest segment count, to keep a corrupt header from asking for absurd mappings.
const MAX_SEGMENT_COUNT: u32 = 1 << 20;

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

/// Attach state of one end: `FREE` → `ATTACHED` → `DETACHED`, `FAILED` or `LOST`, never back.
pub(crate) const END_FREE: u32 = 0;
pub(crate) const END_ATTACHED: u32 = 1;
pub(crate) const END_DETACHED: u32 = 2;
/// Detached while its thread was unwinding from a panic: everything it committed before is
/// delivered, then the stream ends as failed rather than cleanly (layout version 4).
pub(crate) const END_FAILED: u32 = 3;
/// Detached by a network bridge whose remote peer was lost (connection broken, peer dead or
/// silent): everything received before is delivered, then the peer is reported dead
/// (layout version 6).
pub(crate) const END_LOST: u32 = 4;

#[repr(C)]
#[derive(Default)]
pub(crate) struct EndSlot {
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
    /// Segments the consumer has finished reading (monotonic; into the return ring or back to
    /// the gate). With `segment_cap`, the producer's in-flight count is the segments it took
    /// less these.
    pub segments_done: AtomicU64,
    /// Buffer debloating: the most segments the producer may have in flight (taken and not
    /// yet finished by the consumer) before a record may start a new one; 0 when off. The
    /// consumer derives it from the rate at which it reads (`protocol::debloat`).
    pub segment_cap: AtomicU64,
    /// Buffer debloating: the bytes of a segment past which the producer starts no record
    /// (it seals the segment and takes the next); 0 or the segment size for the whole segment.
    pub segment_fill: AtomicU64,
}

/// Producer-side counters (one padded block, written only by the producer).
#[repr(C)]
#[derive(Default)]
pub(crate) struct ProducerCounters {
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    pub segments_committed: AtomicU64,
    pub wakes: AtomicU64,
    /// Nanoseconds spent blocked waiting for a free segment (backpressure).
    pub backpressured_ns: AtomicU64,
    /// Monotonic-clock nanoseconds when the current wait began, 0 when not waiting: lets a
    /// reader count a wait that is still going on.
    pub blocked_since_ns: AtomicU64,
    /// Wake-ups issued by the buffer-timeout flusher thread (its own line of writes).
    pub flusher_wakes: AtomicU64,
    /// Segments the producer has taken from the return ring.
    pub segments_acquired: AtomicU64,
}

/// Consumer-side counters.
#[repr(C)]
#[derive(Default)]
pub(crate) struct ConsumerCounters {
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    pub segments_returned: AtomicU64,
    pub wakes: AtomicU64,
    /// Nanoseconds spent waiting for data.
    pub idle_ns: AtomicU64,
    pub idle_since_ns: AtomicU64,
    /// Segments the consumer has taken from the data ring.
    pub segments_taken: AtomicU64,
    /// Of a gate's channel: records and payload bytes handed out as a checkpoint's in-flight
    /// data (overtaken by an unaligned barrier), in all.
    pub inflight_records: AtomicU64,
    pub inflight_bytes: AtomicU64,
    /// Of a gate's channel: records and payload bytes its producer had sent beyond what was
    /// read when the last checkpoint held it and was released (0 if not held then).
    pub held_records: AtomicU64,
    pub held_bytes: AtomicU64,
    /// Of a gate's channel, for the last released checkpoint: how long it was held (its
    /// barrier's arrival to the release), and its barrier's delay (sent to released); 0 if its
    /// barrier had not arrived.
    pub held_ns: AtomicU64,
    pub barrier_delay_ns: AtomicU64,
    /// Buffer debloating (0 when off): the target time to read what is in flight, and the
    /// rate the consumer reads at while busy (bytes per second, smoothed), which set
    /// `ConsumerCursors::segment_cap`.
    pub debloat_target_ns: AtomicU64,
    pub debloat_rate: AtomicU64,
}

/// `LinkFigures::role`: the consumer end is a sending bridge.
pub(crate) const LINK_SENDING: u64 = 1;
/// `LinkFigures::role`: the producer end is a receiving bridge.
pub(crate) const LINK_RECEIVING: u64 = 2;

/// Figures of a network bridge attached as one end of the channel (feature `net`), for
/// `shmflow stat`; all zero otherwise. Written Relaxed by the bridge, never read back by it
/// (the consumer reads `role` as a hint for its waits).
#[repr(C)]
#[derive(Default)]
pub(crate) struct LinkFigures {
    /// 0 (no bridge is an end of the channel), `LINK_SENDING` or `LINK_RECEIVING`.
    pub role: AtomicU64,
    /// Segments of credit: unspent by the sender (1), announced and unspent (2).
    pub credit: AtomicU64,
    /// Segments waiting behind the one being sent (1: its data ring), or the backlog the
    /// sender last announced (2).
    pub backlog: AtomicU64,
    /// Bytes sent in segments the receiver has not given credit back for yet (1 only).
    pub in_flight_bytes: AtomicU64,
    /// Bytes of segments sent (1) or received (2) over the network.
    pub wire_bytes: AtomicU64,
}

/// What a network bridge attached to a channel publishes for `shmflow stat`, as it last was.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Link {
    /// The bridge's end: `LINK_SENDING` (it reads the channel) or `LINK_RECEIVING` (it writes
    /// it); 0 when no bridge is an end of the channel.
    pub(crate) role: u64,
    pub(crate) credit: u64,
    pub(crate) backlog: u64,
    /// Sending only: bytes sent without credit back yet.
    pub(crate) in_flight_bytes: u64,
    pub(crate) wire_bytes: u64,
}

impl LinkFigures {
    /// Publishes `link` (the bridges, feature `net`); a receiving bridge has no bytes in
    /// flight and leaves `in_flight_bytes` as it is. Relaxed: figures for `shmflow
    /// stat`, never read back by the bridge and ordered with nothing.
    #[cfg_attr(any(not(feature = "net"), shmflow_loom), allow(dead_code))]
    pub(crate) fn publish(&self, link: Link) {
        self.role.store(link.role, Ordering::Relaxed);
        self.credit.store(link.credit, Ordering::Relaxed);
        self.backlog.store(link.backlog, Ordering::Relaxed);
        if link.role == LINK_SENDING {
            self.in_flight_bytes
                .store(link.in_flight_bytes, Ordering::Relaxed);
        }
        self.wire_bytes.store(link.wire_bytes, Ordering::Relaxed);
    }

    /// A receiving bridge is the producer end, as its last publication says: the consumer's
    /// waits take it as a hint (Relaxed: a wrong answer, from a region that lies, only changes
    /// how a wait spends its time).
    pub(crate) fn fed_by_bridge(&self) -> bool {
        self.role.load(Ordering::Relaxed) == LINK_RECEIVING
    }

    /// What the bridge last published (Relaxed: statistics; a reader may see a mix of two
    /// publications, never a torn figure).
    pub(crate) fn read(&self) -> Link {
        Link {
            role: self.role.load(Ordering::Relaxed),
            credit: self.credit.load(Ordering::Relaxed),
            backlog: self.backlog.load(Ordering::Relaxed),
            in_flight_bytes: self.in_flight_bytes.load(Ordering::Relaxed),
            wire_bytes: self.wire_bytes.load(Ordering::Relaxed),
        }
    }
}

/// Bytes of payload a priority event can carry (the rest of its slot is kind and length).
pub(crate) const PRIO_PAYLOAD: usize = 31 * 8;
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
    /// 0 until one process takes the duty of unlinking a named channel's name (layout
    /// version 8): the name can be removed by either end (see `region::name`), and a CAS
    /// from 0 to 1 makes sure it is removed once — never a newer region that reused it.
    pub name_claim: AtomicU32,
    pub producer: Padded<EndSlot>,
    pub consumer: Padded<EndSlot>,
    pub prod: Padded<ProducerCursors>,
    pub cons: Padded<ConsumerCursors>,
    /// Bit 0 set while the producer is (about to be) asleep waiting for a returned segment.
    pub producer_park: Padded<FutexWord>,
    /// Bit 0 set while the consumer is (about to be) asleep waiting for data; bit 1 (sticky)
    /// if it cannot issue the heavy barrier, so the producer must notify with an RMW (see
    /// `park.rs`).
    pub consumer_park: Padded<FutexWord>,
    pub producer_counters: Padded<ProducerCounters>,
    pub consumer_counters: Padded<ConsumerCounters>,
    /// Priority lane: next slot the producer fills (its own line, written only by priority
    /// sends, so the consumer's check before each message stays a cache hit).
    pub prio_tail: Padded<AtomicU64>,
    /// Priority events, outside the segments so that they can overtake queued records.
    pub prio: [PrioSlot; PRIO_SLOTS],
    /// A network bridge's figures (layout version 6).
    pub link: Padded<LinkFigures>,
}

#[cfg(not(shmflow_loom))]
const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_SIZE);

/// What the creator writes once into a header: the shape, and who made it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Identity {
    pub(crate) magic: u64,
    pub(crate) segment_size: u32,
    pub(crate) segment_count: u32,
    pub(crate) total_size: u64,
    pub(crate) creator_pid: u32,
}

/// What an opener reads of a header before it trusts the rest: the layout version, the header
/// size, and the size it records for the whole region.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Recorded {
    pub(crate) version: u32,
    pub(crate) header_size: u32,
    pub(crate) total_size: u64,
}

/// Reads a header's magic word, the last thing its creator writes. SYNC POINT: Acquire, pairs
/// with the Release store in [`Header::init`] (or [`GateHeader::init`]): an opener that sees
/// the magic sees everything the creator wrote before it.
pub(crate) fn load_magic(word: &AtomicU64) -> u64 {
    word.load(Ordering::Acquire)
}

impl Header {
    /// Writes a fresh header (creator only, before anyone else can see the region), and puts
    /// `free`, every segment the channel starts with, in its return ring (`ret_slots`), in
    /// order. `publish`: store the magic last with Release; a gate's channels leave that to
    /// the gate's own header ([`GateHeader::init`]), which every opener reads first.
    pub(crate) fn init(
        &self,
        id: Identity,
        ret_slots: &[AtomicU64],
        free: impl Iterator<Item = u32>,
        publish: bool,
    ) {
        self.version.store(LAYOUT_VERSION, Ordering::Relaxed);
        self.header_size
            .store(HEADER_SIZE as u32, Ordering::Relaxed);
        self.segment_size.store(id.segment_size, Ordering::Relaxed);
        self.segment_count
            .store(id.segment_count, Ordering::Relaxed);
        self.total_size.store(id.total_size, Ordering::Relaxed);
        self.creator_pid.store(id.creator_pid, Ordering::Relaxed);
        let mut n = 0u64;
        for (slot, seg) in ret_slots.iter().zip(free) {
            slot.store(seg as u64, Ordering::Relaxed);
            n += 1;
        }
        self.cons.ret_tail.store(n, Ordering::Relaxed);
        if publish {
            // SYNC POINT: Release, pairs with `load_magic`.
            self.magic.store(id.magic, Ordering::Release);
        } else {
            // Published by the gate's magic (Release, after every channel).
            self.magic.store(id.magic, Ordering::Relaxed);
        }
    }

    /// The channel's geometry and what the header records of itself, as written (Relaxed:
    /// after `load_magic`; every value is checked before it is trusted).
    pub(crate) fn recorded(&self) -> (Geometry, Recorded) {
        let g = Geometry {
            segment_size: self.segment_size.load(Ordering::Relaxed),
            segment_count: self.segment_count.load(Ordering::Relaxed),
        };
        (
            g,
            Recorded {
                version: self.version.load(Ordering::Relaxed),
                header_size: self.header_size.load(Ordering::Relaxed),
                total_size: self.total_size.load(Ordering::Relaxed),
            },
        )
    }

    /// Takes the duty of removing a named channel's name: true for the one end that does
    /// (see `region::name`). Relaxed: the claim orders nothing but itself; one RMW wins in the
    /// word's total order.
    pub(crate) fn claim_name(&self) -> bool {
        self.name_claim
            .compare_exchange(0, 1, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    pub(crate) fn end(&self, end: crate::error::End) -> &EndSlot {
        match end {
            crate::error::End::Producer => &self.producer,
            crate::error::End::Consumer => &self.consumer,
        }
    }
}

/// Size and number of segments: everything else in the layout follows from these two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes per segment (a multiple of 64, 4 KiB ..= 1 GiB; under `--cfg shmflow_loom`,
    /// from 64 bytes, at most 4 KiB of segments in all).
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
    /// The default segment size with a pool large enough for `records` records of `len`
    /// bytes each at once: a writer can send them all and end before its reader opens the
    /// region. With a smaller pool the writer blocks once the pool is full, until a reader
    /// frees a segment (a `try_`/timeout send reports it instead).
    ///
    /// Each record takes its length plus an 8-byte frame header, rounded up to 8 bytes, in
    /// a segment; a record longer than a segment spans several, with a header per part.
    ///
    /// # Examples
    ///
    /// ```
    /// let g = shmflow::Geometry::for_records(10_000, 100)?;
    /// // A 32 KiB segment holds 292 records of 100 B (112 bytes each with the header).
    /// assert_eq!((g.segment_size, g.segment_count), (32 * 1024, 35));
    /// # Ok::<(), shmflow::ConfigError>(())
    /// ```
    ///
    /// # Errors
    /// [`ConfigError`] if they need more than the largest pool (2^20 segments).
    pub fn for_records(records: u64, len: usize) -> Result<Geometry, ConfigError> {
        let seg = DEFAULT_SEGMENT_SIZE as u64;
        let header = FRAME_HEADER as u64;
        let len = len as u64;
        let usable = seg - header;
        let segments = if len <= usable {
            let per_segment = seg / (len + header).next_multiple_of(8);
            records.div_ceil(per_segment)
        } else {
            // A spanning record may begin in a segment's last bytes and so take one part
            // more than its length needs; each part has its header and alignment.
            let parts = len.div_ceil(usable) + 1;
            let bytes = records
                .saturating_mul(len.saturating_add(parts * (header + 8)))
                .saturating_add(seg);
            bytes.div_ceil(seg)
        };
        let count = u32::try_from(segments.max(2))
            .ok()
            .filter(|&n| n <= MAX_SEGMENT_COUNT)
            .ok_or_else(|| {
                ConfigError::new(
                    "Geometry::for_records",
                    "records × len",
                    format!("a pool of at most {MAX_SEGMENT_COUNT} segments of {seg} bytes"),
                    segments,
                )
            })?;
        Ok(Geometry {
            segment_size: DEFAULT_SEGMENT_SIZE,
            segment_count: count,
        })
    }

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
        #[cfg(shmflow_loom)]
        if (s as u64) * (n as u64) > LOOM_MAX_POOL {
            return Err(ConfigError::new(
                region,
                "segment_size × segment_count",
                format!(
                    "at most {LOOM_MAX_POOL} bytes under --cfg shmflow_loom (loom follows every \
                     word of a segment: a model takes a few segments of a few words, such as \
                     Geometry {{ segment_size: 64, segment_count: 2 }})"
                ),
                (s as u64) * (n as u64),
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

    /// Where the latency table starts: after the segments (layout version 11).
    pub(crate) fn latency_offset(&self) -> usize {
        self.segments_offset() + self.segment_count as usize * self.segment_size as usize
    }

    /// Total bytes of a region with this geometry.
    pub fn region_size(&self) -> usize {
        self.latency_offset() + crate::protocol::latency::TABLE_BYTES
    }
}

// ----- gates ---------------------------------------------------------------------------
//
// The layout of a gate region: one consumer, `M` channels, each with its own producer.
//
// ```text
// | gate header (4 KiB): identity, geometry, consumer state, the gate's park word, pool figures |
// | channel 0: header (4 KiB, as a single channel's) | data ring | return ring  (E + F slots each) |
// | channel 1: ...                                                                                |
// | segments 0 .. T-1, T = M × E + F: channel c owns [c×E, c×E + E); floating are [M×E, T)      |
// | the gate's latency table (`protocol::latency`)                                              |
// ```
//
// Every ring still has one writer: a channel's return ring is written only by the consumer,
// which is the sole owner of the floating pool (it lends a floating segment by pushing it into
// that channel's return ring, and takes it back when it comes out of the data ring). A ring
// holds `E + F` slots, the most segments one channel can ever own.

/// First 8 bytes of a gate region ("SHMGATE" + 0x01): a single-channel open of a gate is
/// `BadMagic`, and the other way round.
pub(crate) const GATE_MAGIC: u64 = u64::from_le_bytes(*b"SHMGATE\x01");
/// Default exclusive segments per channel (Flink's `buffers-per-channel`).
const DEFAULT_EXCLUSIVE: u32 = 2;
/// Default floating segments per gate (Flink's `floating-buffers-per-gate`).
const DEFAULT_FLOATING: u32 = 8;
/// Most channels in one gate (each producer's liveness lock takes one byte of the object).
pub(crate) const MAX_CHANNELS: u32 = 1024;

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

/// Figures the consumer publishes about a gate's checkpoints (for `shmflow stat`).
#[repr(C)]
#[derive(Default)]
pub(crate) struct CheckpointFigures {
    /// Checkpoints released, and cancelled before they were complete.
    pub released: AtomicU64,
    pub abandoned: AtomicU64,
    /// The last one released: its id, how (`RELEASED_*`), its alignment time (first barrier
    /// seen to release), its start delay (sent to released), and what its alignment held
    /// back (records and bytes sent beyond what was read on the held channels).
    pub last_id: AtomicU64,
    pub last_how: AtomicU64,
    pub last_alignment_ns: AtomicU64,
    pub last_start_delay_ns: AtomicU64,
    pub last_held_records: AtomicU64,
    pub last_held_bytes: AtomicU64,
    /// Records and payload bytes handed out as in-flight data, in all.
    pub inflight_records: AtomicU64,
    pub inflight_bytes: AtomicU64,
}

/// `CheckpointFigures::last_how`.
pub(crate) const RELEASED_ALIGNED: u64 = 1;
pub(crate) const RELEASED_UNALIGNED: u64 = 2;
pub(crate) const RELEASED_TIMED_OUT: u64 = 3;

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
    pub consumer: Padded<EndSlot>,
    /// Non-zero while the consumer is (about to be) asleep waiting for any channel. Every
    /// channel's producer wakes this one word.
    pub park: Padded<FutexWord>,
    pub pool: Padded<GateFigures>,
    pub checkpoints: Padded<CheckpointFigures>,
}

#[cfg(not(shmflow_loom))]
const _: () = assert!(std::mem::size_of::<GateHeader>() <= HEADER_SIZE);

impl GateHeader {
    /// Writes a fresh gate header, after every channel's ([`Header::init`] without
    /// publishing): the magic last, with Release, publishes them all.
    pub(crate) fn init(&self, gg: GateGeometry, creator_pid: u32) {
        self.version.store(LAYOUT_VERSION, Ordering::Relaxed);
        self.header_size
            .store(HEADER_SIZE as u32, Ordering::Relaxed);
        self.channels.store(gg.channels, Ordering::Relaxed);
        self.exclusive.store(gg.exclusive, Ordering::Relaxed);
        self.floating.store(gg.floating, Ordering::Relaxed);
        self.segment_size.store(gg.segment_size, Ordering::Relaxed);
        self.total_size
            .store(gg.region_size() as u64, Ordering::Relaxed);
        self.creator_pid.store(creator_pid, Ordering::Relaxed);
        self.pool
            .floating_free
            .store(gg.floating as u64, Ordering::Relaxed);
        // SYNC POINT: Release, pairs with `load_magic`.
        self.magic.store(GATE_MAGIC, Ordering::Release);
    }

    /// The gate's geometry and what the header records of itself, as written (Relaxed:
    /// after `load_magic`; every value is checked before it is trusted).
    pub(crate) fn recorded(&self) -> (GateGeometry, Recorded) {
        let gg = GateGeometry::new(self.channels.load(Ordering::Relaxed))
            .with_exclusive(self.exclusive.load(Ordering::Relaxed))
            .with_floating(self.floating.load(Ordering::Relaxed))
            .with_segment_size(self.segment_size.load(Ordering::Relaxed));
        (
            gg,
            Recorded {
                version: self.version.load(Ordering::Relaxed),
                header_size: self.header_size.load(Ordering::Relaxed),
                total_size: self.total_size.load(Ordering::Relaxed),
            },
        )
    }
}

/// The shape of a gate: how many channels, how many segments each owns, how many float.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GateGeometry {
    /// Channels (one producer each), 1 ..= 1024.
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
    ///
    /// ```
    /// let g = shmflow::GateGeometry::new(3).with_floating(4).with_segment_size(4096);
    /// assert_eq!((g.channels, g.exclusive, g.floating, g.segment_size), (3, 2, 4, 4096));
    /// ```
    pub const fn new(channels: u32) -> GateGeometry {
        GateGeometry {
            channels,
            exclusive: DEFAULT_EXCLUSIVE,
            floating: DEFAULT_FLOATING,
            segment_size: crate::protocol::abi::DEFAULT_SEGMENT_SIZE,
        }
    }

    /// The same, with `n` segments owned by each channel.
    pub const fn with_exclusive(mut self, n: u32) -> GateGeometry {
        self.exclusive = n;
        self
    }

    /// The same, with `n` floating segments.
    pub const fn with_floating(mut self, n: u32) -> GateGeometry {
        self.floating = n;
        self
    }

    /// The same, with segments of `bytes` bytes.
    pub const fn with_segment_size(mut self, bytes: u32) -> GateGeometry {
        self.segment_size = bytes;
        self
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
        if total > crate::protocol::abi::MAX_SEGMENT_COUNT as u64 {
            return Err(bad(
                "channels × exclusive + floating",
                "at most 2^20 segments",
                total.min(u32::MAX as u64) as u32,
            ));
        }
        // The segment size has the channel's limits.
        crate::protocol::abi::Geometry {
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
        #[cfg(shmflow_loom)]
        if self.segment_size as u64 * total > LOOM_MAX_POOL {
            return Err(ConfigError::new(
                region,
                "segments × segment_size",
                format!(
                    "at most {LOOM_MAX_POOL} bytes under --cfg shmflow_loom (loom follows every \
                     word of a segment: a model's gate takes a few segments of 64 bytes)"
                ),
                self.segment_size as u64 * total,
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
    #[cfg_attr(shmflow_loom, allow(dead_code))]
    pub(crate) fn channel_offset(&self, c: u32) -> usize {
        HEADER_SIZE + c as usize * self.channel_block()
    }

    #[cfg_attr(shmflow_loom, allow(dead_code))]
    pub(crate) fn data_ring_offset(&self, c: u32) -> usize {
        self.channel_offset(c) + HEADER_SIZE
    }

    #[cfg_attr(shmflow_loom, allow(dead_code))]
    pub(crate) fn return_ring_offset(&self, c: u32) -> usize {
        self.data_ring_offset(c) + self.ring_bytes()
    }

    pub(crate) fn segments_offset(&self) -> usize {
        HEADER_SIZE + self.channels as usize * self.channel_block()
    }

    /// Where the gate's latency table starts: after every segment (layout version 11).
    pub(crate) fn latency_offset(&self) -> usize {
        self.segments_offset() + self.total_segments() as usize * self.segment_size as usize
    }

    /// Total bytes of a gate region with this geometry.
    pub fn region_size(&self) -> usize {
        self.latency_offset() + crate::protocol::latency::TABLE_BYTES
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

// ----- the layout, pinned ------------------------------------------------------------------
//
// The places other builds of shmflow (and the tests that patch regions by offset) rely on. A
// field that moves breaks these at compile time; `golden_layout` below pins every field.

#[cfg(not(shmflow_loom))]
const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(Header, magic) == 0);
    assert!(offset_of!(Header, version) == 8);
    assert!(offset_of!(Header, header_size) == 12);
    assert!(offset_of!(Header, segment_size) == 16);
    assert!(offset_of!(Header, segment_count) == 20);
    assert!(offset_of!(Header, total_size) == 24);
    assert!(offset_of!(GateHeader, magic) == 0);
    assert!(offset_of!(GateHeader, version) == 8);
    assert!(offset_of!(GateHeader, header_size) == 12);
    assert!(std::mem::size_of::<GateHeader>() <= HEADER_SIZE);
};

#[cfg(all(test, not(shmflow_loom)))]
mod tests;
