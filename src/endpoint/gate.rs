//! Gates: one consumer reading `M` channels, each written by its own producer process, with
//! Flink's exclusive and floating segments (credit-based flow control).
//!
//! A gate is one region (layout in `protocol::abi`): each channel has its own header, rings and
//! `exclusive` segments; the gate owns `floating` segments that it lends to channels that ask
//! (see `pool.rs` for the protocol). The consumer blocks on one futex word for the whole gate,
//! which every channel's producer wakes, and reads the channels round-robin, at most
//! [`QUANTUM`] messages from one before it looks at the next, so a busy channel cannot starve
//! another. The number of channels is fixed when the gate is created.
//!
//! What `recv` returns, per channel, in order: its records and events
//! ([`GateMessage::Record`], [`GateMessage::Event`]), then exactly one of
//! [`GateMessage::EndOfPartition`] (its producer detached; everything it committed was
//! delivered) or [`GateMessage::ChannelDead`] (its producer died; everything it committed was
//! delivered first, and its floating segments went back to the pool). After every channel has
//! ended, `recv` returns `Ok(None)`.
//!
//! Checkpoint barriers ([`Producer::send_barrier`](crate::Producer::send_barrier)) are
//! aligned across the channels and handed out once per checkpoint
//! ([`GateMessage::Barrier`]); the rules — holding, the switch to unaligned, the in-flight
//! records handed back ([`GateMessage::InFlight`]), cancellation by a newer id, channels that
//! close during an alignment, ids that go backwards — are on [`GateMessage::Barrier`].

use std::time::Duration;

use crate::endpoint::consumer::Message;
use crate::endpoint::consumer::Record;
use crate::endpoint::consumer::{Consumer, Ready, UncleanEnd};
use crate::endpoint::event::{Barrier, Event, Released};
use crate::endpoint::gate_stats::{self as stats, GateSnapshot};
use crate::endpoint::metrics::Waiting;
use std::convert::Infallible;

use crate::error::{corrupt, Halt, Lost, RecvError, RecvTimeoutError, TryRecvError};
use crate::protocol::abi::GateGeometry;
use crate::protocol::park::{self, Forever, Immediately, Patience, Until, WaitStrategy};
use crate::protocol::pool;
use crate::region::os::Host;
use crate::region::view::Shared;
use crate::sync::Arc;
use crate::sys::clock::monotonic_ns;

/// Messages the gate takes from one channel before it moves on to the next that has data.
pub const QUANTUM: u32 = 8;

/// What a gate hands out.
#[non_exhaustive]
pub enum GateMessage<'a> {
    /// A record from `channel`.
    Record {
        /// The channel it came through.
        channel: u32,
        /// The record, in place.
        record: Record<'a>,
    },
    /// An event from `channel` (ordinary or priority).
    Event {
        /// The channel it came through.
        channel: u32,
        /// The event.
        event: Event<'a>,
    },
    /// `channel`'s producer detached after everything it sent was delivered.
    EndOfPartition {
        /// The channel that ended.
        channel: u32,
    },
    /// `channel`'s producer was dropped while its thread unwound from a panic; everything it
    /// committed was delivered before this.
    ChannelFailed {
        /// The channel whose producer failed.
        channel: u32,
        /// Which producer.
        error: Box<crate::error::ProducerFailedError>,
    },
    /// `channel`'s producer died; everything it committed was delivered before this.
    ChannelDead {
        /// The channel whose producer died.
        channel: u32,
        /// What died, naming the pid.
        error: Box<crate::error::PeerDeadError>,
    },
    /// Checkpoint barrier `id` is released: take the checkpoint now. Every record handed out
    /// before belongs before it. `Released::Aligned`: every open channel's barrier had
    /// arrived, and what follows belongs after it. `Released::Unaligned`: it was released
    /// early (an unaligned barrier, or an aligned one whose alignment timeout passed); the
    /// records still queued in front of the barrier on the channels where it had not arrived
    /// follow as [`GateMessage::InFlight`] (to process, and to persist with the checkpoint),
    /// then [`GateMessage::InFlightEnd`].
    ///
    /// The rules where a choice is left: a channel whose barrier has arrived is held (its
    /// records and in-band barriers are not read; its priority events and announcements are,
    /// since they overtake its data); a channel that ends, fails or dies during the alignment
    /// no longer counts; a barrier with a newer id cancels the checkpoint in progress
    /// ([`GateMessage::BarrierCancelled`]), and an older barrier arriving later is ignored
    /// (a checkpoint never begun because a newer one began first — an unaligned barrier can
    /// overtake an older in-band one — is subsumed by it, and never reported); an
    /// id at or below a channel's last is that channel's protocol error
    /// ([`RecvError::Corrupt`], and the channel is closed); an aligned barrier sent with an
    /// alignment timeout switches once that time has passed since it was sent (the emitter's
    /// clock), counted from its announcement, which overtakes the queued records.
    Barrier {
        /// The checkpoint id.
        id: u64,
        /// How it was released.
        released: Released,
        /// The emitter's monotonic clock when it sent the barrier (the first barrier or
        /// announcement of this id the gate saw).
        emitted_ns: u64,
        /// Nanoseconds from the first barrier (or announcement) of this id the gate saw to its
        /// release: the alignment time (Flink's `checkpointAlignmentTime`).
        alignment_ns: u64,
        /// The payload of the first barrier of this id the gate saw.
        payload: &'a [u8],
    },
    /// Checkpoint `id` was abandoned for a newer one before it was complete (before its
    /// release, or before its in-flight records were all handed out).
    BarrierCancelled {
        /// The abandoned checkpoint.
        id: u64,
    },
    /// A record from `channel` that an unaligned barrier overtook: process it as any record,
    /// and persist it as part of `checkpoint`'s in-flight data (handed out once, in order).
    InFlight {
        /// The channel it came through.
        channel: u32,
        /// The checkpoint whose in-flight data it is.
        checkpoint: u64,
        /// The record, in place.
        record: Record<'a>,
    },
    /// Every in-flight record of checkpoint `id` has been handed out: the checkpoint is
    /// complete.
    InFlightEnd {
        /// The checkpoint.
        id: u64,
    },
}

