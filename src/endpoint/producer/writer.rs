//! Serializing in place: a [`Claim`] of a known length, a [`RecordWriter`] that streams a
//! record of any length (spanning segments if it must), and the calls that make them.

use std::io;
use std::time::{Duration, Instant};

use super::Producer;
use crate::error::{
    aborted, too_large, RecordAbortedError, SendError, SendTimeoutError, TrySendError, WriteError,
};
use crate::protocol::frame::{self, HEADER};
use crate::protocol::park::{Deadline, Forever, Immediately, Patience, Until};

use super::Sent;

impl Producer {
    #[inline]
    pub(super) fn claim_inner<P: Patience>(
        &mut self,
        len: usize,
        patience: P,
    ) -> Sent<Claim<'_>, P> {
        // Room in the segment in hand implies that the record fits a segment: test that first.
        // (Written so that no sum can wrap, whatever `len` is.)
        let fits_here = matches!(&self.cur,
            Some(c) if self.seg_end >= c.wpos && self.seg_end - c.wpos >= HEADER
                && len <= self.seg_end - c.wpos - HEADER);
        if !fits_here && len > self.seg_size - HEADER {
            return Err(too_large(
                &self.shared.name,
                "a claimed record",
                len as u64,
                self.max_unspanned_len() as u64,
            )
            .into());
        }
        if !fits_here {
            self.ensure_room_slow(HEADER + len, patience)?;
        }
        let c = self.cur.as_ref().expect("a segment in hand");
        let at = c.wpos;
        self.shared.tracker.write(c.seg as usize, at + HEADER, len);
        Ok(Claim {
            producer: self,
            at,
            len,
        })
    }

    /// Claims `len` bytes inside shared memory for one record, to serialize into in place
    /// (zero copy). The record is sent by [`Claim::commit`]; dropping the claim sends nothing.
    /// `len` must be at most [`Producer::max_unspanned_len`].
    ///
    /// # Errors
    /// [`SendError::RecordTooLarge`] if `len` does not fit in one segment; otherwise as
    /// [`Producer::send`].
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// let mut claim = tx.claim(16)?; // 16 bytes in shared memory
    /// claim[..8].copy_from_slice(&7u64.to_le_bytes());
    /// claim[8..].copy_from_slice(&9u64.to_le_bytes());
    /// claim.commit();
    /// tx.flush()?;
    /// let r = rx.recv()?.unwrap();
    /// assert_eq!(r.as_pod::<[u64; 2]>(), Some(&[7, 9]));
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    #[inline]
    pub fn claim(&mut self, len: usize) -> Result<Claim<'_>, SendError> {
        self.claim_inner(len, Forever).map_err(Into::into)
    }

    /// [`Producer::claim`] without waiting ([`TrySendError::Full`]).
    ///
    /// # Errors
    /// [`TrySendError::Full`] if no segment is free now; otherwise as [`Producer::claim`].
    pub fn try_claim(&mut self, len: usize) -> Result<Claim<'_>, TrySendError> {
        self.claim_inner(len, Immediately).map_err(Into::into)
    }

    /// [`Producer::claim`] waiting at most `timeout` ([`SendTimeoutError::Timeout`]).
    ///
    /// # Errors
    /// [`SendTimeoutError::Timeout`] if no segment comes back in time; otherwise as
    /// [`Producer::claim`].
    pub fn claim_timeout(
        &mut self,
        len: usize,
        timeout: Duration,
    ) -> Result<Claim<'_>, SendTimeoutError> {
        self.claim_inner(len, Until::after(timeout))
            .map_err(Into::into)
    }

    /// [`Producer::claim`] waiting until `deadline` at most.
    ///
    /// # Errors
    /// [`SendTimeoutError::Timeout`] if no segment comes back by `deadline`; otherwise as
    /// [`Producer::claim`].
    pub fn claim_deadline(
        &mut self,
        len: usize,
        deadline: Instant,
    ) -> Result<Claim<'_>, SendTimeoutError> {
        self.claim_inner(len, Until::at(deadline))
            .map_err(Into::into)
    }

    #[inline]
    pub(super) fn claim_batch_inner<P: Patience>(
        &mut self,
        len: usize,
        max: usize,
        patience: P,
    ) -> Sent<Batch<'_>, P> {
        if len > self.seg_size - HEADER {
            return Err(too_large(
                &self.shared.name,
                "a record of a batch",
                len as u64,
                self.max_unspanned_len() as u64,
            )
            .into());
        }
        let frame = frame::next_frame(0, len);
        if max == 0 {
            // Nothing claimed, and no segment needed (there may be none in hand).
            return Ok(Batch {
                producer: self,
                at: 0,
                record_len: len,
                frame,
                count: 0,
                held: false,
                headed: 0,
            });
        }
        let room = |p: &Producer| match &p.cur {
            Some(c) if p.seg_end >= c.wpos => (p.seg_end - c.wpos) / frame,
            _ => 0,
        };
        if room(self) == 0 {
            self.ensure_room_slow(frame, patience)?;
        }
        let count = room(self).min(max);
        let c = self.cur.as_ref().expect("a segment in hand");
        let at = c.wpos;
        self.shared.tracker.write(c.seg as usize, at, count * frame);
        let held = c.pending.is_none();
        Ok(Batch {
            producer: self,
            at,
            record_len: len,
            frame,
            count,
            held,
            headed: 0,
        })
    }

    /// Claims room for up to `max` records of `len` bytes each in the segment in hand (as many
    /// as fit there, at least one: if none fits it waits for a fresh segment as
    /// [`Producer::claim`] does), to serialize into in place; [`Batch::commit`] sends them
    /// all at once. For streams of small records: the per-record work of a claim and its
    /// commit is done once per batch, and what remains per record is its bytes and its
    /// header. `len` must be at most [`Producer::max_unspanned_len`]; `max` 0 claims nothing.
    ///
    /// # Errors
    /// [`SendError::RecordTooLarge`] if `len` does not fit in one segment; otherwise as
    /// [`Producer::send`].
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// let records = vec![[7u8; 64]; 1000];
    /// let mut rest = &records[..];
    /// while !rest.is_empty() {
    ///     let mut batch = tx.claim_batch(64, rest.len())?;
    ///     let n = batch.len();
    ///     for (slot, r) in batch.iter_mut().zip(rest) {
    ///         slot.copy_from_slice(r);
    ///     }
    ///     batch.commit();
    ///     rest = &rest[n..];
    /// }
    /// tx.close();
    /// let mut n = 0;
    /// while let Some(r) = rx.recv()? {
    ///     assert_eq!(r.as_bytes(), Some(&[7u8; 64][..]));
    ///     n += 1;
    /// }
    /// assert_eq!(n, 1000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn claim_batch(&mut self, len: usize, max: usize) -> Result<Batch<'_>, SendError> {
        self.claim_batch_inner(len, max, Forever)
            .map_err(Into::into)
    }

    /// [`Producer::claim_batch`] without waiting ([`TrySendError::Full`] when no record fits
    /// the segment in hand and no segment may be taken now).
    ///
    /// # Errors
    /// [`TrySendError::Full`] if no segment is free now (or the consumer's debloating cap
    /// holds the producer back); otherwise as [`Producer::claim_batch`].
    pub fn try_claim_batch(&mut self, len: usize, max: usize) -> Result<Batch<'_>, TrySendError> {
        self.claim_batch_inner(len, max, Immediately)
            .map_err(Into::into)
    }

    /// [`Producer::claim_batch`] waiting at most `timeout` for a segment.
    ///
    /// # Errors
    /// [`SendTimeoutError::Timeout`] if no segment comes back in time; otherwise as
    /// [`Producer::claim_batch`].
    pub fn claim_batch_timeout(
        &mut self,
        len: usize,
        max: usize,
        timeout: Duration,
    ) -> Result<Batch<'_>, SendTimeoutError> {
        self.claim_batch_inner(len, max, Until::after(timeout))
            .map_err(Into::into)
    }

    /// [`Producer::claim_batch`] waiting until `deadline` at most for a segment.
    ///
    /// # Errors
    /// [`SendTimeoutError::Timeout`] if no segment comes back by `deadline`; otherwise as
    /// [`Producer::claim_batch`].
    pub fn claim_batch_deadline(
        &mut self,
        len: usize,
        max: usize,
        deadline: Instant,
    ) -> Result<Batch<'_>, SendTimeoutError> {
        self.claim_batch_inner(len, max, Until::at(deadline))
            .map_err(Into::into)
    }

    /// Starts a record whose length is not known up front, written through `std::io::Write`
    /// and ended by [`RecordWriter::finish`]. If it outgrows its segment it moves to a fresh
    /// one, and spans segments only if it is larger than a segment. Dropping the writer without
    /// `finish` discards the record (the consumer never sees it, or sees
    /// [`RecvError::RecordAborted`](crate::RecvError::RecordAborted) if parts were already handed over). Waits block like `send`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::io::Write;
    ///
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// let mut w = tx.stream()?;
    /// write!(w, "{} and {}", "a length", "not known up front")?;
    /// w.finish()?;
    /// tx.flush()?;
    /// assert_eq!(rx.recv()?.unwrap().to_vec()?, b"a length and not known up front");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`Producer::send`]; the writer's own writes fail with a [`WriteError`].
    pub fn stream(&mut self) -> Result<RecordWriter<'_>, SendError> {
        self.stream_inner(Forever).map_err(Into::into)
    }

    /// [`Producer::stream`] whose waits (for the first segment and for every further segment
    /// the record grows into) all end at `timeout` from now: a write that would wait longer
    /// fails with [`WriteError::Timeout`] and the record is discarded (or aborted, if parts of
    /// it were already handed over).
    ///
    /// # Errors
    /// [`SendTimeoutError::Timeout`] if no segment comes back in time; otherwise as
    /// [`Producer::stream`].
    pub fn stream_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<RecordWriter<'_>, SendTimeoutError> {
        self.stream_inner(Until::after(timeout)).map_err(Into::into)
    }

    /// As [`Producer::stream_timeout`], with the deadline as an instant.
    pub fn stream_deadline(
        &mut self,
        deadline: Instant,
    ) -> Result<RecordWriter<'_>, SendTimeoutError> {
        self.stream_inner(Until::at(deadline)).map_err(Into::into)
    }

    /// [`Producer::stream`] that never waits: [`TrySendError::Full`] (and later
    /// [`WriteError::Full`]) wherever a segment would have to be waited for, with the record
    /// discarded (or aborted) as for `stream_timeout`.
    ///
    /// # Errors
    /// [`TrySendError::Full`] if no segment is free now; otherwise as [`Producer::stream`].
    pub fn try_stream(&mut self) -> Result<RecordWriter<'_>, TrySendError> {
        self.stream_inner(Immediately).map_err(Into::into)
    }

    pub(super) fn stream_inner<P: Patience + Into<Deadline>>(
        &mut self,
        patience: P,
    ) -> Sent<RecordWriter<'_>, P> {
        self.ensure_room(HEADER, patience)?;
        let c = self.cur.as_mut().expect("a segment in hand");
        let frag_start = c.wpos;
        Ok(RecordWriter {
            producer: self,
            frag_start,
            pos: frag_start + HEADER,
            total: 0,
            spanning: false,
            finished: false,
            failed: false,
            interrupted: false,
            deadline: patience.into(),
        })
    }
}

