//! The receiving side: connects to a server and requests channels by name; each arrives into
//! a local producer (a channel of its own, or a channel of a local gate), as the credit it
//! announces allows.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::endpoint::producer::Producer;
use crate::error::SendError;
use crate::net::error::{LinkError, ProtocolError, SetupError};
use crate::net::link::{self, BoxStream, ChannelEnd, Held, Writer};
use crate::net::wire::{self, Closed, Codec, Msg};
use crate::net::{check_name, ChannelOutcome, Config, Ended};

pub(crate) mod receiving;
use receiving::{Credit, Entry, In, Last, Receiving, Stop, Waiting};

/// Bytes the connection's reader asks the socket for at once.
const READ_BUFFER: usize = 256 << 10;

/// Messages waiting for a channel's task (each is bounded by the credit it was sent with).
const QUEUE: usize = 64;

/// Connects to a [`Server`](crate::net::Server) and feeds the remote channels it requests
/// into local producers. One TCP connection carries every channel of the client; a channel
/// whose local consumer is slow stops its sender alone (its credit runs out), not the
/// connection.
///
/// # Examples
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use shmflow::net::{Client, Config};
/// let (tx, mut rx) = shmflow::pair(shmflow::Geometry::default())?;
/// let mut client = Client::connect("127.0.0.1:7400".parse()?, Config::default()).await?;
/// client.import("events", tx)?;
/// let reader = tokio::task::spawn_blocking(move || {
///     while let Ok(Some(r)) = rx.recv() {
///         println!("{:?}", r.as_bytes());
///     }
/// });
/// for c in client.run().await {
///     println!("{}: {:?}", c.name, c.result);
/// }
/// reader.await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Client {
    stream: BoxStream,
    peer: SocketAddr,
    config: Config,
    imports: Vec<(String, Producer)>,
}

impl std::fmt::Debug for dyn link::Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stream")
    }
}

