use super::*;
use std::mem::{offset_of, size_of};

/// Every field of every structure in a region, as `struct.field@offset+size`.
fn layout() -> String {
    macro_rules! fields {
        ($out:ident, $t:ty, $($f:ident: $ft:ty),* $(,)?) => {$(
            $out.push(format!(
                "{}.{}@{}+{}",
                stringify!($t),
                stringify!($f),
                offset_of!($t, $f),
                size_of::<$ft>()
            ));
        )*};
    }
    let mut v = Vec::new();
    fields!(v, EndSlot, state: AtomicU32, pid: AtomicU32);
    fields!(v, ProducerCursors, data_tail: AtomicU64, ret_head: AtomicU64, demand: AtomicU64);
    fields!(v, ConsumerCursors, data_head: AtomicU64, ret_tail: AtomicU64, lent: AtomicU64,
        floating_held: AtomicU64, prio_head: AtomicU64, segments_done: AtomicU64,
        segment_cap: AtomicU64, segment_fill: AtomicU64);
    fields!(v, ProducerCounters, records: AtomicU64, bytes: AtomicU64,
        segments_committed: AtomicU64, wakes: AtomicU64, backpressured_ns: AtomicU64,
        blocked_since_ns: AtomicU64, flusher_wakes: AtomicU64, segments_acquired: AtomicU64);
    fields!(v, ConsumerCounters, records: AtomicU64, bytes: AtomicU64,
        segments_returned: AtomicU64, wakes: AtomicU64, idle_ns: AtomicU64,
        idle_since_ns: AtomicU64, segments_taken: AtomicU64, inflight_records: AtomicU64,
        inflight_bytes: AtomicU64, held_records: AtomicU64, held_bytes: AtomicU64,
        held_ns: AtomicU64, barrier_delay_ns: AtomicU64, debloat_target_ns: AtomicU64,
        debloat_rate: AtomicU64);
    fields!(v, PrioSlot, kind_len: AtomicU64, words: [AtomicU64; PRIO_PAYLOAD / 8]);
    fields!(v, Header, magic: AtomicU64, version: AtomicU32, header_size: AtomicU32,
        segment_size: AtomicU32, segment_count: AtomicU32, total_size: AtomicU64,
        creator_pid: AtomicU32, name_claim: AtomicU32, producer: Padded<EndSlot>,
        consumer: Padded<EndSlot>, prod: Padded<ProducerCursors>,
        cons: Padded<ConsumerCursors>, producer_park: Padded<FutexWord>,
        consumer_park: Padded<FutexWord>, producer_counters: Padded<ProducerCounters>,
        consumer_counters: Padded<ConsumerCounters>, prio_tail: Padded<AtomicU64>,
        prio: [PrioSlot; PRIO_SLOTS], link: Padded<LinkFigures>);
    fields!(v, LinkFigures, role: AtomicU64, credit: AtomicU64, backlog: AtomicU64,
        in_flight_bytes: AtomicU64, wire_bytes: AtomicU64);
    fields!(v, GateFigures, floating_free: AtomicU64, idle_ns: AtomicU64,
        idle_since_ns: AtomicU64);
    fields!(v, GateHeader, magic: AtomicU64, version: AtomicU32, header_size: AtomicU32,
        channels: AtomicU32, exclusive: AtomicU32, floating: AtomicU32,
        segment_size: AtomicU32, total_size: AtomicU64, creator_pid: AtomicU32,
        _reserved: AtomicU32, consumer: Padded<EndSlot>, park: Padded<FutexWord>,
        pool: Padded<GateFigures>, checkpoints: Padded<CheckpointFigures>);
    fields!(v, CheckpointFigures, released: AtomicU64, abandoned: AtomicU64,
        last_id: AtomicU64, last_how: AtomicU64, last_alignment_ns: AtomicU64,
        last_start_delay_ns: AtomicU64, last_held_records: AtomicU64,
        last_held_bytes: AtomicU64, inflight_records: AtomicU64, inflight_bytes: AtomicU64);
    {
        use crate::protocol::latency::{Slot, Table, BUCKETS, MAX_LABEL, TABLE_BYTES};
        fields!(v, Slot, label: [AtomicU64; MAX_LABEL / 8], count: AtomicU64,
            sum_ns: AtomicU64, max_ns: AtomicU64, last_ns: AtomicU64,
            buckets: [AtomicU32; BUCKETS]);
        v.push(format!(
            "latency Table={} in {TABLE_BYTES} bytes after the segments",
            size_of::<Table>()
        ));
    }
    v.push(format!(
        "Header={} GateHeader={}",
        size_of::<Header>(),
        size_of::<GateHeader>()
    ));
    v.join("\n")
}

/// The layout this version of the ABI has. A change to any structure of the region must
/// come with a new `LAYOUT_VERSION` (ends of two layouts must refuse each other) and a new
/// golden text here: this test fails until both are done.
#[test]
fn golden_layout() {
    let now = layout();
    let golden = include_str!("../abi.golden");
    assert_eq!(
        (LAYOUT_VERSION, now.trim()),
        (GOLDEN_VERSION, golden.trim()),
        "the region layout changed: bump LAYOUT_VERSION, then write the new layout to \
         src/protocol/abi.golden and GOLDEN_VERSION (the layout now is printed above)"
    );
}

/// The layout version `abi.golden` describes.
const GOLDEN_VERSION: u32 = 11;

#[test]
#[ignore = "prints the layout for abi.golden"]
fn print_layout() {
    println!("{}", layout());
}
