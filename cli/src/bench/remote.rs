//! `shmflow bench --only remote`: remote channels (`shmflow::net`, over loopback TCP)
//! against a raw TCP stream, in the same run and between the same kind of processes.
//!
//! Throughput: this process writes, a child reads, every figure the median of the repeats.
//! - `remote_*`: through the bridges (a producer thread into a local channel that a
//!   `net::Server` forwards; in the child a `net::Client` writing into its local channel, a
//!   consumer thread reading it), every setting at its default; `remote_small` with `send` and
//!   `recv`, `remote_small_batch` with the forms for small records (`claim_batch` of 64, and
//!   `try_drain`); `remote_bulk` written in place as `direct_bulk` is, `remote_bulk_send` with
//!   `send` from a buffer and the default geometry;
//! - `direct_*`: direct ends (`net::Listener::accept_producer` here, `net::connect_consumer`
//!   in the child): no bridge, no runtime. `direct_small_rps` with `FlushPolicy::Explicit`
//!   (whole segments), `direct_small_batch_*` the same with `claim_batch` and `try_drain`,
//!   `direct_small_timeout_1ms_rps` with a 1 ms buffer timeout,
//!   `direct_small_every_record_rps` with the default (a write per record); `direct_bulk` with
//!   the default policy, records written in place (`claim`, segments of 256 KiB: the record is
//!   serialized where it is sent from, as the raw TCP loop writes the buffer it would have
//!   serialized into; neither loop writes the bytes), `direct_bulk_send` with `send` from a
//!   buffer (one more copy) and the default geometry; `direct_small_64k_seg_*` as
//!   `direct_small_rps` with segments of 64 KiB, the raw TCP stream's write size (each
//!   segment is one write: the default 32 KiB segments make twice the writes, reads and
//!   wake-ups of the TCP stream per byte);
//! - `tcp_64k_gbps`: a raw TCP stream with 64 KiB writes and reads between the same two
//!   processes, and `tcp_64k_rps64` the same bytes counted as 64 B records;
//! - `tcp_framed_rps64`: 64 B records framed by hand over a raw TCP stream, the ceiling of any
//!   transport that carries them one by one: the writer copies each record behind an 8-byte
//!   header into a 32 KiB buffer (a segment's framing and size) and writes the buffer when the
//!   next record does not fit; the reader reads whole buffers and walks their frames, checking
//!   each length and touching the record, as a direct consumer does in place.
//!
//! `*_small_*` carry 64 B records, `*_bulk_*` 64 KiB records. `*_cpu_s_per_gb`: CPU seconds
//! (user + system, every thread of both processes, from `getrusage`) per GB carried, over the
//! whole run (set-up included).
//!
//! Round trip: a number goes to the child over one channel and comes back over another (one
//! connection each way; every end blocking with the default wait and flush policy);
//! `tcp_pingpong_rtt` is 8 bytes written and echoed on a raw TCP connection (`TCP_NODELAY`);
//! `tcp_two_conn_rtt` the same over two raw TCP connections, one each way, the shape of a
//! pair of channels (each data segment then has its acknowledgement to itself).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use shmflow::net::{connect_consumer, Client, Config, Listener, Server};
use shmflow::{Geometry, Producer, WaitStrategy};

use super::harness::{
    child, finished, parse_report, records_per_look, send_batched, touch, LineBuf, LineRec, REC,
    RTT_G,
};
use super::roles::Role;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A loopback port nobody listens on now.
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("a port");
    l.local_addr().expect("its address").port()
}

