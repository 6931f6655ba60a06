//! The consumer's waiting calls as futures, for async tasks (feature `tokio`).
//!
//! Each is its `try_` form in a loop: try; if it would block, wait in the executor until the
//! producer publishes, ends the stream or dies ([`park::wait_async`]); try again. A `try_`
//! call that would block changes nothing, so dropping the future at its `.await` loses
//! nothing: the record it was waiting for is read by the next call.

use super::{Consumer, Message, Record, Seen, Skip};
use crate::endpoint::metrics::Waiting;
use crate::endpoint::waiting::{poll_budget, spend_budget, start_slow, Slow};
use crate::error::{settled, Halt, RecvError};
use crate::protocol::figures;
use crate::protocol::park::{self, Immediately, Look, WaitStrategy};
use crate::region::bridge::Bridges;
use crate::region::os::Host;

impl Consumer {
    /// Waits in the executor on the consumer's park word with `wait` until `look` gives a
    /// value (the one wait of every async reader and of the network bridge).
    pub(super) async fn park_async<T>(
        &mut self,
        wait: WaitStrategy,
        pace: park::Pace,
        mut look: impl FnMut(&mut Consumer, Look) -> Result<Option<T>, RecvError>,
    ) -> Result<T, RecvError> {
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if self.link.is_some() {
            // A direct network end: between looks, what arrived is read into the region as
            // the socket becomes readable.
            let _ = (wait, pace);
            return std::future::poll_fn(|cx| loop {
                if let Some(t) = look(self, Look::IfDue)? {
                    return std::task::Poll::Ready(Ok(t));
                }
                let Some(l) = &mut self.link else {
                    continue;
                };
                l.fill(Some(std::time::Instant::now()));
                if let Some(t) = look(self, Look::Quick)? {
                    return std::task::Poll::Ready(Ok(t));
                }
                if let Some(l) = &mut self.link {
                    std::task::ready!(l.poll_readable(cx));
                }
            })
            .await;
        }
        let shared = self.shared.clone();
        // Boxed: the waiting state is large and needed only here, so that the calls that
        // find their work done at once stay small futures.
        // SAFETY: the word is in the region that `shared`, owned by this future, maps.
        Box::pin(unsafe {
            park::wait_async::<Host, _, RecvError>(
                park::WaitOn {
                    word: shared.consumer_park(),
                    bell: shared.consumer_bell(),
                },
                &shared.name,
                Bridges::global(),
                wait,
                park::Notifier::Light,
                pace,
                |l| look(self, l),
            )
        })
        .await
    }

    /// Waits in the executor until a `try_` read would not block: a frame (or, if `S` takes
    /// them, a pending priority event; `S` skips them too if it says so), the end of the
    /// stream, or the producer's death. The time counts as idle, as a thread's wait does.
    pub(super) async fn readable<S: Seen>(&mut self) -> Result<(), RecvError> {
        let shared = self.shared.clone();
        let h = shared.header();
        let got = {
            let _idle = Waiting::start(figures::consumer_idle(h));
            let pace = self.pace();
            self.park_async(self.wait, pace, |c, look| {
                Ok(c.poll_wait::<S>(look)?.map(|_| ()))
            })
            .await
        };
        self.wait_mark = self.cur.map(|c| (c.seg, c.rd));
        got.map(|_| ())
    }

