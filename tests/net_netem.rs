//! Credit over a delayed link: two network namespaces joined by a veth pair with `tc netem`
//! delay, the sending bridge in one and the receiving bridge in the other (each a real child
//! process). What Flink's credit-based design implies, shown on a real link:
//! - throughput is bounded by credit per round trip: at most `credit × segment size / RTT`;
//! - floating segments lent to a channel with a backlog raise that bound: a gate channel with
//!   2 exclusive and 8 floating segments carries several times what it carries with its 2
//!   exclusive ones alone.
//!
//! Needs root and iproute2 (`ip`, `tc`). Where the kernel has no netem qdisc, it says
//! `SKIP: …` for netem and puts the delay in a relay of its own, run in namespace A between the
//! receiver and the sender, that holds every byte for the same delay in each direction; where
//! namespaces cannot be made (no root), it says `SKIP: …` for them too and runs the relay on
//! loopback. The design is shown either way. The figures are printed (`--nocapture`); the checks
//! are the bound (noise can only lower a throughput) and a floating gain of at least 1.5× where
//! the design gives 5×.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{role, ROLE};
use shmflow::net::{Client, Config, Server};
use shmflow::{Gate, GateGeometry, GateMessage, Geometry, Producer};

const SEG: u32 = 32 * 1024;
const DELAY_MS: u64 = 10; // each way: a round trip of 20 ms
const SECS: f64 = 2.0;

