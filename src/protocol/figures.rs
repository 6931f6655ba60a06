//! The figures of a region's header: the counters, gauges and timestamps the ends publish for
//! metrics, `shmflow stat` and `top`, and the only code that names them. Writers are named
//! for what happened (a segment taken, a wait begun, a checkpoint released); readers read a
//! whole structure at once into a plain `Copy` value ([`read_channel`], [`read_gate`]), and a
//! few read the one or two figures an end needs as it goes.
//!
//! Every figure is a statistic with one writer: stored Relaxed with plain (non-RMW) stores
//! (see `counters`), read Relaxed, ordered with nothing else. A reader may see a slightly old
//! value, or a mix of two publications, never a torn figure. The ends' attach states are not
//! figures: [`read_channel`] and [`read_gate`] read them as `ends` does, with Acquire.

use crate::protocol::abi::{
    GateHeader, Header, Link, LINK_RECEIVING, LINK_SENDING, RELEASED_ALIGNED, RELEASED_TIMED_OUT,
    RELEASED_UNALIGNED,
};
use crate::protocol::counters::{add_owned, read, set, Local};
use crate::protocol::ends::EndState;
use crate::sync::AtomicU64;

// ----- waits ---------------------------------------------------------------------------------

/// A wait that a pair of figures accounts: when the current one began (0 while none goes on,
/// so that a reader counts a wait still going on) and the time spent waiting in all. The
/// total lives in shared memory alone: a wait may end in a dropped future, where no local copy
/// can be reached.
#[derive(Clone, Copy)]
pub(crate) struct Wait<'a> {
    since: &'a AtomicU64,
    total: &'a AtomicU64,
}

impl Wait<'_> {
    /// A wait began at `now` (monotonic-clock nanoseconds). Relaxed (in `counters::set`):
    /// pairs with the Relaxed loads of the readers; ordered with nothing else.
    #[inline]
    pub(crate) fn began(&self, now: u64) {
        set(self.since, now);
    }

    /// The wait ended: none goes on now (its time is added by [`Wait::counted`]). Relaxed,
    /// as [`Wait::began`].
    #[inline]
    pub(crate) fn ended(&self) {
        set(self.since, 0);
    }

    /// A wait of `waited` nanoseconds ended: the total grows by `waited`. Relaxed, as
    /// [`Wait::began`]; this side is the total's only writer.
    #[inline]
    pub(crate) fn counted(&self, waited: u64) {
        add_owned(self.total, waited);
    }

    /// The time spent in waits that ended (Relaxed, as [`Wait::began`]).
    #[inline]
    pub(crate) fn total(&self) -> u64 {
        read(self.total)
    }
}

/// The producer's waits for a free segment (backpressure).
#[inline]
pub(crate) fn backpressure(h: &Header) -> Wait<'_> {
    Wait {
        since: &h.producer_counters.blocked_since_ns,
        total: &h.producer_counters.backpressured_ns,
    }
}

/// The consumer's waits for data (idle time).
#[inline]
pub(crate) fn consumer_idle(h: &Header) -> Wait<'_> {
    Wait {
        since: &h.consumer_counters.idle_since_ns,
        total: &h.consumer_counters.idle_ns,
    }
}

/// A gate consumer's waits for any of its channels.
#[inline]
pub(crate) fn gate_idle(g: &GateHeader) -> Wait<'_> {
    Wait {
        since: &g.pool.idle_since_ns,
        total: &g.pool.idle_ns,
    }
}

// ----- the producer's counters (`ProducerCounters`) --------------------------------------
//
// Each writer takes the producer's local count (the truth) and mirrors it into the header
// with a Relaxed store (in `counters::Local`): pairs with the Relaxed loads of the readers.

/// The producer wrote records: publishes its per-record counts, `records` records of
/// `bytes` payload bytes in all (counted locally with `Local::bump`).
#[inline]
pub(crate) fn records_written(h: &Header, records: &Local, bytes: &Local) {
    records.publish(&h.producer_counters.records);
    bytes.publish(&h.producer_counters.bytes);
}

/// A receiving bridge wrote a chunk of `n` records of `payload` bytes: counts and publishes
/// them.
#[cfg_attr(any(not(feature = "net"), shmflow_loom), allow(dead_code))]
#[inline]
pub(crate) fn chunk_written(
    h: &Header,
    records: &mut Local,
    bytes: &mut Local,
    n: u64,
    payload: u64,
) {
    records.add(&h.producer_counters.records, n);
    bytes.add(&h.producer_counters.bytes, payload);
}

