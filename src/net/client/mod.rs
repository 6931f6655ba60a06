//! The receiving side: connects to a server and requests channels by name; each arrives into
//! a local producer (a channel of its own, or a channel of a local gate), as the credit it
//! announces allows.

use std::net::SocketAddr;

use tokio::net::TcpStream;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::endpoint::producer::Producer;
use crate::error::SendError;
use crate::net::error::{LinkError, ProtocolError, SetupError};
use crate::net::link::{self, BoxStream, Held, Reader, Writer};
use crate::net::wire::{self, Closed, Codec, Msg};
use crate::net::{check_name, ChannelOutcome, Config, Ended};

pub(crate) mod receiving;
use receiving::{Credit, Entry, In, Last, Receiving, Stop, Waiting};

/// Bytes the connection's reader asks the socket for at once.
const READ_BUFFER: usize = 256 << 10;

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
        // Dropping this future (`run` dropped) stops the heartbeats; the channels still held
        // detach as lost (`Held`).
        let _stop = stop.clone().drop_guard();
        let beat = stop.child_token();
        link::heartbeats(writer.clone(), config.heartbeat, beat.clone());
        let names: Vec<String> = imports.iter().map(|(n, _)| n.clone()).collect();
        let mut slots: Vec<Slot> = Vec::with_capacity(names.len());
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
                    slots.push(Slot::Ended);
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
            // Every wake-up of its consumer is an RMW (the consumer parks without the heavy
            // barrier, a process-wide fence that costs an interrupt of every other CPU).
            p.raw_rmw_notifier();
            // The channel's waits (free segments, room in the lane) are polled by the
            // connection's one task, afresh after every message of any channel: they park at
            // once, so that no poll spins in the task.
            p.set_wait_strategy(crate::protocol::park::WaitStrategy::Park);
            // One wake of the consumer per few segments written, not one each (and the ones
            // held whenever the task may wait: see the loop).
            let batch = crate::endpoint::owed::batch_for(p.geometry().segment_count);
            p.raw_batch_wakes(batch);
            let g = p.geometry();
            let ch = Receiving::new(
                Held::new(p),
                id,
                g.segment_size as usize,
                g.segment_count as u64,
                credit as u64,
            );
            slots.push(Slot::Open {
                ch: Box::new(ch),
                last_sent: false,
                due: false,
            });
        }
        // The connection's one task: it reads each message and writes it into its channel's
        // segments at once (the read buffer is free again before the next read), announces
        // credit once the messages read so far are written, and waits, between messages, for
        // what a channel waits for: free segments while its sender is short of credit, room
        // in the lane for a priority event.
        let mut reading = true;
        while failure.is_none() && slots.iter().any(Slot::is_open) {
            if !reading || !matches!(buffered(&reader), Ok(Some(_))) {
                // The task may wait now (no whole message is buffered).
                wake_consumers(&mut slots);
            }
            let event = tokio::select! {
                biased;
                m = link::next(&mut reader, config.dead_after), if reading => Event::Read(m),
                a = attention(&mut slots) => a,
            };
            let (id, step) = match event {
                Event::Read(m) => {
                    let msg = match m {
                        Ok(Some(m)) => m,
                        // The sender's end of the stream (its `run` ended or was dropped) after
                        // every channel's end: what is held behind a priority event may still
                        // be waiting for room.
                        Ok(None) if slots.iter().all(Slot::sent_all) => {
                            reading = false;
                            continue;
                        }
                        Ok(None) => {
                            failure = Some(LinkError::PeerClosed);
                            break;
                        }
                        Err(e) => {
                            failure = Some(e);
                            break;
                        }
                    };
                    let (channel, input) = match msg {
                        // (Still a message read: the credit check below is due as after any.)
                        Msg::Heartbeat => (wire::CONNECTION, None),
                        Msg::Error {
                            channel: wire::CONNECTION,
                            code,
                            message,
                        } => {
                            failure = Some(LinkError::remote(code, message));
                            break;
                        }
                        Msg::Buffer {
                            channel,
                            backlog,
                            offset,
                            frames,
                        } => (
                            channel,
                            Some(In::Buffer {
                                backlog,
                                offset,
                                frames,
                            }),
                        ),
                        Msg::Priority {
                            channel,
                            kind,
                            payload,
                        } => (
                            channel,
                            Some(In::Priority {
                                entry: Entry::event(kind),
                                payload,
                            }),
                        ),
                        Msg::Announce { channel, payload } => (
                            channel,
                            Some(In::Priority {
                                entry: Entry {
                                    kind: 0,
                                    barrier: true,
                                },
                                payload,
                            }),
                        ),
                        Msg::Close { channel, how } => (channel, Some(In::Close(how))),
                        Msg::Error {
                            channel,
                            code,
                            message,
                        } => (channel, Some(In::Error { code, message })),
                        other => {
                            failure = Some(other.wrong_direction("sender").into());
                            break;
                        }
                    };
                    match (input, slots.get_mut(channel as usize)) {
                        (None, _) => (channel, Ok(())),
                        (Some(input), Some(Slot::Open { ch, last_sent, due })) if !*last_sent => {
                            *last_sent = matches!(input, In::Close(_) | In::Error { .. });
                            let buffer = matches!(input, In::Buffer { .. });
                            let step = ch.take(input);
                            *due |= buffer && step.is_ok();
                            (channel, step)
                        }
                        (Some(input), Some(s @ Slot::Cancelled)) => {
                            // Late messages of a channel this side ended: dropped (a sender
                            // that read the `Cancel` sends nothing more, not even `Close`).
                            if matches!(input, In::Close(_) | In::Error { .. }) {
                                *s = Slot::Ended;
                            }
                            (channel, Ok(()))
                        }
                        (Some(_), _) => {
                            failure = Some(
                                ProtocolError::Channel {
                                    channel,
                                    detail: "a message for a channel that is not open".into(),
                                }
                                .into(),
                            );
                            break;
                        }
                    }
                }
                Event::Room(id, r) => {
                    let Slot::Open { ch, due, .. } = &mut slots[id] else {
                        unreachable!("only open channels wait")
                    };
                    let step = r.map_err(Stop::Consumer).and_then(|()| ch.release());
                    // Everything held is written: credit may be due.
                    *due |= step.is_ok() && ch.held.is_empty();
                    (id as u32, step)
                }
                Event::Free(id, r) => {
                    let Slot::Open { due, .. } = &mut slots[id] else {
                        unreachable!("only open channels wait")
                    };
                    *due |= r.is_ok();
                    (id as u32, r.map_err(Stop::Consumer))
                }
            };
            if let Err(why) = step {
                let Slot::Open { ch, last_sent, .. } =
                    std::mem::replace(&mut slots[id as usize], Slot::Ended)
                else {
                    unreachable!("a step of an open channel")
                };
                // (A write follows, which may wait.)
                wake_consumers(&mut slots);
                let result = ch.stop(why, &writer).await;
                // Ended here before its sender ended it (its consumer left or broke, or took
                // no priority events): the sender was sent `Cancel` or `Error`, and what it
                // sent before that is still on its way (dropped here).
                if !last_sent {
                    slots[id as usize] = Slot::Cancelled;
                }
                if let Err(e @ LinkError::Protocol(_)) = &result {
                    failure = Some(e.clone());
                }
                out.push(ChannelOutcome {
                    name: names[id as usize].clone(),
                    result,
                });
                continue;
            }
            // Credit once every message read so far is written (the next one needs a read):
            // one announcement for a batch of buffers.
            if !reading || !matches!(buffered(&reader), Ok(Some(_))) {
                // (Before the credit's writes, which may wait.)
                wake_consumers(&mut slots);
                if let Err(e) = announce_due(&mut slots, &writer).await {
                    failure = Some(e);
                }
            }
        }
        beat.cancel();
        wake_consumers(&mut slots);
        if let Some(e) = &failure {
            stop.cancel();
            link::refuse(&writer, e).await;
        }
        for (id, slot) in slots.into_iter().enumerate() {
            if let Slot::Open { ch, .. } = slot {
                // Cut by the connection's end: its consumer reads what arrived, then
                // `PeerDead`.
                ch.p.take().raw_lose();
                out.push(ChannelOutcome {
                    name: names[id].clone(),
                    result: Err(failure.clone().unwrap_or(LinkError::PeerClosed)),
                });
            }
        }
        if failure.is_none() {
            writer.lock().await.shutdown().await;
        }
        out
    }
}

