//! The byte streams timely's network threads read and write: a pair of shmflow channels
//! between two processes of one host, or a socket.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};

use shmflow::{Consumer, Producer, RecvError, SendError, WaitStrategy};
use timely::communication::allocator::zero_copy::stream::Stream;

/// One process's end of a duplex byte stream over two shmflow channels (one each way), as
/// timely's network threads use a socket: its send thread writes (each `write` is one record
/// of at most a segment), its receive thread reads (a read takes every record already there
/// that fits). A write waits while the peer has not handed back a segment.
///
/// Clones share the two ends (`try_clone`, as a socket's clones share the socket); it is
/// `Send` and `Sync`, each half behind a lock of its own that its one thread takes.
#[derive(Clone)]
pub struct ShmStream {
    tx: Arc<Mutex<Option<Producer>>>,
    rx: Arc<Mutex<Reader>>,
    peer: Arc<str>,
}

/// The reading half: the consumer, and what is left of a record longer than the last read's
/// buffer.
struct Reader {
    rx: Option<Consumer>,
    rest: Vec<u8>,
    at: usize,
}

impl std::fmt::Debug for ShmStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmStream")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ShmStream {
    /// A stream that writes with `tx` and reads with `rx`, both connected to the process
    /// `peer` names (for messages), each waiting as `wait` says.
    pub fn new(mut tx: Producer, mut rx: Consumer, peer: &str, wait: WaitStrategy) -> ShmStream {
        tx.set_wait_strategy(wait);
        rx.set_wait_strategy(wait);
        ShmStream {
            tx: Arc::new(Mutex::new(Some(tx))),
            rx: Arc::new(Mutex::new(Reader {
                rx: Some(rx),
                rest: Vec::new(),
                at: 0,
            })),
            peer: peer.into(),
        }
    }

    /// The process at the other end, as the hostfile names it.
    pub fn peer(&self) -> &str {
        &self.peer
    }
}

fn recv_error(peer: &str, e: RecvError) -> io::Error {
    let kind = match e {
        RecvError::PeerDead(_) => io::ErrorKind::ConnectionReset,
        RecvError::ProducerFailed(_) | RecvError::RecordAborted(_) => {
            io::ErrorKind::ConnectionAborted
        }
        _ => io::ErrorKind::InvalidData,
    };
    io::Error::new(kind, format!("from {peer}: {e}"))
}

fn send_error(peer: &str, e: SendError) -> io::Error {
    let kind = match e {
        SendError::PeerDead(_) => io::ErrorKind::ConnectionReset,
        SendError::Closed(_) => io::ErrorKind::BrokenPipe,
        _ => io::ErrorKind::InvalidData,
    };
    io::Error::new(kind, format!("to {peer}: {e}"))
}

impl Read for ShmStream {
    /// The next bytes the peer wrote, waiting for them; `Ok(0)` once the peer shut its
    /// writing half down (or dropped it) and everything before was read.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut g = lock(&self.rx);
        let Reader { rx, rest, at } = &mut *g;
        if *at < rest.len() {
            let n = buf.len().min(rest.len() - *at);
            buf[..n].copy_from_slice(&rest[*at..*at + n]);
            *at += n;
            return Ok(n);
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let Some(rx) = rx.as_mut() else {
            return Ok(0);
        };
        let n = {
            let record = match rx.recv() {
                Ok(Some(r)) => r,
                Ok(None) => return Ok(0),
                Err(e) => return Err(recv_error(&self.peer, e)),
            };
            let copied;
            let bytes = match record.as_bytes() {
                Some(b) => b,
                None => {
                    copied = record.to_vec().map_err(|e| recv_error(&self.peer, e))?;
                    &copied[..]
                }
            };
            let n = buf.len().min(bytes.len());
            buf[..n].copy_from_slice(&bytes[..n]);
            if n < bytes.len() {
                rest.clear();
                rest.extend_from_slice(&bytes[n..]);
                *at = 0;
                return Ok(n);
            }
            n
        };
        // What else is there already goes in the same read, as a socket's read takes every
        // byte that arrived: fewer, larger reads for timely's receive loop.
        let mut filled = n;
        while filled < buf.len() {
            let record = match rx.try_recv() {
                Ok(Some(r)) => r,
                _ => break,
            };
            let Some(bytes) = record.as_bytes() else {
                // (A record that spans segments waits for its next read.)
                let copied = record.to_vec().map_err(|e| recv_error(&self.peer, e))?;
                rest.clear();
                rest.extend_from_slice(&copied);
                *at = 0;
                break;
            };
            let k = (buf.len() - filled).min(bytes.len());
            buf[filled..filled + k].copy_from_slice(&bytes[..k]);
            filled += k;
            if k < bytes.len() {
                rest.clear();
                rest.extend_from_slice(&bytes[k..]);
                *at = 0;
                break;
            }
        }
        Ok(filled)
    }
}

impl Write for ShmStream {
    /// Sends up to a segment of `buf` as one record, waiting for a free segment; returns how
    /// much went.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut g = lock(&self.tx);
        let tx = g.as_mut().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("to {}: the writing half was shut down", self.peer),
            )
        })?;
        let n = buf.len().min(tx.max_unspanned_len().max(1));
        tx.send(&buf[..n]).map_err(|e| send_error(&self.peer, e))?;
        Ok(n)
    }

    /// Nothing to do: every write is published as it is sent.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Stream for ShmStream {
    fn try_clone(&self) -> io::Result<Self> {
        Ok(self.clone())
    }

    /// Blocking only (what timely asks for); non-blocking mode is refused.
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        if nonblocking {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a shmflow stream reads and writes in blocking mode only",
            ));
        }
        Ok(())
    }

    /// Shutting the writing half ends the peer's stream after what was written; shutting the
    /// reading half detaches from the peer's channel (its writes then fail).
    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        if matches!(how, Shutdown::Write | Shutdown::Both) {
            if let Some(tx) = lock(&self.tx).take() {
                tx.close();
            }
        }
        if matches!(how, Shutdown::Read | Shutdown::Both) {
            lock(&self.rx).rx = None;
        }
        Ok(())
    }
}

/// A link between two processes of a cluster: shmflow channels on one host, a TCP
/// connection between hosts (or, where asked for, a Unix or TCP socket on one host).
#[derive(Debug)]
pub enum Link {
    /// Two shmflow channels.
    Shm(ShmStream),
    /// A TCP connection.
    Tcp(TcpStream),
    /// A Unix stream socket.
    Unix(UnixStream),
}

impl Read for Link {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Link::Shm(s) => s.read(buf),
            Link::Tcp(s) => s.read(buf),
            Link::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Link {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Link::Shm(s) => s.write(buf),
            Link::Tcp(s) => s.write(buf),
            Link::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Link::Shm(s) => s.flush(),
            Link::Tcp(s) => s.flush(),
            Link::Unix(s) => s.flush(),
        }
    }
}

impl Stream for Link {
    fn try_clone(&self) -> io::Result<Self> {
        Ok(match self {
            Link::Shm(s) => Link::Shm(s.clone()),
            Link::Tcp(s) => Link::Tcp(s.try_clone()?),
            Link::Unix(s) => Link::Unix(s.try_clone()?),
        })
    }

    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        match self {
            Link::Shm(s) => Stream::set_nonblocking(s, nonblocking),
            Link::Tcp(s) => s.set_nonblocking(nonblocking),
            Link::Unix(s) => s.set_nonblocking(nonblocking),
        }
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Link::Shm(s) => Stream::shutdown(s, how),
            Link::Tcp(s) => s.shutdown(how),
            Link::Unix(s) => s.shutdown(how),
        }
    }
}
