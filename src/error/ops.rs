//! One error per operation: receiving, sending, writing and closing, each with its "not now"
//! variants (`Empty`, `Full`, `Timeout`) and the failures the operation can meet.

use std::fmt;
use std::io;

use super::details::{
    ClosedError, CorruptError, PeerDeadError, ProducerFailedError, RecordAbortedError,
    RecordTooLargeError, SysError,
};
use std::convert::Infallible;

use super::path::{Expiry, Halt, Lost, NotNow, TimedOut};
use super::Error;

/// Defines a per-operation error: its "not now" variants (each mapped to the umbrella's
/// `WouldBlock`/`Timeout`) and the failures the operation can meet. A path's own error (`base`)
/// has no "not now" variant; the others convert totally from it and from the path's [`Halt`]
/// with their patience's marker.
macro_rules! op_error {
    (
        $(#[$meta:meta])*
        pub enum $name:ident : $base:ident halts $marker:ident => $halt_now:ident {
            $( $(#[$nmeta:meta])* $now:ident => $core_now:ident : $now_msg:literal, )*
        }
        failures { $( $fail:ident($payload:ty) ),* $(,)? }
    ) => {
        op_error! {
            $(#[$meta])*
            pub enum $name {
                $( $(#[$nmeta])* $now => $core_now : $now_msg, )*
            }
            failures { $( $fail($payload) ),* }
        }

        impl From<$base> for $name {
            #[inline]
            fn from(e: $base) -> $name {
                match e {
                    $( $base::$fail(b) => $name::$fail(b), )*
                }
            }
        }

        impl From<Halt<$marker, $base>> for $name {
            #[inline]
            fn from(h: Halt<$marker, $base>) -> $name {
                match h {
                    Halt::Expired($marker) => $name::$halt_now,
                    Halt::Failed(e) => e.into(),
                }
            }
        }
    };
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$nmeta:meta])* $now:ident => $core_now:ident : $now_msg:literal, )*
        }
        failures { $( $fail:ident($payload:ty) ),* $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Debug)]
        #[non_exhaustive]
        pub enum $name {
            $( $(#[$nmeta])* $now, )*
            $(
                #[doc = concat!("See [`", stringify!($payload), "`].")]
                $fail(Box<$payload>),
            )*
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    $( $name::$now => f.write_str($now_msg), )*
                    $( $name::$fail(e) => e.fmt(f), )*
                }
            }
        }

        impl std::error::Error for $name {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                #[allow(unreachable_patterns)]
                match self {
                    $( $name::$fail(e) => std::error::Error::source(&**e), )*
                    _ => None,
                }
            }
        }

        impl From<$name> for Error {
            fn from(e: $name) -> Error {
                match e {
                    $( $name::$now => Error::$core_now, )*
                    $( $name::$fail(b) => Error::$fail(b), )*
                }
            }
        }

        impl From<$name> for io::Error {
            fn from(e: $name) -> io::Error {
                Error::from(e).into()
            }
        }

        $(
            impl From<Box<$payload>> for $name {
                #[inline]
                fn from(b: Box<$payload>) -> $name {
                    $name::$fail(b)
                }
            }
        )*

    };
}

/// A path's own error: what its blocking calls return, and what its lower steps fail with.
macro_rules! path_error {
    ($name:ident { $( $fail:ident($payload:ty) ),* $(,)? }) => {
        impl From<Halt<Infallible, $name>> for $name {
            #[inline]
            fn from(h: Halt<Infallible, $name>) -> $name {
                h.failure()
            }
        }

        $(
            impl<X> From<Box<$payload>> for Halt<X, $name> {
                #[inline]
                fn from(b: Box<$payload>) -> Halt<X, $name> {
                    Halt::Failed($name::$fail(b))
                }
            }
        )*

        impl From<Lost> for $name {
            #[inline]
            fn from(l: Lost) -> $name {
                match l {
                    Lost::PeerDead(b) => $name::PeerDead(b),
                    Lost::Io(b) => $name::Io(b),
                }
            }
        }

        impl<X> From<Lost> for Halt<X, $name> {
            #[inline]
            fn from(l: Lost) -> Halt<X, $name> {
                Halt::Failed(l.into())
            }
        }
    };
}

op_error! {
    /// Why [`Consumer::recv`](crate::Consumer::recv), a gate's `recv`, or reading a spanning
    /// record's parts failed. End of stream is not an error: `recv` returns `Ok(None)`.
    pub enum RecvError {}
    failures {
        PeerDead(PeerDeadError),
        ProducerFailed(ProducerFailedError),
        Corrupt(CorruptError),
        RecordTooLarge(RecordTooLargeError),
        RecordAborted(RecordAbortedError),
        Io(SysError),
    }
}

