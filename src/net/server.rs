//! The sending side: listens, and serves the local channels it exports to the receivers that
//! request them — each channel's segments drained by one task, as credit allows.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::endpoint::consumer::raw::{RawEnd, RawPoll};
use crate::endpoint::consumer::Consumer;
use crate::error::RecvError;
use crate::net::error::{LinkError, ProtocolError, SetupError};
use crate::net::link::{self, BoxStream, ChannelEnd, Held, Writer};
use crate::net::wire::{self, Closed, Codec, Msg};
use crate::net::{check_name, ChannelOutcome, Config, Ended, ServeReport};

/// Credit a receiver may hold on one channel, beyond which it is taken as hostile.
const MAX_CREDIT: u64 = 1 << 24;

/// Exports local channels to remote receivers: listens on an address, and for each channel a
/// receiver requests by name, forwards the channel's segments as credit allows. The
/// channel's [`Consumer`] is the sending end's bridge: the local producer writes as usual and
/// blocks when the remote receiver gives no credit.
///
/// # Examples
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use shmflow::net::{Config, Server};
/// let (mut tx, rx) = shmflow::pair(shmflow::Geometry::default())?;
/// let mut server = Server::bind("127.0.0.1:7400".parse()?, Config::default()).await?;
/// server.export("events", rx)?;
/// tokio::task::spawn_blocking(move || tx.send(b"hello"));
/// let report = server.run().await; // until every exported channel ended
/// assert!(report.channels[0].result.is_ok());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    config: Config,
    exports: HashMap<String, Consumer>,
}

impl Server {
    /// Listens on `addr`. An address other than loopback needs [`Config::tls`] (or an
    /// explicit [`Config::insecure_plaintext`]).
    ///
    /// # Errors
    /// [`SetupError::PlaintextRefused`], or [`SetupError::Io`] if the address cannot be
    /// bound.
    pub async fn bind(addr: SocketAddr, config: Config) -> Result<Server, SetupError> {
        config.check_addr(addr)?;
        let listener = TcpListener::bind(addr).await.map_err(|e| SetupError::Io {
            context: format!("listening on {addr}"),
            source: e,
        })?;
        Ok(Server {
            listener,
            config,
            exports: HashMap::new(),
        })
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

    /// Offers `consumer`'s channel under `name`, to the first receiver that requests it.
    ///
    /// # Errors
    /// [`SetupError::Name`] for an empty name, one over 255 bytes, or one exported already.
    pub fn export(&mut self, name: &str, consumer: Consumer) -> Result<(), SetupError> {
        check_name(name)?;
        if self.exports.contains_key(name) {
            return Err(SetupError::Name {
                name: name.into(),
                detail: "exported twice",
            });
        }
        self.exports.insert(name.to_owned(), consumer);
        Ok(())
    }

    /// Serves until every exported channel has ended (its stream ended, its remote consumer
    /// left, or its connection failed). Connections that fail before requesting a channel
    /// (a peer that is not shmflow, a failed TLS handshake, a silent peer) are listed in
    /// [`ServeReport::refused`] and do not stop the server.
    pub async fn run(self) -> ServeReport {
        let Server {
            listener,
            config,
            exports,
        } = self;
        let total = exports.len();
        let exports = Arc::new(Mutex::new(exports));
        let mut conns = JoinSet::new();
        let mut report = ServeReport::default();
        while report.channels.len() < total {
            tokio::select! {
                acc = listener.accept(), if !exports.lock().expect("exports").is_empty() => {
                    match acc {
                        Ok((stream, peer)) => {
                            let (exports, config) = (exports.clone(), config.clone());
                            conns.spawn(serve(stream, peer, exports, config));
                        }
                        Err(e) => report.refused.push((None, LinkError::io(e))),
                    }
                }
                Some(done) = conns.join_next() => match done {
                    Ok(c) => {
                        report.channels.extend(c.channels);
                        if let Some(e) = c.refused {
                            report.refused.push((Some(c.peer), e));
                        }
                    }
                    Err(e) => report.refused.push((None, LinkError::Task(e.to_string()))),
                },
                // Every export was taken and every connection ended: nothing more can come
                // (each taken channel reports its outcome, so this is only a safeguard).
                else => break,
            }
        }
        report
    }
}

/// What one connection served.
struct ConnReport {
    peer: SocketAddr,
    channels: Vec<ChannelOutcome>,
    /// The connection failed before it served any channel.
    refused: Option<LinkError>,
}

/// A sending channel's credit, given by the connection's reader, spent by its task. Not
/// padded to lines of its own: with `CachePadded` a 64 B stream through the bridges ran at
/// 0.93–0.94× the unpadded rate (medians of 10 and 14 alternating pairs), the reader's and the
/// task's writes already being few per segment.
#[derive(Default)]
struct Ctl {
    /// Segments of credit not spent yet.
    unspent: AtomicU64,
    granted: AtomicU64,
    cancelled: AtomicBool,
    /// The receiving end failed (its consumer died, or was ended there): the receiver's
    /// code and message. The local producer must see `PeerDead`.
    lost: std::sync::OnceLock<(u32, String)>,
    notify: Notify,
}

impl Ctl {
    fn add(&self, channel: u32, credit: u32) -> Result<(), ProtocolError> {
        // Relaxed: the count is the message; `notify` wakes the task.
        let total = self.granted.fetch_add(credit as u64, Ordering::Relaxed) + credit as u64;
        let now = self.unspent.fetch_add(credit as u64, Ordering::AcqRel) + credit as u64;
        if now > MAX_CREDIT || total > u64::MAX / 2 {
            return Err(ProtocolError::Credit {
                channel,
                detail: format!("{now} segments of credit, more than {MAX_CREDIT}"),
            });
        }
        self.notify.notify_one();
        Ok(())
    }

    fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        self.notify.notify_one();
    }
}

async fn accept(stream: TcpStream, config: &Config) -> Result<BoxStream, LinkError> {
    stream.set_nodelay(true)?;
    let stream = link::Tcp(stream);
    match &config.tls {
        None => Ok(Box::new(stream)),
        Some(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.server.clone());
            match tokio::time::timeout(config.dead_after, acceptor.accept(stream)).await {
                Err(_) => Err(LinkError::PeerSilent {
                    silent_for: config.dead_after,
                }),
                Ok(Err(e)) => Err(LinkError::Tls(std::sync::Arc::new(e))),
                Ok(Ok(s)) => Ok(Box::new(s)),
            }
        }
    }
}

async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    exports: Arc<Mutex<HashMap<String, Consumer>>>,
    config: Config,
) -> ConnReport {
    let mut out = ConnReport {
        peer,
        channels: Vec::new(),
        refused: None,
    };
    let stream = match accept(stream, &config).await {
        Ok(s) => s,
        Err(e) => {
            out.refused = Some(e);
            return out;
        }
    };
    let (r, w) = tokio::io::split(stream);
    let mut reader = FramedRead::new(r, Codec::new(0));
    let writer = Writer::new(w, config.dead_after);
    let stop = CancellationToken::new();
    // Dropping this future (the server's `run` dropped) stops the heartbeats and the tasks.
    let _stop = stop.clone().drop_guard();
    link::heartbeats(writer.clone(), config.heartbeat, stop.clone());
    let mut ctls: HashMap<u32, Arc<Ctl>> = HashMap::new();
    let mut names: HashMap<u32, String> = HashMap::new();
    let mut tasks: JoinSet<(u32, ChannelEnd)> = JoinSet::new();
    // Fired when the loop below has read the last message it will read.
    let read_all = CancellationToken::new();
    let failure: Option<LinkError> = loop {
        tokio::select! {
            Some(done) = tasks.join_next() => {
                let (id, result) = match done {
                    // (No channel is cut before the connection ends.)
                    Ok((id, end)) => (id, end.outcome(None)),
                    Err(e) => break Some(LinkError::Task(e.to_string())),
                };
                // A channel that broke the protocol ends the connection.
                if let Err(e @ LinkError::Protocol(_)) = &result {
                    let e = e.clone();
                    out.channels.push(ChannelOutcome { name: names[&id].clone(), result });
                    break Some(e);
                }
                out.channels.push(ChannelOutcome { name: names[&id].clone(), result });
            }
            m = link::next(&mut reader, config.dead_after) => {
                let msg = match m {
                    Ok(Some(m)) => m,
                    Ok(None) if tasks.is_empty() => break None,
                    Ok(None) => break Some(LinkError::PeerClosed),
                    Err(e) => break Some(e),
                };
                match msg {
                    Msg::Heartbeat => {}
                    Msg::Request { channel, credit, segment_size, name } => {
                        if names.contains_key(&channel) {
                            break Some(ProtocolError::Channel {
                                channel,
                                detail: "requested twice".into(),
                            }.into());
                        }
                        let taken = exports.lock().expect("exports").remove(&name);
                        let Some(consumer) = taken else {
                            let e = Msg::Error {
                                channel,
                                code: wire::code::UNKNOWN_CHANNEL,
                                message: format!("no channel {name:?} is exported here (or it was requested already)"),
                            };
                            if let Err(e) = writer.send(&e).await {
                                break Some(e);
                            }
                            continue;
                        };
                        let ours = consumer.geometry().segment_size;
                        if ours != segment_size {
                            let e = Msg::Error {
                                channel,
                                code: wire::code::GEOMETRY,
                                message: format!("channel {name:?} has segments of {ours} bytes, the receiver {segment_size}: both ends need the same segment size"),
                            };
                            names.insert(channel, name.clone());
                            out.channels.push(ChannelOutcome {
                                name,
                                result: Err(LinkError::SegmentSize {
                                    ours,
                                    theirs: segment_size,
                                }),
                            });
                            consumer.raw_lose();
                            if let Err(e) = writer.send(&e).await {
                                break Some(e);
                            }
                            continue;
                        }
                        let ctl = Arc::new(Ctl::default());
                        if let Err(e) = ctl.add(channel, credit) {
                            // The channel was taken: it ends here, with the reason.
                            let e = LinkError::from(e);
                            names.insert(channel, name.clone());
                            out.channels.push(ChannelOutcome { name, result: Err(e.clone()) });
                            consumer.raw_lose();
                            break Some(e);
                        }
                        names.insert(channel, name);
                        ctls.insert(channel, ctl.clone());
                        let ends = Ends { stop: stop.clone(), read_all: read_all.clone() };
                        let (w, dead_after) = (writer.clone(), config.dead_after);
                        tasks.spawn(async move {
                            let end = send_channel(consumer, channel, ctl, w, ends, credit, dead_after);
                            (channel, end.await)
                        });
                    }
                    Msg::AddCredit { channel, credit } => match ctls.get(&channel) {
                        Some(c) => {
                            if let Err(e) = c.add(channel, credit) {
                                break Some(e.into());
                            }
                        }
                        None => break Some(ProtocolError::Channel {
                            channel,
                            detail: "credit for a channel never requested".into(),
                        }.into()),
                    },
                    Msg::Cancel { channel } if ctls.contains_key(&channel) => {
                        ctls[&channel].cancel();
                    }
                    Msg::Error { channel, code, message } if ctls.contains_key(&channel) => {
                        // The receiving end failed: end this channel as lost.
                        let _ = ctls[&channel].lost.set((code, message));
                        ctls[&channel].cancel();
                    }
                    Msg::Error { channel: wire::CONNECTION, code, message } => {
                        break Some(LinkError::remote(code, message));
                    }
                    other => break Some(other.wrong_direction("receiver").into()),
                }
            }
        }
    };
    read_all.cancel();
    if let Some(e) = &failure {
        stop.cancel();
        link::refuse(&writer, e).await;
        while let Some(done) = tasks.join_next().await {
            if let Ok((id, end)) = done {
                out.channels.push(ChannelOutcome {
                    name: names[&id].clone(),
                    result: end.outcome(Some(e)),
                });
            }
        }
        if names.is_empty() {
            out.refused = Some(e.clone());
        }
    } else {
        stop.cancel();
        writer.lock().await.shutdown().await;
    }
    // A channel the receiver ended can see a write fail (the receiver closed the connection)
    // before its reason was read; the reader has read everything since: the receiver's reason
    // is the failed channel's outcome.
    for (id, ctl) in &ctls {
        if let Some((code, message)) = ctl.lost.get() {
            let ended = out.channels.iter_mut().find(|o| o.name == names[id]);
            if let Some(o) = ended.filter(|o| o.result.is_err()) {
                o.result = Err(LinkError::remote(*code, message.clone()));
            }
        }
    }
    out
}