/// The producer took a free segment from the return ring.
#[inline]
pub(crate) fn segment_acquired(h: &Header, acquired: &mut Local) {
    acquired.add(&h.producer_counters.segments_acquired, 1);
}

/// The producer sealed a segment and handed it over in full.
#[inline]
pub(crate) fn segment_committed(h: &Header, committed: &mut Local) {
    committed.add(&h.producer_counters.segments_committed, 1);
}

/// The producer made a wake-up call to its consumer.
#[inline]
pub(crate) fn consumer_woken(h: &Header, wakes: &mut Local) {
    wakes.add(&h.producer_counters.wakes, 1);
}

/// The producer's flusher thread made a wake-up call to the consumer (its own figure: the
/// flusher is its only writer).
#[inline]
pub(crate) fn flusher_woke(h: &Header, wakes: &mut Local) {
    wakes.add(&h.producer_counters.flusher_wakes, 1);
}

/// Records the producer has published, as it last published them (Relaxed, as every figure).
#[inline]
pub(crate) fn read_records_written(h: &Header) -> u64 {
    read(&h.producer_counters.records)
}

/// Segments the producer has taken, as it last published them (Relaxed, as every figure).
#[inline]
pub(crate) fn read_segments_acquired(h: &Header) -> u64 {
    read(&h.producer_counters.segments_acquired)
}

// ----- the consumer's counters (`ConsumerCounters`) --------------------------------------
//
// As the producer's: the local count is the truth, mirrored with a Relaxed store (in
// `counters::Local`) that pairs with the Relaxed loads of the readers.

/// The consumer read records: publishes its per-record counts, `records` records of `bytes`
/// payload bytes in all (counted locally with `Local::bump`).
#[inline]
pub(crate) fn records_read(h: &Header, records: &Local, bytes: &Local) {
    records.publish(&h.consumer_counters.records);
    bytes.publish(&h.consumer_counters.bytes);
}

/// A sending bridge forwarded a chunk of `n` records of `payload` bytes: counts and
/// publishes them.
#[cfg_attr(any(not(feature = "net"), shmflow_loom), allow(dead_code))]
#[inline]
pub(crate) fn chunk_read(h: &Header, records: &mut Local, bytes: &mut Local, n: u64, payload: u64) {
    records.add(&h.consumer_counters.records, n);
    bytes.add(&h.consumer_counters.bytes, payload);
}

/// The consumer took a segment from the data ring.
#[inline]
pub(crate) fn segment_taken(h: &Header, taken: &mut Local) {
    taken.add(&h.consumer_counters.segments_taken, 1);
}

/// The consumer finished a segment and gave it back. SYNC POINT: Release, paired with the
/// Acquire in [`read_segments_returned`]: everything the consumer did before it gave the
/// segment back (its reads of the segment's records, and what its caller did after each of
/// them) happens before what a producer whose `close_timeout` saw the count does after it.
#[inline]
pub(crate) fn segment_returned(h: &Header, returned: &mut Local) {
    returned.add_release(&h.consumer_counters.segments_returned, 1);
}

/// The consumer made a wake-up call to its producer.
#[inline]
pub(crate) fn producer_woken(h: &Header, wakes: &mut Local) {
    wakes.add(&h.consumer_counters.wakes, 1);
}

/// Records the consumer has read, as it last published them (Relaxed, as every figure).
#[inline]
pub(crate) fn read_records_read(h: &Header) -> u64 {
    read(&h.consumer_counters.records)
}

/// Segments the consumer has given back, as it last published them. SYNC POINT: Acquire,
/// paired with the Release in [`segment_returned`] (a producer waiting in `close` relies on
/// it).
#[inline]
pub(crate) fn read_segments_returned(h: &Header) -> u64 {
    crate::protocol::counters::read_acquire(&h.consumer_counters.segments_returned)
}

/// Segments the consumer has taken from the data ring (a broken build's figure for `close`).
#[cfg(shmflow_broken = "close_counts_taken")]
pub(crate) fn read_segments_taken(h: &Header) -> u64 {
    read(&h.consumer_counters.segments_taken)
}

/// Records and payload bytes the producer has published beyond what the consumer has
/// published reading, as the two last published them (0 where a count lags behind the other).
/// Relaxed, as every figure.
#[inline]
pub(crate) fn read_unread(h: &Header) -> (u64, u64) {
    let (pc, cc) = (&h.producer_counters, &h.consumer_counters);
    (
        read(&pc.records).saturating_sub(read(&cc.records)),
        read(&pc.bytes).saturating_sub(read(&cc.bytes)),
    )
}

