//! Latency markers on the writing side: emitted in band every interval (when on), and passed
//! on by a stage that reads them.

#[allow(unused_imports)]
use super::*;

use crate::endpoint::markers::LatencyMarker;
use crate::error::{SendError, TrySendError};
use crate::protocol::latency;

impl Producer {
    /// Writes a latency marker of `label`, sent at `emitted_ns` (wall clock), in its place
    /// after every record sent so far; published as the flush policy publishes a record.
    pub(super) fn write_marker<P: Patience>(
        &mut self,
        emitted_ns: u64,
        label: &[u8],
        patience: P,
    ) -> Sent<(), P> {
        let (body, n) = latency::encode(emitted_ns, label);
        self.write_event_frame(latency::marker_word(), &body[..n], patience)
    }

    /// A marker is due (the tick counter reached `marker_at`): written after the record just
    /// sent if there is room without waiting; else it stays due, for the next record.
    #[cfg(not(shmflow_loom))]
    #[cold]
    #[inline(never)]
    pub(super) fn marker_due(&mut self) {
        let Some(s) = self.markers.take() else {
            self.marker_at = u64::MAX;
            return;
        };
        // In a child made by `fork`, the clock was at its end: it is set to now (and a
        // ticker started here), and the marker is due only if it is by that clock.
        crate::endpoint::markers::resume_after_fork();
        if crate::endpoint::markers::ticks() < self.marker_at {
            self.markers = Some(s);
            return;
        }
        let gone = self.gone;
        let wrote = self.write_marker(
            crate::sys::clock::realtime_ns(),
            s.label(),
            crate::protocol::park::Immediately,
        );
        match wrote {
            Ok(()) => self.marker_at = s.next_due(),
            // A marker that took a fresh segment and found the consumer gone: that answers
            // nothing the user asked (the consumer may have read every record before it
            // left, which `close_timeout` then reports as a clean end), so the producer is
            // not marked gone by it; the user's next call that takes a segment, flushes or
            // closes finds the consumer gone itself.
            Err(_) if !gone => self.gone = false,
            Err(_) => {}
        }
        self.markers = Some(s);
    }

    /// Emits a latency marker every interval (Flink's `metrics.latency.interval`), labelled
    /// with the source's name, or stops (`None`). Off by default.
    ///
    /// A marker goes in band, after the record whose send finds it due (so a producer that
    /// sends nothing emits none), and never makes `send` wait: one that finds no room at once
    /// goes after the next record. The consumer, or gate, that reads it counts its age in its
    /// region's latency figures, per source ([`Consumer::latency`](crate::Consumer::latency),
    /// `shmflow stat`, `top`, `export`), and hands it out as a message
    /// ([`Message::LatencyMarker`](crate::Message::LatencyMarker)) for a stage to pass on
    /// ([`Producer::forward_latency_marker`]). Its age is measured on the wall clock, exact
    /// between processes of one machine. One thread per process keeps the marker clock while
    /// any producer emits markers (the hot path reads no clock: it compares a counter). A
    /// child made by `fork` gets a marker clock of its own at its first marker check, so a
    /// producer it inherited goes on emitting markers there.
    ///
    /// Not under `--cfg shmflow_loom`: the marker clock is a thread of the system.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use shmflow::{LatencyMarkers, Message};
    ///
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// tx.set_latency_markers(Some(LatencyMarkers::every(Duration::from_millis(1), "read-0")));
    /// tx.send(b"record")?; // the first marker is due at once: it follows this record
    /// assert!(matches!(rx.recv_message()?, Some(Message::Record(_))));
    /// match rx.recv_message()? {
    ///     Some(Message::LatencyMarker(m)) => assert_eq!(m.source(), "read-0"),
    ///     other => panic!("{other:?}"),
    /// }
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    #[cfg(not(shmflow_loom))]
    pub fn set_latency_markers(
        &mut self,
        markers: Option<crate::endpoint::markers::LatencyMarkers>,
    ) {
        self.markers = None;
        self.marker_at = u64::MAX;
        if let Some(m) = markers {
            if let Some(s) = crate::endpoint::markers::Schedule::start(&m) {
                self.markers = Some(Box::new(s));
                self.marker_at = 0;
            }
        }
    }

    /// The markers this producer emits, if any.
    #[cfg(not(shmflow_loom))]
    pub fn latency_markers(&self) -> Option<crate::endpoint::markers::LatencyMarkers> {
        self.markers.as_ref().map(|s| s.markers())
    }

    /// Passes on a latency marker read upstream, in its place after every record sent so far,
    /// so that the stages after this one measure from the same source and emission. Blocks
    /// like `send` while no segment is free.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use shmflow::{LatencyMarkers, Message};
    ///
    /// let (mut source, mut stage_in) = shmflow::pair(shmflow::Geometry::default())?;
    /// let (mut stage_out, mut sink) = shmflow::pair(shmflow::Geometry::default())?;
    /// source.set_latency_markers(Some(LatencyMarkers::every(Duration::from_millis(1), "src")));
    /// source.send(b"x")?;
    /// drop(source);
    /// while let Some(m) = stage_in.recv_message()? {
    ///     match m {
    ///         Message::Record(r) => stage_out.send(r.as_bytes().unwrap())?,
    ///         Message::LatencyMarker(m) => stage_out.forward_latency_marker(&m)?,
    ///         _ => {}
    ///     }
    /// }
    /// drop(stage_out);
    /// while sink.recv()?.is_some() {}
    /// assert_eq!(sink.latency()[0].source, "src"); // measured from the source
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Producer::send`].
    pub fn forward_latency_marker(&mut self, marker: &LatencyMarker) -> Result<(), SendError> {
        self.write_marker(marker.emitted_ns(), marker.label(), Forever)
            .map_err(Into::into)
    }

    /// As [`Producer::forward_latency_marker`], or [`TrySendError::Full`] (nothing sent)
    /// without a free segment now.
    pub fn try_forward_latency_marker(
        &mut self,
        marker: &LatencyMarker,
    ) -> Result<(), TrySendError> {
        self.write_marker(marker.emitted_ns(), marker.label(), Immediately)
            .map_err(Into::into)
    }
}
