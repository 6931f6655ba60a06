//! The `shmflow` command: list, stat --json, clean, and clear failures on regions that are not
//! shmflow's; every subcommand has `--help`; a bad command line is clap's usage error.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::process::Command;

use common::unique_name;
use shmflow::{Consumer, FlushPolicy, Geometry, Producer};

fn shmflow(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_shmflow"))
        .args(args)
        .output()
        .unwrap()
}

const FIELDS: [&str; 33] = [
    "region",
    "segment_count",
    "segment_size",
    "producer_state",
    "producer_pid",
    "consumer_state",
    "consumer_pid",
    "records_written",
    "bytes_written",
    "segments_committed",
    "segments_acquired",
    "producer_wakes",
    "backpressured_ns",
    "records_read",
    "bytes_read",
    "segments_taken",
    "segments_returned",
    "consumer_wakes",
    "idle_ns",
    "segments_not_free",
    "segments_at_consumer",
    "window_s",
    "records_written_per_s",
    "records_read_per_s",
    "bytes_written_per_s",
    "bytes_read_per_s",
    "backPressuredTimeMsPerSecond",
    "producerBusyTimeMsPerSecond",
    "idleTimeMsPerSecond",
    "busyTimeMsPerSecond",
    "outPoolUsage",
    "inPoolUsage",
    "backpressureLevel",
];