op_error! {
    /// Why a `try_recv` (or `try_next_part`) returned no record.
    pub enum TryRecvError: RecvError halts NotNow => Empty {
        /// Nothing is committed yet: try again later.
        Empty => WouldBlock: "nothing to receive yet",
    }
    failures {
        PeerDead(PeerDeadError),
        ProducerFailed(ProducerFailedError),
        Corrupt(CorruptError),
        RecordTooLarge(RecordTooLargeError),
        RecordAborted(RecordAbortedError),
        Io(SysError),
    }
}

op_error! {
    /// Why a `recv_timeout`/`recv_deadline` (or a timed part read) returned no record.
    pub enum RecvTimeoutError: RecvError halts TimedOut => Timeout {
        /// Nothing arrived before the deadline.
        Timeout => Timeout: "timed out waiting for a record",
    }
    failures {
        PeerDead(PeerDeadError),
        ProducerFailed(ProducerFailedError),
        Corrupt(CorruptError),
        RecordTooLarge(RecordTooLargeError),
        RecordAborted(RecordAbortedError),
        Io(SysError),
    }
}

op_error! {
    /// Why a blocking send, claim, event, stream write or flush failed.
    pub enum SendError {}
    failures {
        Closed(ClosedError),
        PeerDead(PeerDeadError),
        Corrupt(CorruptError),
        RecordTooLarge(RecordTooLargeError),
        RecordAborted(RecordAbortedError),
        Io(SysError),
    }
}

op_error! {
    /// Why a `try_send` (or `try_claim`, `try_send_event`, …) sent nothing.
    pub enum TrySendError: SendError halts NotNow => Full {
        /// No room now: no free segment (the consumer has not returned one), or, for a
        /// priority event or an unaligned barrier, no place in the priority lane (the
        /// consumer has not received the ones ahead). Try again later.
        Full => WouldBlock: "no room to send now: the consumer has not returned a free segment (or, for a priority event or barrier, received the ones ahead of it) yet",
    }
    failures {
        Closed(ClosedError),
        PeerDead(PeerDeadError),
        Corrupt(CorruptError),
        RecordTooLarge(RecordTooLargeError),
        RecordAborted(RecordAbortedError),
        Io(SysError),
    }
}

op_error! {
    /// Why a `send_timeout`/`send_deadline` (or a timed claim, event, …) sent nothing.
    pub enum SendTimeoutError: SendError halts TimedOut => Timeout {
        /// No room before the deadline: no segment came back, or, for a priority event or
        /// an unaligned barrier, the consumer did not receive the ones ahead of it.
        Timeout => Timeout: "timed out waiting for room to send: the consumer returned no free segment (or, for a priority event or barrier, did not receive the ones ahead of it) in time",
    }
    failures {
        Closed(ClosedError),
        PeerDead(PeerDeadError),
        Corrupt(CorruptError),
        RecordTooLarge(RecordTooLargeError),
        RecordAborted(RecordAbortedError),
        Io(SysError),
    }
}

op_error! {
    /// Why a write to a streamed record ([`RecordWriter`](crate::RecordWriter)) failed. Its
    /// waits follow the call that started it: `stream` waits, `try_stream` reports `Full`,
    /// `stream_timeout` reports `Timeout`.
    pub enum WriteError {
        /// No free segment now (`try_stream`).
        Full => WouldBlock: "no free segment: the consumer has not returned one yet",
        /// No segment came back before the deadline (`stream_timeout`).
        Timeout => Timeout: "timed out waiting for a free segment",
    }
    failures {
        Closed(ClosedError),
        PeerDead(PeerDeadError),
        Corrupt(CorruptError),
        RecordTooLarge(RecordTooLargeError),
        RecordAborted(RecordAbortedError),
        Io(SysError),
    }
}

/// Why [`Producer::close_timeout`](crate::Producer::close_timeout) (or `close_deadline`)
/// could not confirm that the consumer read everything. The stream is ended in every case:
/// the records already published stay where they are.
#[derive(Debug)]
#[non_exhaustive]
pub enum CloseError {
    /// No consumer attached before the deadline. A named channel keeps its name, so a consumer
    /// that opens it later still reads every record (`shmflow list` shows it as ended with
    /// records unread; `shmflow clean --unread NAME` removes it).
    NotOpened {
        /// The region's name.
        region: String,
        /// Segments published and not read.
        unread_segments: u64,
    },
    /// The consumer is attached and alive but had not read everything by the deadline; it
    /// goes on reading after this call returns.
    Timeout {
        /// The region's name.
        region: String,
        /// Segments published and not read yet.
        unread_segments: u64,
    },
    /// The consumer detached before it read everything.
    Closed {
        /// The region's name.
        region: String,
        /// Segments published and never read.
        unread_segments: u64,
    },
    /// The consumer died before it read everything (or was already seen dead).
    PeerDead(Box<PeerDeadError>),
    /// A call before `close` had already found the consumer gone (it returned `Closed`).
    AlreadyClosed(Box<ClosedError>),
    /// The region holds values a correct consumer does not write.
    Corrupt(Box<CorruptError>),
    /// A system call failed.
    Io(Box<SysError>),
}

