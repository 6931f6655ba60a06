//! The report of `shmflow bench`: the ratios as a table of data ([`RATIOS`]), and the
//! measures and ratios of the paired trials as a table on stdout or one JSON object, each the
//! median and the spread over its trials or pairs.

use std::fmt;

use super::harness::machine;
use super::paired::Outcome;
use Goal::{AtLeast, AtMost, LowerIsBetter, Reference};

/// What a ratio should be, as the report prints it.
#[derive(Clone, Copy, Debug)]
pub(super) enum Goal {
    /// At least this.
    AtLeast(f64),
    /// At most this.
    AtMost(f64),
    /// No goal: shown to compare.
    Reference,
    /// No bound: the lower the better.
    LowerIsBetter,
}

impl fmt::Display for Goal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AtLeast(v) => write!(f, ">= {v}"),
            AtMost(v) => write!(f, "<= {v}"),
            Reference => f.write_str("(for reference)"),
            LowerIsBetter => f.write_str("(lower is better)"),
        }
    }
}

/// A ratio of two measures of the same run: `num / den`, named `name`.
#[derive(Debug)]
pub(super) struct Ratio {
    pub(super) name: &'static str,
    /// The measure above the line.
    pub(super) num: &'static str,
    /// The measure below it.
    pub(super) den: &'static str,
    pub(super) goal: Goal,
}

