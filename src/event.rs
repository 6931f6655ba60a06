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

use crate::error::{Error, Result};
use crate::layout::{Header, PRIO_PAYLOAD, PRIO_SLOTS};
use crate::sync::Ordering;

/// The largest payload of an event (ordinary or priority), in bytes.
pub const MAX_EVENT_PAYLOAD: usize = PRIO_PAYLOAD;

/// An event as received: the user's kind and payload, and whether it came as a priority event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event<'a> {
    /// What the producer passed as the kind.
    pub kind: u32,
    /// The payload (in place for an ordinary event; copied out of the lane for a priority one).
    pub payload: &'a [u8],
    /// True if it overtook the records queued before it.
    pub priority: bool,
}

/// What a consumer receives with [`crate::Consumer::recv_message`].
pub enum Message<'a> {
    /// A record.
    Record(crate::Record<'a>),
    /// An event (ordinary or priority).
    Event(Event<'a>),
}

pub(crate) fn check_payload(region: &str, payload: &[u8]) -> Result<()> {
    if payload.len() > MAX_EVENT_PAYLOAD {
        return Err(Error::too_large(
            region,
            "an event payload",
            payload.len() as u64,
            MAX_EVENT_PAYLOAD as u64,
        ));
    }
    Ok(())
}

/// Producer side of the lane: writes slot `tail` if there is room (`Ok(false)` if the lane is
/// full). The consumer's head is untrusted: one that passed the tail or fell more than the
/// lane behind is `Corrupt`.
pub(crate) fn lane_push(
    h: &Header,
    tail: u64,
    kind: u32,
    payload: &[u8],
    region: &str,
) -> Result<bool> {
    // Acquire: the consumer's reads of the slot we reuse happened before it moved its head.
    let head = h.cons.prio_head.load(Ordering::Acquire);
    if head > tail || tail - head > PRIO_SLOTS as u64 {
        return Err(Error::corrupt(
            region,
            "priority lane head",
            format!(
                "between {} and {tail}",
                tail.saturating_sub(PRIO_SLOTS as u64)
            ),
            head,
        ));
    }
    if tail - head == PRIO_SLOTS as u64 {
        return Ok(false);
    }
    let slot = &h.prio[(tail % PRIO_SLOTS as u64) as usize];
    for (i, w) in slot.words.iter().enumerate() {
        let mut b = [0u8; 8];
        let from = (i * 8).min(payload.len());
        let to = (i * 8 + 8).min(payload.len());
        b[..to - from].copy_from_slice(&payload[from..to]);
        // Relaxed: published by the Release store of the tail.
        w.store(u64::from_le_bytes(b), Ordering::Relaxed);
        if to == payload.len() {
            break;
        }
    }
    slot.kind_len.store(
        ((kind as u64) << 32) | payload.len() as u64,
        Ordering::Relaxed,
    );
    // Release: the slot's words are visible to whoever loads the tail with Acquire.
    h.prio_tail.store(tail + 1, Ordering::Release);
    Ok(true)
}

/// Consumer side: copies slot `head` into `buf` if the lane holds one. `Err(Corrupt)` if the
/// producer's tail or the slot's length make no sense.
pub(crate) fn lane_pop(
    h: &Header,
    head: u64,
    buf: &mut [u8; PRIO_PAYLOAD],
    region: &str,
) -> Result<Option<(u32, usize)>> {
    // Acquire: pairs with the producer's Release of the tail.
    let tail = h.prio_tail.load(Ordering::Acquire);
    if tail == head {
        return Ok(None);
    }
    if tail < head || tail - head > PRIO_SLOTS as u64 {
        return Err(Error::corrupt(
            region,
            "priority lane tail",
            format!("between {head} and {}", head + PRIO_SLOTS as u64),
            tail,
        ));
    }
    let slot = &h.prio[(head % PRIO_SLOTS as u64) as usize];
    let kl = slot.kind_len.load(Ordering::Relaxed);
    let (kind, len) = ((kl >> 32) as u32, (kl & 0xffff_ffff) as usize);
    if len > PRIO_PAYLOAD {
        return Err(Error::corrupt(
            region,
            "priority event length",
            format!("at most {PRIO_PAYLOAD}"),
            len as u64,
        ));
    }
    for (i, w) in slot.words.iter().enumerate().take(len.div_ceil(8)) {
        let b = w.load(Ordering::Relaxed).to_le_bytes();
        let n = (len - i * 8).min(8);
        buf[i * 8..i * 8 + n].copy_from_slice(&b[..n]);
    }
    // Release: our reads of the slot happen before the producer reuses it.
    h.cons.prio_head.store(head + 1, Ordering::Release);
    Ok(Some((kind, len)))
}

impl std::fmt::Debug for Message<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Message::Record(r) => f.debug_tuple("Record").field(r).finish(),
            Message::Event(e) => f.debug_tuple("Event").field(e).finish(),
        }
    }
}