/// How a channel's task hears about its connection.
struct Ends {
    /// The connection ended: the task stops.
    stop: CancellationToken,
    /// The connection's reader has read all it will (see `send_channel`).
    read_all: CancellationToken,
}

/// One exported channel: forwards its segments while there is credit, then its end.
async fn send_channel(
    c: Consumer,
    id: u32,
    ctl: Arc<Ctl>,
    w: Arc<Writer>,
    ends: Ends,
    initial: u32,
    dead_after: std::time::Duration,
) -> ChannelEnd {
    let mut c = Held::new(c);
    // One wake of the local producer per few segments sent, not one each, and the ones held
    // before every wait for credit or frames and at the end of each batch of writes (a write
    // that waits for the socket within a batch holds at most a batch less one).
    let batch = crate::endpoint::owed::batch_for(c.geometry().segment_count);
    c.raw_batch_wakes(batch);
    let mut figures = Figures {
        initial: initial as u64,
        ..Figures::default()
    };
    let r = tokio::select! {
        r = forward(&mut c, id, &ctl, &w, &mut figures) => r,
        _ = ends.stop.cancelled() => Err(Fail::Cut),
    };
    if let Err(Fail::Link(LinkError::Io(_))) = &r {
        // A write failed: the receiver closed the connection. What it said before (that its
        // consumer left, or failed) is read by the connection's reader, which may not have
        // come to it yet; it ends soon (the connection is closed), and within `dead_after`
        // whatever happens.
        let _ = tokio::time::timeout(dead_after, ends.read_all.cancelled()).await;
    }
    let r = match r {
        Ok(ended) => ChannelEnd::Done(Ok(ended)),
        Err(Fail::Link(e)) => ChannelEnd::Done(Err(e)),
        Err(Fail::Cut) => ChannelEnd::Cut,
        // The local end broke (a corrupt region): the receiver is told, the channel ends.
        Err(Fail::Local(e)) => {
            let _ = w
                .send(&Msg::Error {
                    channel: id,
                    code: wire::code::LOCAL,
                    message: e.to_string(),
                })
                .await;
            ChannelEnd::Done(Err(LinkError::local(e)))
        }
    };
    if let Some((code, message)) = ctl.lost.get() {
        // The receiving end failed: the local producer sees its consumer dead.
        c.take().raw_lose();
        return ChannelEnd::Done(Err(LinkError::remote(*code, message.clone())));
    }
    if ctl.cancelled.load(Ordering::Acquire)
        && matches!(
            r,
            ChannelEnd::Cut
                | ChannelEnd::Done(Err(LinkError::Io(_)
                    | LinkError::PeerClosed
                    | LinkError::PeerSilent { .. }
                    | LinkError::PeerNotReading { .. }))
        )
    {
        // The receiver's consumer left, and then the connection ended (closed, broke, or
        // went silent): the channel ended because the consumer left.
        drop(c.take());
        return ChannelEnd::Done(Ok(Ended::ConsumerLeft));
    }
    match &r {
        // The stream ended, or the remote consumer left: the local producer sees the
        // channel closed.
        ChannelEnd::Done(Ok(_)) => drop(c.take()),
        // The remote side is lost: the local producer sees its consumer dead.
        _ => c.take().raw_lose(),
    }
    r
}

