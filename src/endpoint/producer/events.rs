//! Events: ordinary ones, framed in order with the records, and priority ones, which go
//! through the priority lane and overtake the records queued before them.

use std::time::{Duration, Instant};

use super::Producer;
use crate::error::{SendError, SendTimeoutError, TrySendError};
use crate::protocol::frame::{self, HEADER};
use crate::protocol::park::{self, Forever, Immediately, Look, Patience, Until};

use super::Sent;
use crate::region::os::Host;

impl Producer {
    pub(super) fn send_event_inner<P: Patience>(
        &mut self,
        kind: u32,
        payload: &[u8],
        patience: P,
    ) -> Sent<(), P> {
        crate::endpoint::event::check_payload(&self.shared.name, payload)?;
        if self.closed {
            return Err(self.closed_error().into());
        }
        let len = 8 + payload.len();
        self.ensure_room(HEADER + len, patience)?;
        let c = self
            .cur
            .as_mut()
            .expect("ensure_room leaves a segment in hand");
        let at = c.wpos;
        c.wpos = frame::next_frame(at, len);
        self.write_header(at, len as u32, frame::EVENT);
        self.write_bytes(at + HEADER, &(kind as u64).to_le_bytes());
        self.write_bytes(at + 2 * HEADER, payload);
        self.after_frame_end();
        Ok(())
    }

    /// Sends an event in order with the records: the consumer's
    /// [`Consumer::recv_message`](crate::Consumer::recv_message) returns it after every
    /// record sent before it and before every record sent after it (plain `recv` skips it).
    /// `payload` is at most [`crate::MAX_EVENT_PAYLOAD`] bytes. Blocks like `send`.
    ///
    /// # Errors
    /// [`SendError::RecordTooLarge`] for a payload over the limit; otherwise as
    /// [`Producer::send`].
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::Message;
    ///
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// tx.send(b"before")?;
    /// tx.send_event(1, b"checkpoint")?;
    /// tx.send(b"after")?;
    /// drop(tx);
    /// let mut seen = Vec::new();
    /// while let Some(m) = rx.recv_message()? {
    ///     seen.push(match m {
    ///         Message::Record(r) => String::from_utf8(r.to_vec()?).unwrap(),
    ///         Message::Event(e) => format!("event {}", e.kind),
    ///         _ => continue, // kinds of message a later version may add
    ///     });
    /// }
    /// assert_eq!(seen, ["before", "event 1", "after"]);
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn send_event(&mut self, kind: u32, payload: &[u8]) -> Result<(), SendError> {
        self.send_event_inner(kind, payload, Forever)
            .map_err(Into::into)
    }

    /// As [`Producer::send_event`], or [`TrySendError::Full`] without a free segment.
    pub fn try_send_event(&mut self, kind: u32, payload: &[u8]) -> Result<(), TrySendError> {
        self.send_event_inner(kind, payload, Immediately)
            .map_err(Into::into)
    }

    /// As [`Producer::send_event`], waiting at most `timeout` for a free segment.
    pub fn send_event_timeout(
        &mut self,
        kind: u32,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(), SendTimeoutError> {
        self.send_event_inner(kind, payload, Until::after(timeout))
            .map_err(Into::into)
    }

    /// As [`Producer::send_event`], waiting until `deadline` at most.
    pub fn send_event_deadline(
        &mut self,
        kind: u32,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), SendTimeoutError> {
        self.send_event_inner(kind, payload, Until::at(deadline))
            .map_err(Into::into)
    }

    /// Sends a priority event: it overtakes the records and events already sent and not yet
    /// received (see [`Event`](crate::Event) for exactly which), the way Flink's unaligned checkpoint
    /// barriers do. It is visible at once (no flush needed). At most four can be in flight:
    /// the fifth waits until the consumer has received one.
    ///
    /// # Errors
    /// [`SendError::RecordTooLarge`] for a payload over
    /// [`MAX_EVENT_PAYLOAD`](crate::MAX_EVENT_PAYLOAD); otherwise as [`Producer::send`].
    pub fn send_priority_event(&mut self, kind: u32, payload: &[u8]) -> Result<(), SendError> {
        self.priority_inner(kind, payload, Forever)
            .map_err(Into::into)
    }

    /// As [`Producer::send_priority_event`], or [`TrySendError::Full`] if four are in flight.
    pub fn try_send_priority_event(
        &mut self,
        kind: u32,
        payload: &[u8],
    ) -> Result<(), TrySendError> {
        self.priority_inner(kind, payload, Immediately)
            .map_err(Into::into)
    }

    /// As [`Producer::send_priority_event`], waiting at most `timeout` for room.
    pub fn send_priority_event_timeout(
        &mut self,
        kind: u32,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(), SendTimeoutError> {
        self.priority_inner(kind, payload, Until::after(timeout))
            .map_err(Into::into)
    }

    /// As [`Producer::send_priority_event`], waiting until `deadline` at most.
    pub fn send_priority_event_deadline(
        &mut self,
        kind: u32,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), SendTimeoutError> {
        self.priority_inner(kind, payload, Until::at(deadline))
            .map_err(Into::into)
    }

    pub(crate) fn priority_inner<P: Patience>(
        &mut self,
        kind: u32,
        payload: &[u8],
        patience: P,
    ) -> Sent<(), P> {
        crate::endpoint::event::check_payload(&self.shared.name, payload)?;
        if self.closed {
            return Err(self.closed_error().into());
        }
        self.check_gone()?;
        let shared = self.shared.clone();
        park::wait_for::<Host, _, _, _>(
            &shared.header().producer_park,
            self.wait,
            patience,
            park::Notifier::Rmw,
            park::Pace::Sparse,
            |look| self.poll_priority(kind, payload, look),
        )
    }

    /// Pushes a priority event if the lane has room (and then wakes the consumer); else what
    /// a producer waiting for room looks at.
    fn poll_priority(
        &mut self,
        kind: u32,
        payload: &[u8],
        look: Look,
    ) -> Result<Option<()>, SendError> {
        let h = self.shared.header();
        if crate::protocol::lane::lane_push(h, self.prio_tail, kind, payload, &self.shared.name)? {
            self.prio_tail += 1;
            self.notify_consumer();
            return Ok(Some(()));
        }
        if self.consumer_detached() {
            return Err(self.closed_error());
        }
        self.check_peer(look)?;
        Ok(None)
    }
}
