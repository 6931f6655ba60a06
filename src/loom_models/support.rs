//! What the loom models stand on: the real ring, producer and consumer over a region on the
//! heap, plus a census of where every segment is.

// Loom-only hooks: nothing here is part of a normal build.
#![allow(missing_debug_implementations)]

use crate::endpoint::consumer::Consumer;
use crate::endpoint::producer::Producer;
use crate::protocol::abi::Geometry;
use crate::protocol::ring::{RingRx, RingTx};
use crate::region::view::Shared;
use crate::sync::{Arc, Ordering};

/// A channel region on the heap, with loom's atomics.
#[derive(Clone)]
pub(crate) struct Region(Arc<Shared>);

impl Region {
    /// A fresh region of `segments` segments of `segment_size` bytes (at least 64 under loom).
    pub(crate) fn new(segment_size: u32, segments: u32) -> Region {
        let g = Geometry {
            segment_size,
            segment_count: segments,
        };
        // Not `Geometry::validate`: the models use segments far below the product's minimum
        // (a page) to keep loom's state space small; the layout code takes any multiple of 64.
        assert!(segment_size % 64 == 0 && segment_size >= 64 && segments >= 2);
        Region(Arc::new(Shared::new_heap(g)))
    }

    /// Attaches the producer end.
    pub(crate) fn producer(&self) -> Producer {
        Producer::attach(self.0.clone()).unwrap()
    }

    /// The word the producer parks on.
    pub(crate) fn producer_park(&self) -> &loom::sync::atomic::AtomicU32 {
        self.0.header().producer_park.0.atomic()
    }

    /// Attaches the consumer end.
    pub(crate) fn consumer(&self) -> Consumer {
        Consumer::attach(self.0.clone()).unwrap()
    }

