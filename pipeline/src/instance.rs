//! A stage instance: the process the supervisor starts for one (stage, index). It creates its
//! gate, opens its outputs, restores its checkpoint, and runs the stage's work between the
//! barriers.
//!
//! The checkpoint protocol, per kind of stage:
//! - a **source**, told by the supervisor to trigger checkpoint `n`, sends barrier `n` on
//!   every output between two records and acknowledges `n` with its position;
//! - an **operator** or **sink**, when its gate releases barrier `n`, snapshots (its bytes,
//!   its keyed state's savepoint, a sink's pre-commit), forwards the barrier, and
//!   acknowledges `n` — at once when released aligned, after the in-flight records the
//!   barrier overtook (which it processes and keeps with the checkpoint) when unaligned;
//! - an acknowledgement is a state file written atomically, then a line to the supervisor.
//!
//! At the end of its input a source sends an end-of-input event, tells the supervisor, and
//! waits for the final (aligned) checkpoint, then ends its stream once that checkpoint is
//! complete (a final checkpoint that expires is triggered again); an operator that has the event from every
//! channel calls `finish` and passes the event on. A sink keeps running until its
//! pre-committed transactions are committed.

use std::collections::VecDeque;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use shmflow::{
    Alignment, Gate, GateGeometry, GateMessage, LatencyMarkers, Partition, Partitioner, Producer,
    Released,
};

use crate::control::{self, FromInstance, Lines, ToInstance};
use crate::error::{PeerFailure, StageError};
use crate::graph::{Kind, Partitioning, Pipeline};
use crate::keyed::KeyedState;
use crate::stage::{Context, KeyedSlot, Operator, Sink};
use crate::store::{InstanceState, Store};

pub(crate) const ENV_ROLE: &str = "SHMFLOW_PIPELINE_INSTANCE";
pub(crate) const ENV_REGIONS: &str = "SHMFLOW_PIPELINE_REGIONS";
pub(crate) const ENV_RESTORE: &str = "SHMFLOW_PIPELINE_RESTORE";
pub(crate) const ENV_FD: &str = "SHMFLOW_PIPELINE_CONTROL_FD";
pub(crate) const ENV_SUPERVISOR: &str = "SHMFLOW_PIPELINE_SUPERVISOR";
pub(crate) const ENV_OLDEST: &str = "SHMFLOW_PIPELINE_OLDEST_RETAINED";

/// The event a source sends on every output at the end of its input.
pub(crate) const END_OF_INPUT: u32 = 0x5346_454f;

/// How long an instance waits for a downstream gate to be created.
const OPEN_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a waiting instance looks at its control messages.
const TICK: Duration = Duration::from_millis(20);

/// The shared-memory name of instance `i` of `stage`'s gate.
pub(crate) fn gate_name(regions: &str, stage: &str, i: usize) -> String {
    format!("/{regions}-{stage}-{i}")
}

/// Runs this process as the instance its environment names, and exits.
pub(crate) fn run(p: &Pipeline, role: &str) -> ! {
    let code = match Instance::start(p, role) {
        Err(e) => {
            eprintln!("shmflow-pipeline instance {role}: {e}");
            2
        }
        Ok(mut inst) => {
            // A panic in the stage's code is its own failure: the hook tells the supervisor
            // before the unwinding drops the gate and outputs (and the peers report theirs).
            let out = inst.control.out.clone();
            let default_hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                // try_lock: a panic while this thread holds the connection must not deadlock.
                if let Ok(mut out) = out.try_lock() {
                    let msg = FromInstance::Error {
                        own: true,
                        text: format!("panicked: {info}"),
                    };
                    let _ = control::send(&mut out, &msg.line());
                }
                default_hook(info);
            }));
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inst.work(p))) {
                Ok(Ok(())) => 0,
                Ok(Err(e)) => {
                    eprintln!("shmflow-pipeline instance {role}: {e}");
                    1
                }
                // The panic hook told the supervisor.
                Err(_) => 101,
            }
        }
    };
    std::process::exit(code)
}

