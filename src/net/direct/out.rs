//! The sending direct end: the producer's thread forwards what it publishes, straight from
//! its segments, and reads credit from the socket when it has to wait.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::endpoint::consumer::raw::{RawEnd, RawPoll};
use crate::endpoint::consumer::Consumer;
use crate::endpoint::remote::{Outbound, Settled};
use crate::net::direct::keeper::{Chore, Keeper, AWAY};
use crate::net::direct::reader::{Got, Reader, Readiness};
use crate::net::direct::sock::Sock;
use crate::net::error::{LinkError, ProtocolError};
use crate::net::link::Lose;
use crate::net::wire::{self, Closed, Msg, Peeked};

/// Credit a receiver may hold, beyond which it is taken as hostile (as the server's).
const MAX_CREDIT: u64 = 1 << 24;

/// How the channel stands.
#[derive(Debug)]
enum State {
    /// Forwarding.
    Open,
    /// The end is on the wire.
    Ended,
    /// The receiver's consumer left (`Cancel`).
    Left,
    /// The link failed.
    Failed,
}

/// The sending end's state, shared by the producer's thread and its keeper (which forwards
/// segments that wait for credit while the producer's thread is away).
struct Out {
    /// The private channel's consumer: what the producer published, read segment by segment
    /// (`None` once the channel ended here: its producer then sees it closed or lost).
    c: Option<Consumer>,
    id: u32,
    sock: Arc<Sock>,
    reader: Reader,
    /// Segments of credit not spent.
    credit: u64,
    /// Segments started (each spent a credit).
    started: u64,
    state: State,
    /// Published segments wait for credit: the keeper forwards them when it comes. Stored
    /// only with the state's lock held (the keeper's chore included), so that it always says
    /// what the last forward left.
    pending: Arc<CachePadded<AtomicBool>>,
    /// The last forward stopped for want of credit.
    waiting: bool,
    /// The backlog (published segments not taken) when the producer's thread last looked
    /// for credit on the socket for want of it, and when: it looks again once more is
    /// published or [`AWAY`] passed, so that a producer that keeps publishing hears credit
    /// itself (the keeper takes over only once its calls stop), at most once per segment it
    /// publishes or per `AWAY`.
    heard_at: Option<(u64, Instant)>,
    /// Bytes of frames sent.
    wire: u64,
    /// The backlog sent with the last buffer.
    backlog: u64,
    /// What ended the link (set once, when it fails).
    cause: Option<String>,
}

/// A direct sending end, as its producer holds it.
pub(crate) struct Direct {
    out: Arc<Mutex<Out>>,
    keeper: Keeper,
    sock: Arc<Sock>,
    ready: Readiness,
}

impl Direct {
    pub(crate) fn new(
        c: Consumer,
        id: u32,
        credit: u32,
        sock: Arc<Sock>,
        reader: Reader,
        heartbeat: Duration,
    ) -> std::io::Result<Direct> {
        let pending = Arc::new(CachePadded::new(AtomicBool::new(false)));
        let out = Arc::new(Mutex::new(Out {
            c: Some(c),
            id,
            sock: sock.clone(),
            reader,
            credit: credit as u64,
            started: 0,
            state: State::Open,
            pending: pending.clone(),
            waiting: false,
            heard_at: None,
            wire: 0,
            backlog: 0,
            cause: None,
        }));
        let o = out.clone();
        let chore: Chore = Box::new(move || {
            // The producer's thread is away (or waiting for this lock): read what the peer
            // sent and forward what its credit allows.
            let mut o = o.lock().unwrap_or_else(|p| p.into_inner());
            o.run(|o| o.receive(Some(Instant::now())));
            // Forwarding, or the end on the wire and the receiver still reading: the
            // heartbeats go on (the producer's calls stop the keeper when it is done).
            matches!(o.state, State::Open | State::Ended)
        });
        let keeper = Keeper::start(sock.clone(), heartbeat, pending, Some(chore))?;
        Ok(Direct {
            out,
            keeper,
            sock,
            ready: Readiness::default(),
        })
    }

    /// Runs `f` on the state; wakes the keeper if segments now wait for credit, stops it once
    /// the channel ended.
    fn with(&mut self, f: impl FnOnce(&mut Out) -> Result<(), LinkError>) -> bool {
        self.keeper.touch();
        let (wake, open) = {
            let mut o = self.out.lock().unwrap_or_else(|p| p.into_inner());
            let wake = o.run(f);
            (wake, matches!(o.state, State::Open))
        };
        if wake {
            self.keeper.wake();
        }
        if !open {
            self.keeper.stop();
        }
        open
    }
}

impl Out {
    /// Runs `f`, fails the link if it failed, and sets the pending flag as it leaves the
    /// segments: true if the keeper must be woken (segments newly wait for credit).
    fn run(&mut self, f: impl FnOnce(&mut Out) -> Result<(), LinkError>) -> bool {
        if matches!(self.state, State::Open) {
            if let Err(e) = f(self) {
                if let Some(e) = self.last_words(e) {
                    self.fail(e);
                }
            }
        }
        let waiting = matches!(self.state, State::Open) && self.backlog();
        // Relaxed: read by the keeper as a hint; this lock orders everything else.
        !self.pending.swap(waiting, Ordering::Relaxed) && waiting
    }