/// How long a channel out of credit waits for credit alone before it waits for priority
/// events too.
const CREDIT_ALONE: std::time::Duration = std::time::Duration::from_millis(1);

/// Out of credit: waits for credit, or for a priority event, which overtakes the segments
/// waiting for credit as it overtakes them on one machine.
///
/// Credit alone first, for up to [`CREDIT_ALONE`]: a stream whose receiver is the slower side
/// runs out of credit every few segments, and the credit is back within a round trip. A wait
/// on the consumer's park word would cost an announcement (a process-wide fence) each time,
/// and the local producer, publishing meanwhile, would ring the doorbell for every segment,
/// each ring a wake of this task for nothing. A priority event published during that first
/// wait goes out when credit comes, or after at most `CREDIT_ALONE`.
async fn wait_credit_or_priority(c: &mut Consumer, ctl: &Ctl) -> Result<(), RecvError> {
    c.raw_wake_owed();
    if tokio::time::timeout(CREDIT_ALONE, wait_credit(ctl))
        .await
        .is_ok()
    {
        return Ok(());
    }
    tokio::select! {
        _ = wait_credit(ctl) => Ok(()),
        r = c.raw_priority_wait() => r,
    }
}

async fn wait_credit(ctl: &Ctl) {
    // `notify_one` keeps a permit when nobody waits: no wake-up is lost between the caller's
    // look at the credit and this wait.
    ctl.notify.notified().await;
}

