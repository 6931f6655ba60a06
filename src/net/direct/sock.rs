//! What both direct ends share: the blocking socket, written by one thread at a time (the
//! end's, and the keeper's heartbeats), and read through [`Reader`] by one thread at a time
//! (the end's, or its keeper's while the end's thread is away, under the end's lock); with
//! TLS, a rustls session that every byte goes through ([`TlsLayer`]).

use std::io::{IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio_rustls::rustls;

use crate::net::error::{LinkError, ProtocolError};
use crate::net::wire::{Codec, Msg, Peeked};
use crate::protocol::flush_signal::FlushSignal;

/// The connection of a direct end.
pub(crate) struct Sock {
    stream: TcpStream,
    /// One writer at a time, so that messages never interleave; holds the encoding buffers.
    write: Mutex<Bufs>,
    /// Milliseconds from `epoch` to the last write (the keeper's heartbeats fill silence).
    last_write_ms: AtomicU64,
    epoch: Instant,
    /// How long a write may wait for the peer to read.
    deadline: Duration,
    /// The TLS session, if the connection has one.
    tls: Option<TlsLayer>,
}

/// A writer's buffers (under [`Sock::write`]).
struct Bufs {
    /// A message's encoding, or a `Buffer`'s head.
    head: BytesMut,
    /// TLS records sealed by the session and not yet written.
    sealed: Vec<u8>,
}

/// A TLS session over a direct end's connection (rustls, in this process): what is written is
/// encrypted by it and then written to the socket, what the socket brings is decrypted by it
/// and then read. The session's lock is held only for that work, never while a thread waits
/// for the socket: a writer seals its records under it and writes them after, a reader waits
/// for the peer's bytes before it takes it. So a reader is never held up by a writer that
/// waits for the peer to read, nor a writer by a reader that waits for bytes.
///
/// Locks, always in this order: the socket's `write` lock, then `conn` (a writer, and a reader
/// that has records to send: handshake messages, alerts); `raw`, then `conn` (the reader), or
/// `raw`, then `write`. Every write to the socket happens under `write`, so TLS records never
/// interleave.
struct TlsLayer {
    /// The session. Its plaintext buffer is drained before it is given more ciphertext (it
    /// refuses more than 16 KiB of plaintext unread).
    conn: Mutex<rustls::Connection>,
    /// Ciphertext read from the socket and not yet given to the session.
    raw: Mutex<Raw>,
}

/// Ciphertext read and not yet decrypted: `buf[lo..hi]`.
struct Raw {
    buf: Box<[u8]>,
    lo: usize,
    hi: usize,
}

/// Bytes of ciphertext a read of a TLS connection asks the socket for at once (four records
/// of the largest size).
const RAW_CHUNK: usize = 4 * (16 << 10) + 4 * 256;

/// A socket's read or write timed out (or, not waiting, found nothing).
fn waited_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// A session that refused what the peer sent (it has queued an alert that says why): the
/// reading side's error.
fn refused(e: rustls::Error) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

impl Sock {
    /// The connection's descriptor (for a readiness wait).
    pub(crate) fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.stream.as_fd()
    }

    /// `tls`: a session (still to shake hands) that every byte is to go through.
    pub(crate) fn new(
        stream: TcpStream,
        deadline: Duration,
        tls: Option<rustls::Connection>,
    ) -> std::io::Result<Arc<Sock>> {
        stream.set_nodelay(true)?;
        // A peer that reads nothing for `deadline` is stalled: the write fails.
        stream.set_write_timeout(Some(deadline))?;
        let tls = tls.map(|mut conn| {
            // What is written is sealed and written at once, so the session holds at most one
            // message (a segment's frames and a head) unsealed: no limit below that.
            conn.set_buffer_limit(None);
            TlsLayer {
                conn: Mutex::new(conn),
                raw: Mutex::new(Raw {
                    buf: vec![0u8; RAW_CHUNK].into_boxed_slice(),
                    lo: 0,
                    hi: 0,
                }),
            }
        });
        Ok(Arc::new(Sock {
            stream,
            write: Mutex::new(Bufs {
                head: BytesMut::with_capacity(256),
                sealed: Vec::new(),
            }),
            last_write_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            deadline,
            tls,
        }))
    }

    /// The connection goes through TLS.
    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Completes the TLS handshake (if the connection has TLS), waiting for the peer at most
    /// the deadline for each of its messages. The error says what the session refused (a
    /// certificate no trusted authority signed, a name it does not carry) or that the peer
    /// went silent or left.
    pub(crate) fn handshake(&self) -> std::io::Result<()> {
        let Some(t) = &self.tls else {
            return Ok(());
        };
        self.stream.set_read_timeout(Some(self.deadline))?;
        loop {
            self.send_sealed(t, &mut [])?;
            let mut conn = t.conn.lock().unwrap_or_else(|p| p.into_inner());
            if !conn.is_handshaking() {
                return Ok(());
            }
            let mut r = &self.stream;
            match conn.read_tls(&mut r) {
                Ok(0) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the peer closed the connection during the TLS handshake",
                    ))
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if waited_out(&e) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "the peer said nothing for {:?} during the TLS handshake",
                            self.deadline
                        ),
                    ))
                }
                Err(e) => return Err(e),
            }
            if let Err(e) = conn.process_new_packets() {
                drop(conn);
                // The alert that says why, if the socket takes it.
                let _ = self.send_sealed(t, &mut []);
                return Err(refused(e));
            }
        }
    }

    /// Seals `parts` (and whatever else the session has to send) into TLS records under the
    /// session's lock, then writes them without it; all under the `write` lock.
    fn send_sealed(&self, t: &TlsLayer, parts: &mut [IoSlice<'_>]) -> std::io::Result<()> {
        let mut bufs = self.write.lock().unwrap_or_else(|p| p.into_inner());
        self.seal_and_write(t, &mut bufs.sealed, parts)
    }

    /// As [`Sock::send_sealed`], the `write` lock held (its `sealed` buffer given).
    fn seal_and_write(
        &self,
        t: &TlsLayer,
        sealed: &mut Vec<u8>,
        parts: &mut [IoSlice<'_>],
    ) -> std::io::Result<()> {
        sealed.clear();
        {
            let mut conn = t.conn.lock().unwrap_or_else(|p| p.into_inner());
            for p in parts.iter() {
                conn.writer().write_all(p)?;
            }
            while conn.wants_write() {
                conn.write_tls(sealed)?;
            }
        }
        (&self.stream).write_all(sealed)
    }

    /// Writes `parts` whole, as one message (sealed by the session, with TLS); the `write`
    /// lock held.
    fn write_parts(&self, sealed: &mut Vec<u8>, parts: &mut [IoSlice<'_>]) -> std::io::Result<()> {
        if let Some(t) = &self.tls {
            return self.seal_and_write(t, sealed, parts);
        }
        let mut parts = parts;
        loop {
            if parts.is_empty() {
                return Ok(());
            }
            match crate::sys::sock::send_vectored(self.stream.as_fd(), parts) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut parts, n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Plaintext into `bufs` through the session: what it holds, else what `raw` holds
    /// decrypted, else what the socket brings (`now`: without waiting, `WouldBlock` if
    /// nothing; else as the socket's read timeout lets, and no new read once `until` has
    /// passed). `Ok(0)`: the peer ended the stream (with TLS's `close_notify` or without: the
    /// protocol's own `Close` says whether the channel ended cleanly).
    fn tls_read(
        &self,
        t: &TlsLayer,
        bufs: &mut [std::io::IoSliceMut<'_>],
        now: bool,
        until: Option<Instant>,
    ) -> std::io::Result<usize> {
        let mut raw = t.raw.lock().unwrap_or_else(|p| p.into_inner());
        let mut read_once = false;
        loop {
            let mut answer = false;
            {
                let mut conn = t.conn.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    match conn.reader().read_vectored(bufs) {
                        Ok(n) => {
                            answer |= conn.wants_write();
                            drop(conn);
                            if answer {
                                self.answer(t);
                            }
                            return Ok(n);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(0),
                        Err(e) => return Err(e),
                    }
                    if raw.lo == raw.hi {
                        break;
                    }
                    let Raw { buf, lo, hi } = &mut *raw;
                    let mut rest = &buf[*lo..*hi];
                    let n = conn.read_tls(&mut rest)?;
                    // After the peer's `close_notify` the session takes nothing more.
                    *lo = if n == 0 { *hi } else { *lo + n };
                    if let Err(e) = conn.process_new_packets() {
                        drop(conn);
                        self.answer(t);
                        return Err(refused(e));
                    }
                    // Handshake messages, key updates, alerts the session has to send.
                    answer |= conn.wants_write();
                }
            }
            if answer {
                self.answer(t);
            }
            // Nothing decrypted is left: read the socket, without the session's lock.
            if read_once && until.is_some_and(|u| Instant::now() >= u) {
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            read_once = true;
            (raw.lo, raw.hi) = (0, 0);
            let got = if now {
                crate::sys::sock::recv_now(self.stream.as_fd(), &mut raw.buf)
            } else {
                (&self.stream).read(&mut raw.buf)
            };
            match got {
                Ok(0) => {
                    // The end of the stream: the session says whether it was announced.
                    let mut conn = t.conn.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = conn.read_tls(&mut &[][..]);
                    if let Err(e) = conn.process_new_packets() {
                        return Err(refused(e));
                    }
                    return match conn.reader().read_vectored(bufs) {
                        Ok(n) => Ok(n),
                        Err(_) => Ok(0),
                    };
                }
                Ok(n) => raw.hi = n,
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends what the session has to say after reading (handshake messages, an alert): a
    /// failure shows at the next read or write.
    #[cold]
    fn answer(&self, t: &TlsLayer) {
        let _ = self.send_sealed(t, &mut []);
    }

    fn stamp(&self) {
        // Relaxed: a hint for the keeper; a stale value costs one extra heartbeat.
        self.last_write_ms
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn write_err(&self, e: std::io::Error) -> LinkError {
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                LinkError::PeerNotReading {
                    stalled_for: self.deadline,
                }
            }
            _ => LinkError::io(e),
        }
    }

    /// Sends one message.
    pub(crate) fn send(&self, msg: &Msg) -> Result<(), LinkError> {
        let mut bufs = self.write.lock().unwrap_or_else(|p| p.into_inner());
        let Bufs { head, sealed } = &mut *bufs;
        head.clear();
        msg.encode(head);
        let r = self.write_parts(sealed, &mut [IoSlice::new(head)]);
        drop(bufs);
        self.stamp();
        r.map_err(|e| self.write_err(e))
    }

    /// Sends a `Buffer` whose frames are `frames` (straight from the segment), in one
    /// gathering write when the socket takes it all.
    pub(crate) fn send_buffer(
        &self,
        channel: u32,
        backlog: u32,
        offset: u32,
        frames: &[u8],
    ) -> Result<(), LinkError> {
        let mut bufs = self.write.lock().unwrap_or_else(|p| p.into_inner());
        let Bufs { head, sealed } = &mut *bufs;
        head.clear();
        crate::net::wire::put_buffer_head(head, channel, backlog, offset, frames.len());
        let r = self.write_parts(sealed, &mut [IoSlice::new(head), IoSlice::new(frames)]);
        drop(bufs);
        self.stamp();
        r.map_err(|e| self.write_err(e))
    }

    /// Ends the writing side (the peer reads the end of the stream; with TLS, announced by
    /// a `close_notify` first).
    pub(crate) fn shutdown_write(&self) {
        let mut bufs = self.write.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = &self.tls {
            let handshaking = {
                let mut conn = t.conn.lock().unwrap_or_else(|p| p.into_inner());
                if !conn.is_handshaking() {
                    conn.send_close_notify();
                }
                conn.is_handshaking()
            };
            if !handshaking {
                let _ = self.seal_and_write(t, &mut bufs.sealed, &mut []);
            }
        }
        let _ = self.stream.shutdown(Shutdown::Write);
    }

    /// Ends both sides.
    pub(crate) fn shutdown(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// Work the keeper does for an end while its thread is away (see [`Keeper`]); false once
/// the end has nothing more to say (the keeper then ends, with no heartbeat after).
pub(crate) type Chore = Box<dyn FnMut() -> bool + Send>;

/// What the keeper's thread is told, under its lock.
#[derive(Default)]
struct Orders {
    /// The buffer timeout (`FlushPolicy::Timeout`) the end defers records with, once it
    /// does: the keeper then looks every interval while records come.
    interval: Option<Duration>,
}

/// How long an end's thread makes no call before its keeper takes over what waits for
/// credit. A producer that stops calling adds between one and two of these to the wait of its
/// last segments (on top of the credit's own: the keeper's look restarts when a call lands
/// in it); a producer that keeps calling pays nothing for it, and looks for credit itself
/// (at least once per `AWAY` while it has none).
pub(crate) const AWAY: Duration = Duration::from_micros(500);

/// Waits until the end's thread has made no call (`calls` unchanged) for [`AWAY`]: true then,
/// false as soon as `done` says the wait is moot (the keeper is stopped, nothing waits any
/// more, a heartbeat is due: a thread that keeps calling without credit writes nothing). The
/// keeper's thread sleeps meanwhile (`park_timeout`: a wake or a stop cuts a sleep short and
/// the loop looks again).
fn away(calls: &AtomicU64, done: impl Fn() -> bool) -> bool {
    loop {
        // Relaxed: pairs with the Relaxed store of `Keeper::touch`, a hint with nothing
        // published through it: a stale count only moves when the keeper takes the end's
        // mutex (which orders everything it then reads), never what it does under it.
        let before = calls.load(Ordering::Relaxed);
        let start = Instant::now();
        while start.elapsed() < AWAY {
            std::thread::park_timeout(AWAY - start.elapsed().min(AWAY));
            if done() {
                return false;
            }
        }
        if calls.load(Ordering::Relaxed) == before {
            return true;
        }
    }
}

/// The keeper of a direct end: a thread that sends a heartbeat whenever the end has written
/// nothing for `every`, so that the peer does not take an end whose thread is busy elsewhere
/// as dead; and runs its end's [`Chore`] (a sending end's reads what the receiver said and
/// forwards what is published; a receiving end's, if its consumer's thread is away, announces
/// credit and fills the end's segments from the socket)
/// - before each heartbeat it sends (the end silent for `every`), so that an idle end still
///   reads what its peer says;
/// - for a sending end, whenever the socket has something to read while `pending` is set
///   (segments waiting for credit when the producer's thread returned before the credit
///   came) and the end's thread has made no call for [`AWAY`] (a thread that keeps calling
///   hears its credit itself: were the keeper to forward meanwhile, the two would take turns
///   at the end's lock and at the CPUs, each turn a wake-up), and
/// - for a sending end, once per buffer timeout while records are deferred
///   (`FlushPolicy::Timeout`): the end marks each deferred record in a [`FlushSignal`], the
///   hand-off of the local buffer-timeout flusher (its loom model covers it), and the keeper
///   takes the mark each interval, and sleeps (until a mark, a heartbeat or the stop) when
///   there was none.
///
/// Stopped and joined on drop.
pub(crate) struct Keeper {
    /// Calls of the end's thread ([`Keeper::touch`]): the keeper takes the end for away
    /// once this stays the same for [`AWAY`].
    calls: Arc<AtomicU64>,
    orders: Arc<(Mutex<Orders>, Condvar)>,
    stop: Arc<AtomicBool>,
    signal: Arc<FlushSignal>,
    /// The interval last told (so that a deferral takes the lock only when it changes).
    interval: Option<Duration>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Keeper {
    /// `pending`: the flag of [`Keeper::wake`] (never set for an end without a chore).
    pub(crate) fn start(
        sock: Arc<Sock>,
        every: Duration,
        pending: Arc<AtomicBool>,
        mut chore: Option<Chore>,
    ) -> std::io::Result<Keeper> {
        let orders = Arc::new((Mutex::new(Orders::default()), Condvar::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let signal = Arc::new(FlushSignal::default());
        let calls = Arc::new(AtomicU64::new(0));
        let (o, p, st, sig, n) = (
            orders.clone(),
            pending.clone(),
            stop.clone(),
            signal.clone(),
            calls.clone(),
        );
        let thread = std::thread::Builder::new()
            .name("shmflow-keeper".into())
            .spawn(move || {
                let (lock, cv) = &*o;
                let heartbeat_due = || {
                    let now = sock.epoch.elapsed().as_millis() as u64;
                    let last = sock.last_write_ms.load(Ordering::Relaxed);
                    now.saturating_sub(last) >= every.as_millis() as u64
                };
                // A heartbeat failed: none are sent any more.
                let mut mute = false;
                loop {
                    let interval = {
                        let mut g = lock.lock().unwrap_or_else(|p| p.into_inner());
                        // Relaxed: hints; the chore looks at the state itself, under its lock,
                        // and every change is followed by a notify under this lock (or, for
                        // the stop, an unpark too), so no wake-up is lost.
                        if !st.load(Ordering::Relaxed) && !p.load(Ordering::Relaxed) {
                            let wait = g.interval.map_or(every, |d| d.min(every));
                            g = cv
                                .wait_timeout(g, wait)
                                .unwrap_or_else(|p| p.into_inner())
                                .0;
                        }
                        g.interval
                    };
                    if st.load(Ordering::Relaxed) {
                        return;
                    }
                    if let Some(chore) = chore.as_mut() {
                        if interval.is_some() {
                            if sig.take() && !chore() {
                                return;
                            } else {
                                // Nothing deferred for an interval: sleep until the end marks
                                // a record, segments wait for credit, a heartbeat is due, or
                                // the stop (`wake` and `stop` unpark too).
                                sig.sleep(
                                    || {
                                        st.load(Ordering::Relaxed)
                                            || p.load(Ordering::Relaxed)
                                            || heartbeat_due()
                                    },
                                    || std::thread::park_timeout(every),
                                );
                            }
                        }
                        if p.load(Ordering::Relaxed)
                            && away(&n, || {
                                // Relaxed: hints, as above (the chore looks at the state
                                // under its lock). A muted keeper sends no heartbeat: one
                                // due must not cut this wait short for ever.
                                st.load(Ordering::Relaxed)
                                    || !p.load(Ordering::Relaxed)
                                    || (!mute && heartbeat_due())
                            })
                        {
                            // Until the peer says something (credit), or a heartbeat is due.
                            if let Ok(true) =
                                crate::sys::sock::wait_readable(sock.stream.as_fd(), every)
                            {
                                if !chore() {
                                    return;
                                }
                            }
                        }
                    }
                    if heartbeat_due() {
                        // An end silent for a heartbeat interval reads what its peer said
                        // meanwhile (heartbeats, credit, records, the channel's end): nothing
                        // else reads while its stage makes no call, and over a long silence
                        // the peer's heartbeats would fill this side's socket buffers until
                        // the peer's keeper, unable to write, took the link for stalled.
                        if let Some(chore) = chore.as_mut() {
                            if !p.load(Ordering::Relaxed) && !chore() {
                                return;
                            }
                        }
                        if !mute && sock.send(&Msg::Heartbeat).is_err() {
                            // The end's own calls find out. An end with a chore may still
                            // have reading to do (its writing side failed first): the chore
                            // goes on, with no more heartbeats, until it says it is done.
                            if chore.is_none() {
                                return;
                            }
                            mute = true;
                        }
                    }
                }
            })?;
        Ok(Keeper {
            calls,
            orders,
            stop,
            signal,
            interval: None,
            thread: Some(thread),
        })
    }

    /// The end's thread made a call (see [`AWAY`]).
    #[inline]
    pub(crate) fn touch(&self) {
        // Relaxed: pairs with the Relaxed loads in `away`; a hint of activity, nothing is
        // published through it (the end's mutex orders the state).
        self.calls.store(
            self.calls.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Relaxed,
        );
    }

    /// Wakes the keeper to look at its `pending` flag (set and cleared by whoever holds the
    /// end's state, the chore included; this after setting it).
    pub(crate) fn wake(&self) {
        let (lock, cv) = &*self.orders;
        {
            let _g = lock.lock().unwrap_or_else(|p| p.into_inner());
            cv.notify_one();
        }
        // It may sleep on the flush signal rather than on the condvar.
        if let Some(t) = self.thread.as_ref() {
            t.thread().unpark();
        }
    }

    /// A record was published and not forwarded: the keeper forwards it within `interval`
    /// if nothing else does (one atomic swap, and an unpark only when the keeper sleeps).
    #[inline]
    pub(crate) fn defer(&mut self, interval: Duration) {
        let thread = self.thread.as_ref().map(|t| t.thread());
        self.signal.mark(|| {
            if let Some(t) = thread {
                t.unpark();
            }
        });
        if self.interval != Some(interval) {
            self.set_interval(interval);
        }
    }

    #[cold]
    fn set_interval(&mut self, interval: Duration) {
        self.interval = Some(interval);
        let (lock, cv) = &*self.orders;
        lock.lock().unwrap_or_else(|p| p.into_inner()).interval = Some(interval);
        cv.notify_one();
    }

    /// Stops the keeper (the end has nothing more to say).
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        {
            let (lock, cv) = &*self.orders;
            let _g = lock.lock().unwrap_or_else(|p| p.into_inner());
            cv.notify_one();
        }
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Readiness of a direct end's socket in the tokio reactor, for its async waits (registered
/// at the first).
#[derive(Default)]
pub(crate) struct Readiness(Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>);

impl Readiness {
    /// `Ready` once the socket has something to read (or failed: the read that follows says
    /// so); the readiness is cleared first, so that the next call waits for more.
    pub(crate) fn poll(
        &mut self,
        sock: &Sock,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        use std::task::Poll;
        if self.0.is_none() {
            let fd = match sock.stream.as_fd().try_clone_to_owned() {
                Ok(fd) => fd,
                // The read that follows reports what is wrong.
                Err(_) => return Poll::Ready(()),
            };
            // SAFETY: the `OwnedFd` is owned by the `AsyncFd` for its whole life, open, and
            // always gives the same number (a copy of the socket's descriptor).
            let registered = unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
            };
            match registered {
                Ok(a) => self.0 = Some(a),
                Err(_) => return Poll::Ready(()),
            }
        }
        let a = self.0.as_ref().expect("registered above");
        match a.poll_read_ready(cx) {
            Poll::Ready(Ok(mut g)) => {
                g.clear_ready();
                Poll::Ready(())
            }
            Poll::Ready(Err(_)) => Poll::Ready(()),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Bytes a read asks the socket for at once (more for larger segments: a whole `Buffer`).
const READ_CHUNK: usize = 256 << 10;

/// The reading side: messages out of a buffer that the socket fills, checked by the
/// protocol's decoder; a `Buffer`'s frames are handed out in place.
pub(crate) struct Reader {
    buf: Box<[u8]>,
    lo: usize,
    hi: usize,
    codec: Codec,
    dead_after: Duration,
    /// The read timeout the socket has now.
    timeout: Option<Duration>,
    /// The last read brought less than it asked for: the socket had nothing more then.
    short: bool,
    /// Messages (and heads of large buffers) handed out so far.
    taken: u64,
    /// Bytes read from the socket so far.
    got: u64,
}

/// What [`Reader::next`] found.
pub(crate) enum Got<'a> {
    Msg(Peeked<'a>),
    /// The head of a large `Buffer` whose frames have not all arrived: its first header word
    /// is `first`, and the caller reads the other `len - 8` bytes of frames where they belong
    /// with [`Reader::read_rest`] (the head was checked as [`Codec`] checks it).
    Large {
        channel: u32,
        backlog: u32,
        offset: u32,
        first: u64,
        len: usize,
    },
    /// Nothing by the deadline.
    Nothing,
}

/// Bytes of a `Buffer`'s frames from which [`Reader::next_or_large`] hands the rest to the
/// caller to read in place, rather than gathering all of it first (and copying it once more).
pub(crate) const LARGE: usize = 4 << 10;

/// Bytes a read asks for when large buffers are to go straight into their segments: every
/// control message and small buffer, or the head of a large one.
const SMALL_READ: usize = 4 << 10;

impl Reader {
    /// A reader for `Buffer`s of up to `max_frames` bytes (0: a side that receives none).
    pub(crate) fn new(max_frames: usize, dead_after: Duration) -> Reader {
        // A sender reads only control messages (at most about a kilobyte each): a small
        // buffer, which is also all a connection waiting in a listener's handshake holds.
        let cap = if max_frames == 0 {
            SMALL_READ
        } else {
            READ_CHUNK.max(2 * (max_frames + 64))
        };
        Reader {
            buf: vec![0u8; cap].into_boxed_slice(),
            lo: 0,
            hi: 0,
            codec: Codec::new(max_frames),
            dead_after,
            timeout: None,
            short: false,
            taken: 0,
            got: 0,
        }
    }

    /// How long a peer may be silent before it is taken as dead.
    pub(crate) fn dead_after(&self) -> Duration {
        self.dead_after
    }

    /// Messages (and heads of large buffers) handed out so far.
    pub(crate) fn taken(&self) -> u64 {
        self.taken
    }

    /// Bytes read from the socket so far (plaintext, under TLS).
    pub(crate) fn got(&self) -> u64 {
        self.got
    }

    /// Nothing is left in the buffer, and the last read found the socket emptied: a read
    /// now would most likely find nothing.
    pub(crate) fn drained(&self) -> bool {
        self.short && self.lo == self.hi
    }

    /// The next message, reading the socket if none is whole in the buffer: waits until
    /// `until` (`None`: as long as the peer is alive; a peer silent for `dead_after` is
    /// `PeerSilent`), `Got::Nothing` if it passes. The message borrows the buffer until the
    /// next call.
    pub(crate) fn next(
        &mut self,
        sock: &Sock,
        until: Option<Instant>,
    ) -> Result<Got<'_>, LinkError> {
        self.next_or_large(sock, until, false)
    }

    /// As [`Reader::next`]; with `large`, a `Buffer` of at least [`LARGE`] bytes of frames that
    /// has not all arrived comes as [`Got::Large`].
    pub(crate) fn next_or_large(
        &mut self,
        sock: &Sock,
        until: Option<Instant>,
        large: bool,
    ) -> Result<Got<'_>, LinkError> {
        // When the first read that may wait began (a clock read only when one does).
        let mut started: Option<Instant> = None;
        loop {
            if self.whole()? {
                break;
            }
            if large {
                if let Some(got) = self.large()? {
                    self.taken += 1;
                    return Ok(got);
                }
            }
            if self.lo > 0 {
                // Move the partial message to the front: the rest lands behind it.
                self.buf.copy_within(self.lo..self.hi, 0);
                self.hi -= self.lo;
                self.lo = 0;
            }
            let left = until.map(|u| u.saturating_duration_since(Instant::now()));
            if left != Some(Duration::ZERO) {
                // What is left of the silence deadline, as `read_rest` counts it: a timeout
                // set a little short of it ends a read early, and the read after asks only
                // for the rest, so that a silent peer is found after `dead_after`, not twice
                // that.
                let quiet = started.map_or(self.dead_after, |s| {
                    self.dead_after.saturating_sub(s.elapsed())
                });
                self.wait_at_most(sock, left.map_or(quiet, |l| l.min(quiet)))?;
            }
            // Where large buffers go straight into their segments, ask for little at once:
            // what a read brings beyond the head of a large buffer is copied once more.
            let ask = if large { SMALL_READ } else { self.buf.len() };
            let top = (self.hi + ask).min(self.buf.len());
            let dst = &mut self.buf[self.hi..top];
            let dst_len = dst.len();
            let got = if let (Some(t), Some(Duration::ZERO)) = (&sock.tls, left) {
                sock.tls_read(t, &mut [std::io::IoSliceMut::new(dst)], true, until)
            } else if left == Some(Duration::ZERO) {
                crate::sys::sock::recv_now(sock.stream.as_fd(), dst)
            } else {
                started.get_or_insert_with(Instant::now);
                match &sock.tls {
                    Some(t) => sock.tls_read(t, &mut [std::io::IoSliceMut::new(dst)], false, until),
                    None => (&sock.stream).read(dst),
                }
            };
            match got {
                Ok(0) => return Err(LinkError::PeerClosed),
                Ok(n) => {
                    // (A session may hold more than a short read gave: never drained.)
                    self.short = n < dst_len && !sock.is_tls();
                    self.hi += n;
                    self.got += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if waited_out(&e) => {
                    if started.is_some_and(|s| s.elapsed() >= self.dead_after) {
                        return Err(LinkError::PeerSilent {
                            silent_for: self.dead_after,
                        });
                    }
                    if until.is_some_and(|u| Instant::now() >= u) {
                        return Ok(Got::Nothing);
                    }
                }
                Err(e) => return Err(LinkError::io(e)),
            }
        }
        let (len, msg) = self
            .codec
            .peek(&self.buf[self.lo..self.hi])?
            .expect("a whole message");
        self.lo += len;
        if self.lo == self.hi {
            (self.lo, self.hi) = (0, 0);
        }
        self.taken += 1;
        Ok(Got::Msg(msg))
    }

    /// The head of a large `Buffer` at the front, taken out (its first frame header word
    /// with it), if one is there and its frames are not.
    fn large(&mut self) -> Result<Option<Got<'static>>, LinkError> {
        use crate::net::wire::{buffer_head, BUFFER_HEAD, K_BUFFER, PREFIX};
        let at = &self.buf[self.lo..self.hi];
        let want = PREFIX + BUFFER_HEAD + 8;
        if at.len() < want {
            return Ok(None);
        }
        let Some((total, kind)) = self.codec.head(at)? else {
            return Ok(None);
        };
        if kind != K_BUFFER || total < want || total - PREFIX - BUFFER_HEAD < LARGE {
            return Ok(None);
        }
        let (channel, backlog, offset) = buffer_head(&at[PREFIX..want])?;
        let first = u64::from_le_bytes(at[want - 8..want].try_into().expect("8 bytes"));
        self.lo += want;
        Ok(Some(Got::Large {
            channel,
            backlog,
            offset,
            first,
            len: total - PREFIX - BUFFER_HEAD,
        }))
    }

    /// After [`Got::Large`]: fills `dst` (the rest of its frames) from `*at` on, with what
    /// is buffered, then straight from the socket, until it is full (`Ok(true)`) or `until`
    /// passes (`Ok(false)`: `*at` says how far it came; call again with the same `dst` to go
    /// on). Each read that may wait also asks for up to [`SMALL_READ`] bytes behind `dst`,
    /// into the buffer: what follows the buffer (the next message's head, in a stream of large
    /// buffers) comes with the same system call. `*heard` is when the last of it came (the
    /// head's arrival at first): a peer silent for `dead_after` since then is `PeerSilent`,
    /// across calls.
    pub(crate) fn read_rest(
        &mut self,
        sock: &Sock,
        dst: &mut [u8],
        at: &mut usize,
        until: Option<Instant>,
        heard: &mut Instant,
    ) -> Result<bool, LinkError> {
        self.short = false;
        let have = (self.hi - self.lo).min(dst.len() - *at);
        dst[*at..*at + have].copy_from_slice(&self.buf[self.lo..self.lo + have]);
        self.lo += have;
        if self.lo == self.hi {
            (self.lo, self.hi) = (0, 0);
        }
        *at += have;
        while *at < dst.len() {
            // The buffer is empty here (what it held went into `dst` above, or filled it).
            debug_assert_eq!((self.lo, self.hi), (0, 0));
            let left = until.map(|u| u.saturating_duration_since(Instant::now()));
            let now = left == Some(Duration::ZERO);
            if !now {
                let quiet = self.dead_after.saturating_sub(heard.elapsed());
                self.wait_at_most(sock, left.map_or(quiet, |l| l.min(quiet)))?;
            }
            let behind = SMALL_READ.min(self.buf.len());
            let want = dst.len() - *at;
            let mut bufs = [
                std::io::IoSliceMut::new(&mut dst[*at..]),
                std::io::IoSliceMut::new(&mut self.buf[..behind]),
            ];
            let got = match &sock.tls {
                Some(t) => sock.tls_read(t, &mut bufs, now, until),
                // (What is there now: the rest of `dst` only, which is all a caller that
                // waits for nothing needs.)
                None if now => crate::sys::sock::recv_now(sock.stream.as_fd(), &mut bufs[0]),
                None => (&sock.stream).read_vectored(&mut bufs),
            };
            if let Ok(n) = got {
                self.got += n as u64;
            }
            match got {
                Ok(0) => return Err(LinkError::PeerClosed),
                Ok(n) if n <= want => {
                    *at += n;
                    *heard = Instant::now();
                }
                Ok(n) => {
                    // `dst` is full; the rest went into the buffer (the socket had no more
                    // if it did not fill it).
                    *at = dst.len();
                    self.hi = n - want;
                    self.short = self.hi < behind && !sock.is_tls();
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if waited_out(&e) => {
                    if heard.elapsed() >= self.dead_after {
                        return Err(LinkError::PeerSilent {
                            silent_for: self.dead_after,
                        });
                    }
                    if until.is_some_and(|u| Instant::now() >= u) {
                        return Ok(false);
                    }
                }
                Err(e) => return Err(LinkError::io(e)),
            }
        }
        Ok(true)
    }

    /// Makes a blocking read of `sock` wait at most `t`, and not much less: the socket's
    /// timeout is set again only when the one set is longer than `t` or shorter by more than
    /// a sixteenth of it, and then a thirty-second short of `t`, so that the timeouts of a
    /// stream of reads (the time left of one silence deadline, read after read) cost one
    /// system call in many rather than one each. A read that the shorter timeout ends early
    /// only looks again: every caller checks its own deadlines when a read times out.
    fn wait_at_most(&mut self, sock: &Sock, t: Duration) -> std::io::Result<()> {
        let t = t.max(Duration::from_micros(1));
        if self
            .timeout
            .is_some_and(|cur| cur <= t && t - cur <= t / 16)
        {
            return Ok(());
        }
        let set = (t - t / 32).max(Duration::from_micros(1));
        sock.stream.set_read_timeout(Some(set))?;
        self.timeout = Some(set);
        Ok(())
    }

    /// True if a whole message is in the buffer (checked as far as its head goes).
    fn whole(&mut self) -> Result<bool, ProtocolError> {
        Ok(self.codec.peek_len(&self.buf[self.lo..self.hi])?.is_some())
    }
}