/// `len` bytes claimed in a segment for one record (see [`Producer::claim`]).
#[must_use = "dropping a claim without `commit` sends nothing"]
pub struct Claim<'a> {
    producer: &'a mut Producer,
    at: usize,
    len: usize,
}

impl Claim<'_> {
    /// Sends the record with all `len` bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// let mut c = tx.claim(4)?;
    /// c.copy_from_slice(b"abcd");
    /// c.commit(); // dropping the claim instead would send nothing
    /// tx.flush()?;
    /// assert_eq!(rx.recv()?.unwrap().as_bytes(), Some(&b"abcd"[..]));
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    #[inline(always)]
    pub fn commit(self) {
        let len = self.len;
        self.commit_len(len);
    }

    /// Sends the record with only its first `len` bytes (`len` at most the claimed length):
    /// for serializers that reserve a bound and use less.
    ///
    /// # Panics
    /// If `len` is more than the claimed length.
    // (Always inlined: the few instructions of a record's end, on every record's path, are
    // not left to the caller's inlining budget.)
    #[inline(always)]
    pub fn commit_len(self, len: usize) {
        assert!(
            len <= self.len,
            "commit_len({len}) is more than the {} bytes claimed",
            self.len
        );
        let p = self.producer;
        let c = p.cur.as_mut().expect("a claim holds a segment");
        debug_assert_eq!(c.wpos, self.at);
        c.wpos = frame::next_frame(self.at, len);
        p.write_header(self.at, len as u32, frame::WHOLE);
        p.record_done(len as u64);
    }
}

