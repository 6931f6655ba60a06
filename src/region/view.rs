//! `Shared`: typed access to one region's header, rings and segments, whatever
//! holds the bytes (a shared mapping in production, the heap under loom).

#[cfg(not(shmflow_loom))]
use std::os::fd::OwnedFd;
use std::ptr::NonNull;

use crate::protocol::abi::{GateGeometry, GateHeader};
use crate::protocol::abi::{Geometry, Header};
#[cfg(not(shmflow_loom))]
use crate::region::os::Bell;
use crate::sync::{AtomicU64, ByteTracker, FutexWord};

/// This process's part in removing a region's name (see `region::name`).
#[cfg(not(shmflow_loom))]
#[derive(Debug)]
pub(crate) enum NameDuty {
    /// An anonymous region, a read-only view, or a gate opened by a producer: nothing to do.
    None,
    /// This process created the region under this name.
    Creator(std::ffi::CString),
    /// This process opened the named channel as an end.
    Opener(std::ffi::CString),
}

#[cfg(not(shmflow_loom))]
/// The mapping and the descriptor behind a region.
pub(crate) struct Mapping {
    /// Held for its `Drop`, which unmaps (after our `Drop` has unlinked the name).
    pub(crate) _map: memmap2::MmapRaw,
    pub(crate) fd: OwnedFd,
    /// The region's POSIX name and this process's part in removing it (see
    /// `region::name`).
    pub(crate) name: NameDuty,
    /// Set once an end of this process has settled the name's fate (removed it, or left it
    /// for a later consumer): the creator's fallback unlink in `Drop` is then skipped.
    pub(crate) name_settled: std::sync::atomic::AtomicBool,
    /// The doorbells of the park words that this process holds (anonymous regions only;
    /// shared with a peer opened in this process from a handle).
    pub(crate) bells: std::sync::Arc<Bells>,
}

/// The doorbells of a region's park words held by this process: an anonymous region's creator
/// holds them all, a child those of its channel (handed with the region by `PeerHandle`).
#[cfg(not(shmflow_loom))]
#[derive(Default, Debug)]
pub(crate) struct Bells {
    /// The consumer's word: the channel's, or the gate's.
    pub(crate) consumer: Option<Bell>,
    /// Each channel's producer word, by channel index (0 for a channel of its own).
    pub(crate) producers: Vec<Option<Bell>>,
}

#[cfg(not(shmflow_loom))]
impl Bells {
    /// Fresh bells for a region of `channels` channels (1 for a channel of its own).
    pub(crate) fn fresh(channels: usize) -> std::io::Result<Bells> {
        Ok(Bells {
            consumer: Some(Bell::new()?),
            producers: (0..channels)
                .map(|_| Bell::new().map(Some))
                .collect::<std::io::Result<_>>()?,
        })
    }

    /// The bells of channel `c` alone, handed over: its consumer's word's and its producer's.
    /// `c` is below `MAX_CHANNELS` (checked where it is read).
    pub(crate) fn of_channel(c: u32, consumer: Bell, producer: Bell) -> Bells {
        let mut producers: Vec<Option<Bell>> = (0..c).map(|_| None).collect();
        producers.push(Some(producer));
        Bells {
            consumer: Some(consumer),
            producers,
        }
    }

    /// Channel `c`'s producer word's bell, if held.
    pub(crate) fn producer(&self, c: u32) -> Option<&Bell> {
        self.producers.get(c as usize).and_then(Option::as_ref)
    }
}

#[cfg(not(shmflow_loom))]
impl Mapping {
    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.fd
    }
}

#[cfg(not(shmflow_loom))]
impl Drop for Mapping {
    /// The creator's fallback: a gate's name, or a channel whose end never attached (or never
    /// settled the name), goes with the creator's mapping.
    fn drop(&mut self) {
        if let NameDuty::Creator(name) = &self.name {
            if !self.name_settled.load(std::sync::atomic::Ordering::Relaxed) {
                // Failure (already removed by `shmflow clean` or by hand) leaves nothing to do.
                let _ = crate::sys::shm::unlink(name);
            }
        }
    }
}

