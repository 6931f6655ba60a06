//! The alignment state machine, checked against every order in which a gate can meet short
//! scripts of records, barriers, announcements, closed channels and the passing of time.
//!
//! A model channel has a script (records and barriers, in the producer's order); its
//! announcements can be seen at any moment (the priority lane overtakes), in their own order.
//! At each step the explorer tries every choice the gate could face: read the next item of a
//! channel the machine lets it read, see the next announcement of a channel, close a channel
//! (its end, failure or death, at any point), or let time reach the next switch. Along every
//! path an oracle, written from the rules in the module docs and not from the machine, checks:
//!
//! - an aligned release finds every open channel exactly past its barrier (nothing after the
//!   barrier was read, nothing before it left);
//! - after an unaligned release, a record is flagged as that checkpoint's in-flight data
//!   exactly when it precedes its channel's barrier, and only then;
//! - the in-flight data ends only when every open channel is past the barrier;
//! - no id is released twice, released or cancelled ids only grow, and every barrier seen is
//!   accounted for at the end (released, cancelled, or stale when it came);
//! - nothing is stuck: with every channel closed, no checkpoint is left in progress, and a
//!   channel with items left can always be read or time can pass.

use super::*;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Item {
    Record,
    Barrier(u64, Alignment),
}

const T: Duration = Duration::from_nanos(5);

struct Model<'a> {
    scripts: &'a [Vec<Item>],
}

#[derive(Clone)]
struct State {
    al: Aligner,
    now: u64,
    pos: Vec<usize>,
    ann: Vec<usize>,
    open: Vec<bool>,
    /// Oracle: released ids (and how), cancelled ids, ended ids; the unaligned checkpoint
    /// whose in-flight data is being handed out.
    released: Vec<(u64, Released)>,
    cancelled: Vec<u64>,
    ended: Vec<u64>,
    unaligned: Option<u64>,
    /// Every barrier id seen, with whether it was stale when it came.
    seen: Vec<(u64, bool)>,
    records: usize,
}

