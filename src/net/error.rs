//! What can go wrong with remote channels: setting up (`SetupError`), the peer breaking the
//! wire protocol (`ProtocolError`), and what ends a connection or a channel (`LinkError`).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The peer sent something that is not the shmflow wire protocol, or broke its rules. The
/// connection is closed; nothing it sent after the last valid frame was used.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtocolError {
    /// A frame longer than this side accepts (the largest segment it receives into).
    FrameLength {
        /// The length announced.
        found: u64,
        /// The most this side accepts.
        max: u64,
    },
    /// Not shmflow's magic number: the peer is something else.
    Magic {
        /// What came instead.
        found: u32,
    },
    /// A wire version this side does not speak.
    Version {
        /// The peer's version.
        found: u8,
        /// The version this side speaks.
        supported: u8,
    },
    /// An unknown message kind.
    Kind {
        /// The kind byte.
        found: u8,
    },
    /// A message whose body does not have the shape of its kind.
    Malformed {
        /// The message.
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A shmflow frame inside a `Buffer` cannot stand where it is.
    Frame {
        /// The field of the frame header.
        field: &'static str,
        /// What it may be.
        expected: String,
        /// What it was.
        found: u64,
    },
    /// Credit arithmetic broken: a segment sent without credit, or credit beyond reason.
    Credit {
        /// The channel.
        channel: u32,
        /// What is wrong.
        detail: String,
    },
    /// A message for a channel that was never opened on this connection, that ended, or
    /// that goes the wrong way.
    Channel {
        /// The channel id.
        channel: u32,
        /// What is wrong.
        detail: String,
    },
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::FrameLength { found, max } => write!(
                f,
                "a frame of {found} bytes, more than the {max} this side accepts"
            ),
            ProtocolError::Magic { found } => write!(
                f,
                "bad magic {found:#010x}: the peer does not speak the shmflow wire protocol"
            ),
            ProtocolError::Version { found, supported } => {
                write!(f, "wire version {found}, this side speaks {supported}")
            }
            ProtocolError::Kind { found } => write!(f, "unknown message kind {found}"),
            ProtocolError::Malformed { what, detail } => write!(f, "malformed {what}: {detail}"),
            ProtocolError::Frame {
                field,
                expected,
                found,
            } => write!(
                f,
                "invalid record frame in a buffer: {field} is {found}, expected {expected}"
            ),
            ProtocolError::Credit { channel, detail } => {
                write!(f, "channel {channel}: credit broken: {detail}")
            }
            ProtocolError::Channel { channel, detail } => write!(f, "channel {channel}: {detail}"),
        }
    }
}

impl std::error::Error for ProtocolError {}

/// What the peer said when it gave up ([`LinkError::Remote`]): the wire protocol's error
/// codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RemoteCode {
    /// No channel of that name is exported there (or it was requested already).
    UnknownChannel,
    /// The two ends' segment sizes differ.
    SegmentSize,
    /// This side broke the protocol, as the peer sees it.
    Protocol,
    /// The peer's local end of the channel failed (a shared-memory error there).
    LocalFailure,
    /// A code this version does not know.
    Other(u32),
}

impl fmt::Display for RemoteCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RemoteCode::UnknownChannel => f.write_str("unknown channel"),
            RemoteCode::SegmentSize => f.write_str("segment sizes differ"),
            RemoteCode::Protocol => f.write_str("protocol broken"),
            RemoteCode::LocalFailure => f.write_str("its local end failed"),
            RemoteCode::Other(c) => write!(f, "code {c}"),
        }
    }
}

/// What ended a connection, or a remote channel before its stream ended. It is `Clone` (one
/// connection's failure ends each of its channels), so its sources are shared (`Arc`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum LinkError {
    /// Reading or writing the connection failed (reset by the peer, broken pipe, …).
    Io(Arc<io::Error>),
    /// The peer closed the connection while the channel was open (it exited or crashed).
    PeerClosed,
    /// Nothing arrived from the peer for this long, not even a heartbeat: it is dead, stopped
    /// or cut off.
    PeerSilent {
        /// How long it was silent.
        silent_for: Duration,
    },
    /// The peer read nothing for this long while this side had bytes to write: it is
    /// stuck, or its side of the network is.
    PeerNotReading {
        /// How long a write waited.
        stalled_for: Duration,
    },
    /// The peer broke the protocol; the connection was closed.
    Protocol(ProtocolError),
    /// The peer reported an error and gave up.
    Remote {
        /// What kind of error.
        code: RemoteCode,
        /// The peer's message.
        message: String,
    },
    /// The local end of the channel failed: its shared-memory peer left, died, or broke the
    /// shared-memory protocol.
    Local(Arc<crate::error::Error>),
    /// The local consumer of a receiving channel takes no priority events: more than a lane's
    /// worth waited for it, so the channel was ended (and the sender told).
    PriorityEventsUnread,
    /// The two ends' segment sizes differ (segments cross as they are).
    SegmentSize {
        /// This side's segment size.
        ours: u32,
        /// The peer's.
        theirs: u32,
    },
    /// A task of the bridge ended without a result (it panicked: a bug in shmflow).
    Task(String),
    /// The TLS handshake failed (a certificate not signed by the expected authority, a
    /// peer without a certificate, or a name mismatch).
    Tls(Arc<io::Error>),
}