impl Client {
    /// Connects to `addr` (with TLS if the config has it). An address other than loopback
    /// needs [`Config::tls`] (or an explicit [`Config::insecure_plaintext`]). Heartbeats
    /// start with [`Client::run`]: call it within the config's `dead_after` (800 ms by
    /// default), or the server takes the connection as silent.
    ///
    /// # Errors
    /// [`SetupError::PlaintextRefused`]; [`SetupError::Io`] if the connection cannot be
    /// made within the config's `dead_after`; [`SetupError::Handshake`] if TLS fails.
    pub async fn connect(addr: SocketAddr, config: Config) -> Result<Client, SetupError> {
        config.check_addr(addr)?;
        let io = |e: std::io::Error| SetupError::Io {
            context: format!("connecting to {addr}"),
            source: e,
        };
        let tcp = match tokio::time::timeout(config.dead_after, TcpStream::connect(addr)).await {
            Err(_) => {
                return Err(io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no answer",
                )))
            }
            Ok(r) => r.map_err(io)?,
        };
        tcp.set_nodelay(true).map_err(io)?;
        let tcp = link::Tcp(tcp);
        let stream: BoxStream = match &config.tls {
            None => Box::new(tcp),
            Some(tls) => {
                let connector = tokio_rustls::TlsConnector::from(tls.client.clone());
                let hs = connector.connect(tls.server_name.clone(), tcp);
                match tokio::time::timeout(config.dead_after, hs).await {
                    Err(_) => {
                        return Err(SetupError::Handshake(LinkError::PeerSilent {
                            silent_for: config.dead_after,
                        }))
                    }
                    Ok(Err(e)) => {
                        return Err(SetupError::Handshake(LinkError::Tls(std::sync::Arc::new(
                            e,
                        ))))
                    }
                    Ok(Ok(s)) => Box::new(s),
                }
            }
        };
        Ok(Client {
            stream,
            peer: addr,
            config,
            imports: Vec::new(),
        })
    }

    /// The server's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Requests the server's channel `name`, to arrive into `producer` (the producer end of a
    /// local channel, or of a channel of a local gate: [`Producer::open_channel`]). Both ends'
    /// segments must be the same size.
    ///
    /// # Errors
    /// [`SetupError::Name`] for an empty name, one over 255 bytes, or one imported already.
    pub fn import(&mut self, name: &str, producer: Producer) -> Result<(), SetupError> {
        check_name(name)?;
        if self.imports.iter().any(|(n, _)| n == name) {
            return Err(SetupError::Name {
                name: name.into(),
                detail: "imported twice",
            });
        }
        self.imports.push((name.to_owned(), producer));
        Ok(())
    }

    /// Requests every imported channel and feeds them until each has ended; returns how each
    /// ended. If the connection fails, every channel still open ends with the reason, and its
    /// local consumer reads what arrived, then `PeerDead`.
    ///
    /// A channel whose end has arrived is written to its end even after the server has closed
    /// the connection: like a local producer blocked in `send_priority_event`, it waits while
    /// its consumer's priority lane is full (a consumer reading with `recv` alone never takes
    /// priority events), and `run` returns when it is done or its consumer is gone.
    pub async fn run(self) -> Vec<ChannelOutcome> {
        let Client {
            stream,
            config,
            imports,
            ..
        } = self;
        let max_seg = imports
            .iter()
            .map(|(_, p)| p.geometry().segment_size as usize)
            .max()
            .unwrap_or(0);
        let (r, w) = tokio::io::split(stream);
        // Read in large gulps: one system call brings many small buffers, or most of a
        // segment.
        let mut reader = FramedRead::with_capacity(r, Codec::new(max_seg), READ_BUFFER);
        let writer = Writer::new(w, config.dead_after);
        let stop = CancellationToken::new();
        // Dropping this future (`run` dropped) stops the heartbeats and the tasks.
        let _stop = stop.clone().drop_guard();
        let beat = stop.child_token();
        link::heartbeats(writer.clone(), config.heartbeat, beat.clone());
        let names: Vec<String> = imports.iter().map(|(n, _)| n.clone()).collect();
        let mut queues: Vec<Option<mpsc::Sender<In>>> = Vec::new();
        let mut cancelled = vec![false; names.len()];
        let mut tasks: JoinSet<(u32, ChannelEnd)> = JoinSet::new();
        let mut out = Vec::new();
        let mut failure = None;
        for (id, (name, mut p)) in imports.into_iter().enumerate() {
            let id = id as u32;
            let credit = match p.raw_free() {
                Ok(c) => c.min(u32::MAX as u64) as u32,
                Err(e) => {
                    out.push(ChannelOutcome {
                        name,
                        result: Err(LinkError::local(e)),
                    });
                    queues.push(None);
                    continue;
                }
            };
            let req = Msg::Request {
                channel: id,
                credit,
                segment_size: p.geometry().segment_size,
                name,
            };
            if let Err(e) = writer.send(&req).await {
                failure = Some(e);
            }
            let (tx, rx) = mpsc::channel(QUEUE);
            queues.push(Some(tx));
            let (w, stop) = (writer.clone(), stop.clone());
            tasks.spawn(
                async move { (id, receive_channel(p, id, credit as u64, rx, w, stop).await) },
            );
        }
        while failure.is_none() && !tasks.is_empty() {
            tokio::select! {
                Some(done) = tasks.join_next() => match done {
                    Ok((id, end)) => {
                        // (No channel is cut before the connection ends.)
                        let result = end.outcome(None);
                        // Ended here before its sender closed it (its consumer left or broke, or
                        // took no priority events): the sender was sent `Cancel` or `Error`, and
                        // what it sent before that is still on its way (dropped here).
                        if queues[id as usize].is_some() {
                            cancelled[id as usize] = true;
                        }
                        queues[id as usize] = None;
                        if let Err(e @ LinkError::Protocol(_)) = &result {
                            failure = Some(e.clone());
                        }
                        out.push(ChannelOutcome { name: names[id as usize].clone(), result });
                    }
                    Err(e) => failure = Some(LinkError::Task(e.to_string())),
                },
                m = link::next(&mut reader, config.dead_after) => {
                    let msg = match m {
                        Ok(Some(m)) => m,
                        // The sender shuts the connection down once every channel has ended:
                        // the tasks may still be writing what came before the end.
                        Ok(None) if queues.iter().all(Option::is_none) => break,
                        Ok(None) => { failure = Some(LinkError::PeerClosed); break; }
                        Err(e) => { failure = Some(e); break; }
                    };
                    let (channel, input) = match msg {
                        Msg::Heartbeat => continue,
                        Msg::Error { channel: wire::CONNECTION, code, message } => {
                            failure = Some(LinkError::remote(code, message));
                            break;
                        }
                        Msg::Buffer { channel, backlog, offset, frames } => {
                            (channel, In::Buffer { backlog, offset, frames })
                        }
                        Msg::Priority { channel, kind, payload } => {
                            (channel, In::Priority { entry: Entry::event(kind), payload })
                        }
                        Msg::Announce { channel, payload } => (
                            channel,
                            In::Priority {
                                entry: Entry { kind: 0, barrier: true },
                                payload,
                            },
                        ),
                        Msg::Close { channel, how } => (channel, In::Close(how)),
                        Msg::Error { channel, code, message } => (channel, In::Error { code, message }),
                        other => {
                            failure = Some(other.wrong_direction("sender").into());
                            break;
                        }
                    };
                    if cancelled.get(channel as usize) == Some(&true) {
                        // Late messages of a channel this side cancelled: dropped.
                        if matches!(input, In::Close(_) | In::Error { .. }) {
                            cancelled[channel as usize] = false;
                        }
                        continue;
                    }
                    let Some(Some(q)) = queues.get(channel as usize) else {
                        failure = Some(ProtocolError::Channel {
                            channel,
                            detail: "a message for a channel that is not open".into(),
                        }.into());
                        break;
                    };
                    let last = matches!(input, In::Close(_) | In::Error { .. });
                    // A task that ended already (its consumer left) drops what follows.
                    let _ = q.send(input).await;
                    if last {
                        queues[channel as usize] = None;
                    }
                }
            }
        }
        beat.cancel();
        if let Some(e) = &failure {
            stop.cancel();
            link::refuse(&writer, e).await;
        }
        drop(queues);
        while let Some(done) = tasks.join_next().await {
            if let Ok((id, end)) = done {
                out.push(ChannelOutcome {
                    name: names[id as usize].clone(),
                    result: end.outcome(failure.as_ref()),
                });
            }
        }
        if failure.is_none() {
            writer.lock().await.shutdown().await;
        }
        out
    }
}

