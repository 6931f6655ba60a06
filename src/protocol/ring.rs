//! A lock-free single-producer single-consumer ring of segment indices.
//!
//! Both rings of a channel (data: producer → consumer, return: consumer → producer) are this
//! type. Cursors are monotonic `u64` counters (they never wrap in practice); slot `i % cap`
//! holds the value pushed at position `i`. Each side keeps its own cursor locally — the copy in
//! shared memory is only a publication for the peer, never read back — and caches the peer's
//! cursor so that the common case touches no line the peer writes.
//!
//! The capacity equals the number of segments and every segment is in exactly one place, so a
//! push never finds the ring full; if it does, the peer has put a segment in two places and the
//! push fails with [`CorruptError`] instead of overwriting.

use crate::error::{corrupt, CorruptError};

/// What a broken cursor or slot is.
type Result<T> = std::result::Result<T, Box<CorruptError>>;
use crate::protocol::abi::Header;
use crate::sync::{AtomicU64, Ordering};

/// The shared parts of one ring.
pub(crate) struct RingRef<'a> {
    pub slots: &'a [AtomicU64],
    /// Written by the popping side.
    pub head: &'a AtomicU64,
    /// Written by the pushing side.
    pub tail: &'a AtomicU64,
    /// Values must be below this (the segment count).
    pub limit: u64,
    /// For errors: which region, which ring.
    pub region: &'a str,
    pub name: &'static str,
}

/// The cursors of a channel's data ring (producer → consumer) in `h`: its head, written by
/// the consumer, and its tail, written by the producer (for a [`RingRef`]).
#[inline]
pub(crate) fn data_cursors(h: &Header) -> (&AtomicU64, &AtomicU64) {
    (&h.cons.data_head, &h.prod.data_tail)
}

/// The cursors of a channel's return ring (consumer → producer) in `h`: its head, written by
/// the producer, and its tail, written by the consumer (for a [`RingRef`]).
#[inline]
pub(crate) fn return_cursors(h: &Header) -> (&AtomicU64, &AtomicU64) {
    (&h.prod.ret_head, &h.cons.ret_tail)
}

/// The pushing side's private state.
#[derive(Debug)]
pub(crate) struct RingTx {
    tail: u64,
    head_cache: u64,
}

/// The popping side's private state.
#[derive(Debug)]
pub(crate) struct RingRx {
    head: u64,
    tail_cache: u64,
}

impl RingTx {
    /// A pushing side whose ring already holds `tail - head` values.
    pub(crate) fn new(head: u64, tail: u64) -> Self {
        RingTx {
            tail,
            head_cache: head,
        }
    }

    /// Values pushed so far (the private tail).
    #[cfg_attr(shmflow_loom, allow(dead_code))]
    pub(crate) fn pushed(&self) -> u64 {
        self.tail
    }

    /// Pushes `value`. A full ring is corruption: every segment is in one place, so a ring
    /// sized for all of them never fills.
    pub(crate) fn push(&mut self, ring: &RingRef<'_>, value: u32) -> Result<()> {
        if self.try_push(ring, value)? {
            return Ok(());
        }
        let cap = ring.slots.len() as u64;
        Err(corrupt(
            ring.region,
            ring.name,
            format!("a free slot: a ring of {cap} never fills when every segment is in one place"),
            cap,
        ))
    }

    /// Pushes `value` if the ring has room (`Ok(false)`: full); a head that makes no sense
    /// is corruption.
    pub(crate) fn try_push(&mut self, ring: &RingRef<'_>, value: u32) -> Result<bool> {
        let cap = ring.slots.len() as u64;
        if self.tail - self.head_cache >= cap {
            // Acquire: the peer's read of the slot we are about to overwrite happened before.
            let head = ring.head.load(Ordering::Acquire);
            let used = self.tail.wrapping_sub(head);
            if used > cap || head < self.head_cache {
                return Err(corrupt(
                    ring.region,
                    ring.name,
                    format!("a head between {} and {}", self.head_cache, self.tail),
                    head,
                ));
            }
            self.head_cache = head;
            if used == cap {
                return Ok(false);
            }
        }
        ring.slots[(self.tail % cap) as usize].store(value as u64, Ordering::Relaxed);
        self.tail += 1;
        // Release: the slot (and whatever the value hands over) is visible before the cursor.
        #[cfg(not(shmflow_broken = "ring_relaxed"))]
        ring.tail.store(self.tail, Ordering::Release);
        #[cfg(shmflow_broken = "ring_relaxed")]
        ring.tail.store(self.tail, Ordering::Relaxed);
        Ok(true)
    }
}

impl RingRx {
    pub(crate) fn new(head: u64, tail: u64) -> Self {
        RingRx {
            head,
            tail_cache: tail,
        }
    }

    /// Values ready to pop (reads the peer's cursor, validates it, caches it).
    pub(crate) fn ready(&mut self, ring: &RingRef<'_>) -> Result<u64> {
        let cap = ring.slots.len() as u64;
        // Acquire: pairs with the Release in `push`, so the slot is visible.
        let tail = ring.tail.load(Ordering::Acquire);
        let ready = tail.wrapping_sub(self.head);
        if ready > cap || tail < self.tail_cache {
            return Err(corrupt(
                ring.region,
                ring.name,
                format!(
                    "a tail between {} and {}",
                    self.tail_cache.max(self.head),
                    self.head + cap
                ),
                tail,
            ));
        }
        self.tail_cache = tail;
        Ok(ready)
    }