/// The control connection, instance side: a thread reads the supervisor's lines into an
/// inbox; the instance's own thread looks at it between records.
struct Control {
    /// Shared with the acknowledgement writer: one line per write, under the mutex.
    out: Arc<Mutex<UnixStream>>,
    inbox: Arc<(Mutex<VecDeque<ToInstance>>, Condvar)>,
    /// Set by the reader after it queued a message, cleared by the taker. A hint only: the
    /// queue itself is under the mutex, so Relaxed on both sides (the mutex orders the data).
    pending: Arc<AtomicBool>,
}

impl Control {
    fn new(stream: UnixStream) -> std::io::Result<Control> {
        let reader = stream.try_clone()?;
        let inbox = Arc::new((Mutex::new(VecDeque::new()), Condvar::new()));
        let pending = Arc::new(AtomicBool::new(false));
        let (ib, pd) = (inbox.clone(), pending.clone());
        std::thread::Builder::new()
            .name("shmflow-control".into())
            .spawn(move || {
                let mut lines = Lines::new(reader);
                loop {
                    let msg = match lines.next() {
                        Ok(Some(line)) => ToInstance::parse(&line),
                        Ok(None) => Err("the supervisor is gone".to_owned()),
                        Err(e) => Err(e.to_string()),
                    };
                    match msg {
                        Ok(m) => {
                            ib.0.lock().unwrap_or_else(|p| p.into_inner()).push_back(m);
                            pd.store(true, Ordering::Relaxed);
                            ib.1.notify_all();
                        }
                        Err(e) => {
                            // The supervisor owns this process's lifetime: without it there is
                            // nobody to acknowledge to, and a new supervisor restarts us.
                            eprintln!("shmflow-pipeline instance: {e}; exiting");
                            std::process::exit(3);
                        }
                    }
                }
            })?;
        Ok(Control {
            out: Arc::new(Mutex::new(stream)),
            inbox,
            pending,
        })
    }

    fn has_pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed)
    }

    fn take(&self) -> Vec<ToInstance> {
        let mut q = self.inbox.0.lock().unwrap_or_else(|p| p.into_inner());
        self.pending.store(false, Ordering::Relaxed);
        q.drain(..).collect()
    }

    /// Waits up to `timeout` for a message.
    fn wait(&self, timeout: Duration) {
        let q = self.inbox.0.lock().unwrap_or_else(|p| p.into_inner());
        if q.is_empty() {
            let _ = self.inbox.1.wait_timeout(q, timeout);
        }
    }

    fn send(&mut self, msg: &FromInstance) {
        send_line(&self.out, msg);
    }
}

/// Writes one message; a failed write means the supervisor is gone (the reader thread then
/// ends the process).
fn send_line(out: &Mutex<UnixStream>, msg: &FromInstance) {
    let mut out = out.lock().unwrap_or_else(|p| p.into_inner());
    let _ = control::send(&mut out, &msg.line());
}

/// The asynchronous part of a checkpoint (Flink's async snapshot phase): the state captured
/// at the barrier is written and synced by this thread while the instance goes on with its
/// records; the acknowledgement follows the write. When several states wait, only the newest
/// is written: the coordinator triggers a checkpoint only once the one before ended, and one
/// whose acknowledgement is still waiting here cannot have completed, so it was aborted.
struct Acker {
    tx: Option<mpsc::Sender<(u64, InstanceState, u64)>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Why a write failed; the instance's thread fails with it at its next look.
    failure: Arc<Mutex<Option<String>>>,
}

