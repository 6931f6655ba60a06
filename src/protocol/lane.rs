//! The priority lane: four slots in the channel header, outside the segments, so that a
//! priority event can overtake what is queued (see the `event` endpoint for the order).

use crate::error::{corrupt, CorruptError};

/// What a broken cursor or slot is.
type Result<T> = std::result::Result<T, Box<CorruptError>>;
use crate::protocol::abi::{Header, PRIO_PAYLOAD, PRIO_SLOTS};
use crate::protocol::barrier::{HEAD, LANE_FLAG};

/// What a lane slot holds besides its payload: a priority event of `kind`, or (`barrier`) a
/// barrier's announcement (kind 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) kind: u32,
    pub(crate) barrier: bool,
}

impl Entry {
    pub(crate) fn event(kind: u32) -> Entry {
        Entry {
            kind,
            barrier: false,
        }
    }
}
use crate::sync::Ordering;

/// Producer side of the lane: writes slot `tail` if there is room (`Ok(false)` if the lane is
/// full). The consumer's head is untrusted: one that passed the tail or fell more than the
/// lane behind is `Corrupt`.
pub(crate) fn lane_push(
    h: &Header,
    tail: u64,
    entry: Entry,
    payload: &[u8],
    region: &str,
) -> Result<bool> {
    // Acquire: the consumer's reads of the slot we reuse happened before it moved its head.
    let head = h.cons.prio_head.load(Ordering::Acquire);
    if head > tail || tail - head > PRIO_SLOTS as u64 {
        return Err(corrupt(
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
    let flag = if entry.barrier { LANE_FLAG } else { 0 };
    slot.kind_len.store(
        ((entry.kind as u64) << 32) | flag | payload.len() as u64,
        Ordering::Relaxed,
    );
    // SYNC POINT: Release, paired with the Acquire load of the tail in `lane_pop` (and
    // `lane_pending`): the slot's words are visible to whoever sees the new tail.
    #[cfg(not(shmflow_broken = "lane_relaxed"))]
    h.prio_tail.store(tail + 1, Ordering::Release);
    // Broken on purpose (loom only): the slot published without ordering its words.
    #[cfg(shmflow_broken = "lane_relaxed")]
    h.prio_tail.store(tail + 1, Ordering::Relaxed);
    Ok(true)
}

/// Consumer side: true if the lane holds an event at `head` (the consumer's own cursor).
/// Acquire: pairs with the producer's Release store of the tail in [`lane_push`].
#[inline]
pub(crate) fn lane_pending(h: &Header, head: u64) -> bool {
    h.prio_tail.load(Ordering::Acquire) != head
}

/// Producer side: true if the lane has room at `tail` (the producer's own cursor), without
/// checking the consumer's head (a head that makes no sense is left for [`lane_push`] to
/// report). Acquire: as in `lane_push`.
pub(crate) fn lane_has_room(h: &Header, tail: u64) -> bool {
    tail.wrapping_sub(h.cons.prio_head.load(Ordering::Acquire)) != PRIO_SLOTS as u64
}

/// Priority events sent up to `tail` that the consumer has not taken. Acquire: pairs with the
/// consumer's Release store of its head in [`lane_pop`].
pub(crate) fn lane_unread(h: &Header, tail: u64) -> u64 {
    tail.saturating_sub(h.cons.prio_head.load(Ordering::Acquire))
}

/// The producer's tail as it stands (Relaxed: for a listing or a message).
pub(crate) fn lane_tail(h: &Header) -> u64 {
    h.prio_tail.load(Ordering::Relaxed)
}

/// Consumer side: copies slot `head` into `buf` if the lane holds one. `Err(Corrupt)` if the
/// producer's tail or the slot's length make no sense.
pub(crate) fn lane_pop(
    h: &Header,
    head: u64,
    buf: &mut [u8; PRIO_PAYLOAD],
    region: &str,
) -> Result<Option<(Entry, usize)>> {
    // Acquire: pairs with the producer's Release of the tail.
    let tail = h.prio_tail.load(Ordering::Acquire);
    if tail == head {
        return Ok(None);
    }
    if tail < head || tail - head > PRIO_SLOTS as u64 {
        return Err(corrupt(
            region,
            "priority lane tail",
            format!("between {head} and {}", head + PRIO_SLOTS as u64),
            tail,
        ));
    }
    let slot = &h.prio[(head % PRIO_SLOTS as u64) as usize];
    let kl = slot.kind_len.load(Ordering::Relaxed);
    let barrier = kl & LANE_FLAG != 0;
    let (kind, len) = ((kl >> 32) as u32, (kl & 0xffff_ffff & !LANE_FLAG) as usize);
    if len > PRIO_PAYLOAD || (barrier && (kind != 0 || len < HEAD)) {
        return Err(corrupt(
            region,
            "priority event length",
            format!(
                "at most {PRIO_PAYLOAD} (at least {HEAD} and kind 0 for a barrier's \
                 announcement)"
            ),
            kl & 0xffff_ffff,
        ));
    }
    for (i, w) in slot.words.iter().enumerate().take(len.div_ceil(8)) {
        let b = w.load(Ordering::Relaxed).to_le_bytes();
        let n = (len - i * 8).min(8);
        buf[i * 8..i * 8 + n].copy_from_slice(&b[..n]);
    }
    // Release: our reads of the slot happen before the producer reuses it.
    h.cons.prio_head.store(head + 1, Ordering::Release);
    Ok(Some((Entry { kind, barrier }, len)))
}

#[cfg(all(test, not(shmflow_loom)))]
mod tests {
    use super::*;

    fn corrupt(r: Result<impl std::fmt::Debug>) -> String {
        match r {
            Err(e) => e.to_string(),
            other => panic!("not corrupt: {other:?}"),
        }
    }

    #[test]
    fn events_come_out_in_order_until_the_lane_is_full() {
        let h = Header::default();
        let mut buf = [0u8; PRIO_PAYLOAD];
        let slots = PRIO_SLOTS as u64;
        for t in 0..slots {
            let payload = vec![t as u8; t as usize * 5];
            assert!(lane_push(&h, t, Entry::event(100 + t as u32), &payload, "t").unwrap());
        }
        assert!(
            !lane_push(&h, slots, Entry::event(9), b"", "t").unwrap(),
            "full"
        );
        for head in 0..slots {
            let (e, len) = lane_pop(&h, head, &mut buf, "t").unwrap().unwrap();
            assert_eq!(
                (e, len),
                (Entry::event(100 + head as u32), head as usize * 5)
            );
            assert!(buf[..len].iter().all(|&b| b == head as u8));
        }
        assert_eq!(lane_pop(&h, slots, &mut buf, "t").unwrap(), None, "empty");
        // Room again after the pops, in the reused slots; a payload of the largest size.
        let big = [0xEE; PRIO_PAYLOAD];
        assert!(lane_push(&h, slots, Entry::event(7), &big, "t").unwrap());
        assert_eq!(
            lane_pop(&h, slots, &mut buf, "t").unwrap(),
            Some((Entry::event(7), PRIO_PAYLOAD))
        );
        assert_eq!(buf, big);
        // A barrier's announcement keeps its flag, and must be kind 0 and hold its head.
        let ann = Entry {
            kind: 0,
            barrier: true,
        };
        assert!(lane_push(&h, slots + 1, ann, &[1; HEAD], "t").unwrap());
        assert_eq!(
            lane_pop(&h, slots + 1, &mut buf, "t").unwrap(),
            Some((ann, HEAD))
        );
    }

    #[test]
    fn cursors_and_lengths_from_the_peer_are_checked() {
        let h = Header::default();
        let mut buf = [0u8; PRIO_PAYLOAD];
        // A consumer head past the producer's tail, or further behind than the lane holds.
        h.cons.prio_head.store(5, Ordering::Relaxed);
        assert!(corrupt(lane_push(&h, 3, Entry::event(1), b"", "t")).contains("priority lane head"));
        h.cons.prio_head.store(0, Ordering::Relaxed);
        corrupt(lane_push(
            &h,
            PRIO_SLOTS as u64 + 1,
            Entry::event(1),
            b"",
            "t",
        ));
        // A producer tail behind the head, or too far ahead.
        h.prio_tail.store(2, Ordering::Relaxed);
        assert!(corrupt(lane_pop(&h, 3, &mut buf, "t")).contains("priority lane tail"));
        h.prio_tail
            .store(3 + PRIO_SLOTS as u64 + 1, Ordering::Relaxed);
        corrupt(lane_pop(&h, 3, &mut buf, "t"));
        // A slot whose length is larger than a slot holds.
        h.prio_tail.store(1, Ordering::Relaxed);
        h.prio[0]
            .kind_len
            .store((1 << 32) | (PRIO_PAYLOAD as u64 + 1), Ordering::Relaxed);
        assert!(corrupt(lane_pop(&h, 0, &mut buf, "t")).contains("priority event length"));
        // An announcement with a kind, or shorter than a barrier's head.
        for kl in [(1 << 32) | LANE_FLAG | HEAD as u64, LANE_FLAG | 3] {
            h.prio[0].kind_len.store(kl, Ordering::Relaxed);
            assert!(corrupt(lane_pop(&h, 0, &mut buf, "t")).contains("for a barrier"));
        }
        assert_eq!(
            h.cons.prio_head.load(Ordering::Relaxed),
            0,
            "nothing consumed"
        );
    }
}