impl CloseError {
    /// The region's name.
    pub fn region(&self) -> &str {
        match self {
            CloseError::NotOpened { region, .. }
            | CloseError::Timeout { region, .. }
            | CloseError::Closed { region, .. } => region,
            CloseError::PeerDead(e) => &e.region,
            CloseError::AlreadyClosed(e) => &e.region,
            CloseError::Corrupt(e) => &e.region,
            CloseError::Io(e) => &e.region,
        }
    }
}

impl fmt::Display for CloseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseError::NotOpened {
                region,
                unread_segments,
            } => write!(
                f,
                "region {region}: no consumer opened the channel before the deadline; the \
                 stream is ended with {unread_segments} segment(s) or event(s) unread (a named \
                 channel keeps them under its name for a consumer that opens it later; \
                 `shmflow clean --unread NAME` discards them)"
            ),
            CloseError::Timeout {
                region,
                unread_segments,
            } => write!(
                f,
                "region {region}: the consumer had not read everything by the deadline \
                 ({unread_segments} segment(s) to go); it is alive and goes on reading"
            ),
            CloseError::Closed {
                region,
                unread_segments,
            } => write!(
                f,
                "region {region}: the consumer detached with {unread_segments} segment(s) \
                 unread; those records were not read"
            ),
            CloseError::PeerDead(e) => e.fmt(f),
            CloseError::AlreadyClosed(e) => e.fmt(f),
            CloseError::Corrupt(e) => e.fmt(f),
            CloseError::Io(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for CloseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CloseError::Io(e) => Some(&e.source),
            _ => None,
        }
    }
}

impl From<CloseError> for Error {
    fn from(e: CloseError) -> Error {
        match e {
            CloseError::NotOpened { .. } | CloseError::Timeout { .. } => Error::Timeout,
            CloseError::Closed { region, .. } => Error::Closed(super::path::closed(&region)),
            CloseError::PeerDead(b) => Error::PeerDead(b),
            CloseError::AlreadyClosed(b) => Error::Closed(b),
            CloseError::Corrupt(b) => Error::Corrupt(b),
            CloseError::Io(b) => Error::Io(b),
        }
    }
}

path_error!(RecvError {
    PeerDead(PeerDeadError),
    ProducerFailed(ProducerFailedError),
    Corrupt(CorruptError),
    RecordTooLarge(RecordTooLargeError),
    RecordAborted(RecordAbortedError),
    Io(SysError),
});

path_error!(SendError {
    Closed(ClosedError),
    PeerDead(PeerDeadError),
    Corrupt(CorruptError),
    RecordTooLarge(RecordTooLargeError),
    RecordAborted(RecordAbortedError),
    Io(SysError),
});

impl From<SendError> for WriteError {
    #[inline]
    fn from(e: SendError) -> WriteError {
        match e {
            SendError::Closed(b) => WriteError::Closed(b),
            SendError::PeerDead(b) => WriteError::PeerDead(b),
            SendError::Corrupt(b) => WriteError::Corrupt(b),
            SendError::RecordTooLarge(b) => WriteError::RecordTooLarge(b),
            SendError::RecordAborted(b) => WriteError::RecordAborted(b),
            SendError::Io(b) => WriteError::Io(b),
        }
    }
}

impl From<Halt<Expiry, SendError>> for WriteError {
    #[inline]
    fn from(h: Halt<Expiry, SendError>) -> WriteError {
        match h {
            Halt::Expired(Expiry::NotNow) => WriteError::Full,
            Halt::Expired(Expiry::TimedOut) => WriteError::Timeout,
            Halt::Failed(e) => e.into(),
        }
    }
}

impl From<Lost> for CloseError {
    fn from(l: Lost) -> CloseError {
        match l {
            Lost::PeerDead(b) => CloseError::PeerDead(b),
            Lost::Io(b) => CloseError::Io(b),
        }
    }
}

impl From<Box<CorruptError>> for CloseError {
    fn from(b: Box<CorruptError>) -> CloseError {
        CloseError::Corrupt(b)
    }
}
