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

// ----- the details of each failure ----------------------------------------------------------

/// The peer process died without detaching (its liveness lock is gone). A consumer gets this
/// only after every record the producer committed before dying was delivered.
#[derive(Debug)]
pub struct PeerDeadError {
    pub(crate) region: String,
    pub(crate) end: End,
    pub(crate) pid: u32,
    pub(crate) remote: bool,
}

impl PeerDeadError {
    /// The region's name (`/name` or `memfd:…`).
    pub fn region(&self) -> &str {
        &self.region
    }
    /// The end that died.
    pub fn end(&self) -> End {
        self.end
    }
    /// The pid it recorded when it attached.
    pub fn pid(&self) -> u32 {
        self.pid
    }
    /// True if the end is a network bridge (`shmflow::net`) whose peer on the other side of
    /// the connection was lost; `pid` is then the bridge's process, which is alive.
    pub fn is_remote(&self) -> bool {
        self.remote
    }
}

impl fmt::Display for PeerDeadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.remote {
            return match self.end {
                End::Producer => write!(
                    f,
                    "region {}: the remote producer behind the network bridge (pid {}) was \
                     lost (it died, went silent, or the connection broke); what it sent before \
                     was delivered, nothing more will come",
                    self.region, self.pid
                ),
                End::Consumer => write!(
                    f,
                    "region {}: the remote consumer behind the network bridge (pid {}) was \
                     lost (it died, went silent, or the connection broke); nothing written from \
                     now on would be read",
                    self.region, self.pid
                ),
            };
        }
        match self.end {
            End::Producer => write!(
                f,
                "region {}: the producer (pid {}) died without detaching; the records it \
                 committed before dying were delivered, nothing more will come",
                self.region, self.pid
            ),
            End::Consumer => write!(
                f,
                "region {}: the consumer (pid {}) died without detaching; nothing written from \
                 now on would be read",
                self.region, self.pid
            ),
        }
    }
}

/// The producer ended its stream as failed ([`Producer::fail`](crate::Producer::fail), or
/// dropped while its thread was unwinding from a panic): every record it committed before was
/// delivered, and the stream did not end cleanly.
#[derive(Debug)]
pub struct ProducerFailedError {
    pub(crate) region: String,
    pub(crate) pid: u32,
}

impl ProducerFailedError {
    /// The region's name.
    pub fn region(&self) -> &str {
        &self.region
    }
    /// The pid the producer recorded when it attached.
    pub fn pid(&self) -> u32 {
        self.pid
    }
}

impl fmt::Display for ProducerFailedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "region {}: the producer (pid {}) ended its stream as failed (it gave up, or was \
             dropped while panicking); the records it committed before were delivered, the \
             stream did not end cleanly",
            self.region, self.pid
        )
    }
}

/// A value read from shared memory is out of range: the peer is buggy, crashed while writing,
/// or hostile. The channel cannot be trusted any more.
#[derive(Debug)]
pub struct CorruptError {
    pub(crate) region: String,
    pub(crate) field: &'static str,
    pub(crate) expected: String,
    pub(crate) found: u64,
}

impl CorruptError {
    /// The region's name.
    pub fn region(&self) -> &str {
        &self.region
    }
    /// Which field of the region.
    pub fn field(&self) -> &'static str {
        self.field
    }
    /// What a correct peer would have written.
    pub fn expected(&self) -> &str {
        &self.expected
    }
    /// What was found.
    pub fn found(&self) -> u64 {
        self.found
    }
}

impl fmt::Display for CorruptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "region {} is corrupt: {} should be {}, found {} (the peer is buggy, crashed \
             mid-write, or hostile)",
            self.region, self.field, self.expected, self.found
        )
    }
}

