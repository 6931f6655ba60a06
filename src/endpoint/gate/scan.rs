//! Choosing the next channel to read: lending floating segments, the round-robin scan with its
//! quantum, the liveness looks at the producers, and waiting (with the alignment timeout's
//! switch) when no channel has anything.

#[allow(unused_imports)]
use super::*;

impl Gate {
    /// Takes back the floating segments channels handed back, then lends to channels that
    /// ask while the pool has some.
    pub(super) fn lend(&mut self) {
        let before = self.pool.free();
        for c in &mut self.chans {
            if let Some(l) = c.lending() {
                for seg in l.take_returned() {
                    self.pool.put(seg);
                }
            }
        }
        // One segment to each channel that asks, round after round, while the pool has some
        // and someone asks (a round that lends nothing ends it).
        'rounds: while self.pool.free() > 0 {
            let mut lent = false;
            for (c, st) in self.chans.iter_mut().zip(&self.state) {
                if !matches!(st, State::Open) || c.backlog() == 0 {
                    continue;
                }
                let Some(seg) = self.pool.take() else {
                    break 'rounds;
                };
                // A channel that turns out corrupt fails when it is read; lending is best
                // effort, and a segment that could not be handed over stays in the pool.
                if c.grant(seg).is_err() {
                    self.pool.put(seg);
                } else {
                    lent = true;
                }
            }
            if !lent {
                break;
            }
        }
        if self.pool.free() != before {
            self.publish_pool();
        }
    }

    /// Looks at every channel once, starting with the one whose turn it is.
    pub(super) fn scan(&mut self) -> Option<Pick> {
        let m = self.chans.len();
        let start = if self.burst < QUANTUM {
            self.rr
        } else {
            self.burst = 0;
            (self.rr + 1) % m
        };
        let mut all_done = true;
        for i in 0..m {
            let c = (start + i) % m;
            if matches!(self.state[c], State::Done | State::Ended | State::Failed) {
                continue;
            }
            all_done = false;
            self.fill_link(c);
            if !self.cp.align.readable(c) {
                // Held by an alignment: its priority lane only (priority events and
                // announcements overtake the data it holds).
                if self.chans[c].prio_waiting() {
                    return Some(Pick::Read(c));
                }
                continue;
            }
            match self.chans[c].ready() {
                Ok(Ready::Message) => {
                    if c != self.rr {
                        self.rr = c;
                        self.burst = 0;
                    }
                    return Some(Pick::Read(c));
                }
                Ok(Ready::Ended) => return Some(Pick::Ended(c)),
                Ok(Ready::Empty) => {
                    // A dead producer's channel, drained: its death is reported once.
                    if let State::Dying(_) = self.state[c] {
                        if let State::Dying(e) = std::mem::replace(&mut self.state[c], State::Done)
                        {
                            return Some(Pick::Dead(c, e));
                        }
                    }
                }
                Err(e) => return Some(Pick::Failed(c, e)),
            }
        }
        if all_done {
            Some(Pick::AllDone)
        } else {
            if self.rr == start {
                // The channel whose turn it was had nothing: the next one's turn.
                self.burst = QUANTUM;
            }
            None
        }
    }

    /// Looks at the producers' locks: a dead one's channel drains, then reports its death.
    pub(super) fn check_producers(&mut self) {
        self.last_check_ns = monotonic_ns();
        for (c, st) in self.chans.iter_mut().zip(self.state.iter_mut()) {
            if matches!(st, State::Open) {
                if let Err(e) = c.check_producer() {
                    *st = State::Dying(e);
                }
            }
        }
    }

    /// What to deliver next, waiting as `patience` allows (a scan fails no call: a channel's
    /// failure is its pick).
    pub(super) fn decide<P: Patience>(&mut self, patience: P) -> Result<Pick, P::Expired> {
        match self.switch_instant() {
            Some(at) => match self.decide_until(park::Sooner {
                inner: patience,
                at,
            }) {
                Ok(p) => Ok(p),
                Err(None) => Ok(Pick::Switch),
                Err(Some(x)) => Err(x),
            },
            None => self.decide_until(patience),
        }
    }

    /// When the alignment in progress switches to unaligned, as an instant, if it can.
    pub(super) fn switch_instant(&self) -> Option<std::time::Instant> {
        let at = self.cp.align.switch_at_ns()?;
        let now = monotonic_ns();
        Some(crate::sync::now() + Duration::from_nanos(at.saturating_sub(now)))
    }

    pub(super) fn decide_until<P: Patience>(&mut self, patience: P) -> Result<Pick, P::Expired> {
        self.lend();
        self.scans = self.scans.wrapping_add(1);
        // (A full pass comes at least every `QUANTUM + 1` receives: while the gate is busy,
        // this reads the clock about every 128 to 1152 receives.)
        if self.scans % 128 == 0
            && monotonic_ns().saturating_sub(self.last_check_ns)
                > crate::protocol::park::CHECK_INTERVAL.as_nanos() as u64
        {
            // Busy with some channels: still notice a dead one within about the interval.
            self.check_producers();
        }
        if let Some(p) = self.scan() {
            return Ok(p);
        }
        let shared = self.shared.clone();
        let gate = shared.gate.as_ref().expect("gate").gate_header();
        // A `try_` look is no wait.
        let idle = patience
            .waits()
            .then(|| Waiting::start(figures::gate_idle(gate)));
        let got = park::wait_for::<Host, _, _, Infallible>(
            shared.consumer_park(),
            self.wait,
            patience,
            park::Notifier::Light,
            // Spaced looks: each reads the frame every producer is writing.
            park::Pace::SparseSpaced,
            |look| Ok(self.poll_pick(look)),
        );
        drop(idle);
        got.map_err(Halt::expired)
    }

    /// What a waiting gate looks at: lends what was asked for, looks at the producers'
    /// liveness when due, and scans the channels.
    pub(super) fn poll_pick(&mut self, look: crate::protocol::park::Look) -> Option<Pick> {
        self.lend();
        let due = || {
            monotonic_ns().saturating_sub(self.last_check_ns)
                > crate::protocol::park::CHECK_INTERVAL.as_nanos() as u64
        };
        if look == crate::protocol::park::Look::Now
            || (look == crate::protocol::park::Look::IfDue && due())
        {
            self.check_producers();
        }
        if look == crate::protocol::park::Look::Now {
            self.mark_links();
        }
        self.scan()
    }

    /// The fast path of a receive: the next record of the channel whose turn it is, when
    /// nothing else needs the gate: the channel's quantum is not used up, it is open, no
    /// channel waits to be settled, no checkpoint holds it or makes its records in-flight
    /// data, no alignment step waits nor times out, and a whole record is committed next in
    /// its segment in hand (what `deliver` would make of it is then a plain `Record`).
    /// Anything else takes the full pass (`decide`, `deliver`), which lends floating
    /// segments, scans every channel and looks at the producers when due: it runs at least
    /// once every `QUANTUM + 1` receives.
    #[inline]
    pub(super) fn fast_pick(&mut self) -> Option<(usize, usize, *const u8)> {
        let c = self.rr;
        if self.burst >= QUANTUM
            || self.to_retire
            || !self.cp.steps.is_empty()
            || !matches!(self.state.get(c), Some(State::Open))
        {
            return None;
        }
        let al = &self.cp.align;
        if al.switch_at_ns().is_some() || !al.readable(c) || al.in_flight(c).is_some() {
            return None;
        }
        // A linked channel's socket is read into its free segments, and credit announced,
        // on every receive, as in the full pass (nothing for a gate without links).
        self.fill_link(c);
        let (len, ptr) = self.chans[c].whole_now()?;
        self.burst += 1;
        Some((c, len, ptr))
    }

    pub(super) fn recv_inner<P: Patience>(
        &mut self,
        patience: P,
    ) -> Result<Option<GateMessage<'_>>, Halt<P::Expired, RecvError>> {
        // (A channel that ended or failed, or in-flight records counted, on the last call
        // are settled first, by the full path.)
        if let Some((c, len, ptr)) = self.fast_pick() {
            // SAFETY: `len` and `ptr` are what `whole_now` of channel `c` just returned, and
            // nothing was read from it since.
            let record = unsafe { self.chans[c].record_at(len, ptr) };
            return Ok(Some(GateMessage::Record {
                channel: c as u32,
                record,
            }));
        }
        self.retire_finished();
        loop {
            if let Some(step) = self.cp.steps.pop_front() {
                return Ok(Some(self.step_message(step)?));
            }
            self.cp.tick();
            if !self.cp.steps.is_empty() {
                continue;
            }
            let pick = self.decide(patience).map_err(Halt::Expired)?;
            let this: *mut Gate = self;
            // SAFETY: `this` is `self`, reborrowed for one call. The borrow ends with the
            // call on every path but the `return`, which returns it for the lifetime of
            // `self`; the compiler cannot see that the `Again` path holds no borrow (a known
            // limit of its borrow checker), so it is reborrowed through a pointer.
            match unsafe { &mut *this }.deliver(pick)? {
                Delivered::Message(m) => return Ok(Some(m)),
                Delivered::AllDone => return Ok(None),
                Delivered::Again => {}
            }
        }
    }
}
