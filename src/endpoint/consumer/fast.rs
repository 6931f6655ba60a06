//! The receiving fast path (a whole record in the segment in hand), the counters it bumps,
//! and the metrics a user reads.

#[allow(unused_imports)]
use super::*;

impl Consumer {
    /// Turns the per-record counters (records and bytes read) on or off; segment counts and
    /// idle time are always kept.
    pub fn set_metrics(&mut self, on: bool) {
        self.metrics = on;
    }

    /// The channel's counters now (both sides', as the region shows them). Record and byte
    /// counts are published in batches: the producer's every 64 records (under per-record
    /// policies) and at flushes and segment ends, the consumer's every 16 records, after each `drain`, and
    /// whenever it finds nothing to read. Records written are shown as at least records read.
    pub fn metrics(&self) -> crate::endpoint::metrics::Snapshot {
        self.publish_counts();
        crate::endpoint::metrics::snapshot(&self.shared)
    }

    #[inline]
    pub(super) fn count_record(&mut self, len: u64) {
        if !self.metrics {
            return;
        }
        self.counters.records.bump(1);
        self.counters.bytes.bump(len);
        // Published every 16 records, and whenever the consumer moves to another segment or
        // finds nothing to read: two shared stores per record cost 10–15 % at 100 M records/s.
        if self.counters.records.0 % 16 == 0 {
            self.publish_counts();
        }
    }

    /// Publishes the per-record counters.
    pub(super) fn publish_counts(&self) {
        let h = self.shared.header();
        figures::records_read(h, &self.counters.records, &self.counters.bytes);
    }

    /// Moves past the rest of a spanning record that was dropped unread.
    pub(super) fn skip_rest<P: Patience>(&mut self, patience: P) -> Got<(), P> {
        while self.skipping {
            let f = match self.wait_frame::<P, Infallible>(patience)? {
                Waited::Frame(f) => f,
                Waited::End => {
                    self.skipping = false;
                    self.in_span = false;
                    return Ok(());
                }
                Waited::Priority(never) => match never {},
            };
            self.advance(f);
            if f.kind != frame::MIDDLE {
                self.skipping = false;
                self.in_span = false;
            }
        }
        Ok(())
    }

    /// Fast path (almost every record): a whole-record frame already committed in the segment
    /// in hand. Anything else — a span, the end of the segment, or a header that does not
    /// check out — goes through `poll_frame`, which validates it fully and names the error.
    #[inline]
    pub(super) fn fast_whole(&mut self) -> Option<(usize, *const u8)> {
        if self.skipping || self.in_span {
            return None;
        }
        self.fast_whole_inner()
    }

    /// [`Consumer::fast_whole`] for a caller that knows it is neither in a span nor skipping
    /// (`recv`'s fast path). `try_drain` runs the same checks (`frame::whole_fast`) on locals
    /// of its own, kept in registers across its closure.
    #[inline(always)]
    pub(super) fn fast_whole_inner(&mut self) -> Option<(usize, *const u8)> {
        let (seg_size, max) = (self.seg_size, self.fast_max);
        let c = self.cur.as_mut()?;
        let at = c.rd;
        if at + HEADER > seg_size {
            return None;
        }
        // SAFETY: `base` is the segment's start (cached at pop), `at + 8 <= segment_size`
        // (checked above), `at` 8-aligned (a frame boundary). Acquire: as in `poll_frame`.
        let word = frame::load(unsafe { self.shared.word_in(c.base, c.seg, at) });
        let (len, next) = frame::whole_fast(word, at, seg_size, max)?;
        c.rd = next;
        prefetch_ahead(c, seg_size);
        // SAFETY: `at + 8 + len <= next <= segment_size` (`whole_fast`).
        Some((len, unsafe { c.base.add(at + HEADER) }))
    }

    /// Moves back over the whole record of `len` bytes that [`Consumer::fast_whole`] just
    /// returned (not counted yet): the next read returns it again.
    #[inline]
    pub(super) fn unread_whole(&mut self, len: usize) {
        if let Some(c) = self.cur.as_mut() {
            c.rd -= frame::align8(HEADER + len);
        }
    }

    /// A record within the segment in hand, at `at`.
    pub(super) fn single(&self, at: usize, len: usize) -> RecordKind {
        let c = self.cur.as_ref().expect("a segment in hand");
        RecordKind::Single {
            len,
            // SAFETY: `at + len <= segment_size` (validated by `parse`).
            ptr: unsafe { c.base.add(at) },
        }
    }
}