/// A record longer than the reader accepts (`Consumer::set_max_record_len`), than an API can
/// place in one segment (`claim`), or an event payload longer than
/// [`MAX_EVENT_PAYLOAD`](crate::MAX_EVENT_PAYLOAD).
#[derive(Debug)]
pub struct RecordTooLargeError {
    pub(crate) region: String,
    pub(crate) what: &'static str,
    pub(crate) len: u64,
    pub(crate) max: u64,
}

impl RecordTooLargeError {
    /// The region's name.
    pub fn region(&self) -> &str {
        &self.region
    }
    /// The length (or the length seen so far, for a spanning record).
    pub fn length(&self) -> u64 {
        self.len
    }
    /// The largest length accepted there.
    pub fn max(&self) -> u64 {
        self.max
    }
}

impl fmt::Display for RecordTooLargeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "region {}: {} of {} bytes exceeds the limit of {} bytes",
            self.region, self.what, self.len, self.max
        )
    }
}

/// A spanning record was abandoned by its producer before its last part (a timed-out or
/// dropped stream writer, or the producer closed): the parts already read are not a whole
/// record. The channel goes on with the next record.
#[derive(Debug)]
pub struct RecordAbortedError {
    pub(crate) region: String,
}

impl RecordAbortedError {
    /// The region's name.
    pub fn region(&self) -> &str {
        &self.region
    }
}

impl fmt::Display for RecordAbortedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "region {}: the producer abandoned a spanning record before its last part",
            self.region
        )
    }
}

/// The consumer has detached: nothing written from now on would be read.
#[derive(Debug)]
pub struct ClosedError {
    pub(crate) region: String,
}

impl ClosedError {
    /// The region's name.
    pub fn region(&self) -> &str {
        &self.region
    }
}

impl fmt::Display for ClosedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "region {}: the consumer has detached, records can no longer be delivered",
            self.region
        )
    }
}

/// A system call on the region failed.
#[derive(Debug)]
pub struct SysError {
    pub(crate) region: String,
    pub(crate) op: &'static str,
    pub(crate) source: io::Error,
}

impl SysError {
    /// The region's name.
    pub fn region(&self) -> &str {
        &self.region
    }
    /// What shmflow was doing (the call, e.g. `"mmap"`).
    pub fn op(&self) -> &'static str {
        self.op
    }
    /// The OS error.
    pub fn io_error(&self) -> &io::Error {
        &self.source
    }
}

impl fmt::Display for SysError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "region {}: {} failed: {}",
            self.region, self.op, self.source
        )
    }
}

impl std::error::Error for SysError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// A geometry, name or option outside what shmflow supports.
#[derive(Debug, Clone)]
pub struct ConfigError {
    pub(crate) region: String,
    pub(crate) field: &'static str,
    pub(crate) expected: String,
    pub(crate) found: String,
}

impl ConfigError {
    pub(crate) fn new(
        region: &str,
        field: &'static str,
        expected: impl Into<String>,
        found: impl fmt::Display,
    ) -> ConfigError {
        ConfigError {
            region: region.to_owned(),
            field,
            expected: expected.into(),
            found: found.to_string(),
        }
    }
    /// The region's name, or `<config>` before there is one.
    pub fn region(&self) -> &str {
        &self.region
    }
    /// Which setting.
    pub fn field(&self) -> &'static str {
        self.field
    }
    /// What it must be.
    pub fn expected(&self) -> &str {
        &self.expected
    }
    /// What it was.
    pub fn found(&self) -> &str {
        &self.found
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "region {}: {} must be {}, got {}",
            self.region, self.field, self.expected, self.found
        )
    }
}

impl std::error::Error for ConfigError {}

macro_rules! simple_error_impls {
    ($($t:ty),*) => {$(
        impl std::error::Error for $t {}
    )*};
}
simple_error_impls!(
    ProducerFailedError,
    PeerDeadError,
    CorruptError,
    RecordTooLargeError,
    RecordAbortedError,
    ClosedError
);

// ----- opening and creating ------------------------------------------------------------------