/// Where one channel sits in a mapping, computed from a validated geometry (never read from
/// the region).
#[derive(Clone, Copy, Debug)]
#[cfg_attr(shmflow_loom, allow(dead_code))]
pub(crate) struct Placement {
    /// Segment size, and the most segments this channel can hold (its ring capacity).
    pub(crate) geometry: Geometry,
    /// Segments addressable by index (the channel's own, or the whole gate's).
    pub(crate) seg_total: usize,
    /// Segments in the return ring of a fresh region.
    pub(crate) initial_free: u64,
    pub(crate) header: usize,
    pub(crate) data_ring: usize,
    pub(crate) return_ring: usize,
    pub(crate) segments: usize,
    /// The latency table: the channel's own, or the gate's for a gate's channel.
    pub(crate) latency: usize,
    /// For a gate's channel: its index and the gate's geometry.
    pub(crate) gate: Option<(u32, GateGeometry)>,
}

#[cfg_attr(shmflow_loom, allow(dead_code))]
impl Placement {
    /// A channel of its own.
    pub(crate) fn channel(g: Geometry) -> Placement {
        Placement {
            geometry: g,
            seg_total: g.segment_count as usize,
            initial_free: g.segment_count as u64,
            header: 0,
            data_ring: g.data_ring_offset(),
            return_ring: g.return_ring_offset(),
            segments: g.segments_offset(),
            latency: g.latency_offset(),
            gate: None,
        }
    }

    /// Channel `c` of a gate.
    pub(crate) fn gate_channel(gg: GateGeometry, c: u32) -> Placement {
        Placement {
            geometry: Geometry {
                segment_size: gg.segment_size,
                segment_count: gg.ring_cap() as u32,
            },
            seg_total: gg.total_segments() as usize,
            initial_free: gg.exclusive as u64,
            header: gg.channel_offset(c),
            data_ring: gg.data_ring_offset(c),
            return_ring: gg.return_ring_offset(c),
            segments: gg.segments_offset(),
            latency: gg.latency_offset(),
            gate: Some((c, gg)),
        }
    }
}

/// What keeps the region's memory alive.
#[cfg_attr(shmflow_loom, allow(dead_code))]
pub(crate) enum Backing {
    #[cfg(not(shmflow_loom))]
    Mapped(std::sync::Arc<Mapping>),
    #[cfg(shmflow_loom)]
    Heap(Box<HeapRegion>),
    #[cfg(shmflow_loom)]
    HeapGate(std::sync::Arc<crate::region::heap::HeapGate>),
}

/// What a channel of a gate knows about its place in it.
pub(crate) struct Membership {
    /// The channel's index in the gate.
    pub index: u32,
    pub geometry: GateGeometry,
    gate: NonNull<GateHeader>,
}

impl Membership {
    pub(crate) fn gate_header(&self) -> &GateHeader {
        // SAFETY: points into the same backing as the channel, alive as long as `Shared`.
        unsafe { self.gate.as_ref() }
    }
}

/// Under loom: the same structures, allocated on the heap with loom's atomics.
#[cfg(shmflow_loom)]
pub(crate) struct HeapRegion {
    header: Header,
    data_slots: Box<[AtomicU64]>,
    ret_slots: Box<[AtomicU64]>,
    /// One loom atomic per 8-byte word of the segments: frame headers are read and written
    /// atomically, and loom cannot overlay its atomics on plain memory.
    words: Box<[AtomicU64]>,
    segments: Box<[u64]>,
}

pub(crate) struct Shared {
    pub(crate) name: String,
    /// Segment size, and the most segments this channel can hold (its ring capacity).
    pub(crate) geometry: Geometry,
    /// Segments addressable by index: the channel's own for a
    /// single channel, the whole gate's for a gate channel.
    seg_total: usize,
    /// Segments in the return ring of a fresh region.
    pub(crate) initial_free: u64,
    /// The word the consumer parks on: the channel's own, or the gate's for a gate channel.
    consumer_park: NonNull<FutexWord>,
    /// Set for a channel of a gate.
    pub(crate) gate: Option<Membership>,
    header: NonNull<Header>,
    data_slots: NonNull<AtomicU64>,
    ret_slots: NonNull<AtomicU64>,
    /// Under loom: the atomic shadow of every segment word (see `HeapRegion::words`).
    #[cfg(shmflow_loom)]
    words: NonNull<AtomicU64>,
    segments: NonNull<u8>,
    /// The latency table (`protocol::latency`) the consumer writes: the channel's own, or the
    /// gate's; `None` on the heap under loom (a model emits no markers).
    latency: Option<NonNull<crate::protocol::latency::Table>>,
    pub(crate) tracker: ByteTracker,
    #[cfg_attr(shmflow_loom, allow(dead_code))]
    backing: Backing,
    /// Under loom: the modelled doorbells of a region made by the public API (`pair`,
    /// `create_anonymous`), on which its async waiters sleep; `None` for the library's own
    /// models, whose async waiters sleep through the bridge thread.
    #[cfg(shmflow_loom)]
    pub(crate) heap_bells: Option<std::sync::Arc<crate::region::heap::HeapBells>>,
}