    /// How many places each segment is in: the return ring, the data ring, and the consumer's
    /// hand (`consumer_holds`, from [`Consumer::held_segment`]). The producer's current
    /// segment is already in the data ring or the consumer's hand (the consumer may read
    /// committed records while the producer writes the rest), so it is not a place of its own.
    pub(crate) fn census(&self, consumer_holds: Option<u32>) -> Vec<u32> {
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

/// The producer's half of a region's priority lane, as the producer uses it.
pub(crate) struct LaneSender {
    region: Region,
    tail: u64,
}

/// The consumer's half.
pub(crate) struct LaneReceiver {
    region: Region,
    head: u64,
}

/// The priority lane of a fresh region.
pub(crate) fn lane() -> (LaneSender, LaneReceiver) {
    let region = Region::new(64, 2);
    (
        LaneSender {
            region: region.clone(),
            tail: 0,
        },
        LaneReceiver { region, head: 0 },
    )
}

impl LaneSender {
    /// Pushes an event of `kind` if a slot is free (`false`: the lane is full).
    pub(crate) fn push(&mut self, kind: u32, payload: &[u8]) -> bool {
        use crate::protocol::lane::{lane_push, Entry};
        let h = self.region.0.header();
        let pushed = lane_push(h, self.tail, Entry::event(kind), payload, "model").unwrap();
        self.tail += pushed as u64;
        pushed
    }
}

impl LaneReceiver {
    /// Pops the next event: its kind and payload, `None` if the lane is empty.
    pub(crate) fn pop(&mut self) -> Option<(u32, Vec<u8>)> {
        use crate::protocol::abi::PRIO_PAYLOAD;
        let h = self.region.0.header();
        let mut buf = [0u8; PRIO_PAYLOAD];
        let (e, len) = crate::protocol::lane::lane_pop(h, self.head, &mut buf, "model").unwrap()?;
        self.head += 1;
        Some((e.kind, buf[..len].to_vec()))
    }
}

/// The pushing half of a real ring (the data ring of a heap region).
pub(crate) struct RingSender {
    region: Region,
    tx: RingTx,
}

/// The popping half.
pub(crate) struct RingReceiver {
    region: Region,
    rx: RingRx,
}

/// The data ring of a fresh region with `capacity` slots, as a bare ring of values below
/// `capacity`.
pub(crate) fn ring(capacity: u32) -> (RingSender, RingReceiver) {
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
    /// Pushes if there is room (`Ok(false)`: full, which the channel never lets happen).
    pub(crate) fn push(&mut self, v: u32) -> Result<bool, Box<crate::error::CorruptError>> {
        self.tx.try_push(&self.region.0.data_ring(), v)
    }
}

impl RingReceiver {
    /// Pops, `None` if empty.
    pub(crate) fn pop(&mut self) -> Result<Option<u32>, Box<crate::error::CorruptError>> {
        self.rx.pop(&self.region.0.data_ring())
    }
}

/// A gate region on the heap: `channels` channels of `exclusive` segments each plus
/// `floating` segments, 64 bytes each.
pub(crate) struct GateRegion {
    chans: Vec<Arc<Shared>>,
}

impl GateRegion {
    /// A fresh gate.
    pub(crate) fn new(channels: u32, exclusive: u32, floating: u32) -> GateRegion {
        let gg = crate::protocol::abi::GateGeometry::new(channels)
            .with_exclusive(exclusive)
            .with_floating(floating)
            .with_segment_size(64);
        // As for `Region::new`: tiny segments, below the product's minimum, on purpose.
        assert!(channels >= 1 && exclusive >= 1 && exclusive + floating >= 2);
        let hg = std::sync::Arc::new(crate::region::heap::HeapGate::new(gg));
        let chans: Vec<_> = (0..channels)
            .map(|c| Arc::new(Shared::heap_gate_channel(hg.clone(), c)))
            .collect();
        crate::region::view::init_gate(&hg.gate, &chans, gg, 0);
        GateRegion { chans }
    }

    /// Attaches the gate's consumer.
    pub(crate) fn gate(&self) -> crate::endpoint::gate::Gate {
        crate::endpoint::gate::Gate::attach(self.chans.clone(), None).unwrap()
    }

    /// Attaches channel `c`'s producer.
    pub(crate) fn producer(&self, c: usize) -> Producer {
        Producer::attach_gate_channel(self.chans[c].clone()).unwrap()
    }

    /// Floating segments granted to channel `c` so far.
    pub(crate) fn lent(&self, c: usize) -> u64 {
        self.chans[c].header().cons.lent.load(Ordering::Relaxed)
    }

    /// How many times each of channel `c`'s exclusive segments sits in that channel's rings
    /// (plus `consumer_holds`); floating segments are counted by the gate's pool instead.
    pub(crate) fn exclusive_census(&self, c: usize, consumer_holds: Option<u32>) -> Vec<u32> {
        let s = &self.chans[c];
        let m = s.gate.as_ref().unwrap();
        let excl = m.geometry.exclusive_range(c as u32);
        let h = s.header();
        let cap = s.n() as u64;
        let mut count = vec![0u32; excl.len()];
        let mut look = |slots: &[crate::sync::AtomicU64], head: u64, tail: u64| {
            assert!(tail >= head && tail - head <= cap, "cursors {head}..{tail}");
            for i in head..tail {
                let v = slots[(i % cap) as usize].load(Ordering::Acquire) as u32;
                if excl.contains(&v) {
                    count[(v - excl.start) as usize] += 1;
                }
            }
        };
        look(
            s.data_slots(),
            h.cons.data_head.load(Ordering::Acquire),
            h.prod.data_tail.load(Ordering::Acquire),
        );
        look(
            s.ret_slots(),
            h.prod.ret_head.load(Ordering::Acquire),
            h.cons.ret_tail.load(Ordering::Acquire),
        );
        if let Some(seg) = consumer_holds.filter(|s| excl.contains(s)) {
            count[(seg - excl.start) as usize] += 1;
        }
        count
    }
}

/// The hand-off between a producer and its buffer-timeout flusher, as the flusher uses it.
#[derive(Default)]
pub(crate) struct FlushSignal(crate::protocol::flush_signal::FlushSignal);

impl FlushSignal {
    /// Producer, after publishing: unparks `flusher` if it sleeps.
    pub(crate) fn mark(&self, flusher: &loom::thread::Thread) {
        self.0.mark(|| flusher.unpark())
    }

    /// Flusher: true if something was published since the last call.
    pub(crate) fn take(&self) -> bool {
        self.0.take()
    }

    /// Flusher: sleeps until something is published (or `stop`).
    pub(crate) fn sleep(&self, stop: impl Fn() -> bool) {
        self.0.sleep(stop, loom::thread::park)
    }
}

/// Serves the model's async bridge until [`stop_bridge`] (run it in a thread of its own).
pub(crate) fn serve_bridge() {
    crate::region::bridge::Bridges::global().first().serve();
}

/// Ends [`serve_bridge`].
pub(crate) fn stop_bridge() {
    crate::region::bridge::Bridges::global().first().stop();
}

/// A park word, its doorbell and a published flag, for the model of the async wait protocol
/// alone.
#[derive(Default)]
pub(crate) struct ParkWord {
    word: crate::sync::FutexWord,
    bell: crate::sync::Bell,
    /// Both sides hold the doorbell: the waiter sleeps on it, the notifier rings it.
    doorbell: bool,
    published: crate::sync::AtomicU32,
}

impl ParkWord {
    /// A fresh word, nothing published: the waiter sleeps through the bridge.
    pub(crate) fn new() -> ParkWord {
        ParkWord::default()
    }

    /// A fresh word whose notifier attached holding its doorbell: the waiter sleeps on the
    /// doorbell.
    pub(crate) fn with_doorbell() -> ParkWord {
        let w = ParkWord {
            doorbell: true,
            ..ParkWord::default()
        };
        crate::protocol::park::mark_ringable(&w.word);
        w
    }

    /// The word itself (for a model that waits on it synchronously).
    pub(crate) fn word(&self) -> &crate::sync::FutexWord {
        &self.word
    }

    fn bell(&self) -> Option<&crate::region::os::Bell> {
        self.doorbell.then_some(&self.bell)
    }

    /// The notifier: publishes (Release), then wakes the waiter if it announced itself (the
    /// read-modify-write notification), through the doorbell if it sleeps on it.
    pub(crate) fn publish(&self) {
        self.published.store(1, Ordering::Release);
        crate::protocol::park::notify::<crate::region::os::Host>(&self.word, self.bell());
    }

    /// The async waiter (parking at once): completes once it has seen the publication.
    pub(crate) async fn wait(&self) {
        // SAFETY: the word is in `self`, which the future borrows; the models await it to the
        // end and never leak it.
        unsafe {
            crate::protocol::park::wait_async::<crate::region::os::Host, _, crate::error::RecvError>(
                crate::protocol::park::WaitOn {
                    word: &self.word,
                    bell: self.bell(),
                },
                "model",
                crate::region::bridge::Bridges::global(),
                crate::protocol::park::WaitStrategy::Park,
                crate::protocol::park::Notifier::Rmw,
                crate::protocol::park::Pace::Sparse,
                // Acquire: pairs with the Release in `publish`.
                |_| Ok((self.published.load(Ordering::Acquire) != 0).then_some(())),
            )
        }
        .await
        .unwrap()
    }
}