impl Model<'_> {
    fn barrier_index(&self, c: usize, id: u64) -> Option<usize> {
        self.scripts[c]
            .iter()
            .position(|i| matches!(i, Item::Barrier(b, _) if *b == id))
    }

    fn announcements(&self, c: usize) -> Vec<(u64, Alignment)> {
        self.scripts[c]
            .iter()
            .filter_map(|i| match i {
                Item::Barrier(id, a) if a.announced() => Some((*id, *a)),
                _ => None,
            })
            .collect()
    }

    fn newest_finished(s: &State) -> Option<u64> {
        s.released
            .iter()
            .map(|r| r.0)
            .chain(s.cancelled.iter().copied())
            .max()
    }

    /// A barrier is stale if a newer one was seen already, or its checkpoint (or a newer one)
    /// is finished.
    fn stale(s: &State, id: u64) -> bool {
        s.seen.iter().any(|&(x, _)| x > id) || Self::newest_finished(s).is_some_and(|m| id <= m)
    }

    /// Applies the machine's steps to the oracle, checking each.
    fn steps(&self, s: &mut State, steps: &[Step], path: &[String]) {
        for st in steps {
            match *st {
                Step::Release { id, how, .. } => {
                    assert!(
                        !s.released.iter().any(|r| r.0 == id),
                        "{id} released twice: {path:?}"
                    );
                    if let Some(m) = Self::newest_finished(s) {
                        assert!(id > m, "{id} released after {m}: {path:?}");
                    }
                    if how == Released::Aligned {
                        for c in 0..self.scripts.len() {
                            if s.open[c] {
                                let b = self.barrier_index(c, id).expect("a barrier");
                                assert_eq!(
                                    s.pos[c],
                                    b + 1,
                                    "aligned release of {id}: channel {c} not exactly past \
                                     its barrier: {path:?}"
                                );
                            }
                        }
                    } else {
                        s.unaligned = Some(id);
                    }
                    s.released.push((id, how));
                }
                Step::Cancelled { id } => {
                    assert!(!s.cancelled.contains(&id), "{id} cancelled twice: {path:?}");
                    assert!(
                        !s.ended.contains(&id),
                        "{id} cancelled after its end: {path:?}"
                    );
                    if s.released.iter().any(|r| r.0 == id) {
                        assert_eq!(
                            s.unaligned,
                            Some(id),
                            "only an unfinished unaligned checkpoint is cancelled after its \
                             release: {path:?}"
                        );
                    }
                    if s.unaligned == Some(id) {
                        s.unaligned = None;
                    }
                    s.cancelled.push(id);
                }
                Step::InFlightEnd { id } => {
                    assert_eq!(
                        s.unaligned,
                        Some(id),
                        "an end without its release: {path:?}"
                    );
                    for c in 0..self.scripts.len() {
                        if s.open[c] {
                            let b = self.barrier_index(c, id).expect("a barrier");
                            assert!(
                                s.pos[c] > b,
                                "{id} ended before channel {c}'s barrier: {path:?}"
                            );
                        }
                    }
                    s.ended.push(id);
                    s.unaligned = None;
                }
                Step::Backwards { .. } => panic!("scripts have increasing ids: {path:?}"),
            }
        }
    }

    fn explore(&self, s: State, path: &mut Vec<String>, paths: &mut u64) {
        let n = self.scripts.len();
        // Nothing stuck: while a channel has items left, the gate can read one, see an
        // announcement, or wait for the switch (closing a channel is no way forward).
        let left = (0..n).any(|c| s.open[c] && s.pos[c] < self.scripts[c].len());
        if left {
            let readable =
                (0..n).any(|c| s.open[c] && s.pos[c] < self.scripts[c].len() && s.al.readable(c));
            let announcing = (0..n).any(|c| s.open[c] && s.ann[c] < self.announcements(c).len());
            let switching = s.al.switch_at_ns().is_some_and(|at| at > s.now);
            assert!(readable || announcing || switching, "stuck: {path:?}");
        }
        let mut moved = false;
        for c in 0..n {
            // Read the next item of a channel the machine lets the gate read.
            if s.open[c] && s.pos[c] < self.scripts[c].len() && s.al.readable(c) {
                moved = true;
                let mut t = s.clone();
                let item = self.scripts[c][t.pos[c]];
                t.now += 1;
                let mut out = Vec::new();
                match item {
                    Item::Record => {
                        let flag = t.al.in_flight(c);
                        let expected = t
                            .unaligned
                            .filter(|&u| self.barrier_index(c, u).is_none_or(|b| t.pos[c] < b));
                        path.push(format!("r{c}"));
                        assert_eq!(flag, expected, "in-flight flag: {path:?}");
                        t.records += 1;
                        t.pos[c] += 1;
                    }
                    Item::Barrier(id, alignment) => {
                        path.push(format!("b{c}:{id}"));
                        let stale = Self::stale(&t, id);
                        t.seen.push((id, stale));
                        t.pos[c] += 1;
                        let b = Seen {
                            id,
                            emitted_ns: 0,
                            alignment,
                        };
                        t.al.barrier(c, b, t.now, &mut out);
                    }
                }
                self.steps(&mut t, &out, path);
                self.explore(t, path, paths);
                path.pop();
            }
            // See the next announcement.
            let anns = self.announcements(c);
            if s.open[c] && s.ann[c] < anns.len() {
                moved = true;
                let mut t = s.clone();
                let (id, alignment) = anns[t.ann[c]];
                t.ann[c] += 1;
                path.push(format!("a{c}:{id}"));
                let stale = Self::stale(&t, id);
                t.seen.push((id, stale));
                let mut out = Vec::new();
                let b = Seen {
                    id,
                    emitted_ns: 0,
                    alignment,
                };
                t.al.announcement(c, b, t.now, &mut out);
                self.steps(&mut t, &out, path);
                self.explore(t, path, paths);
                path.pop();
            }
            // Close it (its end, failure or death), once, at any point.
            if s.open[c] {
                moved = true;
                let mut t = s.clone();
                t.open[c] = false;
                path.push(format!("x{c}"));
                let mut out = Vec::new();
                t.al.closed(c, t.now, &mut out);
                self.steps(&mut t, &out, path);
                self.explore(t, path, paths);
                path.pop();
            }
        }
        // Let time reach the switch.
        if let Some(at) = s.al.switch_at_ns() {
            if at > s.now {
                moved = true;
                let mut t = s.clone();
                t.now = at;
                path.push(format!("t{at}"));
                let mut out = Vec::new();
                t.al.tick(t.now, &mut out);
                self.steps(&mut t, &out, path);
                self.explore(t, path, paths);
                path.pop();
            }
        }
        if !moved {
            // Every channel is closed: nothing may be left in progress, and every barrier
            // seen is accounted for.
            assert!(s.open.iter().all(|o| !o), "stuck: {path:?}");
            assert!(s.al.current().is_none(), "left in progress: {path:?}");
            for &(id, stale) in &s.seen {
                let done = s.released.iter().any(|r| r.0 == id) || s.cancelled.contains(&id);
                assert!(
                    done || stale,
                    "barrier {id} vanished: neither released, cancelled nor stale: {path:?}"
                );
            }
            *paths += 1;
        }
    }

    fn run(scripts: &[Vec<Item>]) -> u64 {
        let n = scripts.len();
        let m = Model { scripts };
        let s = State {
            al: Aligner::new(n),
            now: 0,
            pos: vec![0; n],
            ann: vec![0; n],
            open: vec![true; n],
            released: Vec::new(),
            cancelled: Vec::new(),
            ended: Vec::new(),
            unaligned: None,
            seen: Vec::new(),
            records: 0,
        };
        let mut paths = 0;
        m.explore(s, &mut Vec::new(), &mut paths);
        paths
    }
}

