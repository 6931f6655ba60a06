//! The groups of `shmflow bench` (`--only GROUP` picks one): the short trials each takes, what
//! each gives, in the order the report lists them (`paired` decides which run side by side).

use std::time::Duration;

use shmflow::{FlushPolicy, Geometry, WaitStrategy};

use super::floors::{floor_futex, floor_spin, floor_stream};
use super::harness::REC;
use super::local::{
    batch_stream, os_stream, plain_stream, plain_stream_for, rtt_shmflow, rtt_stream,
    shmflow_stream, tuned_stream,
};
use super::paired::Trial;
use super::remote::Streamed;
use super::{asynch, netem, remote, Cfg, BULK, SPIN};

/// The value at fraction `p` of the sorted `v`.
fn pct(v: &[u64], p: f64) -> f64 {
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)] as f64
}

/// A trial of round trips: each measure a percentile of them, as its name says (`_p50_ns`,
/// `_p99_ns`, `_p999_ns`).
fn rtt<'a>(gives: &[&'static str], mut f: impl FnMut() -> Vec<u64> + 'a) -> Trial<'a> {
    let gives = gives.to_vec();
    let at: Vec<(&'static str, f64)> = gives
        .iter()
        .map(|&k| {
            let p = if k.ends_with("_p50_ns") {
                0.5
            } else if k.ends_with("_p99_ns") {
                0.99
            } else if k.ends_with("_p999_ns") {
                0.999
            } else {
                unreachable!("{k}: not a percentile")
            };
            (k, p)
        })
        .collect();
    Trial {
        gives,
        every_pair: true,
        run: Box::new(move || {
            let v = f();
            at.iter().map(|&(k, p)| (k, pct(&v, p))).collect()
        }),
    }
}

/// A trial of a stream that reports (count, nanoseconds): count per second over `unit`.
fn rate<'a>(k: &'static str, unit: f64, mut f: impl FnMut() -> (f64, f64) + 'a) -> Trial<'a> {
    Trial {
        gives: vec![k],
        every_pair: true,
        run: Box::new(move || {
            let (n, ns) = f();
            vec![(k, n / ns * 1e9 / unit)]
        }),
    }
}

/// A trial of a stream between processes whose CPU is counted: `[rate, cpu_s_per_gb]` of
/// records of `len` bytes, the rate in records/s (`gb`: in GB/s).
fn streamed<'a>(
    gives: [&'static str; 2],
    len: usize,
    gb: bool,
    mut f: impl FnMut() -> Streamed + 'a,
) -> Trial<'a> {
    Trial {
        gives: gives.to_vec(),
        every_pair: true,
        run: Box::new(move || {
            let s = f();
            let per_s = s.count / s.ns * 1e9;
            vec![
                (gives[0], if gb { per_s * len as f64 / 1e9 } else { per_s }),
                (gives[1], s.cpu_s_per_gb(s.count * len as f64)),
            ]
        }),
    }
}

