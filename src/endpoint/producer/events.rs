//! Events: ordinary ones, framed in order with the records, and priority ones, which go
//! through the priority lane and overtake the records queued before them.

use std::time::{Duration, Instant};

use super::Producer;
use crate::endpoint::event::Alignment;
use crate::error::{SendError, SendTimeoutError, TrySendError};
use crate::protocol::barrier;
use crate::protocol::frame::{self, HEADER};
use crate::protocol::lane::{self, Entry};
use crate::protocol::park::{Forever, Immediately, Look, Patience, Until};

use super::Sent;

impl Producer {
    pub(super) fn send_event_inner<P: Patience>(
        &mut self,
        kind: u32,
        payload: &[u8],
        patience: P,
    ) -> Sent<(), P> {
        crate::endpoint::event::check_payload(&self.shared.name, payload)?;
        self.write_event_frame(kind as u64, payload, patience)
    }

    /// Writes an `EVENT` frame of kind word `word` and body `body` in its place after every
    /// record sent so far (an event, a latency marker); published as the flush policy
    /// publishes a record.
    pub(super) fn write_event_frame<P: Patience>(
        &mut self,
        word: u64,
        body: &[u8],
        patience: P,
    ) -> Sent<(), P> {
        if self.closed {
            return Err(self.closed_error().into());
        }
        let len = 8 + body.len();
        self.ensure_room(HEADER + len, patience)?;
        let c = self
            .cur
            .as_mut()
            .expect("ensure_room leaves a segment in hand");
        let at = c.wpos;
        c.wpos = frame::next_frame(at, len);
        self.write_header(at, len as u32, frame::EVENT);
        self.write_bytes(at + HEADER, &word.to_le_bytes());
        self.write_bytes(at + 2 * HEADER, body);
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
        self.priority_inner(Entry::event(kind), payload, Forever)
            .map_err(Into::into)
    }

    /// As [`Producer::send_priority_event`], or [`TrySendError::Full`] if four are in flight.
    pub fn try_send_priority_event(
        &mut self,
        kind: u32,
        payload: &[u8],
    ) -> Result<(), TrySendError> {
        self.priority_inner(Entry::event(kind), payload, Immediately)
            .map_err(Into::into)
    }