use Item::{Barrier as B, Record as R};

fn two(a: Alignment, b: Alignment) -> Vec<Vec<Item>> {
    vec![vec![R, B(1, a), R, B(2, b)], vec![R, B(1, a), R, B(2, b)]]
}

#[test]
fn aligned_barriers_hold_each_channel_until_all_arrived() {
    let paths = Model::run(&two(Alignment::Aligned, Alignment::Aligned));
    assert!(paths > 100, "{paths}");
}

#[test]
fn unaligned_barriers_hand_back_what_they_overtook_exactly_once() {
    let paths = Model::run(&two(Alignment::Unaligned, Alignment::Unaligned));
    assert!(paths > 100, "{paths}");
}

#[test]
fn an_alignment_timeout_switches_to_unaligned() {
    let paths = Model::run(&two(
        Alignment::AlignedWithTimeout(T),
        Alignment::AlignedWithTimeout(T),
    ));
    assert!(paths > 100, "{paths}");
}

#[test]
fn mixed_modes_and_a_newer_barrier_cancel_cleanly() {
    // Channel 1 skips checkpoint 1 (its barrier 2 cancels 1), with mixed modes.
    let scripts = vec![
        vec![
            R,
            B(1, Alignment::Aligned),
            R,
            B(2, Alignment::Unaligned),
            R,
        ],
        vec![R, B(2, Alignment::Unaligned), R],
    ];
    Model::run(&scripts);
    // Three channels: one skips checkpoint 1, whose alignment may also time out.
    let scripts = vec![
        vec![
            B(1, Alignment::AlignedWithTimeout(T)),
            R,
            B(3, Alignment::Aligned),
        ],
        vec![B(2, Alignment::Unaligned), B(3, Alignment::Aligned)],
        vec![
            B(1, Alignment::AlignedWithTimeout(T)),
            B(3, Alignment::Aligned),
        ],
    ];
    assert!(Model::run(&scripts) > 1000);
}

#[test]
fn a_backwards_id_is_the_channel_s_protocol_error() {
    let mut al = Aligner::new(2);
    let mut out = Vec::new();
    let b = |id| Seen {
        id,
        emitted_ns: 0,
        alignment: Alignment::Aligned,
    };
    al.barrier(0, b(5), 1, &mut out);
    al.barrier(0, b(5), 2, &mut out);
    assert_eq!(
        out,
        [Step::Backwards {
            channel: 0,
            found: 5,
            least: 6
        }]
    );
    out.clear();
    // Another channel's older barrier is stale, not an error: checkpoint 5 is in progress.
    al.barrier(1, b(4), 3, &mut out);
    assert!(out.is_empty());
    assert!(!al.readable(0) && al.readable(1));
    al.barrier(1, b(5), 4, &mut out);
    assert_eq!(
        out,
        [Step::Release {
            id: 5,
            how: Released::Aligned,
            started_ns: 1,
            emitted_ns: 0,
            released_ns: 4,
        }]
    );
    out.clear();
    let u = Seen {
        id: 7,
        emitted_ns: 0,
        alignment: Alignment::Unaligned,
    };
    al.announcement(1, u, 5, &mut out);
    al.announcement(1, u, 6, &mut out);
    assert_eq!(
        out,
        [
            Step::Release {
                id: 7,
                how: Released::Unaligned { timed_out: false },
                started_ns: 5,
                emitted_ns: 0,
                released_ns: 5,
            },
            Step::Backwards {
                channel: 1,
                found: 7,
                least: 8
            }
        ]
    );
}
