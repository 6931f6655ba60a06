//! Fuzz target: a gate (one consumer, several producer channels, a floating pool) whose
//! region bytes are attacker-controlled while every party keeps working.
//!
//! ```text
//! cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run gate -- -runs=1000000
//! ```
//!
//! A live named gate of 3 channels (2 exclusive segments each, 2 floating) carries records,
//! events, a priority event and a lent floating segment; then the first input byte picks:
//! - 0: the input overwrites the region from its start (gate header, channel headers, rings,
//!   segments);
//! - 1: the input is a list of 10-byte patches `(offset u16 × 8, value u64)` spread over the
//!   whole region — a few corrupted fields in a plausible state.
//!
//! Then the gate reads (every path of `try_recv`), the attached producers write, new
//! producers try to attach to the scribbled channels, and a read-only `GateMonitor` (what
//! `shmflow stat` uses) opens and snapshots it. Success is the absence of a crash: no panic,
//! no access outside the mapping, every call returns.
#![no_main]

mod common;

use std::sync::atomic::{AtomicU64, Ordering};

use common::{apply_patches, read_parts};
use libfuzzer_sys::fuzz_target;
use shmflow::{FlushPolicy, Gate, GateGeometry, GateMessage, Producer};
use shmflow::monitor::GateMonitor;

const G: GateGeometry = GateGeometry::new(3).with_exclusive(2).with_floating(2).with_segment_size(4096);

static RUN: AtomicU64 = AtomicU64::new(0);

fn read_gate(gate: &mut Gate) {
    gate.set_max_record_len(1 << 20);
    for _ in 0..32 {
        match gate.try_recv() {
            Ok(Some(GateMessage::Record { record, .. })) => {
                read_parts(record);
            }
            Ok(Some(GateMessage::Event { event, .. })) => {
                let _ = event.payload.len();
            }
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(_) => {}
        }
    }
    let m = gate.metrics();
    let _ = (
        m.input_exclusive_buffers_usage(),
        m.input_floating_buffers_usage(),
        m.likely_skew(),
    );
}

fn write(p: &mut Producer, seed: u8) {
    let rec = vec![seed; usize::from(seed) * 41];
    for i in 0..8 {
        let _ = match i % 4 {
            0 => p.try_send(&rec).is_ok(),
            1 => p.flush().is_ok(),
            2 if seed % 2 == 0 => p.try_send_event(7, &[seed; 9]).is_ok(),
            2 => p
                .try_send_barrier(u64::from(seed), shmflow::Alignment::Aligned, &[seed; 2])
                .is_ok(),
            _ => p.try_send_priority_event(8, &[seed; 3]).is_ok(),
        };
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let name = format!(
        "/shmflow-fuzz-gate-{}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    );
    let mut gate = Gate::create(&name, G).unwrap();
    let mut prods: Vec<Producer> = (0..G.channels)
        .map(|c| Producer::open_channel(&name, c).unwrap())
        .collect();
    // Channel 0 gets a backlog (so a floating segment is lent), channel 1 events, channel 2
    // ends its partition: every piece of gate state is live when the bytes change.
    prods[0].set_flush_policy(FlushPolicy::EveryRecord);
    for i in 0..3u8 {
        let _ = prods[0].try_send(&vec![i; 3000]);
    }
    let _ = prods[0].try_send(&[9; 3000]); // out of exclusive segments: asks for a loan
    prods[1].send_event(1, b"in order").unwrap();
    prods[1].send_priority_event(2, b"overtakes").unwrap();
    // A checkpoint in progress: announced and in place on channel 1, not yet on the others.
    prods[1]
        .send_barrier(1, shmflow::Alignment::Unaligned, b"ckpt")
        .unwrap();
    prods[1].flush().unwrap();
    drop(prods.pop());
    for _ in 0..3 {
        let _ = gate.try_recv().map(|m| m.is_some());
    }

    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/dev/shm{name}"))
        .unwrap();
    // SAFETY: a second shared mapping of the gate, written while its users run: that is the
    // attack. Nothing in this process reads it as Rust data.
    let mut map = unsafe { memmap2::MmapMut::map_mut(&file).unwrap() };
    let len = map.len();
    if mode % 2 == 0 {
        let n = rest.len().min(len);
        map[..n].copy_from_slice(&rest[..n]);
    } else {
        apply_patches(&mut map, rest);
    }

    // A zero magic reads as a creator still setting up: an open by name then waits its
    // bounded grace (500 ms) before refusing. Correct, but it would make this target crawl.
    let opens = map[..8] != [0; 8];

    read_gate(&mut gate);
    for (i, p) in prods.iter_mut().enumerate() {
        write(p, mode.wrapping_add(i as u8));
    }
    if !opens {
        read_gate(&mut gate);
        return;
    }
    // Attaching to scribbled channels (the one that ended, and out-of-range ones).
    for c in [2, 3, u32::MAX] {
        if let Ok(mut p) = Producer::open_channel(&name, c) {
            write(&mut p, mode);
        }
    }
    if let Ok(mon) = GateMonitor::open(&name) {
        let s = mon.snapshot();
        let _ = (
            s.input_floating_buffers_usage(),
            s.likely_skew(),
            mon.is_stale(),
        );
        for c in 0..mon.channels() {
            let _ = mon.producer_alive(c);
        }
    }
    read_gate(&mut gate);
    drop(prods);
    read_gate(&mut gate);
});