/// Announces the free segments the sender has no credit for yet, when they are due
/// ([`Credit::due`]).
async fn announce(
    p: &mut Producer,
    c: &mut Credit,
    (id, segments, backlog): (u32, u64, u64),
    w: &Writer,
) -> Result<(), LinkError> {
    let free = p.raw_free().map_err(LinkError::local)?;
    let add = c.due(free, segments, backlog).min(u32::MAX as u64);
    if add > 0 {
        w.send(&Msg::AddCredit {
            channel: id,
            credit: add as u32,
        })
        .await?;
        c.announced += add;
    }
    Ok(())
}

impl Receiving<Held<Producer>> {
    /// Announces new credit and shows the figures.
    async fn announce(&mut self, w: &Writer) -> Result<(), LinkError> {
        let at = (self.id, self.segments, self.backlog);
        announce(&mut self.p, &mut self.credit, at, w).await?;
        self.p
            .raw_figures(self.credit.outstanding(), self.backlog, self.wire);
        Ok(())
    }

    /// Ends the channel for `why`.
    async fn stop(self, why: Stop, w: &Writer) -> Result<Ended, LinkError> {
        let p = self.p.take();
        match why {
            Stop::Sender(Last::Close(Closed::Clean)) => {
                p.close();
                Ok(Ended::Clean)
            }
            Stop::Sender(Last::Close(Closed::Failed)) => {
                p.fail();
                Ok(Ended::Failed)
            }
            Stop::Sender(Last::Close(Closed::ProducerDead)) => {
                p.raw_lose();
                Ok(Ended::ProducerDead)
            }
            Stop::Sender(Last::Error { code, message }) => {
                p.fail();
                Err(LinkError::remote(code, message))
            }
            Stop::Consumer(e) => consumer_gone(p, self.id, w, e).await,
            Stop::Broken(e) => {
                p.raw_lose();
                Err(e)
            }
            Stop::PriorityUnread => {
                p.fail();
                let _ = w
                    .send(&Msg::Error {
                        channel: self.id,
                        code: wire::code::LOCAL,
                        message: PRIORITY_UNREAD.into(),
                    })
                    .await;
                Err(LinkError::PriorityEventsUnread)
            }
        }
    }
}

