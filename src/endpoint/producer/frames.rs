//! Writing frames into the segment in hand: headers and bytes, publishing per the flush
//! policy, and the counters and metrics of what was written.

#[allow(unused_imports)]
use super::*;

impl Producer {
    #[inline]
    pub(super) fn seg_ptr(&self) -> *mut u8 {
        self.cur.as_ref().expect("a segment in hand").base
    }

    /// Writes the header of the frame at `at`: held back if it is the first unpublished frame
    /// (its slot stays 0 until `store_commit`), else stored at once — the consumer cannot
    /// reach it before the first one is published.
    #[inline]
    pub(super) fn write_header(&mut self, at: usize, len: u32, kind: u32) {
        let c = self.cur.as_mut().expect("a segment in hand");
        debug_assert!(at % 8 == 0 && at + HEADER <= self.seg_size);
        let word = frame::encode(len, kind);
        if c.pending.is_none() {
            c.pending = Some((at, word));
        } else {
            assert!(at + HEADER <= self.seg_size);
            // SAFETY: `base` is the segment's start (cached at take), `at` is 8-aligned and
            // inside (asserted). Relaxed: published by the Release store of the first pending
            // header.
            frame::write_unpublished(unsafe { self.shared.word_in(c.base, c.seg, at) }, word);
        }
    }

    #[inline]
    pub(super) fn write_bytes(&self, at: usize, bytes: &[u8]) {
        let c = self.cur.as_ref().expect("a segment in hand");
        assert!(at + bytes.len() <= self.seg_size);
        self.shared.tracker.write(c.seg as usize, at, bytes.len());
        // SAFETY: in bounds (asserted), the segment is ours (see `write_header`), and `bytes`
        // cannot overlap shared memory that we are writing.
        unsafe { copy_record(bytes, self.seg_ptr().add(at)) };
    }

    /// A frame ended (record, or abort): publish according to the policy.
    #[inline(always)]
    pub(super) fn after_frame_end(&mut self) {
        match self.per_record {
            // The throughput setting does nothing per record.
            PerRecord::Nothing => {}
            // The default: two stores and a load (see `publish_record`), kept inline.
            PerRecord::Publish => self.publish_record(),
            PerRecord::PublishMarked => self.publish_per_policy(),
        }
    }

    /// Publishes the frame just ended and wakes the consumer if it announced that it sleeps
    /// (the counters go out every `COUNTS_EVERY` records, at segment ends and flushes).
    #[inline(always)]
    pub(super) fn publish_record(&mut self) {
        if self.metrics && self.counters.records.0 % COUNTS_EVERY == 0 {
            self.publish_counts();
        }
        if self.store_commit_inner(true) {
            if self.light {
                if park::notify_light::<Host>(self.shared.consumer_park(), || {
                    self.shared.consumer_bell()
                }) {
                    self.count_wake();
                }
            } else {
                self.notify_consumer();
            }
        }
    }

    #[inline(never)]
    pub(super) fn publish_per_policy(&mut self) {
        if self.metrics && self.counters.records.0 % COUNTS_EVERY == 0 {
            self.publish_counts();
        }
        match self.policy {
            FlushPolicy::Explicit => {}
            FlushPolicy::EveryRecord => self.publish(),
            // A direct network end: published into its region now, forwarded with the next
            // segment or flush, or by its keeper thread within the interval.
            #[cfg(all(feature = "net", not(shmflow_loom)))]
            FlushPolicy::Timeout(d) if self.link.is_some() => {
                if self.store_commit() {
                    if let Some(l) = &mut self.link {
                        l.defer(d);
                    }
                }
            }
            FlushPolicy::Timeout(_) => {
                #[cfg(not(shmflow_loom))]
                {
                    // Publish the frame now (one Release store) and leave the wake-up to the
                    // flusher, which makes at most one per interval.
                    if self.store_commit() {
                        let interval = policy_interval(self.policy);
                        let marked = self
                            .flusher
                            .get_or_insert_with(|| {
                                crate::endpoint::flusher::Flusher::start(
                                    self.shared.clone(),
                                    interval,
                                )
                            })
                            .mark_pending();
                        if !marked {
                            // No flusher thread could be started: wake now.
                            self.notify_consumer();
                        }
                    }
                }
                #[cfg(shmflow_loom)]
                self.publish();
            }
        }
    }

    #[inline(always)]
    pub(super) fn record_done(&mut self, len: u64) {
        self.records_done(1, len);
    }

    /// `n` frames of `bytes` bytes in all ended: count them, publish as the policy says, and
    /// send a latency marker if one is due — once for them all.
    #[inline(always)]
    pub(super) fn records_done(&mut self, n: u64, bytes: u64) {
        if self.metrics {
            let before = self.counters.records.0;
            self.counters.records.bump(n);
            self.counters.bytes.bump(bytes);
            // The per-record publishers publish the counts at each multiple of
            // `COUNTS_EVERY`; a batch can step over one: publish them here then.
            let now = self.counters.records.0;
            if n > 1
                && !matches!(self.per_record, PerRecord::Nothing)
                && before / COUNTS_EVERY != now / COUNTS_EVERY
                && now % COUNTS_EVERY != 0
            {
                self.publish_counts();
            }
        }
        self.after_frame_end();
        // A latency marker due: a load of the marker clock's counter (never due when off).
        #[cfg(not(shmflow_loom))]
        if crate::endpoint::markers::ticks() >= self.marker_at {
            self.marker_due();
        }
    }

    /// Publishes the per-record counters.
    pub(super) fn publish_counts(&self) {
        let h = self.shared.header();
        figures::records_written(h, &self.counters.records, &self.counters.bytes);
    }

    /// Turns the per-record counters (records and bytes written) on or off; segment counts
    /// and backpressured time are always kept. On by default: they cost two stores per record
    /// to a line only this side writes.
    pub fn set_metrics(&mut self, on: bool) {
        self.metrics = on;
    }

    /// The channel's counters now (both sides', as the region shows them; the peer publishes
    /// its per-record counts at segment boundaries, flushes and waits).
    pub fn metrics(&self) -> crate::endpoint::metrics::Snapshot {
        self.publish_counts();
        crate::endpoint::metrics::snapshot(&self.shared)
    }
}
