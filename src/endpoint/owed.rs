//! Wake-ups a network bridge holds back. A bridge moves whole segments, several per socket
//! read or write: a local peer woken for each would switch in and out once per segment, and
//! on two CPUs those switches cost more than the segments' bytes. The bridge makes one wake-up
//! per batch instead, and the ones it holds before it waits for its peer or the remote side
//! (credit, frames, a message) and at the end of each batch of segments, so that its peer
//! sleeps on work that is there at most while the bridge's own socket write of that batch
//! waits (and never on more than a batch less one).

/// Wake-ups of the local peer held back for a batch.
#[derive(Debug, Default)]
pub(crate) struct Owed {
    /// Wake-ups per batch: 0 or 1 makes each at once (every end but a bridge's).
    batch: u8,
    /// Held since the last one made.
    held: u8,
}

impl Owed {
    /// One wake-up in every `batch`.
    pub(crate) fn new(batch: u8) -> Owed {
        Owed { batch, held: 0 }
    }

    /// A wake-up is due: true if it is to be made now (it makes the held ones too).
    #[inline]
    pub(crate) fn now(&mut self) -> bool {
        if self.batch <= 1 {
            return true;
        }
        self.held += 1;
        if self.held >= self.batch {
            self.held = 0;
            return true;
        }
        false
    }

    /// The held ones are to be made now: true if any was held.
    pub(crate) fn settle(&mut self) -> bool {
        std::mem::take(&mut self.held) > 0
    }
}

/// The batch for a channel of `segments`: a quarter of the pool, at most 8 (a socket read's
/// worth of the default segments), at least 1, so that a peer never waits for more than a
/// few segments.
pub(crate) fn batch_for(segments: u32) -> u8 {
    (segments / 4).clamp(1, 8) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_wake_in_a_batch_and_the_held_ones_when_settled() {
        let mut o = Owed::new(4);
        assert_eq!(
            (0..8).map(|_| o.now()).collect::<Vec<_>>(),
            [false, false, false, true, false, false, false, true]
        );
        assert!(!o.settle(), "nothing held after a batch");
        assert!(!o.now());
        assert!(o.settle());
        assert!(!o.settle());
        // A quarter of the pool, at most 8; the default wakes at once.
        assert_eq!(batch_for(64), 8);
        assert_eq!(batch_for(16), 4);
        assert_eq!(batch_for(8), 2);
        assert_eq!(batch_for(4), 1);
        let mut every = Owed::default();
        assert!(every.now() && every.now());
        assert!(!every.settle());
    }
}