/// The trials of every selected group, in the order the report lists their measures.
pub(super) fn trials<'a>(cfg: &'a Cfg, only: Option<&str>) -> Vec<Trial<'a>> {
    let pool = Geometry::default();
    let pool_bytes = pool.segment_size as usize * pool.segment_count as usize;
    let mut t: Vec<Trial<'a>> = Vec::new();
    // `--only GROUP` runs one group, for profiling.
    let want = |g: &str| only.is_none_or(|o| o == g);
    if want("spin") {
        t.push(rtt(
            &["rtt_spin_p50_ns", "rtt_spin_p99_ns", "rtt_spin_p999_ns"],
            || rtt_shmflow(cfg, SPIN, false),
        ));
        t.push(rtt(&["floor_spin_p50_ns"], || floor_spin(cfg)));
    }
    if want("block") {
        t.push(rtt(&["rtt_block_p50_ns", "rtt_block_p99_ns"], || {
            rtt_shmflow(cfg, WaitStrategy::Park, false)
        }));
        t.push(rtt(
            &["rtt_default_wait_p50_ns", "rtt_default_wait_p99_ns"],
            || rtt_shmflow(cfg, WaitStrategy::Block, false),
        ));
        t.push(rtt(&["floor_futex_p50_ns"], || floor_futex(cfg, false)));
        t.push(rtt(&["uds_rtt_p50_ns"], || rtt_stream(cfg, false)));
        t.push(rtt(&["pipe_rtt_p50_ns"], || rtt_stream(cfg, true)));
    }
    if want("same_cpu") {
        t.push(rtt(&["rtt_same_cpu_p50_ns"], || {
            rtt_shmflow(cfg, WaitStrategy::Park, true)
        }));
        t.push(rtt(&["rtt_same_cpu_default_wait_p50_ns"], || {
            rtt_shmflow(cfg, WaitStrategy::Block, true)
        }));
        t.push(rtt(&["floor_futex_same_cpu_p50_ns"], || {
            floor_futex(cfg, true)
        }));
    }
    if want("small") {
        t.push(rate("small_rps", 1.0, move || {
            shmflow_stream(cfg, pool, REC)
        }));
        t.push(rate("small_batch_rps", 1.0, move || {
            batch_stream(cfg, pool, REC)
        }));
        t.push(rate("plain_rps", 1.0, || plain_stream(cfg)));
        t.push(rate("floor_small_rps", 1.0, move || {
            floor_stream(cfg, pool_bytes, REC)
        }));
        t.push(rate("uds_batched_rps", 1.0, || os_stream(cfg, false)));
        t.push(rate("pipe_batched_rps", 1.0, || os_stream(cfg, true)));
    }
    let gb = |(n, ns): (f64, f64)| (n * BULK as f64, ns);
    if want("bulk") {
        t.push(rate("bulk_gbps", 1e9, move || {
            gb(shmflow_stream(cfg, pool, BULK))
        }));
        t.push(rate("floor_bulk_gbps", 1e9, move || {
            gb(floor_stream(cfg, pool_bytes, BULK))
        }));
    }
    if want("async") {
        use asynch::{async_stream, tokio_uds_rtt, Rtt};
        let r = cfg.rounds;
        t.push(rtt(&["rtt_sync_park_p50_ns"], move || {
            asynch::rtt(r, Rtt::Sync)
        }));
        t.push(rtt(
            &["rtt_async_current_p50_ns", "rtt_async_current_p99_ns"],
            move || asynch::rtt(r, Rtt::Current),
        ));
        t.push(rtt(
            &["rtt_async_multi_p50_ns", "rtt_async_multi_p99_ns"],
            move || asynch::rtt(r, Rtt::Multi),
        ));
        t.push(rtt(&["rtt_async_bridge_p50_ns"], move || {
            asynch::rtt(r, Rtt::Bridge)
        }));
        t.push(rtt(&["rtt_async_multi_bridge_p50_ns"], move || {
            asynch::rtt(r, Rtt::MultiBridge)
        }));
        t.push(rtt(&["rtt_sync_block_p50_ns"], move || {
            asynch::rtt(r, Rtt::SyncBlock)
        }));
        t.push(rtt(
            &["rtt_async_block_p50_ns", "rtt_async_block_p99_ns"],
            move || asynch::rtt(r, Rtt::CurrentBlock),
        ));
        t.push(rtt(&["tokio_uds_rtt_p50_ns"], move || tokio_uds_rtt(r)));
        t.push(rate("sync_plain_rps", 1.0, || plain_stream(cfg)));
        t.push(rate("async_rps", 1.0, || async_stream(cfg.secs, false)));
        t.push(rate("async_drain_rps", 1.0, || {
            async_stream(cfg.secs, true)
        }));
    }
    if only == Some("netem") {
        t.push(Trial {
            gives: netem::MEASURES.to_vec(),
            every_pair: false,
            run: Box::new(|| {
                let mut v = Vec::new();
                netem::measure(&mut |k, x| v.push((k, x)));
                v
            }),
        });
    }
    if want("remote") {
        use remote::{
            direct_rtt, direct_stream, remote_rtt, remote_stream, tcp_framed_stream, tcp_rtt,
            tcp_rtt_two, tcp_stream, RttWait, Writes,
        };
        // A stream's CPU figure counts its processes' and connection's set-up too: trials of
        // 3x the others' length keep that a small part of it.
        let (r, secs) = (cfg.rounds / 2, 3.0 * cfg.secs);
        t.push(rtt(
            &["remote_rtt_p50_ns", "remote_rtt_p99_ns"],
            move || remote_rtt(r),
        ));
        t.push(rtt(
            &["direct_rtt_p50_ns", "direct_rtt_p99_ns"],
            move || direct_rtt(r, RttWait::Block),
        ));
        t.push(rtt(&["direct_rtt_park_p50_ns"], move || {
            direct_rtt(r, RttWait::Park)
        }));
        t.push(rtt(&["tcp_pingpong_rtt_p50_ns"], move || tcp_rtt(r)));
        t.push(rtt(&["tcp_two_conn_rtt_p50_ns"], move || tcp_rtt_two(r)));
        // Raw TCP in 64 KiB writes: its bytes per second, the same counted as 64 B records,
        // and its CPU per GB.
        t.push(Trial {
            gives: vec!["tcp_64k_rps64", "tcp_64k_gbps", "tcp_64k_cpu_s_per_gb"],
            every_pair: true,
            run: Box::new(move || {
                let s = tcp_stream(secs);
                let gbps = s.count / s.ns;
                vec![
                    ("tcp_64k_rps64", gbps * 1e9 / REC as f64),
                    ("tcp_64k_gbps", gbps),
                    ("tcp_64k_cpu_s_per_gb", s.cpu_s_per_gb(s.count)),
                ]
            }),
        });
        t.push(streamed(
            ["tcp_framed_rps64", "tcp_framed_cpu_s_per_gb"],
            REC,
            false,
            move || tcp_framed_stream(secs),
        ));
        t.push(streamed(
            ["remote_small_rps", "remote_small_cpu_s_per_gb"],
            REC,
            false,
            move || remote_stream(secs, REC, Writes::Send),
        ));
        t.push(streamed(
            ["remote_small_batch_rps", "remote_small_batch_cpu_s_per_gb"],
            REC,
            false,
            move || remote_stream(secs, REC, Writes::Batch),
        ));
        t.push(streamed(
            ["direct_small_rps", "direct_small_cpu_s_per_gb"],
            REC,
            false,
            move || direct_stream(secs, REC, FlushPolicy::Explicit, Writes::Send),
        ));
        t.push(streamed(
            ["direct_small_batch_rps", "direct_small_batch_cpu_s_per_gb"],
            REC,
            false,
            move || direct_stream(secs, REC, FlushPolicy::Explicit, Writes::Batch),
        ));
        t.push(rate("direct_small_timeout_1ms_rps", 1.0, move || {
            let s = direct_stream(
                secs,
                REC,
                FlushPolicy::Timeout(Duration::from_millis(1)),
                Writes::Send,
            );
            (s.count, s.ns)
        }));
        t.push(rate("direct_small_every_record_rps", 1.0, move || {
            let s = direct_stream(secs, REC, FlushPolicy::EveryRecord, Writes::Send);
            (s.count, s.ns)
        }));
        t.push(streamed(
            ["remote_bulk_gbps", "remote_bulk_cpu_s_per_gb"],
            BULK,
            true,
            move || remote_stream(secs, BULK, Writes::InPlace),
        ));
        t.push(streamed(
            ["remote_bulk_send_gbps", "remote_bulk_send_cpu_s_per_gb"],
            BULK,
            true,
            move || remote_stream(secs, BULK, Writes::Send),
        ));
        t.push(streamed(
            ["direct_bulk_gbps", "direct_bulk_cpu_s_per_gb"],
            BULK,
            true,
            move || direct_stream(secs, BULK, FlushPolicy::EveryRecord, Writes::InPlace),
        ));
        t.push(streamed(
            ["direct_bulk_send_gbps", "direct_bulk_send_cpu_s_per_gb"],
            BULK,
            true,
            move || direct_stream(secs, BULK, FlushPolicy::EveryRecord, Writes::Send),
        ));
        t.push(streamed(
            [
                "direct_small_64k_seg_rps",
                "direct_small_64k_seg_cpu_s_per_gb",
            ],
            REC,
            false,
            move || direct_stream(secs, REC, FlushPolicy::Explicit, Writes::SendWide),
        ));
    }
    if want("markers") {
        t.push(Trial {
            gives: MARKERS.to_vec(),
            every_pair: false,
            run: Box::new(move || markers(cfg, pool)),
        });
    }
    if want("pool") {
        let tiny = Geometry {
            segment_size: 4096,
            segment_count: 2,
        };
        t.push(rate("small_tiny_pool_rps", 1.0, move || {
            shmflow_stream(cfg, tiny, REC)
        }));
    }
    t
}

