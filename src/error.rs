//! The one error type of shmflow. Every message names the region and says what was expected
//! and what was found, so that a user can act on it.

use std::fmt;
use std::io;

/// Which end of a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The side that writes records.
    Producer,
    /// The side that reads records.
    Consumer,
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            End::Producer => "producer",
            End::Consumer => "consumer",
        })
    }
}

/// Everything that can go wrong in shmflow.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A system call on the region failed.
    Io {
        /// The region's name (`/name` or `memfd:…`).
        region: String,
        /// What shmflow was doing.
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// `create` found a region of that name already there (`O_EXCL`).
    AlreadyExists {
        /// The region's name.
        region: String,
    },
    /// `open` found no region of that name.
    NotFound {
        /// The region's name.
        region: String,
    },
    /// The region does not start with shmflow's magic: it is not a shmflow region, or its
    /// creator has not finished initializing it.
    BadMagic {
        /// The region's name.
        region: String,
        /// The magic this kind of open needs (a channel's or a gate's).
        expected: u64,
        /// The magic that was found.
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
    /// The size of the shared-memory object does not match the geometry in its header.
    SizeMismatch {
        /// The region's name.
        region: String,
        /// The size the header's geometry implies.
        expected: u64,
        /// The size of the object.
        found: u64,
    },
    /// A geometry or option outside what shmflow supports.
    InvalidConfig {
        /// The region's name, or `<config>` before there is one.
        region: String,
        /// Which setting.
        field: &'static str,
        /// What it must be.
        expected: String,
        /// What it was.
        found: u64,
    },
    /// That end of the channel is already attached (at most one producer and one consumer).
    AlreadyAttached {
        /// The region's name.
        region: String,
        /// The end that was asked for.
        end: End,
        /// The pid recorded by the end that is attached.
        pid: u32,
    },
    /// That end of the channel was attached before and has detached: an end attaches once.
    EndDetached {
        /// The region's name.
        region: String,
        /// The end that was asked for.
        end: End,
    },
    /// A value read from shared memory is out of range: the peer is buggy, crashed while
    /// writing, or hostile. The channel cannot be trusted any more.
    Corrupt {
        /// The region's name.
        region: String,
        /// Which field of the region.
        field: &'static str,
        /// What a correct peer would have written.
        expected: String,
        /// What was found.
        found: u64,
    },
    /// The consumer has detached: nothing written from now on would be read.
    Closed {
        /// The region's name.
        region: String,
    },
    /// A spanning record was abandoned by the producer before its last part (timeout, dropped
    /// stream writer, or the producer closed): the parts already read are not a whole record.
    RecordAborted {
        /// The region's name.
        region: String,
    },
    /// A record longer than the reader accepts (`Consumer::set_max_record_len`) or than an
    /// API can place in one segment (`claim`).
    RecordTooLarge {
        /// The region's name.
        region: String,
        /// The record's length (or the length seen so far).
        len: u64,
        /// The largest length accepted there.
        max: u64,
    },
    /// The peer process died without detaching (its liveness lock is gone). For a consumer,
    /// every record committed before the death was delivered first.
    PeerDead {
        /// The region's name.
        region: String,
        /// The end that died.
        end: End,
        /// The pid it had recorded at attach.
        pid: u32,
    },
    /// A named region exists but none of its ends is alive: left behind by a crash.
    Stale {
        /// The region's name.
        region: String,
    },
    /// A `try_` call found nothing to do without waiting.
    WouldBlock,
    /// A `_timeout` call ran out of time.
    Timeout,
}

impl Error {
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn io(region: &str, op: &'static str, source: io::Error) -> Self {
        Error::Io {
            region: region.to_owned(),
            op,
            source,
        }
    }

    pub(crate) fn corrupt(region: &str, field: &'static str, expected: String, found: u64) -> Self {
        Error::Corrupt {
            region: region.to_owned(),
            field,
            expected,
            found,
        }
    }

    /// True for the two "not now" results of `try_` and `_timeout` calls.
    pub fn is_would_block_or_timeout(&self) -> bool {
        matches!(self, Error::WouldBlock | Error::Timeout)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { region, op, source } => write!(f, "region {region}: {op} failed: {source}"),
            Error::AlreadyExists { region } => write!(
                f,
                "region {region} already exists; open it instead, or remove it (shm_unlink, \
                 or `rm /dev/shm{region}`) if its creator is gone"
            ),
            Error::NotFound { region } => {
                write!(
                    f,
                    "region {region} does not exist (no such POSIX shared-memory object)"
                )
            }
            Error::BadMagic {
                region,
                expected,
                found,
            } => {
                use crate::gate::layout::GATE_MAGIC;
                use crate::layout::MAGIC;
                let what = |m| match m {
                    MAGIC => "a shmflow channel",
                    GATE_MAGIC => "a shmflow gate",
                    _ => "a shmflow region",
                };
                if *found == MAGIC || *found == GATE_MAGIC {
                    write!(
                        f,
                        "region {region} is {}, not {}: open it as one",
                        what(*found),
                        what(*expected)
                    )
                } else {
                    write!(
                        f,
                        "region {region} is not a shmflow region (or is not initialized yet): \
                         expected magic {expected:#018x} ({}), found {found:#018x}",
                        what(*expected)
                    )
                }
            }
            Error::VersionMismatch {
                region,
                expected,
                found,
            } => write!(
                f,
                "region {region} has layout version {found}, this shmflow speaks version \
                 {expected}: both ends must use the same shmflow release"
            ),
            Error::SizeMismatch {
                region,
                expected,
                found,
            } => write!(
                f,
                "region {region} is {found} bytes but its header's geometry needs {expected} \
                 bytes: truncated or not a shmflow region"
            ),
            Error::InvalidConfig {
                region,
                field,
                expected,
                found,
            } => {
                write!(
                    f,
                    "region {region}: {field} must be {expected}, got {found}"
                )
            }
            Error::AlreadyAttached { region, end, pid } => write!(
                f,
                "region {region}: the {end} end is already attached (pid {pid}); a channel has \
                 one producer and one consumer"
            ),
            Error::EndDetached { region, end } => write!(
                f,
                "region {region}: the {end} end was attached before and has detached; an end \
                 attaches once, create a new channel"
            ),
            Error::Corrupt {
                region,
                field,
                expected,
                found,
            } => write!(
                f,
                "region {region} is corrupt: {field} should be {expected}, found {found} (the \
                 peer is buggy, crashed mid-write, or hostile)"
            ),
            Error::Closed { region } => {
                write!(f, "region {region}: the consumer has detached, records can no longer be delivered")
            }
            Error::RecordAborted { region } => write!(
                f,
                "region {region}: the producer abandoned a spanning record before its last part"
            ),
            Error::RecordTooLarge { region, len, max } => {
                write!(
                    f,
                    "region {region}: record of {len} bytes exceeds the limit of {max} bytes"
                )
            }
            Error::PeerDead { region, end, pid } => write!(
                f,
                "region {region}: the {end} (pid {pid}) died without detaching; records it \
                 committed before dying were delivered, nothing more will come"
            ),
            Error::Stale { region } => write!(
                f,
                "region {region} exists but no end of it is alive (left by a crashed process): \
                 remove it with `shmflow clean` or `rm /dev/shm{region}`, then create it again"
            ),
            Error::WouldBlock => f.write_str("the operation would block"),
            Error::Timeout => f.write_str("the operation timed out"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match &e {
            Error::WouldBlock => io::ErrorKind::WouldBlock,
            Error::Timeout => io::ErrorKind::TimedOut,
            Error::Closed { .. } => io::ErrorKind::BrokenPipe,
            Error::Corrupt { .. } => io::ErrorKind::InvalidData,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// shmflow's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
