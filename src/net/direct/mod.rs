//! Direct network ends: a [`Producer`] whose segments its own thread writes to the socket as
//! it publishes them, and a [`Consumer`] that reads the socket into its free segments when it
//! has read everything — no bridge thread, no shared-memory region between processes.
//!
//! They speak the same protocol as the bridges ([`Server`](crate::net::Server) and
//! [`Client`](crate::net::Client)), so either kind of end can face either kind: Flink's
//! credits (one per free segment of the receiver), the backlog with each buffer, priority
//! events and barriers overtaking the segments, heartbeats (from a small keeper thread, so
//! that an end whose thread is busy elsewhere is not taken as dead), and every byte that
//! arrives checked before it is used. One connection carries one channel. A receiving end is
//! a [`Consumer`] ([`connect_consumer`]) or a channel of a [`Gate`]
//! ([`connect_gate_channel`]).
//!
//! The sockets block: the thread that calls `send` or `recv` does the network work itself,
//! which is what makes these ends fast on few cores (an async runtime would put a hand-off
//! between the stage and the socket, which is what the bridges pay for).
//!
//! Each end keeps a private region (an anonymous mapping only this process sees): records are
//! written into its segments and read from them in place, as on one machine. A sending end
//! forwards what it publishes (every record with [`FlushPolicy::EveryRecord`], the default;
//! whole segments and flushes with [`FlushPolicy::Explicit`], the throughput setting) and,
//! out of segments, reads the receiver's credit; a receiving end announces the segments its
//! reader hands back as credit.
//!
//! With [`Config::tls`] the connection carries mutual TLS, as the bridges' does (rustls in
//! this process; the listening side is the TLS server, the connecting side checks its name):
//! what is written is encrypted into records and then written, what is read is decrypted and
//! then copied into the segment, so a large buffer is no longer read straight into it, and
//! every byte costs the cipher's work on top. Without TLS, only loopback is allowed, or any
//! address with [`Config::insecure_plaintext`].
//!
//! [`FlushPolicy::EveryRecord`]: crate::FlushPolicy::EveryRecord
//! [`FlushPolicy::Explicit`]: crate::FlushPolicy::Explicit

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::Instant;

use crate::endpoint::consumer::Consumer;
use crate::endpoint::gate::Gate;
use crate::endpoint::producer::Producer;
use crate::error::OpenError;
use crate::net::error::{LinkError, ProtocolError, SetupError};
use crate::net::wire::{self, Msg, Peeked};
use crate::net::{check_name, Config};
use crate::protocol::abi::Geometry;
use tokio_rustls::rustls;

mod inbound;
mod keeper;
mod out;
mod reader;
mod sock;

use reader::{Got, Reader};
use sock::Sock;

/// Credit a request may carry (as the server's bound).
const MAX_CREDIT: u32 = 1 << 24;

/// The TLS session of one connection, if the config has TLS: the listening side is the
/// server, the connecting side the client (it checks the server's name), both present their
/// certificate (as the bridges do).
fn session(config: &Config, server: bool) -> Result<Option<rustls::Connection>, SetupError> {
    let Some(tls) = &config.tls else {
        return Ok(None);
    };
    let conn = if server {
        rustls::ServerConnection::new(tls.server.clone()).map(rustls::Connection::Server)
    } else {
        rustls::ClientConnection::new(tls.client.clone(), tls.server_name.clone())
            .map(rustls::Connection::Client)
    };
    conn.map(Some)
        .map_err(|e| SetupError::Tls(format!("a session: {e}")))
}

fn private_pair(geometry: Geometry) -> Result<(Producer, Consumer), SetupError> {
    let local = |e: OpenError| SetupError::Handshake(LinkError::local(e));
    let (p, handle) = Producer::create_anonymous_with(geometry).map_err(local)?;
    let c = Consumer::from_handle(handle).map_err(local)?;
    Ok((p, c))
}

