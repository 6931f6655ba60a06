//! Buffer debloating (Flink's `taskmanager.network.memory.buffer-debloat`): keep in flight only
//! what the consumer reads in a target time, so that a checkpoint barrier queued behind the
//! data waits at most about that long, whatever the pool's size.
//!
//! The rule, applied by the consumer each time it finishes a segment:
//!
//! - **Rate.** Over a sample of at least [`SAMPLE_NS`] of wall time, the bytes it finished
//!   divided by the time it was *busy* (wall time less the time it waited for data): a
//!   consumer that waits is not the bottleneck, and counting its waits would shrink the cap
//!   of a channel whose producer is held back by that very cap. A sample with less than
//!   [`MIN_BUSY_NS`] of busy time says nothing and is dropped. Samples are smoothed
//!   exponentially (weight [`WEIGHT`] for the newest), so one slow record moves the cap little.
//! - **Cap.** `ceil(rate × target / segment size)` segments, never fewer than [`MIN_CAP`]
//!   (one being read, one being written: the producer always makes progress) and never more
//!   than the channel's segments. It changes only when it moves by a quarter or more (Flink's
//!   `threshold-percentages` of 25), or reaches a bound, so it does not flap.
//!
//! The cap counts segments: what a record may start a new segment beyond. The producer
//! (`Producer::capped`) compares it with the segments it took and the consumer has not
//! finished (`ConsumerCursors::segments_done`). Until the first sample the cap is every
//! segment of the channel.

use std::time::Duration;

use crate::protocol::abi::Header;
use crate::sync::Ordering;

// ----- the hand-off between the ends --------------------------------------------------------

/// Consumer: it has finished `done` segments in all (before it returns the last one and wakes
/// the producer).
#[inline]
pub(crate) fn publish_done(h: &Header, done: u64) {
    // SYNC POINT: Release, paired with the producer's Acquire in `in_flight`. Stored before
    // the wake-up that follows it (the return ring's push and notify), so that a capped
    // producer that wakes finds the segment done; stored after, it could find it still in
    // flight and park for good (the loom model catches that order).
    h.cons.segments_done.store(done, Ordering::Release);
}

/// Consumer: publishes the producer's cap (0: none) and says whether the producer must be
/// woken (the cap rose or went: a producer parked at the old cap may go on).
#[inline]
pub(crate) fn publish_cap(h: &Header, cap: u64) -> bool {
    // Relaxed: only this end writes the cap.
    let old = h.cons.segment_cap.load(Ordering::Relaxed);
    // SYNC POINT: Release, paired with the producer's Acquire in `cap`; the caller's wake-up
    // reaches a producer parked at the old cap.
    h.cons.segment_cap.store(cap, Ordering::Release);
    cap == 0 || cap > old
}

/// Producer: segments it took (`taken`, its own count) that the consumer has not finished.
/// A foreign count above ours reads as none in flight.
#[inline]
pub(crate) fn in_flight(h: &Header, taken: u64) -> u64 {
    // SYNC POINT: Acquire, paired with the consumer's Release in `publish_done`.
    taken.saturating_sub(h.cons.segments_done.load(Ordering::Acquire))
}

/// Producer: the consumer's cap (0: none).
#[inline]
pub(crate) fn cap(h: &Header) -> u64 {
    // SYNC POINT: Acquire, paired with the consumer's Release in `publish_cap`.
    h.cons.segment_cap.load(Ordering::Acquire)
}

// ----- the rule -------------------------------------------------------------------------------

/// The shortest sample of the consumer's rate.
pub(crate) const SAMPLE_NS: u64 = 50_000_000;
/// A sample with less busy time than this is dropped.
pub(crate) const MIN_BUSY_NS: u64 = 1_000_000;
/// Weight of the newest sample in the smoothed rate.
pub(crate) const WEIGHT: f64 = 0.3;
/// The fewest segments a cap allows in flight.
pub(crate) const MIN_CAP: u64 = 2;

/// The consumer's debloating state.
#[derive(Debug, Clone)]
pub(crate) struct Debloat {
    target_ns: u64,
    seg_size: u64,
    /// The channel's segments: the cap never exceeds them.
    most: u64,
    /// The current sample: its start, the consumer's idle total then, bytes finished since.
    since_ns: u64,
    idle_at_start: u64,
    bytes: u64,
    /// Smoothed rate, bytes per second of busy time (`None` before the first sample).
    rate: Option<f64>,
    /// The cap in force.
    cap: u64,
}

