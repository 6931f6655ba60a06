//! The producer's waiting calls as futures, for async tasks (feature `tokio`).
//!
//! Each waits in the executor for what its `try_` form lacks — enough free segments for the
//! whole record, or room in the priority lane — and then does the `try_` form, which cannot
//! block any more. Until then nothing is written, so dropping the future at its `.await`
//! publishes nothing. The wait is backpressure, counted as the blocking calls count it.

use super::{Bound, Claim, Producer, RecordWriter};
use crate::endpoint::metrics::Waiting;
use crate::endpoint::waiting::{segment_budget, spend_budget, start_slow, Slow};
use crate::error::{aborted, settled, Halt, NotNow, SendError, WriteError};
use crate::protocol::figures;
use crate::protocol::frame::HEADER;
use crate::protocol::lane::Entry;
use crate::protocol::park::{self, Deadline, Immediately, Look};

use super::Sent;
use crate::region::bridge::Bridges;
use crate::region::os::Host;

impl Producer {
    /// Waits in the executor until `poll` gives a value, with `producer_park` as the word, the
    /// time counted as backpressure.
    pub(super) async fn wait_async<T>(
        &mut self,
        mut poll: impl FnMut(&mut Producer, Look) -> Result<Option<T>, SendError>,
    ) -> Result<T, SendError> {
        let shared = self.shared.clone();
        let h = shared.header();
        let _blocked = Waiting::start(figures::backpressure(h));
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if self.link.is_some() {
            // A direct network end: between looks, what the peer sent (credit) is read as
            // the socket becomes readable.
            return std::future::poll_fn(|cx| loop {
                if let Some(t) = poll(self, Look::IfDue)? {
                    return std::task::Poll::Ready(Ok(t));
                }
                let Some(l) = &mut self.link else {
                    continue;
                };
                l.wait(Some(std::time::Instant::now()));
                if let Some(t) = poll(self, Look::Quick)? {
                    return std::task::Poll::Ready(Ok(t));
                }
                if let Some(l) = &mut self.link {
                    std::task::ready!(l.poll_readable(cx));
                }
            })
            .await;
        }
        // Boxed: the waiting state is large and needed only here, so that the calls that
        // find their work done at once stay small futures.
        // SAFETY: the word is in the region that `shared`, owned by this future, maps.
        Box::pin(unsafe {
            park::wait_async::<Host, _, SendError>(
                park::WaitOn {
                    word: h.producer_park(),
                    bell: shared.producer_bell(),
                },
                &shared.name,
                Bridges::global(),
                self.wait,
                park::Notifier::Rmw,
                park::Pace::Sparse,
                |look| poll(self, look),
            )
        })
        .await
    }

    /// Waits until `k` segments are free (or the consumer is gone); with `Bound::Capped`, also
    /// until the consumer's cap lets a record start.
    async fn free_async(&mut self, k: u64, bound: Bound) -> Result<(), SendError> {
        let mut last_ready = None;
        self.wait_async(|p, look| p.poll_free(k, bound, &mut last_ready, look))
            .await
    }

    /// Free segments a record of `len` bytes needs to go whole now, or `None` if that is more
    /// than can be free at once or than the channel owns (a gate channel's exclusive segments).
    fn needs(&self, len: usize) -> Option<u64> {
        if HEADER + len <= self.seg_size {
            Some(1 + self.pending_abort as u64)
        } else {
            // At most what the channel owns: a gate channel waiting for floating segments to
            // be free all at once could wait for ever while other channels hold them, where
            // the blocking `send` goes part by part.
            self.spanning_needs(len)
                .filter(|&k| k <= self.shared.initial_free)
        }
    }

    /// As [`Producer::send`], waiting in the executor instead of blocking the thread.
    ///
    /// The record is anything that is bytes by reference (`&[u8]`, `&[u8; N]`, `&Vec<u8>`,
    /// `&str`), and the future keeps its type: for an array, whose length is part of the type,
    /// the write is built for that length where the future is polled, as the blocking `send`
    /// is where it is inlined.
    ///
    /// Cancellation: dropping the future before it completes sends nothing of the record,
    /// unless it needs more segments than the channel owns (its pool, or a gate channel's
    /// exclusive segments): such a record goes out part by part
    /// (as [`RecordWriter::write_async`]), and if the future is dropped half-way the consumer
    /// is told it was aborted ([`RecvError::RecordAborted`](crate::RecvError::RecordAborted)),
    /// never given a piece of it. `tokio::time::timeout` around it is the async form of
    /// [`Producer::send_timeout`].
    ///
    /// # Errors
    /// As [`Producer::send`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), shmflow::Error> {
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// tx.send_async(b"from a task").await?;
    /// assert_eq!(rx.recv_async().await?.unwrap().as_bytes(), Some(&b"from a task"[..]));
    /// # Ok(()) }
    /// ```
    pub fn send_async<'a, B>(&'a mut self, bytes: &'a B) -> SendAsync<'a, B>
    where
        B: AsRef<[u8]> + ?Sized,
    {
        SendAsync {
            producer: Some(self),
            bytes,
            slow: None,
        }
    }

