//! Snapshots of a channel's counters, rates per second and the backpressure level.

use crate::protocol::abi::{Link, LINK_RECEIVING, LINK_SENDING};
pub use crate::protocol::ends::EndState;
use crate::protocol::figures;

/// Nanoseconds on the monotonic clock (the clock of [`Snapshot::at_ns`]), comparable between
/// processes of one boot.
pub fn monotonic_now_ns() -> u64 {
    monotonic_ns()
}

pub(crate) use crate::sys::clock::monotonic_ns;

/// The ages of the latency markers from one source that an end (or a gate) read: Flink's
/// `latency` histogram, per source. From [`Consumer::latency`](crate::Consumer::latency),
/// [`Gate::latency`](crate::Gate::latency) or a monitor's `latency`.
///
/// The histogram has HdrHistogram's log-linear buckets, each at most 1/32 of its values wide
/// (about 3 %), from 1 ns to about 69 s (longer ages count in the last bucket). The figures
/// count from the region's creation; [`SourceLatency::since`] gives those of an interval.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SourceLatency {
    /// The source's label (see [`LatencyMarkers::every`](crate::LatencyMarkers::every)).
    pub source: String,
    /// Markers counted.
    pub count: u64,
    /// Their ages summed.
    pub sum: std::time::Duration,
    /// The largest age.
    pub max: std::time::Duration,
    /// The age of the last marker.
    pub last: std::time::Duration,
    /// `(the smallest age in the bucket, in nanoseconds; markers in it)` for every bucket that
    /// has any, in order of age.
    pub buckets: Vec<(u64, u64)>,
}