    /// The connection broke under a write or read: a receiver whose consumer left (or
    /// failed) said so before it closed, and what it said is still to be read — that is the
    /// channel's end (`None`: it ended as the receiver said), not the broken connection.
    fn last_words(&mut self, e: LinkError) -> Option<LinkError> {
        if !matches!(
            e,
            LinkError::Io(_) | LinkError::PeerClosed | LinkError::PeerNotReading { .. }
        ) {
            return Some(e);
        }
        loop {
            match self.reader.next(&self.sock, Some(Instant::now())) {
                Ok(Got::Msg(Peeked::Other(m @ (Msg::Cancel { .. } | Msg::Error { .. })))) => {
                    return self.take(m).err();
                }
                Ok(Got::Msg(Peeked::Other(_))) => {}
                _ => return Some(e),
            }
        }
    }

    /// Published data not sent for want of credit (as the last forward left it).
    fn backlog(&mut self) -> bool {
        self.waiting && self.c.is_some()
    }

    /// The link failed: the producer sees its consumer lost; a peer that broke the protocol
    /// is told why.
    fn fail(&mut self, e: LinkError) {
        self.cause.get_or_insert_with(|| e.to_string());
        if let Some(c) = self.c.take() {
            c.lose();
        }
        if matches!(e, LinkError::Protocol(_) | LinkError::Local(_)) {
            let code = match e {
                LinkError::Protocol(_) => wire::code::PROTOCOL,
                _ => wire::code::LOCAL,
            };
            let _ = self.sock.send(&Msg::Error {
                channel: wire::CONNECTION,
                code,
                message: e.to_string(),
            });
        }
        self.sock.shutdown();
        self.state = State::Failed;
    }

    /// Forwards what is published, as far as credit allows.
    fn forward(&mut self) -> Result<(), LinkError> {
        loop {
            let Some(c) = self.c.as_mut() else {
                return Ok(());
            };
            if let Some((entry, payload)) = c.raw_priority().map_err(LinkError::local)? {
                // Priority events need no credit, so a sender of nothing else would never
                // read what the receiver says: hear it first (it may have ended the channel,
                // and said why).
                self.hear()?;
                if self.c.is_none() {
                    return Ok(());
                }
                // A priority event overtakes the segments waiting for credit.
                self.sock
                    .send(&crate::net::server::lane_message(self.id, entry, payload))?;
                continue;
            }
            match c.raw_poll(self.credit > 0).map_err(LinkError::local)? {
                RawPoll::Chunk(ch) if ch.at == 0 && self.credit == 0 => {
                    let backlog = c.raw_backlog().map_err(LinkError::local)?;
                    if self.look_for_credit(backlog)? {
                        continue;
                    }
                    self.waiting = true;
                    return Ok(());
                }
                // (The keeper may forward while the producer's thread pushes.)
                RawPoll::Priority => continue,
                RawPoll::Chunk(ch) => {
                    if ch.at == 0 {
                        self.credit -= 1;
                        self.started += 1;
                        self.heard_at = None;
                    }
                    self.backlog = c.raw_backlog().map_err(LinkError::local)?;
                    let backlog = u32::try_from(self.backlog).unwrap_or(u32::MAX);
                    let frames = c.raw_bytes(&ch);
                    self.wire += frames.len() as u64;
                    self.sock
                        .send_buffer(self.id, backlog, ch.at as u32, frames)?;
                    c.raw_done(ch).map_err(LinkError::local)?;
                }
                RawPoll::NeedCredit => {
                    let backlog = c.raw_backlog().map_err(LinkError::local)?;
                    if self.look_for_credit(backlog)? {
                        continue;
                    }
                    self.waiting = true;
                    return Ok(());
                }
                RawPoll::Empty => {
                    self.waiting = false;
                    return Ok(());
                }
                RawPoll::Ended(how) => {
                    let how = match how {
                        RawEnd::Clean => Closed::Clean,
                        RawEnd::Failed => Closed::Failed,
                        RawEnd::Dead => Closed::ProducerDead,
                    };
                    self.sock.send(&Msg::Close {
                        channel: self.id,
                        how,
                    })?;
                    // Nothing more to say: the peer's end of stream tells when it has all.
                    self.state = State::Ended;
                    self.waiting = false;
                    return Ok(());
                }
            }
        }
    }

    /// Out of credit with `backlog` segments published: reads what the receiver sent and is
    /// there now, once per backlog or per [`AWAY`] (see `heard_at`). True if that brought
    /// credit (or ended the channel): the forward goes on.
    fn look_for_credit(&mut self, backlog: u64) -> Result<bool, LinkError> {
        let now = Instant::now();
        if self
            .heard_at
            .is_some_and(|(b, t)| b == backlog && now.duration_since(t) < AWAY)
        {
            return Ok(false);
        }
        self.heard_at = Some((backlog, now));
        self.hear()?;
        Ok(self.credit > 0 || self.c.is_none())
    }