impl std::ops::Deref for Claim<'_> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: `at + 8 + len <= segment_size` (checked by `claim`), the segment is in the
        // producer's hand and past the published offset, so the consumer does not read it.
        unsafe {
            std::slice::from_raw_parts(self.producer.seg_ptr().add(self.at + HEADER), self.len)
        }
    }
}

impl std::ops::DerefMut for Claim<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only view.
        unsafe {
            std::slice::from_raw_parts_mut(self.producer.seg_ptr().add(self.at + HEADER), self.len)
        }
    }
}

/// Room for `len()` records of one length, claimed at once in a segment (see
/// [`Producer::claim_batch`]): fill them in place, then [`Batch::commit`] sends them all (or
/// [`Batch::commit_first`] the first few); dropping the batch sends nothing.
#[must_use = "dropping a batch without `commit` sends nothing"]
pub struct Batch<'a> {
    producer: &'a mut Producer,
    /// Where the first record's frame starts; record `i`'s frame is at `at + i * frame`.
    at: usize,
    /// Bytes of every record.
    record_len: usize,
    /// Bytes of every frame: its header and record, rounded up to 8.
    frame: usize,
    /// Records claimed: `at + count * frame` is within the segment's usable end.
    count: usize,
    /// The first frame is the first unpublished one of the segment: its header slot is the 0
    /// the consumer stops at, so its header is held back, to be stored by the publication
    /// that follows the commit.
    held: bool,
    /// The headers of frames `0..headed` are written (but the first one's when `held`): each
    /// is written as [`Batch::iter_mut`] hands out its record, together with the record's
    /// bytes (records are handed out first to last), and the commit writes the headers from
    /// `headed` on. A header past what is committed
    /// stays beyond the 0 that the next publication stores at the write position, where the
    /// consumer never reads; later frames overwrite it, as they overwrite what an earlier
    /// use of the segment left there.
    headed: usize,
}

