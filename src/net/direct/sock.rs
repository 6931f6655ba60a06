//! What both direct ends share: the blocking socket, written by one thread at a time (the
//! end's, and the keeper's heartbeats), and read through [`Reader`](super::reader::Reader) by
//! one thread at a time (the end's, or its keeper's while the end's thread is away, under the
//! end's lock); with TLS, a rustls session that every byte goes through ([`TlsLayer`]).

use std::io::{IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio_rustls::rustls;

use crossbeam_utils::CachePadded;

use crate::net::error::LinkError;
use crate::net::wire::Msg;

/// The connection of a direct end.
pub(crate) struct Sock {
    pub(super) stream: TcpStream,
    /// One writer at a time, so that messages never interleave; holds the encoding buffers.
    pub(super) write: Mutex<Bufs>,
    /// Milliseconds from `epoch` to the last write (the keeper's heartbeats fill silence):
    /// stored by the writing thread at every write, read by the keeper's, on a line of its
    /// own.
    pub(super) last_write_ms: CachePadded<AtomicU64>,
    pub(super) epoch: Instant,
    /// How long a write may wait for the peer to read.
    pub(super) deadline: Duration,
    /// The TLS session, if the connection has one.
    pub(super) tls: Option<TlsLayer>,
}

/// A writer's buffers (under [`Sock::write`]).
pub(super) struct Bufs {
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
pub(super) struct TlsLayer {
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
pub(super) fn waited_out(e: &std::io::Error) -> bool {
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
            last_write_ms: CachePadded::new(AtomicU64::new(0)),
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
    pub(super) fn tls_read(
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
