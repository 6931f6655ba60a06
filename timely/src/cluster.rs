//! Connecting the processes of a cluster: each pair once, by the hostfile's addresses.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use shmflow::{Consumer, Geometry, Producer, WaitStrategy};

use crate::stream::{Link, ShmStream};

/// How two processes of one host are linked (processes of different hosts always over TCP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Local {
    /// Two anonymous shmflow channels, one each way (the default).
    Shm,
    /// A Unix stream socket.
    Unix,
    /// A TCP connection, as timely's own start-up makes.
    Tcp,
}

/// How a cluster's links are made.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Options {
    /// How processes of one host are linked.
    pub local: Local,
    /// The geometry of each shmflow channel (one per direction and pair of processes): its
    /// pool bounds what one process can have in flight towards another.
    pub geometry: Geometry,
    /// How long to keep trying to reach a process that has not started listening yet, and to
    /// wait for the processes that connect to this one.
    pub connect_for: Duration,
    /// How timely's network threads wait on a shmflow link: the library's default, `Block`
    /// (looks for up to 50 µs, then sleeps), or `Park` (sleeps at once, as a socket read
    /// does; each sleep costs a system-wide barrier, which made timely's exchange 30 % slower
    /// on a 2-vCPU VM).
    pub wait: WaitStrategy,
}

impl Default for Options {
    /// shmflow between processes of one host, channels of 16 segments of 256 KiB (4 MiB in
    /// flight per direction), the default wait, a minute to connect.
    fn default() -> Options {
        Options {
            local: Local::Shm,
            geometry: Geometry {
                segment_size: 256 << 10,
                segment_count: 16,
            },
            connect_for: Duration::from_secs(60),
            wait: WaitStrategy::Block,
        }
    }
}

impl Options {
    /// The defaults, with `SHMFLOW_TIMELY_LOCAL` (`shm`, `unix` or `tcp`) choosing how
    /// processes of one host are linked and `SHMFLOW_TIMELY_WAIT` (`block` or `park`) how a
    /// shmflow link waits.
    ///
    /// # Errors
    /// A value of `SHMFLOW_TIMELY_LOCAL` that is none of the three.
    pub fn from_env() -> Result<Options, String> {
        let mut o = Options::default();
        if let Ok(v) = std::env::var("SHMFLOW_TIMELY_WAIT") {
            o.wait = match v.as_str() {
                "park" => WaitStrategy::Park,
                "block" => WaitStrategy::Block,
                other => {
                    return Err(format!(
                        "SHMFLOW_TIMELY_WAIT is park or block, not {other:?}"
                    ))
                }
            };
        }
        if let Ok(v) = std::env::var("SHMFLOW_TIMELY_LOCAL") {
            o.local = match v.as_str() {
                "shm" => Local::Shm,
                "unix" => Local::Unix,
                "tcp" => Local::Tcp,
                other => {
                    return Err(format!(
                        "SHMFLOW_TIMELY_LOCAL is shm, unix or tcp, not {other:?}"
                    ))
                }
            };
        }
        Ok(o)
    }
}

/// The host part of a `host:port` address.
fn host(address: &str) -> &str {
    address.rsplit_once(':').map_or(address, |(h, _)| h)
}

/// The abstract Unix socket a process listens on for the processes of its host: named after
/// its address, so that two clusters of one host cannot mix (the second to bind fails, as
/// with a TCP port).
fn unix_name(address: &str) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("shmflow-timely/{address}"))
}