// SAFETY: all shared state behind the pointers is atomics or segment bytes whose ownership the
// channel protocol hands between the ends; the pointers stay valid as long as `_backing` lives,
// which is as long as `Shared`.
unsafe impl Send for Shared {}
// SAFETY: as above; `&Shared` only gives out atomics and raw segment pointers.
unsafe impl Sync for Shared {}

impl Shared {
    /// Views one channel of a mapped region: a channel of its own, or a channel of a gate
    /// (the one constructor for both).
    ///
    /// # Safety
    /// `base` must point to a page-aligned mapping, kept alive by `backing`, of at least the
    /// region size of the shape `place` was computed from.
    #[cfg(not(shmflow_loom))]
    pub(crate) unsafe fn new(
        name: String,
        place: Placement,
        base: NonNull<u8>,
        backing: std::sync::Arc<Mapping>,
    ) -> Shared {
        let at = |off: usize| {
            // SAFETY: every offset comes from a validated geometry and lies inside the
            // region (caller).
            unsafe { NonNull::new_unchecked(base.as_ptr().add(off)) }
        };
        let header: NonNull<Header> = at(place.header).cast();
        let (consumer_park, gate) = match place.gate {
            None => (
                // SAFETY: the header is valid for the life of `backing`.
                NonNull::from(unsafe { header.as_ref() }.consumer_park()),
                None,
            ),
            Some((index, geometry)) => {
                // The gate header starts the region.
                let gate: NonNull<GateHeader> = base.cast();
                (
                    // SAFETY: the gate header is valid for the life of `backing`.
                    NonNull::from(unsafe { gate.as_ref() }.park()),
                    Some(Membership {
                        index,
                        geometry,
                        gate,
                    }),
                )
            }
        };
        Shared {
            name,
            geometry: place.geometry,
            seg_total: place.seg_total,
            initial_free: place.initial_free,
            consumer_park,
            gate,
            header,
            data_slots: at(place.data_ring).cast(),
            ret_slots: at(place.return_ring).cast(),
            segments: at(place.segments),
            latency: Some(at(place.latency).cast()),
            tracker: ByteTracker,
            backing: Backing::Mapped(backing),
        }
    }

    /// A region on the heap, for the loom models: initialized like a fresh mapping.
    #[cfg(shmflow_loom)]
    pub(crate) fn new_heap(geometry: Geometry) -> Shared {
        let n = geometry.segment_count as usize;
        let mut heap = Box::new(HeapRegion {
            header: Header::default(),
            data_slots: (0..n).map(|_| AtomicU64::new(0)).collect(),
            ret_slots: (0..n).map(|_| AtomicU64::new(0)).collect(),
            words: (0..n * geometry.segment_size as usize / 8)
                .map(|_| AtomicU64::new(0))
                .collect(),
            segments: vec![0u64; n * geometry.segment_size as usize / 8].into_boxed_slice(),
        });
        let shared = Shared {
            name: "heap:loom".into(),
            geometry,
            seg_total: n,
            initial_free: n as u64,
            consumer_park: NonNull::from(heap.header.consumer_park()),
            gate: None,
            header: NonNull::from(&heap.header),
            data_slots: NonNull::from(&heap.data_slots[0]),
            ret_slots: NonNull::from(&heap.ret_slots[0]),
            words: NonNull::from(&heap.words[0]),
            segments: NonNull::new(heap.segments.as_mut_ptr().cast()).unwrap(),
            latency: None,
            tracker: ByteTracker::new(n, geometry.segment_size as usize),
            backing: Backing::Heap(heap),
            heap_bells: None,
        };
        shared.init_header(0);
        shared
    }

