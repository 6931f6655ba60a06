//! The priority lane and checkpoint barriers on the reading side, and the message family
//! (`recv_message` and its forms) that hands them out with records and events.

#[allow(unused_imports)]
use super::*;

impl Consumer {
    #[inline]
    pub(super) fn prio_pending(&self) -> bool {
        crate::protocol::lane::lane_pending(self.shared.header(), self.prio_head)
    }

    /// Reads the next priority event into `prio_buf`: `(kind, len)`.
    pub(super) fn pop_priority(
        &mut self,
    ) -> Result<Option<(crate::protocol::lane::Entry, usize)>, Box<CorruptError>> {
        let h = self.shared.header();
        let got = crate::protocol::lane::lane_pop(
            h,
            self.prio_head,
            &mut self.prio_buf,
            &self.shared.name,
        )?;
        if got.is_some() {
            self.prio_head += 1;
            // The producer may wait for room in the lane.
            park::notify::<Host>(h.producer_park(), self.shared.producer_bell());
        }
        Ok(got)
    }

    /// The priority event or barrier announcement at the lane's head, which `prio_pending`
    /// said is there.
    pub(crate) fn lane_message(&mut self) -> Result<Message<'_>, Box<CorruptError>> {
        match self.pop_priority()? {
            Some((e, len)) if e.barrier => {
                Ok(Message::Barrier(self.barrier(&self.prio_buf[..len], true)?))
            }
            Some((e, len)) => Ok(Message::Event(Event {
                kind: e.kind,
                payload: &self.prio_buf[..len],
                priority: true,
            })),
            // Only a producer that moves its tail back makes a pending event vanish.
            None => Err(self.corrupt(
                "priority lane tail",
                "a tail that never moves back".into(),
                crate::protocol::lane::lane_tail(self.shared.header()),
            )),
        }
    }

    /// A barrier's body (past the kind word), checked.
    pub(super) fn barrier<'b>(
        &self,
        body: &'b [u8],
        priority: bool,
    ) -> Result<Barrier<'b>, Box<CorruptError>> {
        match barrier::Head::decode(body) {
            Some((h, payload)) => Ok(Barrier {
                id: h.id,
                emitted_ns: h.emitted_ns,
                alignment: Alignment::from_wire(h.timeout_ns),
                payload,
                priority,
            }),
            None => Err(self.corrupt(
                "barrier length",
                format!("at least {} bytes", barrier::HEAD),
                body.len() as u64,
            )),
        }
    }

    #[inline]
    pub(super) fn message_inner<P: Patience>(
        &mut self,
        patience: P,
    ) -> Got<Option<Message<'_>>, P> {
        // The lane is looked at after the next frame's header is loaded, not before: SYNC
        // POINT, the Acquire load of the header (in `fast_whole`, or `poll_frame`) pairs with
        // the producer's Release commit of the frame, which its push of every priority event
        // sent before the frame precedes; so such an event is seen now, and goes first (the
        // frame is read again by the next call). A record sent after a priority event never
        // comes before it.
        let next = if let Some((len, ptr)) = self.fast_whole() {
            if self.prio_pending() {
                self.unread_whole(len);
                Next::Priority(())
            } else {
                self.count_record(len as u64);
                Next::Record(RecordKind::Single { len, ptr })
            }
        } else {
            self.next_slow::<P, ()>(patience)?
        };
        Ok(match next {
            Next::Record(kind) => Some(Message::Record(Record::new(self, kind))),
            Next::Event { at, len, .. } if self.is_marker(at, len) => {
                // (Owned: the marker is counted before the message borrows the consumer.)
                let m = self.marker(&self.view(at, len)[8..])?;
                self.count_marker(&m);
                Some(Message::LatencyMarker(m))
            }
            Next::Event { at, len, .. } => {
                let bytes = self.view(at, len);
                let word = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
                match barrier::kind_word(word) {
                    barrier::KindWord::Event(kind) => Some(Message::Event(Event {
                        kind,
                        payload: &bytes[8..],
                        priority: false,
                    })),
                    barrier::KindWord::Barrier => {
                        Some(Message::Barrier(self.barrier(&bytes[8..], false)?))
                    }
                    // (Taken above.)
                    barrier::KindWord::Marker | barrier::KindWord::Bad => {
                        return Err(self
                            .corrupt(
                                "event kind word",
                                "a kind in the low half and 0 (an event), or 0 and the \
                                 barrier's or a latency marker's tag in the high half"
                                    .into(),
                                word,
                            )
                            .into())
                    }
                }
            }
            Next::Priority(()) => Some(self.lane_message()?),
            Next::End => None,
        })
    }

    /// Receives the next record or event (see [`Event`] for the order), blocking.
    /// `Ok(None)` is end of stream, as for [`Consumer::recv`].
    ///
    /// # Errors
    /// As [`Consumer::recv`].
    pub fn recv_message(&mut self) -> Result<Option<Message<'_>>, RecvError> {
        self.message_inner(Forever).map_err(Into::into)
    }

    /// As [`Consumer::recv_message`], or [`TryRecvError::Empty`] if nothing is there.
    pub fn try_recv_message(&mut self) -> Result<Option<Message<'_>>, TryRecvError> {
        self.message_inner(Immediately).map_err(Into::into)
    }

    /// As [`Consumer::recv_message`], waiting at most `timeout`
    /// ([`RecvTimeoutError::Timeout`]).
    pub fn recv_message_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<Message<'_>>, RecvTimeoutError> {
        self.message_inner(Until::after(timeout))
            .map_err(Into::into)
    }

    /// As [`Consumer::recv_message`], waiting until `deadline` at most.
    pub fn recv_message_deadline(
        &mut self,
        deadline: Instant,
    ) -> Result<Option<Message<'_>>, RecvTimeoutError> {
        self.message_inner(Until::at(deadline)).map_err(Into::into)
    }
}
