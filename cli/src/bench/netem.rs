//! `shmflow bench --only netem` (root): remote channels across a delayed link, against a raw
//! TCP stream on the same link, in the same run.
//!
//! The link: two network namespaces joined by a veth pair with `tc netem` delay on both ends
//! (the sender in one namespace, the receiver in the other, each a child process). Where the
//! kernel refuses netem (or namespaces), the delay is a relay in this process on loopback that
//! holds every byte for the delay in each direction; the output says which link was used. The
//! delay is one way, so a round trip takes twice that.
//!
//! For each delay (1 ms and 10 ms), MB/s as the receiving child counted them (shmflow's
//! records written in place with `claim`, as the raw TCP loop writes a buffer it does not
//! fill):
//! - `netem{d}_tcp_mbs`: raw TCP with 64 KiB writes;
//! - `netem{d}_direct_mbs` (direct ends) and `netem{d}_remote_mbs` (bridges), 64 KiB records,
//!   with enough credit: 512 segments of 256 KiB on each side (128 MiB; three 64 KiB records
//!   fill a segment, so 96 MiB of records, about four times what a round trip of 23 ms holds
//!   at 1 GB/s: a pool of 128 segments held the direct ends to about 0.75× raw TCP at 10 ms);
//! - `netem{d}_direct_pool4_mbs` and `netem{d}_remote_pool4_mbs`: a receiving pool of 4
//!   segments of 32 KiB, one record per segment, against `netem{d}_pool4_bound_mbs`, the
//!   credit-per-round-trip bound `4 × 32 KiB / RTT`: a sender can have no more than the
//!   receiver's free segments on the way. RTT is `netem{d}_link_rtt_us`, the median of 40 raw
//!   TCP ping-pongs across the link (at least twice the delay; a relay's timer, which fires
//!   on whole milliseconds, adds to it).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use shmflow::net::{connect_consumer, Client, Config, Listener, Server};
use shmflow::Geometry;

use super::harness::{child, done_undo, finished, parse_report, undo_on_failure};
use super::remote::{read_all, tcp_read_all, SinkRead};
use super::roles::Role;

/// The delays measured, one way, in milliseconds.
pub(crate) const DELAYS_MS: [u64; 2] = [1, 10];
/// Enough credit: 128 MiB (see the module's documentation).
const BIG: Geometry = Geometry {
    segment_size: 256 << 10,
    segment_count: 512,
};
/// The small pool whose credit bounds the throughput.
const POOL4: Geometry = Geometry {
    segment_size: 32 << 10,
    segment_count: 4,
};
const BULK: usize = 64 << 10;
const SECS: f64 = 3.0;
/// The sender's address in namespace A.
const NS_ADDR: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(10, 233, 0, 1), 7431));

/// What is measured: how it crosses, and with which pool and record length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    Tcp,
    Direct,
    Remote,
    /// The link's round trip: 8 bytes echoed on a raw TCP connection, 40 times.
    Ping,
}

