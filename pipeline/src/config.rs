//! How often checkpoints are taken, and what happens after a failure.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

pub use shmflow::Alignment;

/// The checkpoint coordinator's settings, with Flink's names and meanings
/// (`execution.checkpointing.*`). One checkpoint runs at a time
/// (`max-concurrent-checkpoints` 1).
///
/// ```
/// use std::time::Duration;
/// use shmflow_pipeline::{Alignment, CheckpointConfig};
///
/// let c = CheckpointConfig::every(Duration::from_millis(100))
///     .min_pause(Duration::from_millis(20))
///     .timeout(Duration::from_secs(10))
///     .tolerable_failures(2)
///     .retained(3)
///     .alignment(Alignment::AlignedWithTimeout(Duration::from_millis(50)));
/// assert_eq!(c.interval, Duration::from_millis(100));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckpointConfig {
    /// Time from one checkpoint's trigger to the next (`interval`).
    pub interval: Duration,
    /// Least time from a checkpoint's end (completed or failed) to the next trigger
    /// (`min-pause`).
    pub min_pause: Duration,
    /// A checkpoint not complete this long after its trigger is aborted in every instance
    /// and its partial state removed (`timeout`).
    pub timeout: Duration,
    /// Failed checkpoints in a row that are tolerated; one more fails the pipeline over
    /// (`tolerable-failed-checkpoints`).
    pub tolerable_failures: u32,
    /// Completed checkpoints kept (`state.checkpoints.num-retained`), at least 1. Older ones
    /// are removed; a restore falls back to an older retained one when the newest is corrupt.
    pub retained: u32,
    /// How gates align the barriers (aligned, unaligned, or aligned with a timeout that
    /// switches to unaligned). The final checkpoint at the end of the input is always aligned.
    pub alignment: Alignment,
}

impl CheckpointConfig {
    /// Checkpoints every `interval`, with Flink's defaults for the rest: no minimum pause, a
    /// 10-minute timeout, no tolerable failure, one retained checkpoint, aligned barriers.
    pub fn every(interval: Duration) -> CheckpointConfig {
        CheckpointConfig {
            interval,
            min_pause: Duration::ZERO,
            timeout: Duration::from_secs(600),
            tolerable_failures: 0,
            retained: 1,
            alignment: Alignment::Aligned,
        }
    }

    /// The same, with this minimum pause.
    pub fn min_pause(mut self, pause: Duration) -> Self {
        self.min_pause = pause;
        self
    }

    /// The same, with this timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The same, tolerating `n` failed checkpoints in a row.
    pub fn tolerable_failures(mut self, n: u32) -> Self {
        self.tolerable_failures = n;
        self
    }

    /// The same, keeping `n` completed checkpoints (at least 1).
    pub fn retained(mut self, n: u32) -> Self {
        self.retained = n.max(1);
        self
    }

    /// The same, with this barrier alignment.
    pub fn alignment(mut self, alignment: Alignment) -> Self {
        self.alignment = alignment;
        self
    }
}

/// What the supervisor does when an instance fails (exits non-zero, dies by a signal, or a
/// checkpoint fails beyond the tolerable number): Flink's restart strategies. Every restart
/// is a full failover: every instance is stopped and the pipeline starts again from the last
/// completed checkpoint.
///
/// ```
/// use std::time::Duration;
/// use shmflow_pipeline::RestartStrategy;
///
/// let fixed = RestartStrategy::fixed_delay(3, Duration::from_millis(100));
/// let exp = RestartStrategy::exponential_delay(Duration::from_millis(10), Duration::from_secs(1));
/// let rate = RestartStrategy::failure_rate(5, Duration::from_secs(60), Duration::from_millis(100));
/// # let _ = (fixed, exp, rate);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum RestartStrategy {
    /// The first failure ends the run (`none`).
    NoRestart,
    /// Up to `attempts` restarts, each after `delay` (`fixed-delay`).
    FixedDelay {
        /// Restarts allowed in all.
        attempts: u32,
        /// Wait before each restart.
        delay: Duration,
    },
    /// The wait doubles (times `multiplier`) from `initial` up to `max` with every failure,
    /// and goes back to `initial` after a run of `reset_after` without failure
    /// (`exponential-delay`); at most `attempts` restarts between resets.
    ExponentialDelay {
        /// The first wait (`initial-backoff`).
        initial: Duration,
        /// The largest wait (`max-backoff`).
        max: Duration,
        /// Factor per failure (`backoff-multiplier`), at least 1.
        multiplier: f64,
        /// A run this long without failure resets the wait (`reset-backoff-threshold`).
        reset_after: Duration,
        /// Restarts allowed before a reset (`attempts-before-reset-backoff`).
        attempts: u32,
    },
    /// Restarts after `delay` while fewer than `max_failures` failures happened in the last
    /// `interval`; one more ends the run (`failure-rate`).
    FailureRate {
        /// Failures allowed within `interval` (`max-failures-per-interval`).
        max_failures: u32,
        /// The window (`failure-rate-interval`).
        interval: Duration,
        /// Wait before each restart.
        delay: Duration,
    },
}

impl RestartStrategy {
    /// `FixedDelay`.
    pub fn fixed_delay(attempts: u32, delay: Duration) -> RestartStrategy {
        RestartStrategy::FixedDelay { attempts, delay }
    }

    /// `ExponentialDelay` with a multiplier of 2, a reset after an hour without failure and
    /// unlimited attempts (Flink's defaults).
    pub fn exponential_delay(initial: Duration, max: Duration) -> RestartStrategy {
        RestartStrategy::ExponentialDelay {
            initial,
            max,
            multiplier: 2.0,
            reset_after: Duration::from_secs(3600),
            attempts: u32::MAX,
        }
    }

