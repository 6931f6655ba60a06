//! The supervisor: what Flink's JobManager does, for one pipeline on one machine. It starts
//! every instance, coordinates the checkpoints, and fails over on any failure.
//!
//! **Recovery protocol.** Any instance that exits non-zero or dies by a signal (or a
//! checkpoint failure beyond the tolerable number) is a failure of the whole pipeline, as in
//! Flink's full-restart failover: every other instance is killed (SIGKILL) and reaped, the
//! run's shared-memory regions are removed, the checkpoints that never completed are
//! discarded, and — if the restart strategy allows it, after its delay — every instance is
//! started again from the newest completed checkpoint that verifies (metadata, sizes and
//! checksums): sources seek to their positions, operators load their state, keyed state
//! rolls back to its savepoint, in-flight records an unaligned barrier overtook are
//! processed again, sinks commit the transactions of that checkpoint and abort the rest.
//! Each run of instances has its own region names, so nothing of a failed run is read by
//! the next.
//!
//! Instances die with the supervisor: each is started with a parent-death signal (SIGKILL),
//! checks at start that the supervisor is still its parent, and exits when the control
//! connection closes. A supervisor started again on the same directory takes its lock,
//! removes what the dead run left in `/dev/shm`, and resumes from the last completed
//! checkpoint.

use std::collections::HashMap;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::config::{Alignment, Restarts};
use crate::control::{self, FromInstance, LineError, Lines, ToInstance};
use crate::error::{io, RunError};
use crate::graph::{Kind, Pipeline};
use crate::instance::{ENV_FD, ENV_OLDEST, ENV_REGIONS, ENV_RESTORE, ENV_ROLE, ENV_SUPERVISOR};
use crate::metrics::Metrics;
use crate::store::{write_atomic, Store, Unusable};

/// How long the instances may take to end after the final checkpoint completed (a sink's
/// commits, the streams' ends).
const SHUTDOWN: Duration = Duration::from_secs(60);

/// What a run of the supervisor did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunSummary {
    /// Restarts made by this supervisor.
    pub restarts: u32,
    /// Checkpoints completed by this supervisor.
    pub completed_checkpoints: u64,
    /// Checkpoints that failed (timed out) under this supervisor.
    pub failed_checkpoints: u64,
    /// The newest completed checkpoint.
    pub last_checkpoint: Option<u64>,
    /// The pipeline had already run to its end in this directory: nothing was started.
    pub already_finished: bool,
}

impl std::fmt::Display for RunSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.already_finished {
            return write!(
                f,
                "the pipeline had already finished (start it fresh to run again)"
            );
        }
        write!(
            f,
            "finished: {} checkpoint(s) completed, {} failed, {} restart(s)",
            self.completed_checkpoints, self.failed_checkpoints, self.restarts
        )
    }
}

/// A message from an instance of attempt `attempt`, or its connection's protocol error.
enum Event {
    Msg(usize, FromInstance),
    Garbage(usize, String),
}

/// The checkpoint in progress: id, trigger time, final or not, acknowledgements by slot
/// (state bytes, alignment ns).
type InProgress = (u64, Instant, bool, HashMap<usize, (u64, u64)>);

/// How an attempt ended.
enum Outcome {
    Finished,
    Failed(String),
}

struct Supervisor<'p> {
    p: &'p Pipeline,
    store: Store,
    names: Vec<String>,
    instances: Vec<(usize, usize)>,
    metrics: Metrics,
    /// Region names start with this (`/dev/shm/PREFIX…`).
    prefix: String,
    summary: RunSummary,
    /// When the last failure was seen: the recovery time runs from here.
    failed_at: Option<Instant>,
}

