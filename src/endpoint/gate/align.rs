//! The gate's checkpoint alignment: a state machine over what the gate reads from its channels
//! (barriers, their priority announcements, channels that close) and the clock, deciding
//! which channels may be read, which records are a checkpoint's in-flight data, and when a
//! barrier is released. It touches no shared memory: the gate feeds it and acts on what it
//! says, so it is tested on its own (every short sequence of inputs, `tests` below).
//!
//! # The rules
//!
//! A barrier `n` reaches the gate on a channel either in its place among the records (the
//! in-band barrier, always sent) or, for an unaligned barrier or one that may switch, also as
//! a priority announcement that overtakes the records queued before it.
//!
//! - **Aligned.** The first barrier `n` starts checkpoint `n`; a channel whose in-band barrier
//!   `n` has arrived is *held*: the gate reads nothing more from it (its data stays in its
//!   segments; its producer feels the hold as backpressure) until barrier `n` has arrived on
//!   every open channel. Then the barrier is released once and every channel is read again.
//! - **Unaligned.** An announcement with no alignment time releases barrier `n` at once
//!   (snapshot now). From then on, a channel whose in-band barrier `n` has not arrived yet hands
//!   its records out as checkpoint `n`'s in-flight data, each once and in order, until that
//!   barrier arrives; when it has arrived on every open channel, the in-flight data is
//!   complete (`InFlightEnd`). Channels held before the switch are released: what follows their
//!   barrier belongs after the checkpoint.
//! - **The switch.** An aligned barrier sent with an alignment timeout `T` switches to
//!   unaligned, as above, once `T` has passed since its emission (the emitter's monotonic
//!   clock, the same on one machine) while it is still aligning. A blocking `send_barrier`
//!   announces at once, before it waits for room for the barrier itself, so the release waits
//!   at most `T` plus the time to notice, however much data is queued; a `try_` or timed send
//!   announces once it has room for both (so that giving up sends nothing), and an alignment
//!   whose first sight at the gate comes later switches later. Across machines the sender's
//!   clock is not the gate's: a sending time in the gate's future counts from now, and the
//!   timeout (and the start delay) mean little between hosts.
//! - **Closing.** A channel that ends, fails or dies no longer counts: the barrier may be
//!   released (or its in-flight data be complete) without it.
//! - **Newer cancels.** A barrier or announcement with an id above the checkpoint in progress
//!   cancels it (`Cancelled { id }`, once) and starts the newer one. A barrier of an older
//!   checkpoint arriving later is ignored: one that was cancelled or is complete, and one
//!   never begun here because a newer one began first (an unaligned barrier can overtake an
//!   older in-band one): that checkpoint is subsumed by the newer one, as Flink subsumes
//!   checkpoints, and the gate says nothing of it.
//! - **Backwards is a protocol error.** On one channel, in-band barrier ids strictly increase,
//!   and so do announcement ids; an id at or below that channel's last is that channel's
//!   protocol error (the gate closes it, as for any other corruption).

use crate::endpoint::event::{Alignment, Released};

/// What the gate must do (or say) after an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Release barrier `id` to the caller: the gate first saw it at `started_ns`, and its
    /// first barrier or announcement seen was sent at `emitted_ns`.
    Release {
        id: u64,
        how: Released,
        started_ns: u64,
        emitted_ns: u64,
        /// When it was released.
        released_ns: u64,
    },
    /// Tell the caller that checkpoint `id` was abandoned for a newer one.
    Cancelled { id: u64 },
    /// Every in-flight record of checkpoint `id` has been handed out.
    InFlightEnd { id: u64 },
    /// The channel broke the barrier rules: close it as corrupt (the id that came, the
    /// least one allowed).
    Backwards {
        channel: usize,
        found: u64,
        least: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Holding the channels whose barrier arrived; switches at `switch_at_ns` (if any).
    Aligning { switch_at_ns: Option<u64> },
    /// Released; reading the not-yet-arrived channels' records as in-flight data.
    Unaligned,
}