impl SourceLatency {
    /// The age below which a fraction `q` (0 to 1) of the markers fall: the largest age of the
    /// bucket that holds the marker of rank `ceil(q × count)`, at most the largest age seen
    /// (HdrHistogram's "highest equivalent value"); zero without markers.
    ///
    /// ```
    /// let mut l = shmflow::metrics::SourceLatency::default();
    /// l.count = 4;
    /// l.max = std::time::Duration::from_nanos(1000);
    /// l.buckets = vec![(10, 3), (992, 1)];
    /// assert_eq!(l.quantile(0.5).as_nanos(), 10);
    /// assert_eq!(l.quantile(1.0).as_nanos(), 1000);
    /// ```
    pub fn quantile(&self, q: f64) -> std::time::Duration {
        let total: u64 = self.buckets.iter().map(|b| b.1).sum();
        if total == 0 {
            return std::time::Duration::ZERO;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for &(low, n) in &self.buckets {
            seen += n;
            if seen >= rank {
                let high = crate::protocol::latency::bucket_high(low);
                let max = self.max.as_nanos().min(u64::MAX as u128) as u64;
                return std::time::Duration::from_nanos(if max >= low {
                    high.min(max)
                } else {
                    high
                });
            }
        }
        self.max
    }

    /// The mean age (zero without markers).
    pub fn mean(&self) -> std::time::Duration {
        if self.count == 0 {
            return std::time::Duration::ZERO;
        }
        self.sum / self.count.min(u32::MAX as u64) as u32
    }

    /// The markers counted since `earlier` (a figure of the same source read before): counts,
    /// sum and buckets as differences, `max` and `last` as they are now.
    pub fn since(&self, earlier: &SourceLatency) -> SourceLatency {
        let mut buckets = Vec::with_capacity(self.buckets.len());
        let mut old = earlier.buckets.iter().peekable();
        for &(low, n) in &self.buckets {
            while old.peek().is_some_and(|o| o.0 < low) {
                old.next();
            }
            let before = match old.peek() {
                Some(&&(l, m)) if l == low => m,
                _ => 0,
            };
            if n > before {
                buckets.push((low, n - before));
            }
        }
        SourceLatency {
            source: self.source.clone(),
            count: self.count.saturating_sub(earlier.count),
            sum: self.sum.saturating_sub(earlier.sum),
            max: self.max,
            last: self.last,
            buckets,
        }
    }
}

/// The latency table of `shared`'s region, per source (empty without a table or markers).
pub(crate) fn latency(shared: &crate::region::view::Shared) -> Vec<SourceLatency> {
    let Some(t) = shared.latency_table() else {
        return Vec::new();
    };
    t.read()
        .into_iter()
        .map(|r| SourceLatency {
            source: String::from_utf8_lossy(&r.label).into_owned(),
            count: r.count,
            sum: std::time::Duration::from_nanos(r.sum_ns),
            max: std::time::Duration::from_nanos(r.max_ns),
            last: std::time::Duration::from_nanos(r.last_ns),
            buckets: r.buckets,
        })
        .collect()
}

/// The counters of one channel at one instant, read from its region header without
/// disturbing the channel (plain loads of lines the two sides write).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Snapshot {
    /// Monotonic-clock nanoseconds when this was taken.
    pub at_ns: u64,
    /// Segments in the pool.
    pub segment_count: u64,
    /// Bytes per segment.
    pub segment_size: u64,
    /// Records the producer committed (published in batches; never fewer than
    /// `records_read`).
    pub records_written: u64,
    /// Payload bytes the producer committed (as `records_written`).
    pub bytes_written: u64,
    /// Segments the producer sealed and handed over in full.
    pub segments_committed: u64,
    /// Segments the producer took from the return ring.
    pub segments_acquired: u64,
    /// Wake-up syscalls the producer made (its own and its flusher thread's).
    pub producer_wakes: u64,
    /// Nanoseconds the producer spent blocked waiting for a free segment, including a wait
    /// still going on.
    pub backpressured_ns: u64,
    /// Records the consumer read.
    pub records_read: u64,
    /// Payload bytes the consumer read.
    pub bytes_read: u64,
    /// Segments the consumer took from the data ring.
    pub segments_taken: u64,
    /// Segments the consumer returned.
    pub segments_returned: u64,
    /// Wake-up syscalls the consumer made.
    pub consumer_wakes: u64,
    /// Nanoseconds the consumer spent waiting for data, including a wait still going on.
    pub idle_ns: u64,
    /// Segments not free, from the producer's view: the pool minus the return ring.
    pub segments_not_free: u64,
    /// Segments queued for the consumer (data ring) or held by it.
    pub segments_at_consumer: u64,
    /// The producer end's attach state.
    pub producer_state: EndState,
    /// The consumer end's attach state.
    pub consumer_state: EndState,
    /// Pid recorded by the producer at attach.
    pub producer_pid: u32,
    /// Pid recorded by the consumer at attach.
    pub consumer_pid: u32,
    /// A network bridge attached as one end (feature `net`), with its figures.
    pub link: Option<LinkSnapshot>,
    /// Segments the producer took that the consumer has not finished reading (the segment
    /// being written included).
    pub segments_in_flight: u64,
    /// Buffer debloating ([`Consumer::set_debloat_target`](crate::Consumer::set_debloat_target)):
    /// the most segments the producer may have in flight before a record waits; 0 when off.
    pub segment_cap: u64,
    /// Buffer debloating: the bytes of a segment records start in (Flink's
    /// `debloatedBufferSize`); the segment size when whole or off.
    pub segment_fill: u64,
    /// Buffer debloating: the target time to read what is in flight, in nanoseconds; 0 when
    /// off.
    pub debloat_target_ns: u64,
    /// Buffer debloating: the rate the consumer reads at while it is not waiting for data,
    /// smoothed, in bytes per second (0 until measured).
    pub debloat_rate: u64,
}

/// What a network bridge attached to a channel reports (`shmflow stat`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LinkSnapshot {
    /// The consumer end is a sending bridge (`true`), or the producer end is a receiving one.
    pub sending: bool,
    /// Segments of credit: unspent by the sender, or announced and unspent (receiver).
    pub credit: u64,
    /// Segments the sender has waiting behind the one it sends (as it last announced, on the
    /// receiving side).
    pub backlog: u64,
    /// Bytes sent in segments the receiver has not given credit back for yet (sending side
    /// only; a receiving gate channel lent floating segments gives credit early, so this
    /// is then a lower bound).
    pub in_flight_bytes: u64,
    /// Bytes of segments that crossed the network.
    pub wire_bytes: u64,
}

/// Flink's backpressure level, from the fraction of time the producer was backpressured:
/// OK below 0.10, LOW from 0.10 to 0.50, HIGH above 0.50.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackpressureLevel {
    /// Ratio < 0.10.
    Ok,
    /// 0.10 ≤ ratio ≤ 0.50.
    Low,
    /// Ratio > 0.50.
    High,
}

impl BackpressureLevel {
    /// The level for a backpressured-time ratio in 0..=1.
    pub fn from_ratio(r: f64) -> Self {
        if r < 0.10 {
            BackpressureLevel::Ok
        } else if r <= 0.50 {
            BackpressureLevel::Low
        } else {
            BackpressureLevel::High
        }
    }

