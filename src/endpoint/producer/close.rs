//! Ending the stream: `flush`, `close` (and waiting until the consumer has read everything,
//! `close_timeout`), `fail`, and the drop.

use std::time::{Duration, Instant};

use super::{Gone, Producer, Sent, WaitStrategy};
use crate::error::{CloseError, Halt, SendError, SendTimeoutError, TimedOut, TrySendError};
use crate::protocol::ends::EndState;
use crate::protocol::figures;
use crate::protocol::park::{self, Forever, Immediately, Look, Patience, Until};
use crate::region::os::Host;

impl Producer {
    /// Makes every record sent so far visible to the consumer and wakes it if it is parked.
    /// A direct network end (`net::Listener::accept_producer`, feature `net`) returns
    /// once every record is on the wire, waiting for credit if it must; a producer in shared
    /// memory never waits here.
    ///
    /// # Errors
    /// [`SendError::Closed`] if the consumer has detached, [`SendError::PeerDead`] once its
    /// death has been seen.
    pub fn flush(&mut self) -> Result<(), SendError> {
        self.flush_inner(Forever).map_err(Into::into)
    }

    /// As [`Producer::flush`], or [`TrySendError::Full`] if a direct network end still holds
    /// records that wait for credit (they are published, and go when credit comes).
    ///
    /// # Errors
    /// As [`Producer::flush`], or [`TrySendError::Full`].
    pub fn try_flush(&mut self) -> Result<(), TrySendError> {
        self.flush_inner(Immediately).map_err(Into::into)
    }

    /// As [`Producer::flush`], waiting at most `timeout` for a direct network end's credit
    /// ([`SendTimeoutError::Timeout`]: the records are published and go when credit comes).
    ///
    /// # Errors
    /// As [`Producer::flush`], or [`SendTimeoutError::Timeout`].
    pub fn flush_timeout(&mut self, timeout: Duration) -> Result<(), SendTimeoutError> {
        self.flush_inner(Until::after(timeout)).map_err(Into::into)
    }

    /// As [`Producer::flush_timeout`], waiting until `deadline` at most.
    ///
    /// # Errors
    /// As [`Producer::flush_timeout`].
    pub fn flush_deadline(&mut self, deadline: Instant) -> Result<(), SendTimeoutError> {
        self.flush_inner(Until::at(deadline)).map_err(Into::into)
    }

    pub(super) fn flush_inner<P: Patience>(&mut self, patience: P) -> Sent<(), P> {
        self.check_gone()?;
        // A producer that only flushes learns of a dead consumer too (a clock read; the
        // liveness syscall at most every `CHECK_INTERVAL`).
        self.check_peer(Look::IfDue)?;
        if self.pending_abort {
            // Best effort: if no segment is free the abort stays pending.
            match self.write_pending_abort(Immediately) {
                Ok(()) | Err(Halt::Expired(_)) => {}
                Err(Halt::Failed(e)) => return Err(Halt::Failed(e)),
            }
        }
        self.publish();
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if let Some(l) = &mut self.link {
            // Under `FlushPolicy::Timeout` the records were published as they were sent and
            // left for the keeper: forward them now.
            l.pump();
        }
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if self.link.as_ref().is_some_and(|l| l.waiting()) {
            // A direct network end: everything goes on the wire first, credit permitting.
            self.wait_producer(patience, |p, _| {
                Ok((!p.link.as_ref().is_some_and(|l| l.waiting())).then_some(()))
            })?;
        }
        #[cfg(not(all(feature = "net", not(shmflow_loom))))]
        let _ = patience;
        if self.consumer_detached() {
            self.gone = true;
            return Err(self.closed_error().into());
        }
        Ok(())
    }

    /// Publishes everything, marks the stream ended and wakes the consumer, which reads what
    /// was committed and then gets end-of-stream. Dropping the producer does the same.
    pub fn close(mut self) {
        self.close_inner(false, None);
    }

