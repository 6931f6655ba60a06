//! Handing an anonymous (memfd) region to a child process.
//!
//! The creator keeps its own descriptor; a [`PeerHandle`] holds a second one, close-on-exec so
//! that it leaks into no other child. [`PeerHandle::pass_to`] arranges for one `Command` to
//! inherit it (the flag is cleared between fork and exec in that child only) and puts its
//! number in an environment variable; the child calls `Consumer::from_env(var)` (or
//! `Producer::from_env`). Drop the handle after spawning: the parent's copy is not needed.
//!
//! The handle's descriptor is an open file description of its own that holds a lock (see
//! `liveness::handle_fd`) for as long as any process has a copy of it: once every copy is
//! closed and no peer attached (the child died before attaching, or the handle was dropped
//! unused), the creator's end stops waiting with `PeerDead` (`never_attached`).
//!
//! The region's doorbells travel with it: the socket pairs that async waiters of the channel
//! sleep on (the consumer's word's and the producer's), inherited the same way. A region
//! opened from a bare descriptor (`from_fd`, `into_fd`) has none in that process: its words
//! are marked bell-less, and async waiters on them sleep on the futex (through the bridge
//! thread) instead.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::process::Command;

use crate::error::{ConfigError, OpenError, RegionKind};

type Result<T, E = OpenError> = std::result::Result<T, E>;
use crate::region::view::{Bells, Shared};

/// The other end of an anonymous region, to give to a child process
/// ([`PeerHandle::pass_to`]) or to a thread of this one (`Producer::from_handle`,
/// `Consumer::from_handle`).
///
/// While a process holds it (or a copy: the child's inherited descriptor, one in flight in a
/// socket), the end that made it waits for its peer as long as it takes. Once every copy is
/// closed and no peer attached, that end's waits fail with
/// [`PeerDead`](crate::PeerDeadError), whose
/// [`never_attached`](crate::PeerDeadError::never_attached) is true (a gate reports the
/// channel as [`ChannelDead`](crate::GateMessage::ChannelDead)): drop the parent's copy once
/// the child is spawned, so that a child that dies before attaching is noticed.
///
/// Under `--cfg shmflow_loom` the region lives on the heap and the handle is for a thread of
/// the model only: it has no descriptor, so no `pass_to`, `into_fd` or `AsFd`.
#[derive(Debug)]
pub struct PeerHandle {
    fd: OwnedFd,
    region: String,
    /// For a gate: the channel whose producer the child becomes.
    channel: Option<u32>,
    /// The region's doorbells (this process's own, shared: the child inherits those of the
    /// channel's consumer word and producer word).
    bells: Option<std::sync::Arc<Bells>>,
}

impl PeerHandle {
    /// The handle of the region's end `peer` (for a gate, its channel's producer): a
    /// descriptor of its own whose lock tells the creator that a peer may still come (see
    /// `liveness::handle_fd`).
    pub(crate) fn new(shared: &Shared, peer: crate::error::End) -> Result<PeerHandle> {
        let bells = match (shared.consumer_bell(), shared.producer_bell()) {
            (Some(_), Some(_)) => shared.bells().cloned(),
            _ => None,
        };
        let channel = shared.gate.as_ref().map(|g| g.index);
        let byte = crate::region::liveness::lock_byte(channel, peer);
        Ok(PeerHandle {
            fd: crate::region::liveness::handle_fd(shared.fd(), byte, &shared.name)?,
            region: shared.name.clone(),
            channel,
            bells,
        })
    }

    /// The doorbells, for a peer in this process (which shares them).
    pub(crate) fn take_bells(&mut self) -> Option<std::sync::Arc<Bells>> {
        self.bells.take()
    }

    /// The four descriptors the child inherits: the wait and ring ends of the consumer
    /// word's bell, then of the producer word's.
    fn bell_fds(&self) -> Option<[RawFd; 4]> {
        let bells = self.bells.as_ref()?;
        let c = bells.consumer.as_ref()?.fds();
        let p = bells.producer(self.channel.unwrap_or(0))?.fds();
        Some([c[0], c[1], p[0], p[1]].map(|f| f.as_raw_fd()))
    }