/// Of a gate's channel: `records` records of `bytes` payload bytes were handed out as a
/// checkpoint's in-flight data. Relaxed (in `counters::add_owned`): pairs with the Relaxed
/// loads of the readers; the gate's consumer is the only writer.
#[inline]
pub(crate) fn channel_inflight(h: &Header, records: u64, bytes: u64) {
    let cc = &h.consumer_counters;
    add_owned(&cc.inflight_records, records);
    add_owned(&cc.inflight_bytes, bytes);
}

/// Of a gate's channel, as a checkpoint is released: its producer had sent `records` records
/// of `bytes` payload bytes beyond what was read while the checkpoint held the channel (0 if
/// it did not), the checkpoint held it for `held_ns` and its barrier took `delay_ns` from
/// sent to released (0 if it had not arrived). Relaxed (in `counters::set`): pairs with the
/// Relaxed loads of the readers.
#[inline]
pub(crate) fn channel_held(h: &Header, records: u64, bytes: u64, held_ns: u64, delay_ns: u64) {
    let cc = &h.consumer_counters;
    set(&cc.held_records, records);
    set(&cc.held_bytes, bytes);
    set(&cc.held_ns, held_ns);
    set(&cc.barrier_delay_ns, delay_ns);
}

/// Buffer debloating began with a target of `target_ns` (the rate is not yet measured).
/// Relaxed (in `counters::set`): pairs with the Relaxed loads of the readers.
#[inline]
pub(crate) fn debloat_started(h: &Header, target_ns: u64) {
    let cc = &h.consumer_counters;
    set(&cc.debloat_target_ns, target_ns);
    set(&cc.debloat_rate, 0);
}

/// Buffer debloating stopped: no target, no rate. Relaxed, as [`debloat_started`].
#[inline]
pub(crate) fn debloat_stopped(h: &Header) {
    let cc = &h.consumer_counters;
    set(&cc.debloat_target_ns, 0);
    set(&cc.debloat_rate, 0);
}

/// Buffer debloating measured the consumer's rate (bytes per second while busy, smoothed).
/// Relaxed, as [`debloat_started`].
#[inline]
pub(crate) fn debloat_rate_measured(h: &Header, rate: u64) {
    set(&h.consumer_counters.debloat_rate, rate);
}

// ----- a network bridge's figures (`LinkFigures`) ----------------------------------------

/// A sending bridge (the consumer end: it reads the channel and sends its segments) publishes
/// its figures. Relaxed (in `LinkFigures::publish`): pairs with the Relaxed loads of
/// [`read_channel`]; never read back by the bridge.
#[cfg_attr(any(not(feature = "net"), shmflow_loom), allow(dead_code))]
#[inline]
pub(crate) fn link_sending(h: &Header, credit: u64, backlog: u64, in_flight: u64, wire: u64) {
    h.link.publish(Link {
        role: LINK_SENDING,
        credit,
        backlog,
        in_flight_bytes: in_flight,
        wire_bytes: wire,
    });
}

/// A receiving bridge (the producer end: it writes what it receives into the channel)
/// publishes its figures. Relaxed, as [`link_sending`].
#[cfg_attr(any(not(feature = "net"), shmflow_loom), allow(dead_code))]
#[inline]
pub(crate) fn link_receiving(h: &Header, credit: u64, backlog: u64, wire: u64) {
    h.link.publish(Link {
        role: LINK_RECEIVING,
        credit,
        backlog,
        in_flight_bytes: 0,
        wire_bytes: wire,
    });
}

/// A receiving bridge is the producer end, as its last publication says (a hint for the
/// consumer's waits; see `LinkFigures::fed_by_bridge`).
#[inline]
pub(crate) fn fed_by_bridge(h: &Header) -> bool {
    h.link.fed_by_bridge()
}

// ----- a gate's figures (`GateFigures`, `CheckpointFigures`) -----------------------------

/// How a checkpoint was released, as its figure records it (`CheckpointFigures::last_how`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReleasedAs {
    /// Every channel's barrier arrived.
    Aligned,
    /// Released unaligned (an unaligned barrier).
    Unaligned,
    /// An aligned checkpoint released unaligned when its alignment timed out.
    TimedOut,
}

impl ReleasedAs {
    fn code(self) -> u64 {
        match self {
            ReleasedAs::Aligned => RELEASED_ALIGNED,
            ReleasedAs::Unaligned => RELEASED_UNALIGNED,
            ReleasedAs::TimedOut => RELEASED_TIMED_OUT,
        }
    }