/// Listens for receivers of direct sending ends.
///
/// # Examples
///
/// ```no_run
/// use shmflow::net::{connect_consumer, Config, Listener};
/// use shmflow::Geometry;
///
/// let listener = Listener::bind("127.0.0.1:7401".parse()?, Config::default())?;
/// let addr = listener.local_addr()?;
/// let reader = std::thread::spawn(move || {
///     let mut rx = connect_consumer(addr, "events", Geometry::default(), Config::default())?;
///     let mut n = 0;
///     while let Some(_record) = rx.recv()? {
///         n += 1;
///     }
///     Ok::<_, Box<dyn std::error::Error + Send + Sync>>(n)
/// });
/// let mut tx = listener.accept_producer("events", Geometry::default())?;
/// tx.send(b"hello")?;
/// tx.close_timeout(std::time::Duration::from_secs(5))?;
/// assert_eq!(reader.join().unwrap().unwrap(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Listener {
    listener: TcpListener,
    config: Config,
}

impl Listener {
    /// Listens on `addr` (any address with [`Config::tls`] or
    /// [`Config::insecure_plaintext`], loopback without).
    ///
    /// # Errors
    /// [`SetupError::PlaintextRefused`], or [`SetupError::Io`] if the address cannot be
    /// bound.
    pub fn bind(addr: SocketAddr, config: Config) -> Result<Listener, SetupError> {
        config.check_addr(addr)?;
        let listener = TcpListener::bind(addr).map_err(|e| SetupError::Io {
            context: format!("listening on {addr}"),
            source: e,
        })?;
        Ok(Listener { listener, config })
    }

    /// The address it listens on (with the port the system chose for port 0).
    ///
    /// # Errors
    /// [`SetupError::Io`] if the system cannot say.
    pub fn local_addr(&self) -> Result<SocketAddr, SetupError> {
        self.listener.local_addr().map_err(|e| SetupError::Io {
            context: "the listening address".into(),
            source: e,
        })
    }

    /// Waits for a receiver that requests the channel `name` (a
    /// [`connect_consumer`] or a [`Client`](crate::net::Client)), and returns the producer
    /// whose records go to it, segments of `geometry` (the receiver's segments must be the
    /// same size). Connections that request another name, or that do not speak the protocol
    /// within the config's `dead_after`, are told so and closed, and the wait goes on; with
    /// TLS, so are those whose handshake fails (a certificate no trusted authority signed, or
    /// no TLS at all).
    ///
    /// # Errors
    /// - [`SetupError::Name`] for an empty name or one over 255 bytes;
    /// - [`SetupError::Handshake`] with [`LinkError::SegmentSize`] if the receiver that asked
    ///   for `name` has segments of another size (it is told so too);
    /// - [`SetupError::Io`] if accepting fails.
    pub fn accept_producer(&self, name: &str, geometry: Geometry) -> Result<Producer, SetupError> {
        self.accept_until(name, geometry, None)
    }

    /// [`accept_producer`](Listener::accept_producer), waiting at most `timeout` for the
    /// receiver.
    ///
    /// # Errors
    /// As [`accept_producer`](Listener::accept_producer), and [`SetupError::Io`] with
    /// [`std::io::ErrorKind::TimedOut`] if no receiver asked for `name` in time.
    pub fn accept_producer_timeout(
        &self,
        name: &str,
        geometry: Geometry,
        timeout: std::time::Duration,
    ) -> Result<Producer, SetupError> {
        self.accept_until(name, geometry, Some(Instant::now() + timeout))
    }