    /// [`Producer::send_async`] once the first try could not send: waits for the segments the
    /// record needs, then tries again.
    async fn send_async_slow(&mut self, bytes: &[u8]) -> Result<(), SendError> {
        loop {
            let Some(need) = self.needs(bytes.len()) else {
                return self.send_by_parts(bytes).await;
            };
            match settled(self.send_inner(bytes, Immediately)) {
                None => self.free_async(need, Bound::Capped).await?,
                Some(r) => return r,
            }
        }
    }

    /// A record larger than the pool can hold at once: streamed, each part waiting for its
    /// segment.
    async fn send_by_parts(&mut self, bytes: &[u8]) -> Result<(), SendError> {
        let mut w = self.stream_async().await?;
        let name = w.producer.shared.name.clone();
        // (Dropped here, the writer goes with the future: the record is aborted.)
        match w.write_async_core(bytes).await {
            Ok(()) => {}
            // (`overflow` cannot find no segment after the wait; if it did, the record is
            // lost, which the consumer is told.)
            Err(Halt::Expired(_)) => return Err(aborted(&name).into()),
            Err(Halt::Failed(e)) => return Err(e),
        }
        Ok(w.finish_inner()?)
    }

    /// As [`Producer::send_pod`], waiting in the executor.
    ///
    /// # Errors
    /// As [`Producer::send`].
    pub fn send_pod_async<'a, T: bytemuck::Pod>(&'a mut self, value: &'a T) -> SendAsync<'a> {
        self.send_async(bytemuck::bytes_of(value))
    }