    /// As [`Consumer::recv`], waiting in the executor instead of blocking the thread.
    ///
    /// Cancellation: dropping the future before it completes loses no record; the next call
    /// returns the record it was waiting for. Wrapping it in `tokio::time::timeout` is the
    /// async form of [`Consumer::recv_timeout`].
    ///
    /// # Errors
    /// As [`Consumer::recv`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), shmflow::Error> {
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// let writer = tokio::task::spawn_blocking(move || -> Result<(), shmflow::SendError> {
    ///     tx.send(b"from a thread")?;
    ///     Ok(()) // dropping the producer ends the stream
    /// });
    /// while let Some(r) = rx.recv_async().await? {
    ///     assert_eq!(r.as_bytes(), Some(&b"from a thread"[..]));
    /// }
    /// writer.await.unwrap()?;
    /// # Ok(()) }
    /// ```
    pub fn recv_async(&mut self) -> RecvAsync<'_> {
        RecvAsync {
            consumer: Some(self),
            slow: None,
        }
    }

    /// [`Consumer::recv_async`] once the first try found nothing: tries again after each wait.
    async fn recv_async_slow(&mut self) -> Result<Option<Record<'_>>, RecvError> {
        loop {
            self.readable::<Skip>().await?;
            {
                let this: *mut Consumer = self;
                // SAFETY: `this` is `self`, reborrowed for one call. The borrow ends with the
                // call on every path but the `return`, which returns it for the lifetime of
                // `self`; the compiler cannot see that the "not now" path holds no borrow
                // (a known limit of its borrow checker), so it is reborrowed through a pointer.
                let got = unsafe { &mut *this }.recv_inner::<_, Halt<_, _>>(Immediately);
                if let Some(r) = settled(got) {
                    return r;
                }
            }
        }
    }

    /// As [`Consumer::drain`], but waits in the executor until there is something: hands every
    /// record available (at most `max`, at least one unless the stream ended) to `f`, and
    /// returns how many; `Ok(0)` is the end of the stream. The throughput-minded async reader's
    /// loop: records that are already there are handed out as by `drain`, with no future per
    /// record. After a call that stopped where a streaming writer is (it read at least a
    /// kilobyte since it last waited, or moved to another segment, or never waited), the next
    /// one first leaves the writer alone for the
    /// wait's gap, as a blocking reader does after a batch (with the default
    /// [`WaitStrategy::Block`]; the other strategies look at once): a reader that looked at once
    /// would find the record or two committed since, call after call, and pull the cache line
    /// the writer is filling each time. Dropping the future while it waits loses nothing.
    ///
    /// # Errors
    /// `f`'s error, or what `recv_async` would return (converted with `From<RecvError>`).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), shmflow::Error> {
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// for _ in 0..100 {
    ///     tx.send(b"x")?;
    /// }
    /// drop(tx);
    /// let mut total = 0;
    /// loop {
    ///     let n = rx
    ///         .drain_async(usize::MAX, |r| {
    ///             total += r.len().unwrap_or(0);
    ///             Ok::<_, shmflow::Error>(())
    ///         })
    ///         .await?;
    ///     if n == 0 {
    ///         break; // end of stream
    ///     }
    /// }
    /// assert_eq!(total, 100);
    /// # Ok(()) }
    /// ```
    pub async fn drain_async<F, E>(&mut self, max: usize, mut f: F) -> Result<usize, E>
    where
        F: FnMut(Record<'_>) -> Result<(), E>,
        E: From<RecvError>,
    {
        if std::mem::take(&mut self.caught_up) {
            // The last call caught up with a streaming writer: looking at once would pull the
            // line it is filling and find the one or two records committed since, call after
            // call, which slows both ends to the pace of that line moving between their
            // caches. Leave the writer alone for the wait's gap first (`WaitStrategy::Block`,
            // as a blocking reader does after a batch; the other strategies look at once), so
            // that the next batch is a large one.
            self.readable::<Skip>().await?;
        }
        let n = self.try_drain(max, &mut f)?;
        if n > 0 || max == 0 {
            // Fewer than `max`: it stopped where the writer is; a streaming one if the reader
            // moved on by `STREAM_BYTES` since it last waited (as `recv_async` tells).
            self.caught_up = n < max && self.pace() == park::Pace::Stream;
            return Ok(n);
        }
        // Nothing now: wait for one record (`None`: the end of the stream), then the rest.
        match self.recv_async().await? {
            Some(r) => f(r)?,
            None => return Ok(0),
        }
        Ok(1 + self.try_drain(max - 1, &mut f)?)
    }

    /// As [`Consumer::recv_message`], waiting in the executor. Cancellation as for
    /// [`Consumer::recv_async`].
    ///
    /// # Errors
    /// As [`Consumer::recv`].
    pub async fn recv_message_async(&mut self) -> Result<Option<Message<'_>>, RecvError> {
        spend_budget(&mut self.coop).await;
        loop {
            {
                let this: *mut Consumer = self;
                // SAFETY: as in `recv_async_slow`.
                if let Some(r) = settled(unsafe { &mut *this }.message_inner(Immediately)) {
                    return r;
                }
            }
            self.readable::<()>().await?;
        }
    }
}

