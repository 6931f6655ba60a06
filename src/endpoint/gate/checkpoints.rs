//! The gate's side of checkpoint barriers: the aligner fed with every channel's barriers,
//! announcements and ends, and the steps it yields for the gate to hand out.

#[allow(unused_imports)]
use super::*;

/// The gate's checkpoint state: the alignment, what it said that the caller has not been told
/// yet, and what a release reports.
pub(super) struct Checkpoints {
    pub(super) align: align::Aligner,
    /// Oldest first.
    pub(super) steps: std::collections::VecDeque<align::Step>,
    pub(super) scratch: Vec<align::Step>,
    /// The payload of the newest checkpoint seen (its id), for its release.
    pub(super) payload: Option<(u64, Vec<u8>)>,
    /// The channels held when the last checkpoint was released (and a buffer for the next).
    pub(super) held_at_release: Vec<usize>,
    pub(super) held_scratch: Vec<usize>,
    /// In-flight records and bytes handed out per channel, not yet published.
    pub(super) inflight: Vec<(u64, u64)>,
    /// Per channel, its last in-band barrier: id, when the gate read it, when it was sent.
    pub(super) arrivals: Vec<Option<(u64, u64, u64)>>,
}

impl Checkpoints {
    pub(super) fn new(channels: usize) -> Checkpoints {
        Checkpoints {
            align: align::Aligner::new(channels),
            steps: std::collections::VecDeque::new(),
            scratch: Vec::new(),
            payload: None,
            held_at_release: Vec::new(),
            held_scratch: Vec::new(),
            inflight: vec![(0, 0); channels],
            arrivals: vec![None; channels],
        }
    }

    /// Runs one input through the alignment and queues what it says.
    pub(super) fn input(
        &mut self,
        f: impl FnOnce(&mut align::Aligner, u64, &mut Vec<align::Step>),
    ) {
        let mut out = std::mem::take(&mut self.scratch);
        let mut held = std::mem::take(&mut self.held_scratch);
        self.align.held_into(&mut held);
        f(&mut self.align, monotonic_ns(), &mut out);
        if out.iter().any(|s| matches!(s, align::Step::Release { .. })) {
            std::mem::swap(&mut self.held_at_release, &mut held);
        }
        self.held_scratch = held;
        self.steps.extend(out.drain(..));
        self.scratch = out;
    }

    /// Channel `c`'s barrier (in band) or announcement (`b.priority`).
    pub(super) fn barrier(&mut self, c: usize, b: &Barrier<'_>) {
        match &mut self.payload {
            Some((id, p)) if b.id > *id => {
                *id = b.id;
                p.clear();
                p.extend_from_slice(b.payload);
            }
            Some(_) => {}
            none => *none = Some((b.id, b.payload.to_vec())),
        }
        let seen = align::Seen {
            id: b.id,
            emitted_ns: b.emitted_ns,
            alignment: b.alignment,
        };
        if b.priority {
            self.input(|al, now, out| al.announcement(c, seen, now, out));
        } else {
            self.arrivals[c] = Some((b.id, monotonic_ns(), b.emitted_ns));
            self.input(|al, now, out| al.barrier(c, seen, now, out));
        }
    }

    /// Channel `c` ended, failed or died.
    pub(super) fn closed(&mut self, c: usize) {
        self.input(|al, now, out| al.closed(c, now, out));
    }

    /// Lets the alignment see the clock: a timeout that passed switches it.
    pub(super) fn tick(&mut self) {
        if self.align.switch_at_ns().is_some() {
            self.input(|al, now, out| al.tick(now, out));
        }
    }
}