/// Runs the pipeline to its end (or until the restart strategy gives up).
pub(crate) fn supervise(p: &Pipeline) -> Result<RunSummary, RunError> {
    p.validate()?;
    let (store, _lock) = Store::open(&p.dir, &p.identity(), p.fresh)?;
    let instances = p.instances();
    let names = instances
        .iter()
        .map(|&(s, i)| p.instance_name(s, i))
        .collect();
    let dir = fs::canonicalize(&p.dir).map_err(io(format!("resolving {}", p.dir.display())))?;
    let prefix = format!(
        "shmflow-pl-{}-{:08x}",
        p.name,
        crc32fast::hash(dir.as_os_str().as_encoded_bytes())
    );
    let metrics = Metrics::load(&store.dir);
    let mut sup = Supervisor {
        p,
        store,
        names,
        instances,
        metrics,
        prefix,
        summary: RunSummary {
            restarts: 0,
            completed_checkpoints: 0,
            failed_checkpoints: 0,
            last_checkpoint: None,
            already_finished: false,
        },
        failed_at: None,
    };
    // What a dead supervisor's instances left (they died with it).
    sup.remove_regions();
    if sup.store.dir.join("finished").exists() {
        sup.summary.already_finished = true;
        return Ok(sup.summary);
    }
    let mut restarts = Restarts::new(p.restart);
    sup.metrics.state = "running".into();
    sup.metrics.supervisor_pid = std::process::id();
    sup.metrics.restart_strategy = p.restart.name().into();
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let restore = match sup.restore_point() {
            Ok(r) => r,
            Err(e) => {
                sup.metrics.state = "failed".into();
                sup.metrics.save(&sup.store.dir);
                return Err(e);
            }
        };
        let outcome = sup.attempt(attempt, restore);
        // The attempt's instances are gone (killed and reaped), whatever its outcome.
        sup.remove_regions();
        // An error of the attempt (an instance that cannot be started, a checkpoint that cannot
        // be written) is a failure like an instance's, under the restart strategy.
        let outcome = outcome.unwrap_or_else(|e| Outcome::Failed(e.to_string()));
        match outcome {
            Outcome::Finished => {
                write_atomic(&sup.store.dir, "finished", b"finished\n").map_err(io(format!(
                    "writing {}",
                    sup.store.dir.join("finished").display()
                )))?;
                sup.metrics.state = "finished".into();
                sup.metrics.save(&sup.store.dir);
                return Ok(sup.summary);
            }
            Outcome::Failed(cause) => {
                let now = Instant::now();
                sup.failed_at = Some(now);
                sup.metrics.last_failure_cause = cause.clone();
                let Some(wait) = restarts.on_failure(now) else {
                    sup.metrics.state = "failed".into();
                    sup.metrics.save(&sup.store.dir);
                    return Err(RunError::RestartsExhausted {
                        restarts: sup.summary.restarts,
                        cause,
                    });
                };
                sup.summary.restarts += 1;
                sup.metrics.num_restarts += 1;
                sup.metrics.state = "restarting".into();
                sup.metrics.save(&sup.store.dir);
                sup.say(format!(
                    "failure: {cause}; restart {} ({}) in {:?} from {}",
                    sup.summary.restarts,
                    p.restart.name(),
                    wait,
                    match sup.store.completed()?.first() {
                        Some(id) => format!("checkpoint {id}"),
                        None => "the beginning".into(),
                    }
                ));
                std::thread::sleep(wait);
                sup.metrics.state = "running".into();
            }
        }
    }
}