    /// Untrusted: 0 (none released yet) or a value no gate writes reads as none.
    fn from_code(code: u64) -> Option<ReleasedAs> {
        match code {
            RELEASED_ALIGNED => Some(ReleasedAs::Aligned),
            RELEASED_UNALIGNED => Some(ReleasedAs::Unaligned),
            RELEASED_TIMED_OUT => Some(ReleasedAs::TimedOut),
            _ => None,
        }
    }
}

/// The gate's pool has `free` floating segments lent to nobody. Relaxed (in `counters::set`):
/// pairs with the Relaxed loads of [`read_gate`].
#[inline]
pub(crate) fn floating_free(g: &GateHeader, free: u64) {
    set(&g.pool.floating_free, free);
}

/// The gate released checkpoint `id` (`how`), `alignment_ns` after it saw its first barrier
/// and `start_delay_ns` after its emission, its alignment having held back `held_records`
/// records of `held_bytes` payload bytes on the held channels. Relaxed (in `counters`): pairs
/// with the Relaxed loads of [`read_gate`]; the gate's consumer is the only writer.
#[inline]
pub(crate) fn checkpoint_released(
    g: &GateHeader,
    id: u64,
    how: ReleasedAs,
    alignment_ns: u64,
    start_delay_ns: u64,
    held_records: u64,
    held_bytes: u64,
) {
    let f = &g.checkpoints;
    add_owned(&f.released, 1);
    set(&f.last_id, id);
    set(&f.last_how, how.code());
    set(&f.last_alignment_ns, alignment_ns);
    set(&f.last_start_delay_ns, start_delay_ns);
    set(&f.last_held_records, held_records);
    set(&f.last_held_bytes, held_bytes);
}

/// The gate abandoned a checkpoint for a newer one before it was complete. Relaxed, as
/// [`checkpoint_released`].
#[inline]
pub(crate) fn checkpoint_abandoned(g: &GateHeader) {
    add_owned(&g.checkpoints.abandoned, 1);
}

/// The gate handed out `records` records of `bytes` payload bytes as in-flight data. Relaxed,
/// as [`checkpoint_released`].
#[inline]
pub(crate) fn gate_inflight(g: &GateHeader, records: u64, bytes: u64) {
    let f = &g.checkpoints;
    add_owned(&f.inflight_records, records);
    add_owned(&f.inflight_bytes, bytes);
}

// ----- readers of whole structures ----------------------------------------------------------

/// An end's attach state and the pid it recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct End {
    pub(crate) state: EndState,
    pub(crate) pid: u32,
}

/// The cursors of a channel (`ProducerCursors`, `ConsumerCursors`) that its figures are
/// computed from, as published.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cursors {
    pub(crate) data_tail: u64,
    pub(crate) ret_head: u64,
    pub(crate) demand: u64,
    pub(crate) ret_tail: u64,
    pub(crate) lent: u64,
    pub(crate) floating_held: u64,
    pub(crate) segments_done: u64,
    pub(crate) segment_cap: u64,
    pub(crate) segment_fill: u64,
}

/// The producer's counters (`ProducerCounters`), as published.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Producer {
    pub(crate) records: u64,
    pub(crate) bytes: u64,
    pub(crate) segments_committed: u64,
    pub(crate) wakes: u64,
    pub(crate) backpressured_ns: u64,
    pub(crate) blocked_since_ns: u64,
    pub(crate) flusher_wakes: u64,
    pub(crate) segments_acquired: u64,
}

/// The consumer's counters (`ConsumerCounters`), as published.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Consumer {
    pub(crate) records: u64,
    pub(crate) bytes: u64,
    pub(crate) segments_returned: u64,
    pub(crate) wakes: u64,
    pub(crate) idle_ns: u64,
    pub(crate) idle_since_ns: u64,
    pub(crate) segments_taken: u64,
    pub(crate) inflight_records: u64,
    pub(crate) inflight_bytes: u64,
    pub(crate) held_records: u64,
    pub(crate) held_bytes: u64,
    pub(crate) held_ns: u64,
    pub(crate) barrier_delay_ns: u64,
    pub(crate) debloat_target_ns: u64,
    pub(crate) debloat_rate: u64,
}

/// Everything a channel's header publishes about it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Channel {
    pub(crate) cursors: Cursors,
    pub(crate) producer: Producer,
    pub(crate) consumer: Consumer,
    pub(crate) producer_end: End,
    pub(crate) consumer_end: End,
    /// What a network bridge attached as one end last published (role 0: none).
    pub(crate) link: Link,
}