    /// Ends the stream as [`close`](Producer::close) does, then waits up to `timeout` until the
    /// consumer has read everything published: the one way for a producer to know that every
    /// record it sent arrived. See [`close_deadline`](Producer::close_deadline).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// tx.send(b"last words")?;
    /// let reader = std::thread::spawn(move || {
    ///     while let Some(r) = rx.recv()? {
    ///         assert_eq!(r.as_bytes(), Some(&b"last words"[..]));
    ///     }
    ///     Ok::<_, shmflow::RecvError>(())
    /// });
    /// tx.close_timeout(Duration::from_secs(10))?; // returns once the record was read
    /// reader.join().unwrap()?;
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`close_deadline`](Producer::close_deadline).
    pub fn close_timeout(self, timeout: Duration) -> Result<(), CloseError> {
        let now = crate::sync::now();
        let deadline = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + Duration::from_secs(1 << 32));
        self.close_deadline(deadline)
    }

    /// Ends the stream as [`close`](Producer::close) does, then waits until `deadline` for
    /// the consumer to read everything published, that is, to hand back every segment it was
    /// given and take every priority event, or to detach after reading every record (counted
    /// when both ends keep metrics, the default). Returning a gate's floating segment wakes
    /// nobody: for a gate channel the wait may look again only every 40 ms. It sleeps on the producer's futex word, woken as segments come back.
    ///
    /// An `Ok` orders memory too: what the consumer's thread did before it handed back the
    /// last segment (its reads, and whatever it did after each) happens before `close`
    /// returns, so a thread of the same process sees it.
    ///
    /// Whatever it returns, the stream is ended, and what was published stays readable: a
    /// named channel that no consumer opened keeps its name for one that opens it later.
    ///
    /// A direct network end (`net::Listener::accept_producer`, feature `net`) sends the rest
    /// and the end (waiting for credit until `deadline`), then waits until the receiver has
    /// everything and ends its side of the connection.
    ///
    /// # Errors
    /// - [`CloseError::NotOpened`]: no consumer attached before the deadline;
    /// - [`CloseError::Timeout`]: the consumer is attached and alive but not done;
    /// - [`CloseError::Closed`]: the consumer detached with records unread;
    /// - [`CloseError::PeerDead`]: the consumer died before reading everything, or (a region
    ///   made with `create_anonymous`) none attached and every copy of its handle is closed
    ///   ([`PeerDeadError::never_attached`](crate::PeerDeadError::never_attached));
    /// - [`CloseError::AlreadyClosed`]: a call before this one had already found the consumer
    ///   gone (it returned `Closed`);
    /// - [`CloseError::Corrupt`], [`CloseError::Io`].
    pub fn close_deadline(mut self, deadline: Instant) -> Result<(), CloseError> {
        if self.gone {
            return Err(self.gone_error().into());
        }
        // A consumer already seen dead is reported at once.
        self.check_peer(Look::Quick)?;
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if self.link.is_some() {
            return self.close_link(deadline);
        }
        self.close_inner(false, None);
        let shared = self.shared.clone();
        let h = shared.header();
        let region = shared.name.clone();
        let acquired = self.counters.acquired.0;
        let written = self.metrics.then_some(self.counters.records.0);
        let prio_sent = self.prio_tail;
        // Segments handed over and not handed back, plus priority events not taken. The
        // consumer publishes its count as it releases each segment, with Release, and the
        // count is read here with Acquire (`figures::read_segments_returned`), so that what the
        // consumer did before it handed the last segment back happens before `close` returns
        // (a lagging value only makes this wait longer). The lane's head is Release/Acquire too.
        let unread = || {
            #[cfg(not(shmflow_broken = "close_counts_taken"))]
            let segments = acquired.saturating_sub(figures::read_segments_returned(h));
            // Broken on purpose (loom only): a segment the consumer took counts as read.
            #[cfg(shmflow_broken = "close_counts_taken")]
            let segments = acquired.saturating_sub(figures::read_segments_taken(h));
            let events = crate::protocol::lane::lane_unread(h, prio_sent);
            segments + events
        };
        let waited = park::wait_for::<Host, _, _, CloseError>(
            h.producer_park(),
            WaitStrategy::Park,
            Until::at(deadline),
            park::Notifier::Rmw,
            park::Pace::Sparse,
            |look| {
                let left = unread();
                if left == 0 {
                    return Ok(Some(Ok(())));
                }
                // Acquire (in `state`): pairs with the consumer's `leave`; its counters were
                // stored before it.
                match h.consumer_end().state() {
                    // An anonymous region's consumer may come while its handle is held.
                    EndState::Free => {
                        self.check_peer(look)?;
                        Ok(None)
                    }
                    EndState::Attached => {
                        self.check_peer(look)?;
                        Ok(None)
                    }
                    EndState::Lost => Err(self.gone_error().into()),
                    _ => {
                        // Detached (its counters were stored before its state): it may have
                        // returned the last segment just before, or read every record and
                        // left the last segment in hand (a reader that knew how many
                        // records to expect).
                        let left = unread();
                        let read = figures::read_records_read(h);
                        Ok(Some(match written {
                            _ if left == 0 => Ok(()),
                            Some(w) if w > 0 && read >= w && prio_sent == 0 => Ok(()),
                            _ => Err(CloseError::Closed {
                                region: region.clone(),
                                unread_segments: left,
                            }),
                        }))
                    }
                }
            },
        );
        match waited {
            Ok(outcome) => outcome,
            Err(Halt::Expired(TimedOut)) => {
                let unread_segments = unread();
                Err(match h.consumer_end().state() {
                    EndState::Free => CloseError::NotOpened {
                        region,
                        unread_segments,
                    },
                    _ => CloseError::Timeout {
                        region,
                        unread_segments,
                    },
                })
            }
            Err(Halt::Failed(e)) => Err(e),
        }
    }

    /// Ends the stream as failed: the consumer reads every record committed so far, then gets
    /// [`RecvError::ProducerFailed`](crate::RecvError::ProducerFailed) (a gate:
    /// [`GateMessage::ChannelFailed`](crate::GateMessage::ChannelFailed)) instead of a clean
    /// end of stream. For a stage that gives up, so that the failure travels down the pipeline;
    /// dropping a producer while its thread panics does the same.
    ///
    /// # Examples
    ///
    /// ```
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// tx.send(b"partial")?;
    /// tx.fail();
    /// assert!(rx.recv()?.is_some());
    /// assert!(matches!(rx.recv(), Err(shmflow::RecvError::ProducerFailed(_))));
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn fail(mut self) {
        self.close_inner(true, None);
    }

    /// A direct network end's `close_deadline`: the rest and the end go out, then the peer's
    /// consumer hands back every segment (its credit says so).
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    fn close_link(mut self, deadline: Instant) -> Result<(), CloseError> {
        use crate::endpoint::remote::Settled;
        self.close_inner(false, Some(deadline));
        let region = self.shared.name.clone();
        let settled = match &mut self.link {
            Some(l) => l.settle(deadline),
            None => Settled::Read,
        };
        match settled {
            Settled::Read => Ok(()),
            Settled::Pending(unread_segments) => Err(CloseError::Timeout {
                region,
                unread_segments,
            }),
            Settled::Left(unread_segments) => Err(CloseError::Closed {
                region,
                unread_segments,
            }),
            Settled::Lost(_) => Err(self.gone_error().into()),
        }
    }

    /// Ends the stream: cleanly, or as failed (`failed`: dropped while unwinding). A direct
    /// network end forwards the rest and the end before it returns (until `until`).
    fn close_inner(&mut self, failed: bool, until: Option<Instant>) {
        if self.closed {
            return;
        }
        self.closed = true;
        #[cfg(not(shmflow_loom))]
        {
            self.flusher = None;
        }
        // A pending abort needs no frame here: end-of-stream in the middle of a spanning
        // record is reported to the consumer as RecordAborted.
        self.seal();
        let h = self.shared.header();
        // Everything sealed above is visible to a consumer that sees the end gone (see
        // `EndSlot::leave`).
        h.producer_end().leave(if failed {
            crate::protocol::ends::Leave::Failed
        } else {
            crate::protocol::ends::Leave::Clean
        });
        self.notify_consumer();
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if let Some(l) = &mut self.link {
            l.drain(until);
        }
        #[cfg(not(all(feature = "net", not(shmflow_loom))))]
        let _ = until;
        self.settle_name();
    }

    /// A named channel's name stays for a consumer that has not come yet if anything was
    /// published, and is removed otherwise (see `region::name`).
    pub(crate) fn settle_name(&self) {
        #[cfg(not(shmflow_loom))]
        {
            use crate::region::name::{settle, Left};
            let left = if self.data.pushed() > 0 || self.prio_tail > 0 {
                Left::Published
            } else {
                Left::Nothing
            };
            settle(&self.shared, crate::error::End::Producer, left);
        }
    }

    /// True if the consumer has detached.
    pub fn is_closed(&self) -> bool {
        self.consumer_detached()
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        // Under loom a failed model unwinds through here; more loom operations would abort.
        #[cfg(shmflow_loom)]
        if std::thread::panicking() {
            return;
        }
        // A producer dropped while its thread unwinds ends the stream as failed, so that the
        // consumer can tell a crash by panic from a finished producer.
        let failed = std::thread::panicking();
        self.close_inner(failed, None);
    }
}

impl From<Gone> for CloseError {
    fn from(g: Gone) -> CloseError {
        match g {
            Gone::Closed(b) => CloseError::AlreadyClosed(b),
            Gone::PeerLost(b) => CloseError::PeerDead(b),
        }
    }
}
