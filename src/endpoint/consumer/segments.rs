//! Segments and frames: taking the next segment from the data ring, checking each frame
//! header before use, moving past what was read and giving segments back to the producer.

#[allow(unused_imports)]
use super::*;

impl Consumer {
    pub(super) fn release_current(&mut self) -> Result<(), Box<CorruptError>> {
        let Some(c) = self.cur.take() else {
            return Ok(());
        };
        self.publish_counts();
        if self.keep_if_held(c.seg, c.rd) {
            // Views of its records are still out (`Record::hold_segment`): it goes back when
            // the last hold is released.
            return Ok(());
        }
        self.recycle(c.seg, c.rd)
    }

    /// Gives a finished segment (read up to `rd`) back to where it came from.
    pub(super) fn recycle(&mut self, seg: u32, rd: usize) -> Result<(), Box<CorruptError>> {
        let h = self.shared.header();
        let back = self.recycler.release(h, seg);
        figures::segment_returned(h, &mut self.counters.returned);
        // Before the wake-up below (see `publish_done`). (Broken on purpose, loom only: late,
        // or never.)
        #[cfg(not(any(
            shmflow_broken = "debloat_done_late",
            shmflow_broken = "debloat_done_never"
        )))]
        debloat::publish_done(h, self.counters.returned.0);
        match back {
            Some(seg) => self.give(seg)?,
            // Back to the gate: a producer held back by the cap still learns of it.
            None if self.debloat.is_some() => self.wake_producer(),
            None => {}
        }
        #[cfg(shmflow_broken = "debloat_done_late")]
        debloat::publish_done(self.shared.header(), self.counters.returned.0);
        if self.debloat.is_some() {
            self.debloat_sample(rd.min(self.seg_size) as u64);
        }
        Ok(())
    }

    /// Wakes the producer if it waits.
    pub(super) fn wake_producer(&mut self) {
        let h = self.shared.header();
        if park::notify::<Host>(h.producer_park(), self.shared.producer_bell()) {
            figures::producer_woken(h, &mut self.counters.wakes);
        }
    }

    /// Pushes a segment into the return ring and wakes the producer (a sending bridge: once
    /// per batch, and before it waits, `raw_wake_owed`).
    pub(super) fn give(&mut self, seg: u32) -> Result<(), Box<CorruptError>> {
        // Release (inside push): our reads of the segment happen before the producer reuses it.
        self.ret.push(&self.shared.return_ring(), seg)?;
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if !self.owed.now() {
            return Ok(());
        }
        self.wake_producer();
        Ok(())
    }

    /// Checks the published header `word` of the frame at `c.rd`.
    pub(super) fn parse(&self, c: ReadSeg, word: u64) -> Result<Frame, Box<CorruptError>> {
        match frame::check(c.rd, word, self.seg_size, self.in_span) {
            Ok(f) => Ok(Frame {
                at: c.rd,
                len: f.len,
                kind: f.kind,
            }),
            Err(v) => Err(self.corrupt(v.field, v.expected, v.found)),
        }
    }

    /// The next published frame, if any, without waiting. Does not move past it.
    pub(super) fn poll_frame(&mut self) -> Result<Option<Frame>, Box<CorruptError>> {
        let mut hops = 0;
        let seg_size = self.seg_size;
        loop {
            let Some(c) = self.cur else {
                if !self.take_next()? {
                    return Ok(None);
                }
                continue;
            };
            if c.rd + HEADER <= seg_size {
                // Acquire: pairs with the producer's Release store of the first header of
                // what it publishes, so every frame up to the next 0 is visible.
                let word = frame::load(self.shared.word(c.seg, c.rd));
                if word == 0 {
                    return Ok(None);
                }
                let f = self.parse(c, word)?;
                if f.kind != frame::SEAL {
                    if !c.complete && self.data.ready(&self.shared.data_ring())? > 0 {
                        // The producer has moved on since we took this segment: it is
                        // complete now, and prefetching ahead in it is safe.
                        if let Some(cur) = &mut self.cur {
                            cur.complete = true;
                        }
                    }
                    return Ok(Some(f));
                }
            }
            // Read to its end, or sealed: the producer writes nothing more in it.
            self.release_current()?;
            hops += 1;
            if hops > self.shared.n() {
                return Ok(None);
            }
        }
    }

    /// Takes the next segment off the data ring into hand, if there is one.
    pub(super) fn take_next(&mut self) -> Result<bool, Box<CorruptError>> {
        debug_assert!(self.cur.is_none());
        let Some(seg) = self.data.pop(&self.shared.data_ring())? else {
            return Ok(false);
        };
        if let Err(e) = self.recycler.check(seg) {
            return Err(self.corrupt(
                "segment index in data ring",
                format!(
                    "one of the channel's segments {:?} or a floating segment lent to it",
                    e.exclusive
                ),
                seg as u64,
            ));
        }
        if self.is_held(seg) {
            return Err(self.corrupt(
                "segment index in data ring",
                "a segment the consumer has not given back (it is held)".to_string(),
                seg as u64,
            ));
        }
        let complete = self.data.ready(&self.shared.data_ring())? > 0;
        self.cur = Some(ReadSeg {
            seg,
            base: self.shared.segment_ptr(seg),
            rd: 0,
            complete,
        });
        figures::segment_taken(self.shared.header(), &mut self.counters.taken);
        Ok(true)
    }

    pub(super) fn advance(&mut self, f: Frame) {
        let c = self.cur.as_mut().expect("a segment in hand");
        c.rd = frame::next_frame(f.at, f.len);
    }
}
