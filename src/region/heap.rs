//! Under `--cfg shmflow_loom`: the memory of regions on the heap, with loom's atomics, in
//! place of the shared mappings (which loom cannot model): gates laid out as the structures
//! of a mapped gate (one header per channel, rings per channel, and segments for the whole
//! gate), and the modelled doorbells of a region (`heap_handoff` makes regions of them).

use crate::protocol::abi::Header;
use crate::sync::AtomicU64;

use crate::protocol::abi::{GateGeometry, GateHeader};

/// The memory of a gate, on the heap.
#[allow(missing_debug_implementations)]
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

/// The modelled doorbells of a heap region (as `view::Bells` of a mapped one): the consumer's
/// word's, and each channel's producer word's.
#[allow(missing_debug_implementations)]
pub(crate) struct HeapBells {
    pub(crate) consumer: crate::region::os::Bell,
    pub(crate) producers: Vec<crate::region::os::Bell>,
}

impl HeapBells {
    pub(crate) fn fresh(channels: u32) -> std::sync::Arc<HeapBells> {
        std::sync::Arc::new(HeapBells {
            consumer: Default::default(),
            producers: (0..channels).map(|_| Default::default()).collect(),
        })
    }
}