/// Why forwarding stopped: the link, the local end (told to the receiver first), or the end
/// of the connection.
enum Fail {
    Link(LinkError),
    Local(RecvError),
    Cut,
}

impl From<LinkError> for Fail {
    fn from(e: LinkError) -> Self {
        Fail::Link(e)
    }
}

impl From<RecvError> for Fail {
    fn from(e: RecvError) -> Self {
        Fail::Local(e)
    }
}

/// The message that forwards a lane entry: a priority event, or a barrier's announcement.
pub(crate) fn lane_message(
    channel: u32,
    entry: crate::protocol::lane::Entry,
    payload: bytes::Bytes,
) -> Msg {
    if entry.barrier {
        Msg::Announce { channel, payload }
    } else {
        Msg::Priority {
            channel,
            kind: entry.kind,
            payload,
        }
    }
}

/// What a sending channel publishes for `shmflow stat`.
#[derive(Default)]
struct Figures {
    /// The credit the request came with.
    initial: u64,
    /// Bytes of segments sent.
    sent: u64,
    /// `sent` when each segment not yet given credit back for started, oldest first (at most
    /// the receiver's segments: one per credit).
    unacked: std::collections::VecDeque<u64>,
    /// Segments given credit back for so far.
    acked: u64,
    backlog: u64,
}

impl Figures {
    fn publish(&mut self, c: &Consumer, ctl: &Ctl) {
        // Each credit after the first ones stands for a segment the receiver's consumer gave
        // back, oldest first.
        let acked = ctl
            .granted
            .load(Ordering::Relaxed)
            .saturating_sub(self.initial);
        while self.acked < acked {
            if self.unacked.pop_front().is_none() {
                // Credit for segments never sent (a gate's floating ones): nothing to pop.
                self.acked = acked;
                break;
            }
            self.acked += 1;
        }
        let in_flight = self.unacked.front().map_or(0, |&at| self.sent - at);
        let credit = ctl.unspent.load(Ordering::Relaxed);
        c.raw_figures(credit, self.backlog, in_flight, self.sent);
    }
}

