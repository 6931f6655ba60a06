//! A pipeline's declaration: stages with a parallelism, edges between them, and its checks.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::config::{CheckpointConfig, RestartStrategy};
use crate::error::BuildError;
use crate::stage::{Operator, Sink, Source};

/// The largest parallelism: a gate has at most 1024 channels.
const MAX_PARALLELISM: usize = 1024;

/// A function from a record to its key.
pub type KeyFn = Arc<dyn Fn(&[u8]) -> u64 + Send + Sync>;

/// How an edge spreads the records of each upstream instance over the downstream instances
/// (Flink's partitioners).
#[derive(Clone)]
#[non_exhaustive]
pub enum Partitioning {
    /// Instance `i` sends to instance `i` only (equal parallelism).
    Forward,
    /// Round robin over every downstream instance.
    Rebalance,
    /// Every record to every downstream instance.
    Broadcast,
    /// By a key drawn from the record: the same key always reaches the same instance.
    Key(KeyFn),
}

impl Partitioning {
    /// `Key`, with this function from a record to its key.
    ///
    /// ```
    /// let by_first_byte = shmflow_pipeline::Partitioning::key(|r| r[0] as u64);
    /// # let _ = by_first_byte;
    /// ```
    pub fn key(f: impl Fn(&[u8]) -> u64 + Send + Sync + 'static) -> Partitioning {
        Partitioning::Key(Arc::new(f))
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Partitioning::Forward => "forward",
            Partitioning::Rebalance => "rebalance",
            Partitioning::Broadcast => "broadcast",
            Partitioning::Key(_) => "key",
        }
    }
}

impl fmt::Debug for Partitioning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

pub(crate) type SourceFactory = Box<dyn Fn(usize) -> Box<dyn Source>>;
pub(crate) type OperatorFactory = Box<dyn Fn(usize) -> Box<dyn Operator>>;
pub(crate) type SinkFactory = Box<dyn Fn(usize) -> Box<dyn Sink>>;

pub(crate) enum Kind {
    Source(SourceFactory),
    Operator(OperatorFactory),
    Sink(SinkFactory),
}

impl Kind {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Kind::Source(_) => "source",
            Kind::Operator(_) => "operator",
            Kind::Sink(_) => "sink",
        }
    }
}

pub(crate) struct StageDecl {
    pub(crate) name: String,
    pub(crate) parallelism: usize,
    pub(crate) kind: Kind,
}

pub(crate) struct EdgeDecl {
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) partitioning: Partitioning,
}

/// A pipeline: its stages, its edges, where it keeps its checkpoints, how often it takes
/// them and how it restarts. [`Pipeline::run`] runs it.
///
/// Each stage instance is a process: this program, started again by the supervisor with the
/// instance's role in its environment. So the program must declare the same pipeline in
/// every process and call [`Pipeline::run`] before it does anything else that only the
/// supervisor should do ([`crate::is_instance`] tells which side runs).
///
/// ```no_run
/// use std::time::Duration;
/// use shmflow_pipeline::{
///     CheckpointConfig, Context, FileSink, FileSource, Operator, Partitioning, Pipeline,
///     RestartStrategy, StageError,
/// };
///
/// struct Upper;
/// impl Operator for Upper {
///     fn process(&mut self, record: &[u8], ctx: &mut Context<'_>) -> Result<(), StageError> {
///         ctx.emit(&record.to_ascii_uppercase())
///     }
/// }
///
/// fn main() -> Result<(), Box<dyn std::error::Error>> {
///     let summary = Pipeline::new("upper", "target/upper-checkpoints")
///         .source("read", 1, |_| Box::new(FileSource::lines("input.txt")))
///         .operator("upper", 2, |_| Box::new(Upper))
///         .sink("write", 1, |i| Box::new(FileSink::new("target/upper-out", i)))
///         .edge("read", "upper", Partitioning::Rebalance)
///         .edge("upper", "write", Partitioning::Rebalance)
///         .checkpoints(CheckpointConfig::every(Duration::from_millis(100)))
///         .restart(RestartStrategy::fixed_delay(5, Duration::from_millis(100)))
///         .run()?;
///     println!("{summary}");
///     Ok(())
/// }
/// ```
pub struct Pipeline {
    pub(crate) name: String,
    pub(crate) dir: PathBuf,
    pub(crate) stages: Vec<StageDecl>,
    pub(crate) edges: Vec<EdgeDecl>,
    pub(crate) checkpoints: CheckpointConfig,
    pub(crate) restart: RestartStrategy,
    pub(crate) fresh: bool,
    pub(crate) quiet: bool,
    pub(crate) gate_floating: u32,
    pub(crate) gate_exclusive: u32,
    pub(crate) segment_size: u32,
    pub(crate) keyed_cache: usize,
    pub(crate) latency_markers: Option<std::time::Duration>,
}

