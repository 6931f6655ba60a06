//! The core's failures, typed by path. A call that may wait takes its patience as a type
//! (`protocol::park::Patience`): a blocking call's running out is `Infallible`, a `try_`
//! call's is [`NotNow`], a timed call's is [`TimedOut`]. What goes wrong on the way is the
//! path's failure: [`RecvError`](super::RecvError) for reading, [`SendError`](super::SendError)
//! for writing (each exactly the failures its path can meet), or one detail (`Box<CorruptError>`,
//! …) below them. Each public error converts from its path's [`Halt`] totally, so an
//! operation's error type is what the compiler checks.

use std::convert::Infallible;
use std::io;

use super::details::{
    ClosedError, CorruptError, PeerDeadError, ProducerFailedError, RecordAbortedError,
    RecordTooLargeError, SysError,
};
use super::End;

/// Why a call that may wait returned without its value: it ran out of patience (`X`), or
/// its path failed (`F`).
#[derive(Debug)]
pub(crate) enum Halt<X, F> {
    /// The deadline passed (for a blocking call, `X` is `Infallible`).
    Expired(X),
    /// The path failed.
    Failed(F),
}

impl<X, F> From<F> for Halt<X, F> {
    #[inline]
    fn from(f: F) -> Self {
        Halt::Failed(f)
    }
}

impl<F> Halt<Infallible, F> {
    /// A blocking call's halt is always a failure.
    #[inline]
    pub(crate) fn failure(self) -> F {
        match self {
            Halt::Expired(never) => match never {},
            Halt::Failed(f) => f,
        }
    }
}

impl<X> Halt<X, Infallible> {
    /// A halt of a path that cannot fail is always running out of time.
    #[inline]
    pub(crate) fn expired(self) -> X {
        match self {
            Halt::Expired(x) => x,
            Halt::Failed(never) => match never {},
        }
    }
}

/// A `try_` call's result as an async call sees it: `None` if it found nothing to do now
/// (wait, then try again), else its outcome.
#[cfg(any(feature = "tokio", shmflow_loom))]
#[inline]
pub(crate) fn settled<T, F>(r: Result<T, Halt<NotNow, F>>) -> Option<Result<T, F>> {
    match r {
        Ok(v) => Some(Ok(v)),
        Err(Halt::Expired(NotNow)) => None,
        Err(Halt::Failed(e)) => Some(Err(e)),
    }
}

/// A `try_` call found nothing to do without waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NotNow;

/// A timed call ran out of time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TimedOut;

/// Either, for a wait chosen at run time (a streamed record follows the call that started it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// As [`NotNow`].
    NotNow,
    /// As [`TimedOut`].
    TimedOut,
}

impl From<NotNow> for Expiry {
    fn from(_: NotNow) -> Expiry {
        Expiry::NotNow
    }
}

impl From<TimedOut> for Expiry {
    fn from(_: TimedOut) -> Expiry {
        Expiry::TimedOut
    }
}

// ----- the details, built where they happen ---------------------------------------------------

/// The region holds `found` where a correct peer writes `expected`.
pub(crate) fn corrupt(
    region: &str,
    field: &'static str,
    expected: String,
    found: u64,
) -> Box<CorruptError> {
    Box::new(CorruptError {
        region: region.to_owned(),
        field,
        expected,
        found,
    })
}

/// The system call `op` failed.
pub(crate) fn sys(region: &str, op: &'static str, source: io::Error) -> Box<SysError> {
    Box::new(SysError {
        region: region.to_owned(),
        op,
        source,
    })
}

/// The consumer has detached.
pub(crate) fn closed(region: &str) -> Box<ClosedError> {
    Box::new(ClosedError {
        region: region.to_owned(),
    })
}

/// A spanning record was abandoned half-way.
pub(crate) fn aborted(region: &str) -> Box<RecordAbortedError> {
    Box::new(RecordAbortedError {
        region: region.to_owned(),
    })
}

/// `what` is `len` bytes, over the limit `max`.
pub(crate) fn too_large(
    region: &str,
    what: &'static str,
    len: u64,
    max: u64,
) -> Box<RecordTooLargeError> {
    Box::new(RecordTooLargeError {
        region: region.to_owned(),
        what,
        len,
        max,
    })
}

/// The producer ended the stream as failed.
pub(crate) fn producer_failed(region: &str, pid: u32) -> Box<ProducerFailedError> {
    Box::new(ProducerFailedError {
        region: region.to_owned(),
        pid,
    })
}

/// The peer `end` (pid `pid`) died.
pub(crate) fn peer_dead(region: &str, end: End, pid: u32) -> Box<PeerDeadError> {
    Box::new(PeerDeadError {
        region: region.to_owned(),
        end,
        pid,
        remote: false,
        never_attached: false,
        cause: None,
    })
}

/// The peer `end` never attached, and its handle is gone.
pub(crate) fn peer_never_attached(region: &str, end: End) -> Box<PeerDeadError> {
    Box::new(PeerDeadError {
        never_attached: true,
        ..*peer_dead(region, end, 0)
    })
}

/// The end is a network bridge (or a direct network end) that lost its remote peer; `cause`:
/// what ended the link, if the end knows.
pub(crate) fn peer_lost(
    region: &str,
    end: End,
    pid: u32,
    cause: Option<String>,
) -> Box<PeerDeadError> {
    Box::new(PeerDeadError {
        region: region.to_owned(),
        end,
        pid,
        remote: true,
        never_attached: false,
        cause,
    })
}

/// What a liveness look finds: the peer died, or the look itself failed.
#[derive(Debug)]
pub(crate) enum Lost {
    /// The peer died.
    PeerDead(Box<PeerDeadError>),
    /// The lock query failed.
    Io(Box<SysError>),
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lost::PeerDead(e) => e.fmt(f),
            Lost::Io(e) => e.fmt(f),
        }
    }
}