/// Why a region could not be created or opened, or an end not attached to it.
#[derive(Debug)]
#[non_exhaustive]
pub enum OpenError {
    /// `create` found an object of that name already there (`O_EXCL`) with a live end.
    AlreadyExists {
        /// The region's name.
        region: String,
    },
    /// A dead end is in the way. Either `create` found a shmflow region of that name none of
    /// whose ends is alive (left behind by a crash: `dead` is `None`), or an open found the
    /// end it asked for attached by a process that died without detaching (`dead` names it).
    /// A dead end is never taken over: its read or write position died with it. Remove the
    /// region (`shmflow clean`, once no end is alive) and create it again.
    Stale {
        /// The region's name.
        region: String,
        /// The end that an open found dead, if that is why.
        dead: Option<DeadEnd>,
    },
    /// `create` found a channel of that name whose stream ended with records that no
    /// consumer has read yet: it waits for its consumer. Open it as a consumer to read them,
    /// or discard them (`shmflow clean --unread`) before creating it again.
    AwaitsConsumer {
        /// The region's name.
        region: String,
        /// Records published and not read (0 if the producer kept no metrics).
        unread_records: u64,
    },
    /// `open` found no object of that name.
    NotFound {
        /// The region's name.
        region: String,
    },
    /// The object is not the kind of shmflow region this call opens: another kind of shmflow
    /// region (`found_kind` says which), not a shmflow region at all, or one whose creator
    /// has not finished initializing it.
    BadMagic {
        /// The region's name.
        region: String,
        /// The kind this call opens.
        expected: RegionKind,
        /// The kind found, if the magic is one of shmflow's.
        found_kind: Option<RegionKind>,
        /// The first 8 bytes found.
        found: u64,
    },
    /// The region was made by a shmflow with another layout version.
    VersionMismatch {
        /// The region's name.
        region: String,
        /// The layout version this library speaks.
        expected: u32,
        /// The layout version in the header.
        found: u32,
    },
    /// The size of the object does not match the geometry in its header.
    SizeMismatch {
        /// The region's name.
        region: String,
        /// The size the header's geometry implies.
        expected: u64,
        /// The size of the object.
        found: u64,
    },
    /// The name is not a shared-memory object at all (a FIFO, socket, directory, device node
    /// or symbolic link): shmflow refuses it without opening what it names.
    NotARegion {
        /// The region's name.
        region: String,
        /// What the name is instead (`"a FIFO"`, `"a directory"`, …).
        found: &'static str,
    },
    /// The object belongs to another user: a region of another user is not trusted.
    NotOwner {
        /// The region's name.
        region: String,
        /// This process's effective uid.
        expected: u32,
        /// The object's owner.
        found: u32,
    },
    /// The object is open to group or others (its mode must be 0600).
    BadMode {
        /// The region's name.
        region: String,
        /// The permission bits found.
        mode: u32,
    },
    /// That end is already attached (a channel has one producer and one consumer).
    AlreadyAttached {
        /// The region's name.
        region: String,
        /// The end that was asked for.
        end: End,
        /// The pid recorded by the end that is attached (0 if it has not recorded one yet).
        pid: u32,
    },
    /// That end was attached before and has detached: an end attaches once.
    EndDetached {
        /// The region's name.
        region: String,
        /// The end that was asked for.
        end: End,
    },
    /// The system cannot back a region this large: the tmpfs behind `/dev/shm` is full, or a
    /// memory limit (the memory cgroup, the machine) is reached. Nothing was left behind.
    NoMemory {
        /// The region's name.
        region: String,
        /// The size of the region that could not be reserved.
        bytes: u64,
        /// The OS error (`ENOSPC`, `ENOMEM`).
        source: io::Error,
    },
    /// A geometry, name or option is out of range.
    InvalidConfig(ConfigError),
    /// The header holds values no shmflow writes.
    Corrupt(Box<CorruptError>),
    /// A system call failed.
    Io(Box<SysError>),
}

