//! Segment hand-off: taking free segments from the return ring (within the debloating cap),
//! publishing written ones on the data ring, waking the consumer, and sealing a segment to
//! move on to the next.

#[allow(unused_imports)]
use super::*;

impl Producer {
    /// Takes a free segment if one is there, and hands it to the consumer at once.
    pub(super) fn try_take(&mut self) -> Result<Option<Current>, Box<CorruptError>> {
        let Some(seg) = self.ret.pop(&self.shared.return_ring())? else {
            return Ok(None);
        };
        self.supply.got();
        // The segment's first word ends its (empty) list of frames. Relaxed: published by the
        // Release push below; the consumer's last look at this word happened before it
        // returned the segment (its Release push, our Acquire pop).
        frame::clear(self.shared.word(seg, 0));
        self.data.push(&self.shared.data_ring(), seg)?;
        let h = self.shared.header();
        self.seg_end = debloat::end_of(debloat::fill(h), self.seg_size);
        figures::segment_acquired(h, &mut self.counters.acquired);
        Ok(Some(Current {
            seg,
            base: self.shared.segment_ptr(seg),
            wpos: 0,
            pending: None,
        }))
    }

    /// Segments taken and not yet finished by the consumer (the one in hand included).
    #[inline]
    pub(super) fn in_flight(&self) -> u64 {
        debloat::in_flight(self.shared.header(), self.counters.acquired.0)
    }

    /// Buffer debloating: true while as many segments are in flight as the consumer's cap
    /// allows, so that a record may not start a new one.
    #[inline]
    pub(super) fn capped(&self) -> bool {
        let cap = debloat::cap(self.shared.header());
        cap != 0 && self.in_flight() >= cap
    }

    /// Segments the consumer's cap lets the producer take now (`u64::MAX` without a cap).
    #[cfg_attr(any(not(feature = "net"), shmflow_loom), allow(dead_code))]
    pub(crate) fn cap_room(&self) -> u64 {
        match debloat::cap(self.shared.header()) {
            0 => u64::MAX,
            cap => cap.saturating_sub(self.in_flight()),
        }
    }

    /// Segments a record could take now: the free ones, as far as the consumer's cap allows.
    #[cfg_attr(any(not(feature = "net"), shmflow_loom), allow(dead_code))]
    pub(crate) fn free_now(&mut self) -> Result<u64, Box<CorruptError>> {
        let ready = self.ret.ready(&self.shared.return_ring())?;
        Ok(ready.min(self.cap_room()))
    }

    /// Takes a segment, waiting for the consumer to return one (this wait is backpressure).
    /// `Bound::Capped`: a record that starts here waits for the consumer's cap too (buffer
    /// debloating); the rest of a record that spans segments, and an abort notice, do not, so
    /// the cap never cuts a record.
    pub(super) fn take<P: Patience>(&mut self, patience: P, bound: Bound) -> Sent<(), P> {
        debug_assert!(self.cur.is_none());
        // A consumer that left is noticed at every segment taken (a load per segment), not
        // only once the free segments run out: at most the segment in hand of what is sent
        // after it left is accepted (and lost with the channel).
        if self.consumer_detached() {
            return Err(self.closed_error().into());
        }
        let capped = bound == Bound::Capped && self.capped();
        if !capped {
            if let Some(c) = self.try_take()? {
                self.cur = Some(c);
                return Ok(());
            }
        }
        if !capped {
            self.ask_for_segment();
        }
        let shared = self.shared.clone();
        let h = shared.header();
        let blocked = Waiting::start(figures::backpressure(h));
        // `PARK_AT_ONCE` segments or more of this producer's are in flight (no cap holds it
        // back: it waits for a segment to come back): the consumer has all of them to read
        // before a late wake-up of this producer could leave it idle, so `Block` parks at
        // once instead of looking (its looks would only take CPU time from the consumer, or
        // from a bridge forwarding the channel, on a machine with few CPUs).
        let wait = match self.wait {
            WaitStrategy::Block if !capped && self.in_flight() >= PARK_AT_ONCE => {
                WaitStrategy::Park
            }
            w => w,
        };
        let got = self.wait_producer_as::<P, _, SendError>(wait, patience, |p, look| {
            if !(bound == Bound::Capped && p.capped()) {
                if let Some(c) = p.try_take()? {
                    return Ok(Some(c));
                }
                // (Once per wait: a cap that lifted may leave the producer short.)
                p.ask_for_segment();
            }
            if p.consumer_detached() {
                return Err(p.closed_error());
            }
            p.check_peer(look)?;
            Ok(None)
        });
        drop(blocked);
        self.cur = Some(got?);
        Ok(())
    }

