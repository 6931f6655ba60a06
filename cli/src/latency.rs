//! Latency markers' figures as the tools show them: each source's histogram from the region
//! loaded into an HdrHistogram, its quantiles (Flink's p50, p95, p99, p999), over the whole run
//! or over the last sampling window.

use hdrhistogram::Histogram;
use serde_json::{json, Value};
use shmflow::metrics::SourceLatency;

/// The quantiles shown, with their names (Flink's).
pub(crate) const QUANTILES: [(&str, f64); 4] =
    [("p50", 0.5), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999)];

/// One source's figures, in nanoseconds.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Figures {
    pub(crate) source: String,
    pub(crate) count: u64,
    /// In the order of [`QUANTILES`].
    pub(crate) quantiles: [u64; 4],
    pub(crate) max: u64,
}

/// The region's histogram of `l` as an HdrHistogram: each bucket's markers at the bucket's
/// largest age (at most the largest age seen), so that a quantile is never below the true one.
pub(crate) fn histogram(l: &SourceLatency) -> Histogram<u64> {
    // The region's buckets are 1/32 wide: two significant digits keep them apart. Up to
    // 2^40 ns (about 18 minutes), past the region's last bucket.
    let mut h = Histogram::<u64>::new_with_bounds(1, 1 << 40, 2)
        .expect("bounds 1 ..= 2^40 at 2 significant digits are valid");
    for &(low, n) in &l.buckets {
        // The bucket's top (one below the next bucket's bottom), at most the largest age.
        let mut one = SourceLatency::default();
        one.buckets = vec![(low, 1)];
        one.max = l.max;
        let top = one.quantile(1.0).as_nanos().min(u64::MAX as u128) as u64;
        h.saturating_record_n(top.max(1), n);
    }
    h
}

/// `l`'s figures.
pub(crate) fn figures(l: &SourceLatency) -> Figures {
    let h = histogram(l);
    let max = l.max.as_nanos().min(u64::MAX as u128) as u64;
    Figures {
        source: l.source.clone(),
        count: l.count,
        // HdrHistogram answers with the top of its own bucket: never past the largest age.
        quantiles: QUANTILES.map(|(_, q)| {
            if h.is_empty() {
                0
            } else {
                h.value_at_quantile(q).min(max)
            }
        }),
        max,
    }
}

/// The markers of `now` counted since `prev` (the same sources read earlier), per source.
pub(crate) fn window(prev: &[SourceLatency], now: &[SourceLatency]) -> Vec<SourceLatency> {
    now.iter()
        .map(|n| match prev.iter().find(|p| p.source == n.source) {
            Some(p) => n.since(p),
            None => n.clone(),
        })
        .collect()
}

/// The figures as JSON: one object per source, nanoseconds.
pub(crate) fn json(ls: &[SourceLatency]) -> Value {
    Value::Array(
        ls.iter()
            .map(|l| {
                let f = figures(l);
                let mut o = serde_json::Map::new();
                o.insert("source".into(), json!(f.source));
                o.insert("count".into(), json!(f.count));
                for ((name, _), v) in QUANTILES.iter().zip(f.quantiles) {
                    o.insert(format!("{name}_ns"), json!(v));
                }
                o.insert("max_ns".into(), json!(f.max));
                o.insert("mean_ns".into(), json!(l.mean().as_nanos() as u64));
                Value::Object(o)
            })
            .collect(),
    )
}

/// The lines `shmflow stat` prints: each source's quantiles since the start, and over the
/// window (`prev` → `now`) when markers came in it.
pub(crate) fn lines(prev: &[SourceLatency], now: &[SourceLatency]) -> Vec<String> {
    let recent = window(prev, now);
    let mut out = Vec::new();
    if now.is_empty() {
        return out;
    }
    out.push(format!(
        "  latency     {:<20} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9}",
        "source (markers)", "p50", "p95", "p99", "p999", "max", "count"
    ));
    for (l, r) in now.iter().zip(&recent) {
        let f = figures(l);
        let q = f.quantiles.map(crate::inspect::duration_ns);
        out.push(format!(
            "              {:<20} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9}",
            cut(&f.source, 20),
            q[0],
            q[1],
            q[2],
            q[3],
            crate::inspect::duration_ns(f.max),
            f.count
        ));
        if r.count > 0 && r.count < l.count {
            let w = figures(r);
            let q = w.quantiles.map(crate::inspect::duration_ns);
            out.push(format!(
                "              {:<20} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9}",
                "  (this window)", q[0], q[1], q[2], q[3], "", w.count
            ));
        }
    }
    out
}

/// `s` cut to `n` characters.
fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        s.chars().take(n - 1).chain(['…']).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn source(buckets: Vec<(u64, u64)>, max_ns: u64) -> SourceLatency {
        let mut l = SourceLatency::default();
        l.source = "s".into();
        l.count = buckets.iter().map(|b| b.1).sum();
        l.max = Duration::from_nanos(max_ns);
        l.buckets = buckets;
        l
    }

    #[test]
    fn quantiles_come_from_the_buckets_never_below_the_truth() {
        // 98 markers at about 10 µs, one at 1 ms, one at 50 ms.
        let l = source(vec![(9_984, 98), (999_424, 1), (49_807_360, 1)], 50_000_000);
        let f = figures(&l);
        assert_eq!(f.count, 100);
        let [p50, p95, p99, p999] = f.quantiles;
        assert!((9_984..10_400).contains(&p50), "{p50}");
        assert_eq!(p95, p50);
        assert!((999_424..1_032_000).contains(&p99), "{p99}");
        assert!((49_807_360..=50_100_000).contains(&p999), "{p999}");
        assert_eq!(f.max, 50_000_000);
    }

    #[test]
    fn a_window_counts_only_what_came_in_it() {
        let before = source(vec![(9_984, 10)], 10_000);
        let now = source(vec![(9_984, 10), (999_424, 5)], 1_000_000);
        let w = window(&[before], &[now]);
        assert_eq!(w[0].count, 5);
        assert_eq!(w[0].buckets, vec![(999_424, 5)]);
        let f = figures(&w[0]);
        assert!(f.quantiles[0] >= 999_424);
    }

    #[test]
    fn no_markers_no_lines() {
        assert!(lines(&[], &[]).is_empty());
        let l = source(vec![(1_000, 1)], 1_000);
        let text = lines(&[], &[l]).join("\n");
        assert!(text.contains("p999") && text.contains("s "), "{text}");
    }
}