impl Acker {
    fn start(store: Store, name: String, control: &Control) -> std::io::Result<Acker> {
        let (tx, rx) = mpsc::channel::<(u64, InstanceState, u64)>();
        let failure = Arc::new(Mutex::new(None));
        let (out, pending, fail) = (
            control.out.clone(),
            control.pending.clone(),
            failure.clone(),
        );
        let thread = std::thread::Builder::new()
            .name("shmflow-ack".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let (id, state, alignment_ns) = rx.try_iter().last().unwrap_or(first);
                    match store.ack(id, &name, &state) {
                        Ok(bytes) => send_line(
                            &out,
                            &FromInstance::Ack {
                                id,
                                bytes,
                                alignment_ns,
                            },
                        ),
                        Err(e) => {
                            *fail.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some(format!("writing checkpoint {id} of {name}: {e}"));
                            // The instance's thread looks at its control flag between records.
                            pending.store(true, Ordering::Relaxed);
                            return;
                        }
                    }
                }
            })?;
        Ok(Acker {
            tx: Some(tx),
            thread: Some(thread),
            failure,
        })
    }

    fn ack(&self, id: u64, state: InstanceState, alignment_ns: u64) {
        if let Some(tx) = &self.tx {
            // After a failure the thread is gone and the send fails: `check` reports it.
            let _ = tx.send((id, state, alignment_ns));
        }
    }

    /// The writer's failure, if it failed.
    fn check(&self) -> Result<(), StageError> {
        match self
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            Some(e) => Err(StageError::msg(e)),
            None => Ok(()),
        }
    }

    /// Waits until every acknowledgement handed over is written and sent.
    fn finish(&mut self) -> Result<(), StageError> {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.check()
    }
}

struct Instance {
    stage: usize,
    index: usize,
    name: String,
    regions: String,
    store: Store,
    restore: Option<u64>,
    control: Control,
    acker: Acker,
    keyed: KeyedSlot,
}

fn env(name: &str) -> Result<String, StageError> {
    std::env::var(name).map_err(|_| StageError::msg(format!("{name} is not set")))
}