    /// Makes the child spawned by `cmd` inherit the region's descriptor and its doorbells, and
    /// find their numbers in environment variable `var` (as `fd`, or `fd:channel` for a
    /// gate's channel, followed by `/a,b,c,d`: the two ends of the consumer word's doorbell,
    /// then of the producer word's).
    pub fn pass_to(&self, cmd: &mut Command, var: &str) {
        let raw = self.fd.as_raw_fd();
        let mut value = match self.channel {
            Some(c) => format!("{raw}:{c}"),
            None => raw.to_string(),
        };
        // The descriptors stay open in this process until the spawn: the handle must outlive
        // it (documented on the type).
        crate::sys::fd::inherit_in_child(cmd, raw);
        if let Some(fds) = self.bell_fds() {
            // Copies of the child's own (owned by `cmd`, closed with it): a child may be
            // handed several channels of one gate, whose doorbell for the gate's word is the
            // same, and takes each number once.
            let copies: std::io::Result<Vec<OwnedFd>> = fds
                .iter()
                .map(|&f| {
                    // SAFETY: `f` is open: the handle's `Arc` keeps the doorbells for as long
                    // as it lives, which is across this call.
                    crate::sys::fd::dup(unsafe { BorrowedFd::borrow_raw(f) })
                })
                .collect();
            // Out of descriptors: the child goes without doorbells (its waits, and its peer's,
            // through the bridge).
            if let Ok(copies) = copies {
                let nums: Vec<String> = copies
                    .into_iter()
                    .map(|own| crate::sys::fd::inherit_owned_in_child(cmd, own).to_string())
                    .collect();
                value.push_str(&format!("/{}", nums.join(",")));
            }
        }
        cmd.env(var, value);
    }

    /// The region's name, for messages.
    pub fn region_name(&self) -> &str {
        &self.region
    }

    /// For a gate's handle: the channel it is for.
    pub fn channel(&self) -> Option<u32> {
        self.channel
    }

    /// Gives up the handle's descriptor (to pass it some other way, e.g. over a Unix socket),
    /// without the region's doorbells: the peer that opens it with `from_fd` makes both ends'
    /// async waits go through the bridge thread, and it is refused once a peer attached with
    /// the doorbells. A gate's channel can be attached only with its doorbells
    /// ([`PeerHandle::pass_to`]).
    ///
    /// The descriptor is the handle: while it or a copy of it (`dup`, one sent with
    /// `SCM_RIGHTS`, one inherited) is open, the end that made it waits for its peer; once
    /// all are closed with no peer attached, it is told the peer never attached. A descriptor
    /// opened anew from `/proc/<pid>/fd/<n>` is not a copy and does not count.
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

/// What a handle's environment variable names: the region's descriptor, the gate channel if
/// the handle was a gate's, and the doorbells' descriptors if they were passed.
struct FromEnv {
    pub(crate) region: RawFd,
    pub(crate) channel: Option<u32>,
    bells: Option<[RawFd; 4]>,
}

/// Reads the descriptor numbers in `var` (`fd[:channel][/a,b,c,d]`), checked open; nothing
/// is taken yet.
fn fd_from_env(var: &str) -> Result<FromEnv> {
    let region = format!("${var}");
    let value = std::env::var(var).map_err(|_| {
        ConfigError::new(
            &region,
            "environment variable",
            "the number of an inherited region descriptor (see PeerHandle::pass_to)",
            "nothing (not set, or not Unicode)",
        )
    })?;
    let bad = |expected: &str| {
        ConfigError::new(
            &region,
            "environment variable",
            expected,
            format!("{value:?}"),
        )
    };
    let (head, bells) = match value.trim().split_once('/') {
        Some((h, b)) => {
            let nums: Vec<&str> = b.split(',').collect();
            let [a, b, c, d] = nums[..] else {
                return Err(bad("fd[:channel]/a,b,c,d with four doorbell descriptors").into());
            };
            let num = |x: &str| {
                x.parse::<RawFd>()
                    .map_err(|_| bad("doorbell descriptor numbers"))
            };
            (h, Some([num(a)?, num(b)?, num(c)?, num(d)?]))
        }
        None => (value.trim(), None),
    };
    let (fd_part, channel) = match head.split_once(':') {
        Some((f, c)) => (
            f,
            Some(
                c.parse::<u32>()
                    .ok()
                    .filter(|&c| c < crate::protocol::abi::MAX_CHANNELS)
                    .ok_or_else(|| bad("fd:channel with a channel number below 1024"))?,
            ),
        ),
        None => (head, None),
    };
    let raw: i32 = fd_part.parse().map_err(|_| bad("a descriptor number"))?;
    if !crate::sys::fd::is_open(raw) {
        return Err(ConfigError::new(
            &region,
            "inherited descriptor",
            "an open descriptor (was the handle passed with PeerHandle::pass_to?)",
            raw,
        )
        .into());
    }
    Ok(FromEnv {
        region: raw,
        channel,
        bells,
    })
}

impl FromEnv {
    /// Checks, without taking them, that the doorbells named in `var` are Unix datagram
    /// sockets handed over to this process (close-on-exec clear), distinct from each other and
    /// from the region's descriptor.
    fn check_bells(&self, var: &str) -> Result<()> {
        let Some(raws) = self.bells else {
            return Ok(());
        };
        let region = format!("${var}");
        for raw in raws {
            let distinct = raws.iter().filter(|&&r| r == raw).count() == 1;
            let ok = crate::sys::bell::is_bell(raw)
                && crate::sys::fd::is_inherited(raw)
                && raw != self.region
                && distinct;
            if !ok {
                return Err(ConfigError::new(
                    &region,
                    "inherited doorbell",
                    "four distinct Unix datagram sockets handed over by PeerHandle::pass_to",
                    raw,
                )
                .into());
            }
        }
        Ok(())
    }

