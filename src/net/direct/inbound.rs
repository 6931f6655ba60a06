//! The receiving direct end: the consumer's thread, when it has read everything, reads the
//! socket and writes what arrived into its free segments (checked as the bridge checks it),
//! and announces the segments it handed back as credit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::endpoint::producer::Producer;
use crate::endpoint::remote::Inbound;
use crate::error::Halt;
use crate::net::client::receiving::{Entry, In as Input, Last, Receiving, Segments, Stop, Waiting};
use crate::net::direct::keeper::{Chore, Keeper};
use crate::net::direct::reader::{Got, Reader, Readiness};
use crate::net::direct::sock::Sock;
use crate::net::error::{LinkError, ProtocolError, PRIORITY_UNREAD};
use crate::net::link::Held;
use crate::net::wire::{self, Closed, Msg, Peeked};

/// A receiving direct end: its state, filled by the consumer's thread when it waits and, while
/// that thread is away, by the keeper before each heartbeat (see [`In::fill`]).
pub(crate) struct In {
    inner: Arc<Mutex<Inner>>,
    /// The keeper filled the region since the consumer's thread last did: what it wrote may
    /// be all the sender sent, so the next fill must not wait for more before the consumer
    /// looks. Relaxed: set and taken under `inner`'s lock, which orders it.
    news: Arc<CachePadded<AtomicBool>>,
    /// The task of an async wait on the socket, for the keeper to wake once it wrote into
    /// the region: the socket's readiness may never come (the keeper read the bytes first,
    /// and the reactor's edge was dropped).
    waker: Arc<Mutex<Option<std::task::Waker>>>,
    keeper: Keeper,
    /// The keeper was stopped (the channel ended here).
    keeper_stopped: bool,
    sock: Arc<Sock>,
    ready: Readiness,
}

/// The receiving state, under the lock that the consumer's thread and the keeper share.
struct Inner {
    /// The private channel's producer and the receiving state (`None` once the channel
    /// ended here: the consumer reads what arrived, then the end).
    ch: Option<Receiving<Held<Producer>>>,
    sock: Arc<Sock>,
    reader: Reader,
    /// Bytes the sender had sent when last looked at, and since when (see
    /// [`Inner::silent`]).
    heard: (u64, Instant),
    /// What was written into the region without a new message: large buffers completed,
    /// held priority events let in (see [`Inner::fill`]).
    settled: u64,
    /// What ended the link (set once, when it broke).
    cause: Option<String>,
    /// A write failed: nothing more is written.
    write_broken: bool,
    /// Large buffers go straight into their segments (see [`In::start`]).
    in_place: bool,
    /// A large buffer placed in its segment whose frames have not all arrived yet.
    large: Option<Large>,
}

/// A large buffer being read into its place in a segment (see [`Inner::take_large`]).
struct Large {
    /// Its offset in the segment, length and first header word (from its head).
    at: usize,
    len: usize,
    first: u64,
    backlog: u32,
    /// Bytes after the first header word read so far.
    filled: usize,
    /// When the last of it came (its head: when the head was taken).
    heard: Instant,
}

