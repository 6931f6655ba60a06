//! Paired trials: each ratio of the report is measured as adjacent short trials of its two
//! sides, A B then B A, once per pair, so that a slow spell of the host falls on both sides
//! of the ratio it spoils; the report takes the median of the per-pair ratios and their spread.

use super::report::RATIOS;

/// A short trial: the measures it gives, and how to take them once.
pub(super) struct Trial<'a> {
    /// The names of the measures `run` returns (some may be missing from a run that failed
    /// part-way, as a delayed link the kernel refused).
    pub(super) gives: Vec<&'static str>,
    /// Whether it runs once per pair (`false`: once in all, in the first pair, for a trial
    /// that pairs its own sides inside or that takes minutes).
    pub(super) every_pair: bool,
    /// Takes the measures once.
    pub(super) run: Box<dyn FnMut() -> Vec<(&'static str, f64)> + 'a>,
}

/// What the trials measured.
pub(super) struct Outcome {
    /// Every value of each measure over all its trials, in the order the trials give them.
    pub(super) measures: Vec<(&'static str, Vec<f64>)>,
    /// The per-pair values of each ratio, as [`RATIOS`] lists them (empty where its two sides
    /// were not measured).
    pub(super) ratios: Vec<Vec<f64>>,
    /// Pairs taken.
    pub(super) pairs: usize,
}

impl Outcome {
    fn add(&mut self, values: &[(&'static str, f64)]) {
        for &(k, v) in values {
            match self.measures.iter_mut().find(|m| m.0 == k) {
                Some(m) => m.1.push(v),
                None => self.measures.push((k, vec![v])),
            }
        }
    }
}

/// The value of measure `k` in one trial's output.
fn get(values: &[(&'static str, f64)], k: &str) -> Option<f64> {
    values.iter().find(|x| x.0 == k).map(|x| x.1)
}

/// The sides of every ratio the trials can measure: (trial of the numerator, trial of the
/// denominator), each pair of trials once, with the ratios it gives.
fn plan(trials: &[Trial]) -> Vec<((usize, usize), Vec<usize>)> {
    let by = |k: &str| trials.iter().position(|t| t.gives.contains(&k));
    let mut plan: Vec<((usize, usize), Vec<usize>)> = Vec::new();
    for (i, r) in RATIOS.iter().enumerate() {
        let (Some(a), Some(b)) = (by(r.num), by(r.den)) else {
            continue;
        };
        match plan.iter_mut().find(|p| p.0 == (a, b)) {
            Some(p) => p.1.push(i),
            None => plan.push(((a, b), vec![i])),
        }
    }
    plan
}

/// Runs `pairs` pairs: in each, every pair of trials that [`plan`] finds, adjacent, the
/// numerator's first in even pairs and the denominator's first in odd ones; then every trial
/// that is the side of no ratio. `progress` prints each pair's start on stderr.
pub(super) fn run(mut trials: Vec<Trial>, pairs: usize, progress: bool) -> Outcome {
    let plan = plan(&trials);
    // The sides of a ratio whose trials both run every pair; a trial that runs once in all
    // is run once and its measures serve every ratio it is a side of.
    let each: Vec<bool> = trials.iter().map(|t| t.every_pair).collect();
    let every_pair = |(a, b): (usize, usize)| each[a] && each[b];
    let mut once: Vec<Option<Vec<(&'static str, f64)>>> = vec![None; trials.len()];
    let mut out = Outcome {
        measures: Vec::new(),
        ratios: vec![Vec::new(); RATIOS.len()],
        pairs,
    };
    // The measures in the trials' order, whatever order the pairs take them in.
    for t in &trials {
        for k in &t.gives {
            out.measures.push((k, Vec::new()));
        }
    }
    for pair in 0..pairs {
        if progress {
            eprintln!("pair {} of {pairs}", pair + 1);
        }
        let mut ran = vec![false; trials.len()];
        for ((a, b), ratios) in &plan {
            let (a, b) = (*a, *b);
            if !every_pair((a, b)) && pair > 0 {
                continue;
            }
            let mut take = |i: usize, out: &mut Outcome| -> Vec<(&'static str, f64)> {
                ran[i] = true;
                if trials[i].every_pair {
                    let v = (trials[i].run)();
                    out.add(&v);
                    v
                } else {
                    once[i]
                        .get_or_insert_with(|| {
                            let v = (trials[i].run)();
                            out.add(&v);
                            v
                        })
                        .clone()
                }
            };
            let (va, vb) = if a == b {
                let v = take(a, &mut out);
                (v.clone(), v)
            } else if pair % 2 == 0 {
                let va = take(a, &mut out);
                (va, take(b, &mut out))
            } else {
                let vb = take(b, &mut out);
                (take(a, &mut out), vb)
            };
            for &i in ratios {
                if let (Some(n), Some(d)) = (get(&va, RATIOS[i].num), get(&vb, RATIOS[i].den)) {
                    out.ratios[i].push(n / d);
                }
            }
        }
        for (i, t) in trials.iter_mut().enumerate() {
            // Every trial runs once per pair (or once in all), as a ratio's side or alone.
            let solo = if t.every_pair {
                !ran[i]
            } else {
                once[i].is_none()
            };
            if solo {
                let v = (t.run)();
                out.add(&v);
                if !t.every_pair {
                    once[i] = Some(v);
                }
            }
        }
    }
    out.measures.retain(|m| !m.1.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A trial that logs its runs and gives `k` the next of `values`.
    fn trial<'a>(
        log: &'a RefCell<Vec<&'static str>>,
        k: &'static str,
        values: Vec<f64>,
        every_pair: bool,
    ) -> Trial<'a> {
        let mut values = values.into_iter();
        Trial {
            gives: vec![k],
            every_pair,
            run: Box::new(move || {
                log.borrow_mut().push(k);
                vec![(k, values.next().unwrap())]
            }),
        }
    }

    #[test]
    fn the_sides_of_a_ratio_run_adjacent_alternating_and_give_one_ratio_per_pair() {
        let log = RefCell::new(Vec::new());
        let trials = vec![
            trial(&log, "small_rps", vec![90.0, 80.0, 30.0], true),
            trial(&log, "floor_small_rps", vec![100.0, 100.0, 40.0], true),
            trial(&log, "small_tiny_pool_rps", vec![5.0, 6.0, 7.0], true),
            trial(&log, "bulk_gbps", vec![1.0], false),
        ];
        let out = run(trials, 3, false);
        assert_eq!(
            *log.borrow(),
            [
                "small_rps",
                "floor_small_rps",
                "small_tiny_pool_rps",
                "bulk_gbps",
                "floor_small_rps",
                "small_rps",
                "small_tiny_pool_rps",
                "small_rps",
                "floor_small_rps",
                "small_tiny_pool_rps",
            ]
        );
        let at = |name: &str| &out.ratios[RATIOS.iter().position(|r| r.name == name).unwrap()];
        assert_eq!(at("small_vs_floor"), &vec![0.9, 0.8, 0.75]);
        assert!(at("bulk_vs_floor").is_empty(), "no floor, no ratio");
        assert_eq!(out.measures[0], ("small_rps", vec![90.0, 80.0, 30.0]));
        assert_eq!(out.measures[3], ("bulk_gbps", vec![1.0]));
        assert_eq!(out.pairs, 3);
    }

    #[test]
    fn a_trial_that_runs_once_runs_once_and_serves_every_ratio_and_its_partners_every_pair() {
        let log = RefCell::new(Vec::new());
        let trials = vec![
            // Once in all: the floor of two ratios.
            trial(&log, "floor_small_rps", vec![100.0], false),
            trial(&log, "small_rps", vec![90.0, 91.0], true),
            trial(&log, "small_batch_rps", vec![99.0, 98.0], true),
        ];
        let out = run(trials, 2, false);
        assert_eq!(
            *log.borrow(),
            [
                "small_rps",
                "floor_small_rps",
                "small_batch_rps",
                "small_rps",
                "small_batch_rps",
            ],
            "the floor once; its partners in the second pair as trials of their own"
        );
        let at = |name: &str| &out.ratios[RATIOS.iter().position(|r| r.name == name).unwrap()];
        assert_eq!(at("small_vs_floor"), &vec![0.9]);
        assert_eq!(at("small_batch_vs_floor"), &vec![0.99]);
    }

    #[test]
    fn a_ratio_of_two_measures_of_one_trial_is_taken_within_it() {
        let log = RefCell::new(Vec::new());
        let mut n = 0.0;
        let trials = vec![Trial {
            gives: vec!["netem1_direct_mbs", "netem1_tcp_mbs"],
            every_pair: false,
            run: Box::new(|| {
                log.borrow_mut().push("netem");
                n += 1.0;
                vec![("netem1_direct_mbs", n), ("netem1_tcp_mbs", 2.0 * n)]
            }),
        }];
        let out = run(trials, 2, false);
        assert_eq!(log.borrow().len(), 1, "once in all");
        let i = RATIOS
            .iter()
            .position(|r| r.name == "netem1_direct_vs_tcp")
            .unwrap();
        assert_eq!(out.ratios[i], vec![0.5]);
    }
}