    /// "OK", "LOW" or "HIGH", as Flink's web UI says it.
    pub fn as_str(&self) -> &'static str {
        match self {
            BackpressureLevel::Ok => "OK",
            BackpressureLevel::Low => "LOW",
            BackpressureLevel::High => "HIGH",
        }
    }
}

/// Rates between two snapshots, with Flink's names and meanings.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Rates {
    /// Length of the window, seconds.
    pub window_s: f64,
    /// Records written per second.
    pub records_written_per_s: f64,
    /// Records read per second.
    pub records_read_per_s: f64,
    /// Bytes written per second.
    pub bytes_written_per_s: f64,
    /// Bytes read per second.
    pub bytes_read_per_s: f64,
    /// Producer: ms per second blocked waiting for a free segment (`backPressuredTimeMsPerSecond`).
    pub back_pressured_time_ms_per_second: f64,
    /// Producer: ms per second not backpressured (`busyTimeMsPerSecond` of the producing task).
    pub producer_busy_time_ms_per_second: f64,
    /// Consumer: ms per second waiting for data (`idleTimeMsPerSecond`).
    pub idle_time_ms_per_second: f64,
    /// Consumer: ms per second not idle (`busyTimeMsPerSecond` of the consuming task).
    pub consumer_busy_time_ms_per_second: f64,
    /// Segments not free / total, at the end of the window (`outPoolUsage`).
    pub out_pool_usage: f64,
    /// Segments queued for or held by the consumer / total, at the end (`inPoolUsage`).
    pub in_pool_usage: f64,
    /// From the backpressured ratio over the window.
    pub level: BackpressureLevel,
}

impl Snapshot {
    /// Buffer debloating: about the bytes the limit lets be in flight (`segment_cap` segments
    /// of `segment_fill` bytes; a record that starts near a segment's fill may end past it),
    /// or `None` when off.
    pub fn in_flight_limit_bytes(&self) -> Option<u64> {
        (self.segment_cap != 0).then(|| self.segment_cap.saturating_mul(self.segment_fill))
    }

    /// Flink's `estimatedTimeToConsumeBuffersMs`: how long the consumer, at its measured
    /// rate, takes to read what is written and not yet read (`None` before a rate is
    /// measured).
    pub fn estimated_time_to_consume_ms(&self) -> Option<f64> {
        (self.debloat_rate != 0).then(|| {
            self.bytes_written.saturating_sub(self.bytes_read) as f64 * 1e3
                / self.debloat_rate as f64
        })
    }

    /// Segments not free / total (`outPoolUsage`).
    pub fn out_pool_usage(&self) -> f64 {
        self.segments_not_free as f64 / self.segment_count.max(1) as f64
    }

    /// Segments queued for or held by the consumer / total (`inPoolUsage`).
    pub fn in_pool_usage(&self) -> f64 {
        self.segments_at_consumer as f64 / self.segment_count.max(1) as f64
    }

    /// Rates over the window from `earlier` to `self`.
    pub fn rates_since(&self, earlier: &Snapshot) -> Rates {
        let window_ns = self.at_ns.saturating_sub(earlier.at_ns).max(1) as f64;
        let per_s = |a: u64, b: u64| a.saturating_sub(b) as f64 * 1e9 / window_ns;
        let ms_per_s =
            |a: u64, b: u64| (a.saturating_sub(b) as f64 / window_ns * 1000.0).min(1000.0);
        let bp = ms_per_s(self.backpressured_ns, earlier.backpressured_ns);
        let idle = ms_per_s(self.idle_ns, earlier.idle_ns);
        Rates {
            window_s: window_ns / 1e9,
            records_written_per_s: per_s(self.records_written, earlier.records_written),
            records_read_per_s: per_s(self.records_read, earlier.records_read),
            bytes_written_per_s: per_s(self.bytes_written, earlier.bytes_written),
            bytes_read_per_s: per_s(self.bytes_read, earlier.bytes_read),
            back_pressured_time_ms_per_second: bp,
            producer_busy_time_ms_per_second: 1000.0 - bp,
            idle_time_ms_per_second: idle,
            consumer_busy_time_ms_per_second: 1000.0 - idle,
            out_pool_usage: self.out_pool_usage(),
            in_pool_usage: self.in_pool_usage(),
            level: BackpressureLevel::from_ratio(bp / 1000.0),
        }
    }
}