#[derive(Clone, Debug)]
struct Checkpoint {
    id: u64,
    phase: Phase,
    /// Per channel: its in-band barrier `id` has arrived.
    arrived: Vec<bool>,
    /// When the gate first saw it (for the alignment duration).
    started_ns: u64,
    /// The emitter's timestamp of the first barrier or announcement seen.
    emitted_ns: u64,
}

/// The alignment state of a gate of `n` channels.
#[derive(Clone, Debug)]
pub(crate) struct Aligner {
    open: Vec<bool>,
    /// Per channel: the last in-band barrier id, and the last announced id.
    last_barrier: Vec<Option<u64>>,
    last_announced: Vec<Option<u64>>,
    cur: Option<Checkpoint>,
    /// The newest checkpoint id released or cancelled (older barriers are stale).
    newest_done: Option<u64>,
}

/// What one in-band barrier or announcement says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) id: u64,
    pub(crate) emitted_ns: u64,
    pub(crate) alignment: Alignment,
}

impl Aligner {
    pub(crate) fn new(channels: usize) -> Aligner {
        Aligner {
            open: vec![true; channels],
            last_barrier: vec![None; channels],
            last_announced: vec![None; channels],
            cur: None,
            newest_done: None,
        }
    }

    /// May the gate read channel `c`'s records now? (Its priority lane is read either way.)
    #[inline]
    pub(crate) fn readable(&self, c: usize) -> bool {
        match &self.cur {
            Some(k) if matches!(k.phase, Phase::Aligning { .. }) => !k.arrived[c],
            _ => true,
        }
    }

    /// The checkpoint whose in-flight data channel `c`'s records are now, if any.
    #[inline]
    pub(crate) fn in_flight(&self, c: usize) -> Option<u64> {
        match &self.cur {
            Some(k) if k.phase == Phase::Unaligned && !k.arrived[c] && self.open[c] => Some(k.id),
            _ => None,
        }
    }

    /// The checkpoint in progress: its id, when the gate first saw it, and its emission time.
    #[cfg(test)]
    pub(crate) fn current(&self) -> Option<(u64, u64, u64)> {
        self.cur
            .as_ref()
            .map(|k| (k.id, k.started_ns, k.emitted_ns))
    }

    /// Channels held now (aligning, barrier arrived, open), into `out` (cleared first).
    pub(crate) fn held_into(&self, out: &mut Vec<usize>) {
        out.clear();
        if let Some(k) = &self.cur {
            if matches!(k.phase, Phase::Aligning { .. }) {
                out.extend((0..self.open.len()).filter(|&c| k.arrived[c] && self.open[c]));
            }
        }
    }

    /// When the alignment in progress switches to unaligned (monotonic ns), if it can.
    pub(crate) fn switch_at_ns(&self) -> Option<u64> {
        match &self.cur {
            Some(Checkpoint {
                phase: Phase::Aligning { switch_at_ns },
                ..
            }) => *switch_at_ns,
            _ => None,
        }
    }

    /// Channel `c`'s in-band barrier, read at `now_ns`.
    pub(crate) fn barrier(&mut self, c: usize, b: Seen, now_ns: u64, out: &mut Vec<Step>) {
        if !moves_on(&mut self.last_barrier[c], c, b.id, out) {
            return;
        }
        if !self.begin(b, now_ns, out) {
            return;
        }
        let k = self.cur.as_mut().expect("begun");
        k.arrived[c] = true;
        self.settle(now_ns, out);
    }

    /// Channel `c`'s announcement of a barrier that follows in its records, read at `now_ns`.
    pub(crate) fn announcement(&mut self, c: usize, b: Seen, now_ns: u64, out: &mut Vec<Step>) {
        if !moves_on(&mut self.last_announced[c], c, b.id, out) {
            return;
        }
        if !self.begin(b, now_ns, out) {
            return;
        }
        self.settle(now_ns, out);
    }

    /// Channel `c` ended, failed or died: it no longer counts.
    pub(crate) fn closed(&mut self, c: usize, now_ns: u64, out: &mut Vec<Step>) {
        if !std::mem::replace(&mut self.open[c], false) {
            return;
        }
        self.settle(now_ns, out);
    }

