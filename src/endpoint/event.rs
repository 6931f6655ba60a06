//! Events: small typed messages carried in order with the records, and priority events that
//! overtake them.
//!
//! An ordinary event is an `EVENT` frame in a segment, so it keeps its place among the
//! records. A priority event goes through the channel's priority lane instead — four slots in
//! the channel header, outside the segments — and the consumer looks at the lane before every
//! message it hands out. So a priority event is delivered before every record and ordinary
//! event that the consumer has not yet started to read when it looks (those queued in
//! segments, including the rest of the segment in hand), never in the middle of a spanning
//! record, after every record already handed out, and before every record and ordinary event
//! sent after it (the consumer looks at the lane after it loads a frame's header, which the
//! producer commits after the push). Priority events keep their order among
//! themselves; everything else keeps its order too. The end of a partition is not an event
//! frame: it is the producer's detach, which the consumer sees only after everything committed
//! before it (see [`crate::GateMessage::EndOfPartition`]).

use std::time::Duration;

use crate::error::{too_large, RecordTooLargeError};
use crate::protocol::abi::PRIO_PAYLOAD;
use crate::protocol::barrier::HEAD;

/// The largest payload of an event (ordinary or priority), in bytes.
pub const MAX_EVENT_PAYLOAD: usize = PRIO_PAYLOAD;

/// An event as received: the user's kind and payload, and whether it came as a priority event.
///
/// # Order
///
/// An ordinary event ([`Producer::send_event`](crate::Producer::send_event)) is a frame in a
/// segment, so it keeps its place among the records. A priority event
/// ([`Producer::send_priority_event`](crate::Producer::send_priority_event)) goes through the
/// channel's priority lane instead — four slots in the channel header, outside the segments —
/// and the consumer looks at the lane before every message it hands out. So a priority event is
/// delivered before every record and ordinary event that the consumer has not yet started to
/// read when it looks (those queued in segments, including the rest of the segment in hand),
/// never in the middle of a spanning record, after every record already handed out, and
/// before every record and ordinary event sent after it. Priority events keep their order
/// among themselves; everything else keeps its order too. The
/// end of a partition is not an event: it is the producer's detach, which the consumer sees
/// only after everything committed before it (see
/// [`GateMessage::EndOfPartition`](crate::GateMessage::EndOfPartition)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Event<'a> {
    /// What the producer passed as the kind.
    pub kind: u32,
    /// The payload (in place for an ordinary event; copied out of the lane for a priority one).
    pub payload: &'a [u8],
    /// True if it overtook the records queued before it.
    pub priority: bool,
}

pub(crate) fn check_payload(region: &str, payload: &[u8]) -> Result<(), Box<RecordTooLargeError>> {
    check_len(region, "an event payload", payload, MAX_EVENT_PAYLOAD)
}

fn check_len(
    region: &str,
    what: &'static str,
    payload: &[u8],
    max: usize,
) -> Result<(), Box<RecordTooLargeError>> {
    if payload.len() > max {
        return Err(too_large(region, what, payload.len() as u64, max as u64));
    }
    Ok(())
}

/// The largest payload of a barrier, in bytes (an event's, less the barrier's own 24).
pub const MAX_BARRIER_PAYLOAD: usize = PRIO_PAYLOAD - HEAD;

/// How a barrier asks to be aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Alignment {
    /// Aligned: a gate holds every channel whose barrier has arrived until it has arrived on
    /// all of them.
    Aligned,
    /// Aligned, switching to unaligned once this long has passed since the barrier was sent
    /// (Flink's aligned-checkpoint timeout). The barrier is also announced through the
    /// priority lane, so that a gate learns of it before the records queued in front of it.
    AlignedWithTimeout(Duration),
    /// Unaligned: announced through the priority lane, released at once; the records it
    /// overtook are handed back as the checkpoint's in-flight data.
    Unaligned,
}

impl Alignment {
    /// The alignment timeout in nanoseconds as carried in a barrier: `u64::MAX` for aligned,
    /// 0 for unaligned.
    pub(crate) fn to_wire(self) -> u64 {
        match self {
            Alignment::Aligned => u64::MAX,
            Alignment::AlignedWithTimeout(d) => d.as_nanos().clamp(1, u64::MAX as u128 - 1) as u64,
            Alignment::Unaligned => 0,
        }
    }

    pub(crate) fn from_wire(ns: u64) -> Alignment {
        match ns {
            u64::MAX => Alignment::Aligned,
            0 => Alignment::Unaligned,
            t => Alignment::AlignedWithTimeout(Duration::from_nanos(t)),
        }
    }

    /// True if the barrier also goes through the priority lane.
    pub(crate) fn announced(self) -> bool {
        !matches!(self, Alignment::Aligned)
    }
}

/// How a released barrier was aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Released {
    /// Every open channel's barrier arrived: the checkpoint has no in-flight data.
    Aligned,
    /// Released before alignment (an unaligned barrier, or `timed_out`: an aligned one whose
    /// alignment timeout passed): in-flight data follows, ending with `InFlightEnd`.
    Unaligned {
        /// True if it was an aligned barrier that switched.
        timed_out: bool,
    },
}

/// A checkpoint barrier as received (Flink's `CheckpointBarrier`): see
/// [`Producer::send_barrier`](crate::Producer::send_barrier).
///
/// A barrier always travels in its place among the records (`priority: false`). One sent
/// [`Alignment::Unaligned`] or [`Alignment::AlignedWithTimeout`] is also announced through
/// the priority lane (`priority: true`), so it reaches the consumer before the records queued
/// in front of it; the records between the announcement and the barrier in its place are the
/// ones it overtook. A [`Consumer`](crate::Consumer) hands out both; a
/// [`Gate`](crate::Gate) aligns them across its channels and hands out
/// [`GateMessage::Barrier`](crate::GateMessage::Barrier) instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Barrier<'a> {
    /// The checkpoint id; a producer's ids strictly increase.
    pub id: u64,
    /// The producer's monotonic clock when it sent the barrier
    /// ([`monotonic_now_ns`](crate::metrics::monotonic_now_ns)), the same clock for every
    /// process on one machine.
    pub emitted_ns: u64,
    /// How it asks to be aligned.
    pub alignment: Alignment,
    /// The producer's payload.
    pub payload: &'a [u8],
    /// True for the announcement from the priority lane, false for the barrier in its place.
    pub priority: bool,
}

impl Barrier<'_> {
    /// Nanoseconds from its emission to `now_ns` (the same monotonic clock), 0 if `now_ns` is
    /// earlier.
    pub fn age_ns(&self, now_ns: u64) -> u64 {
        now_ns.saturating_sub(self.emitted_ns)
    }
}

pub(crate) fn check_barrier_payload(
    region: &str,
    payload: &[u8],
) -> Result<(), Box<RecordTooLargeError>> {
    check_len(region, "a barrier payload", payload, MAX_BARRIER_PAYLOAD)
}