impl fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pipeline")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .field("identity", &self.identity())
            .field("checkpoints", &self.checkpoints)
            .field("restart", &self.restart)
            .finish_non_exhaustive()
    }
}

impl Pipeline {
    /// A pipeline named `name` (1 to 40 ASCII letters, digits, `_`, `-`) that keeps its
    /// checkpoints in `dir`. Defaults: a checkpoint every second
    /// ([`CheckpointConfig::every`]), a fixed-delay restart strategy of 3 attempts 1 s apart
    /// (`RestartStrategy::fixed_delay(3, 1 s)`), gates of 2 exclusive and 8 floating 32 KiB
    /// segments per channel.
    pub fn new(name: &str, dir: impl Into<PathBuf>) -> Pipeline {
        Pipeline {
            name: name.to_owned(),
            dir: dir.into(),
            stages: Vec::new(),
            edges: Vec::new(),
            checkpoints: CheckpointConfig::every(std::time::Duration::from_secs(1)),
            restart: RestartStrategy::fixed_delay(3, std::time::Duration::from_secs(1)),
            fresh: false,
            quiet: false,
            gate_floating: 8,
            gate_exclusive: 2,
            segment_size: 32 * 1024,
            keyed_cache: 64 << 20,
            latency_markers: None,
        }
    }

    /// Adds a source stage of `parallelism` instances; `make(i)` builds instance `i`'s
    /// source in its process.
    pub fn source(
        mut self,
        name: &str,
        parallelism: usize,
        make: impl Fn(usize) -> Box<dyn Source> + 'static,
    ) -> Pipeline {
        self.stages.push(StageDecl {
            name: name.to_owned(),
            parallelism,
            kind: Kind::Source(Box::new(make)),
        });
        self
    }

    /// Adds an operator stage of `parallelism` instances.
    pub fn operator(
        mut self,
        name: &str,
        parallelism: usize,
        make: impl Fn(usize) -> Box<dyn Operator> + 'static,
    ) -> Pipeline {
        self.stages.push(StageDecl {
            name: name.to_owned(),
            parallelism,
            kind: Kind::Operator(Box::new(make)),
        });
        self
    }

    /// Adds a sink stage of `parallelism` instances (two-phase commit: see [`Sink`]).
    pub fn sink(
        mut self,
        name: &str,
        parallelism: usize,
        make: impl Fn(usize) -> Box<dyn Sink> + 'static,
    ) -> Pipeline {
        self.stages.push(StageDecl {
            name: name.to_owned(),
            parallelism,
            kind: Kind::Sink(Box::new(make)),
        });
        self
    }

    /// Joins stage `from` to stage `to`.
    pub fn edge(mut self, from: &str, to: &str, partitioning: Partitioning) -> Pipeline {
        self.edges.push(EdgeDecl {
            from: from.to_owned(),
            to: to.to_owned(),
            partitioning,
        });
        self
    }

    /// The checkpoint coordinator's settings.
    pub fn checkpoints(mut self, config: CheckpointConfig) -> Pipeline {
        self.checkpoints = config;
        self
    }

