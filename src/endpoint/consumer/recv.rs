//! The record family: `recv` and its `try_`, timeout and deadline forms, the slow path they
//! share, and the batch forms (`drain`, `try_drain` and their timed forms).

#[allow(unused_imports)]
use super::*;

impl Consumer {
    pub(super) fn too_large(&self, len: u64) -> Box<RecordTooLargeError> {
        too_large(&self.shared.name, "a record", len, self.max_record_len)
    }

    // Every receiving operation has one core (`recv_inner`, `message_inner`) that takes its
    // patience as a type; the blocking, `try_`, `_timeout` and `_deadline` forms are
    // one-line wrappers that pick it (`Forever`, `Immediately`, `Until`), and the error type
    // follows from it.

    /// Receives the next record, blocking until one is committed. `Ok(None)` is end of
    /// stream: the producer detached and every record it committed has been read.
    ///
    /// # Errors
    /// [`RecvError::PeerDead`] once the producer died and everything it committed was read;
    /// [`RecvError::Corrupt`] if it broke the protocol; [`RecvError::RecordTooLarge`] for a
    /// spanning record over [`Consumer::set_max_record_len`] (the record is skipped).
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// for i in 0..3u64 {
    ///     tx.send_pod(&i)?;
    /// }
    /// drop(tx); // ends the stream
    /// let mut sum = 0;
    /// while let Some(r) = rx.recv()? {
    ///     sum += r.as_pod::<u64>().copied().unwrap_or(0);
    /// }
    /// assert_eq!(sum, 3);
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    #[inline]
    pub fn recv(&mut self) -> Result<Option<Record<'_>>, RecvError> {
        self.recv_inner(Forever)
    }

    /// Receives the next record if one is committed, else [`TryRecvError::Empty`].
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::TryRecvError;
    ///
    /// let (_tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`TryRecvError::Empty`] if nothing is committed yet; otherwise as [`Consumer::recv`].
    #[inline]
    pub fn try_recv(&mut self) -> Result<Option<Record<'_>>, TryRecvError> {
        self.recv_inner(Immediately)
    }

    /// Receives the next record, waiting at most `timeout` ([`RecvTimeoutError::Timeout`]).
    ///
    /// # Errors
    /// [`RecvTimeoutError::Timeout`] if nothing arrives in time; otherwise as
    /// [`Consumer::recv`].
    pub fn recv_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<Record<'_>>, RecvTimeoutError> {
        self.recv_inner(Until::after(timeout))
    }

    /// Receives the next record, waiting until `deadline` at most.
    ///
    /// # Errors
    /// [`RecvTimeoutError::Timeout`] if nothing arrives by `deadline`; otherwise as
    /// [`Consumer::recv`].
    pub fn recv_deadline(
        &mut self,
        deadline: Instant,
    ) -> Result<Option<Record<'_>>, RecvTimeoutError> {
        self.recv_inner(Until::at(deadline))
    }

    /// Hands the records that are available (at most `max`) to `f`, waiting for the first
    /// one if none is there; returns how many. 0 means the stream has ended (or `max` is 0).
    /// Stops early at end of stream or when `f` fails, with `f`'s error. Each record is built
    /// in place for `f`, never moved through a `Result`, so its speed does not depend on how
    /// the caller's loop compiles.
    ///
    /// # Errors
    /// `f`'s error, or what [`Consumer::recv`] would return (converted with
    /// `From<RecvError>`).
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// for _ in 0..100 {
    ///     tx.send(b"x")?;
    /// }
    /// drop(tx);
    /// let mut bytes = 0;
    /// loop {
    ///     let n = rx.drain(usize::MAX, |r| {
    ///         bytes += r.len().unwrap_or(0);
    ///         Ok::<_, shmflow::Error>(())
    ///     })?;
    ///     if n == 0 {
    ///         break; // the end of the stream
    ///     }
    /// }
    /// assert_eq!(bytes, 100);
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn drain<F, E>(&mut self, max: usize, f: F) -> Result<usize, E>
    where
        F: FnMut(Record<'_>) -> Result<(), E>,
        E: From<RecvError>,
    {
        self.drain_core(max, f, Forever)
    }

    /// As [`Consumer::drain`], waiting at most `timeout` for the first record; 0 when
    /// nothing came in time or the stream has ended ([`is_ended`](Consumer::is_ended) tells
    /// them apart).
    ///
    /// # Errors
    /// As [`Consumer::drain`].
    pub fn drain_timeout<F, E>(&mut self, max: usize, timeout: Duration, f: F) -> Result<usize, E>
    where
        F: FnMut(Record<'_>) -> Result<(), E>,
        E: From<RecvError>,
    {
        self.drain_core(max, f, Until::after(timeout))
    }

    /// As [`Consumer::drain_timeout`], waiting until `deadline` at most.
    ///
    /// # Errors
    /// As [`Consumer::drain`].
    pub fn drain_deadline<F, E>(&mut self, max: usize, deadline: Instant, f: F) -> Result<usize, E>
    where
        F: FnMut(Record<'_>) -> Result<(), E>,
        E: From<RecvError>,
    {
        self.drain_core(max, f, Until::at(deadline))
    }

    /// The waiting forms' core: the records there now, else one as `patience` allows and
    /// then the rest of those there.
    pub(super) fn drain_core<F, E, P: Patience>(
        &mut self,
        max: usize,
        mut f: F,
        patience: P,
    ) -> Result<usize, E>
    where
        F: FnMut(Record<'_>) -> Result<(), E>,
        E: From<RecvError>,
    {
        let n = self.try_drain(max, &mut f)?;
        if n > 0 || max == 0 {
            return Ok(n);
        }
        match self.recv_inner::<_, Halt<_, _>>(patience) {
            Ok(Some(r)) => f(r)?,
            Ok(None) | Err(Halt::Expired(_)) => return Ok(0),
            Err(Halt::Failed(e)) => return Err(E::from(e)),
        }
        Ok(1 + self.try_drain(max - 1, &mut f)?)
    }

    /// Hands every record that is available now (at most `max`) to `f`, without waiting;
    /// returns how many. Stops early at end of stream or when `f` fails, with `f`'s error.
    /// A count of 0 means nothing was there yet or the stream has ended:
    /// [`is_ended`](Consumer::is_ended) tells them apart.
    ///
    /// For small records, keep what `f` adds up in a local declared just before the call (as
    /// `bytes` below), and fold it into longer-lived state after: a total that outlives the
    /// loop around the call may be kept in memory, and each record's update then waits on the
    /// last one's store (64 B records drained about 10 % slower in `shmflow bench`). And keep
    /// `f` small: a rare path (a record that spans segments, read part by part) is best in a
    /// function of its own, marked `#[cold]`. A closure with that loop in it may be left a call
    /// per record rather than inlined into the loop here, which drained 64 B records at about
    /// 0.6x the speed in `shmflow bench`.
    ///
    /// # Errors
    /// `f`'s error, or what `try_recv` would return other than `Empty` (converted with
    /// `From<RecvError>`).
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// for _ in 0..100 {
    ///     tx.send(b"x")?;
    /// }
    /// tx.flush()?;
    /// let mut bytes = 0;
    /// let n = rx.try_drain(usize::MAX, |r| {
    ///     bytes += r.len().unwrap_or(0);
    ///     Ok::<_, shmflow::Error>(())
    /// })?;
    /// assert_eq!((n, bytes), (100, 100));
    /// assert_eq!(rx.try_drain(usize::MAX, |_| Ok::<_, shmflow::Error>(()))?, 0); // none now
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn try_drain<F, E>(&mut self, max: usize, mut f: F) -> Result<usize, E>
    where
        F: FnMut(Record<'_>) -> Result<(), E>,
        E: From<RecvError>,
    {
        let mut n = 0;
        while n < max {
            if !self.skipping && !self.in_span {
                // Whole records in the segment in hand: nothing in this loop can start a span
                // or a skip, so the flags are tested once, and the counts are kept in locals
                // and added once.
                let (mut k, mut bytes, mut failed) = (0u64, 0u64, None);
                if let Some(c) = self.cur.as_ref() {
                    // The prefetch ahead is for a segment the producer has left (see
                    // `ReadSeg::complete`): a loop for each case, so neither tests it per
                    // record.
                    let (base, seg, rd) = (c.base, c.seg, c.rd);
                    let run = if c.complete {
                        self.whole_run::<true, _, _>(base, seg, rd, max - n, &mut f)
                    } else {
                        self.whole_run::<false, _, _>(base, seg, rd, max - n, &mut f)
                    };
                    (k, bytes, failed) = run;
                    n += k as usize;
                }
                if self.metrics && k > 0 {
                    self.counters.records.bump(k);
                    self.counters.bytes.bump(bytes);
                    self.publish_counts();
                }
                if let Some(e) = failed {
                    return Err(e);
                }
                if n >= max {
                    break;
                }
            }
            match self.recv_inner::<_, Halt<_, _>>(Immediately) {
                Ok(Some(r)) => {
                    f(r)?;
                    n += 1;
                }
                Ok(None) | Err(Halt::Expired(_)) => break,
                Err(Halt::Failed(e)) => return Err(E::from(e)),
            }
        }
        Ok(n)
    }

    /// The whole records of the segment in hand, from `rd`, at most `max` of them, each handed
    /// to `f`: (records, their bytes, `f`'s error if it failed). `base` and `seg` are the
    /// segment in hand's, `rd` its read position; `COMPLETE` is its `ReadSeg::complete`.
    ///
    /// The segment and the read position stay in locals, kept in registers across `f`. A
    /// `Record` of one segment never moves `cur` (its segment, its base, its read position),
    /// `seg_size`, `fast_max`, `skipping` or `in_span`, and never takes or returns a segment:
    /// it reads `cur` (`at`, `view`), sets `span` to an ended one (`next_part`, `io::Read`)
    /// and adds to `holds` (`hold_segment`); so the locals stay true after `f`, and the
    /// segment stays in hand. The position is stored into `cur` before `f` runs (the store is
    /// not on the loop's chain: only `cur`'s tag is read back), so `self` is as `recv` leaves
    /// it if `f` panics.
    #[inline(always)]
    fn whole_run<const COMPLETE: bool, F, E>(
        &mut self,
        base: *const u8,
        seg: u32,
        mut rd: usize,
        max: usize,
        f: &mut F,
    ) -> (u64, u64, Option<E>)
    where
        F: FnMut(Record<'_>) -> Result<(), E>,
    {
        let (seg_size, fast_max) = (self.seg_size, self.fast_max);
        let (mut k, mut bytes) = (0u64, 0u64);
        while (k as usize) < max {
            // The checks of `fast_whole_inner`, on the locals.
            if rd + HEADER > seg_size {
                break;
            }
            // SAFETY: `base` is the start of the segment in hand (cached at pop, and the
            // segment is still in hand: see above), `rd + 8 <= segment_size` (checked above),
            // `rd` 8-aligned (a frame boundary).
            // SYNC POINT: Acquire, pairs with the producer's Release store of the first header
            // of what it commits (as in `poll_frame`): the payload handed to `f` is written
            // before it.
            let word = frame::load(unsafe { self.shared.word_in(base, seg, rd) });
            let Some((len, next)) = frame::whole_fast(word, rd, seg_size, fast_max) else {
                break;
            };
            let at = rd;
            rd = next;
            if let Some(c) = self.cur.as_mut() {
                c.rd = rd;
            }
            prefetch_from(base, rd, COMPLETE, seg_size);
            k += 1;
            bytes += len as u64;
            // SAFETY: `at + 8 + len <= next <= segment_size` (`whole_fast`).
            let ptr = unsafe { base.add(at + HEADER) };
            if let Err(e) = f(Record::single(self, ptr, len)) {
                return (k, bytes, Some(e));
            }
        }
        (k, bytes, None)
    }
}
