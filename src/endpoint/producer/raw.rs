//! The producer written segment by segment, for the network bridge that receives a remote
//! channel's segments as they are (feature `net`): each chunk of frames lands at the offset
//! it had on the sender, and is published the way the producer publishes its own frames
//! (every word but the first copied, the word past the end zeroed, then the first header
//! stored with Release).

use super::Producer;
use crate::error::SendError;

/// The receiving bridge writes as a producer does, and fails as one.
type Result<T> = std::result::Result<T, SendError>;
use crate::protocol::figures;
use crate::protocol::frame::{self, Tally, HEADER};

/// Why a received chunk cannot be written: the sender broke the protocol.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// A chunk for a new segment, but no segment is free (it was sent without credit).
    NoCredit,
    /// A chunk that does not continue the segment being written where it left off.
    Misplaced { expected: usize, found: usize },
    /// Bytes that do not fit the segment, or no whole header.
    Shape,
}

impl Producer {
    /// The bridge writes into a channel of its own and wakes its consumer with the
    /// read-modify-write only: tells the consumer so, so that it parks without the heavy
    /// barrier (`park::rmw_notifier`). Not for a gate channel, whose consumer's word the
    /// gate's other producers notify too, some with the light form.
    pub(crate) fn raw_rmw_notifier(&self) {
        if self.shared.gate.is_none() {
            crate::protocol::park::rmw_notifier(self.shared.consumer_park());
        }
    }

    /// The bridge wakes the consumer once per `batch` segments it commits, and makes the
    /// wake-ups it holds before it waits ([`Producer::raw_wake_owed`]).
    pub(crate) fn raw_batch_wakes(&mut self, batch: u8) {
        self.owed = crate::endpoint::owed::Owed::new(batch);
    }

    /// Makes the wake-ups held back (see [`Producer::raw_batch_wakes`]): before the bridge
    /// waits for its peer or the remote side, so that the consumer does not sleep on what was
    /// committed while the bridge waits.
    pub(crate) fn raw_wake_owed(&mut self) {
        if self.owed.settle() {
            self.notify_consumer();
        }
    }

    /// Free segments in the return ring: what the bridge may announce as credit.
    pub(crate) fn raw_free(&mut self) -> Result<u64> {
        // Within the consumer's cap (buffer debloating): credit is never more than it allows.
        Ok(self.free_now()?)
    }

    /// Segments taken and not given back by the consumer yet: what it has in hand or still
    /// to read.
    pub(crate) fn raw_unread(&self) -> u64 {
        self.in_flight()
    }

    /// Writes `bytes` (whole frames, checked by the caller with `frame::check`) at offset `at`
    /// of a segment and publishes them: `at == 0` takes a fresh segment, any other offset
    /// continues the segment in hand where the last chunk ended. `ends_segment`: the chunk
    /// finishes the segment (it ends with a SEAL frame or at the segment's end); `tally`: what
    /// its frames carry, as the check counted it.
    pub(crate) fn raw_write(
        &mut self,
        at: usize,
        bytes: &[u8],
        ends_segment: bool,
        tally: Tally,
    ) -> Result<std::result::Result<(), Refused>> {
        if let Err(r) = self.raw_place(at, bytes.len())? {
            return Ok(Err(r));
        }
        // Every byte but the first header word: nothing the consumer can reach before the
        // Release store of the commit.
        self.write_bytes(at + HEADER, &bytes[HEADER..]);
        let first = u64::from_le_bytes(bytes[..HEADER].try_into().expect("8 bytes"));
        self.raw_commit(at, first, bytes.len(), ends_segment, tally);
        Ok(Ok(()))
    }

    /// Makes room for a chunk of `len` bytes at offset `at` (as [`Producer::raw_write`]
    /// places it: `at == 0` takes a fresh segment, any other offset continues the segment in
    /// hand where the last chunk ended). Nothing is published: [`Producer::raw_commit`] does.
    pub(crate) fn raw_place(
        &mut self,
        at: usize,
        len: usize,
    ) -> Result<std::result::Result<(), Refused>> {
        self.check_gone()?;
        if self.consumer_detached() {
            return Err(self.closed_error());
        }
        let end = at + len;
        if len < HEADER || end > self.seg_size || at % 8 != 0 {
            return Ok(Err(Refused::Shape));
        }
        if at == 0 {
            if let Some(c) = &self.cur {
                return Ok(Err(Refused::Misplaced {
                    expected: c.wpos,
                    found: 0,
                }));
            }
            match self.try_take()? {
                Some(c) => self.cur = Some(c),
                None => return Ok(Err(Refused::NoCredit)),
            }
        }
        let Some(c) = self.cur else {
            return Ok(Err(Refused::Misplaced {
                expected: 0,
                found: at,
            }));
        };
        if c.wpos != at {
            return Ok(Err(Refused::Misplaced {
                expected: c.wpos,
                found: at,
            }));
        }
        Ok(Ok(()))
    }

