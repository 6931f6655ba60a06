//! The attach state of each end, and the only code that changes it: `FREE` → `ATTACHED` →
//! `DETACHED`, `FAILED` or `LOST`, never back (see the constants in `abi`).

use crate::protocol::abi::{
    EndSlot, GateHeader, Header, END_ATTACHED, END_DETACHED, END_FAILED, END_FREE, END_LOST,
};
use crate::sync::Ordering;

/// How an end leaves its channel: the state it stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Leave {
    /// Cleanly (a producer: end of stream).
    Clean,
    /// A producer whose thread unwound from a panic, or that called `fail`: its stream ends
    /// as failed.
    Failed,
    /// A network bridge that lost its remote peer: the peer is reported dead.
    #[cfg_attr(not(feature = "net"), allow(dead_code))]
    Lost,
}

impl EndSlot {
    /// FREE → ATTACHED, then records `pid`; `Err(state found)` if the end is not free.
    pub(crate) fn attach(&self, pid: u32) -> Result<(), u32> {
        // AcqRel: the winner sees the previous state; a racing second attacher sees ATTACHED.
        self.state
            .compare_exchange(END_FREE, END_ATTACHED, Ordering::AcqRel, Ordering::Acquire)?;
        // Relaxed: for messages and listings only.
        self.pid.store(pid, Ordering::Relaxed);
        Ok(())
    }

    /// The end leaves.
    ///
    /// SYNC POINT: Release, paired with the peer's Acquire in [`EndSlot::state`]: everything
    /// this end wrote before (the frames it sealed, the segments it returned, its counters)
    /// is visible to a peer that sees it gone.
    pub(crate) fn leave(&self, how: Leave) {
        let state = match how {
            Leave::Clean => END_DETACHED,
            Leave::Failed => END_FAILED,
            Leave::Lost => END_LOST,
        };
        self.state.store(state, Ordering::Release);
    }

    /// The pid the end recorded when it attached (Relaxed: for messages and listings; the
    /// state says whether the end is there).
    pub(crate) fn pid(&self) -> u32 {
        self.pid.load(Ordering::Relaxed)
    }

    /// The end's state now (Acquire: pairs with [`EndSlot::leave`] and [`EndSlot::attach`]).
    pub(crate) fn state(&self) -> EndState {
        EndState::from_raw(self.state.load(Ordering::Acquire))
    }
}

/// The ends of a channel's header.
impl Header {
    /// The producer end's slot.
    #[inline]
    pub(crate) fn producer_end(&self) -> &EndSlot {
        &self.producer.0
    }

    /// The consumer end's slot (of a gate's channel: the gate's consumer, as this channel's
    /// producer sees it).
    #[inline]
    pub(crate) fn consumer_end(&self) -> &EndSlot {
        &self.consumer.0
    }
}

impl GateHeader {
    /// The gate consumer's slot.
    #[inline]
    pub(crate) fn consumer_end(&self) -> &EndSlot {
        &self.consumer.0
    }
}

/// An end's attach state as the region records it: `Free` → `Attached` → `Detached`, never
/// back. A value no shmflow writes is shown as it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum EndState {
    /// Never attached.
    #[default]
    Free,
    /// Attached (alive, unless its liveness lock says otherwise).
    Attached,
    /// Attached once and detached.
    Detached,
    /// Detached while its thread unwound from a panic (a producer: its stream ended as
    /// failed).
    Failed,
    /// Detached by a network bridge that lost its remote peer (the peer on the other machine
    /// died, went silent, or its connection broke).
    Lost,
    /// A value no shmflow writes (a corrupt or foreign region).
    Invalid(u32),
}

impl EndState {
    pub(crate) fn from_raw(v: u32) -> EndState {
        match v {
            crate::protocol::abi::END_FREE => EndState::Free,
            crate::protocol::abi::END_ATTACHED => EndState::Attached,
            crate::protocol::abi::END_DETACHED => EndState::Detached,
            crate::protocol::abi::END_FAILED => EndState::Failed,
            crate::protocol::abi::END_LOST => EndState::Lost,
            other => EndState::Invalid(other),
        }
    }

    /// The number stored in the region (0 free, 1 attached, 2 detached), as `shmflow stat
    /// --json` prints it.
    pub fn code(self) -> u32 {
        match self {
            EndState::Free => crate::protocol::abi::END_FREE,
            EndState::Attached => crate::protocol::abi::END_ATTACHED,
            EndState::Detached => crate::protocol::abi::END_DETACHED,
            EndState::Failed => crate::protocol::abi::END_FAILED,
            EndState::Lost => crate::protocol::abi::END_LOST,
            EndState::Invalid(v) => v,
        }
    }
}

impl std::fmt::Display for EndState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndState::Free => f.write_str("free"),
            EndState::Attached => f.write_str("attached"),
            EndState::Detached => f.write_str("detached"),
            EndState::Failed => f.write_str("failed"),
            EndState::Lost => f.write_str("lost (remote peer)"),
            EndState::Invalid(v) => write!(f, "invalid state {v}"),
        }
    }
}
