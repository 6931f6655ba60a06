//! Where a channel's segments come from and where they go: supplied by the owner of the
//! channel, so that the producer and consumer cores know nothing of gates. A channel of its own
//! owns every segment of its region ([`Supply::Own`], [`Recycler::Own`]); a channel of a gate
//! also borrows floating segments from its gate's [`Pool`] ([`Supply::Lent`],
//! [`Recycler::Lent`]). An async or a network channel is one more variant here, not another
//! hook inside the cores.
//!
//! Lending is Flink's credit discipline over shared memory. A producer that runs out of
//! segments adds one to its `demand` counter (in its own cursor line) and wakes the gate; the
//! gate lends while a channel's `demand` exceeds what it has `lent` it, by pushing a floating
//! segment into that channel's return ring — a ring only the consumer writes, so every ring
//! keeps one writer. When a floating segment comes back out of the data ring, the channel keeps
//! it if its producer still asks, and otherwise hands it back to the gate, which puts it in the
//! pool. `demand - lent` is the channel's backlog: segments asked for and not granted.
//!
//! The pool belongs to the gate and is used by the gate's one thread: no lock. A channel never
//! touches it; it only lists what it holds and what it gives back.

use std::ops::Range;

use crate::protocol::abi::Header;
use crate::sync::Ordering;

// ----- producer side ---------------------------------------------------------------------------

/// How a producer gets more segments than its return ring holds.
#[derive(Debug)]
pub(crate) enum Supply {
    /// A channel of its own: every segment comes back through the return ring.
    Own,
    /// A channel of a gate: when out of segments, it announces its backlog and the gate may
    /// lend it a floating segment.
    Lent {
        /// Segments asked for so far (monotonic; published in the producer's cursor line).
        demand: u64,
        /// This wait has asked already.
        asked: bool,
    },
}

impl Supply {
    /// A gate channel's supply.
    pub(crate) fn lent() -> Supply {
        Supply::Lent {
            demand: 0,
            asked: false,
        }
    }

    /// Out of segments: asks for one more (once per wait). True if the consumer must be woken
    /// so that its gate looks at the new demand.
    #[inline]
    pub(crate) fn ask(&mut self, h: &Header) -> bool {
        match self {
            Supply::Own => false,
            Supply::Lent { asked: true, .. } => false,
            Supply::Lent { demand, asked } => {
                *asked = true;
                *demand += 1;
                // SYNC POINT: Release, paired with the gate's Acquire in `Lending::backlog`;
                // the caller's wake-up makes sure the gate looks.
                h.prod.demand.store(*demand, Ordering::Release);
                true
            }
        }
    }

    #[cfg_attr(any(not(feature = "net"), shmflow_loom), allow(dead_code))]
    /// Asks for `n` more segments at once (a network bridge announcing its remote sender's
    /// backlog). True if the consumer must be woken so that its gate looks.
    pub(crate) fn ask_more(&mut self, h: &Header, n: u64) -> bool {
        match self {
            Supply::Own => false,
            Supply::Lent { demand, .. } => {
                *demand = demand.saturating_add(n);
                // SYNC POINT: Release, paired with the gate's Acquire in `Lending::backlog`.
                h.prod.demand.store(*demand, Ordering::Release);
                true
            }
        }
    }

    #[cfg_attr(any(not(feature = "net"), shmflow_loom), allow(dead_code))]
    /// Segments asked for so far (0 for a channel of its own).
    pub(crate) fn demand(&self) -> u64 {
        match self {
            Supply::Own => 0,
            Supply::Lent { demand, .. } => *demand,
        }
    }

    #[cfg_attr(any(not(feature = "net"), shmflow_loom), allow(dead_code))]
    /// Segments asked for and not granted yet, as far as the gate's published figure says
    /// (`ConsumerCursors::lent`; 0 for a channel of its own). Relaxed (in `counters::read`): a
    /// figure for statistics, paired with nothing; a wrong value only makes a bridge ask for
    /// too many or too few.
    pub(crate) fn unmet(&self, h: &Header) -> u64 {
        let lent = crate::protocol::counters::read(&h.cons.lent);
        self.demand().saturating_sub(lent)
    }

    /// A segment arrived: the next wait asks again.
    #[inline]
    pub(crate) fn got(&mut self) {
        if let Supply::Lent { asked, .. } = self {
            *asked = false;
        }
    }
}

// ----- consumer side ---------------------------------------------------------------------------

/// Where a consumer's finished segments go and which segment indices its data ring may carry.
#[derive(Debug)]
pub(crate) enum Recycler {
    /// A channel of its own: every index below the segment count is its own (the ring checks
    /// the bound), and every finished segment goes back through the return ring.
    Own,
    /// A channel of a gate.
    Lent(Lending),
}