/// What a finished sample found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sampled {
    /// The smoothed rate, bytes per second.
    pub(crate) rate: u64,
    /// The new cap, if it changed.
    pub(crate) cap: Option<u64>,
}

impl Debloat {
    /// Starts with every segment allowed; `now_ns` and `idle_ns` start the first sample.
    pub(crate) fn new(
        target: Duration,
        seg_size: u64,
        most: u64,
        now_ns: u64,
        idle_ns: u64,
    ) -> Debloat {
        let most = most.max(1);
        Debloat {
            target_ns: u64::try_from(target.as_nanos()).unwrap_or(u64::MAX),
            seg_size: seg_size.max(1),
            most,
            since_ns: now_ns,
            idle_at_start: idle_ns,
            bytes: 0,
            rate: None,
            cap: most,
        }
    }

    pub(crate) fn target_ns(&self) -> u64 {
        self.target_ns
    }

    /// The cap in force.
    pub(crate) fn cap(&self) -> u64 {
        self.cap
    }

    /// The consumer finished a segment holding `bytes` at `now_ns`, having waited `idle_ns` in
    /// all so far: what the sample found, if this ends one.
    pub(crate) fn finished(&mut self, bytes: u64, now_ns: u64, idle_ns: u64) -> Option<Sampled> {
        self.bytes = self.bytes.saturating_add(bytes);
        let wall = now_ns.saturating_sub(self.since_ns);
        if wall < SAMPLE_NS {
            return None;
        }
        let idle = idle_ns.saturating_sub(self.idle_at_start).min(wall);
        let busy = wall - idle;
        let bytes = std::mem::take(&mut self.bytes);
        self.since_ns = now_ns;
        self.idle_at_start = idle_ns;
        if busy < MIN_BUSY_NS {
            return None;
        }
        let sample = bytes as f64 * 1e9 / busy as f64;
        let rate = match self.rate {
            None => sample,
            Some(r) => r + WEIGHT * (sample - r),
        };
        self.rate = Some(rate);
        let want = cap_for(rate, self.target_ns, self.seg_size, self.most);
        let bound = want == MIN_CAP.min(self.most) || want == self.most;
        let cap =
            (want != self.cap && (bound || want.abs_diff(self.cap) * 4 >= self.cap)).then(|| {
                self.cap = want;
                want
            });
        Some(Sampled {
            rate: rate as u64,
            cap,
        })
    }
}