    /// The restart strategy.
    pub fn restart(mut self, strategy: RestartStrategy) -> Pipeline {
        self.restart = strategy;
        self
    }

    /// Discards every checkpoint, keyed state and finished mark in the directory before it
    /// starts, another pipeline's too (without it, a supervisor resumes from the last
    /// completed checkpoint, and refuses a directory of another pipeline). Sinks abort what
    /// they had pending; `FileSink` also removes what it had committed.
    pub fn fresh_start(mut self, fresh: bool) -> Pipeline {
        self.fresh = fresh;
        self
    }

    /// The supervisor prints nothing but errors (no line per checkpoint or restart).
    pub fn quiet(mut self, quiet: bool) -> Pipeline {
        self.quiet = quiet;
        self
    }

    /// Each gate channel's exclusive segments, the gate's floating ones, and the segment size
    /// (see `shmflow::GateGeometry`). Fewer segments bound what is in flight, and so how long
    /// an aligned barrier waits.
    pub fn gate_segments(mut self, exclusive: u32, floating: u32, segment_size: u32) -> Pipeline {
        self.gate_exclusive = exclusive;
        self.gate_floating = floating;
        self.segment_size = segment_size;
        self
    }

    /// The keyed state's page cache per instance, in bytes (default 64 MiB); state beyond it
    /// lives on disk.
    pub fn keyed_state_cache(mut self, bytes: usize) -> Pipeline {
        self.keyed_cache = bytes;
        self
    }

    /// Latency markers (Flink's `metrics.latency.interval`): every source instance emits one
    /// per `interval` through each of its outputs, labelled `{stage}-{instance}`; every
    /// operator passes them on, and every gate keeps their age per source — read it with
    /// `shmflow stat` or `shmflow top` on the gates' regions, or their export. Off (`None`)
    /// by default; at one per millisecond they cost 1–2 % of a stage's throughput (see
    /// docs/BENCHMARKS.md).
    pub fn latency_markers(mut self, interval: Option<std::time::Duration>) -> Pipeline {
        self.latency_markers = interval;
        self
    }

    /// Checks the declaration: names, parallelism, edges, shape, no cycle.
    pub fn validate(&self) -> Result<(), BuildError> {
        check_name(&self.name)?;
        if !self
            .stages
            .iter()
            .any(|s| matches!(s.kind, Kind::Source(_)))
        {
            return Err(BuildError::Empty);
        }
        let mut index = HashMap::new();
        for (i, s) in self.stages.iter().enumerate() {
            check_name(&s.name)?;
            if index.insert(s.name.as_str(), i).is_some() {
                return Err(BuildError::DuplicateStage {
                    name: s.name.clone(),
                });
            }
            if s.parallelism == 0 || s.parallelism > MAX_PARALLELISM {
                return Err(BuildError::BadParallelism {
                    stage: s.name.clone(),
                    parallelism: s.parallelism,
                });
            }
        }
        let mut seen = std::collections::HashSet::new();
        for e in &self.edges {
            let label = format!("{} -> {}", e.from, e.to);
            for name in [&e.from, &e.to] {
                if !index.contains_key(name.as_str()) {
                    return Err(BuildError::UnknownStage {
                        edge: label,
                        name: name.clone(),
                    });
                }
            }
            if !seen.insert((e.from.as_str(), e.to.as_str())) {
                return Err(BuildError::DuplicateEdge { edge: label });
            }
            let (f, t) = (
                &self.stages[index[e.from.as_str()]],
                &self.stages[index[e.to.as_str()]],
            );
            if matches!(e.partitioning, Partitioning::Forward) && f.parallelism != t.parallelism {
                return Err(BuildError::ForwardMismatch {
                    edge: label,
                    from: f.parallelism,
                    to: t.parallelism,
                });
            }
        }
        for s in &self.stages {
            let inputs = self.edges.iter().filter(|e| e.to == s.name).count();
            let outputs = self.edges.iter().filter(|e| e.from == s.name).count();
            let bad = match s.kind {
                Kind::Source(_) if inputs > 0 => Some("is a source and cannot have an input"),
                Kind::Sink(_) if outputs > 0 => Some("is a sink and cannot have an output"),
                Kind::Operator(_) | Kind::Sink(_) if inputs == 0 => {
                    Some("has no input edge: every operator and sink reads from a stage")
                }
                _ => None,
            };
            if let Some(reason) = bad {
                return Err(BuildError::BadShape {
                    stage: s.name.clone(),
                    reason,
                });
            }
            // Every channel of a gate is one upstream instance.
            let channels: usize = self.inputs(self.stage_index(&s.name).unwrap_or(0), 0).len();
            if channels > MAX_PARALLELISM {
                return Err(BuildError::BadParallelism {
                    stage: s.name.clone(),
                    parallelism: channels,
                });
            }
        }
        if let Some(cycle) = self.find_cycle() {
            return Err(BuildError::Cycle { stages: cycle });
        }
        Ok(())
    }