/// Every ratio the report shows, in its order: each a measure over another of the same run.
pub(super) const RATIOS: &[Ratio] = &[
    // Remote channels (`--only remote`) against raw TCP between the same two processes on
    // loopback: throughput as a fraction of TCP's (the small records against the same bytes
    // counted as 64 B records), CPU per GB as a multiple of TCP's, and the round trip as a
    // multiple of a TCP ping-pong's; `direct_*` are direct ends, `remote_*` the bridges.
    Ratio {
        name: "direct_small_vs_tcp_64k",
        num: "direct_small_rps",
        den: "tcp_64k_rps64",
        goal: AtLeast(0.8),
    },
    Ratio {
        name: "direct_small_vs_tcp_framed",
        num: "direct_small_rps",
        den: "tcp_framed_rps64",
        goal: Reference,
    },
    Ratio {
        name: "direct_small_cpu_per_gb_vs_tcp_framed",
        num: "direct_small_cpu_s_per_gb",
        den: "tcp_framed_cpu_s_per_gb",
        goal: Reference,
    },
    Ratio {
        name: "direct_small_batch_vs_tcp_64k",
        num: "direct_small_batch_rps",
        den: "tcp_64k_rps64",
        goal: AtLeast(0.8),
    },
    Ratio {
        name: "direct_small_batch_cpu_per_gb_vs_tcp",
        num: "direct_small_batch_cpu_s_per_gb",
        den: "tcp_64k_cpu_s_per_gb",
        goal: AtMost(1.3),
    },
    Ratio {
        name: "direct_small_batch_vs_tcp_framed",
        num: "direct_small_batch_rps",
        den: "tcp_framed_rps64",
        goal: Reference,
    },
    Ratio {
        name: "direct_small_batch_cpu_per_gb_vs_tcp_framed",
        num: "direct_small_batch_cpu_s_per_gb",
        den: "tcp_framed_cpu_s_per_gb",
        goal: Reference,
    },
    Ratio {
        name: "direct_bulk_vs_tcp_64k",
        num: "direct_bulk_gbps",
        den: "tcp_64k_gbps",
        goal: AtLeast(0.8),
    },
    Ratio {
        name: "direct_bulk_send_vs_tcp_64k",
        num: "direct_bulk_send_gbps",
        den: "tcp_64k_gbps",
        goal: Reference,
    },
    Ratio {
        name: "direct_bulk_send_cpu_per_gb_vs_tcp",
        num: "direct_bulk_send_cpu_s_per_gb",
        den: "tcp_64k_cpu_s_per_gb",
        goal: Reference,
    },
    Ratio {
        name: "direct_rtt_vs_tcp_pingpong",
        num: "direct_rtt_p50_ns",
        den: "tcp_pingpong_rtt_p50_ns",
        goal: AtMost(0.3),
    },
    Ratio {
        name: "direct_rtt_park_vs_tcp_pingpong",
        num: "direct_rtt_park_p50_ns",
        den: "tcp_pingpong_rtt_p50_ns",
        goal: Reference,
    },
    Ratio {
        name: "direct_rtt_vs_tcp_two_conn",
        num: "direct_rtt_p50_ns",
        den: "tcp_two_conn_rtt_p50_ns",
        goal: Reference,
    },
    Ratio {
        name: "direct_bulk_cpu_per_gb_vs_tcp",
        num: "direct_bulk_cpu_s_per_gb",
        den: "tcp_64k_cpu_s_per_gb",
        goal: AtMost(1.3),
    },
    Ratio {
        name: "remote_bulk_cpu_per_gb_vs_tcp",
        num: "remote_bulk_cpu_s_per_gb",
        den: "tcp_64k_cpu_s_per_gb",
        goal: AtMost(1.3),
    },
    Ratio {
        name: "remote_small_cpu_per_gb_vs_tcp",
        num: "remote_small_cpu_s_per_gb",
        den: "tcp_64k_cpu_s_per_gb",
        goal: AtMost(1.3),
    },
    Ratio {
        name: "direct_small_cpu_per_gb_vs_tcp",
        num: "direct_small_cpu_s_per_gb",
        den: "tcp_64k_cpu_s_per_gb",
        goal: AtMost(1.3),
    },
    Ratio {
        name: "direct_small_64k_seg_vs_tcp_64k",
        num: "direct_small_64k_seg_rps",
        den: "tcp_64k_rps64",
        goal: Reference,
    },
    Ratio {
        name: "direct_small_64k_seg_cpu_per_gb_vs_tcp",
        num: "direct_small_64k_seg_cpu_s_per_gb",
        den: "tcp_64k_cpu_s_per_gb",
        goal: Reference,
    },
    Ratio {
        name: "remote_small_vs_tcp_64k",
        num: "remote_small_rps",
        den: "tcp_64k_rps64",
        goal: AtLeast(0.8),
    },
    Ratio {
        name: "remote_bulk_vs_tcp_64k",
        num: "remote_bulk_gbps",
        den: "tcp_64k_gbps",
        goal: AtLeast(0.8),
    },
    Ratio {
        name: "remote_small_batch_vs_tcp_64k",
        num: "remote_small_batch_rps",
        den: "tcp_64k_rps64",
        goal: AtLeast(0.8),
    },
    Ratio {
        name: "remote_small_batch_cpu_per_gb_vs_tcp",
        num: "remote_small_batch_cpu_s_per_gb",
        den: "tcp_64k_cpu_s_per_gb",
        goal: AtMost(1.3),
    },
    Ratio {
        name: "remote_bulk_send_vs_tcp_64k",
        num: "remote_bulk_send_gbps",
        den: "tcp_64k_gbps",
        goal: Reference,
    },
    Ratio {
        name: "remote_bulk_send_cpu_per_gb_vs_tcp",
        num: "remote_bulk_send_cpu_s_per_gb",
        den: "tcp_64k_cpu_s_per_gb",
        goal: Reference,
    },
    Ratio {
        name: "remote_rtt_vs_tcp_pingpong",
        num: "remote_rtt_p50_ns",
        den: "tcp_pingpong_rtt_p50_ns",
        goal: AtMost(1.3),
    },
    // shmflow between two local processes against the floors (the same transfers on raw shared
    // memory, with no protocol) and against a Unix socket: the
    // round trips busy-polling and parked, the tuned streams of small and bulk records, and
    // the plain loop against the tuned one.
    Ratio {
        name: "rtt_spin_vs_floor",
        num: "rtt_spin_p50_ns",
        den: "floor_spin_p50_ns",
        goal: AtMost(2.5),
    },
    Ratio {
        name: "rtt_block_vs_futex_floor",
        num: "rtt_block_p50_ns",
        den: "floor_futex_p50_ns",
        goal: AtMost(1.2),
    },
    Ratio {
        name: "small_vs_uds_batched",
        num: "small_rps",
        den: "uds_batched_rps",
        goal: AtLeast(3.0),
    },
    Ratio {
        name: "small_vs_floor",
        num: "small_rps",
        den: "floor_small_rps",
        goal: AtLeast(0.8),
    },
    Ratio {
        name: "small_batch_vs_floor",
        num: "small_batch_rps",
        den: "floor_small_rps",
        goal: AtLeast(0.9),
    },
    Ratio {
        name: "plain_vs_small",
        num: "plain_rps",
        den: "small_rps",
        goal: AtLeast(0.7),
    },
    Ratio {
        name: "bulk_vs_floor",
        num: "bulk_gbps",
        den: "floor_bulk_gbps",
        goal: AtLeast(0.8),
    },
    // The async forms (`--only async`) against the blocking ones in the same run: round trips
    // on a current-thread and a multi-thread runtime, through the doorbell and through the
    // bridge thread, against tokio's Unix socket; and the plain async stream.
    Ratio {
        name: "async_rtt_current_vs_sync_park",
        num: "rtt_async_current_p50_ns",
        den: "rtt_sync_park_p50_ns",
        goal: AtMost(1.5),
    },
    Ratio {
        name: "async_rtt_multi_vs_sync_park",
        num: "rtt_async_multi_p50_ns",
        den: "rtt_sync_park_p50_ns",
        goal: AtMost(1.5),
    },
    Ratio {
        name: "async_rtt_doorbell_vs_bridge",
        num: "rtt_async_current_p50_ns",
        den: "rtt_async_bridge_p50_ns",
        goal: LowerIsBetter,
    },
    Ratio {
        name: "async_rtt_current_vs_tokio_uds",
        num: "rtt_async_current_p50_ns",
        den: "tokio_uds_rtt_p50_ns",
        goal: LowerIsBetter,
    },
    Ratio {
        name: "async_rtt_block_vs_tokio_uds",
        num: "rtt_async_block_p50_ns",
        den: "tokio_uds_rtt_p50_ns",
        goal: AtMost(0.7),
    },
    Ratio {
        name: "async_rtt_block_vs_sync_block",
        num: "rtt_async_block_p50_ns",
        den: "rtt_sync_block_p50_ns",
        goal: AtMost(1.3),
    },
    Ratio {
        name: "async_vs_sync_plain",
        num: "async_rps",
        den: "sync_plain_rps",
        goal: AtLeast(0.8),
    },
    Ratio {
        name: "async_drain_vs_sync_plain",
        num: "async_drain_rps",
        den: "sync_plain_rps",
        goal: Reference,
    },
    // Both processes on one CPU: the round trip against the futex floor's there.
    Ratio {
        name: "same_cpu_vs_futex_floor_same_cpu",
        num: "rtt_same_cpu_p50_ns",
        den: "floor_futex_same_cpu_p50_ns",
        goal: AtMost(2.0),
    },
    // Across a link delayed by 1 ms and by 10 ms one way (`--only netem`): the throughput
    // against raw TCP on the same link with enough credit, and with a pool of 4 segments
    // against what credit allows per round trip (above 1 would be beyond that bound).
    Ratio {
        name: "netem1_direct_vs_tcp",
        num: "netem1_direct_mbs",
        den: "netem1_tcp_mbs",
        goal: AtLeast(0.8),
    },
    Ratio {
        name: "netem1_remote_vs_tcp",
        num: "netem1_remote_mbs",
        den: "netem1_tcp_mbs",
        goal: AtLeast(0.8),
    },
    Ratio {
        name: "netem1_direct_pool4_vs_bound",
        num: "netem1_direct_pool4_mbs",
        den: "netem1_pool4_bound_mbs",
        goal: AtMost(1.0),
    },
    Ratio {
        name: "netem1_remote_pool4_vs_bound",
        num: "netem1_remote_pool4_mbs",
        den: "netem1_pool4_bound_mbs",
        goal: AtMost(1.0),
    },
    Ratio {
        name: "netem10_direct_vs_tcp",
        num: "netem10_direct_mbs",
        den: "netem10_tcp_mbs",
        goal: AtLeast(0.8),
    },
    Ratio {
        name: "netem10_remote_vs_tcp",
        num: "netem10_remote_mbs",
        den: "netem10_tcp_mbs",
        goal: AtLeast(0.8),
    },
    Ratio {
        name: "netem10_direct_pool4_vs_bound",
        num: "netem10_direct_pool4_mbs",
        den: "netem10_pool4_bound_mbs",
        goal: AtMost(1.0),
    },
    Ratio {
        name: "netem10_remote_pool4_vs_bound",
        num: "netem10_remote_pool4_mbs",
        den: "netem10_pool4_bound_mbs",
        goal: AtMost(1.0),
    },
];

