//! What a gate hands out: [`GateMessage`], one per record, event, channel end or checkpoint
//! step, with the channel it came through.

#[allow(unused_imports)]
use super::*;

/// What a gate hands out.
#[non_exhaustive]
pub enum GateMessage<'a> {
    /// A record from `channel`.
    Record {
        /// The channel it came through.
        channel: u32,
        /// The record, in place.
        record: Record<'a>,
    },
    /// An event from `channel` (ordinary or priority).
    Event {
        /// The channel it came through.
        channel: u32,
        /// The event.
        event: Event<'a>,
    },
    /// `channel`'s producer detached after everything it sent was delivered.
    EndOfPartition {
        /// The channel that ended.
        channel: u32,
    },
    /// `channel`'s producer was dropped while its thread unwound from a panic; everything it
    /// committed was delivered before this.
    ChannelFailed {
        /// The channel whose producer failed.
        channel: u32,
        /// Which producer.
        error: Box<crate::error::ProducerFailedError>,
    },
    /// `channel`'s producer died (everything it committed was delivered before this), or,
    /// in a gate made with `create_anonymous`, none attached and every copy of the channel's
    /// handle is closed (`error.never_attached()`).
    ChannelDead {
        /// The channel whose producer died.
        channel: u32,
        /// What died, naming the pid.
        error: Box<crate::error::PeerDeadError>,
    },
    /// Checkpoint barrier `id` is released: take the checkpoint now. Every record handed out
    /// before belongs before it. `Released::Aligned`: every open channel's barrier had
    /// arrived, and what follows belongs after it. `Released::Unaligned`: it was released
    /// early (an unaligned barrier, or an aligned one whose alignment timeout passed); the
    /// records still queued in front of the barrier on the channels where it had not arrived
    /// follow as [`GateMessage::InFlight`] (to process, and to persist with the checkpoint),
    /// then [`GateMessage::InFlightEnd`].
    ///
    /// The rules where a choice is left: a channel whose barrier has arrived is held (its
    /// records and in-band barriers are not read; its priority events and announcements are,
    /// since they overtake its data); a channel that ends, fails or dies during the alignment
    /// no longer counts; a barrier with a newer id cancels the checkpoint in progress
    /// ([`GateMessage::BarrierCancelled`]), and an older barrier arriving later is ignored
    /// (a checkpoint never begun because a newer one began first — an unaligned barrier can
    /// overtake an older in-band one — is subsumed by it, and never reported); an
    /// id at or below a channel's last is that channel's protocol error
    /// ([`RecvError::Corrupt`], and the channel is closed); an aligned barrier sent with an
    /// alignment timeout switches once that time has passed since it was sent (the emitter's
    /// clock), counted from its announcement, which overtakes the queued records.
    Barrier {
        /// The checkpoint id.
        id: u64,
        /// How it was released.
        released: Released,
        /// The emitter's monotonic clock when it sent the barrier (the first barrier or
        /// announcement of this id the gate saw).
        emitted_ns: u64,
        /// Nanoseconds from the first barrier (or announcement) of this id the gate saw to its
        /// release: the alignment time (Flink's `checkpointAlignmentTime`).
        alignment_ns: u64,
        /// The payload of the first barrier of this id the gate saw.
        payload: &'a [u8],
    },
    /// Checkpoint `id` was abandoned for a newer one before it was complete (before its
    /// release, or before its in-flight records were all handed out).
    BarrierCancelled {
        /// The abandoned checkpoint.
        id: u64,
    },
    /// A record from `channel` that an unaligned barrier overtook: process it as any record,
    /// and persist it as part of `checkpoint`'s in-flight data (handed out once, in order).
    InFlight {
        /// The channel it came through.
        channel: u32,
        /// The checkpoint whose in-flight data it is.
        checkpoint: u64,
        /// The record, in place.
        record: Record<'a>,
    },
    /// Every in-flight record of checkpoint `id` has been handed out: the checkpoint is
    /// complete.
    InFlightEnd {
        /// The checkpoint.
        id: u64,
    },
    /// A latency marker from `channel`, in its place among that channel's records: its age is
    /// already counted in the gate's latency figures ([`Gate::latency`](crate::Gate::latency));
    /// a stage passes it on with
    /// [`Partition::forward_latency_marker`](crate::Partition::forward_latency_marker).
    LatencyMarker {
        /// The channel it came through.
        channel: u32,
        /// The marker.
        marker: crate::endpoint::markers::LatencyMarker,
    },
}

impl GateMessage<'_> {
    /// The channel the message is about (`None` for a checkpoint's messages, which are about
    /// every channel).
    pub fn channel(&self) -> Option<u32> {
        match self {
            GateMessage::Record { channel, .. }
            | GateMessage::Event { channel, .. }
            | GateMessage::EndOfPartition { channel }
            | GateMessage::ChannelFailed { channel, .. }
            | GateMessage::ChannelDead { channel, .. }
            | GateMessage::InFlight { channel, .. }
            | GateMessage::LatencyMarker { channel, .. } => Some(*channel),
            GateMessage::Barrier { .. }
            | GateMessage::BarrierCancelled { .. }
            | GateMessage::InFlightEnd { .. } => None,
        }
    }
}

impl std::fmt::Debug for GateMessage<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GateMessage::Record { channel, record } => f
                .debug_struct("Record")
                .field("channel", channel)
                .field("record", record)
                .finish(),
            GateMessage::Event { channel, event } => f
                .debug_struct("Event")
                .field("channel", channel)
                .field("event", event)
                .finish(),
            GateMessage::EndOfPartition { channel } => f
                .debug_struct("EndOfPartition")
                .field("channel", channel)
                .finish(),
            GateMessage::ChannelFailed { channel, error } => f
                .debug_struct("ChannelFailed")
                .field("channel", channel)
                .field("error", error)
                .finish(),
            GateMessage::ChannelDead { channel, error } => f
                .debug_struct("ChannelDead")
                .field("channel", channel)
                .field("error", error)
                .finish(),
            GateMessage::Barrier {
                id,
                released,
                emitted_ns,
                alignment_ns,
                payload,
            } => f
                .debug_struct("Barrier")
                .field("id", id)
                .field("released", released)
                .field("emitted_ns", emitted_ns)
                .field("alignment_ns", alignment_ns)
                .field("payload", payload)
                .finish(),
            GateMessage::BarrierCancelled { id } => {
                f.debug_struct("BarrierCancelled").field("id", id).finish()
            }
            GateMessage::LatencyMarker { channel, marker } => f
                .debug_struct("LatencyMarker")
                .field("channel", channel)
                .field("marker", marker)
                .finish(),
            GateMessage::InFlight {
                channel,
                checkpoint,
                record,
            } => f
                .debug_struct("InFlight")
                .field("channel", channel)
                .field("checkpoint", checkpoint)
                .field("record", record)
                .finish(),
            GateMessage::InFlightEnd { id } => {
                f.debug_struct("InFlightEnd").field("id", id).finish()
            }
        }
    }
}
