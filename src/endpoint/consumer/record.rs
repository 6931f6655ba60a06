//! A record handed out by the consumer: read in place while it lives ([`Record::as_bytes`],
//! [`Record::as_pod`]), part by part if it spans segments ([`Record::next_part`]), or copied
//! out whole ([`Record::to_vec`]); and a [`Message`], a record or an event.

use std::io;
use std::time::{Duration, Instant};

use super::Consumer;
use crate::endpoint::event::{Barrier, Event};
use crate::error::{aborted, Halt, RecvError, RecvTimeoutError, TryRecvError};
use crate::protocol::frame::{self, HEADER};
use crate::protocol::park::{Forever, Immediately, Patience, Until};

use super::{Got, Waited};
use std::convert::Infallible;

/// What the slow path hands out, before it is turned into a [`Record`].
pub(super) enum RecordKind {
    Single { len: usize, ptr: *const u8 },
    Span(Span),
}

/// Where the consumer is in the spanning record it handed out (kept in the consumer, not in
/// the [`Record`], so that a record stays three words).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Span {
    /// A part (or the rest of one, after a short `io::Read`) to hand out before reading on.
    pub(super) next: Option<(usize, usize)>,
    /// The last part was handed out (or the record was aborted).
    pub(super) ended: bool,
    /// Bytes of the record so far.
    pub(super) total: u64,
}

/// One received record, borrowing the consumer (and, for records in one segment, the shared
/// memory they sit in: no copy).
///
/// A record that spans segments arrives part by part: `next_part`, `to_vec`,
/// `read_all_into` and `io::Read` wait for parts the producer has not committed yet, as long
/// as it takes (a peer that dies ends the wait with [`RecvError::PeerDead`]);
/// `try_next_part`, `next_part_timeout` and `to_vec_timeout` bound that wait.
pub struct Record<'a> {
    pub(super) consumer: &'a mut Consumer,
    /// A record within one segment: its bytes in place (`as_bytes` then needs nothing from
    /// the consumer, which keeps the reader's loop tight however the caller's code compiles).
    /// Null for a spanning record, whose state is the consumer's `span`.
    ptr: *const u8,
    len: u32,
    spanning: bool,
}

impl std::fmt::Debug for Record<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Record")
            .field("region", &self.consumer.shared.name)
            .field("len", &self.len())
            .field("spanning", &self.spanning)
            .finish()
    }
}

