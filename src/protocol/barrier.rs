//! How a checkpoint barrier is carried. In band, a barrier is an `EVENT` frame whose kind word
//! (the frame's first 8 bytes, the event's kind in the low half) has [`TAG`] in its high half,
//! which an ordinary event leaves 0. Through the priority lane, its announcement is a slot
//! whose length half has [`LANE_FLAG`] set. Either way the body is [`HEAD`] bytes — the
//! checkpoint id, the emitter's monotonic clock at sending, the alignment timeout in
//! nanoseconds (`u64::MAX`: aligned; 0: unaligned), little-endian — then the user's payload.
//! Both travel as events do, so whatever forwards events (the network bridges) forwards
//! barriers unchanged; the bridge's priority message carries the lane flag.

/// The high half of an in-band barrier's kind word.
pub(crate) const TAG: u32 = 0x4252_5252;
/// Set in the length half of a lane slot that holds a barrier's announcement.
pub(crate) const LANE_FLAG: u64 = 1 << 31;
/// Bytes of a barrier before the user's payload.
pub(crate) const HEAD: usize = 24;

/// A barrier's fixed part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) id: u64,
    pub(crate) emitted_ns: u64,
    pub(crate) timeout_ns: u64,
}

impl Head {
    pub(crate) fn encode(&self) -> [u8; HEAD] {
        let mut b = [0u8; HEAD];
        b[..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..16].copy_from_slice(&self.emitted_ns.to_le_bytes());
        b[16..].copy_from_slice(&self.timeout_ns.to_le_bytes());
        b
    }

    /// The fixed part and the payload of a barrier's body, or `None` if it is too short.
    pub(crate) fn decode(body: &[u8]) -> Option<(Head, &[u8])> {
        if body.len() < HEAD {
            return None;
        }
        let word = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().expect("8 bytes"));
        Some((
            Head {
                id: word(0),
                emitted_ns: word(8),
                timeout_ns: word(16),
            },
            &body[HEAD..],
        ))
    }
}

/// What an `EVENT` frame's kind word says: an event of this kind, a barrier, a latency marker
/// (`protocol::latency`), or none of them (a high half a correct producer does not write).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KindWord {
    Event(u32),
    Barrier,
    Marker,
    Bad,
}

pub(crate) fn kind_word(word: u64) -> KindWord {
    match (word >> 32) as u32 {
        0 => KindWord::Event(word as u32),
        TAG if word as u32 == 0 => KindWord::Barrier,
        crate::protocol::latency::TAG if word as u32 == 0 => KindWord::Marker,
        _ => KindWord::Bad,
    }
}

/// The kind word of an in-band barrier.
pub(crate) const fn barrier_word() -> u64 {
    (TAG as u64) << 32
}

#[cfg(all(test, not(shmflow_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_barrier_round_trips_and_its_kind_word_is_told_from_an_event() {
        let h = Head {
            id: 7,
            emitted_ns: 123,
            timeout_ns: u64::MAX,
        };
        let mut body = h.encode().to_vec();
        body.extend_from_slice(b"p");
        assert_eq!(Head::decode(&body), Some((h, &b"p"[..])));
        assert_eq!(Head::decode(&body[..HEAD - 1]), None);
        assert_eq!(kind_word(barrier_word()), KindWord::Barrier);
        assert_eq!(
            kind_word(crate::protocol::latency::marker_word()),
            KindWord::Marker
        );
        assert_eq!(
            kind_word(crate::protocol::latency::marker_word() | 3),
            KindWord::Bad
        );
        assert_eq!(kind_word(42), KindWord::Event(42));
        assert_eq!(kind_word(barrier_word() | 1), KindWord::Bad);
        assert_eq!(kind_word(1 << 40), KindWord::Bad);
    }
}