/// A gate channel's consumer-side view of lending.
#[derive(Debug)]
pub(crate) struct Lending {
    /// The channel's own segments.
    exclusive: Range<u32>,
    /// Floating segments lent to this channel and not yet handed back, sorted. Only the gate
    /// adds to it, at most every floating segment (a producer that announces a wild backlog
    /// gets what the pool has): looked up by binary search.
    held: Vec<u32>,
    /// Floating segments the consumer finished with while its producer did not ask: the gate
    /// puts them back in its pool.
    returned: Vec<u32>,
    /// Grants so far (fresh loans and segments kept on return). Mirrors the header's `lent`,
    /// which is only a publication: a producer could scribble on it.
    lent: u64,
}

/// What [`Recycler::check`] refuses: a segment this channel may not hold.
#[derive(Debug)]
pub(crate) struct NotOwned {
    pub(crate) exclusive: Range<u32>,
}

impl Lending {
    pub(crate) fn new(exclusive: Range<u32>) -> Lending {
        Lending {
            exclusive,
            held: Vec::new(),
            returned: Vec::new(),
            lent: 0,
        }
    }

    /// Segments the producer asked for and was not given. The producer's counter is untrusted:
    /// a wild value only makes the gate lend what its pool has.
    pub(crate) fn backlog(&self, h: &Header) -> u64 {
        // SYNC POINT: Acquire, paired with the producer's Release in `Supply::ask`.
        let demand = h.prod.demand.load(Ordering::Acquire);
        demand.saturating_sub(self.lent)
    }

    /// Records the loan of `seg` (popped from the gate's pool); the caller pushes it into the
    /// channel's return ring.
    pub(crate) fn grant(&mut self, h: &Header, seg: u32) {
        if let Err(i) = self.held.binary_search(&seg) {
            self.held.insert(i, seg);
        }
        self.lent += 1;
        self.publish(h);
    }

    /// Floating segments to put back in the gate's pool.
    pub(crate) fn take_returned(&mut self) -> std::vec::Drain<'_, u32> {
        self.returned.drain(..)
    }

    fn publish(&self, h: &Header) {
        // Relaxed: figures for `shmflow stat`, not part of any hand-off.
        h.cons.lent.store(self.lent, Ordering::Relaxed);
        h.cons
            .floating_held
            .store(self.held.len() as u64, Ordering::Relaxed);
    }
}

impl Recycler {
    /// Checks that a segment that came out of the data ring is one this channel may hold.
    #[inline]
    pub(crate) fn check(&self, seg: u32) -> Result<(), NotOwned> {
        match self {
            Recycler::Own => Ok(()),
            Recycler::Lent(l)
                if l.exclusive.contains(&seg) || l.held.binary_search(&seg).is_ok() =>
            {
                Ok(())
            }
            Recycler::Lent(l) => Err(NotOwned {
                exclusive: l.exclusive.clone(),
            }),
        }
    }

    /// Where a segment the consumer has finished with goes: `Some(seg)` back into this
    /// channel's return ring, `None` if it goes back to the gate.
    #[inline]
    pub(crate) fn release(&mut self, h: &Header, seg: u32) -> Option<u32> {
        let l = match self {
            Recycler::Own => return Some(seg),
            Recycler::Lent(l) => l,
        };
        if l.exclusive.contains(&seg) {
            return Some(seg);
        }
        if l.backlog(h) > 0 {
            // Still asked for: keep it with the channel, as one more grant.
            l.lent += 1;
            l.publish(h);
            return Some(seg);
        }
        if let Ok(i) = l.held.binary_search(&seg) {
            l.held.remove(i);
            l.returned.push(seg);
        }
        l.publish(h);
        None
    }

    /// The producer is gone: every floating segment the channel holds goes back to the gate.
    pub(crate) fn reclaim_all(&mut self, h: &Header) {
        if let Recycler::Lent(l) = self {
            let held = std::mem::take(&mut l.held);
            l.returned.extend(held);
            l.publish(h);
        }
    }

    /// The channel is closed while its producer may still run: the floating segments it
    /// holds are left out of the pool for good (handing them to another channel could let two
    /// producers write one segment).
    pub(crate) fn forget_all(&mut self, h: &Header) {
        if let Recycler::Lent(l) = self {
            l.held.clear();
            l.publish(h);
        }
    }

    /// The gate channel's lending state (`None` for a channel of its own).
    pub(crate) fn lending(&mut self) -> Option<&mut Lending> {
        match self {
            Recycler::Own => None,
            Recycler::Lent(l) => Some(l),
        }
    }
}