impl Record<'_> {
    /// As [`Record::next_part`], waiting in the executor for the next part. Dropping the
    /// future leaves the record as it was: the next call returns the same part.
    ///
    /// # Errors
    /// As [`Record::next_part`].
    pub async fn next_part_async(&mut self) -> Result<Option<&[u8]>, RecvError> {
        loop {
            match settled(self.next_part_at(Immediately)) {
                Some(Ok(Some((at, len)))) => return Ok(Some(self.consumer.view(at, len))),
                Some(Ok(None)) => return Ok(None),
                None => self.consumer.readable::<std::convert::Infallible>().await?,
                Some(Err(e)) => return Err(e),
            }
        }
    }

    /// As [`Record::read_all_into`], waiting in the executor for the parts. Dropping the
    /// future drops the record: what it read stays in `out`, and the consumer skips the rest.
    ///
    /// # Errors
    /// As [`Record::next_part`].
    pub async fn read_all_into_async(mut self, out: &mut Vec<u8>) -> Result<(), RecvError> {
        while let Some(part) = self.next_part_async().await? {
            out.extend_from_slice(part);
        }
        Ok(())
    }

    /// As [`Record::to_vec`], waiting in the executor for the parts.
    ///
    /// # Errors
    /// As [`Record::next_part`].
    pub async fn to_vec_async(self) -> Result<Vec<u8>, RecvError> {
        let mut v = Vec::with_capacity(self.len().unwrap_or(0));
        self.read_all_into_async(&mut v).await?;
        Ok(v)
    }
}

/// The future of [`Consumer::recv_async`]. A record that is there is taken in the first poll
/// without building the waiting state (which is boxed, and built only if the first try finds
/// nothing): the async loop costs little more than the blocking one.
#[must_use = "futures do nothing unless awaited"]
pub struct RecvAsync<'a> {
    /// The consumer, until the first poll takes it (into the slow path if need be).
    consumer: Option<&'a mut Consumer>,
    slow: Option<Slow<'a, Result<Option<Record<'a>>, RecvError>>>,
}

impl<'a> std::future::Future for RecvAsync<'a> {
    type Output = Result<Option<Record<'a>>, RecvError>;

    #[inline(always)]
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = &mut *self;
        // The common case, kept apart from the rest so that its output is built where the
        // caller matches it: nothing waiting yet, no look at the executor's budget due, and a
        // whole record there. The same steps as the rest's, in the same order.
        if this.slow.is_none() {
            if let Some(c) = this.consumer.take() {
                if c.coop > 0 {
                    if let Some((len, ptr)) = c.fast_whole() {
                        c.coop -= 1;
                        c.count_record(len as u64);
                        return std::task::Poll::Ready(Ok(Some(Record::single(c, ptr, len))));
                    }
                }
                this.consumer = Some(c);
            }
        }
        this.poll_rest(cx)
    }
}

impl<'a> RecvAsync<'a> {
    /// [`RecvAsync::poll`] past its common case: the slow path's poll, the budget's look,
    /// the record found by the full checks, or the start of the wait. Out of line.
    #[inline(never)]
    fn poll_rest(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Option<Record<'a>>, RecvError>> {
        let this = self;
        if let Some(slow) = &mut this.slow {
            return slow.as_mut().poll(cx);
        }
        let Some(c) = this.consumer.take() else {
            panic!("`RecvAsync` polled after it completed");
        };
        if poll_budget(&mut c.coop, cx).is_pending() {
            this.consumer = Some(c);
            return std::task::Poll::Pending;
        }
        // The fast path first, building the future's own output (almost every record): the
        // same as `Consumer::recv_inner`'s, which this must follow.
        if let Some((len, ptr)) = c.fast_whole() {
            c.count_record(len as u64);
            return std::task::Poll::Ready(Ok(Some(Record::single(c, ptr, len))));
        }
        {
            let p: *mut Consumer = c;
            // SAFETY: as in `recv_async_slow`: `p` is `c`, reborrowed for one call whose
            // result borrows it only on the path that returns it.
            if let Some(r) = settled(unsafe { &mut *p }.recv_slow(Immediately)) {
                return std::task::Poll::Ready(r);
            }
        }
        start_slow(&mut this.slow, Box::pin(c.recv_async_slow()), cx)
    }
}

impl std::fmt::Debug for RecvAsync<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvAsync")
            .field("waiting", &self.slow.is_some())
            .finish()
    }
}
