//! Under loom: a gate region on the heap, with loom's atomics, laid out as the structures of
//! a mapped gate (one header per channel, rings per channel, and segments for
//! the whole gate).

// Loom-only hooks: nothing here is part of a normal build.
#![allow(missing_debug_implementations)]

use crate::protocol::abi::Header;
use crate::sync::AtomicU64;

use crate::protocol::abi::{GateGeometry, GateHeader};

/// The memory of a gate, on the heap.
pub(crate) struct HeapGate {
    pub(crate) geometry: GateGeometry,
    pub(crate) gate: GateHeader,
    pub(crate) headers: Box<[Header]>,
    pub(crate) data: Box<[Box<[AtomicU64]>]>,
    pub(crate) ret: Box<[Box<[AtomicU64]>]>,
    /// One loom atomic per 8-byte word of the segments (see `shared::HeapRegion::words`).
    pub(crate) words: Box<[AtomicU64]>,
    pub(crate) segments: std::cell::UnsafeCell<Box<[u64]>>,
}

// SAFETY: as for a mapped region: everything shared is atomics, or segment bytes whose
// ownership the protocol hands between the ends (and which the byte tracker checks).
unsafe impl Sync for HeapGate {}
// SAFETY: as above.
unsafe impl Send for HeapGate {}

impl HeapGate {
    pub(crate) fn new(gg: GateGeometry) -> HeapGate {
        let cap = gg.ring_cap();
        let total = gg.total_segments() as usize;
        let ring = || (0..cap).map(|_| AtomicU64::new(0)).collect::<Box<[_]>>();
        HeapGate {
            geometry: gg,
            gate: GateHeader::default(),
            headers: (0..gg.channels).map(|_| Header::default()).collect(),
            data: (0..gg.channels).map(|_| ring()).collect(),
            ret: (0..gg.channels).map(|_| ring()).collect(),
            words: (0..total * gg.segment_size as usize / 8)
                .map(|_| AtomicU64::new(0))
                .collect(),
            segments: std::cell::UnsafeCell::new(
                vec![0u64; total * gg.segment_size as usize / 8].into_boxed_slice(),
            ),
        }
    }
}
