//! The groups of `shmflow bench` (`--only GROUP` picks one): which measures each takes, in
//! the order the report lists them.

use std::time::Duration;

use shmflow::{FlushPolicy, Geometry, WaitStrategy};

use super::floors::{floor_futex, floor_spin, floor_stream};
use super::harness::REC;
use super::local::{
    os_stream, plain_stream, plain_stream_for, rtt_shmflow, rtt_stream, shmflow_stream,
    tuned_stream,
};
use super::{asynch, netem, remote, Cfg, BULK, SPIN};

/// The value at fraction `p` of the sorted `v`.
fn pct(v: &[u64], p: f64) -> f64 {
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)] as f64
}

/// Best of `repeats`: the child reports "count nanos" for what it consumed.
fn best(cfg: &Cfg, mut run: impl FnMut() -> (f64, f64)) -> f64 {
    (0..cfg.repeats)
        .map(|_| {
            let (n, ns) = run();
            n / ns * 1e9
        })
        .fold(0.0, f64::max)
}

/// One run of every selected group: (measure, value) in order.
pub(super) fn one_run(cfg: &Cfg, only: Option<&str>, json: bool) -> Vec<(&'static str, f64)> {
    let pool = Geometry::default();
    let pool_bytes = pool.segment_size as usize * pool.segment_count as usize;
    let mut r: Vec<(&'static str, f64)> = Vec::new();
    let mut note = |k: &'static str, v: f64| {
        if !json {
            eprintln!("  {k:<24} {v:>14.1}");
        }
        r.push((k, v));
    };
    // `--only GROUP` runs one group, for profiling.
    let want = |g: &str| only.is_none_or(|o| o == g);
    if want("spin") {
        let v = rtt_shmflow(cfg, SPIN, false);
        note("rtt_spin_p50_ns", pct(&v, 0.5));
        note("rtt_spin_p99_ns", pct(&v, 0.99));
        note("rtt_spin_p999_ns", pct(&v, 0.999));
        note("floor_spin_p50_ns", pct(&floor_spin(cfg), 0.5));
    }
    if want("block") {
        let v = rtt_shmflow(cfg, WaitStrategy::Park, false);
        note("rtt_block_p50_ns", pct(&v, 0.5));
        note("rtt_block_p99_ns", pct(&v, 0.99));
        let v = rtt_shmflow(cfg, WaitStrategy::Block, false);
        note("rtt_default_wait_p50_ns", pct(&v, 0.5));
        note("rtt_default_wait_p99_ns", pct(&v, 0.99));
        note("floor_futex_p50_ns", pct(&floor_futex(cfg, false), 0.5));
        note("uds_rtt_p50_ns", pct(&rtt_stream(cfg, false), 0.5));
        note("pipe_rtt_p50_ns", pct(&rtt_stream(cfg, true), 0.5));
    }
    if want("same_cpu") {
        note(
            "rtt_same_cpu_p50_ns",
            pct(&rtt_shmflow(cfg, WaitStrategy::Park, true), 0.5),
        );
        note(
            "rtt_same_cpu_default_wait_p50_ns",
            pct(&rtt_shmflow(cfg, WaitStrategy::Block, true), 0.5),
        );
        note(
            "floor_futex_same_cpu_p50_ns",
            pct(&floor_futex(cfg, true), 0.5),
        );
    }
    if want("small") {
        note("small_rps", best(cfg, || shmflow_stream(cfg, pool, REC)));
        note("plain_rps", best(cfg, || plain_stream(cfg)));
        note(
            "floor_small_rps",
            best(cfg, || floor_stream(cfg, pool_bytes, REC)),
        );
        note("uds_batched_rps", best(cfg, || os_stream(cfg, false)));
        note("pipe_batched_rps", best(cfg, || os_stream(cfg, true)));
    }
    let gb = |(n, ns): (f64, f64)| (n * BULK as f64, ns);
    if want("bulk") {
        note(
            "bulk_gbps",
            best(cfg, || gb(shmflow_stream(cfg, pool, BULK))) / 1e9,
        );
        note(
            "floor_bulk_gbps",
            best(cfg, || gb(floor_stream(cfg, pool_bytes, BULK))) / 1e9,
        );
    }
    if want("async") {
        use asynch::{rtt, Rtt};
        // Alternating, so that a slow moment of the host falls on both sides of each ratio.
        let (mut sync, mut cur, mut multi, mut bridge, mut multi_bridge) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut sync_block, mut cur_block, mut uds) = (Vec::new(), Vec::new(), Vec::new());
        // Alternating, so that a slow moment of the host falls on every figure of a ratio.
        for _ in 0..2 {
            sync.extend(rtt(cfg.rounds / 2, Rtt::Sync));
            cur.extend(rtt(cfg.rounds / 2, Rtt::Current));
            multi.extend(rtt(cfg.rounds / 2, Rtt::Multi));
            bridge.extend(rtt(cfg.rounds / 2, Rtt::Bridge));
            multi_bridge.extend(rtt(cfg.rounds / 2, Rtt::MultiBridge));
            sync_block.extend(rtt(cfg.rounds / 2, Rtt::SyncBlock));
            cur_block.extend(rtt(cfg.rounds / 2, Rtt::CurrentBlock));
            uds.extend(asynch::tokio_uds_rtt(cfg.rounds / 2));
        }
        for v in [
            &mut sync,
            &mut cur,
            &mut multi,
            &mut bridge,
            &mut multi_bridge,
            &mut sync_block,
            &mut cur_block,
            &mut uds,
        ] {
            v.sort_unstable();
        }
        note("rtt_sync_park_p50_ns", pct(&sync, 0.5));
        note("rtt_async_current_p50_ns", pct(&cur, 0.5));
        note("rtt_async_current_p99_ns", pct(&cur, 0.99));
        note("rtt_async_multi_p50_ns", pct(&multi, 0.5));
        note("rtt_async_multi_p99_ns", pct(&multi, 0.99));
        note("rtt_async_bridge_p50_ns", pct(&bridge, 0.5));
        note("rtt_async_multi_bridge_p50_ns", pct(&multi_bridge, 0.5));
        note("rtt_sync_block_p50_ns", pct(&sync_block, 0.5));
        note("rtt_async_block_p50_ns", pct(&cur_block, 0.5));
        note("rtt_async_block_p99_ns", pct(&cur_block, 0.99));
        note("tokio_uds_rtt_p50_ns", pct(&uds, 0.5));
        // The best of each, the three tried in turn: the host's slow spells (a stream 5-10x
        // slower for seconds) then fall on every side of `async_vs_sync_plain` alike, where
        // trying one form's repeats after the other's paired whichever spell each fell in.
        let (mut sync_plain, mut plain, mut drain) = (0.0f64, 0.0f64, 0.0f64);
        let rate = |(n, ns): (f64, f64)| n / ns * 1e9;
        for _ in 0..cfg.repeats {
            sync_plain = sync_plain.max(rate(plain_stream(cfg)));
            plain = plain.max(rate(asynch::async_stream(cfg.secs, false)));
            drain = drain.max(rate(asynch::async_stream(cfg.secs, true)));
        }
        note("sync_plain_rps", sync_plain);
        note("async_rps", plain);
        note("async_drain_rps", drain);
    }
    if only == Some("netem") {
        netem::measure(&mut note);
    }
    if want("remote") {
        use remote::{
            direct_rtt, direct_stream, remote_rtt, remote_stream, tcp_framed_stream, tcp_rtt,
            tcp_rtt_two, tcp_stream, RttWait, Streamed, Writes,
        };
        // Alternating, so that a slow moment of the host falls on both sides of each ratio.
        let (mut remote, mut direct, mut tcp) = (Vec::new(), Vec::new(), Vec::new());
        let (mut tcp_two, mut direct_park) = (Vec::new(), Vec::new());
        for _ in 0..2 {
            remote.extend(remote_rtt(cfg.rounds / 4));
            direct.extend(direct_rtt(cfg.rounds / 4, RttWait::Block));
            direct_park.extend(direct_rtt(cfg.rounds / 4, RttWait::Park));
            tcp.extend(tcp_rtt(cfg.rounds / 4));
            tcp_two.extend(tcp_rtt_two(cfg.rounds / 4));
        }
        for v in [
            &mut remote,
            &mut direct,
            &mut direct_park,
            &mut tcp,
            &mut tcp_two,
        ] {
            v.sort_unstable();
        }
        note("remote_rtt_p50_ns", pct(&remote, 0.5));
        note("remote_rtt_p99_ns", pct(&remote, 0.99));
        note("direct_rtt_p50_ns", pct(&direct, 0.5));
        note("direct_rtt_p99_ns", pct(&direct, 0.99));
        note("direct_rtt_park_p50_ns", pct(&direct_park, 0.5));
        note("tcp_pingpong_rtt_p50_ns", pct(&tcp, 0.5));
        note("tcp_two_conn_rtt_p50_ns", pct(&tcp_two, 0.5));
        // Each figure the median of the repeats; CPU per GB from the same runs.
        let (mut small, mut bulk, mut raw) = (Vec::new(), Vec::new(), Vec::new());
        let (mut dsmall, mut dsmall_each, mut dbulk) = (Vec::new(), Vec::new(), Vec::new());
        let mut dsmall_timeout = Vec::new();
        let (mut dsmall_wide, mut cpu_direct_small_wide) = (Vec::new(), Vec::new());
        let (mut dbulk_send, mut cpu_direct_send) = (Vec::new(), Vec::new());
        let (mut cpu_tcp, mut cpu_bridged, mut cpu_direct) = (Vec::new(), Vec::new(), Vec::new());
        let (mut cpu_bridged_small, mut cpu_direct_small) = (Vec::new(), Vec::new());
        let (mut framed, mut cpu_framed) = (Vec::new(), Vec::new());
        for _ in 0..cfg.repeats {
            let rate = |s: &Streamed, len: usize| s.count / s.ns * 1e9 * len as f64;
            let s = tcp_stream(cfg.secs);
            raw.push(s.count / s.ns);
            cpu_tcp.push(s.cpu_s_per_gb(s.count));
            let s = tcp_framed_stream(cfg.secs);
            framed.push(rate(&s, 1));
            cpu_framed.push(s.cpu_s_per_gb(s.count * REC as f64));
            let s = remote_stream(cfg.secs, REC);
            small.push(rate(&s, 1));
            cpu_bridged_small.push(s.cpu_s_per_gb(s.count * REC as f64));
            let s = direct_stream(cfg.secs, REC, FlushPolicy::Explicit, Writes::Send);
            dsmall.push(rate(&s, 1));
            cpu_direct_small.push(s.cpu_s_per_gb(s.count * REC as f64));
            let s = direct_stream(cfg.secs, REC, FlushPolicy::Explicit, Writes::SendWide);
            dsmall_wide.push(rate(&s, 1));
            cpu_direct_small_wide.push(s.cpu_s_per_gb(s.count * REC as f64));
            let s = direct_stream(
                cfg.secs,
                REC,
                FlushPolicy::Timeout(Duration::from_millis(1)),
                Writes::Send,
            );
            dsmall_timeout.push(rate(&s, 1));
            let s = direct_stream(cfg.secs, REC, FlushPolicy::EveryRecord, Writes::Send);
            dsmall_each.push(rate(&s, 1));
            let s = remote_stream(cfg.secs, BULK);
            bulk.push(rate(&s, BULK) / 1e9);
            cpu_bridged.push(s.cpu_s_per_gb(s.count * BULK as f64));
            let s = direct_stream(cfg.secs, BULK, FlushPolicy::EveryRecord, Writes::InPlace);
            dbulk.push(rate(&s, BULK) / 1e9);
            cpu_direct.push(s.cpu_s_per_gb(s.count * BULK as f64));
            let s = direct_stream(cfg.secs, BULK, FlushPolicy::EveryRecord, Writes::Send);
            dbulk_send.push(rate(&s, BULK) / 1e9);
            cpu_direct_send.push(s.cpu_s_per_gb(s.count * BULK as f64));
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let raw = med(&mut raw);
        note("remote_small_rps", med(&mut small));
        note("direct_small_rps", med(&mut dsmall));
        note("direct_small_timeout_1ms_rps", med(&mut dsmall_timeout));
        note("direct_small_every_record_rps", med(&mut dsmall_each));
        note("tcp_64k_rps64", raw * 1e9 / REC as f64);
        note("tcp_framed_rps64", med(&mut framed));
        note("tcp_framed_cpu_s_per_gb", med(&mut cpu_framed));
        note("remote_bulk_gbps", med(&mut bulk));
        note("direct_bulk_gbps", med(&mut dbulk));
        note("direct_bulk_send_gbps", med(&mut dbulk_send));
        note("tcp_64k_gbps", raw);
        note("tcp_64k_cpu_s_per_gb", med(&mut cpu_tcp));
        note("remote_bulk_cpu_s_per_gb", med(&mut cpu_bridged));
        note("direct_bulk_cpu_s_per_gb", med(&mut cpu_direct));
        note("direct_bulk_send_cpu_s_per_gb", med(&mut cpu_direct_send));
        note("remote_small_cpu_s_per_gb", med(&mut cpu_bridged_small));
        note("direct_small_cpu_s_per_gb", med(&mut cpu_direct_small));
        note("direct_small_64k_seg_rps", med(&mut dsmall_wide));
        note(
            "direct_small_64k_seg_cpu_s_per_gb",
            med(&mut cpu_direct_small_wide),
        );
    }
    if want("markers") {
        markers(cfg, pool, &mut note);
    }
    if want("pool") {
        note(
            "small_tiny_pool_rps",
            best(cfg, || {
                shmflow_stream(
                    cfg,
                    Geometry {
                        segment_size: 4096,
                        segment_count: 2,
                    },
                    REC,
                )
            }),
        );
    }
    r
}

