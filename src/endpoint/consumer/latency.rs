//! Latency markers on the reading side: a marker's body checked, its age counted in the
//! region's latency table, and the figures read back.

#[allow(unused_imports)]
use super::*;

use crate::endpoint::markers::LatencyMarker;

impl Consumer {
    /// A marker's body (past the kind word), checked.
    pub(super) fn marker(&self, body: &[u8]) -> Result<LatencyMarker, Box<CorruptError>> {
        match crate::protocol::latency::decode(body) {
            Some((emitted, label)) => Ok(LatencyMarker::from_wire(emitted, label)),
            None => Err(self.corrupt(
                "latency marker length",
                format!(
                    "{} to {} bytes",
                    crate::protocol::latency::HEAD,
                    crate::protocol::latency::HEAD + crate::protocol::latency::MAX_LABEL
                ),
                body.len() as u64,
            )),
        }
    }

    /// Counts `m`'s age in the channel's latency table (a gate's channel leaves it to its
    /// gate, which counts for all its channels).
    pub(super) fn count_marker(&mut self, m: &LatencyMarker) {
        if self.shared.gate.is_some() {
            return;
        }
        if let Some(t) = self.shared.latency_table() {
            let slot = t.slot_of(m.label(), &mut self.marker_sources);
            t.record(slot, m.age().as_nanos().min(u64::MAX as u128) as u64);
        }
    }

    /// True if the event frame of `len` bytes at `at` is a latency marker.
    pub(super) fn is_marker(&self, at: usize, len: usize) -> bool {
        let bytes = self.view(at, len);
        let word = u64::from_le_bytes(bytes[..8].try_into().expect("an event has 8 bytes"));
        barrier::kind_word(word) == barrier::KindWord::Marker
    }

    /// A reader of records met the event frame of `len` bytes at `at`: if it is a latency
    /// marker, its age is counted (anything else, and a marker that makes no sense, is passed
    /// over as events are).
    pub(super) fn count_marker_at(&mut self, at: usize, len: usize) {
        if !self.is_marker(at, len) {
            return;
        }
        if let Ok(m) = self.marker(&self.view(at, len)[8..]) {
            self.count_marker(&m);
        }
    }

    /// The ages of the latency markers this end has read, per source, since the channel was
    /// made (see [`LatencyMarkers`](crate::LatencyMarkers)); empty while none came.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use shmflow::{LatencyMarkers, Message};
    ///
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// tx.set_latency_markers(Some(LatencyMarkers::every(Duration::from_millis(1), "source-0")));
    /// // Markers go with the records: one is due at once, then one a millisecond.
    /// for _ in 0..3 {
    ///     tx.send(b"record")?;
    ///     std::thread::sleep(Duration::from_millis(2));
    /// }
    /// drop(tx);
    /// while rx.recv()?.is_some() {} // a plain recv counts the markers it passes
    /// let l = &rx.latency()[0];
    /// assert_eq!(l.source, "source-0");
    /// assert!(l.count >= 1);
    /// assert!(l.quantile(0.99) >= l.quantile(0.5));
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn latency(&self) -> Vec<crate::endpoint::metrics::SourceLatency> {
        crate::endpoint::metrics::latency(&self.shared)
    }
}
