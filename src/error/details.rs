//! The details of each failure: who, where, what was expected and what was found. Each
//! sits behind a `Box` in the errors that carry it.

use std::fmt;
use std::io;

use super::End;

/// The peer process died without detaching (its liveness lock is gone), or, for an end made
/// with `create_anonymous`, no peer ever attached and no process holds the region's
/// [`PeerHandle`](crate::PeerHandle) any more ([`never_attached`](PeerDeadError::never_attached)).
/// A consumer gets this only after every record the producer committed before dying was
/// delivered.
#[derive(Debug)]
pub struct PeerDeadError {
    pub(crate) region: String,
    pub(crate) end: End,
    pub(crate) pid: u32,
    pub(crate) remote: bool,
    /// No peer attached, and every descriptor of its handle is closed: none ever will.
    pub(crate) never_attached: bool,
    /// What the link's end knows of the loss (a direct network end: the peer's own words,
    /// or what broke).
    pub(crate) cause: Option<String>,
}

impl PeerDeadError {
    /// The region's name (`/name` or `memfd:…`).
    pub fn region(&self) -> &str {
        &self.region
    }
    /// The end that died (or never attached).
    pub fn end(&self) -> End {
        self.end
    }
    /// The pid it recorded when it attached (0 if it [never attached](Self::never_attached)).
    pub fn pid(&self) -> u32 {
        self.pid
    }
    /// True if the peer never attached and every descriptor of the region's `PeerHandle` was
    /// closed: the process it was passed to exited (or crashed) before attaching, or the
    /// handle was dropped unused. Nothing can attach any more.
    pub fn never_attached(&self) -> bool {
        self.never_attached
    }
    /// True if the end is a network bridge (`shmflow::net`) whose peer on the other side of
    /// the connection was lost; `pid` is then the bridge's process, which is alive.
    pub fn is_remote(&self) -> bool {
        self.remote
    }
    /// For a direct network end (`net::Listener::accept_producer`, `net::connect_consumer`),
    /// what ended the link, when it knows: what the peer said when it gave up (for example
    /// that its consumer takes no priority events), or what broke. `None` otherwise.
    pub fn cause(&self) -> Option<&str> {
        self.cause.as_deref()
    }
}

impl fmt::Display for PeerDeadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(cause) = &self.cause {
            let who = match self.end {
                End::Producer => "producer",
                End::Consumer => "consumer",
            };
            return write!(
                f,
                "region {}: the link to the remote {who} ended: {cause}",
                self.region
            );
        }
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
        if self.never_attached {
            let (who, what) = match self.end {
                End::Producer => ("producer", "nothing will come"),
                End::Consumer => ("consumer", "nothing written would be read"),
            };
            return write!(
                f,
                "region {}: no {who} ever attached, and every descriptor of its handle is \
                 closed (the process it was passed to exited before attaching, or the handle \
                 was dropped unused): {what}",
                self.region
            );
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