impl Supervisor<'_> {
    fn say(&self, text: String) {
        if !self.p.quiet {
            eprintln!("[pipeline {}] {text}", self.p.name);
        }
    }

    /// The newest completed checkpoint that verifies; the checkpoints after it (never
    /// completed, or corrupt) are removed. A corrupt one is reported, never loaded.
    fn restore_point(&mut self) -> Result<Option<u64>, RunError> {
        let completed = self.store.completed()?;
        let mut chosen = None;
        for &id in &completed {
            match self.store.verify(id, &self.names) {
                Ok(()) => {
                    chosen = Some(id);
                    break;
                }
                Err(Unusable::Corrupt(e)) => {
                    let to = self.store.set_aside(id)?;
                    eprintln!(
                        "[pipeline {}] checkpoint {id} is corrupt and is set aside as {}: {e}",
                        self.p.name,
                        to.display()
                    );
                }
                // Perhaps a passing fault: nothing is discarded for it.
                Err(Unusable::Io(e)) => return Err(e),
            }
        }
        if chosen.is_none() && !completed.is_empty() {
            return Err(RunError::NoUsableCheckpoint {
                dir: self.store.dir.clone(),
            });
        }
        for id in self.store.list()? {
            if chosen.is_none_or(|c| id > c) {
                self.store.remove(id)?;
            }
        }
        if let Some(c) = chosen {
            write_atomic(&self.store.dir, "completed", format!("{c}\n").as_bytes())
                .map_err(io("writing the completed pointer"))?;
        }
        Ok(chosen)
    }

    /// Removes every region of this pipeline's runs from `/dev/shm`.
    fn remove_regions(&self) {
        let Ok(entries) = fs::read_dir("/dev/shm") else {
            return;
        };
        for e in entries.flatten() {
            if e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&self.prefix))
            {
                let _ = fs::remove_file(e.path());
            }
        }
    }

    fn spawn(
        &self,
        slot: usize,
        regions: &str,
        restore: Option<u64>,
        oldest: u64,
    ) -> Result<(Child, UnixStream), RunError> {
        let (s, i) = self.instances[slot];
        let name = &self.names[slot];
        let spawn_err = |source| RunError::Spawn {
            instance: name.clone(),
            source,
        };
        let (ours, theirs) = UnixStream::pair().map_err(spawn_err)?;
        let fd = theirs.as_raw_fd();
        // This very program, even if its file was replaced or removed since it started.
        let mut cmd = Command::new("/proc/self/exe");
        if let Some(arg0) = std::env::args_os().next() {
            cmd.arg0(arg0);
        }
        cmd.args(std::env::args_os().skip(1))
            .env(ENV_ROLE, format!("{}/{i}", self.p.stages[s].name))
            .env(ENV_REGIONS, regions)
            .env(
                ENV_RESTORE,
                restore.map(|r| r.to_string()).unwrap_or_default(),
            )
            .env(ENV_FD, fd.to_string())
            .env(ENV_SUPERVISOR, std::process::id().to_string())
            .env(ENV_OLDEST, oldest.to_string());
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // async-signal-safe functions (prctl, fcntl) on values copied into it.
        unsafe {
            cmd.pre_exec(move || {
                // The instance dies with the supervisor's thread that started it.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The control socket's end survives the exec (every other descriptor of the
                // supervisor is close-on-exec).
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(spawn_err)?;
        drop(theirs);
        Ok((child, ours))
    }

    /// One run of every instance, from checkpoint `restore`.
    fn attempt(&mut self, attempt: u32, restore: Option<u64>) -> Result<Outcome, RunError> {
        let cfg = self.p.checkpoints;
        let regions = format!("{}-{}x{attempt}", self.prefix, std::process::id());
        let oldest = self.store.completed()?.last().copied().unwrap_or(0);
        if let Some(c) = restore {
            self.metrics.last_restore_timestamp_ms = wall_ms();
            self.say(format!("starting from checkpoint {c}"));
        }
        let (tx, rx) = mpsc::channel::<Event>();
        let mut children: Vec<Option<Child>> = Vec::new();
        let mut streams: Vec<UnixStream> = Vec::new();
        let mut status = format!("attempt {attempt}\n");
        for slot in 0..self.instances.len() {
            let (child, stream) = match self.spawn(slot, &regions, restore, oldest) {
                Ok(c) => c,
                Err(e) => {
                    kill_all(&mut children);
                    return Err(e);
                }
            };
            status.push_str(&format!("{} {}\n", self.names[slot], child.id()));
            let reader = match stream.try_clone() {
                Ok(r) => r,
                Err(e) => {
                    children.push(Some(child));
                    kill_all(&mut children);
                    return Err(io("cloning a control socket")(e));
                }
            };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut lines = Lines::new(reader);
                loop {
                    let ev = match lines.next() {
                        Ok(Some(line)) => match FromInstance::parse(&line) {
                            Ok(m) => Event::Msg(slot, m),
                            Err(e) => Event::Garbage(slot, e),
                        },
                        // The end, or a connection reset by an instance that exited: its exit
                        // status says how it ended.
                        Ok(None) | Err(LineError::Io(_)) => return,
                        Err(LineError::Protocol(e)) => Event::Garbage(slot, e),
                    };
                    let garbage = matches!(ev, Event::Garbage(..));
                    if tx.send(ev).is_err() || garbage {
                        return;
                    }
                }
            });
            children.push(Some(child));
            streams.push(stream);
        }
        drop(tx);
        let _ = fs::write(self.store.dir.join("status"), status);
        let outcome = self.coordinate(&cfg, restore, &rx, &mut children, &mut streams);
        kill_all(&mut children);
        outcome
    }

    /// The checkpoint coordinator and the watch over the instances, until the end or a
    /// failure.
    fn coordinate(
        &mut self,
        cfg: &crate::CheckpointConfig,
        restore: Option<u64>,
        rx: &mpsc::Receiver<Event>,
        children: &mut [Option<Child>],
        streams: &mut [UnixStream],
    ) -> Result<Outcome, RunError> {
        let pids: Vec<u32> = children
            .iter()
            .map(|c| c.as_ref().map_or(0, Child::id))
            .collect();
        let sources: Vec<usize> = (0..self.instances.len())
            .filter(|&slot| matches!(self.p.stages[self.instances[slot].0].kind, Kind::Source(_)))
            .collect();
        let mut finished_sources = vec![false; self.instances.len()];
        let mut next_id = restore.unwrap_or(0) + 1;
        // The checkpoint in progress: id, trigger time, final?, acknowledgements.
        let mut current: Option<InProgress> = None;
        let mut last_trigger = Instant::now();
        let mut last_end = Instant::now();
        let mut consecutive_failures = 0u32;
        let mut final_done = false;
        // When the final checkpoint completed: the instances end within a bound after it.
        let mut final_at: Option<Instant> = None;
        let mut recovered = self.failed_at.is_none();
        let mut errors: Vec<(usize, bool, String)> = Vec::new();
        let mut exited = vec![false; self.instances.len()];
        loop {
            let ev = rx.recv_timeout(Duration::from_millis(5));
            let mut evs = Vec::new();
            match ev {
                Ok(e) => {
                    evs.push(e);
                    evs.extend(rx.try_iter());
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {}
            }
            for ev in evs {
                match ev {
                    Event::Garbage(slot, e) => {
                        return Ok(Outcome::Failed(format!(
                            "instance {}: {e}",
                            self.names[slot]
                        )))
                    }
                    Event::Msg(slot, FromInstance::Error { own, text }) => {
                        errors.push((slot, own, text));
                    }
                    Event::Msg(slot, FromInstance::Finished) => {
                        finished_sources[slot] = true;
                    }
                    Event::Msg(_, FromInstance::Processed) => {
                        if !recovered {
                            recovered = true;
                            if let Some(t) = self.failed_at {
                                let ms = t.elapsed().as_secs_f64() * 1e3;
                                self.metrics.last_recovery_time_ms = ms;
                                self.metrics.last_recovered_timestamp_ms = wall_ms();
                                self.metrics.save(&self.store.dir);
                                self.say(format!(
                                    "recovered: first record processed {ms:.1} ms after the failure"
                                ));
                            }
                        }
                    }
                    Event::Msg(
                        slot,
                        FromInstance::Ack {
                            id,
                            bytes,
                            alignment_ns,
                        },
                    ) => match &mut current {
                        Some((cid, _, _, acks)) if *cid == id => {
                            acks.insert(slot, (bytes, alignment_ns));
                        }
                        // An acknowledgement of an aborted checkpoint: its files go too.
                        _ if id < next_id => self.store.remove_aborted(id),
                        _ => {
                            return Ok(Outcome::Failed(format!(
                                "instance {} acknowledged checkpoint {id}, never triggered",
                                self.names[slot]
                            )))
                        }
                    },
                }
            }
            // Complete?
            if let Some((id, started, last, acks)) = &current {
                if acks.len() == self.instances.len() {
                    let (id, started, last) = (*id, *started, *last);
                    let align = acks.values().map(|&(_, a)| a).max().unwrap_or(0);
                    let size = self.store.complete(id, &self.names)?;
                    let duration = started.elapsed();
                    // Keep the newest `retained`.
                    let completed = self.store.completed()?;
                    let keep = cfg.retained.max(1) as usize;
                    for &old in completed.iter().skip(keep) {
                        self.store.remove(old)?;
                    }
                    // What aborted checkpoints left (late acknowledgements).
                    for old in self.store.list()? {
                        if old < id && !completed.contains(&old) {
                            self.store.remove_aborted(old);
                        }
                    }
                    let oldest = completed
                        .iter()
                        .take(keep)
                        .next_back()
                        .copied()
                        .unwrap_or(id);
                    for s in streams.iter_mut() {
                        let _ = control::send(s, &ToInstance::Complete { id, oldest }.line());
                    }
                    self.metrics.completed_checkpoints += 1;
                    self.metrics.last_checkpoint_id = id;
                    self.metrics.last_checkpoint_duration_ms = duration.as_secs_f64() * 1e3;
                    self.metrics.last_checkpoint_size = size;
                    self.metrics.checkpoint_alignment_time_ms = align as f64 / 1e6;
                    self.metrics.save(&self.store.dir);
                    self.summary.completed_checkpoints += 1;
                    self.summary.last_checkpoint = Some(id);
                    self.say(format!(
                        "checkpoint {id}{} complete in {:.1} ms, {size} bytes, alignment {:.1} ms",
                        if last { " (final)" } else { "" },
                        duration.as_secs_f64() * 1e3,
                        align as f64 / 1e6
                    ));
                    current = None;
                    last_end = Instant::now();
                    consecutive_failures = 0;
                    if last {
                        final_done = true;
                        final_at = Some(Instant::now());
                    }
                }
            }
            // Expired?
            if let Some((id, started, last, _)) = &current {
                if started.elapsed() >= cfg.timeout {
                    let (id, last) = (*id, *last);
                    for s in streams.iter_mut() {
                        let _ = control::send(s, &ToInstance::Abort { id }.line());
                    }
                    self.store.remove_aborted(id);
                    self.metrics.failed_checkpoints += 1;
                    self.summary.failed_checkpoints += 1;
                    self.metrics.save(&self.store.dir);
                    consecutive_failures += 1;
                    current = None;
                    last_end = Instant::now();
                    self.say(format!(
                        "checkpoint {id}{} expired after {:?} and is aborted",
                        if last { " (final)" } else { "" },
                        cfg.timeout
                    ));
                    if consecutive_failures > cfg.tolerable_failures {
                        return Ok(Outcome::Failed(format!(
                            "{consecutive_failures} checkpoint(s) failed in a row, {} tolerated",
                            cfg.tolerable_failures
                        )));
                    }
                }
            }
            // Trigger?
            let all_finished = sources.iter().all(|&s| finished_sources[s]);
            let now = Instant::now();
            if current.is_none()
                && !final_done
                && now >= last_end + cfg.min_pause
                && (all_finished || now >= last_trigger + cfg.interval)
            {
                let id = next_id;
                next_id += 1;
                let alignment = if all_finished {
                    Alignment::Aligned
                } else {
                    cfg.alignment
                };
                let msg = ToInstance::Trigger {
                    id,
                    alignment,
                    last: all_finished,
                }
                .line();
                for &s in &sources {
                    let _ = control::send(&mut streams[s], &msg);
                }
                current = Some((id, now, all_finished, HashMap::new()));
                last_trigger = now;
            }
            // The instances.
            let mut failed = Vec::new();
            for slot in 0..children.len() {
                let Some(child) = children[slot].as_mut() else {
                    continue;
                };
                match child.try_wait() {
                    Ok(Some(st)) => {
                        children[slot] = None;
                        exited[slot] = true;
                        if !st.success() {
                            failed.push((slot, st));
                        }
                    }
                    Ok(None) => {}
                    Err(e) => return Err(io(format!("waiting for {}", self.names[slot]))(e)),
                }
            }
            if !failed.is_empty() {
                return Ok(Outcome::Failed(
                    self.root_cause(failed, children, rx, &pids, errors),
                ));
            }
            if final_at.is_some_and(|t| t.elapsed() > SHUTDOWN) {
                let left: Vec<&str> = (0..children.len())
                    .filter(|&s| children[s].is_some())
                    .map(|s| self.names[s].as_str())
                    .collect();
                return Ok(Outcome::Failed(format!(
                    "{} did not end within {SHUTDOWN:?} of the final checkpoint",
                    left.join(", ")
                )));
            }
            if exited.iter().all(|&e| e) {
                // Acknowledgements sent just before the exits.
                for ev in rx.try_iter() {
                    if let Event::Msg(slot, FromInstance::Ack { id, .. }) = ev {
                        if let Some((cid, _, _, acks)) = &mut current {
                            if *cid == id {
                                acks.insert(slot, (0, 0));
                            }
                        }
                    }
                }
                if let Some((id, _, true, acks)) = &current {
                    if acks.len() == self.instances.len() {
                        let id = *id;
                        self.store.complete(id, &self.names)?;
                        self.metrics.completed_checkpoints += 1;
                        self.metrics.last_checkpoint_id = id;
                        self.summary.completed_checkpoints += 1;
                        self.summary.last_checkpoint = Some(id);
                        final_done = true;
                    }
                }
                return Ok(match final_done {
                    true => Outcome::Finished,
                    false => Outcome::Failed(
                        "every instance ended before the final checkpoint completed".into(),
                    ),
                });
            }
        }
    }
}

impl Supervisor<'_> {
    /// The failure that started it all: a failure travels (an instance that loses its peer
    /// fails in turn), so the supervisor gathers what failed within a short grace, and names
    /// an instance killed by a signal first, else the first that reported an error.
    fn root_cause(
        &self,
        mut failed: Vec<(usize, std::process::ExitStatus)>,
        children: &mut [Option<Child>],
        rx: &mpsc::Receiver<Event>,
        pids: &[u32],
        mut errors: Vec<(usize, bool, String)>,
    ) -> String {
        // A failure travels, so what failed first may be a consequence: gather exits and
        // errors until a death by a signal or an error of an instance's own is among them
        // (at most 200 ms; a killed instance's peers may notice and exit before it is reaped).
        let start = Instant::now();
        let grace = |failed: &[(usize, std::process::ExitStatus)],
                     errors: &[(usize, bool, String)]| {
            let found = failed.iter().any(|(s, st)| {
                st.signal().is_some() || errors.iter().any(|(e, own, _)| e == s && *own)
            });
            !found && start.elapsed() < Duration::from_millis(200)
        };
        loop {
            for ev in rx.try_iter() {
                if let Event::Msg(s, FromInstance::Error { own, text }) = ev {
                    errors.push((s, own, text));
                }
            }
            if !grace(&failed, &errors) {
                break;
            }
            for (slot, c) in children.iter_mut().enumerate() {
                if let Some(Ok(Some(st))) = c.as_mut().map(Child::try_wait) {
                    *c = None;
                    if !st.success() {
                        failed.push((slot, st));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        for ev in rx.try_iter() {
            if let Event::Msg(s, FromInstance::Error { own, text }) = ev {
                errors.push((s, own, text));
            }
        }
        let by_signal = failed.iter().find(|(_, st)| st.signal().is_some());
        // An error of the stage's own before one that reports a peer's failure.
        let first_error = |own: bool| {
            errors
                .iter()
                .filter(|(_, o, _)| *o == own)
                .find_map(|(s, _, _)| failed.iter().find(|(f, _)| f == s))
        };
        let (slot, status) = by_signal
            .or_else(|| first_error(true))
            .or_else(|| first_error(false))
            .unwrap_or(&failed[0]);
        let how = match (status.code(), status.signal()) {
            (Some(code), _) => format!("exited with code {code}"),
            (_, Some(sig)) => format!("was killed by signal {sig} ({})", signal_name(sig)),
            _ => "ended".to_owned(),
        };
        let why = errors
            .iter()
            .find(|(s, _, _)| s == slot)
            .map(|(_, _, e)| format!(": {e}"))
            .unwrap_or_default();
        format!(
            "instance {} (pid {}) {how}{why}",
            self.names[*slot], pids[*slot]
        )
    }
}

fn kill_all(children: &mut [Option<Child>]) {
    for c in children.iter_mut().flatten() {
        let _ = c.kill();
    }
    for c in children.iter_mut() {
        if let Some(mut child) = c.take() {
            let _ = child.wait();
        }
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGINT => "SIGINT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGPIPE => "SIGPIPE",
        _ => "a signal",
    }
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