impl In {
    /// Starts the receiving end of channel `id` (`credit` announced already), writing into
    /// `p`, and its keeper (heartbeats every `heartbeat` while the end writes nothing, and a
    /// fill before each while the consumer's thread is away). `in_place`: a large buffer is
    /// read straight into its segment, a read waiting for the rest as long as its call waits
    /// (a consumer's own thread); without, it is gathered in the reader's buffer by reads that
    /// never wait (a gate's thread, which other channels wait for). `p` comes back if the
    /// keeper's thread could not start (boxed: it is large, and rare).
    pub(crate) fn start(
        p: Producer,
        id: u32,
        credit: u64,
        sock: Arc<Sock>,
        reader: Reader,
        heartbeat: Duration,
        in_place: bool,
    ) -> Result<In, Box<(Producer, std::io::Error)>> {
        let g = p.geometry();
        let inner = Arc::new(Mutex::new(Inner {
            ch: Some(Receiving::new(
                Held::new(p),
                id,
                g.segment_size as usize,
                g.segment_count as u64,
                credit,
            )),
            sock: sock.clone(),
            reader,
            heard: (0, Instant::now()),
            settled: 0,
            cause: None,
            write_broken: false,
            in_place,
            large: None,
        }));
        let news = Arc::new(CachePadded::new(AtomicBool::new(false)));
        let waker: Arc<Mutex<Option<std::task::Waker>>> = Arc::default();
        let (i, n, w) = (inner.clone(), news.clone(), waker.clone());
        let chore: Chore = Box::new(move || {
            // Only while the consumer's thread is away: one that holds the lock reads the
            // socket itself.
            let Ok(mut inner) = i.try_lock() else {
                return true;
            };
            let wrote = inner.fill(Some(Instant::now()));
            if wrote {
                // (Under the lock: see `news`.)
                n.store(true, Ordering::Relaxed);
            }
            let open = inner.ch.is_some();
            drop(inner);
            if wrote {
                // SYNC POINT: `news` is stored before the waker is taken, and `poll_readable`
                // stores its waker before it loads `news` (both under `w`'s lock): either it
                // sees the news, or its waker is here.
                let task = w.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(task) = task {
                    task.wake();
                }
            }
            // A channel that ended here has nothing more to say, or to read.
            open
        });
        match Keeper::start(sock.clone(), heartbeat, Default::default(), Some(chore)) {
            Ok(keeper) => Ok(In {
                inner,
                news,
                waker,
                keeper,
                keeper_stopped: false,
                sock,
                ready: Readiness::default(),
            }),
            Err(e) => {
                // The chore went with the thread that did not start: `inner` is ours alone.
                let mut inner = inner.lock().unwrap_or_else(|p| p.into_inner());
                let ch = inner.ch.take().expect("a new channel");
                Err(Box::new((ch.p.take(), e)))
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Inner {
    /// Ends the channel here for `why`, as the bridge does.
    fn stop(&mut self, why: Stop) {
        self.large = None;
        let Some(ch) = self.ch.take() else { return };
        let id = ch.id;
        let p = ch.p.take();
        match why {
            Stop::Sender(Last::Close(Closed::Clean)) => p.close(),
            Stop::Sender(Last::Close(Closed::Failed)) | Stop::Sender(Last::Error { .. }) => {
                p.fail()
            }
            Stop::Sender(Last::Close(Closed::ProducerDead)) => p.raw_lose(),
            Stop::Consumer(e) => {
                // A consumer that left reads nothing more; any other failure must not read
                // as a clean end of what arrived.
                if matches!(e, crate::error::SendError::Closed(_)) {
                    drop(p);
                } else {
                    p.fail();
                }
                let _ = self.sock.send(&Msg::Error {
                    channel: id,
                    code: wire::code::LOCAL,
                    message: e.to_string(),
                });
            }
            Stop::Broken(e) => {
                self.cause.get_or_insert_with(|| e.to_string());
                p.raw_lose();
                if matches!(e, LinkError::Protocol(_)) {
                    let _ = self.sock.send(&Msg::Error {
                        channel: wire::CONNECTION,
                        code: wire::code::PROTOCOL,
                        message: e.to_string(),
                    });
                }
            }
            Stop::PriorityUnread => {
                p.fail();
                let _ = self.sock.send(&Msg::Error {
                    channel: id,
                    code: wire::code::LOCAL,
                    message: PRIORITY_UNREAD.into(),
                });
            }
        }
        // Everything the sender will send arrived (or nothing more is wanted): the sender
        // reads the end of the stream.
        self.sock.shutdown_write();
    }

    /// Announces the free segments the sender has no credit for yet, when they are due
    /// ([`Credit::due`](crate::net::client::receiving::Credit::due)).
    fn announce(&mut self) -> Result<(), Stop> {
        let Some(ch) = self.ch.as_mut() else {
            return Ok(());
        };
        let add = ch
            .credit
            .due(ch.p.free(), ch.p.unread(), ch.segments)
            .min(u32::MAX as u64);
        if add > 0 {
            self.sock
                .send(&Msg::AddCredit {
                    channel: ch.id,
                    credit: add as u32,
                })
                .map_err(Stop::Broken)?;
            ch.credit.announced += add;
        }
        ch.p.raw_figures(ch.credit.outstanding(), ch.backlog, ch.wire);
        Ok(())
    }

    /// A priority event that waited for room in the lane goes in if it now fits, and what
    /// was held behind it follows.
    fn release_held(&mut self) -> Result<(), Stop> {
        let Some(ch) = self.ch.as_mut() else {
            return Ok(());
        };
        if let Some(Waiting::Priority { entry, payload }) = ch.held.front() {
            let (entry, payload) = (*entry, payload.clone());
            match ch.p.try_priority(entry, &payload) {
                Ok(()) => {
                    self.settled += 1;
                    ch.release()?
                }
                Err(Halt::Expired(_)) => {}
                Err(Halt::Failed(e)) => return Err(Stop::Consumer(e)),
            }
        }
        Ok(())
    }

    /// One message from the sender.
    fn take(ch: &mut Receiving<Held<Producer>>, msg: Peeked<'_>) -> Result<(), Stop> {
        let id = ch.id;
        let (channel, input) = match msg {
            Peeked::Buffer {
                channel,
                backlog,
                offset,
                frames,
            } => {
                if channel != id {
                    return Err(not_open(channel));
                }
                return ch.take_buffer(backlog, offset, frames);
            }
            Peeked::Other(m) => match m {
                Msg::Heartbeat => return Ok(()),
                Msg::Error {
                    channel: wire::CONNECTION,
                    code,
                    message,
                } => {
                    return Err(Stop::Broken(LinkError::remote(code, message)));
                }
                Msg::Priority {
                    channel,
                    kind,
                    payload,
                } => (
                    channel,
                    Input::Priority {
                        entry: Entry::event(kind),
                        payload,
                    },
                ),
                Msg::Announce { channel, payload } => (
                    channel,
                    Input::Priority {
                        entry: Entry {
                            kind: 0,
                            barrier: true,
                        },
                        payload,
                    },
                ),
                Msg::Close { channel, how } => (channel, Input::Close(how)),
                Msg::Error {
                    channel,
                    code,
                    message,
                } => (channel, Input::Error { code, message }),
                other => {
                    return Err(Stop::Broken(other.wrong_direction("sender").into()));
                }
            },
        };
        if channel != id {
            return Err(not_open(channel));
        }
        ch.take(input)
    }

    /// A large buffer: its place in the segment, for the rest of its frames (read by
    /// [`Inner::take_large`]).
    fn place_large(ch: &mut Receiving<Held<Producer>>, at: usize, len: usize) -> Result<(), Stop> {
        match ch.p.raw_place(at, len) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(r)) => Err(ch.refused(r)),
            Err(e) => Err(Stop::Consumer(e)),
        }
    }

    /// Reads the rest of the large buffer placed in its segment from the socket straight
    /// into its place, until `until`; once all of it is there, checks it there and publishes
    /// it (the first header word stored last, as always). `Ok(false)`: not all of it came
    /// by `until` (the next call goes on).
    fn take_large(
        ch: &mut Receiving<Held<Producer>>,
        reader: &mut Reader,
        sock: &Sock,
        l: &mut Large,
        until: Option<Instant>,
    ) -> Result<bool, Stop> {
        let seg_size = ch.seg_size;
        let dst = ch.p.raw_slice(l.at, l.len);
        if !reader
            .read_rest(sock, dst, &mut l.filled, until, &mut l.heard)
            .map_err(Stop::Broken)?
        {
            return Ok(false);
        }
        let mut span = ch.in_span;
        let checked = wire::check_frames_split(l.at, l.first, dst, seg_size, &mut span)
            .map_err(|e| Stop::Broken(e.into()))?;
        ch.in_span = span;
        ch.place(l.at, l.len, checked.ends)?;
        ch.p.raw_commit(l.at, l.first, l.len, checked.ends, checked.tally);
        ch.wrote(l.backlog, l.len);
        Ok(true)
    }

    fn receive(&mut self, until: Option<Instant>) -> Result<(), Stop> {
        self.release_held()?;
        if self.holding() {
            // A priority event waits for room in the lane: nothing more is read until the
            // consumer takes (or, reading records only, skips) the lane's events, so that
            // what follows it waits in the socket, under TCP's own flow control, rather than
            // piling up here (and no credit is announced for it). Every way of reading takes
            // or skips them as it waits, except reading the parts of a record (which leaves
            // them for the next message): this pause is for that call.
            if let Some(left) = until.map(|u| u.saturating_duration_since(Instant::now())) {
                std::thread::sleep(left.min(HELD_PAUSE));
            } else {
                std::thread::sleep(HELD_PAUSE);
            }
            return Ok(());
        }
        if !self.write_broken && self.announce().is_err() {
            // A sender that ended closes the connection once its end is on the wire, and a
            // write to it then fails, while what it sent before, its end among it, is still
            // to be read. So a failed write only ends the writing: nothing more is written (a
            // write cut short would leave half a message), and the sender reads the end of
            // the stream; the reads go on, and end the channel as what they find says (its
            // end, or a broken connection).
            self.write_broken = true;
            self.sock.shutdown_write();
        }
        self.read(until)
    }

    /// Reads what the sender sent: at least one message, or until `until` (`Some(now)`: what
    /// is there now).
    fn read(&mut self, until: Option<Instant>) -> Result<(), Stop> {
        let mut wait = until;
        loop {
            let Some(ch) = self.ch.as_mut() else {
                return Ok(());
            };
            if !ch.held.is_empty() {
                // A priority event found the lane full: the rest waits (see `receive`).
                return Ok(());
            }
            if let Some(l) = self.large.as_mut() {
                // The rest of a large buffer, as long as the call waits (`until`, not `wait`:
                // a buffer whose head came is worth the call's patience, and a blocking call
                // reads the rest with the head's next bytes); a caller that waits for nothing
                // does not wait for it either (the next call goes on with it).
                if !Inner::take_large(ch, &mut self.reader, &self.sock, l, until)? {
                    return Ok(());
                }
                self.large = None;
                self.settled += 1;
            } else {
                // A large buffer goes straight into its segment.
                match self.reader.next_or_large(&self.sock, wait, self.in_place) {
                    Ok(Got::Nothing) => return Ok(()),
                    Ok(Got::Msg(m)) => Inner::take(ch, m)?,
                    Ok(Got::Large {
                        channel,
                        backlog,
                        offset,
                        first,
                        len,
                    }) => {
                        if channel != ch.id {
                            return Err(not_open(channel));
                        }
                        let at = offset as usize;
                        Inner::place_large(ch, at, len)?;
                        self.large = Some(Large {
                            at,
                            len,
                            first,
                            backlog,
                            filled: 0,
                            heard: Instant::now(),
                        });
                        continue;
                    }
                    Err(e) => return Err(Stop::Broken(e)),
                }
            }
            // Then what else is already there, without waiting (a priority event behind
            // buffers overtakes them once it is read): unless the last read found the socket
            // emptied and nothing whole is left in the buffer, which saves a read that would
            // find nothing.
            if self.reader.drained() {
                return Ok(());
            }
            wait = Some(Instant::now());
        }
    }
}

/// How long a wait pauses while a priority event waits for room in the lane.
const HELD_PAUSE: Duration = Duration::from_millis(1);

impl Inner {
    /// Announces credit and reads what came, until `until`; ends the channel here if the link
    /// failed, the sender ended it, or it was silent for `dead_after`. True if anything may
    /// have been written into the region (a message came, a large buffer was completed, a
    /// held event let in) or the channel ended.
    fn fill(&mut self, until: Option<Instant>) -> bool {
        let before = (self.reader.taken(), self.settled);
        if let Err(why) = self.receive(until) {
            self.stop(why);
            return true;
        }
        if self.silent() {
            let silent_for = self.reader.dead_after();
            self.stop(Stop::Broken(LinkError::PeerSilent { silent_for }));
            return true;
        }
        (self.reader.taken(), self.settled) != before
    }

    /// Not a byte from the sender, heartbeats included, for `dead_after`, while reads went
    /// on. A read that waits finds that out itself; this is for the fills that do not wait
    /// (an async wait, a gate, a consumer that only looks, the keeper), each of which looks
    /// at the time since the sender was last heard.
    fn silent(&mut self) -> bool {
        let got = self.reader.got();
        if got != self.heard.0 || self.holding() || self.ch.is_none() {
            // Heard (by whichever thread read it), or nothing is read for now (a priority
            // event waits for room in the lane).
            self.heard = (got, Instant::now());
            return false;
        }
        self.heard.1.elapsed() >= self.reader.dead_after()
    }

    /// A priority event waits for room in the lane.
    fn holding(&self) -> bool {
        self.ch.as_ref().is_some_and(|ch| !ch.held.is_empty())
    }
}

fn not_open(channel: u32) -> Stop {
    Stop::Broken(
        ProtocolError::Channel {
            channel,
            detail: "a message for a channel that is not open".into(),
        }
        .into(),
    )
}

impl Inbound for In {
    fn fill(&mut self, until: Option<Instant>) {
        let mut inner = self.lock();
        // What the keeper wrote is to be read before anything is waited for.
        let until = if self.news.swap(false, Ordering::Relaxed) {
            Some(Instant::now())
        } else {
            until
        };
        inner.fill(until);
        let ended = inner.ch.is_none();
        drop(inner);
        if ended && !self.keeper_stopped {
            self.keeper_stopped = true;
            self.keeper.stop();
        }
    }

    fn cause(&self) -> Option<String> {
        self.lock().cause.clone()
    }

    fn due(&mut self) -> bool {
        let mut inner = self.lock();
        let broken = inner.write_broken;
        inner.ch.as_mut().is_some_and(|ch| {
            !ch.held.is_empty()
                || (!broken && ch.credit.due(ch.p.free(), ch.p.unread(), ch.segments) > 0)
        }) || self.news.load(Ordering::Relaxed)
    }

    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.sock.as_fd()
    }

    fn poll_readable(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        {
            // SYNC POINT: see the keeper's chore in `In::start`.
            let mut w = self.waker.lock().unwrap_or_else(|p| p.into_inner());
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
            if self.news.load(Ordering::Relaxed) {
                // The keeper wrote into the region: the fill that follows waits for nothing.
                return std::task::Poll::Ready(());
            }
        }
        self.ready.poll(&self.sock, cx)
    }
}

impl Drop for In {
    fn drop(&mut self) {
        // First the keeper (joined: its chore is done with the state), then the end.
        self.keeper.stop();
        let mut inner = self.lock();
        if let Some(ch) = inner.ch.take() {
            // The consumer left before the end: the sender sees it closed.
            let _ = inner.sock.send(&Msg::Cancel { channel: ch.id });
            drop(ch.p.take());
        }
        inner.sock.shutdown_write();
    }
}