    /// The bytes `at + HEADER .. at + len` of the segment in hand, placed by
    /// [`Producer::raw_place`], for the caller to fill (from a socket) before the commit: in a
    /// region only this process maps, whose consumer reads nothing of a chunk before its
    /// commit (a direct network end, filled by the consumer's thread or its keeper, one at a
    /// time), so nobody reads them before the commit. The first header word stays out:
    /// the commit stores it.
    pub(crate) fn raw_slice(&mut self, at: usize, len: usize) -> &mut [u8] {
        let c = self.cur.expect("placed by raw_place");
        assert!(c.wpos == at && len >= HEADER && at + len <= self.seg_size);
        self.shared
            .tracker
            .write(c.seg as usize, at + HEADER, len - HEADER);
        // SAFETY: inside the segment in hand (asserted), whose bytes past the published
        // frames only this producer writes, and which nothing reads before the commit (the
        // first header word, outside this slice, still holds 0); the slice borrows `self`
        // mutably, so no other access of this producer overlaps it.
        unsafe { std::slice::from_raw_parts_mut(c.base.add(at + HEADER), len - HEADER) }
    }

    /// Publishes the chunk of `len` bytes placed at `at` (its bytes after the first header
    /// word written), whose first header word is `first`, as the producer publishes its own
    /// frames: the word past the end zeroed, then the first header stored with Release.
    /// `tally` (what its frames carry, counted by the check) goes to the producer's counters.
    pub(crate) fn raw_commit(
        &mut self,
        at: usize,
        first: u64,
        len: usize,
        ends_segment: bool,
        tally: Tally,
    ) {
        let c = self.cur.expect("placed by raw_place");
        let end = at + len;
        assert!(c.wpos == at && len >= HEADER && end <= self.seg_size);
        let after = (!ends_segment && end + HEADER <= self.seg_size).then(|| {
            // SAFETY: `end` is 8-aligned (a frame boundary: the caller checked the frames)
            // and `end + 8 <= segment_size` (checked here); the segment is in our hand.
            unsafe { self.shared.word_in(c.base, c.seg, end) }
        });
        // SAFETY: `at` is 8-aligned and `at + 8 <= end <= segment_size` (checked in
        // `raw_place` and above); the segment is in our hand.
        let slot = unsafe { self.shared.word_in(c.base, c.seg, at) };
        // The same commit as the producer's own (see `frame::commit`).
        frame::commit(slot, first, after);
        let h = self.shared.header();
        let c = &mut self.counters;
        figures::chunk_written(
            h,
            &mut c.records,
            &mut c.bytes,
            tally.records,
            tally.payload,
        );
        if ends_segment {
            self.cur = None;
            figures::segment_committed(h, &mut self.counters.committed);
        } else if let Some(c) = &mut self.cur {
            c.wpos = end;
        }
        if self.owed.now() {
            self.notify_consumer();
        }
    }

    /// Asks the channel's gate for `n` more floating segments (the remote sender's backlog).
    /// Nothing for a channel of its own.
    pub(crate) fn raw_ask(&mut self, n: u64) {
        if n > 0 && self.supply.ask_more(self.shared.header(), n) {
            self.notify_consumer();
        }
    }

    /// Floating segments asked for and not granted yet, as far as the gate's published
    /// figure says (a figure for statistics: a wrong value only makes the bridge ask for
    /// too many or too few).
    pub(crate) fn raw_unmet(&self) -> u64 {
        self.supply.unmet(self.shared.header())
    }

    /// Waits in the executor until `enough(free, unread)` holds for the segments free (as
    /// [`Producer::raw_free`] counts them) and those the consumer has yet to give back
    /// ([`Producer::raw_unread`]), looked at again each time the consumer gives one back, or
    /// until the consumer leaves (`Closed`) or dies (`PeerDead`). Counted as backpressure.
    pub(crate) async fn raw_wait_free(&mut self, enough: impl Fn(u64, u64) -> bool) -> Result<()> {
        self.wait_async(|p, look| {
            if enough(p.free_now()?, p.in_flight()) {
                return Ok(Some(()));
            }
            if p.consumer_detached() {
                return Err(p.closed_error());
            }
            p.check_peer(look)?;
            Ok(None)
        })
        .await
    }

    /// Publishes the receiving bridge's figures for `shmflow stat`.
    pub(crate) fn raw_figures(&self, credit: u64, backlog: u64, wire: u64) {
        crate::protocol::figures::link_receiving(self.shared.header(), credit, backlog, wire);
    }

    /// The bridge lost its remote peer: end the stream as `LOST`, so that the consumer
    /// reads what arrived and then reports the producer dead. A segment written half-way
    /// keeps what was published of it.
    pub(crate) fn raw_lose(mut self) {
        if !self.closed {
            self.closed = true;
            self.flusher = None;
            self.cur = None;
            let h = self.shared.header();
            // Every chunk published above is visible to a consumer that sees LOST (see
            // `EndSlot::leave`).
            h.producer_end().leave(crate::protocol::ends::Leave::Lost);
            self.notify_consumer();
            self.settle_name();
        }
    }
}