/// Reads a snapshot from a region header.
pub(crate) fn snapshot(shared: &crate::region::view::Shared) -> Snapshot {
    let now = monotonic_ns();
    let f = figures::read_channel(shared.header());
    from_figures(shared, &f, now)
}

/// The snapshot of a channel whose figures `f` were read at `now`.
pub(crate) fn from_figures(
    shared: &crate::region::view::Shared,
    f: &figures::Channel,
    now: u64,
) -> Snapshot {
    // Saturating and wrapping arithmetic: a hostile peer can write any value in its counters.
    let with_ongoing = |total: u64, since: u64| {
        if since != 0 && since <= now {
            total.saturating_add(now - since)
        } else {
            total
        }
    };
    let (pc, cc, cur) = (&f.producer, &f.consumer, &f.cursors);
    // A gate channel's pool is its exclusive segments plus the floating ones it holds.
    let n = match &shared.gate {
        None => shared.n() as u64,
        Some(m) => m.geometry.exclusive as u64 + cur.floating_held.min(m.geometry.floating as u64),
    };
    // Cursors: each read once; a torn view between them only skews a usage figure.
    let free = cur.ret_tail.saturating_sub(cur.ret_head).min(n);
    // Every segment that is not free is queued for or held by the consumer (a producer hands
    // a segment over as it takes it). For a single channel that is also takes − returns.
    let at_consumer = match &shared.gate {
        None => cur
            .data_tail
            .saturating_sub(cur.ret_tail.saturating_sub(n))
            .min(n),
        Some(_) => n - free,
    };
    Snapshot {
        at_ns: now,
        segment_count: n,
        segment_size: shared.segment_size() as u64,
        // The producer publishes its counts in batches (every 64 records under a per-record
        // policy); nothing can have been read that was not written, so the consumer's counts
        // are a lower bound too (exact once the consumer has caught up with an idle producer).
        records_written: pc.records.max(cc.records),
        bytes_written: pc.bytes.max(cc.bytes),
        segments_committed: pc.segments_committed,
        segments_acquired: pc.segments_acquired,
        producer_wakes: pc.wakes.wrapping_add(pc.flusher_wakes),
        backpressured_ns: with_ongoing(pc.backpressured_ns, pc.blocked_since_ns),
        records_read: cc.records,
        bytes_read: cc.bytes,
        segments_taken: cc.segments_taken,
        segments_returned: cc.segments_returned,
        consumer_wakes: cc.wakes,
        idle_ns: with_ongoing(cc.idle_ns, cc.idle_since_ns),
        segments_not_free: n - free,
        segments_at_consumer: at_consumer,
        segments_in_flight: pc
            .segments_acquired
            .saturating_sub(cur.segments_done)
            .min(shared.n() as u64),
        segment_cap: cur.segment_cap,
        segment_fill: match cur.segment_fill {
            fill @ 1.. if fill < shared.segment_size() as u64 => fill,
            _ => shared.segment_size() as u64,
        },
        debloat_target_ns: cc.debloat_target_ns,
        debloat_rate: cc.debloat_rate,
        producer_state: f.producer_end.state,
        consumer_state: f.consumer_end.state,
        producer_pid: f.producer_end.pid,
        consumer_pid: f.consumer_end.pid,
        link: match f.link {
            l @ Link {
                role: LINK_SENDING | LINK_RECEIVING,
                ..
            } => Some(LinkSnapshot {
                sending: l.role == LINK_SENDING,
                credit: l.credit,
                backlog: l.backlog,
                in_flight_bytes: l.in_flight_bytes,
                wire_bytes: l.wire_bytes,
            }),
            // 0 (no bridge), or a value no shmflow writes.
            _ => None,
        },
    }
}

/// A wait in progress, shown live (its figures' `since`) and added to their total when it
/// ends — also when the future that waits is dropped, which is why the total lives in shared
/// memory alone.
pub(crate) struct Waiting<'a> {
    wait: figures::Wait<'a>,
    start: u64,
}

impl<'a> Waiting<'a> {
    pub(crate) fn start(wait: figures::Wait<'a>) -> Waiting<'a> {
        let start = crate::sys::clock::monotonic_ns();
        wait.began(start);
        Waiting { wait, start }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.wait.ended();
        let waited = crate::sys::clock::monotonic_ns().saturating_sub(self.start);
        self.wait.counted(waited);
    }
}