impl Instance {
    fn start(p: &Pipeline, role: &str) -> Result<Instance, StageError> {
        let (stage_name, index) = role
            .rsplit_once('/')
            .and_then(|(s, i)| Some((s, i.parse::<usize>().ok()?)))
            .ok_or_else(|| StageError::msg(format!("{ENV_ROLE}={role:?} is not STAGE/INDEX")))?;
        let stage = p
            .stage_index(stage_name)
            .filter(|&s| index < p.stages[s].parallelism)
            .ok_or_else(|| {
                StageError::msg(format!("{role:?} is not an instance of this pipeline"))
            })?;
        // The supervisor that started us must still be our parent: it may have died between
        // the fork and the parent-death signal's setting.
        let supervisor: u32 = env(ENV_SUPERVISOR)?
            .parse()
            .map_err(|_| StageError::msg(format!("{ENV_SUPERVISOR} is not a pid")))?;
        // SAFETY: getppid has no preconditions.
        if unsafe { libc::getppid() } as u32 != supervisor {
            return Err(StageError::msg(
                "the supervisor died before this instance started",
            ));
        }
        let fd: i32 = env(ENV_FD)?
            .parse()
            .map_err(|_| StageError::msg(format!("{ENV_FD} is not a descriptor")))?;
        // SAFETY: fcntl(F_GETFD) only asks whether the descriptor is open.
        if fd < 3 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(StageError::msg(format!(
                "{ENV_FD}={fd} is not an open descriptor"
            )));
        }
        // SAFETY: the supervisor passed this descriptor (one end of a socket pair) to this
        // process alone, and nothing else in it owns or closes it.
        let stream = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
        // Not inherited by what the stage's own code may start.
        // SAFETY: fcntl on the descriptor this process now owns.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        let restore = match env(ENV_RESTORE)?.as_str() {
            "" => None,
            id => Some(
                id.parse()
                    .map_err(|_| StageError::msg(format!("{ENV_RESTORE}={id:?}")))?,
            ),
        };
        let name = p.instance_name(stage, index);
        let store = Store { dir: p.dir.clone() };
        let keyed_path = store.keyed(&name);
        let oldest = env(ENV_OLDEST)?.parse().unwrap_or(0);
        let keyed = KeyedSlot {
            path: keyed_path,
            cache: p.keyed_cache,
            oldest_retained: oldest,
            state: None,
        };
        let control = Control::new(stream)?;
        let acker = Acker::start(store.clone(), name.clone(), &control)?;
        Ok(Instance {
            stage,
            index,
            name,
            regions: env(ENV_REGIONS)?,
            store,
            restore,
            control,
            acker,
            keyed,
        })
    }

    /// The checkpoint this instance starts from, checked, with its keyed state rolled back.
    fn restored(&mut self) -> Result<InstanceState, StageError> {
        let Some(id) = self.restore else {
            KeyedState::discard(&self.keyed.path)?;
            return Ok(InstanceState::default());
        };
        let state = self.store.load(id, &self.name).map_err(StageError::msg)?;
        match state.keyed {
            Some(sp) => self.keyed.get()?.restore(id, sp)?,
            None => KeyedState::discard(&self.keyed.path)?,
        }
        Ok(state)
    }

    /// One partition per output edge, over producers into the downstream gates.
    fn outputs(&self, p: &Pipeline) -> Result<Vec<Partition>, StageError> {
        let me = &p.stages[self.stage].name;
        let mut parts = Vec::new();
        for e in p.edges.iter().filter(|e| &e.from == me) {
            let t = p.stage_index(&e.to).expect("validated");
            let receivers: Vec<usize> = match e.partitioning {
                Partitioning::Forward => vec![self.index],
                _ => (0..p.stages[t].parallelism).collect(),
            };
            let mut producers = Vec::new();
            for j in receivers {
                let channel = p
                    .inputs(t, j)
                    .iter()
                    .position(|&x| x == (self.stage, self.index))
                    .expect("every sender has a channel");
                producers.push(open_channel(
                    &gate_name(&self.regions, &e.to, j),
                    channel as u32,
                )?);
            }
            let partitioner = match &e.partitioning {
                Partitioning::Broadcast => Partitioner::Broadcast,
                Partitioning::Key(f) => {
                    let f = f.clone();
                    Partitioner::Key(Box::new(move |r: &[u8]| f(r)))
                }
                _ => Partitioner::RoundRobin,
            };
            parts.push(Partition::new(producers, partitioner)?);
        }
        Ok(parts)
    }

    fn ack(&mut self, id: u64, state: InstanceState, alignment_ns: u64) -> Result<(), StageError> {
        self.acker.ack(id, state, alignment_ns);
        Ok(())
    }

    fn work(&mut self, p: &Pipeline) -> Result<(), StageError> {
        let decl = &p.stages[self.stage];
        // The gate first (its producers wait for it), then the outputs.
        let mut gate = match decl.kind {
            Kind::Source(_) => None,
            _ => {
                let channels = p.inputs(self.stage, self.index).len() as u32;
                let geometry = GateGeometry::new(channels)
                    .with_exclusive(p.gate_exclusive)
                    .with_floating(p.gate_floating)
                    .with_segment_size(p.segment_size);
                Some(Gate::create(
                    &gate_name(&self.regions, &decl.name, self.index),
                    geometry,
                )?)
            }
        };
        let mut outputs = self.outputs(p)?;
        let restored = self.restored()?;
        let result = match (&decl.kind, gate.as_mut()) {
            (Kind::Source(make), None) => self.source(p, make(self.index), &restored, &mut outputs),
            (Kind::Operator(make), Some(gate)) => {
                let mut op = make(self.index);
                if self.restore.is_some() {
                    op.restore(&restored.operator)?;
                }
                self.consume(p, Work::Operator(op), gate, restored, &mut outputs)
            }
            (Kind::Sink(make), Some(gate)) => {
                let mut sink = make(self.index);
                let committable: Vec<Vec<u8>> = restored
                    .transactions
                    .iter()
                    .map(|(_, t)| t.clone())
                    .collect();
                sink.recover(&committable)?;
                self.consume(p, Work::Sink(sink), gate, restored, &mut outputs)
            }
            _ => unreachable!("a gate exactly for operators and sinks"),
        };
        let result = result.and_then(|()| self.acker.finish());
        if let Err(e) = &result {
            // The cause first, before the gate and outputs go: their peers fail in turn, and
            // the supervisor names the first error it heard as the failure's cause.
            self.control.send(&FromInstance::Error {
                own: !e.is_peer_failure(),
                text: e.to_string(),
            });
            for part in outputs {
                part.fail();
            }
        }
        drop(gate);
        result
    }

    fn source(
        &mut self,
        p: &Pipeline,
        mut source: Box<dyn crate::Source>,
        restored: &InstanceState,
        outputs: &mut [Partition],
    ) -> Result<(), StageError> {
        source.restore(self.restore.map(|_| restored.operator.as_slice()))?;
        let parallelism = p.stages[self.stage].parallelism;
        if let Some(interval) = p.latency_markers {
            // The stage's name cut so that the instance's number always fits the label (a
            // marker's label holds 32 bytes).
            let suffix = format!("-{}", self.index);
            let name = &p.stages[self.stage].name;
            let mut cut = name.len().min(32 - suffix.len());
            while !name.is_char_boundary(cut) {
                cut -= 1;
            }
            let label = format!("{}{suffix}", &name[..cut]);
            for out in outputs.iter_mut() {
                out.set_latency_markers(Some(LatencyMarkers::every(interval, &label)));
            }
        }
        let mut ended = false;
        // The final checkpoint sent, not yet complete: the stream ends once it is (one that
        // expires is triggered again, so the source stays until then).
        let mut final_sent: Option<u64> = None;
        loop {
            if self.control.has_pending() {
                self.acker.check()?;
                for msg in self.control.take() {
                    match msg {
                        ToInstance::Trigger {
                            id,
                            alignment,
                            last,
                        } => {
                            let mut state = InstanceState {
                                operator: source.position(),
                                ..InstanceState::default()
                            };
                            if let Some(k) = self.keyed.state.as_mut() {
                                state.keyed = Some(k.checkpoint(id)?);
                            }
                            let payload = alignment_payload(alignment);
                            for out in outputs.iter_mut() {
                                out.send_barrier(id, alignment, &payload)?;
                            }
                            self.ack(id, state, 0)?;
                            if last {
                                for out in outputs.iter_mut() {
                                    out.flush()?;
                                }
                                final_sent = Some(id);
                            }
                        }
                        ToInstance::Complete { id, .. } => {
                            source.notify_checkpoint_complete(id)?;
                            if final_sent.is_some_and(|f| id >= f) {
                                // The end of the stream, after the final checkpoint.
                                return Ok(());
                            }
                        }
                        ToInstance::Abort { .. } => {}
                    }
                }
            }
            if ended {
                self.control.wait(TICK);
                continue;
            }
            let mut ctx = Context {
                outputs,
                keyed: &mut self.keyed,
                instance: self.index,
                parallelism,
            };
            if !source.poll(&mut ctx)? {
                ended = true;
                for out in outputs.iter_mut() {
                    out.send_event(END_OF_INPUT, b"")?;
                    out.flush()?;
                }
                self.control.send(&FromInstance::Finished);
            }
        }
    }

    fn consume(
        &mut self,
        p: &Pipeline,
        mut work: Work,
        gate: &mut Gate,
        restored: InstanceState,
        outputs: &mut [Partition],
    ) -> Result<(), StageError> {
        let parallelism = p.stages[self.stage].parallelism;
        let mut ended = vec![false; gate.channels() as usize];
        let mut finished = restored.finished;
        let mut end_forwarded = false;
        let mut pending: Option<(u64, InstanceState, u64)> = None;
        let mut transactions: Vec<(u64, Vec<u8>)> = Vec::new();
        // The newest barrier released here, and the newest checkpoint heard complete.
        let (mut last_barrier, mut completed) = (0u64, 0u64);
        let mut told_processed = false;
        let mut buf = Vec::new();
        // What the restored checkpoint's unaligned barrier overtook, first.
        for r in &restored.in_flight {
            let mut ctx = Context {
                outputs,
                keyed: &mut self.keyed,
                instance: self.index,
                parallelism,
            };
            work.record(r, &mut ctx)?;
        }
        loop {
            if self.control.has_pending() {
                self.acker.check()?;
                for msg in self.control.take() {
                    match msg {
                        ToInstance::Complete { id, oldest } => {
                            self.completed(&mut work, &mut transactions, id, oldest)?;
                            completed = completed.max(id);
                        }
                        ToInstance::Abort { id } => {
                            if pending.as_ref().is_some_and(|(p, _, _)| *p == id) {
                                pending = None;
                            }
                        }
                        ToInstance::Trigger { .. } => {}
                    }
                }
            }
            let msg = match gate.recv_timeout(TICK) {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(shmflow::RecvTimeoutError::Timeout) => continue,
                Err(e) => return Err(e.into()),
            };
            let mut ctx = Context {
                outputs,
                keyed: &mut self.keyed,
                instance: self.index,
                parallelism,
            };
            match msg {
                GateMessage::Record { record, .. } => {
                    let bytes = match record.as_bytes() {
                        Some(b) => b,
                        None => {
                            buf.clear();
                            record.read_all_into(&mut buf)?;
                            &buf[..]
                        }
                    };
                    work.record(bytes, &mut ctx)?;
                    if !told_processed {
                        told_processed = true;
                        self.control.send(&FromInstance::Processed);
                    }
                }
                GateMessage::InFlight {
                    checkpoint, record, ..
                } => {
                    let bytes = match record.as_bytes() {
                        Some(b) => b.to_vec(),
                        None => record.to_vec()?,
                    };
                    work.record(&bytes, &mut ctx)?;
                    if let Some((id, state, _)) = &mut pending {
                        if *id == checkpoint {
                            state.in_flight.push(bytes);
                        }
                    }
                }
                GateMessage::Barrier {
                    id,
                    released,
                    emitted_ns,
                    alignment_ns,
                    payload,
                } => {
                    last_barrier = last_barrier.max(id);
                    let alignment = payload_alignment(payload);
                    let payload = payload.to_vec();
                    let mut state = InstanceState {
                        finished,
                        ..InstanceState::default()
                    };
                    match &mut work {
                        Work::Operator(op) => state.operator = op.snapshot()?,
                        Work::Sink(sink) => {
                            transactions.push((id, sink.pre_commit(id)?));
                            state.transactions = transactions.clone();
                        }
                    }
                    if let Some(k) = self.keyed.state.as_mut() {
                        state.keyed = Some(k.checkpoint(id)?);
                    }
                    for out in outputs.iter_mut() {
                        out.forward_barrier(id, alignment, emitted_ns, &payload)?;
                    }
                    match released {
                        Released::Aligned => self.ack(id, state, alignment_ns)?,
                        _ => pending = Some((id, state, alignment_ns)),
                    }
                }
                GateMessage::InFlightEnd { id }
                    if pending.as_ref().is_some_and(|(p, _, _)| *p == id) =>
                {
                    let (id, state, align) = pending.take().expect("checked");
                    self.ack(id, state, align)?;
                }
                GateMessage::BarrierCancelled { id }
                    if pending.as_ref().is_some_and(|(p, _, _)| *p == id) =>
                {
                    pending = None;
                }
                GateMessage::Event { channel, event } if event.kind == END_OF_INPUT => {
                    ended[channel as usize] = true;
                    if ended.iter().all(|&e| e) && !end_forwarded {
                        if !finished {
                            if let Work::Operator(op) = &mut work {
                                op.finish(&mut ctx)?;
                            }
                            finished = true;
                        }
                        for out in outputs.iter_mut() {
                            out.send_event(END_OF_INPUT, b"")?;
                            out.flush()?;
                        }
                        end_forwarded = true;
                    }
                }
                // A marker goes on to every output (to one channel of each), as Flink's
                // operators pass one on, so the gates downstream measure from the source.
                GateMessage::LatencyMarker { marker, .. } => {
                    for out in outputs.iter_mut() {
                        out.forward_latency_marker(&marker)?;
                    }
                }
                GateMessage::ChannelDead { channel, error } => {
                    return Err(PeerFailure(format!(
                        "input channel {channel} ({}): {error}",
                        upstream(p, self.stage, self.index, channel as usize)
                    ))
                    .into())
                }
                GateMessage::ChannelFailed { channel, error } => {
                    return Err(PeerFailure(format!(
                        "input channel {channel} ({}): {error}",
                        upstream(p, self.stage, self.index, channel as usize)
                    ))
                    .into())
                }
                // The end of one channel, other events, and kinds a later version may add.
                _ => {}
            }
        }
        for out in outputs.iter_mut() {
            out.flush()?;
        }
        // The input ends only after the final checkpoint completed (the sources end their
        // streams then): the instance stays until it has heard so, so that a sink commits what
        // it pre-committed and an operator is told (the supervisor bounds the wait).
        while completed < last_barrier || !transactions.is_empty() {
            self.acker.check()?;
            for msg in self.control.take() {
                if let ToInstance::Complete { id, oldest } = msg {
                    self.completed(&mut work, &mut transactions, id, oldest)?;
                    completed = completed.max(id);
                }
            }
            if completed < last_barrier || !transactions.is_empty() {
                self.control.wait(TICK);
            }
        }
        Ok(())
    }

    /// Checkpoint `id` is complete: a sink commits its transactions up to it, an operator is
    /// told, keyed state may drop the savepoints older than `oldest`.
    fn completed(
        &mut self,
        work: &mut Work,
        transactions: &mut Vec<(u64, Vec<u8>)>,
        id: u64,
        oldest: u64,
    ) -> Result<(), StageError> {
        match work {
            Work::Sink(sink) => {
                for (_, t) in transactions.iter().filter(|(c, _)| *c <= id) {
                    sink.commit(t)?;
                }
                transactions.retain(|(c, _)| *c > id);
            }
            Work::Operator(op) => op.notify_checkpoint_complete(id)?,
        }
        self.keyed.oldest_retained = self.keyed.oldest_retained.max(oldest);
        if let Some(k) = self.keyed.state.as_mut() {
            k.set_oldest_retained(oldest);
        }
        Ok(())
    }
}

