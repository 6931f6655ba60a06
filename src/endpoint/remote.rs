//! Ends whose peer is across the network, with no bridge thread (feature `net`): the
//! recycling and waiting strategy of a [`Producer`](super::producer::Producer) whose segments
//! go to a socket as they are published, and of a [`Consumer`](super::consumer::Consumer)
//! whose segments are filled from a socket when it has nothing left to read.
//!
//! Both ends keep a private region (a channel that only this process maps): the producer
//! writes into its segments and publishes as on one machine, and its [`Outbound`] forwards
//! what was published, as credit allows, and hands each segment back once it is on the wire;
//! the consumer reads in place what its [`Inbound`] wrote into its segments from the socket,
//! and hands them back, which becomes credit. Nothing else runs between the two: the
//! thread that sends writes to the socket, the thread that reads reads from it. The network
//! layer implements both traits; this layer only calls them where a local end would
//! notify or park.

use std::time::Instant;

/// The sending side's strategy: where a local producer would wake its consumer, it
/// forwards; where it would park, it waits for the peer.
pub(crate) trait Outbound: Send {
    /// Forwards everything published and not sent yet, as far as credit allows (a socket
    /// write may block while the peer's receive buffer is full, bounded by the link's
    /// deadline). A failure of the link ends the private consumer as lost, so that the
    /// producer's next call reports `PeerDead`.
    fn pump(&mut self);

    /// Waits until the peer says something (credit, an end, a heartbeat), `until` passes,
    /// or the link fails (then as `pump`), and forwards what the news allows. `Some(now)`
    /// looks without waiting.
    fn wait(&mut self, until: Option<Instant>);

    /// Records were published and not forwarded (`FlushPolicy::Timeout`): forward them within
    /// `within` even if the producer makes no further call (cheap when a flush is asked for
    /// already).
    fn defer(&mut self, within: std::time::Duration);

    /// True while published segments wait for credit (the link is open).
    fn waiting(&self) -> bool;

    /// What ended the link, once it failed or the peer gave up (the peer's words, or what
    /// broke): the cause a `PeerDead` error carries.
    fn cause(&self) -> Option<String>;

    /// The stream ended (its end is published): forwards the rest and the end, waiting for
    /// credit as long as the peer is alive, or until `until`. True once the end is on the
    /// wire.
    fn drain(&mut self, until: Option<Instant>) -> bool;

    /// After [`drain`](Outbound::drain): waits until the peer has everything and ended its
    /// side of the connection, or `until`.
    fn settle(&mut self, until: Instant) -> Settled;

    /// For an async wait: `Ready` once the socket has something to read (then
    /// [`wait`](Outbound::wait) with `Some(now)` takes it), `Pending` with `cx` woken when it
    /// has. Needs a tokio runtime with I/O enabled (as every async wait does).
    #[cfg(feature = "tokio")]
    fn poll_readable(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()>;
}

/// How the peer's consumer stands once the stream ended on a direct sending end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settled {
    /// It read everything.
    Read,
    /// Time ran out with this many segments not handed back (or not sent).
    Pending(u64),
    /// It left with this many segments not handed back.
    Left(u64),
    /// The link failed with this many segments not handed back.
    Lost(u64),
}

/// A link as an end holds it. The ends are `UnwindSafe` and `RefUnwindSafe` with or without
/// the feature that brings links (the auto traits must not change with a feature), so this
/// asserts both: a link caught half-way by a panic is in a state whose later calls report a
/// link error (its socket and reader are checked on every call), never in one that breaks
/// memory safety, which does not rest on unwind safety.
pub(crate) struct Link<T: ?Sized>(pub(crate) Box<T>);

impl<T: ?Sized> std::panic::UnwindSafe for Link<T> {}
impl<T: ?Sized> std::panic::RefUnwindSafe for Link<T> {}

impl<T: ?Sized> std::ops::Deref for Link<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: ?Sized> std::ops::DerefMut for Link<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

/// The receiving side's strategy: where a local consumer would park, it reads from the
/// socket into free segments and announces the segments handed back as credit.
pub(crate) trait Inbound: Send {
    /// Announces credit for the segments handed back, then reads what the peer sent (at
    /// least one message, or until `until`; `Some(now)`: what is there now) and writes it
    /// into the private region. A failure of the link, or the peer's end, ends the private
    /// producer the way a bridge would (lost, failed or closed), so that the consumer reads
    /// what arrived and then the end.
    fn fill(&mut self, until: Option<Instant>);

    /// As [`Outbound::cause`].
    fn cause(&self) -> Option<String>;

    /// True if a [`fill`](Inbound::fill) now would do something without new bytes from the
    /// peer: announce credit for segments handed back, or put in a priority event that
    /// waited for room in the lane. (A gate, which waits for many channels at once, fills a
    /// channel's link when this says so or when its socket got bytes.)
    fn due(&mut self) -> bool;

    /// The socket, for a watch of its readiness (a gate's).
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_>;

    /// For an async wait: as [`Outbound::poll_readable`].
    #[cfg(feature = "tokio")]
    fn poll_readable(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()>;
}