impl Batch<'_> {
    /// How many records were claimed.
    #[inline]
    pub fn len(&self) -> usize {
        self.count
    }

    /// True if no record was claimed (`max` was 0).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Record `i`'s bytes, to write into.
    ///
    /// # Panics
    /// If `i` is not below [`Batch::len`].
    #[inline]
    pub fn record_mut(&mut self, i: usize) -> &mut [u8] {
        assert!(
            i < self.count,
            "record {i} of a batch of {} records",
            self.count
        );
        // SAFETY: `claim_batch` computed `count` as the frames that fit between `at` and the
        // segment's usable end, so `at + count * frame <= seg_end <= segment_size`, and
        // `i < count` (asserted): the record lies inside the segment in hand, past the
        // published offset, where the consumer does not read; `&mut self` makes this the only
        // view of it.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.producer
                    .seg_ptr()
                    .add(self.at + i * self.frame + HEADER),
                self.record_len,
            )
        }
    }

    /// Every record's bytes, in order, to write into. The records come first to last (the
    /// iterator cannot be reversed):
    ///
    /// ```compile_fail
    /// let (mut tx, _rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// let mut batch = tx.claim_batch(8, 3)?;
    /// let last = batch.iter_mut().next_back();
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// let mut batch = tx.claim_batch(8, 3)?;
    /// for (i, r) in batch.iter_mut().enumerate() {
    ///     r.copy_from_slice(&(i as u64).to_le_bytes());
    /// }
    /// batch.commit();
    /// tx.flush()?;
    /// assert_eq!(rx.recv()?.unwrap().as_pod::<u64>(), Some(&0));
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    #[inline]
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut [u8]> + '_ {
        let (at, len, frame, count) = (self.at, self.record_len, self.frame, self.count);
        // (No segment is looked at for an empty batch: there may be none in hand.)
        let (base, seg) = match &self.producer.cur {
            Some(c) if count > 0 => (c.base, c.seg),
            _ => (std::ptr::null_mut(), 0),
        };
        let word = frame::encode(len as u32, frame::WHOLE);
        #[cfg(not(shmflow_broken = "batch_header_unheld"))]
        let skip = usize::from(self.held);
        #[cfg(shmflow_broken = "batch_header_unheld")]
        let skip = 0;
        let shared = &*self.producer.shared;
        let headed = &mut self.headed;
        (0..count).map(move |i| {
            // One pass over the segment's lines: each record's header is written as its
            // bytes are handed out, beside them.
            if i >= skip {
                // SAFETY: `i < count`, so `at + i * frame + HEADER <= at + count * frame`,
                // within the segment in hand, whose start is `base` (see `record_mut`); `at`
                // and `frame` are multiples of 8, so the header is an aligned word, past the
                // published frames, that no item covers (items are the records' bytes only).
                let slot = unsafe { shared.word_in(base, seg, at + i * frame) };
                // Relaxed: published by the Release store of the first unpublished header,
                // as the headers `write_header` stores at once.
                frame::write_unpublished(slot, word);
            }
            // Every pass hands the records out first to last, none skipped (the iterator
            // is no `DoubleEndedIterator`, and every `Iterator` method, `nth` and a zip's
            // included, runs this closure for each index in turn): the headers of `0..=i`
            // are written.
            *headed = i + 1;
            // SAFETY: as in `record_mut` (`i < count`); the items are the records' bytes
            // only, each `frame` bytes apart and `len <= frame - HEADER` long, so no two
            // overlap and none covers a header; they borrow the batch mutably.
            unsafe { std::slice::from_raw_parts_mut(base.add(at + i * frame + HEADER), len) }
        })
    }

    /// Sends every claimed record.
    #[inline(always)]
    pub fn commit(self) {
        let n = self.count;
        self.commit_first(n);
    }

    /// Sends the first `n` records only (`n` at most [`Batch::len`]): for a producer that
    /// had fewer records than it claimed room for.
    ///
    /// # Panics
    /// If `n` is more than [`Batch::len`].
    #[inline]
    pub fn commit_first(self, n: usize) {
        assert!(
            n <= self.count,
            "commit_first({n}) of a batch of {} records",
            self.count
        );
        if n == 0 {
            return;
        }
        let word = frame::encode(self.record_len as u32, frame::WHOLE);
        let p = self.producer;
        let c = p.cur.as_mut().expect("a batch holds a segment");
        debug_assert_eq!(c.wpos, self.at);
        // The headers `iter_mut` did not write (none if it went through every record).
        for i in self.headed.max(usize::from(self.held))..n {
            // SAFETY: `i < n <= count`: the header slot of a claimed frame, inside the
            // segment in hand whose start is `base` (see `record_mut`), 8-aligned, past the
            // published frames.
            let slot = unsafe { p.shared.word_in(c.base, c.seg, self.at + i * self.frame) };
            // Relaxed: as in `iter_mut`.
            frame::write_unpublished(slot, word);
        }
        c.wpos = self.at + n * self.frame;
        if self.held {
            // The first unpublished frame: the next publication stores its header.
            debug_assert!(c.pending.is_none());
            c.pending = Some((self.at, word));
        }
        p.records_done(n as u64, (n * self.record_len) as u64);
    }
}

