//! Errors, one type per operation: declaring a pipeline ([`BuildError`]), running it
//! ([`RunError`]), a stage's own work ([`StageError`]) and keyed state ([`StateError`]).

use std::fmt;
use std::path::PathBuf;

/// A pipeline's declaration is wrong: nothing was started and nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// The pipeline's or a stage's name is empty, too long or has characters other than ASCII
    /// letters, digits, `_` and `-` (names become file and shared-memory names).
    BadName {
        /// The name.
        name: String,
    },
    /// Two stages have the same name.
    DuplicateStage {
        /// The name.
        name: String,
    },
    /// A stage has a parallelism of 0 (or over 1024, a gate's channel limit).
    BadParallelism {
        /// The stage.
        stage: String,
        /// Its parallelism.
        parallelism: usize,
    },
    /// An edge names a stage that was not declared.
    UnknownStage {
        /// The edge, as `from -> to`.
        edge: String,
        /// The name not found.
        name: String,
    },
    /// The stages and edges form a cycle; a pipeline is a directed acyclic graph.
    Cycle {
        /// The stages on the cycle, in order.
        stages: Vec<String>,
    },
    /// A forward edge joins stages of different parallelism (instance `i` sends to instance
    /// `i` only).
    ForwardMismatch {
        /// The edge, as `from -> to`.
        edge: String,
        /// The upstream stage's parallelism.
        from: usize,
        /// The downstream stage's parallelism.
        to: usize,
    },
    /// A source has an input, a sink an output, or an operator or sink no input.
    BadShape {
        /// The stage.
        stage: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The same two stages are joined twice.
    DuplicateEdge {
        /// The edge, as `from -> to`.
        edge: String,
    },
    /// No stage, or no source.
    Empty,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::BadName { name } => write!(
                f,
                "the name {name:?} is not 1 to 40 ASCII letters, digits, '_' or '-'"
            ),
            BuildError::DuplicateStage { name } => {
                write!(f, "two stages are named {name:?}: give each its own name")
            }
            BuildError::BadParallelism { stage, parallelism } => write!(
                f,
                "stage {stage:?} has a parallelism of {parallelism}: it must be 1 to 1024"
            ),
            BuildError::UnknownStage { edge, name } => write!(
                f,
                "the edge {edge} names {name:?}, which is not a declared stage"
            ),
            BuildError::Cycle { stages } => write!(
                f,
                "the edges form a cycle ({}): a pipeline's edges must not lead back",
                stages.join(" -> ")
            ),
            BuildError::ForwardMismatch { edge, from, to } => write!(
                f,
                "the forward edge {edge} joins a parallelism of {from} to one of {to}: \
                 a forward edge needs equal parallelism (use rebalance or a key)"
            ),
            BuildError::BadShape { stage, reason } => write!(f, "stage {stage:?} {reason}"),
            BuildError::DuplicateEdge { edge } => {
                write!(f, "the edge {edge} is declared twice")
            }
            BuildError::Empty => write!(f, "a pipeline needs at least one source"),
        }
    }
}

impl std::error::Error for BuildError {}