    /// As [`Producer::send_priority_event`], waiting at most `timeout` for room.
    pub fn send_priority_event_timeout(
        &mut self,
        kind: u32,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(), SendTimeoutError> {
        self.priority_inner(Entry::event(kind), payload, Until::after(timeout))
            .map_err(Into::into)
    }

    /// As [`Producer::send_priority_event`], waiting until `deadline` at most.
    pub fn send_priority_event_deadline(
        &mut self,
        kind: u32,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), SendTimeoutError> {
        self.priority_inner(Entry::event(kind), payload, Until::at(deadline))
            .map_err(Into::into)
    }

    pub(crate) fn priority_inner<P: Patience>(
        &mut self,
        entry: Entry,
        payload: &[u8],
        patience: P,
    ) -> Sent<(), P> {
        crate::endpoint::event::check_payload(&self.shared.name, payload)?;
        if self.closed {
            return Err(self.closed_error().into());
        }
        self.check_gone()?;
        self.wait_producer(patience, |p, look| p.poll_priority(entry, payload, look))
    }

    /// Pushes a priority event if the lane has room (and then wakes the consumer); else what
    /// a producer waiting for room looks at.
    fn poll_priority(
        &mut self,
        entry: Entry,
        payload: &[u8],
        look: Look,
    ) -> Result<Option<()>, SendError> {
        let h = self.shared.header();
        if lane::lane_push(h, self.prio_tail, entry, payload, &self.shared.name)? {
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

    // ----- checkpoint barriers -----------------------------------------------------------

    /// Sends checkpoint barrier `id` in its place after every record sent so far, published at
    /// once, blocking while no segment (or, for an announced barrier, no lane slot) is free.
    /// [`Alignment::Unaligned`] and [`Alignment::AlignedWithTimeout`] also announce it through
    /// the priority lane, so that it reaches the consumer before the records queued in front of
    /// it (see [`Barrier`](crate::Barrier)); this blocking form announces at once, before it
    /// waits for room for the barrier itself. Ids must strictly increase: a gate takes an id at
    /// or below the channel's last as the channel's protocol error (and after id `u64::MAX`
    /// every barrier is older: the gate ignores them).
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::{Alignment, Message};
    ///
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// tx.send(b"before")?;
    /// tx.send_barrier(1, Alignment::Aligned, b"")?;
    /// tx.send(b"after")?;
    /// let mut seen = Vec::new();
    /// while let Some(Ok(m)) = rx.try_recv_message().transpose() {
    ///     seen.push(match m {
    ///         Message::Record(r) => String::from_utf8(r.to_vec()?).unwrap(),
    ///         Message::Barrier(b) => format!("barrier {}", b.id),
    ///         _ => unreachable!(),
    ///     });
    ///     if seen.len() == 3 {
    ///         break;
    ///     }
    /// }
    /// assert_eq!(seen, ["before", "barrier 1", "after"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`Producer::send`]; [`SendError::RecordTooLarge`] for a payload over
    /// [`MAX_BARRIER_PAYLOAD`](crate::MAX_BARRIER_PAYLOAD).
    pub fn send_barrier(
        &mut self,
        id: u64,
        alignment: Alignment,
        payload: &[u8],
    ) -> Result<(), SendError> {
        self.barrier_inner(id, alignment, None, payload, Forever)
            .map_err(Into::into)
    }

    /// As [`Producer::send_barrier`], or [`TrySendError::Full`] — with nothing sent — if no
    /// segment (or lane slot) is free now.
    pub fn try_send_barrier(
        &mut self,
        id: u64,
        alignment: Alignment,
        payload: &[u8],
    ) -> Result<(), TrySendError> {
        self.barrier_inner(id, alignment, None, payload, Immediately)
            .map_err(Into::into)
    }

    /// As [`Producer::send_barrier`], waiting at most `timeout`
    /// ([`SendTimeoutError::Timeout`], with nothing sent).
    pub fn send_barrier_timeout(
        &mut self,
        id: u64,
        alignment: Alignment,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(), SendTimeoutError> {
        self.barrier_inner(id, alignment, None, payload, Until::after(timeout))
            .map_err(Into::into)
    }

    /// As [`Producer::send_barrier_timeout`], waiting until `deadline` at most.
    pub fn send_barrier_deadline(
        &mut self,
        id: u64,
        alignment: Alignment,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), SendTimeoutError> {
        self.barrier_inner(id, alignment, None, payload, Until::at(deadline))
            .map_err(Into::into)
    }

    /// Passes on a barrier that a gate released (as [`Producer::send_barrier`]), keeping the
    /// time its first sender sent it (`emitted_ns`, from
    /// [`GateMessage::Barrier`](crate::GateMessage::Barrier)): the alignment timeout and the
    /// start delay downstream then count from the source, as Flink's checkpoint start delay
    /// does, not from this stage.
    ///
    /// # Errors
    /// As [`Producer::send_barrier`].
    pub fn forward_barrier(
        &mut self,
        id: u64,
        alignment: Alignment,
        emitted_ns: u64,
        payload: &[u8],
    ) -> Result<(), SendError> {
        self.barrier_inner(id, alignment, Some(emitted_ns), payload, Forever)
            .map_err(Into::into)
    }

    /// As [`Producer::forward_barrier`], or [`TrySendError::Full`] — with nothing sent — if
    /// no segment (or lane slot) is free now.
    ///
    /// # Errors
    /// As [`Producer::try_send_barrier`].
    pub fn try_forward_barrier(
        &mut self,
        id: u64,
        alignment: Alignment,
        emitted_ns: u64,
        payload: &[u8],
    ) -> Result<(), TrySendError> {
        self.barrier_inner(id, alignment, Some(emitted_ns), payload, Immediately)
            .map_err(Into::into)
    }

    /// As [`Producer::forward_barrier`], waiting at most `timeout`
    /// ([`SendTimeoutError::Timeout`], with nothing sent).
    ///
    /// # Errors
    /// As [`Producer::send_barrier_timeout`].
    pub fn forward_barrier_timeout(
        &mut self,
        id: u64,
        alignment: Alignment,
        emitted_ns: u64,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(), SendTimeoutError> {
        self.barrier_inner(
            id,
            alignment,
            Some(emitted_ns),
            payload,
            Until::after(timeout),
        )
        .map_err(Into::into)
    }

    /// As [`Producer::forward_barrier_timeout`], waiting until `deadline` at most.
    ///
    /// # Errors
    /// As [`Producer::send_barrier_timeout`].
    pub fn forward_barrier_deadline(
        &mut self,
        id: u64,
        alignment: Alignment,
        emitted_ns: u64,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), SendTimeoutError> {
        self.barrier_inner(
            id,
            alignment,
            Some(emitted_ns),
            payload,
            Until::at(deadline),
        )
        .map_err(Into::into)
    }

    /// Makes room for an event of `payload_len` bytes without waiting (a free segment taken
    /// if the one in hand has none), writing nothing: a partition's `try_send_event` makes
    /// room on every channel before it writes to any.
    pub(crate) fn reserve_event(&mut self, payload_len: usize) -> Result<(), TrySendError> {
        if self.closed {
            return Err(self.closed_error().into());
        }
        self.check_gone()?;
        self.ensure_room(HEADER + 8 + payload_len, Immediately)
            .map_err(Into::into)
    }

    /// True if the priority lane has a free slot (only this producer fills it: the room
    /// stays until it pushes).
    pub(crate) fn lane_room(&self) -> bool {
        lane::lane_has_room(self.shared.header(), self.prio_tail)
    }

    pub(crate) fn barrier_inner<P: Patience>(
        &mut self,
        id: u64,
        alignment: Alignment,
        emitted_ns: Option<u64>,
        payload: &[u8],
        patience: P,
    ) -> Sent<(), P> {
        crate::endpoint::event::check_barrier_payload(&self.shared.name, payload)?;
        if self.closed {
            return Err(self.closed_error().into());
        }
        self.check_gone()?;
        let head = barrier::Head {
            id,
            emitted_ns: emitted_ns.unwrap_or_else(crate::sys::clock::monotonic_ns),
            timeout_ns: alignment.to_wire(),
        }
        .encode();
        let announce = alignment.announced();
        let mut announced = false;
        if announce {
            // Room in the lane first, so that a call that gives up has sent nothing (only
            // this producer fills the lane: the room stays).
            self.wait_producer(patience, |p, look| p.poll_lane_room(look))?;
            if patience.forever() {
                // A blocking call announces at once: the announcement overtakes the queued
                // records even while this call waits for room for the barrier itself.
                self.announce(&head, payload)?;
                announced = true;
            }
        }
        let len = 8 + barrier::HEAD + payload.len();
        self.ensure_room(HEADER + len, patience)?;
        if announce && !announced {
            // Room for both now: the announcement goes first, so that no reader sees the
            // barrier in its place before its announcement.
            self.announce(&head, payload)?;
        }
        let c = self
            .cur
            .as_mut()
            .expect("ensure_room leaves a segment in hand");
        let at = c.wpos;
        c.wpos = frame::next_frame(at, len);
        self.write_header(at, len as u32, frame::EVENT);
        self.write_bytes(at + HEADER, &barrier::barrier_word().to_le_bytes());
        self.write_bytes(at + 2 * HEADER, &head);
        self.write_bytes(at + 2 * HEADER + barrier::HEAD, payload);
        // A barrier that waits to be published holds a checkpoint up: publish it now.
        self.publish();
        Ok(())
    }

    /// Puts a barrier's announcement in the lane, whose room the caller has seen.
    fn announce(&mut self, head: &[u8; barrier::HEAD], payload: &[u8]) -> Result<(), SendError> {
        let mut body = [0u8; crate::protocol::abi::PRIO_PAYLOAD];
        body[..barrier::HEAD].copy_from_slice(head);
        body[barrier::HEAD..barrier::HEAD + payload.len()].copy_from_slice(payload);
        let entry = Entry {
            kind: 0,
            barrier: true,
        };
        let h = self.shared.header();
        let body = &body[..barrier::HEAD + payload.len()];
        if !lane::lane_push(h, self.prio_tail, entry, body, &self.shared.name)? {
            // The room seen before can only go if the consumer moved its head back.
            return Err(crate::error::corrupt(
                &self.shared.name,
                "priority lane head",
                "a head that never moves back".into(),
                self.prio_tail,
            )
            .into());
        }
        self.prio_tail += 1;
        self.notify_consumer();
        Ok(())
    }

    /// What a producer waiting for a free lane slot looks at.
    fn poll_lane_room(&mut self, look: Look) -> Result<Option<()>, SendError> {
        if lane::lane_has_room(self.shared.header(), self.prio_tail) {
            return Ok(Some(()));
        }
        if self.consumer_detached() {
            return Err(self.closed_error());
        }
        self.check_peer(look)?;
        Ok(None)
    }
}
