//! Errors, one type per operation, in the shapes of std and crossbeam-channel: a `try_` call
//! that finds nothing is [`TryRecvError::Empty`] or [`TrySendError::Full`], a deadline is
//! [`RecvTimeoutError::Timeout`] or [`SendTimeoutError::Timeout`], a consumer that left is
//! [`SendError::Closed`], a peer that died is `PeerDead` everywhere, and opening or creating a
//! region has its own [`OpenError`]. The umbrella [`Error`] takes every one of them through
//! `From`, so `?` works in code that mixes operations.
//!
//! Every failure carries the region's name and says what was expected and what was found. The
//! details sit behind a `Box`, so the errors of the hot calls are two words: a `Result` of
//! `recv` is as small as the record it carries.

use std::fmt;
use std::io;

/// Which end of a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum End {
    /// The side that writes records.
    Producer,
    /// The side that reads records.
    Consumer,
}

impl End {
    /// The other end.
    pub fn peer(self) -> End {
        match self {
            End::Producer => End::Consumer,
            End::Consumer => End::Producer,
        }
    }
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            End::Producer => "producer",
            End::Consumer => "consumer",
        })
    }
}

/// An end found attached by a process that died without detaching
/// ([`OpenError::Stale`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeadEnd {
    /// Which end.
    pub end: End,
    /// The pid it recorded when it attached (0 if it died before recording one).
    pub pid: u32,
    /// For an end of a gate's channel: the channel's index.
    pub channel: Option<u32>,
}

/// What kind of shmflow object a region is (named in [`OpenError::BadMagic`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegionKind {
    /// A single channel (`Producer`/`Consumer`).
    Channel,
    /// A gate of several channels (`Gate`).
    Gate,
}

impl fmt::Display for RegionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RegionKind::Channel => "a shmflow channel",
            RegionKind::Gate => "a shmflow gate",
        })
    }
}

mod details;
mod open;
mod ops;
mod path;
pub use details::{
    ClosedError, ConfigError, CorruptError, PeerDeadError, ProducerFailedError, RecordAbortedError,
    RecordTooLargeError, SysError,
};
pub use open::OpenError;
pub use ops::{
    CloseError, RecvError, RecvTimeoutError, SendError, SendTimeoutError, TryRecvError,
    TrySendError, WriteError,
};
#[cfg(any(feature = "tokio", shmflow_loom))]
pub(crate) use path::settled;
pub(crate) use path::{
    aborted, closed, corrupt, peer_dead, peer_lost, peer_never_attached, producer_failed, sys,
    too_large, Expiry, Halt, Lost, NotNow, TimedOut,
};

// ----- the umbrella --------------------------------------------------------------------------

/// Any shmflow error: every per-operation error converts into it, so `?` works in code that
/// mixes operations. Match on the per-operation errors where the difference matters.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Creating or opening failed.
    Open(Box<OpenError>),
    /// A setting is out of range.
    InvalidConfig(Box<ConfigError>),
    /// A `try_` call found nothing to do without waiting.
    WouldBlock,
    /// A `_timeout` or `_deadline` call ran out of time.
    Timeout,
    /// The consumer has detached.
    Closed(Box<ClosedError>),
    /// The peer died.
    PeerDead(Box<PeerDeadError>),
    /// The producer ended the stream as failed (dropped while panicking).
    ProducerFailed(Box<ProducerFailedError>),
    /// The region holds values a correct peer does not write.
    Corrupt(Box<CorruptError>),
    /// A record or event exceeds a limit.
    RecordTooLarge(Box<RecordTooLargeError>),
    /// A spanning record was abandoned half-way.
    RecordAborted(Box<RecordAbortedError>),
    /// A system call failed.
    Io(Box<SysError>),
}

impl Error {
    /// True for the two "not now" results: [`Error::WouldBlock`] and [`Error::Timeout`].
    pub fn is_would_block_or_timeout(&self) -> bool {
        matches!(self, Error::WouldBlock | Error::Timeout)
    }

    /// True if the peer died.
    pub fn is_peer_dead(&self) -> bool {
        matches!(self, Error::PeerDead(_))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Open(e) => e.fmt(f),
            Error::InvalidConfig(e) => e.fmt(f),
            Error::WouldBlock => f.write_str("the operation would block"),
            Error::Timeout => f.write_str("the operation timed out"),
            Error::Closed(e) => e.fmt(f),
            Error::PeerDead(e) => e.fmt(f),
            Error::ProducerFailed(e) => e.fmt(f),
            Error::Corrupt(e) => e.fmt(f),
            Error::RecordTooLarge(e) => e.fmt(f),
            Error::RecordAborted(e) => e.fmt(f),
            Error::Io(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(&e.source),
            Error::Open(e) => e.source(),
            _ => None,
        }
    }
}

impl From<OpenError> for Error {
    fn from(e: OpenError) -> Self {
        Error::Open(Box::new(e))
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::InvalidConfig(Box::new(e))
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match &e {
            Error::WouldBlock => io::ErrorKind::WouldBlock,
            Error::Timeout => io::ErrorKind::TimedOut,
            Error::Closed(_) => io::ErrorKind::BrokenPipe,
            Error::PeerDead(_) => io::ErrorKind::ConnectionAborted,
            Error::Corrupt(_) => io::ErrorKind::InvalidData,
            Error::RecordTooLarge(_) => io::ErrorKind::InvalidInput,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// shmflow's result type, with the umbrella [`Error`] by default.
pub type Result<T, E = Error> = std::result::Result<T, E>;