#[test]
fn stat_json_parses_and_has_every_field() {
    let name = unique_name("cli-json");
    let mut p = Producer::create(
        &name,
        Geometry {
            segment_size: 4096,
            segment_count: 4,
        },
    )
    .unwrap();
    let mut c = Consumer::open(&name).unwrap();
    p.set_flush_policy(FlushPolicy::EveryRecord);
    for i in 0..10u64 {
        p.send_pod(&i).unwrap();
        c.recv().unwrap().unwrap();
    }
    // The consumer publishes its counts every 16 records and whenever it finds nothing.
    assert!(matches!(c.try_recv(), Err(shmflow::TryRecvError::Empty)));
    let out = shmflow(&["stat", &name, "--json", "--interval-ms", "50"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    for f in FIELDS {
        assert!(v.get(f).is_some(), "missing {f} in {v}");
    }
    assert_eq!(v["records_written"], 10);
    assert_eq!(v["bytes_read"], 80);
    assert_eq!(v["region"], name.as_str());
    assert_eq!(v["backpressureLevel"], "OK");
    assert_eq!(v["producer_pid"], std::process::id());
    // stat did not attach anything.
    assert_eq!(
        (v["producer_state"].as_u64(), v["consumer_state"].as_u64()),
        (Some(1), Some(1))
    );
}

#[test]
fn list_shows_live_regions_with_geometry_and_ends() {
    let name = unique_name("cli-list");
    let _p = Producer::create(
        &name,
        Geometry {
            segment_size: 8192,
            segment_count: 3,
        },
    )
    .unwrap();
    let out = shmflow(&["list"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(&name))
        .unwrap_or_else(|| panic!("{name} not listed:\n{text}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&cols[1..3], ["8192", "3"], "{line}");
    assert!(
        line.contains(&format!("pid {}", std::process::id())),
        "{line}"
    );
}

/// A file in /dev/shm that is removed when dropped, even if an assertion fails first.
struct RawRegion(String);

impl Drop for RawRegion {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(format!("/dev/shm{}", self.0));
    }
}

impl std::ops::Deref for RawRegion {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

fn raw_region(tag: &str, bytes: &[u8]) -> RawRegion {
    let name = unique_name(tag);
    let path = format!("/dev/shm{name}");
    let f = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&path)
        .unwrap();
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .unwrap();
    f.write_all_at(bytes, 0).unwrap();
    RawRegion(name)
}

#[test]
fn stat_fails_clearly_on_regions_that_are_not_right() {
    // Not shmflow's.
    let name = raw_region("cli-garbage", &[7u8; 8192]);
    let out = shmflow(&["stat", &name, "--json"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not a shmflow region") && err.contains(&*name),
        "{err}"
    );
    drop(name);
    // Truncated: a real header, then cut short.
    let good = unique_name("cli-trunc");
    let p = Producer::create(&good, Geometry::default()).unwrap();
    let header = std::fs::read(format!("/dev/shm{good}")).unwrap()[..4096].to_vec();
    drop(p);
    let name = raw_region("cli-trunc2", &header);
    let out = shmflow(&["stat", &name]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("truncated") || err.contains("bytes but its header"),
        "{err}"
    );
    drop(name);
    // Another layout version.
    let mut v2 = header.clone();
    let other = shmflow::LAYOUT_VERSION + 1;
    v2[8..12].copy_from_slice(&other.to_le_bytes());
    let name = raw_region("cli-version", &v2);
    let out = shmflow(&["stat", &name]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("layout version {other}")), "{err}");
    drop(name);
    // Missing.
    let out = shmflow(&["stat", "/shmflow-test-does-not-exist"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
}

#[test]
fn bench_quick_json_has_every_measure_and_ratio() {
    let out = shmflow(&["bench", "--quick", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    for k in [
        "rtt_spin_p50_ns",
        "rtt_spin_p99_ns",
        "rtt_spin_p999_ns",
        "floor_spin_p50_ns",
        "rtt_block_p50_ns",
        "rtt_block_p99_ns",
        "floor_futex_p50_ns",
        "uds_rtt_p50_ns",
        "pipe_rtt_p50_ns",
        "rtt_same_cpu_p50_ns",
        "small_rps",
        "small_batch_rps",
        "plain_rps",
        "floor_small_rps",
        "uds_batched_rps",
        "pipe_batched_rps",
        "bulk_gbps",
        "floor_bulk_gbps",
        "small_tiny_pool_rps",
        "rtt_sync_park_p50_ns",
        "rtt_async_current_p50_ns",
        "rtt_async_multi_p50_ns",
        "rtt_async_bridge_p50_ns",
        "rtt_async_multi_bridge_p50_ns",
        "tokio_uds_rtt_p50_ns",
        "sync_plain_rps",
        "async_rps",
        "async_drain_rps",
        "remote_rtt_p50_ns",
        "tcp_pingpong_rtt_p50_ns",
        "remote_small_rps",
        "tcp_64k_rps64",
        "tcp_framed_rps64",
        "tcp_framed_cpu_s_per_gb",
        "remote_bulk_gbps",
        "tcp_64k_gbps",
        "rtt_sync_block_p50_ns",
        "rtt_async_block_p50_ns",
        "direct_rtt_p50_ns",
        "direct_rtt_park_p50_ns",
        "tcp_two_conn_rtt_p50_ns",
        "direct_small_rps",
        "direct_small_timeout_1ms_rps",
        "direct_small_every_record_rps",
        "direct_bulk_gbps",
        "direct_bulk_send_gbps",
        "tcp_64k_cpu_s_per_gb",
        "remote_bulk_cpu_s_per_gb",
        "direct_bulk_cpu_s_per_gb",
        "remote_small_cpu_s_per_gb",
        "direct_small_cpu_s_per_gb",
        "direct_small_64k_seg_rps",
        "direct_small_64k_seg_cpu_s_per_gb",
        "remote_small_batch_rps",
        "remote_small_batch_cpu_s_per_gb",
        "direct_small_batch_rps",
        "direct_small_batch_cpu_s_per_gb",
        "remote_bulk_send_gbps",
        "remote_bulk_send_cpu_s_per_gb",
    ] {
        let x = v[k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} missing in {v}"));
        assert!(x > 0.0 && x.is_finite(), "{k} = {x}");
    }
    assert!(v["machine"]["cores"].as_u64().unwrap() >= 1);
    // Every ratio has its key; those of the delayed-link group, which runs only when named,
    // are null.
    let ratios = v["ratios"].as_object().unwrap();
    assert_eq!(ratios.len(), 50);
    for (k, r) in ratios {
        assert_eq!(r.is_null(), k.starts_with("netem"), "{k}: {r}");
    }
    assert!(
        v["ratios"]["async_rtt_doorbell_vs_bridge"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(v["ratios"]["remote_small_vs_tcp_64k"].as_f64().unwrap() > 0.0);
    assert!(v["ratios"]["plain_vs_small"].as_f64().unwrap() > 0.0);
    assert!(v["ratios"]["async_vs_sync_plain"].as_f64().unwrap() > 0.0);
    assert!(v["ratios"]["direct_bulk_vs_tcp_64k"].as_f64().unwrap() > 0.0);
    assert!(
        v["ratios"]["async_rtt_block_vs_tokio_uds"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert_eq!(v["pairs"].as_u64(), Some(2));
}

#[test]
fn bench_pairs_report_a_median_and_a_spread_per_measure_and_ratio() {
    let out = shmflow(&[
        "bench", "--quick", "--json", "--only", "small", "--pairs", "3",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["pairs"].as_u64(), Some(3));
    for k in [
        "small_rps",
        "ratios/small_vs_floor",
        "ratios/plain_vs_small",
    ] {
        let (mid, key) = match k.strip_prefix("ratios/") {
            Some(r) => (v["ratios"][r].as_f64().unwrap(), r),
            None => (v[k].as_f64().unwrap(), k),
        };
        let spread = v["spread"][key].as_array().unwrap();
        let (lo, hi) = (spread[0].as_f64().unwrap(), spread[1].as_f64().unwrap());
        assert!(
            lo > 0.0 && lo <= mid && mid <= hi,
            "{k}: {lo} <= {mid} <= {hi}"
        );
    }
    // Each of the group's ratios from 3 pairs of adjacent trials; only the group's ratios.
    for r in [
        "small_vs_floor",
        "small_batch_vs_floor",
        "plain_vs_small",
        "small_vs_uds_batched",
    ] {
        assert_eq!(v["ratio_pairs"][r].as_u64(), Some(3), "{r}");
    }
    assert!(v["ratios"]["bulk_vs_floor"].is_null());
    assert_eq!(v["ratio_pairs"]["bulk_vs_floor"].as_u64(), Some(0));
    // Baselines that moved more than 2x between pairs, each with its ratios.
    for m in v["moved_baselines"].as_array().unwrap() {
        assert!(m["moved"].as_f64().unwrap() > 2.0, "{m}");
        assert!(!m["ratios"].as_array().unwrap().is_empty(), "{m}");
    }
}

#[test]
fn bench_open_loop_reports_every_case_as_a_table_json_and_a_plot() {
    let dir = std::env::temp_dir().join(format!("shmflow-ol-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("ol.svg");
    let out = shmflow(&[
        "bench",
        "--open-loop",
        "--quick",
        "--json",
        "--lengths",
        "32,1344",
        "--rates",
        "20000,4000000",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let runs = v["runs"].as_array().unwrap();
    // 2 lengths x 2 rates x 4 transports.
    assert_eq!(runs.len(), 16);
    for r in runs {
        let lat = &r["latency"];
        let mut last = 0;
        for k in [
            "p50_ns",
            "p90_ns",
            "p99_ns",
            "p99.9_ns",
            "p99.99_ns",
            "max_ns",
        ] {
            let x = lat[k]
                .as_u64()
                .unwrap_or_else(|| panic!("{k} missing in {r}"));
            assert!(x >= last, "percentiles rise: {r}");
            last = x;
        }
        assert!(r["count"].as_u64().unwrap() > 0, "{r}");
        assert!(r["sustained"].is_boolean());
    }
    // 4 M messages/s of 1344 B (5.4 GB/s) through a pipe cannot be kept up on any machine
    // this runs on: it must be reported as not sustained, with the rate it reached.
    let pipe = runs
        .iter()
        .find(|r| r["transport"] == "pipe" && r["length"] == 1344 && r["rate"] == 4_000_000)
        .unwrap();
    assert_eq!(pipe["sustained"], false, "{pipe}");
    assert!(pipe["achieved_rate"].as_f64().unwrap() < 4e6, "{pipe}");
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.contains("shmflow-default") && plot.contains("pipe"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn stat_and_list_show_gates_and_flag_skew() {
    use shmflow::{Gate, GateGeometry};
    let name = unique_name("cli-gate");
    let gg = GateGeometry::new(3)
        .with_exclusive(2)
        .with_floating(4)
        .with_segment_size(4096);
    let mut gate = Gate::create(&name, gg).unwrap();
    let mut hot = Producer::open_channel(&name, 0).unwrap();
    let _cold: Vec<Producer> = (1..3)
        .map(|c| Producer::open_channel(&name, c).unwrap())
        .collect();
    // The hot channel fills its segments and asks; the gate lends it a floating segment at
    // least once every QUANTUM + 1 receives (which read a few records and free nothing),
    // until none is left.
    for _ in 0..20 {
        while hot.try_send(&[0u8; 100]).is_ok() {}
        for _ in 0..=shmflow::tuning::QUANTUM {
            let _ = gate.try_recv();
        }
        if gate.floating_free() == 0 {
            while hot.try_send(&[0u8; 100]).is_ok() {}
            break;
        }
    }
    assert_eq!(gate.floating_free(), 0);
    let out = shmflow(&["stat", &name, "--json", "--interval-ms", "50"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kind"], "gate");
    assert_eq!(v["channels"], 3);
    assert_eq!(v["floating_free"], 0);
    assert_eq!(v["likelySkew"], true, "{v}");
    assert!(v["inputFloatingBuffersUsage"].as_f64().unwrap() > 0.99);
    let chans = v["channel_stats"].as_array().unwrap();
    assert_eq!(chans.len(), 3);
    assert_eq!(chans[0]["floating_held"], 4);
    assert_eq!(chans[0]["exclusive_in_use"], 2);
    assert_eq!(chans[1]["exclusive_in_use"], 0);
    assert_eq!(chans[0]["producer_alive"], true);
    for f in FIELDS.iter().filter(|f| **f != "region") {
        assert!(chans[0].get(*f).is_some(), "channel field {f} missing");
    }
    let out = shmflow(&["stat", &name, "--count", "1", "--interval-ms", "50"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("LIKELY SKEW") && text.contains("inputFloatingBuffersUsage 1.00"),
        "{text}"
    );
    let out = shmflow(&["list"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&name) && text.contains("gate: 3 channels × 2 exclusive + 4 floating"),
        "{text}"
    );
    // A gate is not a channel, and the other way round, by name.
    assert!(matches!(
        shmflow::monitor::Monitor::open(&name),
        Err(shmflow::OpenError::BadMagic { .. })
    ));
}

#[test]
fn stat_shows_a_gates_checkpoints() {
    use shmflow::{Alignment, Gate, GateGeometry};
    let name = unique_name("cli-ckpt");
    let gg = GateGeometry::new(2)
        .with_exclusive(4)
        .with_segment_size(4096);
    let mut gate = Gate::create(&name, gg).unwrap();
    let mut a = Producer::open_channel(&name, 0).unwrap();
    let mut b = Producer::open_channel(&name, 1).unwrap();
    let out = shmflow(&["stat", &name, "--count", "1", "--interval-ms", "50"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("checkpoints: none yet"));
    a.send_barrier(7, Alignment::Aligned, b"").unwrap();
    a.send(b"held back").unwrap();
    a.flush().unwrap();
    b.send(b"before").unwrap();
    b.send_barrier(7, Alignment::Aligned, b"").unwrap();
    let mut released = false;
    while let Ok(Some(m)) = gate.try_recv() {
        released |= matches!(m, shmflow::GateMessage::Barrier { id: 7, .. });
    }
    assert!(released);
    let out = shmflow(&["stat", &name, "--json", "--interval-ms", "50"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let k = &v["checkpoints"];
    assert_eq!(k["released"], 1, "{v}");
    assert_eq!(k["last_id"], 7);
    assert_eq!(k["last_released"], "aligned");
    assert!(k["checkpointAlignmentTime"].as_u64().is_some());
    assert!(k["checkpointStartDelayNanos"].as_u64().unwrap() > 0);
    assert_eq!(k["last_held_records"], 1, "{v}");
    assert_eq!(v["channel_stats"][0]["held_bytes"], 9, "{v}");
    assert!(
        v["channel_stats"][0]["held_ns"].as_u64().unwrap() > 0,
        "{v}"
    );
    assert!(
        v["channel_stats"][1]["barrier_delay_ns"].as_u64().unwrap() > 0,
        "{v}"
    );
    // Channel 0 was held until channel 1's barrier came, which released it at once.
    let held = |c: usize| v["channel_stats"][c]["held_ns"].as_u64().unwrap();
    assert!(held(0) > held(1), "{v}");
    let out = shmflow(&["stat", &name, "--count", "1", "--interval-ms", "50"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("checkpoints: 1 released, 0 cancelled; last #7 aligned")
            && text.contains("checkpointStartDelayNanos")
            && text.contains("held back 1 records / 9 B")
            && text.contains("held(last)  delay(last)  in flight"),
        "{text}"
    );
    println!("{text}");
}

#[test]
fn list_shows_objects_being_created_without_waiting() {
    let name = common::unique_name("cli-empty");
    let path = format!("/dev/shm{name}");
    std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&path)
        .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let start = std::time::Instant::now();
    let out = shmflow(&["list"]);
    let took = start.elapsed();
    std::fs::remove_file(&path).unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with(&name))
        .unwrap_or_else(|| panic!("{name} not listed:\n{text}"));
    assert!(line.contains("empty"), "{line}");
    println!("shmflow list with an empty object took {took:?}");
}

#[test]
fn every_subcommand_has_help_and_bad_arguments_are_usage_errors() {
    for sub in [
        &["--help"][..],
        &["list", "--help"],
        &["clean", "--help"],
        &["stat", "--help"],
        &["bench", "--help"],
        &["demo", "--help"],
        &["demo", "backpressure", "--help"],
    ] {
        let out = shmflow(sub);
        assert!(out.status.success(), "{sub:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Usage:"), "{sub:?}: {text}");
    }
    // clap's errors: exit code 2 and a usage line on stderr.
    for bad in [
        &["stat"][..],
        &["frobnicate"],
        &["bench", "--only", "nothing"],
    ] {
        let out = shmflow(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("error:") && err.contains("--help"),
            "{bad:?}: {err}"
        );
    }
}

/// Waits up to 5 s for the orphan `pid` (`what`, whose parent `parent` was killed) to end;
/// kills it and fails if it runs on.
fn gone_within_5s(pid: i32, what: &str, parent: &str) {
    let gone_by = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
        if std::time::Instant::now() > gone_by {
            // SAFETY: kill on the orphan named by the caller, so that it does not spin on.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{what} {pid} still ran 5 s after {parent} was killed");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The processes whose parent is `parent` and whose command line holds `part`.
fn children_running(parent: u32, part: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let (Ok(stat), Ok(cmd)) = (
            std::fs::read_to_string(e.path().join("stat")),
            std::fs::read(e.path().join("cmdline")),
        ) else {
            continue;
        };
        // The parent is the second field after the command's closing parenthesis.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if ppid == Some(parent) && cmd.contains(part) {
            found.push(pid);
        }
    }
    found
}

#[test]
fn bench_case_sets_its_round_trips_beside_the_floors_in_pairs() {
    let out = shmflow(&[
        "bench", "--case", "--quick", "--json", "--len", "100", "--rate", "20000", "--pairs", "3",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    // --quick at 20 000 a second: 6 000 round trips of each side, over 3 pairs of trials.
    let case = &v["round_trip_ns"];
    let floor = &v["floor_round_trip_ns"];
    for (name, t) in [("case", case), ("floor", floor)] {
        assert_eq!(t["count"].as_u64(), Some(6000), "{name}: {t}");
        let q: Vec<u64> = ["p50", "p99", "p999", "max"]
            .iter()
            .map(|k| t[k].as_u64().unwrap())
            .collect();
        assert!(
            q[0] > 0 && q.windows(2).all(|w| w[0] <= w[1]),
            "{name}: {t}"
        );
    }
    // Those before which no pause was seen are some of them, with percentiles of their own.
    for (all, clean) in [
        (case, &v["round_trip_no_pause_seen_ns"]),
        (floor, &v["floor_round_trip_no_pause_seen_ns"]),
    ] {
        let n = clean["count"].as_u64().unwrap();
        assert!(n > 0 && n <= 6000, "{clean}");
        assert!(
            clean["max"].as_u64() <= all["max"].as_u64(),
            "{clean} {all}"
        );
    }
    // Counted from the time it was due, each round trip is at least as long as from its
    // send, so every quantile is too.
    for (all, due) in [
        (case, &v["round_trip_from_schedule_ns"]),
        (floor, &v["floor_round_trip_from_schedule_ns"]),
    ] {
        assert_eq!(due["count"].as_u64(), Some(6000), "{due}");
        for q in ["p50", "p99", "p999", "max"] {
            assert!(due[q].as_u64() >= all[q].as_u64(), "{q}: {due} {all}");
        }
    }
    // A median with its spread: (median, min, max).
    let spread = |s: &serde_json::Value| {
        let f = |k: &str| s[k].as_f64().unwrap();
        (f("median"), f("min"), f("max"))
    };
    let vs = &v["round_trip_vs_floor"];
    assert_eq!(vs["pairs"].as_u64(), Some(3));
    for q in ["p50", "p99"] {
        let (mid, lo, hi) = spread(&vs[q]);
        assert!(lo > 0.0 && lo <= mid && mid <= hi, "{q}: {vs}");
    }
    // Each trial's own p99 over its own p50: at least 1 in every trial.
    let tail = &v["p99_over_p50_per_trial"];
    assert_eq!(tail["trials"].as_u64(), Some(3));
    for side in [
        "round_trip",
        "floor",
        "round_trip_from_schedule",
        "floor_from_schedule",
    ] {
        let (mid, lo, hi) = spread(&tail[side]);
        assert!(1.0 <= lo && lo <= mid && mid <= hi, "{side}: {tail}");
    }
    // And each trial's, whose spread that is.
    for (side, each) in [("round_trip", "round_trip_each"), ("floor", "floor_each")] {
        let each: Vec<f64> = tail[each]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_f64().unwrap())
            .collect();
        assert_eq!(each.len(), 3, "{tail}");
        let (_, lo, hi) = spread(&tail[side]);
        let (min, max) = each
            .iter()
            .fold((f64::MAX, 0.0f64), |(a, b), &r| (a.min(r), b.max(r)));
        assert!(min == lo && max == hi, "{side}: {tail}");
    }
    // The per-pair ratios are of the same trials as the pooled figures: the ratio of the
    // pooled p50s (which a few slow round trips hardly move) is near their spread.
    let p50 = &vs["p50"];
    let pooled = case["p50"].as_f64().unwrap() / floor["p50"].as_f64().unwrap();
    assert!(
        p50["min"].as_f64().unwrap() / 1.5 <= pooled
            && pooled <= p50["max"].as_f64().unwrap() * 1.5,
        "pooled p50 ratio {pooled} far from {vs}"
    );
    for (pairs, says) in [("0", "--pairs 0"), ("7000", "--pairs 7000: at most 6000")] {
        let out = shmflow(&[
            "bench", "--case", "--quick", "--rate", "20000", "--pairs", pairs,
        ]);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{err}");
    }
}

#[test]
fn the_floors_peer_ends_when_the_bench_is_killed() {
    let mut bench = Command::new(env!("CARGO_BIN_EXE_shmflow"))
        .args(["bench", "--case", "--quick", "--rate", "500"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let peer = loop {
        if let Some(&pid) = children_running(bench.id(), "case-floor").first() {
            break pid;
        }
        assert!(std::time::Instant::now() < deadline, "no case-floor came");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    bench.kill().unwrap();
    bench.wait().unwrap();
    // The orphan sees its parent gone within a look (every 16 384 spins) and ends.
    gone_within_5s(peer, "the floor's peer", "its bench");
}

/// `Cpus_allowed_list` of process (or thread) `pid`, as /proc gives it (`0-1`, `3`).
fn cpus_allowed(pid: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string()
}

/// A child process killed when dropped (a failed assertion leaves nothing running).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn bench_case_pins_the_sender_and_each_receiving_process_where_told() {
    // Two CPUs this test may run on.
    let mine = cpus_allowed("self");
    let first = mine.split([',', '-']).next().unwrap().to_string();
    let last = mine.rsplit([',', '-']).next().unwrap().to_string();
    if first == last {
        eprintln!(
            "skipped: this test may run on one CPU only ({mine}), and a pin there changes nothing"
        );
        return;
    }
    let pin = format!("{first},{last}");
    let mut bench = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_shmflow"))
            .args(["bench", "--case", "--quick", "--rate", "500", "--pin", &pin])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // The case's echo, the floor's peer, the open loop's receiver: each started on the
    // receiver's CPU.
    for role in ["case-echo", "case-floor", "case-sink"] {
        let peer = loop {
            if let Some(&pid) = children_running(bench.0.id(), role).first() {
                break pid;
            }
            if let Some(status) = bench.0.try_wait().unwrap() {
                let mut err = String::new();
                std::io::Read::read_to_string(&mut bench.0.stderr.take().unwrap(), &mut err)
                    .unwrap();
                panic!("the bench ended ({status}) before a {role} came: {err}");
            }
            assert!(std::time::Instant::now() < deadline, "no {role} came");
            std::thread::sleep(std::time::Duration::from_millis(2));
        };
        assert_eq!(cpus_allowed(&peer.to_string()), last, "{role}");
    }
    // The thread that runs the trials, the bench's main one, on the sender's.
    assert_eq!(cpus_allowed(&bench.0.id().to_string()), first);
    drop(bench);
    for (pin, says) in [
        ("0".to_string(), "SENDER,RECEIVER".to_string()),
        ("0,x".to_string(), "\"x\" is not a CPU number".to_string()),
        (
            format!("{first},1023"),
            "may not run on CPU 1023".to_string(),
        ),
    ] {
        let out = shmflow(&["bench", "--case", "--quick", "--pin", &pin]);
        assert_eq!(out.status.code(), Some(1), "{pin}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&says), "{pin}: {err}");
    }
}

#[test]
fn a_bench_whose_measuring_peer_is_killed_says_so_and_leaves_no_process_behind() {
    // The small group's pipe and socket baselines stream into a sink process; killed from
    // outside, its writer fails in the trial's loop (or, killed as the loop ended, the bench
    // finds it dead when it waits for its report).
    let stderr = std::env::temp_dir().join(format!("shmflow-killed-peer-{}", std::process::id()));
    let mut bench = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_shmflow"))
            .args(["bench", "--only", "small", "--pairs", "50"])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap(),
    );
    let pid = bench.0.id();
    let read_err = || std::fs::read_to_string(&stderr).unwrap_or_default();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    // The bench's processes when the sink was killed.
    let alive = loop {
        if let Some(&sink) = children_running(pid, "fd-sink").first() {
            let alive = children_running(pid, "");
            // SAFETY: kill on a child of the bench; should it have ended meanwhile (ESRCH),
            // the next trial's sink is waited for.
            if unsafe { libc::kill(sink, libc::SIGKILL) } == 0 {
                break alive;
            }
        }
        if let Some(status) = bench.0.try_wait().unwrap() {
            panic!(
                "the bench ended ({status}) before its sink came: {}",
                read_err()
            );
        }
        assert!(std::time::Instant::now() < deadline, "no sink came");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = bench.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the bench ran on for 30 s after its sink was killed"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    // Every measuring process it had is gone (it waited for them).
    for child in alive {
        assert!(
            !std::path::Path::new(&format!("/proc/{child}")).exists(),
            "process {child} of the bench is still there: {}",
            read_err()
        );
    }
    let err = read_err();
    let _ = std::fs::remove_file(&stderr);
    // The bench ends as on any failure of its own (exit 1, its message), not with a panic's
    // unwinding (101) that would leave peers running.
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("shmflow bench: a trial panicked (above); its peers are stopped")
            || err.contains("shmflow bench: the measuring peer process failed (signal: 9"),
        "{err}"
    );
}

#[test]
fn the_floors_peer_ends_when_its_parent_was_gone_before_it_looked() {
    // The peer started by hand, told a parent that is not its own (as if the bench that
    // started it had died before the peer first looked): it ends at its first look.
    // SAFETY: memfd_create with a valid name; checked.
    let fd = unsafe { libc::memfd_create(c"floor".as_ptr(), 0) };
    assert!(fd >= 0);
    // SAFETY: the fresh descriptor, owned here (and inherited by the child: no CLOEXEC).
    let f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    f.set_len(4096).unwrap();
    let mut peer = Command::new(env!("CARGO_BIN_EXE_shmflow"))
        .args(["__bench-role", "case-floor", "64"])
        .env("RAW", fd.to_string())
        .env("SHMFLOW_BENCH_PARENT", "1")
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while peer.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            peer.kill().unwrap();
            panic!("the floor's peer ran on for 5 s with its parent gone");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    drop(f);
}

#[test]
fn the_raw_ring_counts_its_records_and_refuses_bad_arguments() {
    let out = Command::new(env!("CARGO_BIN_EXE_shmflow-raw-ring"))
        .args(["stream", "524288", "64", "0.05"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let nums: Vec<u64> = text
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(nums.len(), 2, "{text:?}");
    assert!(nums[0] > 1000 && nums[1] > 0, "{text:?}");
    for bad in [
        &["stream", "524288", "4", "1"][..],
        &["stream", "524288", "65537", "1"],
        &["stream", "524288", "64", "0"],
        &["stream", "524288", "64", "nan"],
        &["stream", "524288", "64", "inf"],
        &["stream", "524288", "64", "-1"],
        &["stream", "1000000000000000000000000000000", "64", "1"],
        &["stream", "30000000", "64", "1"],
        &["stream", "524288", "64.5", "1"],
        &["stream", "x", "64", "1"],
        &["stream"],
        &["sink", "4", "64"],
        &[],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_shmflow-raw-ring"))
            .args(bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{bad:?}: {err}");
        assert!(err.starts_with("shmflow-raw-ring: "), "{bad:?}: {err}");
    }
}

/// `shmflow bench` runs the raw ring only if it was built from the same sources: one left
/// beside it by an older build is refused, with the command that builds both.
#[test]
fn a_raw_ring_built_from_other_sources_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_shmflow-raw-ring"))
        .arg("source")
        .output()
        .unwrap();
    let ours = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        ours.len() == 16 && ours.chars().all(|c| c.is_ascii_hexdigit()),
        "{ours:?}"
    );
    // This program beside a ring that says it was built from other sources.
    let dir = std::env::temp_dir().join(format!("shmflow-stale-ring-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bench = dir.join("shmflow");
    std::fs::copy(env!("CARGO_BIN_EXE_shmflow"), &bench).unwrap();
    let ring = dir.join("shmflow-raw-ring");
    std::fs::write(&ring, "#!/bin/sh\necho 0123456789abcdef\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ring, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(&bench)
        .args(["bench", "--quick", "--only", "small", "--pairs", "1"])
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("built from other sources")
            && err.contains("0123456789abcdef")
            && err.contains(&ours)
            && err.contains("cargo build --release -p shmflow-cli"),
        "{err}"
    );
}

#[test]
fn the_raw_rings_reader_ends_when_its_writer_is_killed() {
    let mut writer = Command::new(env!("CARGO_BIN_EXE_shmflow-raw-ring"))
        .args(["stream", "524288", "64", "30"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let reader = loop {
        if let Some(&pid) = children_running(writer.id(), "sink").first() {
            break pid;
        }
        assert!(std::time::Instant::now() < deadline, "no reader came");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    writer.kill().unwrap();
    writer.wait().unwrap();
    gone_within_5s(reader, "the raw ring's reader", "its writer");
}

#[test]
fn the_raw_rings_reader_refuses_memory_smaller_than_its_ring() {
    // SAFETY: memfd_create with a valid name; checked.
    let fd = unsafe { libc::memfd_create(c"ring".as_ptr(), 0) };
    assert!(fd >= 0);
    // SAFETY: the fresh descriptor, owned here (and inherited by the child: no CLOEXEC).
    let f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    f.set_len(4096 + 65536).unwrap();
    for slots in ["4", "1", "449"] {
        let out = Command::new(env!("CARGO_BIN_EXE_shmflow-raw-ring"))
            .args(["sink", slots, "64"])
            .env("SHMFLOW_RAW_RING_FD", fd.to_string())
            .env("SHMFLOW_RAW_RING_PARENT", std::process::id().to_string())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{slots}: {err}");
        assert!(
            err.contains("the ring's memory is") || err.contains("a ring has 2 to 448 slots"),
            "{slots}: {err}"
        );
    }
    drop(f);
}

#[test]
fn the_raw_rings_reader_ends_when_its_writer_was_gone_before_it_looked() {
    // SAFETY: memfd_create with a valid name; checked.
    let fd = unsafe { libc::memfd_create(c"ring".as_ptr(), 0) };
    assert!(fd >= 0);
    // SAFETY: the fresh descriptor, owned here (and inherited by the child: no CLOEXEC).
    let f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    f.set_len(4096 + 2 * 65536).unwrap();
    let mut reader = Command::new(env!("CARGO_BIN_EXE_shmflow-raw-ring"))
        .args(["sink", "2", "64"])
        .env("SHMFLOW_RAW_RING_FD", fd.to_string())
        .env("SHMFLOW_RAW_RING_PARENT", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while reader.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            reader.kill().unwrap();
            panic!("the raw ring's reader ran on for 5 s with its writer gone");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let out = reader.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the writer is gone"));
    drop(f);
}

#[test]
fn bench_reports_a_peer_it_cannot_start_as_an_error_not_a_panic() {
    // The program's file removed once it runs: the peers it starts for each trial (by
    // re-executing itself) cannot be started any more.
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("shmflow-gone-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("shmflow");
    std::fs::copy(env!("CARGO_BIN_EXE_shmflow"), &exe).unwrap();
    // A file just written can be busy for a moment (another test's fork held it open for
    // writing until its exec): tried again then.
    let mut tries = 0;
    let bench = loop {
        match Command::new(&exe)
            .args(["bench", "--case", "--quick", "--rate", "500"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
        {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => break r.unwrap(),
        }
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    std::fs::remove_dir_all(&dir).unwrap();
    let out = bench.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("could not be started"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_bench_that_fails_leaves_no_peer_running_and_no_namespace() {
    // The delayed link's two peers run at once; the receiver killed from outside, the bench
    // ends with exit 1 and takes the sender with it (and, as root with netem, the network
    // namespaces it made).
    let bench = Command::new(env!("CARGO_BIN_EXE_shmflow"))
        .args(["bench", "--only", "netem", "--quick"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let id = bench.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let (recv, send) = loop {
        let (r, s) = (
            children_running(id, "netem-recv"),
            children_running(id, "netem-send"),
        );
        if let (Some(&r), Some(&s)) = (r.first(), s.first()) {
            break (r, s);
        }
        assert!(std::time::Instant::now() < deadline, "no netem peers came");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    // SAFETY: kill on a child of our child, found just now.
    assert_eq!(unsafe { libc::kill(recv, libc::SIGKILL) }, 0);
    let out = bench.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("the measuring peer process failed"), "{err}");
    // The sender was killed and waited for by the bench: gone, not even a zombie.
    let sender_left = std::path::Path::new(&format!("/proc/{send}")).exists();
    if sender_left {
        // SAFETY: the orphan found above, so that it does not run on.
        unsafe { libc::kill(send, libc::SIGKILL) };
    }
    assert!(!sender_left, "the sender {send} outlived its bench");
    if let Ok(list) = Command::new("ip").args(["netns", "list"]).output() {
        let list = String::from_utf8_lossy(&list.stdout);
        assert!(!list.contains(&format!("shmflow-bench-a{id}")), "{list}");
    }
}

#[test]
fn bench_case_reports_a_killed_peer_as_an_error_not_a_panic() {
    // Each peer of the case killed in its turn: the round trips' echo, the floor's, then the
    // open loop's receiver (the round trips at 500/s take ~4 s, so the receiver comes after
    // them).
    for peer in ["case-echo", "case-floor", "case-sink"] {
        let bench = Command::new(env!("CARGO_BIN_EXE_shmflow"))
            .args(["bench", "--case", "--quick", "--rate", "500"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let victim = loop {
            if let Some(&pid) = children_running(bench.id(), peer).first() {
                break pid;
            }
            assert!(std::time::Instant::now() < deadline, "no {peer} came");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        // SAFETY: kill on a child of our child, found just now.
        assert_eq!(unsafe { libc::kill(victim, libc::SIGKILL) }, 0);
        // Bounded: a bench that waits for its dead peer fails the test instead of hanging it.
        let mut bench = bench;
        while bench.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline + std::time::Duration::from_secs(30) {
                bench.kill().unwrap();
                panic!("the bench went on waiting after its {peer} was killed");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let out = bench.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{peer}: {err}");
        assert!(err.starts_with("shmflow: "), "{peer}: {err}");
        assert!(!err.contains("panicked"), "{peer}: {err}");
    }
}

#[test]
fn clean_removes_a_region_no_live_end_uses_and_keeps_a_live_one() {
    // A stale region: a real region's bytes (its producer recorded as attached) in a named
    // object that no live process holds a liveness lock on.
    let image = common::region_image();
    let stale = unique_name("cli-stale");
    let f = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(format!("/dev/shm{stale}"))
        .unwrap();
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .unwrap();
    f.write_all_at(&image, 0).unwrap();
    drop(f);
    let live = unique_name("cli-live");
    let _p = Producer::create(&live, Geometry::default()).unwrap();
    let out = shmflow(&["clean"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(&format!("removed {stale}")), "{text}");
    assert!(!text.contains(&format!("removed {live}")), "{text}");
    assert!(
        text.contains(&format!(
            "kept {live} (its producer (pid {}) is alive)",
            std::process::id()
        )),
        "{text}"
    );
    assert!(std::fs::metadata(format!("/dev/shm{stale}")).is_err());
    assert!(std::fs::metadata(format!("/dev/shm{live}")).is_ok());
    // A name that is not there is an error: exit 1, with the reason.
    let out = shmflow(&["clean", "/cli-no-such-region"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a shmflow region"));
}

#[test]
fn top_refuses_without_a_terminal() {
    let out = shmflow(&["top"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("terminal"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `shmflow stat NAME` every 100 ms while `leave` makes every end go, and returns what
/// it printed once it stopped by itself (fails if it does not within 20 s).
fn stat_until_it_stops(name: &str, leave: impl FnOnce()) -> String {
    use std::io::BufRead;
    let mut stat = Command::new(env!("CARGO_BIN_EXE_shmflow"))
        .args(["stat", name, "--interval-ms", "100"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The ends leave only once stat has opened the region and shown it.
    let mut out = std::io::BufReader::new(stat.stdout.take().unwrap());
    let mut text = String::new();
    out.read_line(&mut text).unwrap();
    assert!(text.contains("shmflow stat"), "{text}");
    leave();
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = stat.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > std::time::Duration::from_secs(20) {
            stat.kill().unwrap();
            panic!("stat went on after every end left");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    std::io::Read::read_to_string(&mut out, &mut text).unwrap();
    assert!(status.success(), "{text}");
    text
}

#[test]
fn stat_stops_once_a_gate_and_its_producers_have_left() {
    let name = unique_name("cli-gate-ends");
    let gate = shmflow::Gate::create(&name, shmflow::GateGeometry::new(2)).unwrap();
    let mut p = Producer::open_channel(&name, 0).unwrap();
    p.send(b"one").unwrap();
    let text = stat_until_it_stops(&name, move || {
        drop(p);
        drop(gate);
    });
    let last = text.rsplit("shmflow stat").next().unwrap();
    assert!(
        last.contains("the gate and every producer have left"),
        "{text}"
    );
}

#[test]
fn stat_stops_with_the_final_state_once_both_ends_have_left() {
    let name = unique_name("cli-ends");
    let mut p = Producer::create(&name, Geometry::default()).unwrap();
    let mut c = Consumer::open(&name).unwrap();
    p.send(b"one").unwrap();
    assert!(c.recv().unwrap().is_some());
    let text = stat_until_it_stops(&name, move || {
        drop(p);
        drop(c);
    });
    let last = text.rsplit("shmflow stat").next().unwrap();
    assert!(last.contains("both ends have left"), "{text}");
    assert!(
        last.contains("producer detached") && last.contains("consumer detached"),
        "{last}"
    );
    assert!(
        last.contains("records/s   written              —   read              —"),
        "no figures for ends that are not there: {last}"
    );
    assert!(last.contains("1 records written, 1 read"), "{last}");
}

#[test]
fn list_shows_an_ended_stream_nobody_read_and_clean_keeps_it_unless_asked() {
    let name = unique_name("cli-unread");
    let mut p = Producer::create(&name, Geometry::default()).unwrap();
    for i in 0..3u64 {
        p.send(&i.to_le_bytes()).unwrap();
    }
    drop(p);
    let out = shmflow(&["list"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with(&name))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("ended, 3 record(s) unread"), "{line}");
    // Only this test's region: other tests' (and the user's) are left alone.
    let out = shmflow(&["clean", &name]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains(&format!("kept {name} (ended, 3 record(s) unread")),
        "{text}"
    );
    assert!(std::fs::metadata(format!("/dev/shm{name}")).is_ok());
    let out = shmflow(&["clean", "--unread", &name]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("removed {name}")), "{text}");
    assert!(std::fs::metadata(format!("/dev/shm{name}")).is_err());
}

/// One `GET /metrics` over a plain TCP connection, asking for OpenMetrics as Prometheus
/// does: the body.
fn scrape(addr: &str) -> String {
    let (head, body) = get_metrics(addr, Some("application/openmetrics-text; version=1.0.0"));
    assert!(head.contains("openmetrics-text"), "{head}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    body
}

/// One `GET /metrics` with `accept` as the `Accept` header (none: as curl): the head and the
/// body.
fn get_metrics(addr: &str, accept: Option<&str>) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let accept = accept.map_or_else(String::new, |a| format!("Accept: {a}\r\n"));
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n{accept}\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "{head}"
    );
    (head.to_owned(), body.to_owned())
}

/// The value of `metric{region="name"...}` in a scrape.
/// Starts `shmflow export` on a free loopback port with `extra` arguments; returns it and
/// the address it serves.
fn start_export(extra: &[&str]) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut export = Command::new(env!("CARGO_BIN_EXE_shmflow"))
        .args(["export", "--listen", "127.0.0.1:0"])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(export.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("serving http://")
        .and_then(|a| a.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("{line}"))
        .to_owned();
    (export, addr)
}

fn metric(body: &str, metric: &str, region: &str) -> f64 {
    let prefix = format!("{metric}{{region=\"{region}\"");
    body.lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in:\n{body}"))
}

#[test]
fn export_serves_flink_named_metrics_that_agree_with_stat_during_a_running_pipeline() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let name = unique_name("cli-export");
    let gate = unique_name("cli-export-gate");
    let mut p = Producer::create(&name, Geometry::default()).unwrap();
    let mut c = Consumer::open(&name).unwrap();
    let _g = shmflow::Gate::builder()
        .channels(2)
        .debloat_target(std::time::Duration::from_millis(100))
        .create(&gate)
        .unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let (s1, s2) = (stop.clone(), stop.clone());
    let writer = std::thread::spawn(move || {
        let mut i = 0u64;
        while !s1.load(Ordering::Relaxed) {
            p.send_pod(&i).unwrap();
            i += 1;
            if i.is_multiple_of(1000) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    });
    let reader = std::thread::spawn(move || {
        while !s2.load(Ordering::Relaxed) {
            let _ = c.recv_timeout(std::time::Duration::from_millis(10));
        }
    });
    let (mut export, addr) = start_export(&[]);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let first = scrape(&addr);
    let out = shmflow(&["stat", &name, "--json", "--interval-ms", "50"]);
    let stat: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    std::thread::sleep(std::time::Duration::from_millis(100));
    let second = scrape(&addr);
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    reader.join().unwrap();
    export.kill().unwrap();
    export.wait().unwrap();
    for (m, field) in [
        ("shmflow_numRecordsOut_total", "records_written"),
        ("shmflow_numRecordsIn_total", "records_read"),
        ("shmflow_numBytesOut_total", "bytes_written"),
    ] {
        let (a, b) = (metric(&first, m, &name), metric(&second, m, &name));
        let s = stat[field].as_f64().unwrap();
        assert!(a <= s && s <= b, "{m}: {a} <= stat's {field} {s} <= {b}");
        assert!(b > a, "{m} grows while the pipeline runs: {a} then {b}");
    }
    for m in [
        "shmflow_backPressuredTimeMsPerSecond",
        "shmflow_idleTimeMsPerSecond",
        "shmflow_busyTimeMsPerSecond",
    ] {
        let v = metric(&second, m, &name);
        assert!((0.0..=1000.5).contains(&v), "{m} = {v}");
    }
    for m in ["shmflow_outPoolUsage", "shmflow_inPoolUsage"] {
        let v = metric(&second, m, &name);
        assert!((0.0..=1.0).contains(&v), "{m} = {v}");
    }
    assert!(second.contains(&format!(
        "shmflow_endAttached{{region=\"{name}\",channel=\"\",end=\"producer\"}} 1"
    )));
    assert_eq!(
        metric(&second, "shmflow_inputFloatingBuffersUsage", &gate),
        0.0
    );
    assert!(second.contains(&format!(
        "shmflow_backlog{{region=\"{gate}\",channel=\"1\"}}"
    )));
    // The gate debloats: every segment, whole, until a rate is measured.
    assert_eq!(
        metric(&second, "shmflow_inFlightSegmentsLimit", &gate),
        f64::from(shmflow::GateGeometry::new(2).exclusive + shmflow::GateGeometry::new(2).floating)
    );
    assert_eq!(
        metric(&second, "shmflow_debloatedBufferSize", &gate),
        f64::from(shmflow::GateGeometry::new(2).segment_size)
    );
    assert!(!second.contains(&format!("shmflow_inFlightSegmentsLimit{{region=\"{name}\"")));
}

#[test]
fn stat_shows_buffer_debloating() {
    let name = unique_name("cli-debloat");
    let mut rx = Consumer::builder()
        .geometry(Geometry {
            segment_size: 4096,
            segment_count: 16,
        })
        .debloat_target(std::time::Duration::from_millis(20))
        .create(&name)
        .unwrap();
    let mut tx = Producer::open(&name).unwrap();
    let out = shmflow(&["stat", &name, "--count", "1", "--interval-ms", "50"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("debloating  target 20.0 ms")
            && text
                .contains("in-flight limit 16 segments × 4096 B (debloatedBufferSize) = 64.0 KiB"),
        "before a rate is measured the cap is every segment:\n{text}"
    );
    let writer = std::thread::spawn(move || {
        let rec = [1u8; 1000];
        while tx.send(&rec).is_ok() {}
    });
    // Read at about 2 MB/s (500 µs of work per 1000-byte record) for half a second: 20 ms of
    // that is about 40 KB, ten segments of 4 KiB.
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_millis(500) {
        drop(rx.recv().unwrap().expect("the writer streams"));
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_micros(500) {
            std::hint::spin_loop();
        }
    }
    let out = shmflow(&["stat", &name, "--json", "--interval-ms", "50"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = &v["debloat"];
    let cap = d["segment_cap"].as_u64().unwrap();
    assert!((2..16).contains(&cap), "{v}");
    assert_eq!(d["target_ns"], 20_000_000, "{v}");
    assert!(d["rate_bytes_per_s"].as_u64().unwrap() > 100_000, "{v}");
    assert_eq!(d["inFlightLimitBytes"], cap * 4096, "{v}");
    assert!(
        d["estimatedTimeToConsumeBuffersMs"].as_f64().is_some(),
        "{v}"
    );
    let out = shmflow(&["stat", &name, "--count", "1", "--interval-ms", "50"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("in-flight limit {cap} segments"))
            && text.contains("estimatedTimeToConsumeBuffersMs"),
        "{text}"
    );
    println!("{text}");
    drop(rx);
    writer.join().unwrap();
}

#[test]
fn stat_shows_a_gates_debloating_per_channel() {
    use shmflow::Gate;
    let name = unique_name("cli-gate-debloat");
    let _gate = Gate::builder()
        .channels(2)
        .segment_size(4096)
        .debloat_target(std::time::Duration::from_millis(50))
        .create(&name)
        .unwrap();
    let out = shmflow(&["stat", &name, "--count", "1", "--interval-ms", "50"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("debloating  target 50.0 ms") && text.contains("MB/s  cap  now"),
        "{text}"
    );
}

#[test]
fn export_rates_come_from_its_own_sampling_not_from_who_scrapes() {
    let name = unique_name("cli-export-sampled");
    let mut p = Producer::create(&name, Geometry::default()).unwrap();
    let mut c = Consumer::open(&name).unwrap();
    for i in 0..1000u64 {
        p.send_pod(&i).unwrap();
    }
    p.flush().unwrap();
    // One sample window (the first, 200 ms) and no other for a minute.
    let (mut export, addr) = start_export(&["--sample-ms", "60000"]);
    // Two scrapers in a row, with records read between: the same rates, live counters.
    let first = scrape(&addr);
    while c.try_recv().ok().flatten().is_some() {}
    let second = scrape(&addr);
    export.kill().unwrap();
    export.wait().unwrap();
    for m in [
        "shmflow_backPressuredTimeMsPerSecond",
        "shmflow_idleTimeMsPerSecond",
    ] {
        assert_eq!(metric(&first, m, &name), metric(&second, m, &name), "{m}");
    }
    assert_eq!(metric(&first, "shmflow_numRecordsIn_total", &name), 0.0);
    assert_eq!(metric(&second, "shmflow_numRecordsIn_total", &name), 1000.0);
}

#[test]
fn export_backlog_is_the_queue_now_and_promtool_finds_only_flinks_camel_case() {
    let name = unique_name("cli-export-backlog");
    let g = Geometry {
        segment_size: 4096,
        segment_count: 8,
    };
    let mut p = Producer::create(&name, g).unwrap();
    let mut c = Consumer::open(&name).unwrap();
    // Three segments' worth published, none read.
    for _ in 0..12 {
        p.send(&[1u8; 1000]).unwrap();
    }
    p.flush().unwrap();
    let (mut export, addr) = start_export(&[]);
    let queued = metric(&scrape(&addr), "shmflow_backlog", &name);
    assert!(queued >= 2.0, "segments queued: {queued}");
    while c.try_recv().ok().flatten().is_some() {}
    let (head, text) = get_metrics(&addr, None);
    export.kill().unwrap();
    export.wait().unwrap();
    assert_eq!(
        metric(&text, "shmflow_backlog", &name),
        0.0,
        "read: the queue is empty"
    );
    // Without an `Accept` for OpenMetrics: the classic text format.
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    assert!(!text.contains("# EOF"), "{text}");
    assert!(
        text.contains("# TYPE shmflow_numRecordsIn_total counter"),
        "{text}"
    );
    // promtool (from Prometheus) finds nothing but the camelCase of Flink's names.
    let Some(said) = promtool_check(&text) else {
        return;
    };
    let other: Vec<&str> = said
        .lines()
        .filter(|l| !l.ends_with("metric names should be written in 'snake_case' not 'camelCase'"))
        .collect();
    assert!(other.is_empty(), "promtool: {said}");
}

#[test]
fn stat_and_export_show_latency_markers_per_source() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    let name = unique_name("cli-latency");
    let mut p = Producer::create(&name, Geometry::default()).unwrap();
    let mut c = Consumer::open(&name).unwrap();
    p.set_latency_markers(Some(shmflow::LatencyMarkers::every(
        Duration::from_millis(1),
        "cli-source",
    )));
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let writer = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            p.send(b"record").unwrap();
            std::thread::sleep(Duration::from_micros(100));
        }
    });
    let reader = std::thread::spawn(move || {
        while c.recv().unwrap().is_some() {}
        c.latency()
    });
    let (mut export, addr) = start_export(&["--sample-ms", "200"]);
    // Two sampling intervals with markers in them.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(600) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = shmflow(&["stat", &name, "--json"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let l = &v["latency"][0];
    assert_eq!(l["source"], "cli-source", "{v}");
    assert!(l["count"].as_u64().unwrap() >= 1, "{v}");
    let q = |k: &str| l[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    assert!(q("p50_ns") <= q("p95_ns") && q("p95_ns") <= q("p99_ns"));
    assert!(q("p99_ns") <= q("p999_ns") && q("p999_ns") <= q("max_ns"));
    let body = scrape(&addr);
    let (_, text) = get_metrics(&addr, None);
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let read = reader.join().unwrap();
    export.kill().unwrap();
    export.wait().unwrap();
    assert!(read[0].count >= 1);
    let line =
        format!("shmflow_latency{{region=\"{name}\",source=\"cli-source\",quantile=\"0.99\"}}");
    assert!(body.contains(&line), "{line} in:\n{body}");
    assert!(body.contains("# TYPE shmflow_latency summary"), "{body}");
    assert!(
        body.contains(&format!(
            "shmflow_latencyMarkers_total{{region=\"{name}\",source=\"cli-source\"}}"
        )),
        "{body}"
    );
    // The classic text format's summary passes promtool, as the rest does.
    let Some(said) = promtool_check(&text) else {
        return;
    };
    assert!(
        said.lines()
            .all(|l| l.ends_with("metric names should be written in 'snake_case' not 'camelCase'")),
        "promtool: {said}"
    );
}

/// What `promtool check metrics` says of `text` (stdout and stderr), or `None` (with a SKIP
/// line) where promtool is not installed and `SHMFLOW_REQUIRE_PROMTOOL` is not set.
fn promtool_check(text: &str) -> Option<String> {
    use std::io::Write;
    let promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut promtool = match promtool {
        Ok(p) => p,
        Err(e) if std::env::var_os("SHMFLOW_REQUIRE_PROMTOOL").is_none() => {
            println!("SKIP the promtool check: {e} (CI installs it)");
            return None;
        }
        Err(e) => panic!("promtool: {e}"),
    };
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    Some(String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}
