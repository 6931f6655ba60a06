//! What both ends of a connection share: the stream (TCP, or TLS over TCP), the writer that
//! channel tasks take turns on, heartbeats, and reading with a deadline.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter, ReadHalf, WriteHalf};
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::net::error::LinkError;
use crate::net::wire::{self, Codec, Msg};
use crate::net::Ended;

/// A connection: TCP, or TLS over TCP.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

pub(crate) type BoxStream = Box<dyn Stream>;
pub(crate) type Reader = FramedRead<ReadHalf<BoxStream>, Codec>;

/// A TCP stream whose gathering writes raise no `SIGPIPE` when the peer has gone (tokio's
/// go through `writev`, which would kill a host process that has not ignored the signal; its
/// plain writes already pass `MSG_NOSIGNAL`): the connection's errors stay errors. Plaintext
/// connections and TLS sessions both write through it.
pub(crate) struct Tcp(pub(crate) tokio::net::TcpStream);

impl AsyncRead for Tcp {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tcp {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        use std::os::fd::AsFd;
        let s = &self.0;
        loop {
            std::task::ready!(s.poll_write_ready(cx))?;
            // `try_io` clears the readiness on `WouldBlock`, so the next poll waits.
            match s.try_io(tokio::io::Interest::WRITABLE, || {
                crate::sys::sock::send_vectored(s.as_fd(), bufs)
            }) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                r => return std::task::Poll::Ready(r),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Bytes the writer gathers before it writes (larger buffers go straight through).
const WRITE_BUFFER: usize = 256 << 10;

/// Bytes of frames from which a `Buffer` is written straight from the segment, in one
/// gathering write with its head (after what was gathered before it), rather than copied into
/// the gathering buffer: a copy of a large chunk costs more than the write it would save.
const STRAIGHT: usize = 16 << 10;

/// The writing half, shared by every channel of the connection: a task takes it for a
/// batch of messages and flushes before letting go.
pub(crate) struct Writer {
    inner: tokio::sync::Mutex<Inner>,
}

pub(crate) struct Inner {
    w: BufWriter<WriteHalf<BoxStream>>,
    head: BytesMut,
    /// How long one write may wait for the peer to read.
    deadline: Duration,
}

/// One write, bounded: a peer that reads nothing for `deadline` is taken as stalled.
async fn bounded<T>(
    deadline: Duration,
    f: impl std::future::Future<Output = std::io::Result<T>>,
) -> Result<T, LinkError> {
    match tokio::time::timeout(deadline, f).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(LinkError::PeerNotReading {
            stalled_for: deadline,
        }),
    }
}

impl Writer {
    /// `deadline`: how long a write may wait for the peer to read (its `dead_after`).
    pub(crate) fn new(w: WriteHalf<BoxStream>, deadline: Duration) -> Arc<Writer> {
        Arc::new(Writer {
            inner: tokio::sync::Mutex::new(Inner {
                w: BufWriter::with_capacity(WRITE_BUFFER, w),
                head: BytesMut::with_capacity(64),
                deadline,
            }),
        })
    }

    /// Takes the writer for a batch.
    pub(crate) async fn lock(&self) -> tokio::sync::MutexGuard<'_, Inner> {
        self.inner.lock().await
    }

    /// Sends one message and flushes.
    pub(crate) async fn send(&self, msg: &Msg) -> Result<(), LinkError> {
        let mut g = self.lock().await;
        g.put(msg).await?;
        g.flush().await
    }
}

impl Inner {
    /// Writes one message (buffered).
    pub(crate) async fn put(&mut self, msg: &Msg) -> Result<(), LinkError> {
        self.head.clear();
        msg.encode(&mut self.head);
        bounded(self.deadline, self.w.write_all(&self.head)).await
    }

    /// Writes a `Buffer` whose frames are `frames` (straight from shared memory).
    pub(crate) async fn put_buffer(
        &mut self,
        channel: u32,
        backlog: u32,
        offset: u32,
        frames: &[u8],
    ) -> Result<(), LinkError> {
        self.head.clear();
        wire::put_buffer_head(&mut self.head, channel, backlog, offset, frames.len());
        if frames.len() < STRAIGHT {
            bounded(self.deadline, self.w.write_all(&self.head)).await?;
            return bounded(self.deadline, self.w.write_all(frames)).await;
        }
        // What was gathered goes first, then the head and the frames in one gathering write
        // (`write_all_buf` writes vectored where the stream does: TCP; TLS encrypts a copy).
        bounded(self.deadline, self.w.flush()).await?;
        let mut both = bytes::Buf::chain(&self.head[..], frames);
        bounded(self.deadline, self.w.get_mut().write_all_buf(&mut both)).await
    }