struct Netns {
    a: String,
    b: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn in_ns(ns: &str, cmd: &[&str]) -> Result<(), String> {
    let mut args = vec!["netns", "exec", ns];
    args.extend_from_slice(cmd);
    ip(&args)
}

impl Netns {
    /// The namespaces and the veth pair between them; then netem's delay on both ends, which
    /// may be refused on its own (the namespaces stay).
    fn setup() -> Result<(Netns, Result<(), String>), String> {
        let id = std::process::id();
        let n = Netns {
            a: format!("shmflow-a{id}"),
            b: format!("shmflow-b{id}"),
        };
        ip(&["netns", "add", &n.a])?;
        ip(&["netns", "add", &n.b])?;
        let (va, vb) = (
            format!("sfa{}", id % 100_000),
            format!("sfb{}", id % 100_000),
        );
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", &n.a])?;
        ip(&["link", "set", &vb, "netns", &n.b])?;
        in_ns(&n.a, &["ip", "addr", "add", "10.231.0.1/24", "dev", &va])?;
        in_ns(&n.b, &["ip", "addr", "add", "10.231.0.2/24", "dev", &vb])?;
        for (ns, dev) in [(&n.a, &va), (&n.b, &vb)] {
            in_ns(ns, &["ip", "link", "set", dev, "up"])?;
            in_ns(ns, &["ip", "link", "set", "lo", "up"])?;
        }
        let delay = format!("{DELAY_MS}ms");
        let netem = [(&n.a, &va), (&n.b, &vb)]
            .into_iter()
            .try_for_each(|(ns, dev)| {
                in_ns(
                    ns,
                    &[
                        "tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", &delay,
                    ],
                )
            });
        Ok((n, netem))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth pair with it.
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

fn config() -> Config {
    // The namespaces' link is private to this test: no TLS.
    Config::default().insecure_plaintext()
}

const NS_ADDR: &str = "10.231.0.1:7411";
/// Where the relay listens in namespace A, when the delay is the relay's.
const NS_RELAY_ADDR: &str = "10.231.0.1:7412";

fn env_addr(var: &str) -> std::net::SocketAddr {
    std::env::var(var).unwrap().parse().unwrap()
}

/// In namespace A: a producer writing one record per segment as fast as it can for `SECS`,
/// served to the receiver.
fn sender() {
    let rt = runtime();
    rt.block_on(async {
        let (mut tx, rx) = shmflow::pair(Geometry {
            segment_size: SEG,
            segment_count: 16,
        })
        .unwrap();
        let mut s = Server::bind(env_addr("LISTEN"), config()).await.unwrap();
        s.export("c", rx).unwrap();
        println!("listening");
        let writer = std::thread::spawn(move || {
            let rec = vec![7u8; SEG as usize - 8];
            let end = Instant::now() + Duration::from_secs_f64(SECS);
            while Instant::now() < end {
                tx.send(&rec).unwrap();
            }
        });
        let report = s.run().await;
        writer.join().unwrap();
        assert!(report.channels[0].result.is_ok(), "{report:?}");
    });
}

/// In namespace B: receives into a channel of `mode`'s shape and reads as fast as it can;
/// prints `bytes ns`.
fn receiver(mode: &str) {
    let rt = runtime();
    let (producer, mut read): (Producer, Box<dyn FnMut() -> Option<usize> + Send>) = match mode {
        "channel4" => {
            let (tx, mut rx) = shmflow::pair(Geometry {
                segment_size: SEG,
                segment_count: 4,
            })
            .unwrap();
            let read = move || rx.recv().unwrap().map(|r| r.len().unwrap());
            (tx, Box::new(read))
        }
        gate => {
            let floating = if gate == "gate-e2-f8" { 8 } else { 0 };
            let name = format!("/shmflow-netem-{}", std::process::id());
            let mut g = Gate::create(
                &name,
                GateGeometry::new(1)
                    .with_exclusive(2)
                    .with_floating(floating)
                    .with_segment_size(SEG),
            )
            .unwrap();
            let p = Producer::open_channel(&name, 0).unwrap();
            let read = move || loop {
                match g.recv().unwrap()? {
                    GateMessage::Record { record, .. } => return Some(record.len().unwrap()),
                    GateMessage::EndOfPartition { .. } => {}
                    other => panic!("{other:?}"),
                }
            };
            (p, Box::new(read))
        }
    };
    let reader = std::thread::spawn(move || {
        let (mut bytes, mut first) = (0u64, None);
        while let Some(n) = read() {
            first.get_or_insert_with(Instant::now);
            bytes += n as u64;
        }
        (bytes, first.map_or(1, |t| t.elapsed().as_nanos()))
    });
    rt.block_on(async {
        let start = Instant::now();
        let mut c = loop {
            match Client::connect(env_addr("CONNECT"), config()).await {
                Ok(c) => break c,
                Err(e) if start.elapsed() > Duration::from_secs(10) => panic!("{e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        c.import("c", producer).unwrap();
        let out = c.run().await;
        assert!(out[0].result.is_ok(), "{out:?}");
    });
    let (bytes, ns) = reader.join().unwrap();
    println!("result {bytes} {ns}");
}

/// Where the two children run: in the namespaces (the delay netem's, or that of a relay
/// running in namespace A), or on loopback through the delay relay of this process.
enum Link {
    Netns(Netns),
    NetnsRelay(Netns, std::process::Child),
    Relay { listen: String, connect: String },
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Link::NetnsRelay(_, relay) = self {
            let _ = relay.kill();
            let _ = relay.wait();
        }
    }
}

/// This test binary again, as `role` (in namespace `ns` if given).
fn this_test(ns: Option<&str>, role: &str) -> Command {
    let mut c = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]);
            c.arg(std::env::current_exe().unwrap());
            c
        }
        None => Command::new(std::env::current_exe().unwrap()),
    };
    c.args([
        "--exact",
        "credit_per_round_trip_bounds_throughput_and_floating_segments_raise_it",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(ROLE, role);
    c
}

fn child(link: &Link, role: &str, mode: &str) -> std::process::Child {
    let mut cmd = match link {
        Link::Netns(n) | Link::NetnsRelay(n, _) => {
            let relayed = matches!(link, Link::NetnsRelay(..));
            let mut c = this_test(Some(if role == "sender" { &n.a } else { &n.b }), role);
            c.env("LISTEN", NS_ADDR)
                .env("CONNECT", if relayed { NS_RELAY_ADDR } else { NS_ADDR });
            c
        }
        Link::Relay { listen, connect } => {
            let mut c = this_test(None, role);
            c.env("LISTEN", listen).env("CONNECT", connect);
            c
        }
    };
    cmd.env("NETEM_MODE", mode)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Bytes per second through a receiver of `mode`.
fn measure(link: &Link, mode: &str) -> f64 {
    let s = child(link, "sender", mode);
    let r = child(link, "receiver", mode);
    let out = r.wait_with_output().unwrap();
    let mut s = s;
    if !out.status.success() {
        let _ = s.kill();
        let _ = s.wait();
        panic!("{mode}: the receiver failed: {}", out.status);
    }
    let so = s.wait_with_output().unwrap();
    assert!(so.status.success(), "{mode}: the sender failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.find("result ").map(|i| l[i + 7..].to_owned()))
        .expect("the receiver's result");
    let mut it = line.split_whitespace().map(|x| x.parse::<f64>().unwrap());
    let (bytes, ns) = (it.next().unwrap(), it.next().unwrap());
    bytes / ns * 1e9
}

#[test]
fn credit_per_round_trip_bounds_throughput_and_floating_segments_raise_it() {
    match role().as_deref() {
        Some("sender") => {
            sender();
            std::process::exit(0)
        }
        Some("receiver") => {
            receiver(&std::env::var("NETEM_MODE").unwrap());
            std::process::exit(0)
        }
        Some("relay") => {
            // In namespace A until killed.
            runtime().block_on(async {
                relay(
                    NS_RELAY_ADDR.parse().unwrap(),
                    NS_ADDR.parse().unwrap(),
                    Duration::from_millis(DELAY_MS),
                )
                .await;
                std::future::pending::<()>().await
            });
        }
        _ => {}
    }
    // The relay's runtime lives as long as the test.
    let rt = runtime();
    let (link, how) = match Netns::setup() {
        Ok((n, Ok(()))) => (Link::Netns(n), "two network namespaces, veth with netem"),
        Ok((n, Err(e))) => {
            println!(
                "SKIP: netem on the veth pair: {e}; the delay is a relay of the test's own in \
                 namespace A instead"
            );
            let relay = this_test(Some(&n.a), "relay")
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            (
                Link::NetnsRelay(n, relay),
                "two network namespaces, veth, the delay relay in namespace A",
            )
        }
        Err(e) => {
            println!(
                "SKIP: two network namespaces with a netem delay: {e}; showing it on loopback \
                 through the test's delay relay instead"
            );
            let listen = format!("127.0.0.1:{}", free_port());
            let connect = rt.block_on(relay(
                "127.0.0.1:0".parse().unwrap(),
                listen.parse().unwrap(),
                Duration::from_millis(DELAY_MS),
            ));
            (
                Link::Relay {
                    listen,
                    connect: connect.to_string(),
                },
                "loopback through the delay relay",
            )
        }
    };
    println!("link: {how}, {DELAY_MS} ms each way");
    let rtt = Duration::from_millis(2 * DELAY_MS).as_secs_f64();
    let bound = |credit: f64| credit * SEG as f64 / rtt;
    let mut rows = Vec::new();
    for (mode, credit) in [("channel4", 4.0), ("gate-e2-f0", 2.0), ("gate-e2-f8", 10.0)] {
        let bps = measure(&link, mode);
        println!(
            "{mode:<11} credit {credit:>2} segments of {} KiB, RTT {:.0} ms: {:>6.2} MB/s (credit/RTT bound {:>6.2} MB/s)",
            SEG / 1024,
            rtt * 1e3,
            bps / 1e6,
            bound(credit) / 1e6
        );
        rows.push((mode, credit, bps));
    }
    for (mode, credit, bps) in &rows {
        // Credit per round trip is a ceiling: a receiver can never have more in flight.
        assert!(
            *bps <= bound(*credit) * 1.25,
            "{mode}: {bps} B/s above the credit bound {}",
            bound(*credit)
        );
    }
    let gain = rows[2].2 / rows[1].2;
    println!("floating segments lent to the channel with a backlog: {gain:.1}× (design: 5×)");
    assert!(gain >= 1.5, "floating segments gave only {gain:.2}×");
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A relay listening on `at` that forwards each connection to `to`, every byte held for
/// `delay` in each direction (a delayed link without netem). Returns the address to connect
/// to.
async fn relay(
    at: std::net::SocketAddr,
    to: std::net::SocketAddr,
    delay: Duration,
) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind(at).await.unwrap();
    let addr = l.local_addr().unwrap();
    async fn pump(
        mut r: tokio::net::tcp::OwnedReadHalf,
        mut w: tokio::net::tcp::OwnedWriteHalf,
        delay: Duration,
    ) {
        let (tx, mut rx) =
            tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
        let writer = tokio::spawn(async move {
            while let Some((at, bytes)) = rx.recv().await {
                tokio::time::sleep_until(at).await;
                if w.write_all(&bytes).await.is_err() {
                    return;
                }
            }
        });
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(n) = r.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let at = tokio::time::Instant::now() + delay;
            if tx.send((at, buf[..n].to_vec())).is_err() {
                break;
            }
        }
        drop(tx);
        let _ = writer.await;
    }
    tokio::spawn(async move {
        loop {
            let Ok((a, _)) = l.accept().await else { return };
            // The sender may still be starting: retry for a while.
            let start = tokio::time::Instant::now();
            let b = loop {
                match tokio::net::TcpStream::connect(to).await {
                    Ok(b) => break Some(b),
                    Err(_) if start.elapsed() < Duration::from_secs(10) => {
                        tokio::time::sleep(Duration::from_millis(10)).await
                    }
                    Err(_) => break None,
                }
            };
            let Some(b) = b else { continue };
            let _ = (a.set_nodelay(true), b.set_nodelay(true));
            let (ar, aw) = a.into_split();
            let (br, bw) = b.into_split();
            tokio::spawn(pump(ar, bw, delay));
            tokio::spawn(pump(br, aw, delay));
        }
    });
    addr
}