impl GateMessage<'_> {
    /// The channel the message is about (`None` for a checkpoint's messages, which are about
    /// every channel).
    pub fn channel(&self) -> Option<u32> {
        match self {
            GateMessage::Record { channel, .. }
            | GateMessage::Event { channel, .. }
            | GateMessage::EndOfPartition { channel }
            | GateMessage::ChannelFailed { channel, .. }
            | GateMessage::ChannelDead { channel, .. }
            | GateMessage::InFlight { channel, .. } => Some(*channel),
            GateMessage::Barrier { .. }
            | GateMessage::BarrierCancelled { .. }
            | GateMessage::InFlightEnd { .. } => None,
        }
    }
}

#[derive(Debug)]
enum State {
    Open,
    /// The producer died: deliver what it committed, then report this error.
    Dying(Lost),
    /// Its producer detached (and the message that said so borrowed the channel): its floating
    /// segments go back to the pool at the next call.
    Ended,
    /// Broke the protocol: closed at the next call. Its producer may still be running and
    /// writing the floating segments it holds, so they stay out of the pool.
    Failed,
    Done,
}

/// What the scan decided, before anything borrows a channel (`None` from the scan: nothing
/// to do now).
enum Pick {
    Read(usize),
    Ended(usize),
    Dead(usize, Lost),
    Failed(usize, RecvError),
    AllDone,
    /// An alignment's timeout passed: switch it.
    Switch,
}

/// What one delivery gave: a message, the end of every channel, or nothing to hand out
/// (a barrier the gate took in): look again.
enum Delivered<'a> {
    Message(GateMessage<'a>),
    AllDone,
    Again,
}

/// The reading end of a gate. Single-threaded (`Send`, not `Sync`).
pub struct Gate {
    chans: Vec<Consumer>,
    state: Vec<State>,
    geometry: GateGeometry,
    /// Floating segments lent to nobody: the gate's alone, used by its one thread.
    pool: pool::Pool,
    shared: Arc<Shared>,
    wait: WaitStrategy,
    /// Round-robin: the channel read last, and how many messages in a row it gave.
    rr: usize,
    burst: u32,
    /// Scans since the last liveness look, to look now and then while busy too.
    scans: u32,
    last_check_ns: u64,
    /// Async calls since the last look at the executor's budget.
    #[cfg(any(feature = "tokio", shmflow_loom))]
    coop: u8,
    /// Checkpoint alignment.
    cp: Checkpoints,
    /// Channels whose producer is a direct network end here, and their watcher (made with
    /// the first).
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    links: Option<links::Links>,
}

/// The gate's checkpoint state: the alignment, what it said that the caller has not been told
/// yet, and what a release reports.
struct Checkpoints {
    align: align::Aligner,
    /// Oldest first.
    steps: std::collections::VecDeque<align::Step>,
    scratch: Vec<align::Step>,
    /// The payload of the newest checkpoint seen (its id), for its release.
    payload: Option<(u64, Vec<u8>)>,
    /// The channels held when the last checkpoint was released (and a buffer for the next).
    held_at_release: Vec<usize>,
    held_scratch: Vec<usize>,
    /// In-flight records and bytes handed out per channel, not yet published.
    inflight: Vec<(u64, u64)>,
    /// Per channel, its last in-band barrier: id, when the gate read it, when it was sent.
    arrivals: Vec<Option<(u64, u64, u64)>>,
}

