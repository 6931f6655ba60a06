//! Waiting for the next frame: the wait strategies, the network link's readiness and the
//! liveness looks, and the pace that tells a streaming writer from a sparse one.

#[allow(unused_imports)]
use super::*;

impl Consumer {
    /// The next frame (or, if `S` takes them, a pending priority event), waiting as
    /// `patience` allows; `Waited::End` at end of stream.
    pub(super) fn wait_frame<P: Patience, S: Seen>(&mut self, patience: P) -> Got<Waited<S>, P> {
        if let Some(seen) = S::TAKE.filter(|_| self.prio_pending()) {
            return Ok(Waited::Priority(seen));
        }
        if let Some(f) = self.poll_frame()? {
            return Ok(Waited::Frame(f));
        }
        // Nothing to read: a good moment to publish what was read so far.
        self.publish_counts();
        let timed = patience.waits();
        // (Not under loom: the spin path is covered by `wait_for`, and the models stay small.)
        #[cfg(not(shmflow_loom))]
        if timed && matches!(self.wait, WaitStrategy::BusyPoll(_)) {
            // Most waits of a busy channel are short: look a few more times before reading
            // the clock (waits shorter than this burst, well under a microsecond, are not
            // counted as idle time).
            for _ in 0..FAST_POLLS {
                crate::sync::spin_loop();
                if let Some(f) = self.poll_frame()? {
                    return Ok(Waited::Frame(f));
                }
            }
        }
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if self.link.is_some() {
            return self.wait_link(patience);
        }
        let pace = self.pace();
        // SAFETY: `self.shared` is an `Arc` that is never replaced while `self` lives, so the
        // region it points to outlives this call; only the closure's `&mut self` is used to
        // change `self`, and it never touches the `Arc`. (Cloning the `Arc` instead would cost
        // two atomic read-modify-writes per wait.)
        let shared: &Shared = unsafe { &*Arc::as_ptr(&self.shared) };
        let h = shared.header();
        // A `try_` look is no wait: neither idle time nor a pace mark.
        let idle = timed.then(|| Waiting::start(figures::consumer_idle(h)));
        // A receiving bridge writes what a socket read brought, a segment at a time, as the
        // network delivers it: after a large batch the next one is a network delivery away,
        // and `Block`'s looks would only burn CPU time the bridge and its peers need (as a
        // direct network end reads blocking at once after a large batch).
        let strategy = match (self.wait, pace) {
            (WaitStrategy::Block, park::Pace::Stream) if figures::fed_by_bridge(h) => {
                WaitStrategy::Park
            }
            (w, _) => w,
        };
        let got = park::wait_for::<Host, _, _, _>(
            shared.consumer_park(),
            strategy,
            patience,
            park::Notifier::Light,
            pace,
            |look| self.poll_wait::<S>(look),
        );
        drop(idle);
        if timed {
            self.wait_mark = self.cur.map(|c| (c.seg, c.rd));
        }
        got
    }

    /// A direct network end's wait: between looks, the link reads from the socket into the
    /// region (and announces credit) instead of parking.
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(super) fn wait_link<P: Patience, S: Seen>(&mut self, patience: P) -> Got<Waited<S>, P> {
        let timed = patience.waits();
        let shared = self.shared.clone();
        let h = shared.header();
        let idle = timed.then(|| Waiting::start(figures::consumer_idle(h)));
        let got = self.wait_link_looks(patience);
        drop(idle);
        if timed {
            self.wait_mark = self.cur.map(|c| (c.seg, c.rd));
        }
        got
    }

    /// [`Consumer::wait_link`] without the idle time and the pace mark.
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(super) fn wait_link_looks<P: Patience, S: Seen>(
        &mut self,
        patience: P,
    ) -> Got<Waited<S>, P> {
        let mut looked = false;
        if patience.waits() {
            // The bounded look of the wait strategy, as a local end's: each look reads the
            // socket without waiting (one system call), so that a reply arriving within the
            // look is taken at once rather than through a wake-up of this thread, which
            // costs tens of microseconds when the sender runs on another CPU of a VM. After a
            // large batch (a streaming sender) `Block` reads blocking at once: the next read
            // brings a batch too, so its wake-up is shared by many records, and looks would
            // only burn CPU time the stream's other side needs.
            let pace = match self.pace() {
                park::Pace::Sparse => park::Pace::SparseSpaced,
                p => p,
            };
            let wait = match (self.wait, pace) {
                (WaitStrategy::Block, park::Pace::Stream) => WaitStrategy::Park,
                (w, _) => w,
            };
            let spun = park::spin_phase::<Host, _, _>(wait, pace, &mut |look| {
                if let Some(w) = self.poll_wait::<S>(look)? {
                    return Ok(Some(w));
                }
                if let Some(l) = &mut self.link {
                    l.fill(Some(Instant::now()));
                }
                self.poll_wait::<S>(Look::Quick)
            })?;
            if let Some(w) = spun {
                return Ok(w);
            }
        }
        loop {
            if let Some(w) = self.poll_wait::<S>(Look::IfDue)? {
                return Ok(w);
            }
            let until = if let Some(e) = patience.immediate() {
                // A `try_` call: one look at what arrived already.
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
                l.fill(until);
            }
        }
    }

    /// What a waiting reader looks at: a frame (or a pending priority event, if `S` takes
    /// them), the end of the stream, or the producer's death once nothing it committed is
    /// left. `None`: nothing yet.
    pub(super) fn poll_wait<S: Seen>(
        &mut self,
        look: Look,
    ) -> Result<Option<Waited<S>>, RecvError> {
        if let Some(seen) = S::TAKE.filter(|_| self.prio_pending()) {
            return Ok(Some(Waited::Priority(seen)));
        }
        if S::SKIP {
            // (Each pop wakes a producer waiting for room in the lane.)
            while self.pop_priority().map_err(RecvError::Corrupt)?.is_some() {}
        }
        if let Some(f) = self.poll_frame()? {
            return Ok(Some(Waited::Frame(f)));
        }
        if self.producer_detached() {
            // Everything sealed before the detach is visible now: look once more.
            return Ok(Some(match self.poll_frame()? {
                Some(f) => Waited::Frame(f),
                None => Waited::End,
            }));
        }
        if let Some(l) = &mut self.liveness {
            if let Err(e) = l.check(self.shared.header(), &self.shared.name, look) {
                // Drain first: whatever it committed before dying is delivered.
                return match self.poll_frame()? {
                    Some(f) => Ok(Some(Waited::Frame(f))),
                    None => Err(e.into()),
                };
            }
        }
        Ok(None)
    }

    /// How the last batch looked: `Stream` if the reader moved on by at least
    /// `STREAM_BYTES`, or to another segment, since its last wait.
    pub(super) fn pace(&self) -> park::Pace {
        match (self.cur, self.wait_mark) {
            (Some(c), Some((seg, rd))) if c.seg == seg && c.rd < rd + STREAM_BYTES => {
                park::Pace::Sparse
            }
            _ => park::Pace::Stream,
        }
    }
}
