//! What a user writes: a stage's work. The runtime does the plumbing (gates, partitions,
//! barriers, acknowledgements) around it.

use std::path::PathBuf;

use shmflow::Partition;

use crate::error::{StageError, StateError};
use crate::keyed::KeyedState;

/// A source: reads records from a replayable input and emits them.
///
/// The runtime asks for [`Source::position`] at each checkpoint barrier, between two calls of
/// [`Source::poll`]: everything emitted before belongs to the checkpoint, and a restore
/// starts from that position ([`Source::restore`]), so that nothing is read twice or lost.
pub trait Source {
    /// Moves to `position` (one that [`Source::position`] returned), or to the beginning
    /// (`None`). Called once, before the first [`Source::poll`].
    fn restore(&mut self, position: Option<&[u8]>) -> Result<(), StageError>;

    /// Emits the next record or few through `ctx`; `Ok(false)` at the end of the input.
    /// Keep each call short (a record or a small batch): barriers go out between calls.
    fn poll(&mut self, ctx: &mut Context<'_>) -> Result<bool, StageError>;

    /// The replay position after everything emitted so far.
    fn position(&mut self) -> Vec<u8>;

    /// Checkpoint `checkpoint` is complete in every instance (Flink's
    /// `CheckpointListener::notifyCheckpointComplete`): what it covers will never be read
    /// again, so a source may, say, acknowledge it to the system it reads from. Called on the
    /// instance's thread between two polls; an error fails the instance.
    fn notify_checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), StageError> {
        let _ = checkpoint;
        Ok(())
    }
}

/// An operator: records in, records out, with state.
///
/// Its state is either its own bytes ([`Operator::snapshot`], taken at every checkpoint
/// barrier in full, like Flink's heap state backend) or keyed state ([`Context::keyed`], on
/// disk, checkpointed incrementally), or both.
pub trait Operator {
    /// Processes one record; emits through `ctx`.
    fn process(&mut self, record: &[u8], ctx: &mut Context<'_>) -> Result<(), StageError>;

    /// Every input has ended: emit final results. Called once per completed run; a pipeline
    /// restored from a checkpoint taken after it does not call it again.
    fn finish(&mut self, ctx: &mut Context<'_>) -> Result<(), StageError> {
        let _ = ctx;
        Ok(())
    }

    /// The operator's own state at a checkpoint barrier, as bytes.
    fn snapshot(&mut self) -> Result<Vec<u8>, StageError> {
        Ok(Vec::new())
    }

    /// Loads a state that [`Operator::snapshot`] returned. Called once, before the first
    /// record, when the pipeline starts from a checkpoint.
    fn restore(&mut self, state: &[u8]) -> Result<(), StageError> {
        let _ = state;
        Ok(())
    }

    /// Checkpoint `checkpoint` is complete in every instance (Flink's
    /// `CheckpointListener::notifyCheckpointComplete`): the state snapshotted for it will be
    /// restored after any failure from now on. Called on the instance's thread between two
    /// records; an error fails the instance.
    fn notify_checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), StageError> {
        let _ = checkpoint;
        Ok(())
    }
}

/// A sink with two-phase commit (Flink's `TwoPhaseCommitSinkFunction`): records go into an
/// open transaction; at a checkpoint barrier the transaction is pre-committed (made durable,
/// not yet visible) and a new one opened; once the checkpoint is complete in every stage,
/// its transactions are committed (made visible). After any crash the pipeline restores the
/// last completed checkpoint and calls [`Sink::recover`]: the transactions it lists are
/// committed (their checkpoint completed, their commit may not have happened), every other
/// one is aborted. So the outside world sees every result exactly once.
///
/// Checkpoint ids are not unique across restores: after a restore of checkpoint `c` the next
/// is `c + 1` again. A sink that names its transactions in an outside system must not take
/// the id alone as the transaction's identity (add the time, or a counter it keeps in its
/// handle).
pub trait Sink {
    /// Adds a record to the open transaction.
    fn write(&mut self, record: &[u8]) -> Result<(), StageError>;

    /// Makes the open transaction durable for `checkpoint` and opens the next one; returns
    /// what [`Sink::commit`] needs to commit it (kept in the checkpoint).
    fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, StageError>;

    /// Makes a pre-committed transaction visible. Must be idempotent: it may be called
    /// again for a transaction already committed (after a crash between the two).
    fn commit(&mut self, transaction: &[u8]) -> Result<(), StageError>;

    /// Called once at start: commits `committable` (pre-committed before the checkpoint the
    /// pipeline restores from, or empty on a first start) and aborts every other transaction
    /// a previous run left: the open one and those pre-committed after the checkpoint.
    fn recover(&mut self, committable: &[Vec<u8>]) -> Result<(), StageError>;
}

/// What a stage's code can do besides its records: emit, use keyed state, know where it
/// runs.
pub struct Context<'a> {
    pub(crate) outputs: &'a mut [Partition],
    pub(crate) keyed: &'a mut KeyedSlot,
    pub(crate) instance: usize,
    pub(crate) parallelism: usize,
}

impl std::fmt::Debug for Context<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("outputs", &self.outputs.len())
            .field("instance", &self.instance)
            .field("parallelism", &self.parallelism)
            .finish()
    }
}

impl Context<'_> {
    /// Sends `record` on every output edge (partitioned as each edge says). Blocks while the
    /// receivers have no free segment: that is the backpressure.
    pub fn emit(&mut self, record: &[u8]) -> Result<(), StageError> {
        for out in self.outputs.iter_mut() {
            out.send(record)?;
        }
        Ok(())
    }

    /// Sends `record` on output edge `edge` only (edges in declaration order).
    pub fn emit_to(&mut self, edge: usize, record: &[u8]) -> Result<(), StageError> {
        match self.outputs.get_mut(edge) {
            Some(out) => Ok(out.send(record)?),
            None => Err(StageError::msg(format!(
                "output edge {edge} does not exist: this stage has {}",
                self.outputs.len()
            ))),
        }
    }

    /// This instance's keyed state (opened at first use): a map from bytes to bytes on disk,
    /// checkpointed incrementally at every barrier and restored with the pipeline. Each
    /// instance has its own, so keys reach it through a key-partitioned edge.
    pub fn keyed(&mut self) -> Result<&mut KeyedState, StateError> {
        self.keyed.get()
    }

    /// This instance's index within its stage.
    pub fn instance(&self) -> usize {
        self.instance
    }

    /// The stage's parallelism.
    pub fn parallelism(&self) -> usize {
        self.parallelism
    }
}

/// Where an instance's keyed state lives, opened at first use.
#[derive(Debug)]
pub(crate) struct KeyedSlot {
    pub(crate) path: PathBuf,
    pub(crate) cache: usize,
    /// The coordinator keeps the checkpoints from this one on.
    pub(crate) oldest_retained: u64,
    pub(crate) state: Option<KeyedState>,
}

impl KeyedSlot {
    pub(crate) fn get(&mut self) -> Result<&mut KeyedState, StateError> {
        if self.state.is_none() {
            let mut state = KeyedState::open(&self.path, self.cache)?;
            state.set_oldest_retained(self.oldest_retained);
            self.state = Some(state);
        }
        Ok(self.state.as_mut().expect("opened above"))
    }
}