impl<'a> Record<'a> {
    #[inline(always)]
    pub(super) fn single(consumer: &'a mut Consumer, ptr: *const u8, len: usize) -> Record<'a> {
        // A frame's length is a u32 (frame.rs), so `len` fits.
        Record {
            consumer,
            ptr,
            len: len as u32,
            spanning: false,
        }
    }

    pub(super) fn new(consumer: &'a mut Consumer, kind: RecordKind) -> Record<'a> {
        match kind {
            RecordKind::Single { ptr, len } => Record::single(consumer, ptr, len),
            RecordKind::Span(span) => {
                consumer.span = span;
                Record {
                    consumer,
                    ptr: std::ptr::null(),
                    len: 0,
                    spanning: true,
                }
            }
        }
    }

    /// Offset of a single record's bytes in the segment in hand.
    fn at(&self) -> usize {
        let base = self
            .consumer
            .cur
            .as_ref()
            .expect("a record's segment is in hand")
            .base;
        self.ptr as usize - base as usize
    }
}

impl Record<'_> {
    /// The bytes, in place, for a record within one segment; `None` for a spanning record
    /// (use [`Record::next_part`], [`Record::to_vec`] or `io::Read`).
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// tx.send(b"in place")?;
    /// tx.flush()?;
    /// let r = rx.recv()?.unwrap();
    /// assert_eq!(r.as_bytes(), Some(&b"in place"[..])); // a view into shared memory
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    #[inline]
    pub fn as_bytes(&self) -> Option<&[u8]> {
        if self.spanning {
            return None;
        }
        #[cfg(shmflow_loom)]
        self.consumer.track(self.at(), self.len as usize);
        // SAFETY: `ptr` is `len` committed bytes of the segment in hand, which is not
        // returned while this record borrows the consumer (see `view`).
        Some(unsafe { std::slice::from_raw_parts(self.ptr, self.len as usize) })
    }

    /// A `Pod` value viewed in place, if the record is in one segment and its size and
    /// alignment fit `T` (payloads are 8-byte aligned).
    pub fn as_pod<T: bytemuck::Pod>(&self) -> Option<&T> {
        bytemuck::try_from_bytes(self.as_bytes()?).ok()
    }

    /// The length of a record within one segment; `None` for a spanning record (longer than
    /// a segment minus its 8-byte header: [`Producer::max_unspanned_len`](crate::Producer::max_unspanned_len)),
    /// whose length the producer may not have known up front. Read it part by part or with
    /// [`Record::to_vec`] to learn it.
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// tx.send(b"four")?;
    /// tx.send(&vec![7u8; 100_000])?; // larger than a 32 KiB segment: it spans
    /// drop(tx);
    /// assert_eq!(rx.recv()?.unwrap().len(), Some(4));
    /// let mut big = rx.recv()?.unwrap();
    /// assert_eq!((big.len(), big.as_bytes()), (None, None));
    /// assert_eq!(big.to_vec()?.len(), 100_000);
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn len(&self) -> Option<usize> {
        (!self.spanning).then_some(self.len as usize)
    }

    /// True for an empty record in one segment.
    pub fn is_empty(&self) -> bool {
        self.len() == Some(0)
    }

    /// True if the record spans segments.
    pub fn is_spanning(&self) -> bool {
        self.spanning
    }

    /// The next part's place. A wait for a part that is not committed yet ends when
    /// `patience` runs out and leaves the record as it was, so the call can be repeated.
    pub(super) fn next_part_at<P: Patience>(
        &mut self,
        patience: P,
    ) -> Got<Option<(usize, usize)>, P> {
        if !self.spanning {
            let part = (self.at(), self.len as usize);
            // Yield once: mark as consumed by turning it into an ended span.
            self.consumer.span = Span {
                next: None,
                ended: true,
                total: part.1 as u64,
            };
            self.spanning = true;
            return Ok(Some(part));
        }
        let c = &mut *self.consumer;
        if let Some(p) = c.span.next.take() {
            return Ok(Some(p));
        }
        if c.span.ended {
            return Ok(None);
        }
        let f = match c.wait_frame::<P, Infallible>(patience)? {
            Waited::Frame(f) => f,
            Waited::End => {
                // The producer detached in the middle of the record.
                c.in_span = false;
                c.span.ended = true;
                return Err(aborted(&c.shared.name).into());
            }
            Waited::Priority(never) => match never {},
        };
        c.advance(f);
        match f.kind {
            frame::MIDDLE => {}
            frame::LAST => {
                c.in_span = false;
                c.span.ended = true;
            }
            _ => {
                debug_assert_eq!(f.kind, frame::ABORT);
                c.in_span = false;
                c.span.ended = true;
                return Err(aborted(&c.shared.name).into());
            }
        }
        c.span.total += f.len as u64;
        if c.span.total > c.max_record_len {
            return Err(c.too_large(c.span.total).into());
        }
        if c.span.ended {
            let t = c.span.total;
            c.count_record(t);
        }
        Ok(Some((f.at + HEADER, f.len)))
    }

    /// The next part of the record, in place (no copy); `None` after the last. A record in one
    /// segment has one part. For a spanning record each call may wait for the producer, and
    /// moving to the next part gives the previous segment back (which is why a part borrows
    /// the record mutably: parts of records larger than the pool cannot all be held at once).
    ///
    /// # Errors
    /// [`RecvError::RecordAborted`] if the producer abandoned the record, and the failures of
    /// [`Consumer::recv`].
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::Geometry;
    ///
    /// // A record larger than a segment arrives in parts, each read in place.
    /// let (mut tx, mut rx) = shmflow::pair(Geometry { segment_size: 4096, segment_count: 4 })?;
    /// let big = vec![5u8; 10_000];
    /// let t = std::thread::spawn(move || tx.send(&big));
    /// let mut r = rx.recv()?.unwrap();
    /// assert!(r.is_spanning());
    /// let mut total = 0;
    /// while let Some(part) = r.next_part()? {
    ///     total += part.len();
    /// }
    /// assert_eq!(total, 10_000);
    /// t.join().unwrap()?;
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn next_part(&mut self) -> Result<Option<&[u8]>, RecvError> {
        self.part(Forever).map_err(Into::into)
    }

    /// As [`Record::next_part`], without waiting: [`TryRecvError::Empty`] if the producer has
    /// not committed the next part yet. The record stays as it was; call again later.
    pub fn try_next_part(&mut self) -> Result<Option<&[u8]>, TryRecvError> {
        self.part(Immediately).map_err(Into::into)
    }

    /// As [`Record::next_part`], waiting at most `timeout` for the next part
    /// ([`RecvTimeoutError::Timeout`]; the record stays as it was).
    pub fn next_part_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<&[u8]>, RecvTimeoutError> {
        self.part(Until::after(timeout)).map_err(Into::into)
    }

    /// As [`Record::next_part`], waiting until `deadline` at most.
    pub fn next_part_deadline(
        &mut self,
        deadline: Instant,
    ) -> Result<Option<&[u8]>, RecvTimeoutError> {
        self.part(Until::at(deadline)).map_err(Into::into)
    }

    fn part<P: Patience>(&mut self, patience: P) -> Got<Option<&[u8]>, P> {
        match self.next_part_at(patience)? {
            Some((at, len)) => Ok(Some(self.consumer.view(at, len))),
            None => Ok(None),
        }
    }

    /// Appends the whole record to `out` (one copy; spanning records are reassembled),
    /// waiting as long as the producer takes to commit the parts.
    ///
    /// # Errors
    /// As [`Record::next_part`].
    pub fn read_all_into(self, out: &mut Vec<u8>) -> Result<(), RecvError> {
        self.read_all_until(out, Forever).map_err(Into::into)
    }

    /// The whole record as one contiguous `Vec` (one copy), waiting as long as the producer
    /// takes to commit the parts.
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// tx.send(b"copied out")?;
    /// tx.flush()?;
    /// let owned: Vec<u8> = rx.recv()?.unwrap().to_vec()?; // safe to keep and to validate
    /// assert_eq!(owned, b"copied out");
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Record::next_part`].
    pub fn to_vec(self) -> Result<Vec<u8>, RecvError> {
        self.collect_until(Forever).map_err(Into::into)
    }

    /// As [`Record::to_vec`], but the whole record must arrive within `timeout`, else
    /// [`RecvTimeoutError::Timeout`] (the rest of the record is then skipped by the
    /// consumer's next read). A record within one segment never waits.
    pub fn to_vec_timeout(self, timeout: Duration) -> Result<Vec<u8>, RecvTimeoutError> {
        self.collect_until(Until::after(timeout))
            .map_err(Into::into)
    }

    /// As [`Record::to_vec_timeout`], with the deadline as an instant.
    pub fn to_vec_deadline(self, deadline: Instant) -> Result<Vec<u8>, RecvTimeoutError> {
        self.collect_until(Until::at(deadline)).map_err(Into::into)
    }

    fn collect_until<P: Patience>(self, patience: P) -> Got<Vec<u8>, P> {
        let mut v = Vec::with_capacity(self.len().unwrap_or(0));
        self.read_all_until(&mut v, patience)?;
        Ok(v)
    }

    fn read_all_until<P: Patience>(mut self, out: &mut Vec<u8>, patience: P) -> Got<(), P> {
        if !self.spanning {
            out.extend_from_slice(self.consumer.view(self.at(), self.len as usize));
            return Ok(());
        }
        while let Some((at, len)) = self.next_part_at(patience)? {
            out.extend_from_slice(self.consumer.view(at, len));
        }
        Ok(())
    }
}

impl io::Read for Record<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let Some((at, len)) = self.next_part_at(Forever).map_err(Halt::failure)? else {
                return Ok(0);
            };
            let n = buf.len().min(len);
            buf[..n].copy_from_slice(&self.consumer.view(at, n)[..n]);
            if n < len || len == 0 {
                // Hand the rest of this part out first next time (`next_part_at` turned the
                // record into a span whose pending part this is).
                self.consumer.span.next = (n < len).then_some((at + n, len - n));
            }
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
        }
    }
}

impl Drop for Record<'_> {
    fn drop(&mut self) {
        // Under loom a failed model unwinds through here; more loom operations would abort.
        #[cfg(shmflow_loom)]
        if std::thread::panicking() {
            return;
        }
        if self.spanning && !self.consumer.span.ended {
            self.consumer.skipping = true;
        }
    }
}

/// What a consumer receives with [`crate::Consumer::recv_message`].
#[non_exhaustive]
pub enum Message<'a> {
    /// A record.
    Record(Record<'a>),
    /// An event (ordinary or priority).
    Event(Event<'a>),
    /// A checkpoint barrier (in its place, or its announcement through the priority lane).
    Barrier(Barrier<'a>),
    /// A latency marker, in its place among the records: its age is already counted in this
    /// end's latency figures ([`Consumer::latency`](crate::Consumer::latency)); a stage passes
    /// it on with [`Producer::forward_latency_marker`](crate::Producer::forward_latency_marker).
    /// A plain `recv` counts it and goes on.
    LatencyMarker(crate::endpoint::markers::LatencyMarker),
}

impl std::fmt::Debug for Message<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Message::Record(r) => f.debug_tuple("Record").field(r).finish(),
            Message::Event(e) => f.debug_tuple("Event").field(e).finish(),
            Message::Barrier(b) => f.debug_tuple("Barrier").field(b).finish(),
            Message::LatencyMarker(m) => f.debug_tuple("LatencyMarker").field(m).finish(),
        }
    }
}

#[cfg(all(test, not(shmflow_loom)))]
mod size_tests {
    use super::Record;
    use crate::error::{Error, RecvError, RecvTimeoutError, SendError, TryRecvError, TrySendError};
    use std::mem::size_of;

    /// What the hot calls return stays small: a record and its error fit in four words (the
    /// details of a failure are boxed). Before the errors were split per operation, the one
    /// error type was 80 bytes and so was `recv`'s result.
    #[test]
    fn hot_results_are_small() {
        type Recv<'a> = Option<Record<'a>>;
        assert!(size_of::<Error>() <= 16, "{}", size_of::<Error>());
        assert!(size_of::<TryRecvError>() <= 16);
        assert!(size_of::<TrySendError>() <= 16);
        let sizes = [
            size_of::<std::result::Result<Recv<'static>, RecvError>>(),
            size_of::<std::result::Result<Recv<'static>, TryRecvError>>(),
            size_of::<std::result::Result<Recv<'static>, RecvTimeoutError>>(),
            size_of::<std::result::Result<(), SendError>>(),
            size_of::<std::result::Result<(), TrySendError>>(),
        ];
        for s in sizes {
            assert!(s <= 32, "{sizes:?}");
        }
    }
}