/// The measures of [`markers`], in its order.
const MARKERS: [&str; 10] = [
    "plain_markers_off_rps",
    "plain_markers_1ms_rps",
    "plain_markers_1ms_vs_off",
    "plain_markers_1ms_vs_off_min",
    "plain_markers_1ms_vs_off_max",
    "small_markers_off_rps",
    "small_markers_1ms_rps",
    "small_markers_1ms_vs_off",
    "small_markers_1ms_vs_off_min",
    "small_markers_1ms_vs_off_max",
];

/// The cost of latency markers at one per millisecond: the plain loop and the tuned one, each
/// in adjacent pairs of short trials, off then on, then on then off (so that neither side is
/// always first): the median of the per-pair ratios and their spread.
fn markers(cfg: &Cfg, pool: Geometry) -> Vec<(&'static str, f64)> {
    let pairs = cfg.pairs.max(2);
    let secs = cfg.secs * 2.0;
    let every = Some(Duration::from_millis(1));
    let rate = |(n, ns): (f64, f64)| n / ns * 1e9;
    let mut forms: [(_, Vec<f64>, Vec<f64>, Vec<f64>); 2] = [
        ("plain", Vec::new(), Vec::new(), Vec::new()),
        ("tuned", Vec::new(), Vec::new(), Vec::new()),
    ];
    for pair in 0..pairs {
        for (form, off, on, ratio) in forms.iter_mut() {
            let run = |m: Option<Duration>| match *form {
                "plain" => rate(plain_stream_for(secs, m)),
                _ => rate(tuned_stream(secs, pool, REC, m)),
            };
            let (a, b) = if pair % 2 == 0 {
                let a = run(None);
                (a, run(every))
            } else {
                let b = run(every);
                (run(None), b)
            };
            off.push(a);
            on.push(b);
            ratio.push(b / a);
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let [(_, p_off, p_on, p_r), (_, t_off, t_on, t_r)] = &mut forms;
    let values = [
        med(p_off),
        med(p_on),
        med(p_r),
        p_r[0],
        p_r[pairs - 1],
        med(t_off),
        med(t_on),
        med(t_r),
        t_r[0],
        t_r[pairs - 1],
    ];
    MARKERS.iter().copied().zip(values).collect()
}