    fn accept_until(
        &self,
        name: &str,
        geometry: Geometry,
        until: Option<Instant>,
    ) -> Result<Producer, SetupError> {
        check_name(name)?;
        // The region first: a geometry it cannot have fails here, before any peer is met.
        let (mut p, c) = private_pair(geometry)?;
        // Connections accepted whose request has not come whole yet: each is read as its
        // bytes arrive, so that a silent or slow one does not hold up the others (a receiver
        // behind it would take this side as dead).
        let mut pending: Vec<Pending> = Vec::new();
        loop {
            let now = Instant::now();
            // A peer silent for `dead_after` is dropped.
            pending.retain(|h| h.until > now);
            let mut wait = self.config.dead_after;
            if let Some(h) = pending.iter().map(|h| h.until).min() {
                wait = wait.min(h.saturating_duration_since(now));
            }
            if let Some(u) = until {
                let left = u.saturating_duration_since(now);
                if left.is_zero() {
                    return Err(SetupError::Io {
                        context: format!("waiting for a receiver of {name:?}"),
                        source: std::io::ErrorKind::TimedOut.into(),
                    });
                }
                wait = wait.min(left);
            }
            // At most `MAX_PENDING` at once: beyond that, new connections wait in the
            // system's backlog until one is done with (memory stays bounded under a flood).
            let listening = pending.len() < MAX_PENDING;
            let ready = {
                let mut fds = Vec::with_capacity(pending.len() + 1);
                if listening {
                    fds.push(self.listener.as_fd());
                }
                fds.extend(pending.iter().map(|h| h.sock.as_fd()));
                crate::sys::sock::wait_any_readable(&fds, wait).map_err(|e| SetupError::Io {
                    context: "waiting for a receiver".into(),
                    source: e,
                })?
            };
            let (accept, ready) = if listening {
                (ready[0], &ready[1..])
            } else {
                (false, &ready[..])
            };
            // The pending ones first, newest last (removal by swap keeps the others' places
            // in `ready` valid when walking backwards).
            for k in (0..pending.len()).rev() {
                if !ready[k] {
                    continue;
                }
                let h = &mut pending[k];
                let request = match h.reader.next(&h.sock, Some(Instant::now())) {
                    Ok(Got::Nothing) => continue,
                    Ok(Got::Msg(Peeked::Other(Msg::Request {
                        channel,
                        credit,
                        segment_size,
                        name: asked,
                    }))) => Some((channel, credit, segment_size, asked)),
                    // A receiver that breaks the protocol is told why (as a bridge tells it),
                    // then dropped; one that left, just dropped.
                    Ok(Got::Msg(Peeked::Other(other))) => {
                        tell_broken(&h.sock, &other.wrong_direction("receiver").into());
                        None
                    }
                    Err(e @ LinkError::Protocol(_)) => {
                        tell_broken(&h.sock, &e);
                        None
                    }
                    Ok(_) | Err(_) => None,
                };
                let h = pending.swap_remove(k);
                let Some((channel, credit, segment_size, asked)) = request else {
                    continue;
                };
                if asked != name {
                    let _ = h.sock.send(&Msg::Error {
                        channel,
                        code: wire::code::UNKNOWN_CHANNEL,
                        message: format!("no channel {asked:?} is offered here"),
                    });
                    continue;
                }
                if segment_size != geometry.segment_size {
                    let ours = geometry.segment_size;
                    let _ = h.sock.send(&Msg::Error {
                        channel,
                        code: wire::code::GEOMETRY,
                        message: format!(
                            "channel {name:?} has segments of {ours} bytes, the receiver \
                             {segment_size}: both ends need the same segment size"
                        ),
                    });
                    return Err(SetupError::Handshake(LinkError::SegmentSize {
                        ours,
                        theirs: segment_size,
                    }));
                }
                if credit > MAX_CREDIT {
                    let e = LinkError::from(ProtocolError::Credit {
                        channel,
                        detail: format!("{credit} segments of credit, more than {MAX_CREDIT}"),
                    });
                    tell_broken(&h.sock, &e);
                    continue;
                }
                let io = |e: std::io::Error| SetupError::Io {
                    context: format!("the connection from {}", h.peer),
                    source: e,
                };
                let out =
                    out::Direct::new(c, channel, credit, h.sock, h.reader, self.config.heartbeat)
                        .map_err(io)?;
                p.set_link(Box::new(out));
                return Ok(p);
            }
            if accept {
                let (stream, peer) = self.listener.accept().map_err(|e| SetupError::Io {
                    context: "accepting a receiver".into(),
                    source: e,
                })?;
                // With TLS the handshake goes on as the request is read (a peer that does not
                // complete it within `dead_after`, or whose certificate the session refuses,
                // is dropped like one that does not speak the protocol).
                let tls = session(&self.config, true)?;
                let sock =
                    Sock::new(stream, self.config.dead_after, tls).map_err(|e| SetupError::Io {
                        context: format!("the connection from {peer}"),
                        source: e,
                    })?;
                pending.push(Pending {
                    sock,
                    reader: Reader::new(0, self.config.dead_after),
                    until: Instant::now() + self.config.dead_after,
                    peer,
                });
            }
        }
    }
}

