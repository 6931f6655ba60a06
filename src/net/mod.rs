//! Remote channels over TCP (feature `net`): Flink's credit-based flow control between
//! machines, on tokio.
//!
//! Not under `--cfg shmflow_loom`: sockets and another machine are outside what a loom model
//! runs.
//!
//! A channel crosses the network through two bridges. On the sending machine a [`Server`]
//! holds the [`Consumer`](crate::Consumer) end of a local channel and listens; on the
//! receiving machine a [`Client`] holds the [`Producer`](crate::Producer) end of a local
//! channel (or of a channel of a local [`Gate`](crate::Gate)), connects, and requests the
//! channel by name. The stages at both ends keep using `Producer` and `Consumer` (or `Gate`)
//! as they would on one machine.
//!
//! **Segments cross as they are.** The server forwards the published part of each segment
//! (a segment may go in several parts as it fills, so latency stays low), byte for byte, and
//! the client writes it at the same offset of one of its own free segments: records are
//! never re-serialized. Both ends' segments must be the same size.
//!
//! **Credit.** One credit is one free segment of the receiving channel. The client announces
//! the free segments of its producer in its request and then as they come back from its
//! consumer; the server starts a segment only with a credit in hand, and tells its backlog
//! (segments published and waiting) with each buffer. A receiving gate channel whose sender
//! has a backlog asks its gate for floating segments, which become credit. With no credit,
//! one channel stops — its local producer blocks in `send`, its backpressured time rises —
//! while the connection goes on carrying the others.
//!
//! **Faults.** Both sides send heartbeats while idle; a peer that is silent for
//! [`Config::dead_after`], a connection that breaks or a peer that breaks the protocol ends
//! every channel of the connection: the local consumer reads the intact, in-order prefix that
//! arrived and then gets `PeerDead` ([`PeerDeadError::is_remote`](crate::PeerDeadError::is_remote)),
//! and a local producer blocked in `send` gets `PeerDead`.
//!
//! **Security.** Everything received is validated before use (frame lengths, channel ids,
//! credit arithmetic, and every record frame inside a buffer against its segment); a peer
//! that sends garbage gets its connection closed and this side a [`LinkError`]. Plaintext is
//! allowed on loopback only: any other address needs [`Tls`] with mutual authentication, or
//! an explicit [`Config::insecure_plaintext`].
//!
//! The wire format is in `docs/PROTOCOL.md` (section 9).

use std::net::SocketAddr;
use std::time::Duration;

pub(crate) mod client;
mod direct;
mod error;
mod link;
pub(crate) mod server;
mod tls;
pub(crate) mod wire;

pub use client::Client;
pub use direct::{connect_consumer, connect_gate_channel, Listener};
pub use error::{LinkError, ProtocolError, RemoteCode, SetupError};
pub use server::Server;
pub use tls::Tls;

/// Settings of a [`Server`] or [`Client`].
#[derive(Clone, Debug)]
pub struct Config {
    pub(crate) heartbeat: Duration,
    pub(crate) dead_after: Duration,
    pub(crate) tls: Option<Tls>,
    pub(crate) insecure_plaintext: bool,
}

impl Default for Config {
    /// Heartbeats every 200 ms, a peer silent for 800 ms is dead, plaintext (loopback only).
    fn default() -> Self {
        Config {
            heartbeat: Duration::from_millis(200),
            dead_after: Duration::from_millis(800),
            tls: None,
            insecure_plaintext: false,
        }
    }
}

impl Config {
    /// Sends a heartbeat every `every` while idle, and takes the peer as dead after
    /// `dead_after` without a message (at least twice `every`).
    pub fn heartbeat(mut self, every: Duration, dead_after: Duration) -> Config {
        self.heartbeat = every.max(Duration::from_millis(1));
        self.dead_after = dead_after.max(2 * self.heartbeat);
        self
    }

    /// Mutual TLS on every connection.
    pub fn tls(mut self, tls: Tls) -> Config {
        self.tls = Some(tls);
        self
    }

    /// Allows plaintext on addresses other than loopback. **Insecure**: anyone on the path
    /// can read the records and inject their own. For networks that are private by other
    /// means (a namespace, a VPN).
    pub fn insecure_plaintext(mut self) -> Config {
        self.insecure_plaintext = true;
        self
    }

    /// How long a silent peer is given.
    pub fn dead_after(&self) -> Duration {
        self.dead_after
    }

    fn check_addr(&self, addr: SocketAddr) -> Result<(), SetupError> {
        if addr.ip().is_loopback() || self.tls.is_some() || self.insecure_plaintext {
            Ok(())
        } else {
            Err(SetupError::PlaintextRefused { addr })
        }
    }
}

/// How a remote channel ended without a failure of the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ended {
    /// The producer closed the stream; everything arrived.
    Clean,
    /// The producer ended it as failed; everything it sent arrived.
    Failed,
    /// The producer died; everything it sent before arrived.
    ProducerDead,
    /// The consumer left before the end.
    ConsumerLeft,
}

/// How one remote channel ended.
#[derive(Debug)]
pub struct ChannelOutcome {
    /// The channel's name.
    pub name: String,
    /// Its end, or what broke the link.
    pub result: Result<Ended, LinkError>,
}

/// What a [`Server`] did.
#[derive(Debug, Default)]
pub struct ServeReport {
    /// Every exported channel, as it ended.
    pub channels: Vec<ChannelOutcome>,
    /// Connections closed before they served a channel, with the peer's address and why.
    pub refused: Vec<(Option<SocketAddr>, LinkError)>,
}

fn check_name(name: &str) -> Result<(), SetupError> {
    if name.is_empty() || name.len() > wire::MAX_NAME {
        return Err(SetupError::Name {
            name: name.into(),
            detail: "a channel name is 1 to 255 bytes",
        });
    }
    Ok(())
}
