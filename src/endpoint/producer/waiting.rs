//! Waiting for room: the wait strategies (or a network end's readiness) around a poll, and
//! the liveness looks at the consumer while waiting.

#[allow(unused_imports)]
use super::*;

impl Producer {
    /// Waits until at least `k` segments are free, and the consumer's cap lets a record start
    /// (for `try_`/`_timeout` sends of spanning records, so that they either go whole or not
    /// at all).
    pub(super) fn wait_free<P: Patience>(&mut self, k: u64, patience: P) -> Sent<(), P> {
        let mut last_ready = None;
        self.wait_producer(patience, |p, look| {
            p.poll_free(k, Bound::Capped, &mut last_ready, look)
        })
    }

    /// The producer's wait (for segments, lane room, the cap): parked on its own word, woken
    /// by the consumer's read-modify-write notify, `poll` looking at each wake-up.
    pub(super) fn wait_producer<P: Patience, T, F>(
        &mut self,
        patience: P,
        poll: impl FnMut(&mut Producer, Look) -> Result<Option<T>, F>,
    ) -> Result<T, Halt<P::Expired, F>> {
        self.wait_producer_as(self.wait, patience, poll)
    }

    /// [`Producer::wait_producer`] with the strategy `wait`.
    pub(super) fn wait_producer_as<P: Patience, T, F>(
        &mut self,
        wait: WaitStrategy,
        patience: P,
        mut poll: impl FnMut(&mut Producer, Look) -> Result<Option<T>, F>,
    ) -> Result<T, Halt<P::Expired, F>> {
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if self.link.is_some() {
            return self.wait_link(patience, poll);
        }
        let shared = self.shared.clone();
        park::wait_for::<Host, _, _, F>(
            shared.header().producer_park(),
            wait,
            patience,
            park::Notifier::Rmw,
            park::Pace::Sparse,
            |look| poll(self, look),
        )
    }

    /// A direct network end's wait: between looks, the link reads what the peer sent
    /// (credit frees the segments waiting for it) instead of parking.
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(super) fn wait_link<P: Patience, T, F>(
        &mut self,
        patience: P,
        mut poll: impl FnMut(&mut Producer, Look) -> Result<Option<T>, F>,
    ) -> Result<T, Halt<P::Expired, F>> {
        let mut looked = false;
        loop {
            if let Some(t) = poll(self, Look::IfDue).map_err(Halt::Failed)? {
                return Ok(t);
            }
            let until = if let Some(e) = patience.immediate() {
                // A `try_` call: one look at what the peer sent already.
                if looked {
                    return Err(Halt::Expired(e));
                }
                looked = true;
                Some(Instant::now())
            } else {
                match patience.remaining() {
                    Ok(left) => left.and_then(|d| Instant::now().checked_add(d)),
                    Err(e) => return Err(Halt::Expired(e)),
                }
            };
            if let Some(l) = &mut self.link {
                l.wait(until);
            }
        }
    }

    /// What a producer waiting for `k` free segments looks at (`last_ready`: what the last
    /// look found, `None` at first); `Bound::Capped` when a record is to start in them, so the
    /// consumer's cap must allow it too.
    pub(super) fn poll_free(
        &mut self,
        k: u64,
        bound: Bound,
        last_ready: &mut Option<u64>,
        look: Look,
    ) -> Result<Option<()>, SendError> {
        let ready = self.ret.ready(&self.shared.return_ring())?;
        // Held back by the consumer's cap: wait for it, without asking for more segments.
        let capped = bound == Bound::Capped && self.capped();
        if ready >= k && !capped {
            return Ok(Some(()));
        }
        if !capped {
            if last_ready.is_some_and(|last| ready > last) {
                // The last ask was granted and it is not enough yet: ask again.
                self.supply.got();
            }
            *last_ready = Some(ready);
            self.ask_for_segment();
        }
        if self.consumer_detached() {
            return Err(self.closed_error());
        }
        self.check_peer(look)?;
        Ok(None)
    }

    /// `Err(PeerDead)` if the consumer's process is gone (a syscall: only while waiting).
    pub(super) fn check_peer(&mut self, look: Look) -> Result<(), Lost> {
        let res = match &mut self.liveness {
            Some(l) => l.check(self.shared.header(), &self.shared.name, look),
            None => Ok(()),
        };
        // Only a dead consumer makes the segment in hand worthless; a failed look (a syscall
        // error) leaves it, and any pending abort, for the next call.
        if let Err(Lost::PeerDead(_)) = res {
            self.forget_segment();
        }
        res
    }
}
