//! Handing an anonymous (memfd) region to a child process.
//!
//! The creator keeps its own descriptor; a [`PeerHandle`] holds a second one, close-on-exec so
//! that it leaks into no other child. [`PeerHandle::pass_to`] arranges for one `Command` to
//! inherit it (the flag is cleared between fork and exec in that child only) and puts its
//! number in an environment variable; the child calls `Consumer::from_env(var)` (or
//! `Producer::from_env`). Drop the handle after spawning: the parent's copy is not needed.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::process::Command;

use crate::error::{ConfigError, OpenError, RegionKind};

type Result<T, E = OpenError> = std::result::Result<T, E>;
use crate::region::view::Shared;

/// The other end of an anonymous region, to give to a child process.
#[derive(Debug)]
pub struct PeerHandle {
    fd: OwnedFd,
    region: String,
    /// For a gate: the channel whose producer the child becomes.
    channel: Option<u32>,
}

impl PeerHandle {
    pub(crate) fn new(shared: &Shared) -> Result<PeerHandle> {
        Ok(PeerHandle {
            fd: crate::region::object::dup_fd(shared)?,
            region: shared.name.clone(),
            channel: shared.gate.as_ref().map(|g| g.index),
        })
    }

    /// Makes the child spawned by `cmd` inherit the region's descriptor and find its number in
    /// environment variable `var` (as `fd`, or `fd:channel` for a gate's channel).
    pub fn pass_to(&self, cmd: &mut Command, var: &str) {
        let raw = self.fd.as_raw_fd();
        match self.channel {
            Some(c) => cmd.env(var, format!("{raw}:{c}")),
            None => cmd.env(var, raw.to_string()),
        };
        // `raw` stays open in this process until the spawn: the handle must outlive it
        // (documented on the type).
        crate::sys::fd::inherit_in_child(cmd, raw);
    }

    /// The region's name, for messages.
    pub fn region_name(&self) -> &str {
        &self.region
    }

    /// For a gate's handle: the channel it is for.
    pub fn channel(&self) -> Option<u32> {
        self.channel
    }

    /// Gives up the handle's descriptor (to pass it some other way, e.g. over a Unix socket).
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }
}

impl AsFd for PeerHandle {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

pub(crate) fn fd_region_name(fd: &OwnedFd) -> String {
    format!(
        "memfd:shmflow(fd {} in pid {})",
        fd.as_raw_fd(),
        std::process::id()
    )
}

/// Takes ownership of the descriptor whose number is in `var`, and the gate channel if the
/// handle was a gate's (`fd:channel`).
pub(crate) fn fd_from_env(var: &str) -> Result<(RawFd, Option<u32>)> {
    let region = format!("${var}");
    let value = std::env::var(var).map_err(|_| {
        ConfigError::new(
            &region,
            "environment variable",
            "the number of an inherited region descriptor (see PeerHandle::pass_to)",
            "nothing (not set, or not Unicode)",
        )
    })?;
    let (fd_part, channel) = match value.trim().split_once(':') {
        Some((f, c)) => (
            f,
            Some(c.parse::<u32>().map_err(|_| {
                ConfigError::new(
                    &region,
                    "environment variable",
                    "fd:channel with a channel number",
                    format!("{value:?}"),
                )
            })?),
        ),
        None => (value.trim(), None),
    };
    let raw: i32 = fd_part.parse().map_err(|_| {
        ConfigError::new(
            &region,
            "environment variable",
            "a descriptor number",
            format!("{value:?}"),
        )
    })?;
    if !crate::sys::fd::is_open(raw) {
        return Err(ConfigError::new(
            &region,
            "inherited descriptor",
            "an open descriptor (was the handle passed with PeerHandle::pass_to?)",
            raw,
        )
        .into());
    }
    Ok((raw, channel))
}

/// Takes the inherited descriptor `raw` (named in `var`) once it is known to be a shmflow
/// region of `kind`; on any error it is left open and untouched, as it was inherited.
pub(crate) fn adopt_region(var: &str, raw: RawFd, kind: RegionKind) -> Result<OwnedFd> {
    let region = format!("${var}");
    if crate::sys::fd::is_open(raw) && !crate::sys::fd::is_inherited(raw) {
        // Close-on-exec is set: this process opened it (or took it already). Taking it again
        // would make two owners; `from_fd` borrows instead.
        return Err(ConfigError::new(
            &region,
            "inherited descriptor",
            "a descriptor handed over by PeerHandle::pass_to (close-on-exec clear); use \
             from_fd for a descriptor this process already holds",
            format!("{raw}, which this process already owns"),
        )
        .into());
    }
    crate::sys::fd::with_borrowed(raw, |fd| crate::region::object::probe(&region, fd, kind))
        .unwrap_or_else(|| {
            Err(ConfigError::new(
                &region,
                "inherited descriptor",
                "an open descriptor (was the handle passed with PeerHandle::pass_to?)",
                raw,
            )
            .into())
        })?;
    // SAFETY: the parent passed this descriptor for us to own, and it is a region of the right
    // kind; nothing else in this process refers to it (it was inherited, not opened here).
    unsafe { crate::sys::fd::adopt(raw) }.map_err(|e| OpenError::io(&region, "fcntl(F_SETFD)", e))
}

/// A descriptor of our own for a region handed over as `fd`, once it is known to be a
/// shmflow region of `kind`; `fd` itself is never taken or changed.
pub(crate) fn dup_region(fd: BorrowedFd<'_>, kind: RegionKind) -> Result<(OwnedFd, String)> {
    let name = format!(
        "memfd:shmflow(fd {} in pid {})",
        fd.as_raw_fd(),
        std::process::id()
    );
    crate::region::object::probe(&name, fd, kind)?;
    let own = crate::sys::fd::dup(fd).map_err(|e| OpenError::io(&name, "dup", e))?;
    Ok((own, name))
}