    /// One message from the receiver.
    fn take(&mut self, msg: Msg) -> Result<(), LinkError> {
        let id = self.id;
        match msg {
            Msg::Heartbeat => {}
            Msg::AddCredit { channel, credit } if channel == id => {
                self.credit += credit as u64;
                if self.credit > MAX_CREDIT {
                    return Err(ProtocolError::Credit {
                        channel,
                        detail: format!(
                            "{} segments of credit, more than {MAX_CREDIT}",
                            self.credit
                        ),
                    }
                    .into());
                }
            }
            Msg::Cancel { channel } if channel == id => {
                // The remote consumer left: the producer sees the channel closed.
                self.c = None;
                self.state = State::Left;
            }
            Msg::Error {
                channel,
                code,
                message,
            } if channel == id || channel == wire::CONNECTION => {
                return Err(LinkError::remote(code, message));
            }
            Msg::AddCredit { channel, .. }
            | Msg::Cancel { channel }
            | Msg::Error { channel, .. } => {
                return Err(ProtocolError::Channel {
                    channel,
                    detail: "a message for a channel that is not open".into(),
                }
                .into())
            }
            other => return Err(other.wrong_direction("receiver").into()),
        }
        Ok(())
    }

    /// Takes what the receiver sent and is there now, without forwarding.
    fn hear(&mut self) -> Result<(), LinkError> {
        while let Some(m) = control(self.reader.next(&self.sock, Some(Instant::now()))?)? {
            self.take(m)?;
        }
        Ok(())
    }

    /// Reads what the receiver sent (waiting until `until`), then forwards.
    fn receive(&mut self, until: Option<Instant>) -> Result<(), LinkError> {
        if let Some(c) = &self.c {
            // What `metrics().link` shows, at each wait (the sender's in-flight bytes are
            // the bridge's business: here they are the socket's).
            c.raw_figures(self.credit, self.backlog, 0, self.wire);
        }
        let mut wait = until;
        loop {
            let Some(m) = control(self.reader.next(&self.sock, wait)?)? else {
                break;
            };
            self.take(m)?;
            // Then what else is already there, without waiting.
            wait = Some(Instant::now());
        }
        self.forward()
    }
}

/// What a receiver sent: never a `Buffer`.
fn control(got: Got<'_>) -> Result<Option<Msg>, LinkError> {
    match got {
        Got::Nothing => Ok(None),
        Got::Msg(Peeked::Other(m)) => Ok(Some(m)),
        Got::Msg(Peeked::Buffer { channel, .. }) | Got::Large { channel, .. } => {
            Err(ProtocolError::Channel {
                channel,
                detail: "Buffer is not something a receiver sends".into(),
            }
            .into())
        }
    }
}

impl Outbound for Direct {
    fn pump(&mut self) {
        self.with(Out::forward);
    }

    #[inline]
    fn defer(&mut self, within: Duration) {
        self.keeper.defer(within);
    }

    fn waiting(&self) -> bool {
        let mut o = self.out.lock().unwrap_or_else(|p| p.into_inner());
        matches!(o.state, State::Open) && o.backlog()
    }

    fn cause(&self) -> Option<String> {
        self.out
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .cause
            .clone()
    }

    fn wait(&mut self, until: Option<Instant>) {
        self.with(|o| o.receive(until));
    }

    fn drain(&mut self, until: Option<Instant>) -> bool {
        loop {
            if !self.with(Out::forward) {
                break;
            }
            if until.is_some_and(|u| Instant::now() >= u) {
                return false;
            }
            self.with(|o| o.receive(until));
        }
        matches!(
            self.out.lock().unwrap_or_else(|p| p.into_inner()).state,
            State::Ended
        )
    }

    fn settle(&mut self, until: Instant) -> Settled {
        let mut o = self.out.lock().unwrap_or_else(|p| p.into_inner());
        o.settle(until)
    }

    fn poll_readable(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        self.ready.poll(&self.sock, cx)
    }
}

impl Out {
    fn settle(&mut self, until: Instant) -> Settled {
        loop {
            match &self.state {
                State::Ended => {}
                State::Open => return Settled::Pending(self.started.max(1)),
                State::Left => return Settled::Left(self.started),
                State::Failed => return Settled::Lost(self.started),
            }
            // The receiver ends its side once everything arrived (credit may come first).
            match self.reader.next(&self.sock, Some(until)).and_then(control) {
                Ok(None) => return Settled::Pending(self.started),
                Ok(Some(m)) => {
                    if let Err(e) = self.take(m) {
                        self.fail(e);
                    }
                }
                Err(LinkError::PeerClosed) => return Settled::Read,
                Err(e) => self.fail(e),
            }
        }
    }
}

impl Drop for Direct {
    fn drop(&mut self) {
        self.keeper.stop();
        let o = self.out.lock().unwrap_or_else(|p| p.into_inner());
        o.sock.shutdown_write();
    }
}
