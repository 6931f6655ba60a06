//! The floating pool and its lending, Flink's credit discipline over shared memory.
//!
//! Only the consumer touches the pool. A producer that runs out of segments adds one to its
//! `demand` counter (in its own cursor line) and wakes the gate; the consumer lends while a
//! channel's `demand` exceeds what it has `lent` it, by pushing a floating segment into that
//! channel's return ring — a ring only the consumer writes, so every ring keeps one writer.
//! When a floating segment comes back out of a data ring, the consumer hands it straight back
//! to the same channel if that channel still asks, and otherwise returns it to the pool.
//! `demand - lent` is the channel's backlog: segments asked for and not granted.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::shared::Shared;
use crate::sync::{Arc, AtomicU64, Mutex, Ordering};

/// The consumer's floating pool, shared by the channels of its gate (one thread uses it; the
/// lock only makes the sharing safe to write).
pub(crate) struct Pool {
    /// Floating segments lent to nobody.
    free: Vec<u32>,
    /// Per floating segment: `channel + 1` of the channel holding it, 0 if in the pool.
    owner: Vec<u32>,
    first: u32,
}

impl Pool {
    pub(crate) fn new(floating: Range<u32>) -> Pool {
        Pool {
            free: floating.clone().rev().collect(),
            owner: vec![0; floating.len()],
            first: floating.start,
        }
    }

    fn slot(&self, seg: u32) -> Option<usize> {
        seg.checked_sub(self.first)
            .map(|i| i as usize)
            .filter(|&i| i < self.owner.len())
    }

    /// Takes back every floating segment `channel` holds (its producer is gone).
    pub(crate) fn reclaim_all(&mut self, channel: u32) -> u64 {
        let mut n = 0;
        for i in 0..self.owner.len() {
            if self.owner[i] == channel + 1 {
                self.owner[i] = 0;
                self.free.push(self.first + i as u32);
                n += 1;
            }
        }
        n
    }
}

/// The pool as the gate's channels share it, with a lock-free count of its free segments so
/// that the gate can tell, on every `recv`, whether lending is possible without taking the
/// lock (and without trusting the figure it publishes in shared memory).
pub(crate) struct PoolShared {
    inner: Mutex<Pool>,
    free: AtomicU64,
}

impl PoolShared {
    pub(crate) fn new(pool: Pool) -> PoolShared {
        PoolShared {
            free: AtomicU64::new(pool.free.len() as u64),
            inner: Mutex::new(pool),
        }
    }

    pub(crate) fn lock(&self) -> crate::sync::MutexGuard<'_, Pool> {
        self.inner.lock().unwrap()
    }

    /// Floating segments lent to nobody (kept in step with the pool under its lock).
    pub(crate) fn free(&self) -> u64 {
        // Relaxed: only this process's one gate thread writes and reads it.
        self.free.load(Ordering::Relaxed)
    }

    /// Records the pool's free count, here and in the gate header (for `shmflow stat`).
    fn publish(&self, shared: &Shared, pool: &Pool) {
        let free = pool.free.len() as u64;
        self.free.store(free, Ordering::Relaxed);
        if let Some(m) = &shared.gate {
            // Relaxed: a figure for `shmflow stat`.
            m.gate_header()
                .pool
                .floating_free
                .store(free, Ordering::Relaxed);
        }
    }
}

pub(crate) type SharedPool = Arc<PoolShared>;

/// A gate channel's consumer-side view of lending.
pub(crate) struct GateLink {
    pub(crate) pool: SharedPool,
    pub(crate) channel: u32,
    exclusive: Range<u32>,
    /// Mirrors of the channel header's `lent` and `floating_held` (the header copy is only a
    /// publication; a producer could scribble on it). `lent` counts every grant, a fresh
    /// loan or a segment kept for the channel when it came back.
    lent: u64,
    held: u64,
}

impl GateLink {
    pub(crate) fn new(shared: &Shared, pool: SharedPool) -> GateLink {
        let m = shared.gate.as_ref().expect("a gate channel");
        GateLink {
            pool,
            channel: m.index,
            exclusive: m.geometry.exclusive_range(m.index),
            lent: 0,
            held: 0,
        }
    }

    /// Segments the producer asked for and was not given. The producer's counter is untrusted:
    /// a wild value only makes the gate lend what the pool has.
    pub(crate) fn backlog(&self, shared: &Shared) -> u64 {
        // Acquire: pairs with the producer's Release when it asked.
        let demand = shared.header().prod.demand.load(Ordering::Acquire);
        demand.saturating_sub(self.lent)
    }

    /// Checks that a segment that came out of this channel's data ring is one it may hold.
    pub(crate) fn check_owned(&self, shared: &Shared, seg: u32) -> Result<()> {
        if self.exclusive.contains(&seg) {
            return Ok(());
        }
        let pool = self.pool.lock();
        match pool.slot(seg) {
            Some(i) if pool.owner[i] == self.channel + 1 => Ok(()),
            _ => Err(Error::corrupt(
                &shared.name,
                "segment index in data ring",
                format!(
                    "one of channel {}'s segments {:?} or a floating segment lent to it",
                    self.channel, self.exclusive
                ),
                seg as u64,
            )),
        }
    }

    /// Where a segment the consumer has finished with goes: `Some(seg)` back into this
    /// channel's return ring, `None` if it went back to the pool.
    pub(crate) fn on_release(&mut self, shared: &Shared, seg: u32) -> Option<u32> {
        if self.exclusive.contains(&seg) {
            return Some(seg);
        }
        if self.backlog(shared) > 0 {
            // Still asked for: keep it with the channel, as one more loan.
            self.lent += 1;
            self.publish(shared);
            return Some(seg);
        }
        let mut pool = self.pool.lock();
        if let Some(i) = pool.slot(seg) {
            pool.owner[i] = 0;
            pool.free.push(seg);
        }
        self.held -= 1;
        self.pool.publish(shared, &pool);
        drop(pool);
        self.publish(shared);
        None
    }

    /// A floating segment to lend this channel, if it asks and the pool has one.
    pub(crate) fn take_loan(&mut self, shared: &Shared) -> Option<u32> {
        if self.backlog(shared) == 0 {
            return None;
        }
        let mut pool = self.pool.lock();
        let seg = pool.free.pop()?;
        let i = pool.slot(seg).expect("pool holds floating segments only");
        pool.owner[i] = self.channel + 1;
        self.pool.publish(shared, &pool);
        drop(pool);
        self.lent += 1;
        self.held += 1;
        self.publish(shared);
        Some(seg)
    }

    /// The producer is gone: every floating segment it held goes back to the pool.
    pub(crate) fn reclaim_all(&mut self, shared: &Shared) {
        let mut pool = self.pool.lock();
        self.held -= pool.reclaim_all(self.channel);
        self.pool.publish(shared, &pool);
        drop(pool);
        self.publish(shared);
    }

    fn publish(&self, shared: &Shared) {
        let c = &shared.header().cons;
        // Relaxed: figures for `shmflow stat`, not part of any hand-off.
        c.lent.store(self.lent, Ordering::Relaxed);
        c.floating_held.store(self.held, Ordering::Relaxed);
    }
}