fn config() -> Config {
    // The link is private to the bench (its own namespaces, or loopback): no TLS.
    Config::default().insecure_plaintext()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn in_ns(ns: &str, cmd: &[&str]) -> Result<(), String> {
    let mut args = vec!["netns", "exec", ns];
    args.extend_from_slice(cmd);
    run("ip", &args)
}

/// Two namespaces joined by a veth pair, netem's delay on both ends. Removed on drop.
struct Netns {
    a: String,
    b: String,
    devs: [String; 2],
}

impl Netns {
    fn setup() -> Result<Netns, String> {
        let id = std::process::id();
        let n = Netns {
            a: format!("shmflow-bench-a{id}"),
            b: format!("shmflow-bench-b{id}"),
            devs: [
                format!("sba{}", id % 100_000),
                format!("sbb{}", id % 100_000),
            ],
        };
        for ns in [&n.a, &n.b] {
            run("ip", &["netns", "add", ns])?;
            undo_on_failure(&["ip", "netns", "del", ns]);
        }
        let [va, vb] = &n.devs;
        run(
            "ip",
            &["link", "add", va, "type", "veth", "peer", "name", vb],
        )?;
        run("ip", &["link", "set", va, "netns", &n.a])?;
        run("ip", &["link", "set", vb, "netns", &n.b])?;
        in_ns(&n.a, &["ip", "addr", "add", "10.233.0.1/24", "dev", va])?;
        in_ns(&n.b, &["ip", "addr", "add", "10.233.0.2/24", "dev", vb])?;
        for (ns, dev) in [(&n.a, va), (&n.b, vb)] {
            in_ns(ns, &["ip", "link", "set", dev, "up"])?;
            in_ns(ns, &["ip", "link", "set", "lo", "up"])?;
            // A queue long enough that netem itself never drops at these rates.
            in_ns(
                ns,
                &[
                    "tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", "1ms", "limit",
                    "100000",
                ],
            )?;
        }
        Ok(n)
    }

    fn set_delay(&self, ms: u64) -> Result<(), String> {
        let d = format!("{ms}ms");
        for (ns, dev) in [(&self.a, &self.devs[0]), (&self.b, &self.devs[1])] {
            in_ns(
                ns,
                &[
                    "tc", "qdisc", "change", "dev", dev, "root", "netem", "delay", &d, "limit",
                    "100000",
                ],
            )?;
        }
        Ok(())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the veth pair, and the pair with it.
        for ns in [&self.a, &self.b] {
            let _ = run("ip", &["netns", "del", ns]);
            done_undo(&["ip", "netns", "del", ns]);
        }
    }
}

/// The delayed link the children talk across.
enum Link {
    Netem(Netns),
    /// The relay's runtime (it runs while this lives) and its delay, shared with its tasks.
    Relay(
        tokio::runtime::Runtime,
        std::sync::Arc<std::sync::atomic::AtomicU64>,
    ),
}

impl Link {
    fn setup() -> Link {
        match Netns::setup() {
            Ok(n) => {
                eprintln!("netem: two network namespaces, a veth pair, netem delay on both ends");
                Link::Netem(n)
            }
            Err(e) => {
                eprintln!(
                    "netem: not available ({e}); the delay is a relay in this process on \
                     loopback, holding every byte for the delay in each direction"
                );
                Link::Relay(runtime(), std::sync::Arc::new(0.into()))
            }
        }
    }

    fn set_delay(&self, ms: u64) -> Result<(), String> {
        match self {
            Link::Netem(n) => n.set_delay(ms),
            Link::Relay(_, d) => {
                d.store(ms, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
        }
    }

    /// Runs the sender and the receiver of `kind` across the link: (bytes, nanoseconds) as the
    /// receiver counted them.
    fn measure(&self, kind: Kind, g: Geometry, len: usize) -> (f64, f64) {
        let send = |addr| Role::NetemSend {
            kind,
            addr,
            secs: SECS,
            segment_size: g.segment_size,
            segment_count: g.segment_count,
            len,
        };
        let recv = |addr| Role::NetemRecv {
            kind,
            addr,
            segment_size: g.segment_size,
            segment_count: g.segment_count,
            len,
        };
        let (sender, receiver): (Child, Child) = match self {
            Link::Netem(n) => {
                let send = child(&send(NS_ADDR), &[], |cmd| enter(cmd, &n.a));
                let recv = child(&recv(NS_ADDR), &[], |cmd| enter(cmd, &n.b));
                (send, recv)
            }
            Link::Relay(rt, d) => {
                let port = TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .expect("a free port")
                    .port();
                let to = SocketAddr::from(([127, 0, 0, 1], port));
                let at = rt.block_on(relay(to, d.clone()));
                let send = child(&send(to), &[], |_| {});
                let recv = child(&recv(at), &[], |_| {});
                (send, recv)
            }
        };
        let got = parse_report(&finished(receiver));
        finished(sender);
        got
    }
}

/// Makes `cmd` start in the network namespace `ns` (made by `ip netns add`).
fn enter(cmd: &mut Command, ns: &str) {
    use std::os::unix::process::CommandExt;
    let f = std::fs::File::open(format!("/var/run/netns/{ns}")).expect("the namespace");
    let fd = f.as_raw_fd();
    // SAFETY: only `setns` between fork and exec (async-signal-safe); `f`, moved into the
    // closure, keeps the descriptor open until the command is dropped, after the spawn.
    unsafe {
        cmd.pre_exec(move || {
            let _keep = &f;
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A relay on loopback forwarding each connection to `to`, every byte held for the delay
/// `delay` says (read per chunk, so a change applies to what is read next), in each direction;
/// at most 128 MiB held per direction. Reads of up to 256 KiB take whatever has arrived, so
/// that the relay's work per byte does not depend on how the sender cut its writes.
/// Returns its address.
async fn relay(to: SocketAddr, delay: std::sync::Arc<std::sync::atomic::AtomicU64>) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a relay port");
    let addr = l.local_addr().expect("its address");
    async fn pump(
        mut r: tokio::net::tcp::OwnedReadHalf,
        mut w: tokio::net::tcp::OwnedWriteHalf,
        delay: std::sync::Arc<std::sync::atomic::AtomicU64>,
    ) {
        // At most 512 reads of up to 256 KiB held (128 MiB, more than any figure here needs
        // in a round trip): a sender faster than the receiver is held back, as by a real
        // link.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<(tokio::time::Instant, Vec<u8>)>(512);
        let writer = tokio::spawn(async move {
            while let Some((at, bytes)) = rx.recv().await {
                tokio::time::sleep_until(at).await;
                if w.write_all(&bytes).await.is_err() {
                    return;
                }
            }
        });
        let mut buf = vec![0u8; 256 << 10];
        while let Ok(n) = r.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let ms = delay.load(std::sync::atomic::Ordering::Relaxed);
            let at = tokio::time::Instant::now() + Duration::from_millis(ms);
            if tx.send((at, buf[..n].to_vec())).await.is_err() {
                break;
            }
        }
        drop(tx);
        let _ = writer.await;
    }
    tokio::spawn(async move {
        // One connection per measurement.
        let Ok((a, _)) = l.accept().await else { return };
        let start = tokio::time::Instant::now();
        let b = loop {
            match tokio::net::TcpStream::connect(to).await {
                Ok(b) => break b,
                Err(_) if start.elapsed() < Duration::from_secs(20) => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                Err(_) => return,
            }
        };
        let _ = (a.set_nodelay(true), b.set_nodelay(true));
        let (ar, aw) = a.into_split();
        let (br, bw) = b.into_split();
        tokio::spawn(pump(ar, bw, delay.clone()));
        tokio::spawn(pump(br, aw, delay));
    });
    addr
}

/// The names of [`measure`]'s figures, in its order.
pub(crate) const MEASURES: [&str; 14] = [
    "netem1_link_rtt_us",
    "netem1_tcp_mbs",
    "netem1_direct_mbs",
    "netem1_remote_mbs",
    "netem1_direct_pool4_mbs",
    "netem1_remote_pool4_mbs",
    "netem1_pool4_bound_mbs",
    "netem10_link_rtt_us",
    "netem10_tcp_mbs",
    "netem10_direct_mbs",
    "netem10_remote_mbs",
    "netem10_direct_pool4_mbs",
    "netem10_remote_pool4_mbs",
    "netem10_pool4_bound_mbs",
];

/// One run's figures.
pub(crate) fn measure(note: &mut dyn FnMut(&'static str, f64)) {
    let link = Link::setup();
    let mbs = |(bytes, ns): (f64, f64)| bytes / ns * 1e3;
    for (i, d) in DELAYS_MS.into_iter().enumerate() {
        if let Err(e) = link.set_delay(d) {
            eprintln!("netem: the delay of {d} ms was refused: {e}");
            return;
        }
        // This delay's seven figures, in the order of `MEASURES`.
        let names = &MEASURES[7 * i..7 * i + 7];
        let (rtt_ns, _) = link.measure(Kind::Ping, POOL4, 8);
        note(names[0], rtt_ns / 1e3);
        note(names[1], mbs(link.measure(Kind::Tcp, BIG, BULK)));
        note(names[2], mbs(link.measure(Kind::Direct, BIG, BULK)));
        note(names[3], mbs(link.measure(Kind::Remote, BIG, BULK)));
        let one = POOL4.segment_size as usize - 8;
        note(names[4], mbs(link.measure(Kind::Direct, POOL4, one)));
        note(names[5], mbs(link.measure(Kind::Remote, POOL4, one)));
        // The bound with the round trip measured on the link (a relay's timer adds to it).
        let credit = f64::from(POOL4.segment_size) * f64::from(POOL4.segment_count);
        note(names[6], credit / rtt_ns * 1e3);
    }
}

/// The sending child: listens on `addr`, sends `len`-byte records (or writes) for `secs`
/// into a pool of geometry `g`, then ends the stream.
pub(crate) fn send(
    kind: Kind,
    addr: SocketAddr,
    secs: f64,
    g: Geometry,
    len: usize,
) -> Result<(), String> {
    let rec = vec![0x5Au8; len];
    let end = || Instant::now() + Duration::from_secs_f64(secs);
    match kind {
        Kind::Ping => {
            let l = TcpListener::bind(addr).map_err(|e| e.to_string())?;
            let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
            s.set_nodelay(true).map_err(|e| e.to_string())?;
            let mut b = [0u8; 8];
            while s.read_exact(&mut b).is_ok() {
                s.write_all(&b).map_err(|e| e.to_string())?;
            }
        }
        Kind::Tcp => {
            let l = TcpListener::bind(addr).map_err(|e| e.to_string())?;
            let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
            s.set_nodelay(true).map_err(|e| e.to_string())?;
            let end = end();
            while Instant::now() < end {
                s.write_all(&rec).map_err(|e| e.to_string())?;
            }
        }
        Kind::Direct => {
            let l = Listener::bind(addr, config()).map_err(|e| e.to_string())?;
            let mut p = l.accept_producer("bench", g).map_err(|e| e.to_string())?;
            let end = end();
            while Instant::now() < end {
                // In place, as on loopback (`direct_bulk`): the transport, not a copy.
                p.claim(len).map_err(|e| e.to_string())?.commit();
            }
            p.close_timeout(Duration::from_secs(60))
                .map_err(|e| e.to_string())?;
        }
        Kind::Remote => {
            let rt = runtime();
            let (mut p, c) = shmflow::pair(g).map_err(|e| e.to_string())?;
            let server = rt.block_on(async {
                let mut s = Server::bind(addr, config())
                    .await
                    .map_err(|e| e.to_string())?;
                s.export("bench", c).map_err(|e| e.to_string())?;
                Ok::<_, String>(tokio::spawn(s.run()))
            })?;
            let end = end();
            while Instant::now() < end {
                // In place, as on loopback (`direct_bulk`): the transport, not a copy.
                p.claim(len).map_err(|e| e.to_string())?.commit();
            }
            drop(p);
            let report = rt.block_on(server).map_err(|e| e.to_string())?;
            report.channels[0]
                .result
                .as_ref()
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// The receiving child: connects to `addr` (retrying while the sender starts), reads `len`-byte
/// records into a pool of geometry `g` to the end touching every byte, prints `bytes ns`.
pub(crate) fn recv(kind: Kind, addr: SocketAddr, g: Geometry, len: usize) -> Result<(), String> {
    let start = Instant::now();
    let retry = |e: String| -> Result<(), String> {
        if start.elapsed() > Duration::from_secs(20) {
            return Err(e);
        }
        std::thread::sleep(Duration::from_millis(5));
        Ok(())
    };
    let (bytes, ns) = match kind {
        Kind::Ping => {
            let mut s = loop {
                match TcpStream::connect(addr) {
                    Ok(s) => break s,
                    Err(e) => retry(e.to_string())?,
                }
            };
            s.set_nodelay(true).map_err(|e| e.to_string())?;
            let mut v = Vec::new();
            let mut b = [0u8; 8];
            for i in 0..45u64 {
                let t = Instant::now();
                s.write_all(&i.to_le_bytes()).map_err(|e| e.to_string())?;
                s.read_exact(&mut b).map_err(|e| e.to_string())?;
                // The first five warm the path up.
                if i >= 5 {
                    v.push(t.elapsed().as_nanos());
                }
            }
            v.sort_unstable();
            // The median round trip, in the place of the bytes.
            (v[v.len() / 2] as u64, 1)
        }
        Kind::Tcp => {
            let mut s = loop {
                match TcpStream::connect(addr) {
                    Ok(s) => break s,
                    Err(e) => retry(e.to_string())?,
                }
            };
            tcp_read_all(&mut s)?
        }
        Kind::Direct => {
            let mut rx = loop {
                match connect_consumer(addr, "bench", g, config()) {
                    Ok(c) => break c,
                    Err(e) => retry(e.to_string())?,
                }
            };
            let (n, ns) = read_all(&mut rx, SinkRead::Recv)?;
            (n * len as u64, ns)
        }
        Kind::Remote => {
            let rt = runtime();
            let (tx, mut rx) = shmflow::pair(g).map_err(|e| e.to_string())?;
            let reader = std::thread::spawn(move || read_all(&mut rx, SinkRead::Recv));
            let outcomes = rt.block_on(async {
                let mut c = loop {
                    match Client::connect(addr, config()).await {
                        Ok(c) => break c,
                        Err(e) => retry(e.to_string())?,
                    }
                };
                c.import("bench", tx).map_err(|e| e.to_string())?;
                Ok::<_, String>(c.run().await)
            })?;
            // (The reader's own error first, as in `remote::remote_sink`.)
            let read = reader.join().map_err(|_| "the reader panicked")?;
            if let Err(e) = &outcomes[0].result {
                return Err(read.err().unwrap_or_else(|| e.to_string()));
            }
            let (n, ns) = read?;
            (n * len as u64, ns)
        }
    };
    println!("{bytes} {ns}");
    Ok(())
}
