//! Latency markers through a partition: emitted by its channels in turn, passed on to one
//! channel at a time (as Flink's record writer sends a marker to one channel).

use super::Partition;
use crate::endpoint::markers::LatencyMarker;
use crate::error::{SendError, TrySendError};

impl Partition {
    /// Emits a latency marker every interval of `markers` through the partition (Flink's
    /// `metrics.latency.interval` at a source), or stops (`None`). Each channel emits one every
    /// `channels × interval`, after a record it sends, so the partition emits about one per
    /// interval across its channels (a channel that sends nothing emits none); see
    /// [`Producer::set_latency_markers`](crate::Producer::set_latency_markers).
    ///
    /// Not under `--cfg shmflow_loom`: the marker clock is a thread of the system.
    #[cfg(not(shmflow_loom))]
    pub fn set_latency_markers(
        &mut self,
        markers: Option<crate::endpoint::markers::LatencyMarkers>,
    ) {
        let n = self.outputs.len() as u32;
        for out in &mut self.outputs {
            out.set_latency_markers(markers.as_ref().map(|m| {
                crate::endpoint::markers::LatencyMarkers::every(
                    m.interval().saturating_mul(n),
                    m.source(),
                )
            }));
        }
    }

    /// Passes on a latency marker read upstream to one channel, in its place after every
    /// record sent there so far; the channels take turns. Blocks like `send` on that channel.
    ///
    /// # Errors
    /// As [`Partition::send`].
    pub fn forward_latency_marker(&mut self, marker: &LatencyMarker) -> Result<(), SendError> {
        let c = self.next_marker % self.outputs.len();
        self.outputs[c].forward_latency_marker(marker)?;
        self.next_marker = c + 1;
        Ok(())
    }

    /// As [`Partition::forward_latency_marker`], or [`TrySendError::Full`] (nothing sent) if
    /// the channel whose turn it is has no free segment now.
    pub fn try_forward_latency_marker(
        &mut self,
        marker: &LatencyMarker,
    ) -> Result<(), TrySendError> {
        let c = self.next_marker % self.outputs.len();
        self.outputs[c].try_forward_latency_marker(marker)?;
        self.next_marker = c + 1;
        Ok(())
    }
}
