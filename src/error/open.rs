//! Creating and opening regions and attaching ends: [`OpenError`].

use std::fmt;
use std::io;

use super::details::{ConfigError, CorruptError, SysError};
use super::{DeadEnd, End, RegionKind};

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