/// Segments that hold what `rate` bytes per second reads in `target_ns`, within the bounds.
pub(crate) fn cap_for(rate: f64, target_ns: u64, seg_size: u64, most: u64) -> u64 {
    let bytes = rate * target_ns as f64 / 1e9;
    let segs = (bytes / seg_size.max(1) as f64).ceil();
    // (`as` saturates: a NaN or huge rate lands on a bound.)
    (segs as u64).clamp(MIN_CAP.min(most), most.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const MIB: u64 = 1 << 20;

    /// Feeds segments of `seg` bytes at `rate` bytes/s of busy time for `for_ms`, starting
    /// at `*now`, with no idle time; returns the last cap published.
    fn feed(d: &mut Debloat, now: &mut u64, seg: u64, rate: f64, for_ms: u64) -> u64 {
        let step = (seg as f64 / rate * 1e9) as u64;
        let end = *now + for_ms * MS;
        while *now < end {
            *now += step;
            d.finished(seg, *now, 0);
        }
        d.cap()
    }

    #[test]
    fn the_cap_holds_what_is_read_in_the_target_time() {
        // 16 segments of 1 MiB read at 20 MB/s, target 100 ms: 2 MB, two segments.
        let mut d = Debloat::new(Duration::from_millis(100), MIB, 16, 0, 0);
        assert_eq!(d.cap(), 16, "every segment until the first sample");
        let mut now = 0;
        assert_eq!(feed(&mut d, &mut now, MIB, 20e6, 2000), 2);
        // 200 MB/s: 20 MB in 100 ms, more than the 16 segments: the cap is all of them.
        assert_eq!(feed(&mut d, &mut now, MIB, 200e6, 2000), 16);
        // 60 MB/s: 6 MB, six segments.
        assert_eq!(feed(&mut d, &mut now, MIB, 60e6, 3000), 6);
    }

    #[test]
    fn the_cap_never_goes_below_two_segments_nor_above_the_channel() {
        let mut d = Debloat::new(Duration::from_millis(1), MIB, 16, 0, 0);
        let mut now = 0;
        assert_eq!(feed(&mut d, &mut now, MIB, 1e6, 2000), MIN_CAP);
        let mut d = Debloat::new(Duration::ZERO, 4096, 8, 0, 0);
        assert_eq!(feed(&mut d, &mut now, 4096, 1e9, 500), MIN_CAP);
        let mut d = Debloat::new(Duration::from_secs(3600), 4096, 8, now, 0);
        assert_eq!(feed(&mut d, &mut now, 4096, 1e9, 500), 8);
        // A channel of one segment: the cap is that one.
        assert_eq!(cap_for(1.0, 1, 4096, 1), 1);
        assert_eq!(cap_for(f64::NAN, 1, 4096, 8), MIN_CAP);
        assert_eq!(cap_for(f64::INFINITY, u64::MAX, 1, 8), 8);
    }

    #[test]
    fn waiting_for_data_does_not_lower_the_rate() {
        // The consumer reads 1 MiB in 10 ms of work, then waits 90 ms for the next: its rate
        // is 100 MB/s of busy time, not 10 MB/s of wall time.
        let mut d = Debloat::new(Duration::from_millis(100), MIB, 64, 0, 0);
        let (mut now, mut idle) = (0, 0);
        let mut last = None;
        for _ in 0..40 {
            idle += 90 * MS;
            now += 100 * MS;
            last = d.finished(MIB, now, idle).or(last);
        }
        let rate = last.expect("sampled").rate as f64;
        assert!((rate - 1.048576e8).abs() / 1e8 < 0.01, "rate {rate}");
        assert_eq!(d.cap(), 10);
        // All idle (less than a millisecond of work in a sample): nothing is learnt.
        let cap = d.cap();
        assert_eq!(d.finished(100, now + 60 * MS, idle + 60 * MS), None);
        assert_eq!(d.cap(), cap);
    }

    #[test]
    fn the_cap_follows_the_rate_smoothly() {
        let mut d = Debloat::new(Duration::from_millis(100), MIB, 64, 0, 0);
        let mut now = 0;
        feed(&mut d, &mut now, MIB, 100e6, 3000);
        assert_eq!(d.cap(), 10);
        // One sample twice as fast moves the smoothed rate by a third of the way only.
        now += SAMPLE_NS;
        let s = d.finished(10 * MIB, now, 0).expect("sampled");
        assert!(s.rate < 140_000_000, "{s:?}");
        // A small change of rate does not move the cap (less than a quarter).
        let mut d = Debloat::new(Duration::from_millis(100), MIB, 64, 0, 0);
        let mut now = 0;
        feed(&mut d, &mut now, MIB, 200e6, 3000);
        assert_eq!(d.cap(), 20);
        assert_eq!(feed(&mut d, &mut now, MIB, 230e6, 3000), 20);
        // 300 MB/s wants 29: the cap moves as soon as the smoothed rate asks for a quarter
        // more (25 or more), and stays within a quarter of the aim.
        let cap = feed(&mut d, &mut now, MIB, 300e6, 3000);
        assert!((25..=29).contains(&cap), "cap {cap}");
        assert!(29 - cap < cap / 4, "cap {cap}");
    }

    #[test]
    fn a_sample_spans_at_least_the_sample_time() {
        let mut d = Debloat::new(Duration::from_millis(100), 4096, 64, 0, 0);
        for i in 1..=10 {
            assert_eq!(d.finished(4096, i * MS, 0), None);
        }
        let s = d.finished(4096, SAMPLE_NS, 0).expect("sampled");
        // 11 segments of 4096 bytes in 50 ms.
        assert_eq!(s.rate, 11 * 4096 * 20);
        // The clock going backwards (a foreign figure) is no sample.
        assert_eq!(d.finished(4096, 0, 0), None);
    }
}