/// A baseline that moved more than this many times between pairs makes its ratios suspect.
const MOVED_LIMIT: f64 = 2.0;

/// The baselines (the measures below a ratio's line) whose largest value over their trials is
/// more than [`MOVED_LIMIT`] times their smallest: (baseline, how many times it moved, the
/// ratios over it that were measured). One pair moves nothing.
fn moved_baselines(out: &Outcome) -> Vec<(&'static str, f64, Vec<&'static str>)> {
    let mut moved: Vec<(&'static str, f64, Vec<&'static str>)> = Vec::new();
    if out.pairs < 2 {
        return moved;
    }
    for (ratio, values) in RATIOS.iter().zip(&out.ratios) {
        if values.is_empty() {
            continue;
        }
        let Some((_, v)) = out.measures.iter().find(|m| m.0 == ratio.den) else {
            continue;
        };
        let v: Vec<f64> = v
            .iter()
            .copied()
            .filter(|x| x.is_finite() && *x > 0.0)
            .collect();
        if v.len() < 2 {
            continue;
        }
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        if hi / lo <= MOVED_LIMIT {
            continue;
        }
        match moved.iter_mut().find(|m| m.0 == ratio.den) {
            Some(m) => m.2.push(ratio.name),
            None => moved.push((ratio.den, hi / lo, vec![ratio.name])),
        }
    }
    moved
}

