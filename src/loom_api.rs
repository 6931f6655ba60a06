//! Entry points for the loom models (`--cfg loom` only): the real ring, producer and consumer
//! over a region on the heap, plus a census of where every segment is.

use crate::layout::Geometry;
use crate::ring::{RingRx, RingTx};
use crate::shared::Shared;
use crate::sync::{Arc, Ordering};
use crate::{Consumer, Producer};

/// A channel region on the heap, with loom's atomics.
#[derive(Clone)]
pub struct Region(Arc<Shared>);

impl Region {
    /// A fresh region of `segments` segments of `segment_size` bytes (at least 64 under loom).
    pub fn new(segment_size: u32, segments: u32) -> Region {
        let g = Geometry {
            segment_size,
            segment_count: segments,
        };
        g.validate("loom").unwrap();
        Region(Arc::new(Shared::new_heap(g)))
    }

    /// Attaches the producer end.
    pub fn producer(&self) -> Producer {
        Producer::attach(self.0.clone()).unwrap()
    }

    /// Attaches the consumer end.
    pub fn consumer(&self) -> Consumer {
        Consumer::attach(self.0.clone()).unwrap()
    }

    /// How many places each segment is in: the return ring, the data ring, and the consumer's
    /// hand (`consumer_holds`, from [`Consumer::held_segment`]). The producer's current
    /// segment is already in the data ring or the consumer's hand (the consumer may read
    /// committed records while the producer writes the rest), so it is not a place of its own.
    pub fn census(&self, consumer_holds: Option<u32>) -> Vec<u32> {
        let s = &self.0;
        let h = s.header();
        let n = s.n() as u64;
        let mut count = vec![0u32; n as usize];
        let ring =
            |slots: &[crate::sync::AtomicU64], head: u64, tail: u64, count: &mut Vec<u32>| {
                assert!(
                    tail >= head && tail - head <= n,
                    "cursors out of range: {head}..{tail}"
                );
                for i in head..tail {
                    let v = slots[(i % n) as usize].load(Ordering::Acquire);
                    count[v as usize] += 1;
                }
            };
        ring(
            s.data_slots(),
            h.cons.data_head.load(Ordering::Acquire),
            h.prod.data_tail.load(Ordering::Acquire),
            &mut count,
        );
        ring(
            s.ret_slots(),
            h.prod.ret_head.load(Ordering::Acquire),
            h.cons.ret_tail.load(Ordering::Acquire),
            &mut count,
        );
        if let Some(seg) = consumer_holds {
            count[seg as usize] += 1;
        }
        count
    }
}

/// The pushing half of a real ring (the data ring of a heap region).
pub struct RingSender {
    region: Region,
    tx: RingTx,
}

/// The popping half.
pub struct RingReceiver {
    region: Region,
    rx: RingRx,
}

/// The data ring of a fresh region with `capacity` slots, as a bare ring of values below
/// `capacity`.
pub fn ring(capacity: u32) -> (RingSender, RingReceiver) {
    let region = Region::new(64, capacity);
    (
        RingSender {
            region: region.clone(),
            tx: RingTx::new(0, 0),
        },
        RingReceiver {
            region,
            rx: RingRx::new(0, 0),
        },
    )
}

impl RingSender {
    /// Pushes; an error means the ring was full (which the channel never lets happen).
    pub fn push(&mut self, v: u32) -> crate::Result<()> {
        self.tx.push(&self.region.0.data_ring(), v)
    }
}

impl RingReceiver {
    /// Pops, `None` if empty.
    pub fn pop(&mut self) -> crate::Result<Option<u32>> {
        self.rx.pop(&self.region.0.data_ring())
    }
}