    /// As [`Producer::claim`], waiting in the executor for a segment. Dropping the future
    /// claims nothing.
    ///
    /// # Errors
    /// As [`Producer::claim`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), shmflow::Error> {
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// let mut claim = tx.claim_async(8).await?;
    /// claim.copy_from_slice(&42u64.to_le_bytes());
    /// claim.commit();
    /// assert_eq!(rx.recv_async().await?.unwrap().as_pod::<u64>(), Some(&42));
    /// # Ok(()) }
    /// ```
    pub async fn claim_async(&mut self, len: usize) -> Result<Claim<'_>, SendError> {
        spend_budget(&mut self.coop).await;
        loop {
            {
                let this: *mut Producer = self;
                // SAFETY: `this` is `self`, reborrowed for one call. The borrow ends with the
                // call on every path but the `return`, which returns it for the lifetime of
                // `self`; the compiler cannot see that the "not now" path holds no borrow
                // (a known limit of its borrow checker), so it is reborrowed through a pointer.
                if let Some(r) = settled(unsafe { &mut *this }.claim_inner(len, Immediately)) {
                    return r;
                }
            }
            let need = 1 + self.pending_abort as u64;
            self.free_async(need, Bound::Capped).await?;
        }
    }

    /// As [`Producer::stream`], waiting in the executor for the first segment. Write to the
    /// record with [`RecordWriter::write_async`]: its `std::io::Write` methods and
    /// `write_bytes` never wait, as for [`Producer::try_stream`] (where a segment would have to
    /// be waited for they fail with [`WriteError::Full`] and the record is lost).
    ///
    /// # Errors
    /// As [`Producer::stream`].
    pub async fn stream_async(&mut self) -> Result<RecordWriter<'_>, SendError> {
        loop {
            {
                let this: *mut Producer = self;
                // SAFETY: as in `claim_async`.
                if let Some(r) = settled(unsafe { &mut *this }.stream_inner(Immediately)) {
                    return r;
                }
            }
            let need = 1 + self.pending_abort as u64;
            self.free_async(need, Bound::Capped).await?;
        }
    }

    /// As [`Producer::send_event`], waiting in the executor. Dropping the future sends
    /// nothing.
    ///
    /// # Errors
    /// As [`Producer::send_event`].
    pub async fn send_event_async(&mut self, kind: u32, payload: &[u8]) -> Result<(), SendError> {
        loop {
            match settled(self.send_event_inner(kind, payload, Immediately)) {
                None => {
                    let need = 1 + self.pending_abort as u64;
                    self.free_async(need, Bound::Capped).await?
                }
                Some(r) => return r,
            }
        }
    }

    /// As [`Producer::send_barrier`], waiting in the executor. Dropping the future sends
    /// nothing. Unlike the blocking form, an announced barrier (unaligned, or aligned with a
    /// timeout) is announced once there is room for the barrier too, as with
    /// [`Producer::send_barrier_timeout`].
    ///
    /// # Errors
    /// As [`Producer::send_barrier`].
    pub async fn send_barrier_async(
        &mut self,
        id: u64,
        alignment: crate::endpoint::event::Alignment,
        payload: &[u8],
    ) -> Result<(), SendError> {
        self.barrier_async(id, alignment, None, payload).await
    }

    /// As [`Producer::forward_barrier`], waiting in the executor (as
    /// [`Producer::send_barrier_async`]).
    ///
    /// # Errors
    /// As [`Producer::send_barrier`].
    pub async fn forward_barrier_async(
        &mut self,
        id: u64,
        alignment: crate::endpoint::event::Alignment,
        emitted_ns: u64,
        payload: &[u8],
    ) -> Result<(), SendError> {
        self.barrier_async(id, alignment, Some(emitted_ns), payload)
            .await
    }

    async fn barrier_async(
        &mut self,
        id: u64,
        alignment: crate::endpoint::event::Alignment,
        emitted_ns: Option<u64>,
        payload: &[u8],
    ) -> Result<(), SendError> {
        loop {
            match settled(self.barrier_inner(id, alignment, emitted_ns, payload, Immediately)) {
                Some(r) => return r,
                None if alignment.announced()
                    && !crate::protocol::lane::lane_has_room(
                        self.shared.header(),
                        self.prio_tail,
                    ) =>
                {
                    self.lane_room_async().await?
                }
                None => {
                    let need = 1 + self.pending_abort as u64;
                    self.free_async(need, Bound::Capped).await?
                }
            }
        }
    }

    /// As [`Producer::send_priority_event`], waiting in the executor for room in the lane.
    /// Dropping the future sends nothing.
    ///
    /// # Errors
    /// As [`Producer::send_priority_event`].
    pub async fn send_priority_event_async(
        &mut self,
        kind: u32,
        payload: &[u8],
    ) -> Result<(), SendError> {
        self.priority_async(Entry::event(kind), payload).await
    }

    /// A lane entry (a priority event or a barrier's announcement), waiting in the executor
    /// for room.
    pub(crate) async fn priority_async(
        &mut self,
        entry: Entry,
        payload: &[u8],
    ) -> Result<(), SendError> {
        loop {
            match settled(self.priority_inner(entry, payload, Immediately)) {
                None => self.lane_room_async().await?,
                Some(r) => return r,
            }
        }
    }

    /// Waits in the executor for room in the priority lane, without pushing: the `try_`
    /// forms push.
    async fn lane_room_async(&mut self) -> Result<(), SendError> {
        self.wait_async(|p, look| {
            if crate::protocol::lane::lane_has_room(p.shared.header(), p.prio_tail) {
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

    /// As [`Producer::flush`]; if a record was aborted half-way (a send that failed or was
    /// dropped), also waits for a segment to tell the consumer so, which `flush` leaves for
    /// later when none is free.
    ///
    /// # Errors
    /// As [`Producer::flush`].
    pub async fn flush_async(&mut self) -> Result<(), SendError> {
        if self.pending_abort && !self.gone {
            // (An abort notice is not held back by the cap.)
            self.free_async(1, Bound::Free).await?;
        }
        // Publishes; a direct end still waiting for credit is awaited below.
        settled(self.flush_inner(Immediately)).unwrap_or(Ok(()))?;
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if self.link.as_ref().is_some_and(|l| l.waiting()) {
            self.wait_async(|p, _| {
                let waiting = p.link.as_ref().is_some_and(|l| l.waiting());
                if !waiting && p.consumer_detached() {
                    return Err(p.closed_error());
                }
                Ok((!waiting).then_some(()))
            })
            .await?;
        }
        Ok(())
    }
}

impl RecordWriter<'_> {
    /// As [`RecordWriter::write_bytes`], waiting in the executor for every further segment
    /// the record grows into. Dropping the future before it completes spoils the record (how
    /// much of `bytes` went in is unknown): later writes and [`RecordWriter::finish`] fail with
    /// [`WriteError::RecordAborted`], and dropping the writer discards the record (the consumer
    /// never sees it, or sees it aborted if parts were already handed over).
    ///
    /// # Errors
    /// As [`RecordWriter::write_bytes`].
    pub async fn write_async(&mut self, bytes: &[u8]) -> Result<(), WriteError> {
        if self.interrupted {
            return Err(aborted(&self.producer.shared.name).into());
        }
        // Set until the write completes: a future dropped part-way leaves it set.
        self.interrupted = true;
        let r = self.write_async_core(bytes).await;
        self.interrupted = false;
        r.map_err(Into::into)
    }

    async fn write_async_core(&mut self, mut bytes: &[u8]) -> Sent<(), Deadline> {
        let seg_size = self.producer.seg_size;
        while !bytes.is_empty() {
            if self.failed {
                return Err(aborted(&self.producer.shared.name).into());
            }
            if self.pos == seg_size {
                // Wait for the next segment here, so that `overflow` finds it free (its
                // `take` cannot block then). Dropped here, or failing, the writer is left as
                // it was: dropping it discards or aborts the record.
                // (The rest of a record is not held back by the cap.)
                self.producer.free_async(1, Bound::Free).await?;
                self.overflow()?;
            }
            let take = bytes.len().min(seg_size - self.pos);
            self.write_inner(&bytes[..take])?;
            bytes = &bytes[take..];
        }
        Ok(())
    }
}

/// The future of [`Producer::send_async`]. A record that fits in the segment in hand is sent
/// in the first poll without building the waiting state (which is boxed, and built only if
/// the record has to wait): the async loop costs little more than the blocking one.
#[must_use = "futures do nothing unless awaited"]
pub struct SendAsync<'a, B: ?Sized = [u8]> {
    /// The producer, until the first poll takes it (into the slow path if need be).
    producer: Option<&'a mut Producer>,
    /// The record, as the caller typed it: for an array (`&[u8; 64]`) its length is a
    /// constant where the future is polled, as it is in the blocking `send` inlined at its
    /// call (the header, the room test and the copy are then built for it), where a slice's
    /// length would be loaded again from the future's state at every poll.
    bytes: &'a B,
    slow: Option<Slow<'a, Result<(), SendError>>>,
}

impl<B: AsRef<[u8]> + ?Sized> std::future::Future for SendAsync<'_, B> {
    type Output = Result<(), SendError>;

    #[inline(always)]
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = &mut *self;
        if let Some(slow) = &mut this.slow {
            return slow.as_mut().poll(cx);
        }
        let Some(p) = this.producer.take() else {
            panic!("`SendAsync` polled after it completed");
        };
        let bytes: &[u8] = this.bytes.as_ref();
        // The common case, kept as short as the blocking `send`'s: the record goes whole into
        // the segment in hand, which needs no wait and cannot fail, and costs no look at the
        // executor's budget (the budget is spent by the segment, see `segment_budget`).
        if p.fits_in_hand(HEADER + bytes.len()) {
            p.write_whole(bytes);
            return std::task::Poll::Ready(Ok(()));
        }
        this.poll_next_segment(p, cx)
    }
}