    /// A cycle's stages, if the edges have one (depth-first search, colouring nodes).
    fn find_cycle(&self) -> Option<Vec<String>> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            OnPath,
            Done,
        }
        fn visit(p: &Pipeline, s: usize, marks: &mut [Mark], path: &mut Vec<usize>) -> bool {
            marks[s] = Mark::OnPath;
            path.push(s);
            for e in p.edges.iter().filter(|e| e.from == p.stages[s].name) {
                let Some(t) = p.stage_index(&e.to) else {
                    continue;
                };
                match marks[t] {
                    Mark::OnPath => {
                        let start = path.iter().position(|&x| x == t).unwrap_or(0);
                        path.drain(..start);
                        path.push(t);
                        return true;
                    }
                    Mark::New => {
                        if visit(p, t, marks, path) {
                            return true;
                        }
                    }
                    Mark::Done => {}
                }
            }
            path.pop();
            marks[s] = Mark::Done;
            false
        }
        let mut marks = vec![Mark::New; self.stages.len()];
        for s in 0..self.stages.len() {
            let mut path = Vec::new();
            if marks[s] == Mark::New && visit(self, s, &mut marks, &mut path) {
                return Some(path.iter().map(|&i| self.stages[i].name.clone()).collect());
            }
        }
        None
    }

    pub(crate) fn stage_index(&self, name: &str) -> Option<usize> {
        self.stages.iter().position(|s| s.name == name)
    }

    /// The gate channels of instance `i` of stage `s`, in order: for each input edge (in
    /// declaration order), the upstream instances that send to it.
    pub(crate) fn inputs(&self, s: usize, i: usize) -> Vec<(usize, usize)> {
        let mut channels = Vec::new();
        for e in self.edges.iter().filter(|e| e.to == self.stages[s].name) {
            let Some(u) = self.stage_index(&e.from) else {
                continue;
            };
            match e.partitioning {
                Partitioning::Forward => channels.push((u, i)),
                _ => channels.extend((0..self.stages[u].parallelism).map(|j| (u, j))),
            }
        }
        channels
    }

    /// The text that identifies this pipeline's checkpoints: its name, stages (kind and
    /// parallelism) and edges. A directory whose identity differs holds another pipeline's.
    pub(crate) fn identity(&self) -> String {
        let stages: Vec<String> = self
            .stages
            .iter()
            .map(|s| format!("{}:{}:{}", s.name, s.kind.name(), s.parallelism))
            .collect();
        let edges: Vec<String> = self
            .edges
            .iter()
            .map(|e| format!("{}>{}:{}", e.from, e.to, e.partitioning.name()))
            .collect();
        format!(
            "pipeline {} stages {} edges {}",
            self.name,
            stages.join(","),
            edges.join(",")
        )
    }

    /// Every instance, as (stage, index), in stage order.
    pub(crate) fn instances(&self) -> Vec<(usize, usize)> {
        self.stages
            .iter()
            .enumerate()
            .flat_map(|(s, d)| (0..d.parallelism).map(move |i| (s, i)))
            .collect()
    }

    pub(crate) fn instance_name(&self, s: usize, i: usize) -> String {
        format!("{}-{i}", self.stages[s].name)
    }
}