async fn forward(
    c: &mut Consumer,
    id: u32,
    ctl: &Ctl,
    w: &Writer,
    fig: &mut Figures,
) -> Result<Ended, Fail> {
    loop {
        if ctl.cancelled.load(Ordering::Acquire) {
            return Ok(Ended::ConsumerLeft);
        }
        if let Some((entry, payload)) = c.raw_priority()? {
            w.send(&lane_message(id, entry, payload)).await?;
            continue;
        }
        let credit = ctl.unspent.load(Ordering::Acquire);
        let polled = c.raw_poll(credit > 0)?;
        match polled {
            RawPoll::Chunk(ch) if ch.at == 0 && credit == 0 => {
                wait_credit_or_priority(c, ctl).await?
            }
            RawPoll::Chunk(first) => {
                let mut g = w.lock().await;
                let mut ch = first;
                loop {
                    if ch.at == 0 {
                        ctl.unspent.fetch_sub(1, Ordering::AcqRel);
                        fig.unacked.push_back(fig.sent);
                    }
                    fig.backlog = c.raw_backlog()?;
                    let backlog = u32::try_from(fig.backlog).unwrap_or(u32::MAX);
                    let frames = c.raw_bytes(&ch);
                    fig.sent += frames.len() as u64;
                    g.put_buffer(id, backlog, ch.at as u32, frames).await?;
                    c.raw_done(ch)?;
                    let credit = ctl.unspent.load(Ordering::Acquire);
                    match c.raw_poll(credit > 0) {
                        Ok(RawPoll::Chunk(next)) if next.at != 0 || credit > 0 => ch = next,
                        _ => break,
                    }
                }
                // The producer learns of the segments just sent now, not a batch later (and
                // before the flush, which may wait for the socket).
                c.raw_wake_owed();
                g.flush().await?;
                drop(g);
                fig.publish(c, ctl);
            }
            // (Sent at the top of the loop; in the chunk loop above, `Priority` ends the
            // batch.)
            RawPoll::Priority => continue,
            RawPoll::NeedCredit => {
                fig.backlog = c.raw_backlog()?;
                fig.publish(c, ctl);
                wait_credit_or_priority(c, ctl).await?
            }
            RawPoll::Empty => {
                fig.publish(c, ctl);
                tokio::select! {
                    r = c.raw_readable() => match r {
                        Ok(()) => {}
                        Err(RecvError::PeerDead(_)) => {
                            w.send(&Msg::Close { channel: id, how: Closed::ProducerDead }).await?;
                            return Ok(Ended::ProducerDead);
                        }
                        Err(e) => return Err(e.into()),
                    },
                    // A cancel while the channel is idle.
                    _ = wait_credit(ctl) => {}
                }
            }
            RawPoll::Ended(how) => {
                // A priority event sent just before the end is visible now (the state's
                // Acquire): it goes before the Close.
                while let Some((entry, payload)) = c.raw_priority()? {
                    w.send(&lane_message(id, entry, payload)).await?;
                }
                let (how, ended) = match how {
                    RawEnd::Clean => (Closed::Clean, Ended::Clean),
                    RawEnd::Failed => (Closed::Failed, Ended::Failed),
                    RawEnd::Dead => (Closed::ProducerDead, Ended::ProducerDead),
                };
                w.send(&Msg::Close { channel: id, how }).await?;
                return Ok(ended);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_adds_up_and_a_flood_of_it_is_a_protocol_error() {
        let ctl = Ctl::default();
        ctl.add(3, 4).unwrap();
        ctl.add(3, 2).unwrap();
        assert_eq!(ctl.unspent.load(Ordering::Relaxed), 6);
        assert_eq!(ctl.granted.load(Ordering::Relaxed), 6);
        // Spending takes from the unspent credit only; what was granted stays counted.
        ctl.unspent.fetch_sub(5, Ordering::AcqRel);
        ctl.add(3, 1).unwrap();
        assert_eq!(ctl.unspent.load(Ordering::Relaxed), 2);
        assert_eq!(ctl.granted.load(Ordering::Relaxed), 7);
        // More unspent credit than any receiver has segments: the peer is broken.
        match ctl.add(3, MAX_CREDIT as u32) {
            Err(ProtocolError::Credit { channel: 3, detail }) => {
                assert!(detail.contains("more than"), "{detail}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_wake_for_credit_or_cancel_is_never_lost() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let ctl = Ctl::default();
            // Credit given before the task waits: the permit is kept, the wait ends at once.
            ctl.add(0, 1).unwrap();
            tokio::time::timeout(std::time::Duration::from_secs(5), wait_credit(&ctl))
                .await
                .expect("the credit's wake-up was kept");
            ctl.cancel();
            tokio::time::timeout(std::time::Duration::from_secs(5), wait_credit(&ctl))
                .await
                .expect("the cancel's wake-up was kept");
            assert!(ctl.cancelled.load(Ordering::Acquire));
        });
    }
}