/// Links this process (`me`, its address `addresses[me]`) with every other process of the
/// cluster: `None` at `me`, as timely's `initialize_networking_from_sockets` takes them.
/// Process `i` reaches every process below it and waits for every one above it; two
/// processes are on one host when their addresses' host parts are equal.
///
/// # Errors
/// An address this process cannot listen on (or whose Unix name is taken: another cluster
/// with the same hostfile runs on this host), a process not reached within
/// `options.connect_for`, a peer that says it is another process than expected, or a shmflow
/// channel that cannot be made or opened; each names the process concerned.
pub fn connect(
    addresses: &[String],
    me: usize,
    options: &Options,
) -> io::Result<Vec<Option<Link>>> {
    let n = addresses.len();
    if me >= n {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("process {me} of a cluster of {n}"),
        ));
    }
    let local =
        |j: usize| options.local != Local::Tcp && host(&addresses[j]) == host(&addresses[me]);
    let deadline = Instant::now() + options.connect_for;
    let above_remote = (me + 1..n).any(|j| !local(j));
    let above_local = (me + 1..n).any(local);
    // Listening first: a process below may be waiting to be reached.
    let tcp = if above_remote {
        let l = TcpListener::bind(&addresses[me])
            .map_err(|e| io::Error::new(e.kind(), format!("listen on {}: {e}", addresses[me])))?;
        l.set_nonblocking(true)?;
        Some(l)
    } else {
        None
    };
    let unix = if above_local {
        let l = UnixListener::bind_addr(&unix_name(&addresses[me])?).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "listen for the processes of this host as {}: {e} (does another cluster with \
                     this address run here?)",
                    addresses[me]
                ),
            )
        })?;
        l.set_nonblocking(true)?;
        Some(l)
    } else {
        None
    };
    let mut links: Vec<Option<Link>> = (0..n).map(|_| None).collect();
    for (i, slot) in links.iter_mut().enumerate().take(me) {
        let link = if local(i) {
            let mut s = retry(deadline, &addresses[i], || {
                UnixStream::connect_addr(&unix_name(&addresses[i])?)
            })?;
            s.write_all(&(me as u64).to_le_bytes())?;
            match options.local {
                Local::Shm => Link::Shm(receive_channels(&mut s, &addresses[i], options.wait)?),
                _ => Link::Unix(s),
            }
        } else {
            let mut s = retry(deadline, &addresses[i], || {
                TcpStream::connect(&addresses[i])
            })?;
            s.set_nodelay(true)?;
            s.write_all(&(me as u64).to_le_bytes())?;
            Link::Tcp(s)
        };
        *slot = Some(link);
    }
    let mut waiting = n - me - 1;
    while waiting > 0 {
        let mut accepted = false;
        if let Some(l) = &tcp {
            match l.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false)?;
                    s.set_nodelay(true)?;
                    let j = peer_index(&mut s, me, n, &links, |j| !local(j))?;
                    links[j] = Some(Link::Tcp(s));
                    waiting -= 1;
                    accepted = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        if let Some(l) = &unix {
            match l.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false)?;
                    let j = peer_index(&mut s, me, n, &links, local)?;
                    links[j] = Some(match options.local {
                        Local::Shm => Link::Shm(send_channels(
                            &mut s,
                            &addresses[j],
                            options.geometry,
                            options.wait,
                        )?),
                        _ => Link::Unix(s),
                    });
                    waiting -= 1;
                    accepted = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        if !accepted {
            if Instant::now() > deadline {
                let missing: Vec<&str> = (me + 1..n)
                    .filter(|&j| links[j].is_none())
                    .map(|j| addresses[j].as_str())
                    .collect();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no connection from {} within {:?}",
                        missing.join(", "),
                        options.connect_for
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(links)
}

/// `connect()` until it succeeds or the deadline passes.
fn retry<S>(
    deadline: Instant,
    to: &str,
    mut connect: impl FnMut() -> io::Result<S>,
) -> io::Result<S> {
    loop {
        match connect() {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() > deadline => {
                return Err(io::Error::new(e.kind(), format!("reach {to}: {e}")))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// The index a connecting process announces: one above `me`, of the right kind (`fits`), not
/// connected yet.
fn peer_index(
    s: &mut impl Read,
    me: usize,
    n: usize,
    links: &[Option<Link>],
    fits: impl Fn(usize) -> bool,
) -> io::Result<usize> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    let j = u64::from_le_bytes(b);
    match usize::try_from(j) {
        Ok(j) if j > me && j < n && links[j].is_none() && fits(j) => Ok(j),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "a process connected as process {j}, which is not one this process {me} of {n} \
                 waits for"
            ),
        )),
    }
}

/// The accepting side of a pair on one host: makes the two channels, hands the peer its ends
/// (the descriptors, over the Unix socket), and waits until it says it has them.
fn send_channels(
    s: &mut UnixStream,
    peer: &str,
    geometry: Geometry,
    wait: WaitStrategy,
) -> io::Result<ShmStream> {
    let shm = |e: shmflow::Error| io::Error::other(format!("a channel with {peer}: {e}"));
    let (tx, theirs_rx) = Producer::create_anonymous(geometry).map_err(|e| shm(e.into()))?;
    let (rx, theirs_tx) = Consumer::create_anonymous(geometry).map_err(|e| shm(e.into()))?;
    let fds = [theirs_rx.as_fd().as_raw_fd(), theirs_tx.as_fd().as_raw_fd()];
    let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
    nix::sys::socket::sendmsg::<()>(
        s.as_raw_fd(),
        &[IoSlice::new(&[1])],
        &cmsg,
        nix::sys::socket::MsgFlags::empty(),
        None,
    )
    .map_err(io::Error::from)?;
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack)
        .map_err(|e| io::Error::new(e.kind(), format!("{peer} did not open its channels: {e}")))?;
    drop((theirs_rx, theirs_tx));
    Ok(ShmStream::new(tx, rx, peer, wait))
}

/// The connecting side of a pair on one host: takes the two descriptors, opens its ends, says
/// so.
fn receive_channels(s: &mut UnixStream, peer: &str, wait: WaitStrategy) -> io::Result<ShmStream> {
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 2]);
    let msg = nix::sys::socket::recvmsg::<()>(
        s.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        nix::sys::socket::MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let nix::sys::socket::ControlMessageOwned::ScmRights(got) = c {
            // SAFETY: descriptors received with SCM_RIGHTS are new ones of this process,
            // owned by nothing else yet.
            fds.extend(
                got.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    let [theirs_rx, theirs_tx] = <[OwnedFd; 2]>::try_from(fds).map_err(|got| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{peer} handed over {} descriptors, not the two of its channels",
                got.len()
            ),
        )
    })?;
    let shm = |e: shmflow::OpenError| io::Error::other(format!("a channel from {peer}: {e}"));
    let rx = Consumer::from_fd(theirs_rx.as_fd()).map_err(shm)?;
    let tx = Producer::from_fd(theirs_tx.as_fd()).map_err(shm)?;
    s.write_all(&[1])?;
    Ok(ShmStream::new(tx, rx, peer, wait))
}
