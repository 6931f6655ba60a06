//! Turning what the scan picked into a message: records, events, a channel's end or death,
//! barriers and their in-flight records; retiring finished channels and publishing the pool's
//! and the checkpoints' figures.

#[allow(unused_imports)]
use super::*;

impl Gate {
    pub(super) fn gate_header(&self) -> &crate::protocol::abi::GateHeader {
        self.shared.gate.as_ref().expect("gate").gate_header()
    }

    /// Publishes a release's figures (for `shmflow stat`): the gate's, and what each held
    /// channel held back.
    pub(super) fn publish_release(
        &mut self,
        id: u64,
        how: Released,
        started_ns: u64,
        emitted_ns: u64,
        now: u64,
    ) {
        let (mut records, mut bytes) = (0, 0);
        for c in 0..self.chans.len() {
            let (r, b) = if self.cp.held_at_release.contains(&c) {
                self.chans[c].unread()
            } else {
                (0, 0)
            };
            let (held_ns, delay_ns) = match self.cp.arrivals[c] {
                Some((i, arrived, sent)) if i == id => {
                    (now.saturating_sub(arrived), now.saturating_sub(sent))
                }
                _ => (0, 0),
            };
            self.chans[c].set_held(r, b, held_ns, delay_ns);
            records += r;
            bytes += b;
        }
        figures::checkpoint_released(
            self.gate_header(),
            id,
            match how {
                Released::Aligned => figures::ReleasedAs::Aligned,
                Released::Unaligned { timed_out: false } => figures::ReleasedAs::Unaligned,
                Released::Unaligned { timed_out: true } => figures::ReleasedAs::TimedOut,
            },
            now.saturating_sub(started_ns),
            now.saturating_sub(emitted_ns),
            records,
            bytes,
        );
    }

    /// Publishes the in-flight counts handed out since the last call.
    pub(super) fn publish_inflight(&mut self) {
        let (mut records, mut bytes) = (0, 0);
        for c in 0..self.chans.len() {
            let (r, b) = std::mem::take(&mut self.cp.inflight[c]);
            if r > 0 {
                self.chans[c].count_inflight(r, b);
                records += r;
                bytes += b;
            }
        }
        if records > 0 {
            figures::gate_inflight(self.gate_header(), records, bytes);
        }
    }

