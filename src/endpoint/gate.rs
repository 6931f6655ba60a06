//! Gates: one consumer reading `M` channels, each written by its own producer process, with
//! Flink's exclusive and floating segments (credit-based flow control).
//!
//! A gate is one region (layout in `protocol::abi`): each channel has its own header, rings and
//! `exclusive` segments; the gate owns `floating` segments that it lends to channels that ask
//! (see `pool.rs` for the protocol). The consumer blocks on one futex word for the whole gate,
//! which every channel's producer wakes, and reads the channels round-robin, at most
//! [`QUANTUM`] messages from one before it looks at the next, so a busy channel cannot starve
//! another. Within a channel's turn, a record committed whole in its segment in hand is handed
//! out at once (`fast_pick`); lending, the other channels and the producers' liveness are
//! looked at in the full pass, at least once every `QUANTUM + 1` receives. The number of channels is fixed when the gate is created.
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
use crate::protocol::figures;
use crate::protocol::park::{self, Forever, Immediately, Patience, Until, WaitStrategy};
use crate::protocol::pool;
use crate::region::os::Host;
use crate::region::view::Shared;
use crate::sync::Arc;
use crate::sys::clock::monotonic_ns;

mod attach;
mod checkpoints;
mod deliver;
mod message;
mod scan;

use checkpoints::Checkpoints;
pub use message::GateMessage;

/// Messages the gate takes from one channel before it moves on to the next that has data.
/// Within a turn, a record committed whole next in the channel's segment in hand is handed out
/// at once; the gate's full pass (taking back the floating segments returned, lending to the
/// channels that ask, a look at the other channels, and at the producers' liveness when due)
/// comes at least once every `QUANTUM + 1` receives, and at every receive that finds nothing
/// whole next.
pub const QUANTUM: u32 = 8;

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
    /// Full passes (`decide`), counted to look at the producers' liveness now and then while
    /// busy too.
    scans: u32,
    last_check_ns: u64,
    /// A channel ended or failed, or in-flight records were counted, since the last
    /// `retire_finished`: the next receive settles them first (and takes the full path).
    to_retire: bool,
    /// Async calls since the last look at the executor's budget.
    #[cfg(any(feature = "tokio", shmflow_loom))]
    coop: u8,
    /// Checkpoint alignment.
    cp: Checkpoints,
    /// Channels whose producer is a direct network end here, and their watcher (made with
    /// the first).
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    links: Option<links::Links>,
    /// Latency markers: the labels of the sources given a slot of the gate's table, in slot
    /// order.
    marker_sources: Vec<crate::protocol::latency::Label>,
}

mod align;
#[cfg(any(feature = "tokio", shmflow_loom))]
mod asynch;
#[cfg(all(feature = "net", not(shmflow_loom)))]
mod links;

impl Gate {
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

    /// The ages of the latency markers the gate handed out, per source, since it was made
    /// (every channel's count in the gate's one table; see
    /// [`Consumer::latency`](crate::Consumer::latency)).
    pub fn latency(&self) -> Vec<crate::endpoint::metrics::SourceLatency> {
        crate::endpoint::metrics::latency(&self.shared)
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
        g.consumer_end().leave(crate::protocol::ends::Leave::Clean);
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