/// Connections a [`Listener`] reads requests from at once.
const MAX_PENDING: usize = 64;

/// A connection accepted by a [`Listener`] whose request has not come whole yet.
struct Pending {
    sock: std::sync::Arc<Sock>,
    reader: Reader,
    /// When it is dropped if its request has not come.
    until: Instant,
    peer: SocketAddr,
}

/// Tells a peer that broke the protocol why, before the connection is dropped.
fn tell_broken(sock: &Sock, e: &LinkError) {
    let _ = sock.send(&Msg::Error {
        channel: wire::CONNECTION,
        code: wire::code::PROTOCOL,
        message: e.to_string(),
    });
}

/// Connects to a [`Listener`] (or a [`Server`](crate::net::Server)) at `addr`, requests the
/// channel `name`, and returns the consumer its records arrive to, in segments of `geometry`
/// (the sender's segments must be the same size). Every free segment is the sender's credit.
///
/// The request is not answered: a sender that offers no such channel, or another segment
/// size, ends the stream as failed, which the first `recv` reports.
///
/// With TLS, the handshake is done before this returns. Under TLS 1.3 the sender checks this
/// side's certificate after this side is done: a refusal then comes as the first `recv`'s
/// error (a lost peer whose cause says what the sender's TLS refused).
///
/// # Errors
/// [`SetupError::Name`], [`SetupError::PlaintextRefused`], [`SetupError::Tls`] if the TLS
/// material cannot make a session, [`SetupError::Handshake`] with [`LinkError::Tls`] if the
/// handshake fails (the sender's certificate not signed by the trusted authority or not for
/// the config's server name, a sender without TLS, or one silent for `dead_after`),
/// [`SetupError::Io`] if the connection cannot be made within the config's `dead_after`.
pub fn connect_consumer(
    addr: SocketAddr,
    name: &str,
    geometry: Geometry,
    config: Config,
) -> Result<Consumer, SetupError> {
    check_name(name)?;
    config.check_addr(addr)?;
    let tls = session(&config, false)?;
    // The region first: a geometry it cannot have fails here, before the peer is met.
    let (p, mut c) = private_pair(geometry)?;
    let sock = open(addr, &config, tls)?;
    let inbound = request(p, name, sock, &config, true).map_err(|b| b.1)?;
    c.set_link(Box::new(inbound));
    Ok(c)
}