    /// Channel `c` of a heap gate, for the loom models. Each channel tracks the bytes of the
    /// whole gate's segments on its own: a floating segment's reuse by another channel is not
    /// race-checked across the two trackers (the lending model checks the hand-off instead).
    #[cfg(shmflow_loom)]
    pub(crate) fn heap_gate_channel(
        hg: std::sync::Arc<crate::region::heap::HeapGate>,
        c: u32,
    ) -> Shared {
        let gg = hg.geometry;
        // SAFETY: the segments live as long as `hg`, which the backing keeps.
        let segs = unsafe { (*hg.segments.get()).as_mut_ptr() };
        Shared {
            name: format!("heap:loom-gate/{c}"),
            geometry: Geometry {
                segment_size: gg.segment_size,
                segment_count: gg.ring_cap() as u32,
            },
            seg_total: gg.total_segments() as usize,
            initial_free: gg.exclusive as u64,
            consumer_park: NonNull::from(hg.gate.park()),
            gate: Some(Membership {
                index: c,
                geometry: gg,
                gate: NonNull::from(&hg.gate),
            }),
            header: NonNull::from(&hg.headers[c as usize]),
            data_slots: NonNull::from(&hg.data[c as usize][0]),
            ret_slots: NonNull::from(&hg.ret[c as usize][0]),
            words: NonNull::from(&hg.words[0]),
            segments: NonNull::new(segs.cast()).unwrap(),
            latency: None,
            tracker: ByteTracker::new(gg.total_segments() as usize, gg.segment_size as usize),
            backing: Backing::HeapGate(hg),
            heap_bells: None,
        }
    }

    #[inline]
    pub(crate) fn header(&self) -> &Header {
        // SAFETY: valid for the life of `self` (see `from_mapping` / `new_heap`).
        unsafe { self.header.as_ref() }
    }

    #[inline]
    pub(crate) fn n(&self) -> usize {
        self.geometry.segment_count as usize
    }

    #[inline]
    pub(crate) fn segment_size(&self) -> usize {
        self.geometry.segment_size as usize
    }

    #[inline]
    pub(crate) fn data_slots(&self) -> &[AtomicU64] {
        // SAFETY: N slots were laid out at this address (layout.rs) for the life of `self`.
        unsafe { std::slice::from_raw_parts(self.data_slots.as_ptr(), self.n()) }
    }

    #[inline]
    pub(crate) fn ret_slots(&self) -> &[AtomicU64] {
        // SAFETY: as for `data_slots`.
        unsafe { std::slice::from_raw_parts(self.ret_slots.as_ptr(), self.n()) }
    }

    /// The latency table the consumer writes (the gate's, for a gate's channel), if the
    /// region has one.
    pub(crate) fn latency_table(&self) -> Option<&crate::protocol::latency::Table> {
        // SAFETY: the table lies inside the mapping at an offset computed from the validated
        // geometry (`Placement::latency`), 64-byte aligned (segment sizes are multiples of 64), for the life of `backing`, which
        // lives as long as `self`; it is atomics only, for which every bit pattern is valid.
        self.latency.map(|t| unsafe { t.as_ref() })
    }

    /// Where the consumer parks.
    #[inline]
    pub(crate) fn consumer_park(&self) -> &FutexWord {
        // SAFETY: points into the backing, alive as long as `self`.
        unsafe { self.consumer_park.as_ref() }
    }

    /// As [`Shared::word`], for a segment whose start `base` (= `segment_ptr(seg)`) the
    /// caller cached: no index arithmetic on the hot path.
    ///
    /// # Safety
    /// `base` must be `self.segment_ptr(seg)`, and `at` 8-aligned with `at + 8 <=
    /// segment_size`.
    #[inline(always)]
    pub(crate) unsafe fn word_in(&self, base: *const u8, seg: u32, at: usize) -> &AtomicU64 {
        debug_assert!(at % 8 == 0 && at + 8 <= self.segment_size());
        #[cfg(not(shmflow_loom))]
        {
            let _ = seg;
            // SAFETY: the caller's contract; see `word` for why an atomic view is sound.
            unsafe { &*(base.add(at) as *const AtomicU64) }
        }
        #[cfg(shmflow_loom)]
        {
            let _ = base;
            self.word(seg, at)
        }
    }

