//! Buffer debloating (Flink's `taskmanager.network.memory.buffer-debloat`): keep in flight only
//! what the consumer reads in a target time, so that a checkpoint barrier queued behind the
//! data waits at most about that long, whatever the pool's size.
//!
//! The rule, applied by the consumer each time it finishes a segment:
//!
//! - **Rate.** Over a sample of at least [`SAMPLE_NS`] of wall time, the bytes it finished
//!   divided by the time it was *busy* (wall time less the time it waited for data): a
//!   consumer that waits is not the bottleneck, and counting its waits would shrink the limit
//!   of a channel whose producer is held back by that very limit. A sample with less than
//!   [`MIN_BUSY_NS`] of busy time says nothing and is dropped. Samples are smoothed
//!   exponentially (weight [`WEIGHT`] for the newest), so one slow record moves little.
//! - **Budget.** `rate × target` bytes may be in flight. While that is at least [`MIN_CAP`]
//!   segments, the limit is a count of whole segments, `ceil(budget / segment size)`, up to
//!   every segment of the channel. Below, it is [`MIN_CAP`] segments (one being read while one
//!   is written: the producer always makes progress), in each of which records start only in
//!   the first `budget / MIN_CAP` bytes (no less than [`MIN_FILL`]): Flink's
//!   `debloatedBufferSize`. The limit changes only when the budget moves by a quarter or more
//!   (Flink's `threshold-percentages` of 25) or reaches a bound, so it does not flap.
//!
//! The producer compares the cap with the segments it took and the consumer has not finished
//! (`ConsumerCursors::segments_done`) before a record starts a new segment, and reads the fill
//! at each segment it takes; a record longer than the fill still goes whole, and the rest of a
//! record that spans segments is never held back. Until the first sample every segment may be
//! in flight, whole.

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
    // flight and park again until its next look at the peer's liveness, tens of milliseconds
    // later, or for good where nothing else wakes it (the loom model catches that order).
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

/// Consumer: publishes the bytes of a segment past which no record starts (0: whole).
#[inline]
pub(crate) fn publish_fill(h: &Header, fill: u64) {
    // Relaxed: advice on where to seal, read at each segment the producer takes; a stale
    // value only moves one segment's seal.
    h.cons.segment_fill.store(fill, Ordering::Relaxed);
}

/// Producer: the consumer's published fill (see `end_of`).
#[inline]
pub(crate) fn fill(h: &Header) -> u64 {
    // Relaxed: see `publish_fill`.
    h.cons.segment_fill.load(Ordering::Relaxed)
}

/// Producer: the consumer's cap (0: none).
#[inline]
pub(crate) fn cap(h: &Header) -> u64 {
    // SYNC POINT: Acquire, paired with the consumer's Release in `publish_cap`.
    h.cons.segment_cap.load(Ordering::Acquire)
}

// ----- the rule -------------------------------------------------------------------------------

/// The shortest sample of the consumer's rate.
#[cfg(not(shmflow_loom))]
pub(crate) const SAMPLE_NS: u64 = 50_000_000;
/// A sample with less busy time than this is dropped.
#[cfg(not(shmflow_loom))]
pub(crate) const MIN_BUSY_NS: u64 = 1_000_000;
/// Under loom, one look of the modelled clock (a millisecond): a model finishes only a few
/// segments, and its clock moves a millisecond at every look.
#[cfg(shmflow_loom)]
pub(crate) const SAMPLE_NS: u64 = 1_000_000;
/// Under loom: any busy time at all.
#[cfg(shmflow_loom)]
pub(crate) const MIN_BUSY_NS: u64 = 1;
/// Weight of the newest sample in the smoothed rate.
pub(crate) const WEIGHT: f64 = 0.3;
/// The fewest segments a cap allows in flight.
pub(crate) const MIN_CAP: u64 = 2;
/// The fewest bytes a debloated segment is filled with (Flink's `min-segment-size` is 256 B;
/// shmflow's hand-off costs more per segment than a buffer's, and the segments stay full size:
/// this is only where the producer stops starting records in one).
pub(crate) const MIN_FILL: u64 = 4096;

