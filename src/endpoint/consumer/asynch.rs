//! The consumer's waiting calls as futures, for async tasks (feature `tokio`).
//!
//! Each is its `try_` form in a loop: try; if it would block, wait in the executor until the
//! producer publishes, ends the stream or dies ([`park::wait_async`]); try again. A `try_`
//! call that would block changes nothing, so dropping the future at its `.await` loses
//! nothing: the record it was waiting for is read by the next call.

use super::*;
use crate::endpoint::waiting::{spend_budget, Waiting};
use crate::protocol::bridge::Bridges;

impl Consumer {
    /// Waits in the executor until a `try_` read would not block: a frame, the end of the
    /// stream, or the producer's death. The time counts as idle, as a thread's wait does.
    async fn readable(&mut self) -> Result<()> {
        let shared = self.shared.clone();
        let h = shared.header();
        let got = {
            let _idle = Waiting::start(
                &h.consumer_counters.idle_since_ns,
                &h.consumer_counters.idle_ns,
            );
            park::wait_async(
                shared.consumer_park(),
                &shared.name,
                Bridges::global(),
                self.wait,
                park::Notifier::Light,
                |look| self.poll_wait(look),
            )
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
    pub async fn recv_async(&mut self) -> Result<Option<Record<'_>>, RecvError> {
        spend_budget(&mut self.coop).await;
        loop {
            {
                let this: *mut Consumer = self;
                // SAFETY: `this` is `self`, reborrowed for one call. The borrow ends with the
                // call on every path but the `return`, which returns it for the lifetime of
                // `self`; the compiler cannot see that the `WouldBlock` path holds no borrow
                // (a known limit of its borrow checker), so it is reborrowed through a pointer.
                match unsafe { &mut *this }.recv_inner(Deadline::Now) {
                    Err(Error::WouldBlock) => {}
                    r => return op(r),
                }
            }
            op(self.readable().await)?;
        }
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
                // SAFETY: as in `recv_async`.
                match unsafe { &mut *this }.message_inner(Deadline::Now) {
                    Err(Error::WouldBlock) => {}
                    r => return op(r),
                }
            }
            self.watch_prio = true;
            let ready = self.readable().await;
            self.watch_prio = false;
            op(ready)?;
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
            match self.next_part_at(Deadline::Now) {
                Ok(Some((at, len))) => return Ok(Some(self.consumer.view(at, len))),
                Ok(None) => return Ok(None),
                Err(Error::WouldBlock) => op(self.consumer.readable().await)?,
                Err(e) => return op(Err(e)),
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