/// Connects to a [`Listener`] (or a [`Server`](crate::net::Server)) at `addr`, requests the
/// channel `name`, and makes its records arrive to channel `channel` of `gate`, as a producer
/// of that channel would write them: the sender's segments must be the gate's size. Every
/// free segment of the channel is the sender's credit, its exclusive ones and the floating
/// ones the gate lends it when the sender's backlog asks (Flink's credit-based flow control).
///
/// The gate's own thread reads the socket into the channel's free segments, as a direct
/// consumer does, when its scan comes to the channel and the socket got bytes (a small
/// watcher thread per gate wakes a waiting gate when one does); nothing else carries the
/// records. The channel ends as a local one does: `EndOfPartition` once the sender closed and
/// everything arrived, `ChannelDead` if the sender died or the link failed, after what
/// arrived before. Dropping the gate cancels the channel at the sender.
///
/// A gate made with [`Gate::create_anonymous`](crate::Gate::create_anonymous): keep channel
/// `c`'s [`PeerHandle`](crate::PeerHandle) until this returns. A channel with no producer
/// whose handle is gone is reported `ChannelDead` (never attached) when the gate next looks,
/// and an ended channel cannot be linked.
///
/// # Examples
///
/// ```no_run
/// use shmflow::net::{connect_gate_channel, Config};
/// use shmflow::{Gate, GateGeometry, GateMessage};
///
/// let mut gate = Gate::create("/agg", GateGeometry::new(2))?;
/// // Channel 0 comes from a remote sender; channel 1 from a local producer.
/// connect_gate_channel("10.0.0.1:7401".parse()?, "orders", &mut gate, 0, Config::default())?;
/// while let Some(m) = gate.recv()? {
///     if let GateMessage::Record { channel, record } = m {
///         println!("{channel}: {:?}", record.as_bytes());
///     }
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As [`connect_consumer`], and [`SetupError::GateChannel`] if the gate has no such channel,
/// the channel ended, or it has a remote producer already; [`SetupError::Handshake`] with a
/// local error if another producer is attached to the channel.
pub fn connect_gate_channel(
    addr: SocketAddr,
    name: &str,
    gate: &mut Gate,
    channel: usize,
    config: Config,
) -> Result<(), SetupError> {
    check_name(name)?;
    config.check_addr(addr)?;
    let tls = session(&config, false)?;
    let gate_channel = |detail: String| SetupError::GateChannel { channel, detail };
    let shared = gate.link_slot(channel).map_err(gate_channel)?;
    let watch = |e: std::io::Error| SetupError::Io {
        context: "watching the connection for the gate".into(),
        source: e,
    };
    // Everything that may fail before the channel's producer is attached: a channel whose
    // producer left would read as complete.
    let sock = open(addr, &config, tls)?;
    gate.watch_link(channel, sock.as_fd()).map_err(watch)?;
    let p = Producer::attach_gate_channel(shared).map_err(|e| gate_channel(e.to_string()))?;
    // From here on a failure loses the channel: the gate reports it dead, with the cause.
    let inbound = request(p, name, sock, &config, false).map_err(|b| {
        let (p, e) = *b;
        p.raw_lose();
        e
    })?;
    gate.set_link(channel, Box::new(inbound));
    Ok(())
}

/// Connects and completes the TLS handshake if there is one.
fn open(
    addr: SocketAddr,
    config: &Config,
    tls: Option<rustls::Connection>,
) -> Result<std::sync::Arc<Sock>, SetupError> {
    let io = |e: std::io::Error| SetupError::Io {
        context: format!("connecting to {addr}"),
        source: e,
    };
    let stream = TcpStream::connect_timeout(&addr, config.dead_after).map_err(io)?;
    let sock = Sock::new(stream, config.dead_after, tls).map_err(io)?;
    sock.handshake()
        .map_err(|e| SetupError::Handshake(LinkError::Tls(std::sync::Arc::new(e))))?;
    Ok(sock)
}

/// Requests `name` with the credit of `p`'s free segments, and returns the receiving end that
/// writes into `p` (`in_place`: see `inbound::In::start`), or `p` back with the error (boxed:
/// it is large, and rare).
fn request(
    mut p: Producer,
    name: &str,
    sock: std::sync::Arc<Sock>,
    config: &Config,
    in_place: bool,
) -> Result<inbound::In, Box<(Producer, SetupError)>> {
    let credit = match p.raw_free() {
        Ok(c) => c,
        Err(e) => return Err(Box::new((p, SetupError::Handshake(LinkError::local(e))))),
    };
    let segment_size = p.geometry().segment_size;
    let sent = sock.send(&Msg::Request {
        channel: 0,
        credit: credit.min(u32::MAX as u64) as u32,
        segment_size,
        name: name.to_owned(),
    });
    if let Err(e) = sent {
        return Err(Box::new((p, SetupError::Handshake(e))));
    }
    let reader = Reader::new(segment_size as usize, config.dead_after);
    inbound::In::start(p, 0, credit, sock, reader, config.heartbeat, in_place).map_err(|b| {
        let (p, e) = *b;
        let e = SetupError::Io {
            context: "starting the connection's keeper thread".into(),
            source: e,
        };
        Box::new((p, e))
    })
}