    /// The message for what the alignment said.
    pub(super) fn step_message(&mut self, step: align::Step) -> Result<GateMessage<'_>, RecvError> {
        Ok(match step {
            align::Step::Release {
                id,
                how,
                started_ns,
                emitted_ns,
                released_ns,
            } => {
                self.publish_release(id, how, started_ns, emitted_ns, released_ns);
                let payload: &[u8] = match &self.cp.payload {
                    Some((i, p)) if *i == id => p,
                    _ => &[],
                };
                GateMessage::Barrier {
                    id,
                    released: how,
                    emitted_ns,
                    alignment_ns: released_ns.saturating_sub(started_ns),
                    payload,
                }
            }
            align::Step::Cancelled { id } => {
                figures::checkpoint_abandoned(self.gate_header());
                GateMessage::BarrierCancelled { id }
            }
            align::Step::InFlightEnd { id } => GateMessage::InFlightEnd { id },
            align::Step::Backwards {
                channel,
                found,
                least,
            } => {
                self.state[channel] = State::Failed;
                self.to_retire = true;
                self.cp.closed(channel);
                return Err(corrupt(
                    &self.shared.name,
                    "checkpoint barrier id",
                    format!("channel {channel}: an id of at least {least} (ids only grow)"),
                    found,
                )
                .into());
            }
        })
    }

    /// Channels that ended or failed on the last call are closed now (the message borrowed
    /// them then).
    pub(super) fn retire_finished(&mut self) {
        self.to_retire = false;
        self.publish_inflight();
        for c in 0..self.chans.len() {
            match self.state[c] {
                State::Ended => self.retire(c, true),
                State::Failed => self.retire(c, false),
                _ => {}
            }
        }
    }

    /// The message of what the scan picked.
    pub(super) fn deliver(&mut self, pick: Pick) -> Result<Delivered<'_>, RecvError> {
        let c = match pick {
            Pick::AllDone => return Ok(Delivered::AllDone),
            Pick::Switch => {
                self.cp.tick();
                return Ok(Delivered::Again);
            }
            Pick::Ended(c) => {
                // The producer detached: it will never use the floating segments it holds.
                let failed = self.chans[c].producer_end();
                self.retire(c, true);
                self.cp.closed(c);
                return Ok(Delivered::Message(match failed {
                    Some(UncleanEnd::Failed(error)) => GateMessage::ChannelFailed {
                        channel: c as u32,
                        error,
                    },
                    // A network bridge that lost its remote producer.
                    Some(UncleanEnd::Lost(error)) => GateMessage::ChannelDead {
                        channel: c as u32,
                        error,
                    },
                    None => GateMessage::EndOfPartition { channel: c as u32 },
                }));
            }
            Pick::Dead(c, error) => {
                self.cp.closed(c);
                let error = match error {
                    Lost::PeerDead(e) => e,
                    // A failed liveness look (a syscall error): the producer may be alive.
                    Lost::Io(e) => {
                        self.retire(c, false);
                        return Err(e.into());
                    }
                };
                // Dead: it will never write the floating segments it holds again.
                self.retire(c, true);
                return Ok(Delivered::Message(GateMessage::ChannelDead {
                    channel: c as u32,
                    error,
                }));
            }
            Pick::Failed(c, e) => {
                // A channel that broke the protocol is closed; the others go on.
                self.state[c] = State::Failed;
                self.to_retire = true;
                self.cp.closed(c);
                return Err(e);
            }
            Pick::Read(c) => c,
        };
        self.burst += 1;
        // `ready` said a message (or an error) is there, so this does not block.
        // (Only fields other than `chans` are touched while a message borrows a channel.)
        // A held channel gives its lane only (never a record or an in-band barrier, even if
        // its producer rewinds the lane's tail after the scan saw an entry).
        let got = if self.cp.align.readable(c) {
            self.chans[c].message_now()
        } else {
            self.chans[c]
                .lane_message()
                .map(Some)
                .map_err(|e| Halt::Failed(e.into()))
        };
        let m = match got {
            Ok(Some(Message::Record(record))) => match self.cp.align.in_flight(c) {
                Some(checkpoint) => {
                    // (A spanning record's bytes are not known before it is read: counted
                    // as a record of 0 bytes.)
                    let n = &mut self.cp.inflight[c];
                    *n = (n.0 + 1, n.1 + record.len().unwrap_or(0) as u64);
                    self.to_retire = true;
                    GateMessage::InFlight {
                        channel: c as u32,
                        checkpoint,
                        record,
                    }
                }
                None => GateMessage::Record {
                    channel: c as u32,
                    record,
                },
            },
            Ok(Some(Message::Event(event))) => GateMessage::Event {
                channel: c as u32,
                event,
            },
            Ok(Some(Message::Barrier(b))) => {
                self.cp.barrier(c, &b);
                return Ok(Delivered::Again);
            }
            Ok(Some(Message::LatencyMarker(marker))) => {
                count_marker(&self.shared, &mut self.marker_sources, &marker);
                GateMessage::LatencyMarker {
                    channel: c as u32,
                    marker,
                }
            }
            Ok(None) => {
                // Reclaimed at the next call (the borrow of the channel lives until here).
                self.state[c] = State::Ended;
                self.to_retire = true;
                self.cp.closed(c);
                GateMessage::EndOfPartition { channel: c as u32 }
            }
            // The producer ended the stream as failed (dropped while panicking).
            Err(Halt::Failed(RecvError::ProducerFailed(error))) => {
                self.state[c] = State::Ended;
                self.to_retire = true;
                self.cp.closed(c);
                GateMessage::ChannelFailed {
                    channel: c as u32,
                    error,
                }
            }
            // `ready` saw a committed frame (or a priority event); only a producer rewriting
            // what it committed makes it vanish: the header (or the lane's tail) reads as
            // nothing now.
            Err(Halt::Expired(_)) => {
                self.state[c] = State::Failed;
                self.to_retire = true;
                self.cp.closed(c);
                return Err(corrupt(
                    &self.shared.name,
                    "frame header or priority lane tail",
                    format!("what channel {c} had committed to stay committed"),
                    0,
                )
                .into());
            }
            // Over the reader's limit: the record is skipped, as on a plain channel, and the
            // channel goes on.
            Err(Halt::Failed(e @ RecvError::RecordTooLarge(_))) => return Err(e),
            Err(Halt::Failed(e)) => {
                self.state[c] = State::Failed;
                self.to_retire = true;
                self.cp.closed(c);
                return Err(e);
            }
        };
        Ok(Delivered::Message(m))
    }

    /// Closes channel `c` for good. `reclaim`: its producer is gone (detached or dead), so its
    /// floating segments go back to the pool now. Otherwise (it broke the protocol, or its
    /// liveness could not be looked at) the producer may still be writing them: they stay out
    /// of the pool, and the channel's consumer end detaches so that the producer's next call
    /// fails with `Closed`.
    pub(super) fn retire(&mut self, c: usize, reclaim: bool) {
        self.state[c] = State::Done;
        let ch = &mut self.chans[c];
        // A remote producer's link: its socket is closed (the sender already has the end).
        // Its producer, in this process, is gone with it: what it held can be taken back.
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        let reclaim = ch.drop_link() || reclaim;
        ch.abandon(reclaim);
        if let Some(l) = ch.lending() {
            for seg in l.take_returned() {
                self.pool.put(seg);
            }
        }
        self.publish_pool();
    }

    /// Publishes the pool's free count in the gate header (a figure for `shmflow stat`).
    pub(super) fn publish_pool(&self) {
        let g = self
            .shared
            .gate
            .as_ref()
            .expect("gate channels")
            .gate_header();
        figures::floating_free(g, self.pool.free() as u64);
    }
}

/// Counts `m`'s age in the gate's latency table (the gate counts for all its channels, with
/// one record of the sources it gave slots: `sources`).
fn count_marker(
    shared: &Shared,
    sources: &mut Vec<crate::protocol::latency::Label>,
    m: &crate::endpoint::markers::LatencyMarker,
) {
    if let Some(t) = shared.latency_table() {
        let slot = t.slot_of(m.label(), sources);
        t.record(slot, m.age().as_nanos().min(u64::MAX as u128) as u64);
    }
}