fn check_name(name: &str) -> Result<(), BuildError> {
    let ok = !name.is_empty()
        && name.len() <= 40
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    match ok {
        true => Ok(()),
        false => Err(BuildError::BadName {
            name: name.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Context, StageError};

    struct Nop;
    impl Operator for Nop {
        fn process(&mut self, _: &[u8], _: &mut Context<'_>) -> Result<(), StageError> {
            Ok(())
        }
    }
    struct NoSource;
    impl Source for NoSource {
        fn poll(&mut self, _: &mut Context<'_>) -> Result<bool, StageError> {
            Ok(false)
        }
        fn position(&mut self) -> Vec<u8> {
            Vec::new()
        }
        fn restore(&mut self, _: Option<&[u8]>) -> Result<(), StageError> {
            Ok(())
        }
    }

    fn base() -> Pipeline {
        Pipeline::new("p", "/nonexistent")
            .source("src", 2, |_| Box::new(NoSource))
            .operator("a", 2, |_| Box::new(Nop))
            .operator("b", 3, |_| Box::new(Nop))
    }

    #[test]
    fn a_good_graph_passes_and_wires_its_channels() {
        let p = base().edge("src", "a", Partitioning::Forward).edge(
            "a",
            "b",
            Partitioning::key(|r| r.len() as u64),
        );
        p.validate().unwrap();
        assert_eq!(p.inputs(1, 1), vec![(0, 1)]);
        assert_eq!(p.inputs(2, 0), vec![(1, 0), (1, 1)]);
        assert_eq!(p.instances().len(), 7);
    }

    #[test]
    fn a_cycle_is_refused_with_its_stages() {
        let p = base()
            .edge("src", "a", Partitioning::Rebalance)
            .edge("a", "b", Partitioning::Rebalance)
            .edge("b", "a", Partitioning::Rebalance);
        match p.validate() {
            Err(BuildError::Cycle { stages }) => assert_eq!(stages, ["a", "b", "a"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_edge_to_an_unknown_stage_is_refused() {
        let p = base().edge("src", "a", Partitioning::Rebalance).edge(
            "a",
            "nope",
            Partitioning::Rebalance,
        );
        assert!(matches!(
            p.validate(),
            Err(BuildError::UnknownStage { name, .. }) if name == "nope"
        ));
    }

    #[test]
    fn a_parallelism_of_zero_is_refused() {
        let p = Pipeline::new("p", "/x").source("src", 0, |_| Box::new(NoSource));
        let e = p.validate().unwrap_err();
        assert!(matches!(
            e,
            BuildError::BadParallelism { parallelism: 0, .. }
        ));
        assert!(e.to_string().contains("1 to 1024"), "{e}");
    }

    #[test]
    fn shapes_names_and_forward_parallelism_are_checked() {
        let p = base().edge("a", "b", Partitioning::Forward);
        assert!(matches!(
            p.validate(),
            Err(BuildError::ForwardMismatch { .. })
        ));
        let p = base().edge("src", "a", Partitioning::Rebalance);
        assert!(matches!(p.validate(), Err(BuildError::BadShape { stage, .. }) if stage == "b"));
        let p = Pipeline::new("bad name", "/x").source("s", 1, |_| Box::new(NoSource));
        assert!(matches!(p.validate(), Err(BuildError::BadName { .. })));
        let p = Pipeline::new("p", "/x").operator("a", 1, |_| Box::new(Nop));
        assert_eq!(p.validate(), Err(BuildError::Empty));
    }
}