    pub(crate) fn pop(&mut self, ring: &RingRef<'_>) -> Result<Option<u32>> {
        if self.head == self.tail_cache && self.ready(ring)? == 0 {
            return Ok(None);
        }
        let cap = ring.slots.len() as u64;
        let value = ring.slots[(self.head % cap) as usize].load(Ordering::Relaxed);
        if value >= ring.limit {
            return Err(corrupt(
                ring.region,
                ring.name,
                format!("a segment index below {}", ring.limit),
                value,
            ));
        }
        self.head += 1;
        // Release: our read of the slot happens before the peer may overwrite it.
        ring.head.store(self.head, Ordering::Release);
        Ok(Some(value as u32))
    }
}

/// The ring cursors an end finds in the header when it attaches: the rule of which cursors a
/// fresh region has, for each end.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cursors {
    data_head: u64,
    data_tail: u64,
    ret_head: u64,
    ret_tail: u64,
}

impl Cursors {
    /// Reads the four cursors. Acquire each: pairs with the Release stores of the side that
    /// moved them last (the creator, which filled the return ring).
    pub(crate) fn at_attach(h: &Header) -> Cursors {
        Cursors {
            data_head: h.cons.data_head.load(Ordering::Acquire),
            data_tail: h.prod.data_tail.load(Ordering::Acquire),
            ret_head: h.prod.ret_head.load(Ordering::Acquire),
            ret_tail: h.cons.ret_tail.load(Ordering::Acquire),
        }
    }

    /// The producer's two rings, if these are the cursors of a fresh region of `n` segments
    /// (a producer cannot take over a half-used stream); else the cursor value found wrong.
    pub(crate) fn producer_rings(&self, n: u64) -> std::result::Result<(RingTx, RingRx), u64> {
        let c = self;
        if c.data_tail != 0 || c.ret_head != 0 || c.ret_tail > n || c.data_head != 0 {
            return Err(c.data_tail | c.ret_head);
        }
        Ok((
            RingTx::new(c.data_head, c.data_tail),
            RingRx::new(c.ret_head, c.ret_tail),
        ))
    }

    /// The consumer's two rings, if nothing was taken yet and the return ring holds the
    /// `free` segments it starts with; else the cursor value found wrong.
    pub(crate) fn consumer_rings(&self, free: u64) -> std::result::Result<(RingRx, RingTx), u64> {
        let c = self;
        if c.data_head != 0 || c.ret_tail != free || c.ret_head > free {
            return Err(c.data_head.max(c.ret_tail));
        }
        Ok((RingRx::new(0, 0), RingTx::new(c.ret_head, c.ret_tail)))
    }
}

#[cfg(all(test, not(shmflow_loom)))]
mod tests {
    use super::*;

    struct Owned {
        slots: Vec<AtomicU64>,
        head: AtomicU64,
        tail: AtomicU64,
    }

    fn owned(cap: usize) -> Owned {
        Owned {
            slots: (0..cap).map(|_| AtomicU64::new(0)).collect(),
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
        }
    }

    fn r(o: &Owned) -> RingRef<'_> {
        RingRef {
            slots: &o.slots,
            head: &o.head,
            tail: &o.tail,
            limit: 100,
            region: "test",
            name: "ring",
        }
    }

    #[test]
    fn fifo_across_many_wraps() {
        let o = owned(3);
        let (mut tx, mut rx) = (RingTx::new(0, 0), RingRx::new(0, 0));
        let mut next_out = 0;
        for i in 0..50u32 {
            tx.push(&r(&o), i % 100).unwrap();
            if i % 3 == 2 {
                while let Some(v) = rx.pop(&r(&o)).unwrap() {
                    assert_eq!(v, next_out % 100);
                    next_out += 1;
                }
            }
        }
        assert_eq!(rx.pop(&r(&o)).unwrap(), Some(48));
        assert_eq!(rx.pop(&r(&o)).unwrap(), Some(49));
        assert_eq!(rx.pop(&r(&o)).unwrap(), None);
    }

    #[test]
    fn full_ring_is_corruption_not_overwrite() {
        let o = owned(2);
        let mut tx = RingTx::new(0, 0);
        tx.push(&r(&o), 1).unwrap();
        tx.push(&r(&o), 2).unwrap();
        assert!(
            tx.push(&r(&o), 3).is_err(),
            "a corrupt cursor or slot is an error"
        );
        assert!(!tx.try_push(&r(&o), 3).unwrap(), "full, said as such");
    }

    #[test]
    fn garbage_from_the_peer_is_an_error() {
        let o = owned(4);
        let mut rx = RingRx::new(0, 0);
        o.tail.store(1000, Ordering::Relaxed); // more than capacity ahead
        assert!(
            rx.pop(&r(&o)).is_err(),
            "a corrupt cursor or slot is an error"
        );
        let o = owned(4);
        let mut rx = RingRx::new(0, 0);
        o.slots[0].store(5000, Ordering::Relaxed); // index out of range
        o.tail.store(1, Ordering::Relaxed);
        assert!(
            rx.pop(&r(&o)).is_err(),
            "a corrupt cursor or slot is an error"
        );
        let o = owned(4);
        let mut tx = RingTx::new(0, 4);
        o.head.store(u64::MAX, Ordering::Relaxed); // head beyond tail
        assert!(
            tx.push(&r(&o), 0).is_err(),
            "a corrupt cursor or slot is an error"
        );
    }
}