/// Running a pipeline failed; the checkpoint directory keeps the last completed checkpoint, so
/// that a supervisor started again on it resumes there.
#[derive(Debug)]
#[non_exhaustive]
pub enum RunError {
    /// The declaration is wrong.
    Build(BuildError),
    /// The checkpoint directory holds another pipeline's checkpoints.
    ForeignDirectory {
        /// The directory.
        dir: PathBuf,
        /// What its identity file says.
        found: String,
        /// What this pipeline's would say.
        expected: String,
    },
    /// Another supervisor runs this pipeline on the same directory.
    Locked {
        /// The directory.
        dir: PathBuf,
        /// The other supervisor's pid, if it could be read.
        pid: Option<u32>,
    },
    /// A file or directory could not be read or written.
    Io {
        /// What was being done, with the path.
        what: String,
        /// The system's error.
        source: std::io::Error,
    },
    /// A stage instance could not be started.
    Spawn {
        /// The instance, as `stage[i]`.
        instance: String,
        /// The system's error.
        source: std::io::Error,
    },
    /// The restart strategy allows no further restart.
    RestartsExhausted {
        /// Restarts made before this failure.
        restarts: u32,
        /// The failure that was not restarted.
        cause: String,
    },
    /// Every completed checkpoint in the directory is corrupt (each was set aside as
    /// `corrupt-chk-ID`): starting from the beginning would repeat what sinks committed, so
    /// the supervisor refuses; `fresh_start(true)` discards them.
    NoUsableCheckpoint {
        /// The directory.
        dir: PathBuf,
    },
    /// Started as a stage instance, with an environment the supervisor did not make.
    BadInstance {
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Build(e) => write!(f, "{e}"),
            RunError::ForeignDirectory {
                dir,
                found,
                expected,
            } => write!(
                f,
                "{} holds the checkpoints of another pipeline ({found}; this one is {expected}): \
                 choose another directory, or start afresh there (fresh_start) to discard them",
                dir.display()
            ),
            RunError::Locked { dir, pid } => write!(
                f,
                "{} is in use by another supervisor{}: stop it first",
                dir.display(),
                pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
            ),
            RunError::Io { what, source } => write!(f, "{what}: {source}"),
            RunError::Spawn { instance, source } => {
                write!(f, "starting instance {instance}: {source}")
            }
            RunError::RestartsExhausted { restarts, cause } => write!(
                f,
                "the restart strategy allows no further restart after {restarts} restart(s); \
                 last failure: {cause} (start the supervisor again to resume from the last \
                 completed checkpoint)"
            ),
            RunError::NoUsableCheckpoint { dir } => write!(
                f,
                "every completed checkpoint in {} is corrupt (set aside as corrupt-chk-ID): \
                 start afresh (fresh_start) to discard them and what the sinks committed",
                dir.display()
            ),
            RunError::BadInstance { reason } => write!(f, "not a valid stage instance: {reason}"),
        }
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::Build(e) => Some(e),
            RunError::Io { source, .. } | RunError::Spawn { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<BuildError> for RunError {
    fn from(e: BuildError) -> Self {
        RunError::Build(e)
    }
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunError {
    let what = what.into();
    move |source| RunError::Io { what, source }
}

/// A stage's own work failed: the instance exits non-zero and the supervisor fails over.
///
/// Any error converts into it with `?`; [`StageError::msg`] makes one from a message.
pub struct StageError(Box<dyn std::error::Error + Send + Sync>);

impl StageError {
    /// An error with this message.
    ///
    /// ```
    /// let e = shmflow_pipeline::StageError::msg("a record is not UTF-8");
    /// assert_eq!(e.to_string(), "a record is not UTF-8");
    /// ```
    pub fn msg(message: impl Into<String>) -> StageError {
        StageError(message.into().into())
    }
}

impl StageError {
    /// Whether this error is a consequence of a peer's failure (a transport error, or an
    /// input whose producer died or failed) rather than the stage's own.
    pub(crate) fn is_peer_failure(&self) -> bool {
        self.0.is::<PeerFailure>()
            || self.0.is::<shmflow::SendError>()
            || self.0.is::<shmflow::RecvError>()
            || self.0.is::<shmflow::RecvTimeoutError>()
    }
}

/// An input whose producer died or failed.
#[derive(Debug)]
pub(crate) struct PeerFailure(pub(crate) String);

impl fmt::Display for PeerFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PeerFailure {}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for StageError {
    fn from(e: E) -> Self {
        StageError(Box::new(e))
    }
}

impl fmt::Display for StageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for StageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// Keyed state could not be read, written, checkpointed or restored.
#[derive(Debug)]
pub struct StateError {
    pub(crate) what: String,
    pub(crate) source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StateError {
    pub(crate) fn new(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> StateError {
        StateError {
            what: what.into(),
            source: Some(source.into()),
        }
    }
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Some(s) => write!(f, "keyed state: {}: {s}", self.what),
            None => write!(f, "keyed state: {}", self.what),
        }
    }
}

impl std::error::Error for StateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}
