//! The reading side of a direct end's socket: messages out of a buffer the socket fills,
//! checked by the protocol's decoder, and the socket's readiness in the tokio reactor.

use std::io::Read;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use crate::net::error::{LinkError, ProtocolError};
use crate::net::wire::{Codec, Peeked};

use super::sock::{waited_out, Sock};

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
                    // A read that offered room behind `dst` and left it empty: the socket held
                    // no more than this (a read now would find nothing). (A read that waits for
                    // nothing asks for `dst`'s rest only, and says nothing of what is left.)
                    self.short = n == want && !now && !sock.is_tls();
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