    pub(crate) async fn flush(&mut self) -> Result<(), LinkError> {
        bounded(self.deadline, self.w.flush()).await
    }

    /// Ends the connection's writing side (the peer reads end of stream).
    pub(crate) async fn shutdown(&mut self) {
        let _ = bounded(self.deadline, self.w.shutdown()).await;
    }
}

/// Sends a heartbeat every `every` until `stop`, so that a peer that hears nothing for its
/// `dead_after` can take this side as dead. A failed write ends it (the reader finds out).
pub(crate) fn heartbeats(w: Arc<Writer>, every: Duration, stop: CancellationToken) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {
                    if w.send(&Msg::Heartbeat).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
}

/// The next message, or the reason there is none: end of stream is `Ok(None)`, silence for
/// `dead_after` is `PeerSilent`.
pub(crate) async fn next(r: &mut Reader, dead_after: Duration) -> Result<Option<Msg>, LinkError> {
    let next =
        std::future::poll_fn(|cx| futures_core::Stream::poll_next(std::pin::Pin::new(&mut *r), cx));
    match tokio::time::timeout(dead_after, next).await {
        Err(_) => Err(LinkError::PeerSilent {
            silent_for: dead_after,
        }),
        Ok(None) => Ok(None),
        Ok(Some(r)) => r.map(Some),
    }
}

/// How a channel's task ended.
pub(crate) enum ChannelEnd {
    /// With an outcome of its own.
    Done(Result<Ended, LinkError>),
    /// Cut short because its connection ended: what ended the connection is its outcome.
    Cut,
}

impl ChannelEnd {
    /// The outcome to report, `connection` being what ended the connection, if anything.
    pub(crate) fn outcome(self, connection: Option<&LinkError>) -> Result<Ended, LinkError> {
        match self {
            ChannelEnd::Done(r) => r,
            // (A connection ends without an error only after every channel did.)
            ChannelEnd::Cut => Err(connection.cloned().unwrap_or(LinkError::PeerClosed)),
        }
    }
}

/// Ends a connection that failed with `e`: sends `Error` for the whole connection, best
/// effort, and ends the writing side — unless the peer cannot read it anyway (the connection
/// broke, or the peer is silent or reads nothing).
pub(crate) async fn refuse(w: &Writer, e: &LinkError) {
    if matches!(
        e,
        LinkError::Io(_)
            | LinkError::PeerClosed
            | LinkError::PeerSilent { .. }
            | LinkError::PeerNotReading { .. }
    ) {
        return;
    }
    let code = match e {
        LinkError::Protocol(_) => wire::code::PROTOCOL,
        _ => wire::code::LOCAL,
    };
    // Bounded: a peer that reads nothing does not keep this side waiting.
    let Ok(mut g) = tokio::time::timeout(Duration::from_secs(1), w.lock()).await else {
        return;
    };
    let _ = g
        .put(&Msg::Error {
            channel: wire::CONNECTION,
            code,
            message: e.to_string(),
        })
        .await;
    let _ = g.flush().await;
    g.shutdown().await;
}

/// An end held by a bridge: if the bridge's future is dropped before it ended the channel
/// (its `run` was cancelled, its runtime shut down), the end detaches as `LOST`, so that the
/// local peer sees `PeerDead` instead of a clean end of a cut stream.
pub(crate) struct Held<T: Lose>(Option<T>);

/// Detaching as `LOST`.
pub(crate) trait Lose {
    fn lose(self);
}

impl Lose for crate::endpoint::consumer::Consumer {
    fn lose(self) {
        self.raw_lose()
    }
}

impl Lose for crate::endpoint::producer::Producer {
    fn lose(self) {
        self.raw_lose()
    }
}

impl<T: Lose> Held<T> {
    pub(crate) fn new(t: T) -> Held<T> {
        Held(Some(t))
    }

    /// The end, for the bridge to end the channel its own way.
    pub(crate) fn take(mut self) -> T {
        self.0.take().expect("held until taken")
    }
}

impl<T: Lose> std::ops::Deref for Held<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("held until taken")
    }
}

impl<T: Lose> std::ops::DerefMut for Held<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0.as_mut().expect("held until taken")
    }
}

impl<T: Lose> Drop for Held<T> {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            t.lose();
        }
    }
}
