//! Hooks for `benches/`: the real ring on the heap, which is otherwise private. Not part of the
//! API (hidden, may change).

use crate::protocol::ring::{RingRef, RingRx, RingTx};
use crate::sync::AtomicU64;
use std::sync::Arc;

struct Cells {
    slots: Box<[AtomicU64]>,
    head: AtomicU64,
    tail: AtomicU64,
}

impl Cells {
    fn ring(&self) -> RingRef<'_> {
        RingRef {
            slots: &self.slots,
            head: &self.head,
            tail: &self.tail,
            limit: u32::MAX as u64,
            region: "bench",
            name: "bench ring",
        }
    }
}

/// The pushing half of a ring of `capacity` slots.
#[allow(missing_debug_implementations)]
pub struct RingSender {
    cells: Arc<Cells>,
    tx: RingTx,
}

/// The popping half.
#[allow(missing_debug_implementations)]
pub struct RingReceiver {
    cells: Arc<Cells>,
    rx: RingRx,
}

/// A fresh ring, split in halves that can go to two threads.
pub fn ring(capacity: usize) -> (RingSender, RingReceiver) {
    let cells = Arc::new(Cells {
        slots: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
        head: AtomicU64::new(0),
        tail: AtomicU64::new(0),
    });
    (
        RingSender {
            cells: cells.clone(),
            tx: RingTx::new(0, 0),
        },
        RingReceiver {
            cells,
            rx: RingRx::new(0, 0),
        },
    )
}

impl RingSender {
    /// Pushes; `false` if the ring is full.
    #[inline]
    pub fn push(&mut self, v: u32) -> bool {
        self.tx.push(&self.cells.ring(), v).is_ok()
    }
}

impl RingReceiver {
    /// Pops, `None` if empty.
    #[inline]
    pub fn pop(&mut self) -> Option<u32> {
        self.rx.pop(&self.cells.ring()).ok().flatten()
    }
}