enum Work {
    Operator(Box<dyn Operator>),
    Sink(Box<dyn Sink>),
}

impl Work {
    fn record(&mut self, bytes: &[u8], ctx: &mut Context<'_>) -> Result<(), StageError> {
        match self {
            Work::Operator(op) => op.process(bytes, ctx),
            Work::Sink(sink) => sink.write(bytes),
        }
    }
}

/// The upstream instance behind a gate channel, for messages.
fn upstream(p: &Pipeline, stage: usize, index: usize, channel: usize) -> String {
    match p.inputs(stage, index).get(channel) {
        Some(&(u, j)) => p.instance_name(u, j),
        None => "unknown".to_owned(),
    }
}

/// A barrier's payload carries its alignment, so that every stage forwards it as the source
/// sent it (the final checkpoint is aligned whatever the configuration).
fn alignment_payload(a: Alignment) -> Vec<u8> {
    let (mode, ms) = match a {
        Alignment::Unaligned => (1u8, 0u64),
        Alignment::AlignedWithTimeout(t) => (2, t.as_millis() as u64),
        _ => (0, 0),
    };
    let mut v = vec![mode];
    v.extend_from_slice(&ms.to_le_bytes());
    v
}

fn payload_alignment(payload: &[u8]) -> Alignment {
    let ms = payload
        .get(1..9)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .unwrap_or(0);
    match payload.first() {
        Some(1) => Alignment::Unaligned,
        Some(2) => Alignment::AlignedWithTimeout(Duration::from_millis(ms)),
        _ => Alignment::Aligned,
    }
}

/// Opens channel `c` of a gate its consumer may not have created yet.
fn open_channel(name: &str, c: u32) -> Result<Producer, StageError> {
    let start = Instant::now();
    loop {
        match Producer::open_channel(name, c) {
            Ok(p) => return Ok(p),
            Err(shmflow::OpenError::NotFound { .. }) if start.elapsed() < OPEN_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => return Err(StageError::msg(format!("opening {name} channel {c}: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_barrier_payload_carries_its_alignment() {
        for a in [
            Alignment::Aligned,
            Alignment::Unaligned,
            Alignment::AlignedWithTimeout(Duration::from_millis(75)),
        ] {
            assert_eq!(payload_alignment(&alignment_payload(a)), a);
        }
        assert_eq!(payload_alignment(b""), Alignment::Aligned);
    }
}
