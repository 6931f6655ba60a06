//! The record family: `send` and its `try_`, timeout and deadline forms (and the `_pod`
//! forms), over one core that writes a record whole or spanning segments.

#[allow(unused_imports)]
use super::*;

impl Producer {
    // Always inline: the copy of a record whose length the caller knows becomes a few moves
    // (the blocking and the async `send` alike).
    #[inline(always)]
    pub(super) fn send_inner<P: Patience>(&mut self, bytes: &[u8], patience: P) -> Sent<(), P> {
        let seg_size = self.seg_size;
        if HEADER + bytes.len() <= seg_size {
            self.ensure_room(HEADER + bytes.len(), patience)?;
            self.write_whole(bytes);
            return Ok(());
        }
        self.send_spanning(bytes, patience)
    }

    /// True if a frame of `need` bytes goes into the segment in hand (`ensure_room`'s fast
    /// path: a pending abort comes only with no segment in hand).
    #[inline(always)]
    pub(super) fn fits_in_hand(&self, need: usize) -> bool {
        debug_assert!(!(self.pending_abort && self.cur.is_some()));
        matches!(&self.cur, Some(c) if c.wpos + need <= self.seg_end)
    }

    /// Writes `bytes` as a whole record into the segment in hand, which has room for it
    /// ([`Producer::fits_in_hand`], or `ensure_room` just made it).
    #[inline(always)]
    pub(super) fn write_whole(&mut self, bytes: &[u8]) {
        let c = self
            .cur
            .as_mut()
            .expect("a segment in hand with room for the record");
        let at = c.wpos;
        c.wpos = frame::next_frame(at, bytes.len());
        self.write_header(at, bytes.len() as u32, frame::WHOLE);
        self.write_bytes(at + HEADER, bytes);
        self.record_done(bytes.len() as u64);
    }

    /// How many free segments a spanning record of `len` bytes needs to go whole (counting
    /// a pending abort), or `None` if that is more than can be free at once: at most `n - 1`
    /// while a segment is in hand (it sits in the data ring).
    pub(super) fn spanning_needs(&self, len: usize) -> Option<u64> {
        let seg_size = self.seg_size;
        let per_segment = (seg_size - HEADER) as u64;
        // A spanning record starts where it is if at least one word of payload fits there.
        let room_here = match &self.cur {
            Some(c) if !self.pending_abort && c.wpos + 2 * HEADER <= self.seg_end => {
                (seg_size - c.wpos - HEADER) as u64
            }
            _ => 0,
        };
        let needed = (len as u64).saturating_sub(room_here).div_ceil(per_segment)
            + self.pending_abort as u64;
        let most = self.shared.n() as u64 - self.cur.is_some() as u64;
        (needed <= most).then_some(needed)
    }

    pub(super) fn send_spanning<P: Patience>(&mut self, bytes: &[u8], patience: P) -> Sent<(), P> {
        let seg_size = self.seg_size;
        if !patience.forever() {
            // The segment in hand cannot take the start (full, or past a debloated fill): seal
            // it now, so that it can come back while the record waits for its segments.
            if matches!(&self.cur, Some(c) if c.wpos + 2 * HEADER > self.seg_end) {
                self.seal();
            }
            // Go whole or not at all when the pool can hold the record's segments at once.
            if let Some(needed) = self.spanning_needs(bytes.len()) {
                self.wait_free(needed, patience)?;
            }
        }
        self.ensure_room(2 * HEADER, patience)?;
        let mut rest = bytes;
        let mut first = true;
        loop {
            let c = self.cur.as_mut().expect("a segment in hand");
            let at = c.wpos;
            let take = rest.len().min(seg_size - at - HEADER);
            let last = take == rest.len();
            c.wpos = frame::next_frame(at, take);
            let kind = match (first, last) {
                (true, _) => frame::FIRST,
                (false, false) => frame::MIDDLE,
                (false, true) => frame::LAST,
            };
            self.write_header(at, take as u32, kind);
            self.write_bytes(at + HEADER, &rest[..take]);
            rest = &rest[take..];
            first = false;
            if last {
                break;
            }
            self.seal();
            if let Err(e) = self.take(patience, Bound::Free) {
                // Parts are out; the consumer must learn that no more will come.
                self.pending_abort = true;
                return Err(e);
            }
        }
        self.record_done(bytes.len() as u64);
        Ok(())
    }