/// A record being streamed (see [`Producer::stream`]).
#[must_use = "dropping a record writer without `finish` discards the record"]
pub struct RecordWriter<'a> {
    pub(super) producer: &'a mut Producer,
    /// Where the current frame's header goes.
    frag_start: usize,
    /// Where the next byte goes.
    pub(super) pos: usize,
    total: u64,
    spanning: bool,
    finished: bool,
    pub(super) failed: bool,
    /// A `write_async` was dropped part-way: how much of its bytes went in is unknown, so the
    /// record can only be discarded (later writes and `finish` fail; dropping cleans up).
    pub(super) interrupted: bool,
    /// When waits for further segments give up.
    deadline: Deadline,
}

impl RecordWriter<'_> {
    pub(super) fn overflow(&mut self) -> Sent<(), Deadline> {
        let p = &mut *self.producer;
        let seg_size = p.shared.segment_size();
        if !self.spanning && self.frag_start > 0 {
            // Still fits a fresh segment perhaps: move it there (records that fit never span).
            // The bytes written so far are copied out *before* the seal: once sealed, the
            // consumer may return the segment, and a gate may lend a floating segment to
            // another channel whose producer then writes it. One scratch buffer per producer,
            // grown on the first move, keeps this rare path from allocating per record.
            let old = p.cur.expect("a segment in hand");
            let partial = self.pos - self.frag_start - HEADER;
            p.shared
                .tracker
                .read(old.seg as usize, self.frag_start + HEADER, partial);
            p.scratch.clear();
            // SAFETY: `frag_start + 8 + partial <= segment_size` (the writer's positions stay
            // inside the segment in hand), and the segment is the producer's until the seal
            // below publishes it: nobody else writes these bytes now.
            p.scratch.extend_from_slice(unsafe {
                std::slice::from_raw_parts(old.base.add(self.frag_start + HEADER), partial)
            });
            p.cur.as_mut().expect("in hand").wpos = self.frag_start;
            p.seal();
            if let Err(e) = p.take(self.deadline, super::Bound::Free) {
                // Nothing of it was published (the seal stopped before it): just lost.
                self.failed = true;
                return Err(e);
            }
            let new = p.cur.expect("just taken");
            p.shared.tracker.write(new.seg as usize, HEADER, partial);
            // SAFETY: `8 + partial <= segment_size`: inside the fresh segment, which is ours
            // (just taken); the scratch buffer is ours too and does not overlap the mapping.
            unsafe {
                std::ptr::copy_nonoverlapping(p.scratch.as_ptr(), new.base.add(HEADER), partial);
            }
            self.frag_start = 0;
            self.pos = HEADER + partial;
            return Ok(());
        }
        // Larger than a segment: this frame is a part, continue in the next segment.
        let kind = if self.spanning {
            frame::MIDDLE
        } else {
            frame::FIRST
        };
        p.write_header(
            self.frag_start,
            (seg_size - self.frag_start - HEADER) as u32,
            kind,
        );
        p.cur.as_mut().expect("in hand").wpos = seg_size;
        self.spanning = true;
        p.seal();
        if let Err(e) = p.take(self.deadline, super::Bound::Free) {
            p.pending_abort = true;
            self.failed = true;
            return Err(e);
        }
        self.frag_start = 0;
        self.pos = HEADER;
        Ok(())
    }

    /// Appends bytes to the record.
    ///
    /// # Errors
    /// As the call that started the record waits ([`WriteError`]); after a failure every
    /// further write is [`WriteError::RecordAborted`].
    pub fn write_bytes(&mut self, bytes: &[u8]) -> Result<(), WriteError> {
        self.write_checked(bytes).map_err(Into::into)
    }

    /// A write from outside (`write_bytes`, `io::Write`): refused once an async write was
    /// dropped part-way.
    fn write_checked(&mut self, bytes: &[u8]) -> Sent<(), Deadline> {
        if self.interrupted {
            return Err(aborted(&self.producer.shared.name).into());
        }
        self.write_inner(bytes)
    }

    pub(super) fn write_inner(&mut self, mut bytes: &[u8]) -> Sent<(), Deadline> {
        if self.failed {
            return Err(aborted(&self.producer.shared.name).into());
        }
        let seg_size = self.producer.shared.segment_size();
        while !bytes.is_empty() {
            if self.pos == seg_size {
                self.overflow()?;
            }
            let take = bytes.len().min(seg_size - self.pos);
            self.producer.write_bytes(self.pos, &bytes[..take]);
            self.pos += take;
            self.total += take as u64;
            bytes = &bytes[take..];
        }
        Ok(())
    }

    /// Ends the record and sends it (according to the flush policy).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::io::Write;
    ///
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// let mut w = tx.stream()?;
    /// w.write_all(b"part one, ")?;
    /// w.write_all(b"part two")?;
    /// w.finish()?; // dropping the writer instead would discard the record
    /// tx.flush()?;
    /// assert_eq!(rx.recv()?.unwrap().to_vec()?, b"part one, part two");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`WriteError::RecordAborted`] if an earlier write failed.
    pub fn finish(self) -> Result<(), WriteError> {
        Ok(self.finish_inner()?)
    }

    /// As [`RecordWriter::finish`], with the one failure it can meet.
    pub(super) fn finish_inner(mut self) -> Result<(), Box<RecordAbortedError>> {
        if self.failed || self.interrupted {
            return Err(aborted(&self.producer.shared.name));
        }
        self.finished = true;
        let p = &mut *self.producer;
        let len = self.pos - self.frag_start - HEADER;
        let kind = if self.spanning {
            frame::LAST
        } else {
            frame::WHOLE
        };
        p.write_header(self.frag_start, len as u32, kind);
        p.cur.as_mut().expect("in hand").wpos = frame::align8(self.pos);
        p.record_done(self.total);
        Ok(())
    }
}