    /// Time passed: an alignment whose timeout passed switches.
    pub(crate) fn tick(&mut self, now_ns: u64, out: &mut Vec<Step>) {
        self.settle(now_ns, out);
    }

    /// Makes `b.id` the checkpoint in progress if it is the newest: `false` if it is stale
    /// (to ignore).
    fn begin(&mut self, b: Seen, now_ns: u64, out: &mut Vec<Step>) -> bool {
        if self.newest_done.is_some_and(|d| b.id <= d) {
            return false;
        }
        let switch = match b.alignment {
            Alignment::Aligned => None,
            // From the sender's clock, which is this machine's; one in the future (a clock
            // that is not) counts from now.
            Alignment::AlignedWithTimeout(t) => Some(
                b.emitted_ns
                    .min(now_ns)
                    .saturating_add(t.as_nanos().min(u64::MAX as u128) as u64),
            ),
            Alignment::Unaligned => Some(0),
        };
        match &mut self.cur {
            Some(k) if k.id == b.id => {
                if let Phase::Aligning { switch_at_ns } = &mut k.phase {
                    *switch_at_ns = match (*switch_at_ns, switch) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                true
            }
            Some(k) if k.id > b.id => false,
            cur => {
                if let Some(old) = cur.take() {
                    #[cfg(not(shmflow_broken = "align_silent_cancel"))]
                    out.push(Step::Cancelled { id: old.id });
                    self.newest_done = Some(old.id);
                }
                self.cur = Some(Checkpoint {
                    id: b.id,
                    phase: Phase::Aligning {
                        switch_at_ns: switch,
                    },
                    arrived: vec![false; self.open.len()],
                    started_ns: now_ns,
                    emitted_ns: b.emitted_ns,
                });
                true
            }
        }
    }

    /// Releases, switches or completes the checkpoint in progress as its state allows.
    fn settle(&mut self, now_ns: u64, out: &mut Vec<Step>) {
        let Some(k) = &mut self.cur else { return };
        #[cfg(not(shmflow_broken = "align_release_early"))]
        let all = (0..self.open.len()).all(|c| !self.open[c] || k.arrived[c]);
        // Broken on purpose: released once any open channel's barrier has arrived.
        #[cfg(shmflow_broken = "align_release_early")]
        let all = (0..self.open.len()).any(|c| self.open[c] && k.arrived[c]);
        match k.phase {
            Phase::Aligning { switch_at_ns } => {
                if all {
                    out.push(Step::Release {
                        id: k.id,
                        how: Released::Aligned,
                        started_ns: k.started_ns,
                        emitted_ns: k.emitted_ns,
                        released_ns: now_ns,
                    });
                    self.newest_done = Some(k.id);
                    self.cur = None;
                } else if switch_at_ns.is_some_and(|t| now_ns >= t) {
                    // An announcement with no alignment time is unaligned from the start.
                    let timed_out = switch_at_ns != Some(0);
                    out.push(Step::Release {
                        id: k.id,
                        how: Released::Unaligned { timed_out },
                        started_ns: k.started_ns,
                        emitted_ns: k.emitted_ns,
                        released_ns: now_ns,
                    });
                    #[cfg(not(shmflow_broken = "align_keep_holding"))]
                    {
                        k.phase = Phase::Unaligned;
                    }
                    #[cfg(shmflow_broken = "align_keep_holding")]
                    {
                        k.phase = Phase::Aligning { switch_at_ns: None };
                    }
                }
            }
            Phase::Unaligned => {
                if all {
                    out.push(Step::InFlightEnd { id: k.id });
                    self.newest_done = Some(k.id);
                    self.cur = None;
                }
            }
        }
    }
}

/// Channel `c`'s ids (in-band, or announced) strictly increase: records `id` as its last and
/// says true, or says `Backwards` and false.
fn moves_on(last: &mut Option<u64>, c: usize, id: u64, out: &mut Vec<Step>) -> bool {
    if let Some(l) = *last {
        if id <= l {
            out.push(Step::Backwards {
                channel: c,
                found: id,
                least: l.saturating_add(1),
            });
            return false;
        }
    }
    *last = Some(id);
    true
}

#[cfg(all(test, not(shmflow_loom)))]
mod tests;