    /// The 8-byte word at `at` of segment `seg`, as an atomic: frame headers, which are the
    /// commits, are only ever read and written through this. `seg` and `at` come from the
    /// side's private state (validated when they came from shared memory); a bad one is a
    /// bug here and panics rather than reaching outside the segment.
    #[inline]
    pub(crate) fn word(&self, seg: u32, at: usize) -> &AtomicU64 {
        assert!(at % 8 == 0 && at + 8 <= self.segment_size());
        #[cfg(not(shmflow_loom))]
        // SAFETY: `segment_ptr` checks `seg`; `at + 8 <= segment_size` and `at` is 8-aligned
        // in a 4096-aligned segment, so this is an aligned u64 inside the mapping, which
        // lives as long as `self`. `AtomicU64` has the layout of `u64`; both ends access a
        // header position only atomically while it can hold a header (the hand-off of the
        // segment orders any earlier plain payload write before it).
        unsafe {
            &*(self.segment_ptr(seg).add(at) as *const AtomicU64)
        }
        #[cfg(shmflow_loom)]
        {
            let per = self.segment_size() / 8;
            // SAFETY: `seg_total × per` shadow words at this address for the life of `self`.
            let all =
                unsafe { std::slice::from_raw_parts(self.words.as_ptr(), self.seg_total * per) };
            &all[seg as usize * per + at / 8]
        }
    }

    /// Start of segment `seg` (validated, < total).
    #[inline]
    pub(crate) fn segment_ptr(&self, seg: u32) -> *mut u8 {
        assert!((seg as usize) < self.seg_total);
        // SAFETY: seg < N, so the offset stays inside the segment area.
        unsafe {
            self.segments
                .as_ptr()
                .add(seg as usize * self.segment_size())
        }
    }

    /// Writes a fresh header (creator only, before anyone else can see the region): every
    /// segment starts free, in the return ring, in order.
    pub(crate) fn init_header(&self, creator_pid: u32) {
        use crate::protocol::abi::{Identity, MAGIC};
        let id = Identity {
            magic: MAGIC,
            segment_size: self.geometry.segment_size,
            segment_count: self.geometry.segment_count,
            total_size: self.geometry.region_size() as u64,
            creator_pid,
        };
        self.header()
            .init(id, self.ret_slots(), 0..self.n() as u32, true);
    }
}

impl Shared {
    #[cfg_attr(shmflow_loom, allow(dead_code))]
    pub(crate) fn backing(&self) -> &Backing {
        &self.backing
    }

    /// The region's doorbells held by this process.
    #[cfg(not(shmflow_loom))]
    pub(crate) fn bells(&self) -> Option<&std::sync::Arc<Bells>> {
        match &self.backing {
            Backing::Mapped(m) => Some(&m.bells),
        }
    }

    /// The doorbell of the consumer's park word, if this process holds it.
    #[inline]
    pub(crate) fn consumer_bell(&self) -> Option<&crate::region::os::Bell> {
        #[cfg(not(shmflow_loom))]
        match &self.backing {
            Backing::Mapped(m) => m.bells.consumer.as_ref(),
        }
        #[cfg(shmflow_loom)]
        self.heap_bells.as_ref().map(|b| &b.consumer)
    }

    /// The doorbell of this channel's producer park word, if this process holds it.
    #[inline]
    pub(crate) fn producer_bell(&self) -> Option<&crate::region::os::Bell> {
        #[cfg(not(shmflow_loom))]
        match &self.backing {
            Backing::Mapped(m) => m.bells.producer(self.gate.as_ref().map_or(0, |g| g.index)),
        }
        #[cfg(shmflow_loom)]
        self.heap_bells.as_ref().and_then(|b| {
            b.producers
                .get(self.gate.as_ref().map_or(0, |g| g.index) as usize)
        })
    }
}

impl Shared {
    /// The data ring (producer → consumer).
    pub(crate) fn data_ring(&self) -> crate::protocol::ring::RingRef<'_> {
        let h = self.header();
        let slots = self.data_slots();
        let (head, tail) = crate::protocol::ring::data_cursors(h);
        crate::protocol::ring::RingRef {
            slots,
            head,
            tail,
            limit: self.seg_total as u64,
            region: &self.name,
            name: "data ring",
        }
    }

    /// The return ring (consumer → producer).
    pub(crate) fn return_ring(&self) -> crate::protocol::ring::RingRef<'_> {
        let h = self.header();
        let slots = self.ret_slots();
        let (head, tail) = crate::protocol::ring::return_cursors(h);
        crate::protocol::ring::RingRef {
            slots,
            head,
            tail,
            limit: self.seg_total as u64,
            region: &self.name,
            name: "return ring",
        }
    }
}