    // ----- public writing API ----------------------------------------------------------------
    //
    // Every operation has one core (`*_inner`) that takes its patience as a type; the
    // blocking, `try_`, `_timeout` and `_deadline` forms below are one-line wrappers that pick
    // it (`Forever`, `Immediately`, `Until`), and the error type follows from it.

    /// Sends one record, blocking while no segment is free (backpressure).
    ///
    /// # Errors
    /// [`SendError::Closed`] if the consumer has detached, [`SendError::PeerDead`] if its
    /// process died, [`SendError::Corrupt`] if it broke the protocol. A record that fits the
    /// segment in hand is written without a look at the consumer: a consumer that detached is
    /// found when the producer takes its next segment (or flushes, or closes), so at most the
    /// room of the segment in hand is accepted after it left, and lost with the channel; one
    /// whose process died without detaching, when the producer waits for a segment, flushes
    /// or closes.
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// tx.send(b"a record")?;
    /// tx.flush()?; // visible now (the default policy also publishes as it goes)
    /// assert_eq!(rx.recv()?.unwrap().as_bytes(), Some(&b"a record"[..]));
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    #[inline]
    pub fn send(&mut self, bytes: &[u8]) -> Result<(), SendError> {
        self.send_inner(bytes, Forever).map_err(Into::into)
    }

    /// Sends one record if that needs no waiting, else [`TrySendError::Full`] with nothing
    /// sent. A spanning record that needs more segments than the pool has cannot be
    /// guaranteed: if the pool runs dry half-way it is aborted (the consumer sees
    /// [`RecvError::RecordAborted`](crate::RecvError::RecordAborted)).
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::{Geometry, TrySendError};
    ///
    /// let (mut tx, _rx) = shmflow::pair(Geometry { segment_size: 4096, segment_count: 2 })?;
    /// // Nobody reads: the pool fills up, and `try_send` says so instead of waiting.
    /// let full = loop {
    ///     match tx.try_send(&[0u8; 1000]) {
    ///         Ok(()) => continue,
    ///         Err(TrySendError::Full) => break true,
    ///         Err(e) => return Err(e.into()),
    ///     }
    /// };
    /// assert!(full);
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`TrySendError::Full`] if no segment is free now, or the consumer's buffer-debloating
    /// cap holds the record back ([`Consumer::set_debloat_target`](crate::Consumer::set_debloat_target));
    /// otherwise as [`Producer::send`].
    pub fn try_send(&mut self, bytes: &[u8]) -> Result<(), TrySendError> {
        self.send_inner(bytes, Immediately).map_err(Into::into)
    }

    /// Sends one record, waiting at most `timeout` for free segments
    /// ([`SendTimeoutError::Timeout`]). Same all-or-nothing rule as [`Producer::try_send`].
    ///
    /// # Errors
    /// [`SendTimeoutError::Timeout`] if no segment comes back in time; otherwise as
    /// [`Producer::send`].
    pub fn send_timeout(
        &mut self,
        bytes: &[u8],
        timeout: Duration,
    ) -> Result<(), SendTimeoutError> {
        self.send_inner(bytes, Until::after(timeout))
            .map_err(Into::into)
    }

    /// As [`Producer::send_timeout`], with the deadline as an instant.
    pub fn send_deadline(
        &mut self,
        bytes: &[u8],
        deadline: Instant,
    ) -> Result<(), SendTimeoutError> {
        self.send_inner(bytes, Until::at(deadline))
            .map_err(Into::into)
    }

    /// Sends a `Pod` value as a record of `size_of::<T>()` bytes; the consumer can view it in
    /// place with [`crate::Record::as_pod`].
    pub fn send_pod<T: bytemuck::Pod>(&mut self, value: &T) -> Result<(), SendError> {
        self.send(bytemuck::bytes_of(value))
    }

    /// [`Producer::send_pod`] without waiting ([`TrySendError::Full`]).
    pub fn try_send_pod<T: bytemuck::Pod>(&mut self, value: &T) -> Result<(), TrySendError> {
        self.try_send(bytemuck::bytes_of(value))
    }

    /// [`Producer::send_pod`] waiting at most `timeout` ([`SendTimeoutError::Timeout`]).
    pub fn send_pod_timeout<T: bytemuck::Pod>(
        &mut self,
        value: &T,
        timeout: Duration,
    ) -> Result<(), SendTimeoutError> {
        self.send_timeout(bytemuck::bytes_of(value), timeout)
    }
}
