//! The receiving side: connects to a server and requests channels by name; each arrives into
//! a local producer (a channel of its own, or a channel of a local gate), as the credit it
//! announces allows.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::endpoint::producer::raw::Refused;
use crate::endpoint::producer::Producer;
use crate::error::Error;
use crate::net::error::{LinkError, ProtocolError, SetupError};
use crate::net::link::{self, BoxStream, Held, Writer, CANCELLED};
use crate::net::wire::{self, Closed, Codec, Msg};
use crate::net::{check_name, ChannelOutcome, Config, Ended};

/// Messages the connection's reader hands to one channel's task.
enum In {
    Buffer {
        backlog: u32,
        offset: u32,
        frames: Bytes,
    },
    Priority {
        kind: u32,
        payload: Bytes,
    },
    Close(Closed),
    Error {
        code: u32,
        message: String,
    },
}

/// Bytes the connection's reader asks the socket for at once.
const READ_BUFFER: usize = 256 << 10;

/// Priority events that may wait for one channel's task. Buffers waiting for a task are
/// bounded by the credit it announced, but priority events are outside credit: a channel
/// whose consumer takes none while its sender keeps sending them is ended when this many
/// wait, so that they cannot pile up without bound (the connection's reader never waits for
/// a channel's task, so that one channel cannot hold up the others).
const PRIORITY_WAITING: usize = 256;