/// Attaches `end` (FREE → ATTACHED), or says who is in the way.
pub(crate) fn attach(
    shared: &Shared,
    end: crate::error::End,
) -> Result<(), crate::error::OpenError> {
    use crate::protocol::abi::{END_ATTACHED, END_DETACHED, END_FAILED, END_LOST};
    let st = shared.header().end(end);
    match st.attach(std::process::id()) {
        Ok(()) => Ok(()),
        Err(END_ATTACHED) => Err(crate::error::OpenError::AlreadyAttached {
            region: shared.name.clone(),
            end,
            pid: st.pid(),
        }),
        Err(END_DETACHED | END_FAILED | END_LOST) => Err(crate::error::OpenError::EndDetached {
            region: shared.name.clone(),
            end,
        }),
        Err(other) => Err(crate::error::OpenError::corrupt(
            &shared.name,
            "end attach state",
            "0 to 4".into(),
            other as u64,
        )),
    }
}

/// An end that attached and then found the region unusable (its cursors are not those of a
/// fresh end) gives the end up as detached, so that it is never left ATTACHED with no live
/// lock behind it (which the next opener would take for a dead process).
pub(crate) fn give_up_attach(shared: &Shared, end: crate::error::End) {
    shared
        .header()
        .end(end)
        .leave(crate::protocol::ends::Leave::Clean);
}

/// Fills in the pid of the end that holds a liveness lock we could not take.
#[cfg(not(shmflow_loom))]
fn with_pid(e: crate::error::OpenError, shared: &Shared) -> crate::error::OpenError {
    match e {
        crate::error::OpenError::AlreadyAttached { region, end, .. } => {
            let pid = shared.header().end(end).pid();
            crate::error::OpenError::AlreadyAttached { region, end, pid }
        }
        other => other,
    }
}

#[cfg(not(shmflow_loom))]
impl Shared {
    /// The region's descriptor.
    pub(crate) fn fd(&self) -> &std::os::fd::OwnedFd {
        match &self.backing {
            Backing::Mapped(m) => m.fd(),
        }
    }
}

/// Attaches `end`: takes its liveness lock (unless the creator already holds it) and then moves
/// its state to ATTACHED — lock first, so a peer that sees ATTACHED can trust the lock. Under
/// loom there is no lock and no liveness.
pub(crate) fn attach_end(
    shared: &Shared,
    end: crate::error::End,
    lock: Option<std::sync::Arc<crate::region::liveness::EndLock>>,
) -> Result<Option<crate::region::liveness::Liveness>, crate::error::OpenError> {
    let channel = shared.gate.as_ref().map(|g| g.index);
    #[cfg(not(shmflow_loom))]
    let lock = Some(match lock {
        Some(l) => l,
        None => std::sync::Arc::new(
            crate::region::liveness::EndLock::acquire(
                shared.fd(),
                crate::region::liveness::lock_byte(channel, end),
                end,
                &shared.name,
            )
            .map_err(|e| with_pid(e, shared))?,
        ),
    });
    match attach(shared, end) {
        // We hold the end's liveness lock, so the process that marked it attached is gone:
        // a dead end, never taken for a live one (nor taken over: its position died with it).
        #[cfg(not(shmflow_loom))]
        Err(crate::error::OpenError::AlreadyAttached { region, end, pid }) => {
            return Err(crate::error::OpenError::Stale {
                region,
                dead: Some(crate::error::DeadEnd { end, pid, channel }),
            })
        }
        Err(e) => return Err(e),
        Ok(()) => {}
    }
    Ok(lock.map(|l| crate::region::liveness::Liveness::new(l, end, channel)))
}

/// Writes a fresh gate (creator only, before anyone else can see it): every channel's return
/// ring holds its exclusive segments; the floating ones stay with the consumer.
pub(crate) fn init_gate(
    gate: &crate::protocol::abi::GateHeader,
    chans: &[crate::sync::Arc<Shared>],
    gg: GateGeometry,
    pid: u32,
) {
    use crate::protocol::abi::{Identity, GATE_MAGIC};
    let id = Identity {
        magic: GATE_MAGIC,
        segment_size: gg.segment_size,
        segment_count: gg.ring_cap() as u32,
        total_size: gg.region_size() as u64,
        creator_pid: pid,
    };
    for (c, ch) in chans.iter().enumerate() {
        ch.header()
            .init(id, ch.ret_slots(), gg.exclusive_range(c as u32), false);
    }
    gate.init(gg, pid);
}