impl OpenError {
    /// The region's name.
    pub fn region(&self) -> &str {
        match self {
            OpenError::AlreadyExists { region }
            | OpenError::Stale { region, .. }
            | OpenError::AwaitsConsumer { region, .. }
            | OpenError::NotFound { region }
            | OpenError::BadMagic { region, .. }
            | OpenError::VersionMismatch { region, .. }
            | OpenError::SizeMismatch { region, .. }
            | OpenError::NotARegion { region, .. }
            | OpenError::NotOwner { region, .. }
            | OpenError::BadMode { region, .. }
            | OpenError::AlreadyAttached { region, .. }
            | OpenError::EndDetached { region, .. }
            | OpenError::NoMemory { region, .. } => region,
            OpenError::InvalidConfig(e) => &e.region,
            OpenError::Corrupt(e) => &e.region,
            OpenError::Io(e) => &e.region,
        }
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::AlreadyExists { region } => write!(
                f,
                "region {region} already exists and one of its ends is alive; open it instead, \
                 or use another name"
            ),
            OpenError::Stale { region, dead: None } => write!(
                f,
                "region {region} exists but no end of it is alive (left by a crashed process): \
                 remove it with `shmflow clean` or `rm /dev/shm{region}`, then create it again"
            ),
            OpenError::Stale {
                region,
                dead: Some(d),
            } => {
                write!(f, "region {region}: ")?;
                if let Some(c) = d.channel {
                    write!(f, "channel {c}'s ")?;
                }
                write!(
                    f,
                    "{} end was attached by pid {}, which died without detaching; a dead end \
                     is never taken over. ",
                    d.end, d.pid
                )?;
                match (d.end, d.channel) {
                    (End::Producer, Some(_)) => f.write_str(
                        "The gate reports the channel dead; this channel cannot carry records \
                         again: create the gate again (`shmflow clean` removes it once no end \
                         is alive)",
                    ),
                    _ => f.write_str(
                        "A live peer end gets PeerDead; once no end is alive, remove the region \
                         with `shmflow clean` and create the channel again",
                    ),
                }
            }
            OpenError::AwaitsConsumer {
                region,
                unread_records,
            } => write!(
                f,
                "region {region} holds a stream that ended with {unread_records} record(s) no \
                 consumer has read yet: open it as a consumer to read them, or discard them \
                 with `shmflow clean --unread`, then create it again"
            ),
            OpenError::NotFound { region } => write!(
                f,
                "region {region} does not exist (no such POSIX shared-memory object)"
            ),
            OpenError::BadMagic {
                region,
                expected,
                found_kind: Some(k),
                ..
            } => write!(f, "region {region} is {k}, not {expected}: open it as one"),
            OpenError::BadMagic {
                region,
                expected,
                found_kind: None,
                found,
            } => write!(
                f,
                "region {region} is not a shmflow region (or is not initialized yet): \
                 expected {expected}, but its first 8 bytes are {found:#018x}"
            ),
            OpenError::VersionMismatch {
                region,
                expected,
                found,
            } => write!(
                f,
                "region {region} has layout version {found}, this shmflow speaks version \
                 {expected}: both ends must use the same shmflow release"
            ),
            OpenError::SizeMismatch {
                region,
                expected,
                found,
            } => write!(
                f,
                "region {region} is {found} bytes but its header's geometry needs {expected} \
                 bytes: truncated or not a shmflow region"
            ),
            OpenError::NotARegion { region, found } => write!(
                f,
                "region {region} is {found}, not a shared-memory object: shmflow leaves it alone"
            ),
            OpenError::NotOwner {
                region,
                expected,
                found,
            } => write!(
                f,
                "region {region} belongs to uid {found}, not to this user (uid {expected}): a \
                 region of another user is not trusted"
            ),
            OpenError::BadMode { region, mode } => write!(
                f,
                "region {region} has mode {mode:#o}; it must be 0600 (no access for group or \
                 others)"
            ),
            OpenError::AlreadyAttached { region, end, pid } => write!(
                f,
                "region {region}: the {end} end is already attached (pid {pid}); a channel has \
                 one producer and one consumer"
            ),
            OpenError::EndDetached { region, end } => write!(
                f,
                "region {region}: the {end} end was attached before and has detached; an end \
                 attaches once, create a new channel"
            ),
            OpenError::NoMemory {
                region,
                bytes,
                source,
            } => write!(
                f,
                "region {region}: the system cannot back {bytes} bytes of shared memory \
                 ({source}): the tmpfs behind /dev/shm is full or a memory limit (cgroup) is \
                 reached; use a smaller geometry or free memory"
            ),
            OpenError::InvalidConfig(e) => e.fmt(f),
            OpenError::Corrupt(e) => e.fmt(f),
            OpenError::Io(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::Io(e) => Some(&e.source),
            OpenError::NoMemory { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl OpenError {
    pub(crate) fn io(region: &str, op: &'static str, source: io::Error) -> Self {
        OpenError::Io(Box::new(SysError {
            region: region.to_owned(),
            op,
            source,
        }))
    }

    pub(crate) fn corrupt(region: &str, field: &'static str, expected: String, found: u64) -> Self {
        OpenError::Corrupt(Box::new(CorruptError {
            region: region.to_owned(),
            field,
            expected,
            found,
        }))
    }
}

impl From<ConfigError> for OpenError {
    fn from(e: ConfigError) -> Self {
        OpenError::InvalidConfig(e)
    }
}

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
    pub(crate) fn io(region: &str, op: &'static str, source: io::Error) -> Self {
        Error::Io(Box::new(SysError {
            region: region.to_owned(),
            op,
            source,
        }))
    }

    pub(crate) fn corrupt(region: &str, field: &'static str, expected: String, found: u64) -> Self {
        Error::Corrupt(Box::new(CorruptError {
            region: region.to_owned(),
            field,
            expected,
            found,
        }))
    }

    pub(crate) fn closed(region: &str) -> Self {
        Error::Closed(Box::new(ClosedError {
            region: region.to_owned(),
        }))
    }

    pub(crate) fn aborted(region: &str) -> Self {
        Error::RecordAborted(Box::new(RecordAbortedError {
            region: region.to_owned(),
        }))
    }

    pub(crate) fn too_large(region: &str, what: &'static str, len: u64, max: u64) -> Self {
        Error::RecordTooLarge(Box::new(RecordTooLargeError {
            region: region.to_owned(),
            what,
            len,
            max,
        }))
    }

    pub(crate) fn producer_failed(region: &str, pid: u32) -> Self {
        Error::ProducerFailed(Box::new(ProducerFailedError {
            region: region.to_owned(),
            pid,
        }))
    }

    pub(crate) fn peer_dead(region: &str, end: End, pid: u32) -> Self {
        Error::PeerDead(Box::new(PeerDeadError {
            region: region.to_owned(),
            end,
            pid,
            remote: false,
        }))
    }

    /// The end is a network bridge that lost its remote peer.
    pub(crate) fn peer_lost(region: &str, end: End, pid: u32) -> Self {
        Error::PeerDead(Box::new(PeerDeadError {
            region: region.to_owned(),
            end,
            pid,
            remote: true,
        }))
    }

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

/// Converts the core's error into an operation's: the variants an operation can meet map one
/// to one; one it cannot meet is a bug in shmflow, not something a peer can cause.
pub(crate) trait FromCore: Sized {
    fn from_core(e: Error) -> Self;
}

/// Defines a per-operation error: its "not now" variants (mapped from the core's
/// `WouldBlock`/`Timeout`) and the failures the operation can meet.
macro_rules! op_error {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$nmeta:meta])* $now:ident = $core_now:ident : $now_msg:literal, )*
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

        impl FromCore for $name {
            fn from_core(e: Error) -> Self {
                match e {
                    $( Error::$core_now => $name::$now, )*
                    $( Error::$fail(b) => $name::$fail(b), )*
                    other => unreachable!(
                        concat!("shmflow bug: ", stringify!($name), " cannot hold {:?}"),
                        other
                    ),
                }
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
    pub enum TryRecvError {
        /// Nothing is committed yet: try again later.
        Empty = WouldBlock: "nothing to receive yet",
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
    pub enum RecvTimeoutError {
        /// Nothing arrived before the deadline.
        Timeout = Timeout: "timed out waiting for a record",
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
    pub enum TrySendError {
        /// No free segment now (the consumer has not returned one): try again later.
        Full = WouldBlock: "no free segment: the consumer has not returned one yet",
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
    pub enum SendTimeoutError {
        /// No segment came back before the deadline.
        Timeout = Timeout: "timed out waiting for a free segment",
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
        Full = WouldBlock: "no free segment: the consumer has not returned one yet",
        /// No segment came back before the deadline (`stream_timeout`).
        Timeout = Timeout: "timed out waiting for a free segment",
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

    /// Maps the core's error of a wait for the consumer (`Timeout` is decided by the caller).
    pub(crate) fn from_wait(e: Error) -> CloseError {
        match e {
            Error::PeerDead(b) => CloseError::PeerDead(b),
            Error::Closed(b) => CloseError::AlreadyClosed(b),
            Error::Corrupt(b) => CloseError::Corrupt(b),
            Error::Io(b) => CloseError::Io(b),
            other => CloseError::Io(Box::new(SysError {
                region: String::new(),
                op: "waiting for the consumer",
                source: io::Error::other(other.to_string()),
            })),
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
            CloseError::Closed { region, .. } => Error::closed(&region),
            CloseError::PeerDead(b) => Error::PeerDead(b),
            CloseError::AlreadyClosed(b) => Error::Closed(b),
            CloseError::Corrupt(b) => Error::Corrupt(b),
            CloseError::Io(b) => Error::Io(b),
        }
    }
}

/// A blocking call's error is a subset of its `try_` and `_timeout` forms'.
macro_rules! subset_from {
    ($from:ident => $($to:ident),*) => {$(
        impl From<$from> for $to {
            fn from(e: $from) -> $to {
                $to::from_core(e.into())
            }
        }
    )*};
}
subset_from!(SendError => TrySendError, SendTimeoutError, WriteError);
subset_from!(RecvError => TryRecvError, RecvTimeoutError);

/// shmflow's result type, with the umbrella [`Error`] by default.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The core's result: the umbrella error, converted by each public call into its own.
pub(crate) type CoreResult<T> = std::result::Result<T, Error>;

/// `Result<T, Error>` → `Result<T, E>` for an operation's own error `E`.
#[inline]
pub(crate) fn op<T, E: FromCore>(r: CoreResult<T>) -> std::result::Result<T, E> {
    r.map_err(E::from_core)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::mem::size_of;

    /// What the hot calls return stays small: a record and its error fit in four words (the
    /// details of a failure are boxed). Before the errors were split per operation, the one
    /// error type was 80 bytes and so was `recv`'s result.
    #[test]
    fn hot_results_are_small() {
        type Recv<'a> = Option<crate::endpoint::consumer::Record<'a>>;
        assert!(size_of::<Error>() <= 16, "{}", size_of::<Error>());
        assert!(size_of::<TryRecvError>() <= 16);
        assert!(size_of::<TrySendError>() <= 16);
        let sizes = [
            size_of::<std::result::Result<Recv<'static>, RecvError>>(),
            size_of::<std::result::Result<Recv<'static>, TryRecvError>>(),
            size_of::<std::result::Result<Recv<'static>, RecvTimeoutError>>(),
            size_of::<std::result::Result<(), SendError>>(),
            size_of::<std::result::Result<(), TrySendError>>(),
        ];
        for s in sizes {
            assert!(s <= 32, "{sizes:?}");
        }
    }
}