/// Reads a channel's figures. Every figure and cursor is read once, Relaxed (a statistic:
/// pairs with the Relaxed stores of the writers above, ordered with nothing else), so a value
/// may lag behind another; the ends' states with Acquire (in `EndSlot::state`: pairs with
/// `EndSlot::leave` and `EndSlot::attach`), the pids Relaxed (`EndSlot::pid`).
pub(crate) fn read_channel(h: &Header) -> Channel {
    let (p, c) = (&h.prod, &h.cons);
    let cursors = Cursors {
        data_tail: read(&p.data_tail),
        ret_head: read(&p.ret_head),
        demand: read(&p.demand),
        ret_tail: read(&c.ret_tail),
        lent: read(&c.lent),
        floating_held: read(&c.floating_held),
        segments_done: read(&c.segments_done),
        segment_cap: read(&c.segment_cap),
        segment_fill: read(&c.segment_fill),
    };
    let pc = &h.producer_counters;
    let producer = Producer {
        records: read(&pc.records),
        bytes: read(&pc.bytes),
        segments_committed: read(&pc.segments_committed),
        wakes: read(&pc.wakes),
        backpressured_ns: read(&pc.backpressured_ns),
        blocked_since_ns: read(&pc.blocked_since_ns),
        flusher_wakes: read(&pc.flusher_wakes),
        segments_acquired: read(&pc.segments_acquired),
    };
    let cc = &h.consumer_counters;
    let consumer = Consumer {
        records: read(&cc.records),
        bytes: read(&cc.bytes),
        segments_returned: read(&cc.segments_returned),
        wakes: read(&cc.wakes),
        idle_ns: read(&cc.idle_ns),
        idle_since_ns: read(&cc.idle_since_ns),
        segments_taken: read(&cc.segments_taken),
        inflight_records: read(&cc.inflight_records),
        inflight_bytes: read(&cc.inflight_bytes),
        held_records: read(&cc.held_records),
        held_bytes: read(&cc.held_bytes),
        held_ns: read(&cc.held_ns),
        barrier_delay_ns: read(&cc.barrier_delay_ns),
        debloat_target_ns: read(&cc.debloat_target_ns),
        debloat_rate: read(&cc.debloat_rate),
    };
    // The states first, then the pids and the bridge's figures (as `metrics` always read
    // them).
    let producer_state = h.producer.state();
    let consumer_state = h.consumer.state();
    Channel {
        cursors,
        producer,
        consumer,
        producer_end: End {
            state: producer_state,
            pid: h.producer.pid(),
        },
        consumer_end: End {
            state: consumer_state,
            pid: h.consumer.pid(),
        },
        link: h.link.read(),
    }
}

/// A gate's checkpoints (`CheckpointFigures`), as published.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Checkpoints {
    pub(crate) released: u64,
    pub(crate) abandoned: u64,
    pub(crate) last_id: u64,
    /// `None` if none was released (or the figure holds a value no gate writes).
    pub(crate) last_how: Option<ReleasedAs>,
    pub(crate) last_alignment_ns: u64,
    pub(crate) last_start_delay_ns: u64,
    pub(crate) last_held_records: u64,
    pub(crate) last_held_bytes: u64,
    pub(crate) inflight_records: u64,
    pub(crate) inflight_bytes: u64,
}

/// Everything a gate's header publishes about the gate as a whole (`GateFigures`, its
/// consumer's state, `CheckpointFigures`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Gate {
    pub(crate) idle_since_ns: u64,
    pub(crate) idle_ns: u64,
    pub(crate) floating_free: u64,
    pub(crate) consumer_state: EndState,
    pub(crate) checkpoints: Checkpoints,
}

/// Reads a gate's figures: Relaxed, as [`read_channel`]; the consumer's state with Acquire
/// (in `EndSlot::state`: pairs with `EndSlot::leave` and `EndSlot::attach`).
pub(crate) fn read_gate(g: &GateHeader) -> Gate {
    let f = &g.checkpoints;
    Gate {
        idle_since_ns: read(&g.pool.idle_since_ns),
        idle_ns: read(&g.pool.idle_ns),
        floating_free: read(&g.pool.floating_free),
        consumer_state: g.consumer.state(),
        checkpoints: Checkpoints {
            released: read(&f.released),
            abandoned: read(&f.abandoned),
            last_id: read(&f.last_id),
            last_how: ReleasedAs::from_code(read(&f.last_how)),
            last_alignment_ns: read(&f.last_alignment_ns),
            last_start_delay_ns: read(&f.last_start_delay_ns),
            last_held_records: read(&f.last_held_records),
            last_held_bytes: read(&f.last_held_bytes),
            inflight_records: read(&f.inflight_records),
            inflight_bytes: read(&f.inflight_bytes),
        },
    }
}