impl<'a, B: AsRef<[u8]> + ?Sized> SendAsync<'a, B> {
    /// The first poll of a record that does not fit in the segment in hand (or none is in
    /// hand): spends the segment's budget, then sends if that needs no wait, or starts the
    /// slow path. Out of line: once per segment.
    #[cold]
    #[inline(never)]
    fn poll_next_segment(
        &mut self,
        p: &'a mut Producer,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), SendError>> {
        let bytes: &'a [u8] = self.bytes.as_ref();
        if segment_budget(p.seg_size, cx).is_pending() {
            self.producer = Some(p);
            return std::task::Poll::Pending;
        }
        // Within a segment, the `try_` form either sends or changes nothing (records that
        // span go through the slow path, which first waits for all their segments).
        if HEADER + bytes.len() <= p.seg_size {
            match p.send_inner(bytes, Immediately) {
                Ok(()) => return std::task::Poll::Ready(Ok(())),
                Err(Halt::Failed(e)) => return std::task::Poll::Ready(Err(e)),
                Err(Halt::Expired(NotNow)) => {}
            }
        }
        start_slow(&mut self.slow, Box::pin(p.send_async_slow(bytes)), cx)
    }
}

impl<B: AsRef<[u8]> + ?Sized> std::fmt::Debug for SendAsync<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendAsync")
            .field("len", &self.bytes.as_ref().len())
            .field("waiting", &self.slow.is_some())
            .finish()
    }
}
