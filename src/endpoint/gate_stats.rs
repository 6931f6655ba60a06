//! A gate's figures: Flink's `inputExclusiveBuffersUsage` and `inputFloatingBuffersUsage`,
//! each channel's backlog and floating segments, and each channel's own counters — all read
//! from the region, so `shmflow stat` computes the same from a read-only mapping.

use crate::endpoint::metrics::{from_figures as channel_snapshot, Snapshot};
use crate::protocol::figures;
use crate::region::view::Shared;
use crate::sync::Arc;

/// One channel of a gate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChannelStats {
    /// The channel's counters, as for a single channel (its pool is its exclusive segments
    /// plus the floating ones it holds).
    pub snapshot: Snapshot,
    /// Segments its producer asked for and was not granted (Flink's backlog).
    pub backlog: u64,
    /// Floating segments it holds now.
    pub floating_held: u64,
    /// Of its exclusive segments, how many are not free (queued for the consumer, being read,
    /// or being written).
    pub exclusive_in_use: u64,
    /// Records and payload bytes handed out as checkpoints' in-flight data (overtaken by an
    /// unaligned barrier), in all. A spanning record counts its bytes as 0.
    pub inflight_records: u64,
    /// See `inflight_records`.
    pub inflight_bytes: u64,
    /// Records and payload bytes its producer had sent beyond what was read when the last
    /// released checkpoint held this channel (0 if it did not), as the producer's counters
    /// last said (they are published every few records).
    pub held_records: u64,
    /// See `held_records`.
    pub held_bytes: u64,
    /// For the last released checkpoint: how long this channel was held (its barrier's
    /// arrival to the release), in nanoseconds; 0 if its barrier had not arrived.
    pub held_ns: u64,
    /// For the last released checkpoint: its barrier's delay on this channel, sent to
    /// released, in nanoseconds; 0 if its barrier had not arrived.
    pub barrier_delay_ns: u64,
}

/// A gate's checkpoints, with Flink's names where Flink has one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckpointStats {
    /// Checkpoints released.
    pub released: u64,
    /// Checkpoints abandoned for a newer one before they were complete (an unaligned one
    /// cancelled after its release, before its in-flight data ended, counts in `released`
    /// too).
    pub cancelled: u64,
    /// The last released checkpoint's id (0: none yet).
    pub last_id: u64,
    /// How it was released: `None` if none was, else `Some(Released)`.
    pub last_released: Option<crate::endpoint::event::Released>,
    /// Its alignment time, from the first barrier of it the gate saw to its release
    /// (`checkpointAlignmentTime`, nanoseconds).
    pub checkpoint_alignment_time_ns: u64,
    /// Its delay from its emission to its release (`checkpointStartDelayNanos`): how long the
    /// barrier took to get through, queues and alignment included.
    pub checkpoint_start_delay_nanos: u64,
    /// Records and payload bytes its alignment held back on the held channels at release.
    pub last_held_records: u64,
    /// See `last_held_records`.
    pub last_held_bytes: u64,
    /// Records and payload bytes handed out as in-flight data, in all (the bytes unaligned
    /// barriers handed back).
    pub inflight_records: u64,
    /// See `inflight_records`.
    pub inflight_bytes: u64,
}

/// A gate at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GateSnapshot {
    /// Monotonic-clock nanoseconds when this was taken.
    pub at_ns: u64,
    /// Exclusive segments per channel.
    pub exclusive: u64,
    /// Floating segments in the gate.
    pub floating: u64,
    /// Floating segments lent to nobody.
    pub floating_free: u64,
    /// Nanoseconds the gate's consumer spent waiting for any channel (including a wait going
    /// on now).
    pub idle_ns: u64,
    /// The gate consumer's attach state.
    pub consumer_state: crate::endpoint::metrics::EndState,
    /// Per channel.
    pub channels: Vec<ChannelStats>,
    /// Its checkpoints.
    pub checkpoints: CheckpointStats,
}

impl GateSnapshot {
    /// `inputExclusiveBuffersUsage`: exclusive segments in use / all exclusive segments.
    pub fn input_exclusive_buffers_usage(&self) -> f64 {
        let total = self.exclusive * self.channels.len() as u64;
        let used: u64 = self.channels.iter().map(|c| c.exclusive_in_use).sum();
        used as f64 / total.max(1) as f64
    }