/// Why a channel whose consumer takes no priority events is ended (see `PRIORITY_WAITING`).
use crate::net::error::PRIORITY_UNREAD;

/// One imported channel: writes what arrives into the producer's segments and gives credit
/// as they come back free. It never waits for its consumer with a message in hand: a priority
/// event that finds the lane full waits in `held`, with what follows it, while the task goes
/// on taking messages, so that the connection's reader is never held up by one channel.
async fn receive_channel(
    p: Producer,
    id: u32,
    initial: u64,
    mut rx: mpsc::Receiver<In>,
    w: Arc<Writer>,
    stop: CancellationToken,
) -> ChannelEnd {
    let p = Held::new(p);
    let g = p.geometry();
    let mut ch = Receiving::new(
        p,
        id,
        g.segment_size as usize,
        g.segment_count as u64,
        initial,
    );
    // The reader hands over no more (it handed over the channel's end, or the connection
    // ended).
    let mut rx_done = false;
    // `None`: the connection ended under the channel.
    let failure: Option<LinkError> = loop {
        if let Some(Waiting::Priority { entry, payload }) = ch.held.front() {
            // A priority event waits for room in the lane: take what comes meanwhile.
            let (entry, payload) = (*entry, payload.clone());
            let r = tokio::select! {
                _ = stop.cancelled() => break None,
                r = ch.p.priority_async(entry, &payload) => match r {
                    Ok(()) => ch.release(),
                    Err(e) => Err(Stop::Consumer(e)),
                },
                m = rx.recv(), if !rx_done => match m {
                    Some(m) => ch.take(m),
                    None => {
                        rx_done = true;
                        Ok(())
                    }
                },
            };
            if let Err(why) = r {
                return ChannelEnd::Done(ch.stop(why, &w).await);
            }
            // Everything held is written: announce, unless more is queued (as below).
            if ch.held.is_empty() && rx.is_empty() && !rx_done {
                if let Err(e) = ch.announce(&w).await {
                    break Some(e);
                }
            }
            continue;
        }
        let out = ch.credit.outstanding();
        // Wait for free segments only when the sender is short of credit: otherwise new free
        // segments are announced with the next buffer.
        let short = out == 0 || ch.backlog > out;
        let input = tokio::select! {
            // What is queued first: a channel whose end has arrived neither waits for free
            // segments nor announces credit.
            biased;
            m = rx.recv() => match m {
                Some(m) => m,
                None => break None,
            },
            _ = stop.cancelled() => break None,
            r = ch.p.raw_wait_free(out), if short => {
                match r {
                    Ok(()) => {
                        if let Err(e) = ch.announce(&w).await {
                            break Some(e);
                        }
                        continue;
                    }
                    Err(e) => return ChannelEnd::Done(ch.stop(Stop::Consumer(e), &w).await),
                }
            }
        };
        let buffer = matches!(input, In::Buffer { .. });
        if let Err(why) = ch.take(input) {
            return ChannelEnd::Done(ch.stop(why, &w).await);
        }
        // More buffers already queued: write them first, announce once.
        if buffer && rx.is_empty() && ch.held.is_empty() {
            if let Err(e) = ch.announce(&w).await {
                break Some(e);
            }
        }
    };
    ch.p.take().raw_lose();
    match failure {
        Some(e) => ChannelEnd::Done(Err(e)),
        None => ChannelEnd::Cut,
    }
}

/// The local consumer left (`Closed`: the sender is sent `Cancel`, and its producer sees the
/// channel closed) or died (`Error`: its producer sees it dead).
async fn consumer_gone(p: Producer, id: u32, w: &Writer, e: SendError) -> Result<Ended, LinkError> {
    match e {
        SendError::Closed(_) => {
            drop(p);
            let _ = w.send(&Msg::Cancel { channel: id }).await;
            Ok(Ended::ConsumerLeft)
        }
        other => {
            // What arrived must not read as the whole stream: the consumer sees it failed.
            p.fail();
            let _ = w
                .send(&Msg::Error {
                    channel: id,
                    code: wire::code::LOCAL,
                    message: other.to_string(),
                })
                .await;
            Err(LinkError::local(other))
        }
    }
}
