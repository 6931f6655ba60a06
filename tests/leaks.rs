//! Creating, using and dropping channels and gates many times leaks no descriptor, no
//! mapping and no name in /dev/shm (alone in its test binary, so that no other test opens
//! descriptors meanwhile).

mod common;

use common::unique_name;
use shmflow::monitor::GateMonitor;
use shmflow::{Consumer, FlushPolicy, Gate, GateGeometry, Geometry, Producer};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count()
}

fn cycle(prefix: &str, i: u32) {
    let name = format!("{prefix}-{i}");
    let g = GateGeometry::new(3)
        .with_exclusive(2)
        .with_floating(2)
        .with_segment_size(4096);
    let mut gate = Gate::create(&name, g).unwrap();
    let mut ps: Vec<Producer> = (0..3)
        .map(|c| Producer::open_channel(&name, c).unwrap())
        .collect();
    ps[0].set_flush_policy(FlushPolicy::EveryRecord);
    for _ in 0..4 {
        let _ = ps[0].try_send(&[1; 3000]); // the fourth asks for a floating segment
    }
    ps[1].send_event(1, b"event").unwrap();
    ps[1].send_priority_event(2, b"priority").unwrap();
    for _ in 0..6 {
        let _ = gate.try_recv().map(|m| m.is_some());
    }
    drop(ps);
    GateMonitor::open(&name).unwrap().snapshot();
    drop(gate);

    let (mut p, mut c) = shmflow::pair(Geometry {
        segment_size: 4096,
        segment_count: 3,
    })
    .unwrap();
    p.send(&[3; 9000]).unwrap(); // spanning
    let v = c.recv().unwrap().unwrap().to_vec().unwrap();
    assert_eq!(v.len(), 9000);

    let named = Producer::create(&format!("{name}-ch"), Geometry::default()).unwrap();
    let reader = Consumer::open(&format!("{name}-ch")).unwrap();
    drop((named, reader));
}

#[test]
fn a_thousand_cycles_leak_no_descriptor_mapping_or_name() {
    let prefix = unique_name("leaks");
    cycle(&prefix, 0); // warm-up: lazily created process-wide state
    let (fds, maps) = (open_fds(), mappings());
    for i in 1..=1000 {
        cycle(&prefix, i);
    }
    assert_eq!(open_fds(), fds, "descriptors leaked");
    assert_eq!(mappings(), maps, "mappings leaked");
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix.trim_start_matches('/')))
        .collect();
    assert!(left.is_empty(), "names left in /dev/shm: {left:?}");
}