/// What the producer may have in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limit {
    /// Segments in flight before a record may not start a new one.
    pub(crate) cap: u64,
    /// Bytes of a segment past which no record starts (a multiple of 8; the segment size when
    /// whole): Flink's `debloatedBufferSize`.
    pub(crate) fill: u64,
}

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
    /// The bytes in flight the limit in force was made for (`None`: every segment, whole).
    budget: Option<u64>,
    limit: Limit,
}

/// What a finished sample found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sampled {
    /// The smoothed rate, bytes per second.
    pub(crate) rate: u64,
    /// The new limit, if it changed.
    pub(crate) limit: Option<Limit>,
}

impl Debloat {
    /// Starts with every segment allowed, whole; `now_ns` and `idle_ns` start the first
    /// sample.
    pub(crate) fn new(
        target: Duration,
        seg_size: u64,
        most: u64,
        now_ns: u64,
        idle_ns: u64,
    ) -> Debloat {
        let most = most.max(1);
        let seg_size = seg_size.max(8);
        Debloat {
            target_ns: u64::try_from(target.as_nanos()).unwrap_or(u64::MAX),
            seg_size,
            most,
            since_ns: now_ns,
            idle_at_start: idle_ns,
            bytes: 0,
            rate: None,
            budget: None,
            limit: Limit {
                cap: most,
                fill: seg_size,
            },
        }
    }

    pub(crate) fn target_ns(&self) -> u64 {
        self.target_ns
    }

    /// The limit in force.
    pub(crate) fn limit(&self) -> Limit {
        self.limit
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
        // (`as` saturates: a NaN or huge product lands on a bound below.)
        let budget = (rate * self.target_ns as f64 / 1e9) as u64;
        let want = limit_for(budget, self.seg_size, self.most);
        let moved = match self.budget {
            None => true,
            Some(b) => budget.abs_diff(b).saturating_mul(4) >= b,
        };
        let bound = want.cap == self.most || want.fill == MIN_FILL.min(self.seg_size);
        let limit = (want != self.limit && (moved || bound)).then(|| {
            self.limit = want;
            self.budget = Some(budget);
            want
        });
        Some(Sampled {
            rate: rate as u64,
            limit,
        })
    }
}

/// What holds `budget` bytes in flight: whole segments while that is at least [`MIN_CAP`]
/// of them (up to every segment), else [`MIN_CAP`] segments filled with a share of it each
/// (no less than [`MIN_FILL`] or the segment).
pub(crate) fn limit_for(budget: u64, seg_size: u64, most: u64) -> Limit {
    let seg_size = seg_size.max(8);
    let most = most.max(1);
    let min_cap = MIN_CAP.min(most);
    if budget >= min_cap.saturating_mul(seg_size) {
        Limit {
            cap: budget.div_ceil(seg_size).clamp(min_cap, most),
            fill: seg_size,
        }
    } else {
        let fill = (budget / min_cap) & !7;
        Limit {
            cap: min_cap,
            fill: fill.clamp(MIN_FILL.min(seg_size) & !7, seg_size).max(8),
        }
    }
}