/// The cost of latency markers at one per millisecond: the plain loop and the tuned one, each
/// in adjacent pairs of short trials, off then on, then on then off (so that neither side is
/// always first): the median of the per-pair ratios and their spread.
fn markers(cfg: &Cfg, pool: Geometry, note: &mut impl FnMut(&'static str, f64)) {
    const PAIRS: usize = 10;
    let secs = cfg.secs / 2.0;
    let every = Some(Duration::from_millis(1));
    let rate = |(n, ns): (f64, f64)| n / ns * 1e9;
    let mut forms: [(_, Vec<f64>, Vec<f64>, Vec<f64>); 2] = [
        ("plain", Vec::new(), Vec::new(), Vec::new()),
        ("tuned", Vec::new(), Vec::new(), Vec::new()),
    ];
    for pair in 0..PAIRS {
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
    note("plain_markers_off_rps", med(p_off));
    note("plain_markers_1ms_rps", med(p_on));
    note("plain_markers_1ms_vs_off", med(p_r));
    note("plain_markers_1ms_vs_off_min", p_r[0]);
    note("plain_markers_1ms_vs_off_max", p_r[PAIRS - 1]);
    note("small_markers_off_rps", med(t_off));
    note("small_markers_1ms_rps", med(t_on));
    note("small_markers_1ms_vs_off", med(t_r));
    note("small_markers_1ms_vs_off_min", t_r[0]);
    note("small_markers_1ms_vs_off_max", t_r[PAIRS - 1]);
}
