//! Exactly-once multi-process pipelines over shmflow: what Flink's runtime adds to its
//! network stack, for processes on one machine.
//!
//! A [`Pipeline`] is declared, not wired: stages (sources, operators, two-phase-commit sinks)
//! with a parallelism, and edges between them (forward, rebalance, broadcast, by key). Its
//! supervisor starts every stage instance as its own process (this program again, with the
//! instance's role in its environment), creates the gates and partitions between them, and
//! sends checkpoint barriers through them. Its checkpoint coordinator triggers a checkpoint
//! at an interval, one at a time, with a minimum pause and a timeout; each instance
//! acknowledges it by writing its state atomically, with a checksum; the checkpoint is
//! complete once every acknowledgement is durable. Any failure of any instance (an error, a
//! crash, a kill from outside) fails the pipeline over: every instance stops and the
//! pipeline starts again from the last completed checkpoint, under a restart strategy with
//! Flink's names. Sources replay from their position, keyed state rolls back to its
//! savepoint, and sinks commit only what completed checkpoints cover — so what the outside
//! world sees holds every result exactly once.
//!
//! ```no_run
//! use std::time::Duration;
//! use shmflow_pipeline::{
//!     CheckpointConfig, Context, FileSink, FileSource, Operator, Partitioning, Pipeline,
//!     RestartStrategy, StageError,
//! };
//!
//! /// Counts words in keyed state; emits `word count` at the end of the input.
//! struct Count;
//!
//! impl Operator for Count {
//!     fn process(&mut self, word: &[u8], ctx: &mut Context<'_>) -> Result<(), StageError> {
//!         ctx.keyed()?.add_u64(word, 1)?;
//!         Ok(())
//!     }
//!     fn finish(&mut self, ctx: &mut Context<'_>) -> Result<(), StageError> {
//!         let mut lines = Vec::new();
//!         ctx.keyed()?.for_each(|w, n| {
//!             let n = u64::from_le_bytes(n.try_into().unwrap_or_default());
//!             lines.push(format!("{} {n}", String::from_utf8_lossy(w)));
//!             Ok(())
//!         })?;
//!         for l in lines {
//!             ctx.emit(l.as_bytes())?;
//!         }
//!         Ok(())
//!     }
//! }
//!
//! struct Split;
//!
//! impl Operator for Split {
//!     fn process(&mut self, line: &[u8], ctx: &mut Context<'_>) -> Result<(), StageError> {
//!         for w in line.split(|&b| b == b' ').filter(|w| !w.is_empty()) {
//!             ctx.emit(w)?;
//!         }
//!         Ok(())
//!     }
//! }
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let summary = Pipeline::new("words", "target/words-checkpoints")
//!         .source("read", 2, |i| Box::new(FileSource::lines(format!("input-{i}.txt"))))
//!         .operator("split", 3, |_| Box::new(Split))
//!         .operator("count", 2, |_| Box::new(Count))
//!         .sink("write", 1, |i| Box::new(FileSink::new("target/words-out", i)))
//!         .edge("read", "split", Partitioning::Rebalance)
//!         .edge("split", "count", Partitioning::key(|w| {
//!             w.iter().fold(0xcbf29ce484222325, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3))
//!         }))
//!         .edge("count", "write", Partitioning::Rebalance)
//!         .checkpoints(CheckpointConfig::every(Duration::from_millis(100)))
//!         .restart(RestartStrategy::fixed_delay(10, Duration::from_millis(50)))
//!         .run()?; // the supervisor returns here; an instance never does
//!     println!("{summary}");
//!     Ok(())
//! }
//! ```
//!
//! The layout of the checkpoint directory is in the `store` module's docs; the recovery
//! protocol in the `supervisor` module's; the checkpoint protocol per kind of stage in the
//! `instance` module's (all rendered by `cargo doc --document-private-items`).

mod config;
mod control;
mod error;
mod graph;
mod instance;
mod keyed;
mod metrics;
mod sink;
mod source;
mod stage;
mod store;
mod supervisor;

pub use config::{Alignment, CheckpointConfig, RestartStrategy};
pub use error::{BuildError, RunError, StageError, StateError};
pub use graph::{KeyFn, Partitioning, Pipeline};
pub use keyed::KeyedState;
pub use metrics::Metrics;
pub use sink::FileSink;
pub use source::FileSource;
pub use stage::{Context, Operator, Sink, Source};
pub use supervisor::RunSummary;

/// Whether this process is a stage instance started by a supervisor (rather than the
/// supervisor): a program does its one-time setup (writing inputs, say) only when this is
/// false.
pub fn is_instance() -> bool {
    std::env::var_os(instance::ENV_ROLE).is_some()
}

impl Pipeline {
    /// Runs the pipeline.
    ///
    /// In the supervisor (the program as the user started it): checks the declaration,
    /// takes the checkpoint directory, starts every instance, coordinates checkpoints and
    /// fails over on every failure until the pipeline reaches the end of its input; returns
    /// what it did, or why it gave up (the directory keeps the last completed checkpoint for
    /// a supervisor started again). In a stage instance (started by the supervisor): runs
    /// the instance and exits the process — it never returns.
    ///
    /// # Errors
    /// [`RunError`]: a wrong declaration, a directory of another pipeline or in use, an I/O
    /// error, or a failure the restart strategy did not restart.
    pub fn run(self) -> Result<RunSummary, RunError> {
        if let Some(role) = std::env::var_os(instance::ENV_ROLE) {
            let role = role.to_string_lossy().into_owned();
            if let Err(e) = self.validate() {
                eprintln!("shmflow-pipeline instance {role}: {e}");
                std::process::exit(2);
            }
            instance::run(&self, &role)
        }
        supervisor::supervise(&self)
    }
}
