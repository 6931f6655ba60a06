//! Events: small typed messages carried in order with the records, and priority events that
//! overtake them.
//!
//! An ordinary event is an `EVENT` frame in a segment, so it keeps its place among the
//! records. A priority event goes through the channel's priority lane instead — four slots in
//! the channel header, outside the segments — and the consumer looks at the lane before every
//! message it hands out. So a priority event is delivered before every record and ordinary
//! event that the consumer has not yet started to read when it looks (those queued in
//! segments, including the rest of the segment in hand), never in the middle of a spanning
//! record, and after every record already handed out. Priority events keep their order among
//! themselves; everything else keeps its order too. The end of a partition is not an event
//! frame: it is the producer's detach, which the consumer sees only after everything committed
//! before it (see [`crate::GateMessage::EndOfPartition`]).

use crate::error::{too_large, RecordTooLargeError};
use crate::protocol::abi::PRIO_PAYLOAD;

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
/// never in the middle of a spanning record, and after every record already handed out.
/// Priority events keep their order among themselves; everything else keeps its order too. The
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
    if payload.len() > MAX_EVENT_PAYLOAD {
        return Err(too_large(
            region,
            "an event payload",
            payload.len() as u64,
            MAX_EVENT_PAYLOAD as u64,
        ));
    }
    Ok(())
}