impl io::Write for RecordWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_checked(buf).map_err(WriteError::from)?;
        Ok(buf.len())
    }

    /// A record becomes visible only when finished; this does nothing.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for RecordWriter<'_> {
    fn drop(&mut self) {
        if self.finished || self.failed {
            return;
        }
        let p = &mut *self.producer;
        if !self.spanning {
            // Nothing of it was published: forget it.
            p.cur.as_mut().expect("in hand").wpos = self.frag_start;
            return;
        }
        // Parts are out: replace the frame in progress with ABORT.
        p.write_header(self.frag_start, 0, frame::ABORT);
        p.cur.as_mut().expect("in hand").wpos = frame::next_frame(self.frag_start, 0);
        p.after_frame_end();
    }
}

impl std::fmt::Debug for Claim<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claim")
            .field("region", &self.producer.shared.name)
            .field("at", &self.at)
            .field("len", &self.len)
            .finish()
    }
}

impl std::fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("region", &self.producer.shared.name)
            .field("at", &self.at)
            .field("record_len", &self.record_len)
            .field("count", &self.count)
            .finish()
    }
}

impl std::fmt::Debug for RecordWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordWriter")
            .field("region", &self.producer.shared.name)
            .field("written", &self.total)
            .field("spanning", &self.spanning)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// A claim that no longer borrows its producer ([`Claim::detach`]): for bindings that hand the