    /// `FailureRate`.
    pub fn failure_rate(max_failures: u32, interval: Duration, delay: Duration) -> RestartStrategy {
        RestartStrategy::FailureRate {
            max_failures,
            interval,
            delay,
        }
    }

    /// Flink's name of the strategy.
    pub fn name(&self) -> &'static str {
        match self {
            RestartStrategy::NoRestart => "none",
            RestartStrategy::FixedDelay { .. } => "fixed-delay",
            RestartStrategy::ExponentialDelay { .. } => "exponential-delay",
            RestartStrategy::FailureRate { .. } => "failure-rate",
        }
    }
}

/// Applies a [`RestartStrategy`] to the failures of one supervisor's run.
#[derive(Debug)]
pub(crate) struct Restarts {
    strategy: RestartStrategy,
    /// Restarts since the last reset (exponential) or in all (fixed).
    count: u32,
    /// The next wait (exponential).
    backoff: Duration,
    /// When the last restart was made (exponential's reset).
    last_restart: Option<Instant>,
    /// The failures within the window (failure rate).
    recent: VecDeque<Instant>,
}

impl Restarts {
    pub(crate) fn new(strategy: RestartStrategy) -> Restarts {
        let backoff = match strategy {
            RestartStrategy::ExponentialDelay { initial, .. } => initial,
            _ => Duration::ZERO,
        };
        Restarts {
            strategy,
            count: 0,
            backoff,
            last_restart: None,
            recent: VecDeque::new(),
        }
    }

    /// A failure at `now`: the wait before the restart, or `None` when the strategy allows no
    /// further restart.
    pub(crate) fn on_failure(&mut self, now: Instant) -> Option<Duration> {
        let wait = match self.strategy {
            RestartStrategy::NoRestart => None,
            RestartStrategy::FixedDelay { attempts, delay } => {
                (self.count < attempts).then_some(delay)
            }
            RestartStrategy::ExponentialDelay {
                initial,
                max,
                multiplier,
                reset_after,
                attempts,
            } => {
                if self
                    .last_restart
                    .is_some_and(|t| now.saturating_duration_since(t) >= reset_after)
                {
                    self.backoff = initial;
                    self.count = 0;
                }
                (self.count < attempts).then(|| {
                    let wait = self.backoff.min(max);
                    self.backoff = self.backoff.mul_f64(multiplier.max(1.0)).min(max);
                    wait
                })
            }
            RestartStrategy::FailureRate {
                max_failures,
                interval,
                delay,
            } => {
                self.recent.push_back(now);
                while self
                    .recent
                    .front()
                    .is_some_and(|&t| now.saturating_duration_since(t) > interval)
                {
                    self.recent.pop_front();
                }
                (self.recent.len() <= max_failures as usize).then_some(delay)
            }
        };
        if wait.is_some() {
            self.count += 1;
            self.last_restart = Some(now);
        }
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn fixed_delay_allows_its_attempts_then_stops() {
        let mut r = Restarts::new(RestartStrategy::fixed_delay(2, 5 * MS));
        let t = Instant::now();
        assert_eq!(r.on_failure(t), Some(5 * MS));
        assert_eq!(r.on_failure(t), Some(5 * MS));
        assert_eq!(r.on_failure(t), None);
    }

    #[test]
    fn no_restart_stops_at_once() {
        assert_eq!(
            Restarts::new(RestartStrategy::NoRestart).on_failure(Instant::now()),
            None
        );
    }

    #[test]
    fn exponential_delay_doubles_to_its_cap_and_resets_after_a_quiet_run() {
        let mut r = Restarts::new(RestartStrategy::ExponentialDelay {
            initial: 10 * MS,
            max: 35 * MS,
            multiplier: 2.0,
            reset_after: 1000 * MS,
            attempts: 10,
        });
        let t = Instant::now();
        let waits: Vec<_> = (0..4).map(|i| r.on_failure(t + i * MS).unwrap()).collect();
        assert_eq!(waits, [10 * MS, 20 * MS, 35 * MS, 35 * MS]);
        // A second without failure since the last restart: back to the first wait.
        assert_eq!(r.on_failure(t + 1010 * MS), Some(10 * MS));
    }

    #[test]
    fn exponential_delay_stops_after_its_attempts() {
        let mut r = Restarts::new(RestartStrategy::ExponentialDelay {
            initial: MS,
            max: MS,
            multiplier: 2.0,
            reset_after: 1000 * MS,
            attempts: 1,
        });
        let t = Instant::now();
        assert!(r.on_failure(t).is_some());
        assert_eq!(r.on_failure(t + MS), None);
    }

    #[test]
    fn failure_rate_counts_only_the_window() {
        let mut r = Restarts::new(RestartStrategy::failure_rate(2, 100 * MS, MS));
        let t = Instant::now();
        assert!(r.on_failure(t).is_some());
        assert!(r.on_failure(t + 10 * MS).is_some());
        // A third within 100 ms of the first: too many.
        assert_eq!(r.on_failure(t + 20 * MS), None);
        let mut r = Restarts::new(RestartStrategy::failure_rate(2, 100 * MS, MS));
        assert!(r.on_failure(t).is_some());
        assert!(r.on_failure(t + 10 * MS).is_some());
        // The first has left the window.
        assert!(r.on_failure(t + 150 * MS).is_some());
    }
}