/// Connects, retrying while the peer starts.
async fn connect(addr: SocketAddr) -> Client {
    let start = Instant::now();
    loop {
        match Client::connect(addr, Config::default()).await {
            Ok(c) => return c,
            Err(e) if start.elapsed() > Duration::from_secs(20) => panic!("{e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// Records of `len` bytes for `secs`, over a remote channel, written as `write` says (and read
/// by draining for [`Writes::Batch`]): (records, nanoseconds) as the child counted them.
pub(crate) fn remote_stream(secs: f64, len: usize, write: Writes) -> Streamed {
    with_cpu(|| remote_stream_inner(secs, len, write))
}

fn remote_stream_inner(secs: f64, len: usize, write: Writes) -> (f64, f64) {
    let rt = runtime();
    let g = write.geometry();
    let (mut p, c) = shmflow::pair(g).unwrap();
    let (server, port) = rt.block_on(async {
        let mut s = Server::bind(loopback(0), Config::default()).await.unwrap();
        s.export("bench", c).unwrap();
        let port = s.local_addr().unwrap().port();
        (tokio::spawn(s.run()), port)
    });
    let sink = Role::RemoteSink {
        port,
        segment_size: g.segment_size,
        segment_count: g.segment_count,
        read: write.read(),
    };
    let kid = child(&sink, &[], |_| {});
    write_for(&mut p, secs, len, write);
    drop(p);
    let report = rt.block_on(server).unwrap();
    assert!(report.channels[0].result.is_ok(), "{report:?}");
    parse_report(&finished(kid))
}

/// The sending loop of the streams: records of `len` bytes for `secs`, written as `write`
/// says, the clock read once per [`records_per_look`] records.
fn write_for(p: &mut Producer, secs: f64, len: usize, write: Writes) {
    let line = LineBuf::new(len);
    let rec = line.bytes();
    let per_look = records_per_look(len);
    let end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        match write {
            Writes::Send | Writes::SendWide => {
                for _ in 0..per_look {
                    p.send(rec).unwrap();
                }
            }
            Writes::InPlace => {
                for _ in 0..per_look {
                    p.claim(len).unwrap().commit();
                }
            }
            Writes::Batch => send_batched(p, rec, per_look),
        }
    }
}

/// Reads every record to the end as `read` says, touching every byte in place: (records,
/// nanoseconds from the first).
pub(crate) fn read_all(rx: &mut shmflow::Consumer, read: SinkRead) -> Result<(u64, u128), String> {
    if read == SinkRead::Drain {
        let (n, sum, start) = super::local::sink_records(rx)?;
        std::hint::black_box(sum);
        return Ok((n, start.map(|s| s.elapsed().as_nanos()).unwrap_or(1)));
    }
    let (mut n, mut sum, mut start) = (0u64, 0u64, None);
    while let Some(mut r) = rx.recv().map_err(|e| e.to_string())? {
        start.get_or_insert_with(Instant::now);
        match r.as_bytes() {
            Some(b) => sum = sum.wrapping_add(touch(b)),
            // A record larger than a segment: every part touched in place, as the TCP
            // reader touches what it read.
            None => {
                while let Some(part) = r.next_part().map_err(|e| e.to_string())? {
                    sum = sum.wrapping_add(touch(part));
                }
            }
        }
        n += 1;
    }
    std::hint::black_box(sum);
    Ok((n, start.map(|s| s.elapsed().as_nanos()).unwrap_or(1)))
}

/// CPU time (user + system) of this process's threads and of its waited-for children, in
/// nanoseconds.
fn cpu_ns() -> (f64, f64) {
    let of = |who| {
        // SAFETY: `getrusage` fills the zeroed struct it is given and reads nothing else.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `u` is a valid, writable `rusage`.
        unsafe { libc::getrusage(who, &mut u) };
        let t = |tv: libc::timeval| tv.tv_sec as f64 * 1e9 + tv.tv_usec as f64 * 1e3;
        t(u.ru_utime) + t(u.ru_stime)
    };
    (of(libc::RUSAGE_SELF), of(libc::RUSAGE_CHILDREN))
}

/// A measured stream: what the reader counted, and the CPU both processes spent.
pub(crate) struct Streamed {
    /// Records (or bytes, for raw TCP) the reader counted.
    pub(crate) count: f64,
    /// Nanoseconds from the reader's first record to its last.
    pub(crate) ns: f64,
    /// CPU nanoseconds of both processes, every thread, over the whole run.
    pub(crate) cpu_ns: f64,
}

impl Streamed {
    /// CPU seconds per GB carried, for `bytes` carried in all.
    pub(crate) fn cpu_s_per_gb(&self, bytes: f64) -> f64 {
        self.cpu_ns / 1e9 / (bytes / 1e9)
    }
}

/// Runs `run` (which spawns a child and waits for it), and counts the CPU of both processes.
fn with_cpu(run: impl FnOnce() -> (f64, f64)) -> Streamed {
    let (s0, c0) = cpu_ns();
    let (count, ns) = run();
    let (s1, c1) = cpu_ns();
    Streamed {
        count,
        ns,
        cpu_ns: (s1 - s0) + (c1 - c0),
    }
}

/// Segments for records written in place ([`Writes::InPlace`]): three 64 KiB records each.
pub(crate) const IN_PLACE_G: Geometry = Geometry {
    segment_size: 256 << 10,
    segment_count: 8,
};

/// How the sending loop writes its records.
#[derive(Clone, Copy)]
pub(crate) enum Writes {
    /// `send`, from a buffer (copied into the segment), default geometry.
    Send,
    /// `claim` and `commit`, in place ([`IN_PLACE_G`]): the record is serialized where it is
    /// sent from, as a raw TCP writer writes the buffer it serialized into (neither loop
    /// writes the bytes: both measure the transport).
    InPlace,
    /// `send`, from a buffer, into segments of 64 KiB ([`WIDE_G`]): each segment one write
    /// of the raw TCP stream's size.
    SendWide,
    /// `claim_batch` of up to 64 records, each copied into its place from a buffer, one commit
    /// a batch, default geometry; the sink drains (`try_drain`): the forms a user of small
    /// records reaches for, as the local `small_batch` stream has them.
    Batch,
}

impl Writes {
    /// The segments of the stream's channel (both sides).
    fn geometry(self) -> Geometry {
        match self {
            Writes::Send | Writes::Batch => Geometry::default(),
            Writes::InPlace => IN_PLACE_G,
            Writes::SendWide => WIDE_G,
        }
    }

    /// How the sink reads what this loop writes.
    fn read(self) -> SinkRead {
        match self {
            Writes::Batch => SinkRead::Drain,
            _ => SinkRead::Recv,
        }
    }
}

/// How a stream's sink reads its records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum SinkRead {
    /// `while let Some(r) = rx.recv()?`, each record in place (part by part if it spans
    /// segments).
    Recv,
    /// `try_drain` of everything there, `recv` only when nothing is (the loop of the local
    /// tuned sink; the consumer keeps its default wait strategy and counters).
    Drain,
}

/// Segments of the raw TCP stream's write size ([`Writes::SendWide`]), the default pool's
/// bytes.
pub(crate) const WIDE_G: Geometry = Geometry {
    segment_size: 64 << 10,
    segment_count: 32,
};

/// Records of `len` bytes for `secs` between direct ends (`net::Listener::accept_producer`
/// here, `net::connect_consumer` in a child): no bridge, no runtime; the producer's flush
/// policy `policy`.
pub(crate) fn direct_stream(
    secs: f64,
    len: usize,
    policy: shmflow::FlushPolicy,
    write: Writes,
) -> Streamed {
    with_cpu(|| {
        let l = Listener::bind(loopback(0), Config::default()).unwrap();
        let port = l.local_addr().unwrap().port();
        let g = write.geometry();
        let sink = Role::DirectSink {
            port,
            segment_size: g.segment_size,
            segment_count: g.segment_count,
            read: write.read(),
        };
        let kid = child(&sink, &[], |_| {});
        let mut p = l.accept_producer("bench", g).unwrap();
        p.set_flush_policy(policy);
        write_for(&mut p, secs, len, write);
        p.close_timeout(Duration::from_secs(30)).unwrap();
        parse_report(&finished(kid))
    })
}

/// The child of [`direct_stream`], with the stream's segment geometry, reading as `read` says.
pub(crate) fn direct_sink(port: u16, g: Geometry, read: SinkRead) -> Result<(), String> {
    let mut rx = connect_consumer(loopback(port), "bench", g, Config::default())
        .map_err(|e| e.to_string())?;
    let (n, ns) = read_all(&mut rx, read)?;
    println!("{n} {ns}");
    Ok(())
}

/// How the ends of a direct round trip wait for the reply: at the default `Block` (a bounded
/// look, each reading the socket without waiting, before a blocking read), or blocking in the
/// read at once (`Park`), as a raw TCP ping-pong does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum RttWait {
    Block,
    Park,
}

impl RttWait {
    fn strategy(self) -> WaitStrategy {
        match self {
            RttWait::Block => WaitStrategy::Block,
            RttWait::Park => WaitStrategy::Park,
        }
    }
}

/// Round trips between direct ends: a number goes to the child over one connection and comes
/// back over another (sorted nanoseconds), every end waiting as `wait` says.
pub(crate) fn direct_rtt(rounds: usize, wait: RttWait) -> Vec<u64> {
    let l = Listener::bind(loopback(0), Config::default()).unwrap();
    let port = l.local_addr().unwrap().port();
    let back = free_port();
    let kid = child(&Role::DirectEcho { port, back, wait }, &[], |_| {});
    let mut ping = l.accept_producer("ping", RTT_G).unwrap();
    let start = Instant::now();
    let mut pong = loop {
        match connect_consumer(loopback(back), "pong", RTT_G, Config::default()) {
            Ok(c) => break c,
            Err(e) if start.elapsed() > Duration::from_secs(20) => panic!("{e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    ping.set_wait_strategy(wait.strategy());
    pong.set_wait_strategy(wait.strategy());
    let v = super::harness::time_rounds(rounds, |i| {
        ping.send_pod(&i).unwrap();
        let r = pong.recv().unwrap().unwrap();
        assert_eq!(r.as_pod::<u64>(), Some(&i));
    });
    drop(ping);
    while pong.recv().unwrap().is_some() {}
    finished(kid);
    v
}

/// The child of [`direct_rtt`]: listens on `back` for "pong", requests "ping", echoes.
pub(crate) fn direct_echo(port: u16, back: u16, wait: RttWait) -> Result<(), String> {
    let l = Listener::bind(loopback(back), Config::default()).map_err(|e| e.to_string())?;
    let mut ping = connect_consumer(loopback(port), "ping", RTT_G, Config::default())
        .map_err(|e| e.to_string())?;
    let mut pong = l
        .accept_producer("pong", RTT_G)
        .map_err(|e| e.to_string())?;
    ping.set_wait_strategy(wait.strategy());
    pong.set_wait_strategy(wait.strategy());
    while let Some(r) = ping.recv().map_err(|e| e.to_string())? {
        let v = *r.as_pod::<u64>().ok_or("not a number")?;
        pong.send_pod(&v).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The child of [`remote_stream`], with the stream's segment geometry, reading as `read` says.
pub(crate) fn remote_sink(port: u16, g: Geometry, read: SinkRead) -> Result<(), String> {
    let rt = runtime();
    let (tx, mut rx) = shmflow::pair(g).map_err(|e| e.to_string())?;
    let reader = std::thread::spawn(move || read_all(&mut rx, read));
    let outcomes = rt.block_on(async {
        let mut c = connect(loopback(port)).await;
        c.import("bench", tx).unwrap();
        c.run().await
    });
    // (The reader's own error first: a reader that failed drops its consumer, and the
    // bridge then fails for want of one.)
    let read = reader.join().map_err(|_| "reader panicked")?;
    if let Err(e) = &outcomes[0].result {
        return Err(read.err().unwrap_or_else(|| e.to_string()));
    }
    let (n, ns) = read?;
    println!("{n} {ns}");
    Ok(())
}

/// A raw TCP stream with 64 KiB writes for `secs`: (bytes, nanoseconds) as the child read
/// them.
pub(crate) fn tcp_stream(secs: f64) -> Streamed {
    with_cpu(|| tcp_stream_inner(secs))
}

fn tcp_stream_inner(secs: f64) -> (f64, f64) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let kid = child(&Role::TcpSink { port }, &[], |_| {});
    let (mut s, _) = l.accept().unwrap();
    s.set_nodelay(true).unwrap();
    let line = LineBuf::new(64 << 10);
    let buf = line.bytes();
    let end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        s.write_all(buf).unwrap();
    }
    drop(s);
    parse_report(&finished(kid))
}

/// The child of [`tcp_stream`]: reads to the end, touching every record of 64 bytes.
pub(crate) fn tcp_sink(port: u16) -> Result<(), String> {
    let mut s = TcpStream::connect(loopback(port)).map_err(|e| e.to_string())?;
    let (bytes, ns) = tcp_read_all(&mut s)?;
    println!("{bytes} {ns}");
    Ok(())
}

/// Bytes of a buffer of [`tcp_framed_stream`] (the default segment size).
const FRAMED_BUF: usize = 32 << 10;

/// Bytes of a frame's header in [`tcp_framed_stream`] (a segment's frame header).
const FRAMED_HEADER: usize = 8;

/// 64 B records framed by hand over a raw TCP stream for `secs` (see the module's notes):
/// (records, nanoseconds) as the child counted them.
pub(crate) fn tcp_framed_stream(secs: f64) -> Streamed {
    with_cpu(|| {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let kid = child(&Role::TcpFramedSink { port }, &[], |_| {});
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let rec = std::hint::black_box(LineRec::new());
        let rec = &rec.0;
        let frame = FRAMED_HEADER + REC;
        let mut buf = vec![0u8; FRAMED_BUF];
        let mut at = 0;
        let end = Instant::now() + Duration::from_secs_f64(secs);
        while Instant::now() < end {
            for _ in 0..records_per_look(REC) {
                if at + frame > FRAMED_BUF {
                    // The rest says "no more frames here" (a header of 0), as a seal does.
                    buf[at..].fill(0);
                    s.write_all(&buf).unwrap();
                    at = 0;
                }
                buf[at..at + FRAMED_HEADER].copy_from_slice(&(REC as u64).to_le_bytes());
                buf[at + FRAMED_HEADER..at + frame].copy_from_slice(rec);
                at += frame;
            }
        }
        buf[at..].fill(0);
        s.write_all(&buf).unwrap();
        drop(s);
        parse_report(&finished(kid))
    })
}

/// The child of [`tcp_framed_stream`]: reads whole buffers to the end, checks every frame's
/// length and touches its record.
pub(crate) fn tcp_framed_sink(port: u16) -> Result<(), String> {
    let mut s = TcpStream::connect(loopback(port)).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; FRAMED_BUF];
    let (mut n, mut sum, mut start) = (0u64, 0u64, None);
    loop {
        match s.read_exact(&mut buf) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e.to_string()),
        }
        start.get_or_insert_with(Instant::now);
        let mut at = 0;
        while at + FRAMED_HEADER <= FRAMED_BUF {
            let head: [u8; FRAMED_HEADER] = buf[at..at + FRAMED_HEADER].try_into().unwrap();
            let len = u64::from_le_bytes(head) as usize;
            if len == 0 {
                break;
            }
            let body = at + FRAMED_HEADER;
            if len > FRAMED_BUF - body {
                return Err(format!(
                    "a frame of {len} bytes at {at} overruns its buffer"
                ));
            }
            sum = sum.wrapping_add(touch(&buf[body..body + len]));
            n += 1;
            at = body + len.next_multiple_of(8);
        }
    }
    std::hint::black_box(sum);
    println!("{n} {}", start.map(|s| s.elapsed().as_nanos()).unwrap_or(1));
    Ok(())
}

/// Reads a raw TCP stream to the end with 64 KiB reads, touching every byte: (bytes,
/// nanoseconds from the first read).
pub(crate) fn tcp_read_all(s: &mut TcpStream) -> Result<(u64, u128), String> {
    let mut buf = vec![0u8; 64 << 10];
    let (mut bytes, mut sum, mut start) = (0u64, 0u64, None);
    loop {
        let n = s.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        start.get_or_insert_with(Instant::now);
        sum = sum.wrapping_add(touch(&buf[..n]));
        bytes += n as u64;
    }
    std::hint::black_box(sum);
    Ok((bytes, start.map(|s| s.elapsed().as_nanos()).unwrap_or(1)))
}

/// Round trips over two remote channels (sorted nanoseconds).
pub(crate) fn remote_rtt(rounds: usize) -> Vec<u64> {
    let rt = runtime();
    let (mut ping, ping_out) = shmflow::pair(RTT_G).unwrap();
    let (pong_in, mut pong) = shmflow::pair(RTT_G).unwrap();
    let back = free_port();
    let (server, port) = rt.block_on(async {
        let mut s = Server::bind(loopback(0), Config::default()).await.unwrap();
        s.export("ping", ping_out).unwrap();
        let port = s.local_addr().unwrap().port();
        (tokio::spawn(s.run()), port)
    });
    let kid = child(&Role::RemoteEcho { port, back }, &[], |_| {});
    let client = rt.spawn(async move {
        let mut c = connect(loopback(back)).await;
        c.import("pong", pong_in).unwrap();
        c.run().await
    });
    let v = super::harness::time_rounds(rounds, |i| {
        ping.send_pod(&i).unwrap();
        let r = pong.recv().unwrap().unwrap();
        assert_eq!(r.as_pod::<u64>(), Some(&i));
    });
    drop(ping);
    while pong.recv().unwrap().is_some() {}
    rt.block_on(server).unwrap();
    rt.block_on(client).unwrap();
    finished(kid);
    v
}

/// The child of [`remote_rtt`]: requests "ping", echoes into "pong", which it serves on
/// port `back`.
pub(crate) fn remote_echo(port: u16, back: u16) -> Result<(), String> {
    let rt = runtime();
    let (ping_in, mut ping) = shmflow::pair(RTT_G).map_err(|e| e.to_string())?;
    let (mut pong, pong_out): (Producer, _) = shmflow::pair(RTT_G).map_err(|e| e.to_string())?;
    let echo = std::thread::spawn(move || {
        while let Some(r) = ping.recv().unwrap() {
            let v = *r.as_pod::<u64>().unwrap();
            pong.send_pod(&v).unwrap();
        }
    });
    rt.block_on(async {
        let mut s = Server::bind(loopback(back), Config::default())
            .await
            .map_err(|e| e.to_string())?;
        s.export("pong", pong_out).map_err(|e| e.to_string())?;
        let server = tokio::spawn(s.run());
        let mut c = connect(loopback(port)).await;
        c.import("ping", ping_in).map_err(|e| e.to_string())?;
        c.run().await;
        server.await.map_err(|e| e.to_string())?;
        Ok::<_, String>(())
    })?;
    echo.join().map_err(|_| "echo panicked")?;
    Ok(())
}

/// Round trips of 8 bytes on a raw TCP connection (sorted nanoseconds).
pub(crate) fn tcp_rtt(rounds: usize) -> Vec<u64> {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let kid = child(&Role::TcpEcho { port }, &[], |_| {});
    let (mut s, _) = l.accept().unwrap();
    s.set_nodelay(true).unwrap();
    let mut buf = [0u8; 8];
    let v = super::harness::time_rounds(rounds, |i| {
        s.write_all(&i.to_le_bytes()).unwrap();
        s.read_exact(&mut buf).unwrap();
        assert_eq!(u64::from_le_bytes(buf), i);
    });
    drop(s);
    finished(kid);
    v
}

/// The child of [`tcp_rtt`].
/// [`tcp_rtt`] over two raw TCP connections, one each way, as a pair of channels runs (the
/// child connects twice: it reads the first and writes the second).
pub(crate) fn tcp_rtt_two(rounds: usize) -> Vec<u64> {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let kid = child(&Role::TcpEchoTwo { port }, &[], |_| {});
    let (mut ping, _) = l.accept().unwrap();
    let (mut pong, _) = l.accept().unwrap();
    ping.set_nodelay(true).unwrap();
    let mut buf = [0u8; 8];
    let v = super::harness::time_rounds(rounds, |i| {
        ping.write_all(&i.to_le_bytes()).unwrap();
        pong.read_exact(&mut buf).unwrap();
        assert_eq!(u64::from_le_bytes(buf), i);
    });
    drop(ping);
    finished(kid);
    v
}

/// The child of [`tcp_rtt_two`].
pub(crate) fn tcp_echo_two(port: u16) -> Result<(), String> {
    let mut ping = TcpStream::connect(loopback(port)).map_err(|e| e.to_string())?;
    let mut pong = TcpStream::connect(loopback(port)).map_err(|e| e.to_string())?;
    pong.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut buf = [0u8; 8];
    while ping.read_exact(&mut buf).is_ok() {
        pong.write_all(&buf).map_err(|e| e.to_string())?;
    }
    Ok(())
}

pub(crate) fn tcp_echo(port: u16) -> Result<(), String> {
    let mut s = TcpStream::connect(loopback(port)).map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut buf = [0u8; 8];
    while s.read_exact(&mut buf).is_ok() {
        s.write_all(&buf).map_err(|e| e.to_string())?;
    }
    Ok(())
}