    /// `inputFloatingBuffersUsage`: floating segments lent to channels / all floating
    /// segments (0 for a gate without any).
    pub fn input_floating_buffers_usage(&self) -> f64 {
        if self.floating == 0 {
            return 0.0;
        }
        self.floating.saturating_sub(self.floating_free) as f64 / self.floating as f64
    }

    /// Flink's reading of its buffer metrics: floating usage high (> 0.5) while exclusive usage is low
    /// (< 0.5) means a few channels take all the floating segments — likely skew rather than
    /// a slow consumer (which fills both).
    pub fn likely_skew(&self) -> bool {
        self.input_floating_buffers_usage() > 0.5 && self.input_exclusive_buffers_usage() < 0.5
    }

    /// Fraction of the time between `earlier` and `self` that the gate waited for data.
    pub fn idle_ratio_since(&self, earlier: &GateSnapshot) -> f64 {
        let dt = self.at_ns.saturating_sub(earlier.at_ns);
        if dt == 0 {
            return 0.0;
        }
        (self.idle_ns.saturating_sub(earlier.idle_ns) as f64 / dt as f64).min(1.0)
    }
}

/// Reads every channel of a gate (`chans` are its channels, in order).
pub(crate) fn snapshot(chans: &[Arc<Shared>]) -> GateSnapshot {
    let m = chans[0].gate.as_ref().expect("gate channels");
    let gg = m.geometry;
    let now = crate::sys::clock::monotonic_ns();
    let g = figures::read_gate(m.gate_header());
    let mut idle = g.idle_ns;
    if g.idle_since_ns != 0 && g.idle_since_ns <= now {
        idle = idle.saturating_add(now - g.idle_since_ns);
    }
    GateSnapshot {
        at_ns: now,
        exclusive: gg.exclusive as u64,
        floating: gg.floating as u64,
        floating_free: g.floating_free.min(gg.floating as u64),
        idle_ns: idle,
        consumer_state: g.consumer_state,
        channels: chans.iter().map(|s| channel(s)).collect(),
        checkpoints: checkpoints(&g.checkpoints),
    }
}

fn checkpoints(f: &figures::Checkpoints) -> CheckpointStats {
    use crate::endpoint::event::Released;
    use figures::ReleasedAs;
    CheckpointStats {
        released: f.released,
        cancelled: f.abandoned,
        last_id: f.last_id,
        last_released: f.last_how.map(|how| match how {
            ReleasedAs::Aligned => Released::Aligned,
            ReleasedAs::Unaligned => Released::Unaligned { timed_out: false },
            ReleasedAs::TimedOut => Released::Unaligned { timed_out: true },
        }),
        checkpoint_alignment_time_ns: f.last_alignment_ns,
        checkpoint_start_delay_nanos: f.last_start_delay_ns,
        last_held_records: f.last_held_records,
        last_held_bytes: f.last_held_bytes,
        inflight_records: f.inflight_records,
        inflight_bytes: f.inflight_bytes,
    }
}

fn channel(s: &Shared) -> ChannelStats {
    let m = s.gate.as_ref().expect("gate channel");
    let now = crate::sys::clock::monotonic_ns();
    let f = figures::read_channel(s.header());
    let exclusive = m.geometry.exclusive_range(m.index);
    // Free exclusive segments sit in the return ring: count them there. Values are untrusted
    // and the cursors may move while we look: clamp, and count only real exclusive indices.
    let slots = s.ret_slots();
    let (head, tail) = (f.cursors.ret_head, f.cursors.ret_tail);
    let queued = tail.saturating_sub(head).min(slots.len() as u64);
    let free_exclusive = (0..queued)
        .filter(|i| {
            let v =
                crate::protocol::counters::read(&slots[((head + i) % slots.len() as u64) as usize]);
            v < u32::MAX as u64 && exclusive.contains(&(v as u32))
        })
        .count() as u64;
    let held = f.cursors.floating_held.min(m.geometry.floating as u64);
    let cc = &f.consumer;
    ChannelStats {
        snapshot: channel_snapshot(s, &f, now),
        backlog: f.cursors.demand.saturating_sub(f.cursors.lent),
        floating_held: held,
        exclusive_in_use: (m.geometry.exclusive as u64).saturating_sub(free_exclusive),
        inflight_records: cc.inflight_records,
        inflight_bytes: cc.inflight_bytes,
        held_records: cc.held_records,
        held_bytes: cc.held_bytes,
        held_ns: cc.held_ns,
        barrier_delay_ns: cc.barrier_delay_ns,
    }
}