/// The producer: where records stop starting in a segment of `seg_size` bytes, from the
/// consumer's published fill (untrusted: 0 or anything out of range is the whole segment; the
/// rest is rounded down to a frame boundary and no less than two frame headers).
pub(crate) fn end_of(published_fill: u64, seg_size: usize) -> usize {
    match usize::try_from(published_fill) {
        Ok(f) if f != 0 && f < seg_size => (f & !7).max(16),
        _ => seg_size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const MIB: u64 = 1 << 20;

    /// Feeds segments of `seg` bytes at `rate` bytes/s of busy time for `for_ms`, starting
    /// at `*now`, with no idle time; returns the limit in force after.
    fn feed(d: &mut Debloat, now: &mut u64, seg: u64, rate: f64, for_ms: u64) -> Limit {
        let step = (seg as f64 / rate * 1e9) as u64;
        let end = *now + for_ms * MS;
        while *now < end {
            *now += step;
            d.finished(seg, *now, 0);
        }
        d.limit()
    }

    fn whole(cap: u64) -> Limit {
        Limit { cap, fill: MIB }
    }

    #[test]
    fn the_limit_holds_what_is_read_in_the_target_time() {
        // 16 segments of 1 MiB read at 60 MB/s, target 100 ms: 6 MB, six whole segments.
        let mut d = Debloat::new(Duration::from_millis(100), MIB, 16, 0, 0);
        assert_eq!(d.limit(), whole(16), "every segment until the first sample");
        let mut now = 0;
        assert_eq!(feed(&mut d, &mut now, MIB, 60e6, 3000), whole(6));
        // 200 MB/s: 20 MB in 100 ms, more than the 16 segments: all of them.
        assert_eq!(feed(&mut d, &mut now, MIB, 200e6, 2000), whole(16));
        // 10 MB/s: 1 MB, less than two segments: two segments, each filled with half of it.
        let l = feed(&mut d, &mut now, MIB, 10e6, 3000);
        assert_eq!(l.cap, 2);
        // (Within a quarter of 500 000: the limit follows the smoothed rate down until the
        // budget is within the threshold.)
        assert!((375_000..=625_000).contains(&l.fill), "{l:?}");
        assert_eq!(l.fill % 8, 0);
    }

    #[test]
    fn the_limit_never_goes_below_two_small_segments_nor_above_the_channel() {
        assert_eq!(
            limit_for(0, MIB, 16),
            Limit {
                cap: 2,
                fill: MIN_FILL
            }
        );
        assert_eq!(limit_for(u64::MAX, MIB, 16), whole(16));
        // Segments smaller than the least fill are used whole.
        assert_eq!(limit_for(0, 1024, 16), Limit { cap: 2, fill: 1024 });
        // A channel of one segment: that one.
        assert_eq!(limit_for(0, 4096, 1), Limit { cap: 1, fill: 4096 });
        assert_eq!(limit_for(5000, 4096, 1), Limit { cap: 1, fill: 4096 });
        // Exactly two segments' worth: two whole ones; one byte less: two filled to half.
        assert_eq!(limit_for(2 * MIB, MIB, 16), whole(2));
        assert_eq!(
            limit_for(2 * MIB - 1, MIB, 16),
            Limit {
                cap: 2,
                fill: MIB - 8
            }
        );
        let mut d = Debloat::new(Duration::ZERO, 4096, 8, 0, 0);
        let mut now = 0;
        assert_eq!(
            feed(&mut d, &mut now, 4096, 1e9, 500),
            Limit { cap: 2, fill: 4096 }
        );
        let mut d = Debloat::new(Duration::from_secs(3600), 4096, 8, now, 0);
        assert_eq!(feed(&mut d, &mut now, 4096, 1e9, 500).cap, 8);
    }

    #[test]
    fn where_a_producer_stops_starting_records_is_always_inside_the_segment() {
        assert_eq!(end_of(0, 4096), 4096);
        assert_eq!(end_of(4096, 4096), 4096);
        assert_eq!(end_of(u64::MAX, 4096), 4096);
        assert_eq!(end_of(1001, 4096), 1000);
        assert_eq!(end_of(3, 4096), 16);
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
        assert_eq!(d.limit(), whole(10));
        // All idle (less than a millisecond of work in a sample): nothing is learnt.
        assert_eq!(d.finished(100, now + 60 * MS, idle + 60 * MS), None);
        assert_eq!(d.limit(), whole(10));
    }

    #[test]
    fn the_limit_follows_the_rate_smoothly() {
        let mut d = Debloat::new(Duration::from_millis(100), MIB, 64, 0, 0);
        let mut now = 0;
        assert_eq!(feed(&mut d, &mut now, MIB, 100e6, 3000), whole(10));
        // One sample twice as fast moves the smoothed rate by a third of the way only.
        now += SAMPLE_NS;
        let s = d.finished(10 * MIB, now, 0).expect("sampled");
        assert!(s.rate < 140_000_000, "{s:?}");
        // A small change of rate does not move the limit (less than a quarter).
        let mut d = Debloat::new(Duration::from_millis(100), MIB, 64, 0, 0);
        let mut now = 0;
        assert_eq!(feed(&mut d, &mut now, MIB, 200e6, 3000), whole(20));
        assert_eq!(feed(&mut d, &mut now, MIB, 230e6, 3000), whole(20));
        // 300 MB/s wants 29: the limit moves as soon as the smoothed rate asks for a quarter
        // more, and stays within a quarter of the aim.
        let cap = feed(&mut d, &mut now, MIB, 300e6, 3000).cap;
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