    /// Out of segments: asks the channel's owner for more (a gate lends a floating segment;
    /// a channel of its own has nobody to ask). This is the channel's backlog, in Flink's terms.
    pub(super) fn ask_for_segment(&mut self) {
        if self.supply.ask(self.shared.header()) {
            self.notify_consumer();
        }
    }

    #[inline]
    pub(super) fn notify_consumer(&mut self) {
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if let Some(l) = &mut self.link {
            // A direct network end: the socket is the consumer.
            l.pump();
            return;
        }
        if park::notify::<Host>(self.shared.consumer_park(), self.shared.consumer_bell()) {
            self.count_wake();
        }
    }

    #[cold]
    pub(super) fn count_wake(&mut self) {
        figures::consumer_woken(self.shared.header(), &mut self.counters.wakes);
    }

    /// Makes everything written to the current segment visible and wakes the consumer.
    pub(super) fn publish(&mut self) {
        self.publish_counts();
        if self.store_commit() {
            self.notify_consumer();
        }
    }

    /// Publishes every frame written to the current segment: zeroes the word at the write
    /// position (the new end of the list) and stores the first unpublished header with
    /// Release. True if there was something to publish. The wake-up is the caller's business
    /// (`publish` now, the flusher later).
    #[inline]
    pub(super) fn store_commit(&mut self) -> bool {
        self.store_commit_inner(true)
    }

    /// As `store_commit`; `terminate` false after a SEAL frame, which ends the segment by
    /// itself (and past which a streamed record being moved may still lie).
    #[inline(always)]
    pub(super) fn store_commit_inner(&mut self, terminate: bool) -> bool {
        let Some(c) = &mut self.cur else { return false };
        let Some((at, word)) = c.pending.take() else {
            return false;
        };
        let seg_size = self.seg_size;
        let end = (terminate && c.wpos + HEADER <= seg_size).then(|| {
            // SAFETY: `base` is the segment's start (cached at take); `wpos` is a frame
            // boundary (8-aligned) and `wpos + 8 <= segment_size` (checked above).
            unsafe { self.shared.word_in(c.base, c.seg, c.wpos) }
        });
        assert!(at + HEADER <= seg_size);
        // SAFETY: `at` is the 8-aligned start of a frame written in this segment, inside it
        // (asserted).
        let slot = unsafe { self.shared.word_in(c.base, c.seg, at) };
        frame::commit(slot, word, end);
        true
    }

    /// Seals the current segment: a SEAL frame at the writer position (none if the segment
    /// is full), everything published; the consumer returns it once read.
    pub(super) fn seal(&mut self) {
        let Some(c) = &mut self.cur else { return };
        let sealed = c.wpos + HEADER <= self.seg_size;
        if sealed {
            let at = c.wpos;
            c.wpos += HEADER;
            self.write_header(at, 0, frame::SEAL);
        }
        self.store_commit_inner(!sealed);
        self.publish_counts();
        self.cur = None;
        figures::segment_committed(self.shared.header(), &mut self.counters.committed);
        self.notify_consumer();
    }

    /// Makes sure `need` bytes are free in the current segment, sealing it and taking the next
    /// if not.
    #[inline]
    pub(super) fn ensure_room<P: Patience>(&mut self, need: usize, patience: P) -> Sent<(), P> {
        // Fast path (almost every record): room left in the segment in hand.
        // (A pending abort comes only with no segment in hand: it goes the slow way.)
        if self.fits_in_hand(need) {
            return Ok(());
        }
        self.ensure_room_slow(need, patience)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn ensure_room_slow<P: Patience>(
        &mut self,
        need: usize,
        patience: P,
    ) -> Sent<(), P> {
        self.check_gone()?;
        if self.pending_abort {
            self.write_pending_abort(patience)?;
        }
        if let Some(c) = &self.cur {
            if c.wpos + need <= self.seg_end {
                return Ok(());
            }
            self.seal();
        }
        self.take(patience, Bound::Capped)?;
        // A record longer than a debloated segment's fill goes whole in the fresh one, and
        // alone: the next record starts in the next segment.
        if let Some(c) = &self.cur {
            if c.wpos + need > self.seg_end {
                self.seg_end = frame::align8(c.wpos + need).min(self.seg_size);
            }
        }
        Ok(())
    }

    pub(super) fn write_pending_abort<P: Patience>(&mut self, patience: P) -> Sent<(), P> {
        debug_assert!(self.cur.is_none());
        self.take(patience, Bound::Free)?;
        let c = self.cur.as_mut().expect("just taken");
        let at = c.wpos;
        c.wpos = frame::next_frame(at, 0);
        self.write_header(at, 0, frame::ABORT);
        self.pending_abort = false;
        self.after_frame_end();
        Ok(())
    }

    // ----- writing bytes ---------------------------------------------------------------------
}