/// What the connection's reader keeps of one channel's task.
struct Route {
    tx: mpsc::UnboundedSender<In>,
    /// Priority events queued to the task and not yet in its producer's lane: counted up by
    /// the reader, down by the task. Relaxed both ways: a bound, publishing nothing (the
    /// events themselves travel through the queue).
    priority: Arc<AtomicUsize>,
    /// Cancelled when too many priority events wait (see `PRIORITY_WAITING`).
    overflow: CancellationToken,
}

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
                    Ok(Err(e)) => return Err(SetupError::Handshake(LinkError::Tls(e.to_string()))),
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
        link::heartbeats(writer.clone(), config.heartbeat, stop.clone());
        let names: Vec<String> = imports.iter().map(|(n, _)| n.clone()).collect();
        let mut queues: Vec<Option<Route>> = Vec::new();
        let mut cancelled = vec![false; names.len()];
        let mut tasks: JoinSet<(u32, Result<Ended, LinkError>)> = JoinSet::new();
        let mut out = Vec::new();
        let mut failure = None;
        for (id, (name, mut p)) in imports.into_iter().enumerate() {
            let id = id as u32;
            let credit = match p.raw_free() {
                Ok(c) => c.min(u32::MAX as u64) as u32,
                Err(e) => {
                    out.push(ChannelOutcome {
                        name,
                        result: Err(LinkError::Local(e.to_string())),
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
            let (tx, rx) = mpsc::unbounded_channel();
            let priority = Arc::new(AtomicUsize::new(0));
            let overflow = CancellationToken::new();
            queues.push(Some(Route {
                tx,
                priority: priority.clone(),
                overflow: overflow.clone(),
            }));
            let task = Task {
                id,
                w: writer.clone(),
                stop: stop.clone(),
                priority,
                overflow,
            };
            tasks.spawn(async move { (id, receive_channel(p, credit as u64, rx, task).await) });
        }
        while failure.is_none() && !tasks.is_empty() {
            tokio::select! {
                Some(done) = tasks.join_next() => match done {
                    Ok((id, result)) => {
                        // Ended here before its sender closed it (its consumer left or broke):
                        // the sender was sent `Cancel`, and what it sent before that is still
                        // on its way.
                        if queues[id as usize].is_some() {
                            cancelled[id as usize] = true;
                        }
                        queues[id as usize] = None;
                        if let Err(e @ LinkError::Protocol(_)) = &result {
                            failure = Some(e.clone());
                        }
                        out.push(ChannelOutcome { name: names[id as usize].clone(), result });
                    }
                    Err(e) => failure = Some(LinkError::Local(e.to_string())),
                },
                m = link::next(&mut reader, config.dead_after) => {
                    let msg = match m {
                        Ok(Some(m)) => m,
                        Ok(None) => { failure = Some(LinkError::PeerClosed); break; }
                        Err(e) => { failure = Some(e); break; }
                    };
                    let (channel, input) = match msg {
                        Msg::Heartbeat => continue,
                        Msg::Error { channel: wire::CONNECTION, code, message } => {
                            failure = Some(LinkError::Remote { code, message });
                            break;
                        }
                        Msg::Buffer { channel, backlog, offset, frames } => {
                            (channel, In::Buffer { backlog, offset, frames })
                        }
                        Msg::Priority { channel, kind, payload } => (channel, In::Priority { kind, payload }),
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
                    if matches!(input, In::Priority { .. })
                        && q.priority.fetch_add(1, Ordering::Relaxed) >= PRIORITY_WAITING
                    {
                        // Its consumer takes no priority events: the task ends the channel
                        // (and cancels it at the sender); what follows is dropped.
                        q.overflow.cancel();
                        cancelled[channel as usize] = true;
                        queues[channel as usize] = None;
                        continue;
                    }
                    // A task that ended already (its consumer left) drops what follows.
                    let _ = q.tx.send(input);
                    if last {
                        queues[channel as usize] = None;
                    }
                }
            }
        }
        stop.cancel();
        match &failure {
            Some(e) => {
                link::refuse(&writer, e).await;
            }
            None => writer.lock().await.shutdown().await,
        }
        drop(queues);
        while let Some(done) = tasks.join_next().await {
            if let Ok((id, result)) = done {
                let result = match (result, &failure) {
                    (Err(LinkError::Local(m)), Some(e)) if m == CANCELLED => Err(e.clone()),
                    (r, _) => r,
                };
                out.push(ChannelOutcome {
                    name: names[id as usize].clone(),
                    result,
                });
            }
        }
        out
    }
}

/// The credit a receiving channel has announced and the sender has not spent yet, and the
/// state of the frames received.
struct Credit {
    announced: u64,
    started: u64,
}

impl Credit {
    fn outstanding(&self) -> u64 {
        self.announced - self.started
    }
}

/// Announces the free segments the sender has no credit for yet.
async fn announce(p: &mut Producer, c: &mut Credit, id: u32, w: &Writer) -> Result<(), LinkError> {
    let free = p.raw_free().map_err(|e| LinkError::Local(e.to_string()))?;
    let out = c.outstanding();
    if free > out {
        let add = (free - out).min(u32::MAX as u64);
        w.send(&Msg::AddCredit {
            channel: id,
            credit: add as u32,
        })
        .await?;
        c.announced += add;
    }
    Ok(())
}

/// What one channel's task shares with the connection.
struct Task {
    id: u32,
    w: Arc<Writer>,
    stop: CancellationToken,
    /// See [`Route::priority`].
    priority: Arc<AtomicUsize>,
    /// See [`Route::overflow`].
    overflow: CancellationToken,
}

/// One imported channel: writes what arrives into the producer's segments and gives credit
/// as they come back free.
async fn receive_channel(
    p: Producer,
    initial: u64,
    mut rx: mpsc::UnboundedReceiver<In>,
    task: Task,
) -> Result<Ended, LinkError> {
    let Task {
        id,
        w,
        stop,
        priority,
        overflow,
    } = task;
    let mut p = Held::new(p);
    let seg_size = p.geometry().segment_size as usize;
    let segments = p.geometry().segment_count as u64;
    let mut credit = Credit {
        announced: initial,
        started: 0,
    };
    let mut in_span = false;
    let mut backlog = 0u64;
    let mut wire = 0u64;
    let failure: LinkError = loop {
        let out = credit.outstanding();
        // Wait for free segments only when the sender is short of credit: otherwise new free
        // segments are announced with the next buffer.
        let short = out == 0 || backlog > out;
        let input = tokio::select! {
            _ = stop.cancelled() => break LinkError::Local(CANCELLED.into()),
            _ = overflow.cancelled() => return priority_unread(p.take(), id, &w).await,
            m = rx.recv() => match m {
                Some(m) => m,
                None => break LinkError::Local(CANCELLED.into()),
            },
            r = p.raw_wait_free(out), if short => {
                match r {
                    Ok(()) => {
                        if let Err(e) = announce(&mut p, &mut credit, id, &w).await {
                            break e;
                        }
                        p.raw_figures(credit.outstanding(), backlog, wire);
                        continue;
                    }
                    Err(e) => return consumer_gone(p.take(), id, &w, e).await,
                }
            }
        };
        match input {
            In::Buffer {
                backlog: b,
                offset,
                frames,
            } => {
                let offset = offset as usize;
                let ends = match wire::check_frames(offset, &frames, seg_size, &mut in_span) {
                    Ok(e) => e,
                    Err(e) => break e.into(),
                };
                if offset == 0 {
                    if credit.outstanding() == 0 {
                        break ProtocolError::Credit {
                            channel: id,
                            detail: "a segment sent without credit".into(),
                        }
                        .into();
                    }
                    credit.started += 1;
                }
                match p.raw_write(offset, &frames, ends) {
                    Ok(Ok(())) => {}
                    Ok(Err(Refused::NoCredit)) => {
                        break ProtocolError::Credit {
                            channel: id,
                            detail: "a segment sent without a free segment to take it".into(),
                        }
                        .into()
                    }
                    Ok(Err(Refused::Misplaced { expected, found })) => {
                        break ProtocolError::Channel {
                            channel: id,
                            detail: format!(
                                "a buffer at offset {found}, where the segment continues at {expected}"
                            ),
                        }
                        .into()
                    }
                    Ok(Err(Refused::Shape)) => {
                        break ProtocolError::Channel {
                            channel: id,
                            detail: "a buffer that does not fit the segment".into(),
                        }
                        .into()
                    }
                    Err(e) => return consumer_gone(p.take(), id, &w, e).await,
                }
                backlog = (b as u64).min(segments);
                wire += frames.len() as u64;
                // Flink's floating buffers: ask the gate for what the backlog needs beyond
                // the credit the sender has or is about to get.
                let free = p.raw_free().unwrap_or(0);
                let short = backlog.saturating_sub(free);
                let unmet = p.raw_unmet();
                if short > unmet {
                    p.raw_ask(short - unmet);
                }
                // More buffers already queued: write them first, announce once.
                if !rx.is_empty() {
                    continue;
                }
                if let Err(e) = announce(&mut p, &mut credit, id, &w).await {
                    break e;
                }
                p.raw_figures(credit.outstanding(), backlog, wire);
            }
            In::Priority { kind, payload } => {
                // Waits while the lane is full (the consumer has not taken the events before);
                // meanwhile what follows waits in the queue, behind the event, as it would
                // wait behind a local producer blocked in `send_priority_event`.
                tokio::select! {
                    r = p.send_priority_event_async(kind, &payload) => {
                        if let Err(e) = r {
                            return consumer_gone(p.take(), id, &w, e.into()).await;
                        }
                    }
                    _ = overflow.cancelled() => return priority_unread(p.take(), id, &w).await,
                    _ = stop.cancelled() => break LinkError::Local(CANCELLED.into()),
                }
                priority.fetch_sub(1, Ordering::Relaxed);
            }
            In::Close(how) => {
                return Ok(match how {
                    Closed::Clean => {
                        p.take().close();
                        Ended::Clean
                    }
                    Closed::Failed => {
                        p.take().fail();
                        Ended::Failed
                    }
                    Closed::ProducerDead => {
                        p.take().raw_lose();
                        Ended::ProducerDead
                    }
                });
            }
            In::Error { code, message } => {
                p.take().fail();
                return Err(LinkError::Remote { code, message });
            }
        }
    };
    p.take().raw_lose();
    Err(failure)
}

/// The local consumer takes no priority events while its sender keeps sending them (see
/// `PRIORITY_WAITING`): the channel fails here (its consumer is told after the events that
/// reached it) and at the sender, which is told why.
async fn priority_unread(p: Producer, id: u32, w: &Writer) -> Result<Ended, LinkError> {
    p.fail();
    let message = format!(
        "the consumer takes no priority events: {PRIORITY_WAITING} more were waiting for room \
         in its lane; the channel is ended so that they do not pile up"
    );
    let _ = w
        .send(&Msg::Error {
            channel: id,
            code: wire::code::LOCAL,
            message: message.clone(),
        })
        .await;
    Err(LinkError::Local(message))
}

/// The local consumer left (`Closed`: the sender is sent `Cancel`, and its producer sees the
/// channel closed) or died (`Error`: its producer sees it dead).
async fn consumer_gone(p: Producer, id: u32, w: &Writer, e: Error) -> Result<Ended, LinkError> {
    drop(p);
    match e {
        Error::Closed(_) => {
            let _ = w.send(&Msg::Cancel { channel: id }).await;
            Ok(Ended::ConsumerLeft)
        }
        other => {
            let _ = w
                .send(&Msg::Error {
                    channel: id,
                    code: wire::code::LOCAL,
                    message: other.to_string(),
                })
                .await;
            Err(LinkError::Local(other.to_string()))
        }
    }
}