    /// Takes the doorbells named in `var` (checked first); `None` if none were passed.
    fn adopt_bells(&self, var: &str) -> Result<Option<std::sync::Arc<Bells>>> {
        self.check_bells(var)?;
        let Some(raws) = self.bells else {
            return Ok(None);
        };
        let region = format!("${var}");
        let take = |raw| -> Result<OwnedFd> {
            // SAFETY: an inherited socket (checked above) that the parent passed for us to
            // own; nothing else in this process refers to it. (If marking one close-on-exec
            // fails, those taken before are closed with the error: they were ours.)
            unsafe { crate::sys::fd::adopt(raw) }
                .map_err(|e| OpenError::io(&region, "fcntl(F_SETFD)", e))
        };
        let [a, b, c, d] = raws;
        let consumer = crate::region::os::Doorbell::from_fds(take(a)?, take(b)?);
        let producer = crate::region::os::Doorbell::from_fds(take(c)?, take(d)?);
        Ok(Some(std::sync::Arc::new(Bells::of_channel(
            self.channel.unwrap_or(0),
            consumer,
            producer,
        ))))
    }
}

/// What a handle's variable opened: a channel of its own, or channel `c` of a gate.
pub(crate) enum Handed {
    Channel(std::sync::Arc<Shared>),
    GateChannel(std::sync::Arc<Shared>),
}

/// The error of a consumer handed a gate channel's handle.
pub(crate) fn gate_handle_refused(var: &str, c: u32) -> OpenError {
    ConfigError::new(
        &format!("${var}"),
        "handle",
        "a channel's handle: a gate's channel is for its producer",
        format!("the handle of gate channel {c}"),
    )
    .into()
}

/// Opens the region of `handle` for an end in this process, with its doorbells (a thread of
/// the creator's process takes the other end: the two share the doorbells).
pub(crate) fn open_handle(mut handle: PeerHandle) -> Result<Handed> {
    let channel = handle.channel;
    let bells = handle.take_bells();
    let fd = handle.into_fd();
    let name = fd_region_name(&fd);
    Ok(match channel {
        None => Handed::Channel(crate::region::object::open_fd(name, fd, true, bells)?),
        Some(c) => {
            let chans = crate::region::object::gate_open_fd(name.clone(), fd, true, bells)?;
            Handed::GateChannel(crate::region::object::pick_channel(chans, c, &name)?)
        }
    })
}

/// Opens the region named by the handle in `var` (see [`PeerHandle::pass_to`]), with its
/// doorbells if they were passed. A gate's handle is refused unless `gate_ok` (it is for a
/// producer), before anything is taken.
pub(crate) fn open_from_env(var: &str, gate_ok: bool) -> Result<Handed> {
    let env = fd_from_env(var)?;
    if let (Some(c), false) = (env.channel, gate_ok) {
        return Err(gate_handle_refused(var, c));
    }
    // Taken first (checked, close-on-exec set): whatever fails next, they leak into no child
    // of ours.
    let bells = env.adopt_bells(var)?;
    let kind = match env.channel {
        None => RegionKind::Channel,
        Some(_) => RegionKind::Gate,
    };
    let fd = adopt_region(var, env.region, kind)?;
    let name = fd_region_name(&fd);
    Ok(match env.channel {
        None => Handed::Channel(crate::region::object::open_fd(name, fd, true, bells)?),
        Some(c) => {
            let chans = crate::region::object::gate_open_fd(name.clone(), fd, true, bells)?;
            Handed::GateChannel(crate::region::object::pick_channel(chans, c, &name)?)
        }
    })
}

/// Takes the inherited descriptor `raw` (named in `var`) once it is known to be a shmflow
/// region of `kind`; on any error it is left open and untouched, as it was inherited.
fn adopt_region(var: &str, raw: RawFd, kind: RegionKind) -> Result<OwnedFd> {
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
