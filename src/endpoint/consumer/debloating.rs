//! Buffer debloating on the reading side: the rate samples, the cap and in-flight limit it
//! publishes for the producer, and the target a user sets.

#[allow(unused_imports)]
use super::*;

impl Consumer {
    /// Buffer debloating: counts a finished segment of `bytes` into the rate, and publishes
    /// a new cap when the rule says so.
    #[cold]
    pub(super) fn debloat_sample(&mut self, bytes: u64) {
        let idle = self.idle_total();
        let Some(d) = &mut self.debloat else {
            return;
        };
        let Some(s) = d.finished(bytes, monotonic_ns(), idle) else {
            return;
        };
        figures::debloat_rate_measured(self.shared.header(), s.rate);
        if let Some(l) = s.limit {
            self.publish_limit(l);
        }
    }

    /// Publishes a limit: the fill first (it is read as each segment is taken), then the cap.
    pub(super) fn publish_limit(&mut self, l: debloat::Limit) {
        let fill = if l.fill >= self.seg_size as u64 {
            0
        } else {
            l.fill
        };
        debloat::publish_fill(self.shared.header(), fill);
        self.publish_cap(l.cap);
    }

    /// Publishes the producer's segment cap (0: none) and wakes it if the cap rose or went.
    pub(crate) fn publish_cap(&mut self, cap: u64) {
        let wake = debloat::publish_cap(self.shared.header(), cap);
        #[cfg(not(shmflow_broken = "debloat_silent_raise"))]
        if wake {
            self.wake_producer();
        }
        #[cfg(shmflow_broken = "debloat_silent_raise")]
        let _ = wake;
    }

    /// What this end has waited for data in all: its own idle time, or its gate's for a
    /// channel of a gate (the gate waits for all its channels at once).
    pub(super) fn idle_total(&self) -> u64 {
        match &self.shared.gate {
            Some(g) => figures::gate_idle(g.gate_header()).total(),
            None => figures::consumer_idle(self.shared.header()).total(),
        }
    }

    /// Turns buffer debloating on with a target time (Flink's
    /// `taskmanager.network.memory.buffer-debloat.target`), or off with `None`.
    ///
    /// When on, this end measures the rate at which it reads (bytes per second of the time it
    /// is not waiting for data) and lets its producer have in flight only the segments that
    /// hold what it reads in `target`: a record starts a new segment only while fewer are
    /// taken and not yet read. A checkpoint barrier then waits behind about `target` of data
    /// instead of the whole pool. The cap follows the rate, smoothed (a change of less than a
    /// quarter is ignored), is never below two segments (one read while one is written) nor
    /// above the channel's, and is every segment until the first measurement (50 ms of
    /// reading). A record larger than what the cap leaves still goes whole, and a producer
    /// across the network gets no more credit than the cap leaves. The figures are in
    /// [`Snapshot`](crate::metrics::Snapshot) (`debloat_*`, `segment_cap`) and `shmflow stat`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let (mut tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
    /// rx.set_debloat_target(Some(Duration::from_millis(100)));
    /// tx.send(b"x")?;
    /// tx.flush()?;
    /// assert!(rx.recv()?.is_some());
    /// assert_eq!(rx.metrics().debloat_target_ns, 100_000_000);
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn set_debloat_target(&mut self, target: Option<std::time::Duration>) {
        let h = self.shared.header();
        match target {
            Some(t) => {
                let d = Debloat::new(
                    t,
                    self.seg_size as u64,
                    self.shared.n() as u64,
                    monotonic_ns(),
                    self.idle_total(),
                );
                figures::debloat_started(h, d.target_ns());
                let limit = d.limit();
                self.debloat = Some(d);
                self.publish_limit(limit);
            }
            None => {
                figures::debloat_stopped(h);
                self.debloat = None;
                debloat::publish_fill(h, 0);
                self.publish_cap(0);
            }
        }
    }

    /// The debloating target in force (`None`: off).
    pub fn debloat_target(&self) -> Option<std::time::Duration> {
        self.debloat
            .as_ref()
            .map(|d| std::time::Duration::from_nanos(d.target_ns()))
    }
}