/// Every consumer learns of every segment written so far (the wake-ups held for a batch):
/// before the task may wait.
fn wake_consumers(slots: &mut [Slot]) {
    for slot in slots {
        if let Slot::Open { ch, .. } = slot {
            ch.p.raw_wake_owed();
        }
    }
}

/// The length of the next message if the read buffer holds all of it.
fn buffered(r: &Reader) -> Result<Option<usize>, ProtocolError> {
    r.decoder().peek_len(r.read_buffer())
}

/// One imported channel, as the connection's task holds it.
enum Slot {
    Open {
        ch: Box<Receiving<Held<Producer>>>,
        /// The sender's `Close` or `Error` arrived (it may wait in `ch.held`): nothing more
        /// may come for the channel.
        last_sent: bool,
        /// Buffers were written, or segments came free, since credit was last announced.
        due: bool,
    },
    /// Ended here before its sender ended it: what the sender sent before it read the
    /// `Cancel` or `Error` is dropped, up to its `Close` or `Error`.
    Cancelled,
    /// Ended, or never opened: a message for it breaks the protocol.
    Ended,
}

impl Slot {
    fn is_open(&self) -> bool {
        matches!(self, Slot::Open { .. })
    }

    /// Nothing more is to come for it from the sender (a cancelled channel's sender stops
    /// at the `Cancel` without a `Close`: what may still come of it is dropped anyway).
    fn sent_all(&self) -> bool {
        !matches!(
            self,
            Slot::Open {
                last_sent: false,
                ..
            }
        )
    }
}