impl Checkpoints {
    fn new(channels: usize) -> Checkpoints {
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
    fn input(&mut self, f: impl FnOnce(&mut align::Aligner, u64, &mut Vec<align::Step>)) {
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
    fn barrier(&mut self, c: usize, b: &Barrier<'_>) {
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
    fn closed(&mut self, c: usize) {
        self.input(|al, now, out| al.closed(c, now, out));
    }

    /// Lets the alignment see the clock: a timeout that passed switches it.
    fn tick(&mut self) {
        if self.align.switch_at_ns().is_some() {
            self.input(|al, now, out| al.tick(now, out));
        }
    }
}

mod align;
#[cfg(any(feature = "tokio", shmflow_loom))]
mod asynch;
#[cfg(all(feature = "net", not(shmflow_loom)))]
mod links;

impl Gate {
    /// Creates a named gate (`/name`, mode 0600, fails if it exists) and attaches as its
    /// consumer; each producer attaches with [`crate::Producer::open_channel`]. The name is
    /// unlinked when the gate is dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::{Gate, GateGeometry, GateMessage, Producer};
    ///
    /// let name = format!("/shmflow-doc-gate-{}", std::process::id());
    /// let mut gate = Gate::create(&name, GateGeometry::new(2))?;
    /// // Each producer (usually another process) opens its channel.
    /// let mut a = Producer::open_channel(&name, 0)?;
    /// let b = Producer::open_channel(&name, 1)?;
    /// a.send(b"from a")?;
    /// drop(a);
    /// drop(b);
    /// let mut records = 0;
    /// while let Some(m) = gate.recv()? {
    ///     match m {
    ///         GateMessage::Record { channel, record } => {
    ///             assert_eq!((channel, record.as_bytes()), (0, Some(&b"from a"[..])));
    ///             records += 1;
    ///         }
    ///         GateMessage::EndOfPartition { .. } => {}
    ///         other => panic!("{other:?}"),
    ///     }
    /// }
    /// assert_eq!(records, 1);
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`AlreadyExists`](crate::OpenError::AlreadyExists) (or
    /// [`Stale`](crate::OpenError::Stale)), [`InvalidConfig`](crate::OpenError::InvalidConfig)
    /// for a bad name or geometry, [`NoMemory`](crate::OpenError::NoMemory) if the system
    /// cannot back the region, [`Io`](crate::OpenError::Io).
    #[cfg(not(shmflow_loom))]
    pub fn create(name: &str, geometry: GateGeometry) -> Result<Gate, crate::error::OpenError> {
        let (chans, lock) = crate::region::object::gate_create_named(name, geometry)?;
        Gate::attach(chans, Some(lock))
    }

    /// Creates an anonymous (memfd) gate and attaches as its consumer; handle `c` gives
    /// channel `c` to a child process, which calls [`crate::Producer::from_env`].
    ///
    /// The gate's park words get doorbells, on which awaiting tasks sleep in the tokio
    /// reactor: two descriptors each, `2 × (channels + 1)` in this process, and four more per
    /// child while it is spawned. Where the process has no descriptors to spare, the gate is
    /// made without them and its awaiting tasks sleep through the bridge thread instead.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use shmflow::{Gate, GateGeometry};
    ///
    /// let (mut gate, handles) = Gate::create_anonymous(GateGeometry::new(2))?;
    /// for (c, h) in handles.iter().enumerate() {
    ///     let mut cmd = std::process::Command::new("my-producer");
    ///     h.pass_to(&mut cmd, "SHMFLOW_FD"); // the child calls Producer::from_env("SHMFLOW_FD")
    ///     cmd.arg(c.to_string()).spawn()?;
    /// }
    /// drop(handles);
    /// while let Some(m) = gate.recv()? {
    ///     println!("channel {:?}", m.channel());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`InvalidConfig`](crate::OpenError::InvalidConfig) for a bad geometry,
    /// [`NoMemory`](crate::OpenError::NoMemory), [`Io`](crate::OpenError::Io).
    #[cfg(not(shmflow_loom))]
    pub fn create_anonymous(
        geometry: GateGeometry,
    ) -> Result<(Gate, Vec<crate::region::handoff::PeerHandle>), crate::error::OpenError> {
        let (chans, lock) = crate::region::object::gate_create_memfd(geometry)?;
        let handles = chans
            .iter()
            .map(|s| crate::region::handoff::PeerHandle::new(s))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((Gate::attach(chans, Some(lock))?, handles))
    }

    pub(crate) fn attach(
        chans: Vec<Arc<Shared>>,
        lock: Option<std::sync::Arc<crate::region::liveness::EndLock>>,
    ) -> Result<Gate, crate::error::OpenError> {
        let shared = chans[0].clone();
        let geometry = shared.gate.as_ref().expect("gate channels").geometry;
        let pool = pool::Pool::new(geometry.floating_range());
        let n_channels = chans.len();
        let mut consumers = Vec::with_capacity(chans.len());
        for (c, s) in chans.into_iter().enumerate() {
            let lending = pool::Lending::new(geometry.exclusive_range(c as u32));
            consumers.push(Consumer::attach_as(
                s,
                lock.clone(),
                pool::Recycler::Lent(lending),
            )?);
        }
        let g = shared.gate.as_ref().expect("gate channels").gate_header();
        // The gate's own attach state (its channels' are attached above): a fresh gate's
        // creator finds it free.
        if let Err(found) = g.consumer.attach(std::process::id()) {
            return Err(crate::error::OpenError::corrupt(
                &shared.name,
                "gate consumer attach state",
                "0 (free) in a gate this process just made".into(),
                found as u64,
            ));
        }
        Ok(Gate {
            state: consumers.iter().map(|_| State::Open).collect(),
            chans: consumers,
            geometry,
            pool,
            shared,
            wait: WaitStrategy::default(),
            rr: 0,
            burst: 0,
            scans: 0,
            last_check_ns: 0,
            #[cfg(any(feature = "tokio", shmflow_loom))]
            coop: 0,
            cp: Checkpoints::new(n_channels),
            #[cfg(all(feature = "net", not(shmflow_loom)))]
            links: None,
        })
    }

    /// Channel `c`'s region, for a direct network end that is to be its producer: `Err` says
    /// why it cannot be (no such channel, it ended, or it has such an end already).
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(crate) fn link_slot(&self, c: usize) -> Result<Arc<Shared>, String> {
        let n = self.chans.len();
        if c >= n {
            return Err(format!("the gate has {n} channels (0 to {})", n - 1));
        }
        if !matches!(self.state[c], State::Open) {
            return Err("the channel has ended".into());
        }
        if self.chans[c].link_fd().is_some() {
            return Err("the channel has a remote producer already".into());
        }
        Ok(self.chans[c].shared.clone())
    }

    /// Watches `fd`, the socket of channel `c`'s coming link (see `links.rs`): a failure
    /// here leaves the channel as it was.
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(crate) fn watch_link(
        &mut self,
        c: usize,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> std::io::Result<()> {
        if self.links.is_none() {
            self.links = Some(links::Links::start(self.shared.clone(), self.chans.len())?);
        }
        self.links.as_ref().expect("made above").watch(c, fd)
    }

    /// Makes channel `c`'s producer the direct network end whose receiving side is `link`
    /// (its socket watched already, [`Gate::watch_link`]): the gate's thread fills the channel
    /// from its socket (see `links.rs`).
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(crate) fn set_link(&mut self, c: usize, link: Box<dyn crate::endpoint::remote::Inbound>) {
        self.chans[c].set_link(link);
        if let Some(l) = &self.links {
            // For bytes that came before the link was there to read them.
            l.mark(c);
        }
    }

    /// Channel `c`'s link, if it has one, reads what arrived when its socket got bytes or it
    /// has credit to announce (a call that finds nothing to do loads the mark and, for a
    /// linked channel, counts its free segments: a look at its return ring and the cap).
    #[inline]
    fn fill_link(&mut self, c: usize) {
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if let Some(l) = &self.links {
            let ch = &mut self.chans[c];
            if l.take(c) | ch.link_due() {
                ch.link_fill_now();
            }
        }
        #[cfg(not(all(feature = "net", not(shmflow_loom))))]
        let _ = c;
    }

    /// Every linked channel's link is filled at the next scan (a look after a sleep).
    fn mark_links(&mut self) {
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if let Some(l) = &self.links {
            for (c, ch) in self.chans.iter().enumerate() {
                if ch.link_fd().is_some() {
                    l.mark(c);
                }
            }
        }
    }

    /// The gate's shape.
    pub fn geometry(&self) -> GateGeometry {
        self.geometry
    }

    /// Name of the region.
    pub fn region_name(&self) -> &str {
        &self.shared.name
    }

    /// Number of channels.
    pub fn channels(&self) -> u32 {
        self.chans.len() as u32
    }

    /// Sets how blocking calls wait (see [`WaitStrategy`]), for the gate and every channel.
    pub fn set_wait_strategy(&mut self, wait: WaitStrategy) {
        self.wait = wait;
        for c in &mut self.chans {
            c.set_wait_strategy(wait);
        }
    }

    /// Sets the longest record accepted on every channel (see
    /// [`Consumer::set_max_record_len`]).
    pub fn set_max_record_len(&mut self, max: u64) {
        for c in &mut self.chans {
            c.set_max_record_len(max);
        }
    }

    /// Turns buffer debloating on for every channel with a target time, or off with `None`
    /// (see [`Consumer::set_debloat_target`]). Each channel's cap follows the rate at which
    /// the gate reads that channel while it is not waiting for data, so that what is in flight
    /// on all channels together holds about `target` of the gate's reading: a checkpoint
    /// barrier waits behind about that much, however many floating segments there are.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let name = format!("/shmflow-doc-gate-debloat-{}", std::process::id());
    /// let mut gate = shmflow::Gate::builder()
    ///     .channels(2)
    ///     .debloat_target(Duration::from_millis(100))
    ///     .create(&name)?;
    /// assert_eq!(gate.debloat_target(), Some(Duration::from_millis(100)));
    /// gate.set_debloat_target(None);
    /// assert_eq!(gate.debloat_target(), None);
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn set_debloat_target(&mut self, target: Option<Duration>) {
        for c in &mut self.chans {
            c.set_debloat_target(target);
        }
    }

    /// The debloating target in force (`None`: off).
    pub fn debloat_target(&self) -> Option<Duration> {
        self.chans.first().and_then(Consumer::debloat_target)
    }

    /// True once every channel has reported its end (or death): `recv` returns `Ok(None)`
    /// from then on.
    pub fn is_closed(&self) -> bool {
        self.state
            .iter()
            .all(|s| matches!(s, State::Done | State::Ended | State::Failed))
    }

    /// True until channel `c` has reported its end (or death).
    ///
    /// # Panics
    /// If `c` is not below [`Gate::channels`].
    pub fn is_open(&self, c: u32) -> bool {
        !matches!(
            self.state[c as usize],
            State::Done | State::Ended | State::Failed
        )
    }

    /// The gate's figures now: per channel and for the pools (see [`GateSnapshot`]).
    pub fn metrics(&self) -> GateSnapshot {
        stats::snapshot(
            &self
                .chans
                .iter()
                .map(|c| c.shared.clone())
                .collect::<Vec<_>>(),
        )
    }

    /// Floating segments in the pool (lent to nobody).
    pub fn floating_free(&self) -> usize {
        self.pool.free()
    }

    /// Takes back the floating segments channels handed back, then lends to channels that
    /// ask while the pool has some.
    fn lend(&mut self) {
        let before = self.pool.free();
        for c in &mut self.chans {
            if let Some(l) = c.lending() {
                for seg in l.take_returned() {
                    self.pool.put(seg);
                }
            }
        }
        if self.pool.free() > 0 {
            for (c, st) in self.chans.iter_mut().zip(&self.state) {
                if !matches!(st, State::Open) || c.backlog() == 0 {
                    continue;
                }
                let Some(seg) = self.pool.take() else { break };
                // A channel that turns out corrupt fails when it is read; lending is best
                // effort, and a segment that could not be handed over stays in the pool.
                if c.grant(seg).is_err() {
                    self.pool.put(seg);
                }
            }
        }
        if self.pool.free() != before {
            self.publish_pool();
        }
    }

    /// Looks at every channel once, starting with the one whose turn it is.
    fn scan(&mut self) -> Option<Pick> {
        let m = self.chans.len();
        let start = if self.burst < QUANTUM {
            self.rr
        } else {
            self.burst = 0;
            (self.rr + 1) % m
        };
        let mut all_done = true;
        for i in 0..m {
            let c = (start + i) % m;
            if matches!(self.state[c], State::Done | State::Ended | State::Failed) {
                continue;
            }
            all_done = false;
            self.fill_link(c);
            if !self.cp.align.readable(c) {
                // Held by an alignment: its priority lane only (priority events and
                // announcements overtake the data it holds).
                if self.chans[c].prio_waiting() {
                    return Some(Pick::Read(c));
                }
                continue;
            }
            match self.chans[c].ready() {
                Ok(Ready::Message) => {
                    if c != self.rr {
                        self.rr = c;
                        self.burst = 0;
                    }
                    return Some(Pick::Read(c));
                }
                Ok(Ready::Ended) => return Some(Pick::Ended(c)),
                Ok(Ready::Empty) => {
                    // A dead producer's channel, drained: its death is reported once.
                    if let State::Dying(_) = self.state[c] {
                        if let State::Dying(e) = std::mem::replace(&mut self.state[c], State::Done)
                        {
                            return Some(Pick::Dead(c, e));
                        }
                    }
                }
                Err(e) => return Some(Pick::Failed(c, e)),
            }
        }
        if all_done {
            Some(Pick::AllDone)
        } else {
            if self.rr == start {
                // The channel whose turn it was had nothing: the next one's turn.
                self.burst = QUANTUM;
            }
            None
        }
    }

    /// Looks at the producers' locks: a dead one's channel drains, then reports its death.
    fn check_producers(&mut self) {
        self.last_check_ns = monotonic_ns();
        for (c, st) in self.chans.iter_mut().zip(self.state.iter_mut()) {
            if matches!(st, State::Open) {
                if let Err(e) = c.check_producer() {
                    *st = State::Dying(e);
                }
            }
        }
    }

    /// What to deliver next, waiting as `patience` allows (a scan fails no call: a channel's
    /// failure is its pick).
    fn decide<P: Patience>(&mut self, patience: P) -> Result<Pick, P::Expired> {
        match self.switch_instant() {
            Some(at) => match self.decide_until(park::Sooner {
                inner: patience,
                at,
            }) {
                Ok(p) => Ok(p),
                Err(None) => Ok(Pick::Switch),
                Err(Some(x)) => Err(x),
            },
            None => self.decide_until(patience),
        }
    }

    /// When the alignment in progress switches to unaligned, as an instant, if it can.
    fn switch_instant(&self) -> Option<std::time::Instant> {
        let at = self.cp.align.switch_at_ns()?;
        let now = monotonic_ns();
        Some(std::time::Instant::now() + Duration::from_nanos(at.saturating_sub(now)))
    }

    fn decide_until<P: Patience>(&mut self, patience: P) -> Result<Pick, P::Expired> {
        self.lend();
        self.scans = self.scans.wrapping_add(1);
        if self.scans % 1024 == 0
            && monotonic_ns().saturating_sub(self.last_check_ns)
                > crate::protocol::park::CHECK_INTERVAL.as_nanos() as u64
        {
            // Busy with some channels: still notice a dead one within about the interval.
            self.check_producers();
        }
        if let Some(p) = self.scan() {
            return Ok(p);
        }
        let shared = self.shared.clone();
        let figures = &shared.gate.as_ref().expect("gate").gate_header().pool;
        // A `try_` look is no wait.
        let idle = patience
            .waits()
            .then(|| Waiting::start(&figures.idle_since_ns, &figures.idle_ns));
        let got = park::wait_for::<Host, _, _, Infallible>(
            shared.consumer_park(),
            self.wait,
            patience,
            park::Notifier::Light,
            park::Pace::Sparse,
            |look| Ok(self.poll_pick(look)),
        );
        drop(idle);
        got.map_err(Halt::expired)
    }

    /// What a waiting gate looks at: lends what was asked for, looks at the producers'
    /// liveness when due, and scans the channels.
    fn poll_pick(&mut self, look: crate::protocol::park::Look) -> Option<Pick> {
        self.lend();
        let due = || {
            monotonic_ns().saturating_sub(self.last_check_ns)
                > crate::protocol::park::CHECK_INTERVAL.as_nanos() as u64
        };
        if look == crate::protocol::park::Look::Now
            || (look == crate::protocol::park::Look::IfDue && due())
        {
            self.check_producers();
        }
        if look == crate::protocol::park::Look::Now {
            self.mark_links();
        }
        self.scan()
    }

    fn recv_inner<P: Patience>(
        &mut self,
        patience: P,
    ) -> Result<Option<GateMessage<'_>>, Halt<P::Expired, RecvError>> {
        self.retire_finished();
        loop {
            if let Some(step) = self.cp.steps.pop_front() {
                return Ok(Some(self.step_message(step)?));
            }
            self.cp.tick();
            if !self.cp.steps.is_empty() {
                continue;
            }
            let pick = self.decide(patience).map_err(Halt::Expired)?;
            let this: *mut Gate = self;
            // SAFETY: `this` is `self`, reborrowed for one call. The borrow ends with the
            // call on every path but the `return`, which returns it for the lifetime of
            // `self`; the compiler cannot see that the `Again` path holds no borrow (a known
            // limit of its borrow checker), so it is reborrowed through a pointer.
            match unsafe { &mut *this }.deliver(pick)? {
                Delivered::Message(m) => return Ok(Some(m)),
                Delivered::AllDone => return Ok(None),
                Delivered::Again => {}
            }
        }
    }

    fn gate_header(&self) -> &crate::protocol::abi::GateHeader {
        self.shared.gate.as_ref().expect("gate").gate_header()
    }

    /// Publishes a release's figures (for `shmflow stat`): the gate's, and what each held
    /// channel held back.
    fn publish_release(
        &mut self,
        id: u64,
        how: Released,
        started_ns: u64,
        emitted_ns: u64,
        now: u64,
    ) {
        use crate::protocol::abi::{RELEASED_ALIGNED, RELEASED_TIMED_OUT, RELEASED_UNALIGNED};
        use crate::protocol::counters::{add_owned, set};
        let (mut records, mut bytes) = (0, 0);
        for c in 0..self.chans.len() {
            let (r, b) = if self.cp.held_at_release.contains(&c) {
                self.chans[c].unread()
            } else {
                (0, 0)
            };
            let (held_ns, delay_ns) = match self.cp.arrivals[c] {
                Some((i, arrived, sent)) if i == id => {
                    (now.saturating_sub(arrived), now.saturating_sub(sent))
                }
                _ => (0, 0),
            };
            self.chans[c].set_held(r, b, held_ns, delay_ns);
            records += r;
            bytes += b;
        }
        let f = &self.gate_header().checkpoints;
        add_owned(&f.released, 1);
        set(&f.last_id, id);
        set(
            &f.last_how,
            match how {
                Released::Aligned => RELEASED_ALIGNED,
                Released::Unaligned { timed_out: false } => RELEASED_UNALIGNED,
                Released::Unaligned { timed_out: true } => RELEASED_TIMED_OUT,
            },
        );
        set(&f.last_alignment_ns, now.saturating_sub(started_ns));
        set(&f.last_start_delay_ns, now.saturating_sub(emitted_ns));
        set(&f.last_held_records, records);
        set(&f.last_held_bytes, bytes);
    }

    /// Publishes the in-flight counts handed out since the last call.
    fn publish_inflight(&mut self) {
        let (mut records, mut bytes) = (0, 0);
        for c in 0..self.chans.len() {
            let (r, b) = std::mem::take(&mut self.cp.inflight[c]);
            if r > 0 {
                self.chans[c].count_inflight(r, b);
                records += r;
                bytes += b;
            }
        }
        if records > 0 {
            let f = &self.gate_header().checkpoints;
            crate::protocol::counters::add_owned(&f.inflight_records, records);
            crate::protocol::counters::add_owned(&f.inflight_bytes, bytes);
        }
    }

    /// The message for what the alignment said.
    fn step_message(&mut self, step: align::Step) -> Result<GateMessage<'_>, RecvError> {
        Ok(match step {
            align::Step::Release {
                id,
                how,
                started_ns,
                emitted_ns,
                released_ns,
            } => {
                self.publish_release(id, how, started_ns, emitted_ns, released_ns);
                let payload: &[u8] = match &self.cp.payload {
                    Some((i, p)) if *i == id => p,
                    _ => &[],
                };
                GateMessage::Barrier {
                    id,
                    released: how,
                    emitted_ns,
                    alignment_ns: released_ns.saturating_sub(started_ns),
                    payload,
                }
            }
            align::Step::Cancelled { id } => {
                let f = &self.gate_header().checkpoints;
                crate::protocol::counters::add_owned(&f.abandoned, 1);
                GateMessage::BarrierCancelled { id }
            }
            align::Step::InFlightEnd { id } => GateMessage::InFlightEnd { id },
            align::Step::Backwards {
                channel,
                found,
                least,
            } => {
                self.state[channel] = State::Failed;
                self.cp.closed(channel);
                return Err(corrupt(
                    &self.shared.name,
                    "checkpoint barrier id",
                    format!("channel {channel}: an id of at least {least} (ids only grow)"),
                    found,
                )
                .into());
            }
        })
    }

    /// Channels that ended or failed on the last call are closed now (the message borrowed
    /// them then).
    fn retire_finished(&mut self) {
        self.publish_inflight();
        for c in 0..self.chans.len() {
            match self.state[c] {
                State::Ended => self.retire(c, true),
                State::Failed => self.retire(c, false),
                _ => {}
            }
        }
    }

    /// The message of what the scan picked.
    fn deliver(&mut self, pick: Pick) -> Result<Delivered<'_>, RecvError> {
        let c = match pick {
            Pick::AllDone => return Ok(Delivered::AllDone),
            Pick::Switch => {
                self.cp.tick();
                return Ok(Delivered::Again);
            }
            Pick::Ended(c) => {
                // The producer detached: it will never use the floating segments it holds.
                let failed = self.chans[c].producer_end();
                self.retire(c, true);
                self.cp.closed(c);
                return Ok(Delivered::Message(match failed {
                    Some(UncleanEnd::Failed(error)) => GateMessage::ChannelFailed {
                        channel: c as u32,
                        error,
                    },
                    // A network bridge that lost its remote producer.
                    Some(UncleanEnd::Lost(error)) => GateMessage::ChannelDead {
                        channel: c as u32,
                        error,
                    },
                    None => GateMessage::EndOfPartition { channel: c as u32 },
                }));
            }
            Pick::Dead(c, error) => {
                self.cp.closed(c);
                let error = match error {
                    Lost::PeerDead(e) => e,
                    // A failed liveness look (a syscall error): the producer may be alive.
                    Lost::Io(e) => {
                        self.retire(c, false);
                        return Err(e.into());
                    }
                };
                // Dead: it will never write the floating segments it holds again.
                self.retire(c, true);
                return Ok(Delivered::Message(GateMessage::ChannelDead {
                    channel: c as u32,
                    error,
                }));
            }
            Pick::Failed(c, e) => {
                // A channel that broke the protocol is closed; the others go on.
                self.state[c] = State::Failed;
                self.cp.closed(c);
                return Err(e);
            }
            Pick::Read(c) => c,
        };
        self.burst += 1;
        // `ready` said a message (or an error) is there, so this does not block.
        // (Only fields other than `chans` are touched while a message borrows a channel.)
        // A held channel gives its lane only (never a record or an in-band barrier, even if
        // its producer rewinds the lane's tail after the scan saw an entry).
        let got = if self.cp.align.readable(c) {
            self.chans[c].message_now()
        } else {
            self.chans[c]
                .lane_message()
                .map(Some)
                .map_err(|e| Halt::Failed(e.into()))
        };
        let m = match got {
            Ok(Some(Message::Record(record))) => match self.cp.align.in_flight(c) {
                Some(checkpoint) => {
                    // (A spanning record's bytes are not known before it is read: counted
                    // as a record of 0 bytes.)
                    let n = &mut self.cp.inflight[c];
                    *n = (n.0 + 1, n.1 + record.len().unwrap_or(0) as u64);
                    GateMessage::InFlight {
                        channel: c as u32,
                        checkpoint,
                        record,
                    }
                }
                None => GateMessage::Record {
                    channel: c as u32,
                    record,
                },
            },
            Ok(Some(Message::Event(event))) => GateMessage::Event {
                channel: c as u32,
                event,
            },
            Ok(Some(Message::Barrier(b))) => {
                self.cp.barrier(c, &b);
                return Ok(Delivered::Again);
            }
            Ok(None) => {
                // Reclaimed at the next call (the borrow of the channel lives until here).
                self.state[c] = State::Ended;
                self.cp.closed(c);
                GateMessage::EndOfPartition { channel: c as u32 }
            }
            // The producer ended the stream as failed (dropped while panicking).
            Err(Halt::Failed(RecvError::ProducerFailed(error))) => {
                self.state[c] = State::Ended;
                self.cp.closed(c);
                GateMessage::ChannelFailed {
                    channel: c as u32,
                    error,
                }
            }
            // `ready` saw a committed frame (or a priority event); only a producer rewriting
            // what it committed makes it vanish: the header (or the lane's tail) reads as
            // nothing now.
            Err(Halt::Expired(_)) => {
                self.state[c] = State::Failed;
                self.cp.closed(c);
                return Err(corrupt(
                    &self.shared.name,
                    "frame header or priority lane tail",
                    format!("what channel {c} had committed to stay committed"),
                    0,
                )
                .into());
            }
            // Over the reader's limit: the record is skipped, as on a plain channel, and the
            // channel goes on.
            Err(Halt::Failed(e @ RecvError::RecordTooLarge(_))) => return Err(e),
            Err(Halt::Failed(e)) => {
                self.state[c] = State::Failed;
                self.cp.closed(c);
                return Err(e);
            }
        };
        Ok(Delivered::Message(m))
    }

    /// Closes channel `c` for good. `reclaim`: its producer is gone (detached or dead), so its
    /// floating segments go back to the pool now. Otherwise (it broke the protocol, or its
    /// liveness could not be looked at) the producer may still be writing them: they stay out
    /// of the pool, and the channel's consumer end detaches so that the producer's next call
    /// fails with `Closed`.
    fn retire(&mut self, c: usize, reclaim: bool) {
        self.state[c] = State::Done;
        let ch = &mut self.chans[c];
        // A remote producer's link: its socket is closed (the sender already has the end).
        // Its producer, in this process, is gone with it: what it held can be taken back.
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        let reclaim = ch.drop_link() || reclaim;
        ch.abandon(reclaim);
        if let Some(l) = ch.lending() {
            for seg in l.take_returned() {
                self.pool.put(seg);
            }
        }
        self.publish_pool();
    }

    /// Publishes the pool's free count in the gate header (a figure for `shmflow stat`).
    fn publish_pool(&self) {
        let g = self
            .shared
            .gate
            .as_ref()
            .expect("gate channels")
            .gate_header();
        crate::protocol::counters::set(&g.pool.floating_free, self.pool.free() as u64);
    }

    /// The next message from any channel, blocking until there is one. `Ok(None)` once every
    /// channel has ended.
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::{Gate, GateGeometry, GateMessage, Producer};
    ///
    /// let name = format!("/shmflow-doc-grecv-{}", std::process::id());
    /// let mut gate = Gate::create(&name, GateGeometry::new(1))?;
    /// let mut p = Producer::open_channel(&name, 0)?;
    /// p.send(b"one")?;
    /// drop(p);
    /// assert!(matches!(gate.recv()?, Some(GateMessage::Record { channel: 0, .. })));
    /// assert!(matches!(gate.recv()?, Some(GateMessage::EndOfPartition { channel: 0 })));
    /// assert!(gate.recv()?.is_none());
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`RecvError::RecordTooLarge`](crate::RecvError::RecordTooLarge) for a record over
    /// [`Gate::set_max_record_len`]: it is skipped and its channel goes on. Any other error is
    /// a channel that broke the protocol (`Corrupt` and the like): that channel is closed (its
    /// producer's next call fails with `Closed`), the floating segments it holds stay out of
    /// the pool (its producer may still be writing them), and the next call goes on with the
    /// other channels.
    pub fn recv(&mut self) -> Result<Option<GateMessage<'_>>, RecvError> {
        self.recv_inner(Forever).map_err(Into::into)
    }

    /// As [`Gate::recv`], or [`TryRecvError::Empty`](crate::TryRecvError::Empty) if no
    /// channel has anything now.
    pub fn try_recv(&mut self) -> Result<Option<GateMessage<'_>>, TryRecvError> {
        self.recv_inner(Immediately).map_err(Into::into)
    }

    /// As [`Gate::recv`], waiting at most `timeout`
    /// ([`RecvTimeoutError::Timeout`](crate::RecvTimeoutError::Timeout)).
    pub fn recv_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<GateMessage<'_>>, RecvTimeoutError> {
        self.recv_inner(Until::after(timeout)).map_err(Into::into)
    }

    /// As [`Gate::recv`], waiting until `deadline` at most.
    pub fn recv_deadline(
        &mut self,
        deadline: std::time::Instant,
    ) -> Result<Option<GateMessage<'_>>, RecvTimeoutError> {
        self.recv_inner(Until::at(deadline)).map_err(Into::into)
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        #[cfg(shmflow_loom)]
        if std::thread::panicking() {
            return;
        }
        // Each channel's consumer marks its own header detached when it drops.
        let g = self.shared.gate.as_ref().expect("gate").gate_header();
        // Our last reads happen before anyone sees us gone.
        g.consumer.leave(crate::protocol::ends::Leave::Clean);
    }
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("region", &self.shared.name)
            .field("geometry", &self.geometry)
            .field("floating_free", &self.floating_free())
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for GateMessage<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GateMessage::Record { channel, record } => f
                .debug_struct("Record")
                .field("channel", channel)
                .field("record", record)
                .finish(),
            GateMessage::Event { channel, event } => f
                .debug_struct("Event")
                .field("channel", channel)
                .field("event", event)
                .finish(),
            GateMessage::EndOfPartition { channel } => f
                .debug_struct("EndOfPartition")
                .field("channel", channel)
                .finish(),
            GateMessage::ChannelFailed { channel, error } => f
                .debug_struct("ChannelFailed")
                .field("channel", channel)
                .field("error", error)
                .finish(),
            GateMessage::ChannelDead { channel, error } => f
                .debug_struct("ChannelDead")
                .field("channel", channel)
                .field("error", error)
                .finish(),
            GateMessage::Barrier {
                id,
                released,
                emitted_ns,
                alignment_ns,
                payload,
            } => f
                .debug_struct("Barrier")
                .field("id", id)
                .field("released", released)
                .field("emitted_ns", emitted_ns)
                .field("alignment_ns", alignment_ns)
                .field("payload", payload)
                .finish(),
            GateMessage::BarrierCancelled { id } => {
                f.debug_struct("BarrierCancelled").field("id", id).finish()
            }
            GateMessage::InFlight {
                channel,
                checkpoint,
                record,
            } => f
                .debug_struct("InFlight")
                .field("channel", channel)
                .field("checkpoint", checkpoint)
                .field("record", record)
                .finish(),
            GateMessage::InFlightEnd { id } => {
                f.debug_struct("InFlightEnd").field("id", id).finish()
            }
        }
    }
}