/// Three decimals, as the figures are reported (a float that is not finite becomes `null`).
pub(super) fn round3(v: f64) -> Option<f64> {
    v.is_finite().then(|| (v * 1000.0).round() / 1000.0)
}

/// Median, min and max of the finite values (NaN for all three if there is none).
pub(super) fn summary(values: Vec<f64>) -> (f64, f64, f64) {
    let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    let mid = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (mid, v[0], v[v.len() - 1])
}

/// Prints what the trials measured: each measure's median and spread over its trials, each
/// ratio's over its pairs; a table, or with `json` one object.
pub(super) fn print(out: &Outcome, quick: bool, json: bool) {
    let measures: Vec<(&str, (f64, f64, f64))> = out
        .measures
        .iter()
        .map(|(k, v)| (*k, summary(v.clone())))
        .collect();
    let ratio_rows: Vec<(&Ratio, (f64, f64, f64), usize)> = RATIOS
        .iter()
        .zip(&out.ratios)
        .map(|(ratio, v)| (ratio, summary(v.clone()), v.len()))
        .collect();
    let n = out.pairs;
    let moved = moved_baselines(out);
    let (cpu, cores, kernel) = machine();
    if json {
        let mut obj = serde_json::Map::new();
        obj.insert(
            "machine".into(),
            serde_json::json!({ "cpu": cpu, "cores": cores, "kernel": kernel }),
        );
        obj.insert("quick".into(), quick.into());
        obj.insert("pairs".into(), n.into());
        let mut spread = serde_json::Map::new();
        for (k, (mid, lo, hi)) in &measures {
            obj.insert((*k).into(), serde_json::json!(round3(*mid)));
            spread.insert((*k).into(), serde_json::json!([round3(*lo), round3(*hi)]));
        }
        let ratios: serde_json::Map<String, serde_json::Value> = ratio_rows
            .iter()
            .map(|(r, (mid, _, _), _)| (r.name.to_owned(), serde_json::json!(round3(*mid))))
            .collect();
        for (r, (_, lo, hi), _) in &ratio_rows {
            spread.insert(r.name.into(), serde_json::json!([round3(*lo), round3(*hi)]));
        }
        obj.insert("ratios".into(), ratios.into());
        let counts: serde_json::Map<String, serde_json::Value> = ratio_rows
            .iter()
            .map(|(r, _, n)| (r.name.to_owned(), (*n).into()))
            .collect();
        obj.insert("ratio_pairs".into(), counts.into());
        obj.insert("spread".into(), spread.into());
        let flags: Vec<serde_json::Value> = moved
            .iter()
            .map(|(b, x, rs)| serde_json::json!({ "baseline": b, "moved": round3(*x), "ratios": rs }))
            .collect();
        obj.insert("moved_baselines".into(), flags.into());
        println!("{}", serde_json::Value::Object(obj));
    } else {
        println!(
            "machine: {cpu}, {cores} cores, Linux {kernel}{}; median [min..max] over the \
             trials of each measure and the pairs of each ratio",
            if quick { " (quick run)" } else { "" },
        );
        let cell = |(mid, lo, hi): (f64, f64, f64)| {
            if lo < hi {
                format!("{mid:>12.2} [{lo:.2}..{hi:.2}]")
            } else {
                format!("{mid:>12.2}")
            }
        };
        println!("{:<40} {:>12}", "measure", "value");
        for (k, v) in &measures {
            println!("{k:<40} {}", cell(*v));
        }
        println!(
            "\n{:<40} {:>12}  goal  (pairs)",
            "ratio (adjacent trials)", "value"
        );
        for (r, v, pairs) in &ratio_rows {
            // A ratio of groups that were not run is left out.
            if *pairs > 0 {
                println!("{:<40} {}  {}  ({pairs})", r.name, cell(*v), r.goal);
            }
        }
        for (b, x, rs) in &moved {
            println!(
                "FLAG: the baseline {b} moved {x:.1}x between pairs (more than {MOVED_LIMIT}x): \
                 the host was not steady, and {} say as much about it as about shmflow",
                rs.join(", ")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goals_read_as_the_report_prints_them() {
        let shown: Vec<String> = [AtLeast(0.8), AtLeast(3.0), AtMost(2.5), AtMost(1.0)]
            .iter()
            .chain(&[Reference, LowerIsBetter])
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            shown,
            [
                ">= 0.8",
                ">= 3",
                "<= 2.5",
                "<= 1",
                "(for reference)",
                "(lower is better)"
            ]
        );
    }

    /// An outcome of `pairs` pairs of the small group's tuned stream against its floor.
    fn small(floors: &[f64]) -> Outcome {
        let mut ratios = vec![Vec::new(); RATIOS.len()];
        let i = RATIOS
            .iter()
            .position(|r| r.name == "small_vs_floor")
            .unwrap();
        ratios[i] = floors.iter().map(|f| 100.0 / f).collect();
        Outcome {
            measures: vec![
                ("small_rps", vec![100.0; floors.len()]),
                ("floor_small_rps", floors.to_vec()),
            ],
            ratios,
            pairs: floors.len(),
        }
    }

    #[test]
    fn a_baseline_that_moved_more_than_twice_is_flagged_with_its_ratios() {
        assert!(
            moved_baselines(&small(&[100.0])).is_empty(),
            "one pair moves nothing"
        );
        let mut one = small(&[100.0]);
        one.measures[1].1.push(300.0);
        assert!(
            moved_baselines(&one).is_empty(),
            "nor two trials of one pair"
        );
        assert!(moved_baselines(&small(&[100.0, 190.0])).is_empty());
        let moved = moved_baselines(&small(&[100.0, 150.0, 250.0]));
        assert_eq!(moved.len(), 1);
        assert_eq!(moved[0].0, "floor_small_rps");
        assert!((moved[0].1 - 2.5).abs() < 1e-9);
        assert_eq!(moved[0].2, vec!["small_vs_floor"]);
    }

    #[test]
    fn ratios_have_distinct_names() {
        let mut names: Vec<&str> = RATIOS.iter().map(|r| r.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), RATIOS.len());
    }
}