/// claimed bytes out as a view the borrow checker cannot follow (a writable Python
/// `memoryview`). Commit it with [`Producer::commit_detached`]; dropping it sends nothing.
#[derive(Debug)]
#[must_use = "dropping a detached claim sends nothing"]
pub struct DetachedClaim {
    /// Where the claim is: the segment, its frame's offset, and which taking of the segment
    /// (the producer's count of segments acquired), so that a claim the producer wrote past
    /// is refused rather than committed over other records.
    seg: u32,
    at: usize,
    acquired: u64,
    len: usize,
    /// The producer it came from (its number among the process's ends).
    owner: u64,
}

impl DetachedClaim {
    /// The claimed length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a claim of 0 bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Why [`Producer::commit_detached`] refused a claim: the producer took another segment, or
/// wrote past the claim's place, since the claim was detached, or the claim came from another
/// producer. Nothing was sent. (A record writer from [`Producer::stream`] dropped unfinished,
/// or a [`Batch`] dropped or committed in part, leaves the place as it found it, so a claim
/// across one is not refused, but either may have written over the claimed bytes: do not use
/// the producer until the commit.)
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StaleClaimError {
    /// The region of the producer asked to commit.
    pub region: String,
}

impl std::fmt::Display for StaleClaimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: the detached claim is stale (the producer was used between the claim and its \
             commit, or the claim belongs to another producer); nothing was sent",
            self.region
        )
    }
}