/// What the connection's task turns to next.
enum Event {
    /// The next message (or why there is none).
    Read(Result<Option<Msg>, LinkError>),
    /// Channel `.0`'s waiting priority event went into its lane (or its consumer is gone).
    Room(usize, Result<(), SendError>),
    /// Channel `.0`'s consumer freed segments its sender has no credit for (or is gone).
    Free(usize, Result<(), SendError>),
}

/// A wait of one channel, between messages.
type Wait<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Event> + Send + 'a>>;

/// The first of the open channels' waits to end: a priority event waiting for room in its
/// lane, or, with nothing held, free segments enough for credit to be due while its sender
/// has none. Pending for ever if no channel waits (the reader goes on).
async fn attention(slots: &mut [Slot]) -> Event {
    let mut waits: Vec<Wait<'_>> = Vec::new();
    for (id, slot) in slots.iter_mut().enumerate() {
        let Slot::Open { ch, last_sent, .. } = slot else {
            continue;
        };
        if let Some(Waiting::Priority { entry, payload }) = ch.held.front() {
            let (entry, payload) = (*entry, payload.clone());
            let p = &mut *ch.p;
            waits.push(Box::pin(async move {
                Event::Room(id, p.priority_async(entry, &payload).await)
            }));
            continue;
        }
        // A sender with credit sends, and each message read is followed by the credit check:
        // only one without credit leaves the reader idle. (A wait begun for every message
        // would register with the reactor and announce itself on the park word each time.)
        if !*last_sent && ch.credit.outstanding() == 0 {
            // Until credit is due (looked at afresh at each segment the consumer gives back:
            // what is free and what it has to read need not add up to the same all along, in
            // a gate channel, or under a debloating cap that changes).
            let (credit, segments) = (ch.credit, ch.segments);
            let p = &mut *ch.p;
            waits.push(Box::pin(async move {
                let due = |free, unread| credit.due(free, unread, segments) > 0;
                Event::Free(id, p.raw_wait_free(due).await)
            }));
        }
    }
    if waits.is_empty() {
        return std::future::pending().await;
    }
    std::future::poll_fn(|cx| {
        for w in &mut waits {
            if let std::task::Poll::Ready(e) = w.as_mut().poll(cx) {
                return std::task::Poll::Ready(e);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Announces the credit due on every open channel with nothing held (a held buffer's
/// segment is counted free until it is written) that wrote buffers or saw segments come free
/// since its last announcement, or whose sender has no credit (so that a channel starved of
/// credit is heard even while other channels' messages keep the reader busy), and shows the
/// figures.
async fn announce_due(slots: &mut [Slot], w: &Writer) -> Result<(), LinkError> {
    for slot in slots {
        if let Slot::Open {
            ch,
            due,
            last_sent: false,
        } = slot
        {
            let out = ch.credit.outstanding();
            if ch.held.is_empty() && (*due || out == 0) {
                *due = false;
                ch.announce(w).await?;
            }
        }
    }
    Ok(())
}

/// Announces the free segments the sender has no credit for yet, when they are due
/// ([`Credit::due`]).
async fn announce(
    p: &mut Producer,
    c: &mut Credit,
    (id, segments): (u32, u64),
    w: &Writer,
) -> Result<(), LinkError> {
    let free = p.raw_free().map_err(LinkError::local)?;
    let add = c.due(free, p.raw_unread(), segments).min(u32::MAX as u64);
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
        let at = (self.id, self.segments);
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