impl LinkError {
    pub(crate) fn io(e: io::Error) -> LinkError {
        LinkError::Io(Arc::new(e))
    }

    pub(crate) fn local(e: impl Into<crate::error::Error>) -> LinkError {
        LinkError::Local(Arc::new(e.into()))
    }
}

impl From<io::Error> for LinkError {
    fn from(e: io::Error) -> Self {
        LinkError::io(e)
    }
}

impl From<ProtocolError> for LinkError {
    fn from(e: ProtocolError) -> Self {
        LinkError::Protocol(e)
    }
}

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkError::Io(e) => write!(f, "connection failed: {e}"),
            LinkError::PeerClosed => f.write_str(
                "the peer closed the connection while the channel was open (it exited or crashed)",
            ),
            LinkError::PeerSilent { silent_for } => write!(
                f,
                "the peer sent nothing for {silent_for:?}, not even a heartbeat: taken as dead"
            ),
            LinkError::PeerNotReading { stalled_for } => write!(
                f,
                "the peer read nothing for {stalled_for:?} while this side had bytes for it: \
                 taken as stuck"
            ),
            LinkError::Protocol(e) => write!(f, "the peer broke the wire protocol: {e}"),
            LinkError::Remote { code, message } => {
                write!(f, "the peer gave up ({code}): {message}")
            }
            LinkError::Local(e) => write!(f, "the local end of the channel failed: {e}"),
            LinkError::PriorityEventsUnread => f.write_str(PRIORITY_UNREAD),
            LinkError::SegmentSize { ours, theirs } => write!(
                f,
                "the peer's segments are {theirs} bytes, ours {ours}: both ends of a remote \
                 channel need the same segment size"
            ),
            LinkError::Task(m) => write!(f, "a task of the bridge failed (a bug): {m}"),
            LinkError::Tls(e) => write!(f, "TLS handshake failed: {e}"),
        }
    }
}

impl std::error::Error for LinkError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LinkError::Io(e) | LinkError::Tls(e) => Some(&**e),
            LinkError::Local(e) => Some(&**e),
            LinkError::Protocol(e) => Some(e),
            _ => None,
        }
    }
}

/// What a receiving channel whose consumer takes no priority events tells, here and to the
/// sender.
pub(crate) const PRIORITY_UNREAD: &str = "the consumer takes no priority events: more than \
    256 were waiting for room in its lane, and the channel was ended so that they do not pile \
    up";

// Cheap enough to be a codec's error type.
impl From<LinkError> for io::Error {
    fn from(e: LinkError) -> Self {
        io::Error::other(e)
    }
}

/// Setting up a remote endpoint failed: binding, connecting, TLS material, or a name.
#[derive(Debug)]
#[non_exhaustive]
pub enum SetupError {
    /// A system call failed.
    Io {
        /// What was being done.
        context: String,
        /// The system's error.
        source: io::Error,
    },
    /// A plaintext connection on an address other than loopback: give the endpoint TLS
    /// material ([`crate::net::Config::tls`]), or opt out explicitly with
    /// [`crate::net::Config::insecure_plaintext`].
    PlaintextRefused {
        /// The address.
        addr: SocketAddr,
    },
    /// The TLS material could not be used.
    Tls(String),
    /// A channel name that cannot be used: empty, longer than 255 bytes, or given twice.
    Name {
        /// The name.
        name: String,
        /// What is wrong.
        detail: &'static str,
    },
    /// The peer refused or broke the opening of the connection.
    Handshake(LinkError),
    /// A gate channel that cannot take a remote producer: no such channel, it ended, or it
    /// has one already.
    GateChannel {
        /// The channel.
        channel: usize,
        /// What is wrong.
        detail: String,
    },
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::Io { context, source } => write!(f, "{context}: {source}"),
            SetupError::PlaintextRefused { addr } => write!(
                f,
                "{addr} is not a loopback address: remote channels beyond loopback need TLS with \
                 mutual authentication (Config::tls), or an explicit Config::insecure_plaintext()"
            ),
            SetupError::Tls(m) => write!(f, "TLS setup: {m}"),
            SetupError::Name { name, detail } => write!(f, "channel name {name:?}: {detail}"),
            SetupError::Handshake(e) => write!(f, "opening the connection: {e}"),
            SetupError::GateChannel { channel, detail } => {
                write!(f, "gate channel {channel}: {detail}")
            }
        }
    }
}

impl std::error::Error for SetupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SetupError::Io { source, .. } => Some(source),
            SetupError::Handshake(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn link_errors_carry_their_sources_and_name_remote_codes() {
        let io = LinkError::io(io::Error::new(io::ErrorKind::ConnectionReset, "reset"));
        let src = io.source().expect("the io::Error");
        assert_eq!(
            src.downcast_ref::<io::Error>().map(io::Error::kind),
            Some(io::ErrorKind::ConnectionReset)
        );
        let local = LinkError::local(crate::error::SendError::from(crate::error::closed("/r")));
        assert!(local
            .source()
            .and_then(|s| s.downcast_ref::<crate::error::Error>())
            .is_some_and(|e| matches!(e, crate::error::Error::Closed(_))));
        assert!(LinkError::Protocol(ProtocolError::Kind { found: 9 })
            .source()
            .is_some());
        assert!(LinkError::SegmentSize {
            ours: 4096,
            theirs: 8192
        }
        .to_string()
        .contains("same segment size"));
    }
}