impl std::error::Error for StaleClaimError {}

impl Claim<'_> {
    /// Ends the claim's borrow of the producer and gives the claimed bytes as a raw pointer
    /// (`len` bytes, writable) with a [`DetachedClaim`] that
    /// [`Producer::commit_detached`] sends later.
    ///
    /// The pointer stays valid, and the bytes are the producer's alone, as long as the
    /// producer is not used until the commit: any other call may hand the segment to the
    /// consumer, after which the commit is refused ([`StaleClaimError`]) and writes through
    /// the pointer would land in bytes the consumer reads.
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// let (claim, ptr) = tx.claim(4)?.detach();
    /// // SAFETY: the producer is not used until the commit below.
    /// unsafe { ptr.as_ptr().copy_from_nonoverlapping(b"abcd".as_ptr(), 4) };
    /// tx.commit_detached(claim, 4).unwrap();
    /// tx.flush()?;
    /// assert_eq!(rx.recv()?.unwrap().as_bytes(), Some(&b"abcd"[..]));
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn detach(mut self) -> (DetachedClaim, std::ptr::NonNull<u8>) {
        let ptr = std::ptr::NonNull::from(&mut *self).cast::<u8>();
        let p = &*self.producer;
        let c = p.cur.as_ref().expect("a claim holds a segment");
        (
            DetachedClaim {
                seg: c.seg,
                at: self.at,
                acquired: p.counters.acquired.0,
                len: self.len,
                owner: p.owner_id(),
            },
            ptr,
        )
    }
}

impl Producer {
    /// Sends the record of a [`DetachedClaim`] with its first `len` bytes (at most the
    /// claimed length), as [`Claim::commit_len`] would have.
    ///
    /// # Errors
    /// [`StaleClaimError`] if the producer was used since the claim was detached, or the
    /// claim came from another producer: nothing is sent.
    ///
    /// # Panics
    /// If `len` is more than the claimed length.
    pub fn commit_detached(
        &mut self,
        claim: DetachedClaim,
        len: usize,
    ) -> Result<(), StaleClaimError> {
        let fresh = claim.owner == self.owner_id()
            && claim.acquired == self.counters.acquired.0
            && self
                .cur
                .as_ref()
                .is_some_and(|c| c.seg == claim.seg && c.wpos == claim.at);
        if !fresh {
            return Err(StaleClaimError {
                region: self.shared.name.clone(),
            });
        }
        Claim {
            producer: self,
            at: claim.at,
            len: claim.len,
        }
        .commit_len(len);
        Ok(())
    }

    fn owner_id(&self) -> u64 {
        self.end_id
    }
}