/// A gate's floating segments that are lent to nobody. Owned by the gate; one thread.
#[derive(Debug)]
pub(crate) struct Pool {
    free: Vec<u32>,
    floating: Range<u32>,
}

impl Pool {
    pub(crate) fn new(floating: Range<u32>) -> Pool {
        Pool {
            free: floating.clone().rev().collect(),
            floating,
        }
    }

    /// Floating segments lent to nobody.
    pub(crate) fn free(&self) -> usize {
        self.free.len()
    }

    pub(crate) fn take(&mut self) -> Option<u32> {
        self.free.pop()
    }

    /// Takes a segment back. Only floating segments a channel held come here (the channel's
    /// own bookkeeping, not shared memory, says which), so the pool never holds one twice.
    pub(crate) fn put(&mut self, seg: u32) {
        debug_assert!(self.floating.contains(&seg) && !self.free.contains(&seg));
        self.free.push(seg);
    }
}

#[cfg(all(test, not(shmflow_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_lent_supply_asks_once_per_wait_and_publishes_its_demand() {
        let h = Header::default();
        let mut own = Supply::Own;
        assert!(!own.ask(&h) && !own.ask_more(&h, 3) && own.demand() == 0);
        let mut s = Supply::lent();
        assert!(s.ask(&h));
        assert!(!s.ask(&h), "asked already: the gate knows");
        s.got();
        assert!(s.ask(&h), "a segment came: the next wait asks again");
        assert!(s.ask_more(&h, u64::MAX), "a wild backlog saturates");
        assert_eq!(s.demand(), u64::MAX);
        assert_eq!(h.prod.demand.load(Ordering::Relaxed), u64::MAX);
    }

    #[test]
    fn a_gate_channel_holds_its_own_and_what_it_was_lent() {
        let h = Header::default();
        let mut r = Recycler::Lent(Lending::new(0..2));
        assert!(r.check(1).is_ok());
        let e = r.check(5).unwrap_err();
        assert_eq!(e.exclusive, 0..2);
        // The producer asks for two; the gate lends 5 and 6.
        h.prod.demand.store(2, Ordering::Relaxed);
        let l = r.lending().unwrap();
        assert_eq!(l.backlog(&h), 2);
        l.grant(&h, 6);
        l.grant(&h, 5);
        assert_eq!(l.backlog(&h), 0);
        assert!(r.check(5).is_ok() && r.check(6).is_ok());
        assert_eq!(h.cons.floating_held.load(Ordering::Relaxed), 2);
        // Own segments go back to the channel's ring; a floating one back to the gate when
        // nobody asks, or stays as one more grant while the producer asks.
        assert_eq!(r.release(&h, 1), Some(1));
        assert_eq!(r.release(&h, 5), None);
        h.prod.demand.store(3, Ordering::Relaxed);
        assert_eq!(r.release(&h, 6), Some(6), "asked for: kept");
        assert_eq!(h.cons.lent.load(Ordering::Relaxed), 3);
        let back: Vec<u32> = r.lending().unwrap().take_returned().collect();
        assert_eq!(back, [5]);
        assert!(r.check(5).is_err(), "handed back: no longer this channel's");
    }

    #[test]
    fn a_dead_producers_floating_segments_return_and_a_closed_ones_are_kept_out() {
        let h = Header::default();
        let mut r = Recycler::Lent(Lending::new(0..2));
        r.lending().unwrap().grant(&h, 4);
        r.lending().unwrap().grant(&h, 3);
        r.reclaim_all(&h);
        let mut back: Vec<u32> = r.lending().unwrap().take_returned().collect();
        back.sort();
        assert_eq!(back, [3, 4]);
        let mut r = Recycler::Lent(Lending::new(0..2));
        r.lending().unwrap().grant(&h, 4);
        r.forget_all(&h);
        assert_eq!(r.lending().unwrap().take_returned().count(), 0);
        assert_eq!(h.cons.floating_held.load(Ordering::Relaxed), 0);
        assert!(
            Recycler::Own.check(u32::MAX).is_ok(),
            "the ring checks the bound"
        );
    }

    #[test]
    fn the_pool_lends_each_floating_segment_once() {
        let mut p = Pool::new(10..13);
        assert_eq!(p.free(), 3);
        let got: Vec<u32> = std::iter::from_fn(|| p.take()).collect();
        assert_eq!(got, [10, 11, 12]);
        assert_eq!(p.take(), None);
        p.put(11);
        assert_eq!((p.free(), p.take()), (1, Some(11)));
    }
}
