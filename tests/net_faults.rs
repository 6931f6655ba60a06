//! Remote channels when things go wrong: a killed sending or receiving process, a cut or
//! stalled connection, a peer that sends garbage or breaks the credit rules, TLS with the
//! wrong certificate. Real processes are killed and real connections cut (through a proxy on
//! loopback that this test runs); the survivor's view is checked.

mod common;
#[path = "common/pki.rs"]
mod pki;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::BufMut;
use common::{check_record, make_record, role, Rng, ROLE};
use pki::Pki;
use shmflow::net::{Client, Config, Ended, LinkError, ProtocolError, Server, SetupError};
use shmflow::{Consumer, Error, Gate, GateGeometry, GateMessage, Geometry, Producer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

fn geometry() -> Geometry {
    Geometry {
        segment_size: 4096,
        segment_count: 4,
    }
}

fn len_of(seq: u64) -> usize {
    [16usize, 100, 700, 3000, 6000][(seq % 5) as usize]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Reads records until an error; checks each is the next in order and intact.
fn read_prefix(rx: &mut Consumer, from: u64) -> (u64, Result<(), Error>) {
    let (mut seq, mut scratch) = (from, Vec::new());
    loop {
        match rx.recv() {
            Ok(Some(r)) => {
                let v = match r.to_vec() {
                    Ok(v) => v,
                    // A record spanning segments, cut short by the fault: never delivered in
                    // part; the next call reports the fault.
                    Err(shmflow::RecvError::RecordAborted(_)) => continue,
                    Err(e) => return (seq, Err(e.into())),
                };
                if let Err(e) = check_record(seq, len_of(seq), &v, &mut scratch) {
                    panic!("after {seq} good records: {e}");
                }
                seq += 1;
            }
            Ok(None) => return (seq, Ok(())),
            Err(e) => return (seq, Err(e.into())),
        }
    }
}

/// Writes records until an error.
fn write_until_error(tx: Producer) -> (u64, Error) {
    write_until_error_from(tx, 0)
}

/// Sends records until a send has had to wait for room (the slow reader holds the rest);
/// returns the next record's number.
fn send_until_blocked(tx: &mut Producer) -> u64 {
    let mut rec = Vec::new();
    for seq in 0.. {
        make_record(seq, len_of(seq), &mut rec);
        tx.send(&rec).unwrap();
        if tx.metrics().backpressured_ns > 0 {
            return seq + 1;
        }
    }
    unreachable!()
}

/// As `write_until_error`, from record `from` on.
fn write_until_error_from(mut tx: Producer, from: u64) -> (u64, Error) {
    let mut rec = Vec::new();
    for seq in from.. {
        make_record(seq, len_of(seq), &mut rec);
        if let Err(e) = tx.send(&rec) {
            return (seq, e.into());
        }
    }
    unreachable!()
}

fn spawn_role(test: &str, role: &str, env: &[(&str, String)]) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .envs(env.iter().map(|(k, v)| (*k, v.clone())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The first line a child prints that starts with `tag`.
fn read_line(child: &mut Child, tag: &str) -> String {
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    loop {
        let l = lines.next().expect("child ended early").unwrap();
        // The harness prints its own words before ours on the same line.
        if let Some(at) = l.find(tag) {
            let v = l[at + tag.len()..].trim().to_owned();
            // Keep draining so the child never blocks on a full pipe.
            std::thread::spawn(move || for _ in lines {});
            return v;
        }
    }
}

fn sigkill(child: &mut Child) {
    // SAFETY: kill(2) with a pid we spawned and have not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
}

fn expect_remote_dead(e: &Error) {
    match e {
        Error::PeerDead(d) => assert!(d.is_remote(), "{d}"),
        other => panic!("expected PeerDead (remote), got {other}"),
    }
}

// ----- killed processes -------------------------------------------------------------------------

#[test]
fn sending_process_killed_consumer_gets_an_intact_prefix_then_peer_dead() {
    if role().as_deref() == Some("sender") {
        // Producer and bridge in one process: killing it kills both.
        let rt = runtime();
        rt.block_on(async {
            let (tx, rx) = shmflow::pair(geometry()).unwrap();
            let mut server = Server::bind("127.0.0.1:0".parse().unwrap(), Config::default())
                .await
                .unwrap();
            server.export("c", rx).unwrap();
            println!("port {}", server.local_addr().unwrap().port());
            std::io::stdout().flush().unwrap();
            std::thread::spawn(move || write_until_error(tx));
            server.run().await;
        });
        std::process::exit(0);
    }
    let mut child = spawn_role(
        "sending_process_killed_consumer_gets_an_intact_prefix_then_peer_dead",
        "sender",
        &[],
    );
    let port: u16 = read_line(&mut child, "port").parse().unwrap();
    let (tx, mut rx) = shmflow::pair(geometry()).unwrap();
    let rt = runtime();
    let bridge = rt.spawn(async move {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut client = Client::connect(addr, Config::default()).await.unwrap();
        client.import("c", tx).unwrap();
        client.run().await
    });
    // Let some records through, then kill the sender mid-stream.
    let mut got = 0;
    let mut scratch = Vec::new();
    while got < 2000 {
        let r = match rx.recv() {
            Ok(r) => r.unwrap().to_vec().unwrap(),
            Err(e) => panic!("{e} after {got}: {:?}", rt.block_on(bridge).unwrap()),
        };
        check_record(got, len_of(got), &r, &mut scratch).unwrap();
        got += 1;
    }
    sigkill(&mut child);
    let killed = Instant::now();
    let rest = read_prefix(&mut rx, got);
    let took = killed.elapsed();
    let outcomes = rt.block_on(bridge).unwrap();
    let e = rest.1.expect_err("the stream cannot end cleanly");
    expect_remote_dead(&e);
    println!(
        "sender killed after {got} records: {} records in all, then PeerDead after {took:?} ({:?})",
        rest.0, outcomes[0].result
    );
    assert!(outcomes[0].result.is_err(), "{outcomes:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn receiving_process_killed_blocked_producer_gets_peer_dead() {
    if role().as_deref() == Some("receiver") {
        let port: u16 = std::env::var("PORT").unwrap().parse().unwrap();
        let rt = runtime();
        rt.block_on(async {
            let (tx, mut rx) = shmflow::pair(geometry()).unwrap();
            let mut client =
                Client::connect(SocketAddr::from(([127, 0, 0, 1], port)), Config::default())
                    .await
                    .unwrap();
            client.import("c", tx).unwrap();
            // A slow reader: the sender soon has no credit.
            std::thread::spawn(move || {
                while let Ok(Some(_)) = rx.recv() {
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
            println!("connected");
            std::io::stdout().flush().unwrap();
            client.run().await;
        });
        std::process::exit(0);
    }
    let rt = runtime();
    let (tx, rx) = shmflow::pair(geometry()).unwrap();
    let (server, port) = rt.block_on(async {
        let mut s = Server::bind("127.0.0.1:0".parse().unwrap(), Config::default())
            .await
            .unwrap();
        s.export("c", rx).unwrap();
        let port = s.local_addr().unwrap().port();
        (rt.spawn(s.run()), port)
    });
    let mut child = spawn_role(
        "receiving_process_killed_blocked_producer_gets_peer_dead",
        "receiver",
        &[("PORT", port.to_string())],
    );
    read_line(&mut child, "connected");
    let mut tx = tx;
    let next = send_until_blocked(&mut tx);
    let writer = std::thread::spawn(move || write_until_error_from(tx, next));
    sigkill(&mut child);
    let killed = Instant::now();
    let (sent, e) = writer.join().unwrap();
    let took = killed.elapsed();
    expect_remote_dead(&e);
    let report = rt.block_on(server).unwrap();
    println!("receiver killed: the producer's send failed after {took:?}, {sent} records sent");
    assert!(report.channels[0].result.is_err(), "{report:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn direct_sending_process_killed_consumer_gets_an_intact_prefix_then_peer_dead() {
    if role().as_deref() == Some("sender") {
        // A direct producer: the sending process is the one that writes to the socket.
        let l = shmflow::net::Listener::bind("127.0.0.1:0".parse().unwrap(), Config::default())
            .unwrap();
        println!("port {}", l.local_addr().unwrap().port());
        std::io::stdout().flush().unwrap();
        let tx = l.accept_producer("c", geometry()).unwrap();
        write_until_error(tx);
        std::process::exit(0);
    }
    let mut child = spawn_role(
        "direct_sending_process_killed_consumer_gets_an_intact_prefix_then_peer_dead",
        "sender",
        &[],
    );
    let port: u16 = read_line(&mut child, "port").parse().unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut rx = shmflow::net::connect_consumer(addr, "c", geometry(), Config::default()).unwrap();
    let (got, first) = read_prefix_n(&mut rx, 2000);
    assert_eq!(got, 2000, "{first:?}");
    sigkill(&mut child);
    let killed = Instant::now();
    let rest = read_prefix(&mut rx, got);
    let took = killed.elapsed();
    let e = rest.1.expect_err("the stream cannot end cleanly");
    expect_remote_dead(&e);
    println!(
        "direct sender killed after {got} records: {} records in all, then PeerDead after {took:?}",
        rest.0
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// Reads `n` records in order (or until an error).
fn read_prefix_n(rx: &mut Consumer, n: u64) -> (u64, Option<Error>) {
    let mut scratch = Vec::new();
    for seq in 0..n {
        match rx.recv() {
            Ok(Some(r)) => {
                let v = r.to_vec().unwrap();
                check_record(seq, len_of(seq), &v, &mut scratch).unwrap();
            }
            Ok(None) => return (seq, None),
            Err(e) => return (seq, Some(e.into())),
        }
    }
    (n, None)
}

#[test]
fn direct_receiving_process_killed_producer_gets_peer_dead() {
    if role().as_deref() == Some("receiver") {
        let port: u16 = std::env::var("PORT").unwrap().parse().unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut rx =
            shmflow::net::connect_consumer(addr, "c", geometry(), Config::default()).unwrap();
        println!("connected");
        std::io::stdout().flush().unwrap();
        // A slow reader: the sender soon has no credit.
        while let Ok(Some(_)) = rx.recv() {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::process::exit(0);
    }
    let l =
        shmflow::net::Listener::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
    let port = l.local_addr().unwrap().port();
    let mut child = spawn_role(
        "direct_receiving_process_killed_producer_gets_peer_dead",
        "receiver",
        &[("PORT", port.to_string())],
    );
    let tx = l.accept_producer("c", geometry()).unwrap();
    read_line(&mut child, "connected");
    let mut tx = tx;
    let next = send_until_blocked(&mut tx);
    let writer = std::thread::spawn(move || write_until_error_from(tx, next));
    sigkill(&mut child);
    let killed = Instant::now();
    let (sent, e) = writer.join().unwrap();
    let took = killed.elapsed();
    expect_remote_dead(&e);
    println!(
        "direct receiver killed: the producer's send failed after {took:?}, {sent} records sent"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
}

// ----- cut and stalled connections ----------------------------------------------------------

/// Copies `r` to `w` until end of stream, or, once `stall` is cancelled, stops copying and
/// holds both sockets open.
async fn pump(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    stall: CancellationToken,
) {
    let mut buf = vec![0u8; 65536];
    loop {
        let n = tokio::select! {
            n = r.read(&mut buf) => n.unwrap_or(0),
            _ = stall.cancelled() => break,
        };
        if n == 0 || w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
    // Stalled: nothing more goes through, nothing is closed.
    let _keep = (r, w);
    std::future::pending::<()>().await;
}

/// Forwards one connection to `to` until `cut` (both sockets closed at once) or `stall`.
async fn proxy(to: SocketAddr, cut: CancellationToken, stall: CancellationToken) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (a, _) = l.accept().await.unwrap();
        let b = TcpStream::connect(to).await.unwrap();
        let (ar, aw) = a.into_split();
        let (br, bw) = b.into_split();
        tokio::select! {
            _ = async { tokio::join!(pump(ar, bw, stall.clone()), pump(br, aw, stall.clone())) } => {}
            _ = cut.cancelled() => {}
        }
    });
    addr
}

/// A producer and a consumer bridged through the proxy; `fault` is applied once records
/// flow. Returns what the consumer read and its error, the producer's error, and how long
/// after the fault each side took.
fn through_proxy(stall: bool) {
    let rt = runtime();
    let (tx_a, rx_a) = shmflow::pair(geometry()).unwrap();
    let (tx_b, mut rx_b) = shmflow::pair(geometry()).unwrap();
    let cut = CancellationToken::new();
    let stall_t = CancellationToken::new();
    let (server, client) = rt.block_on(async {
        let mut s = Server::bind("127.0.0.1:0".parse().unwrap(), Config::default())
            .await
            .unwrap();
        s.export("c", rx_a).unwrap();
        let to = s.local_addr().unwrap();
        let server = tokio::spawn(s.run());
        let via = proxy(to, cut.clone(), stall_t.clone()).await;
        let mut c = Client::connect(via, Config::default()).await.unwrap();
        c.import("c", tx_b).unwrap();
        (server, tokio::spawn(c.run()))
    });
    let writer = std::thread::spawn(move || write_until_error(tx_a));
    let mut scratch = Vec::new();
    for seq in 0..500 {
        let r = rx_b.recv().unwrap().unwrap().to_vec().unwrap();
        check_record(seq, len_of(seq), &r, &mut scratch).unwrap();
    }
    let fault = Instant::now();
    if stall {
        stall_t.cancel();
    } else {
        cut.cancel();
    }
    let reader = std::thread::spawn(move || {
        let mut seq = 500;
        let mut scratch = Vec::new();
        loop {
            match rx_b.recv() {
                Ok(Some(r)) => {
                    let v = match r.to_vec() {
                        Ok(v) => v,
                        Err(shmflow::RecvError::RecordAborted(_)) => continue,
                        Err(e) => return (seq, Error::from(e), fault.elapsed()),
                    };
                    check_record(seq, len_of(seq), &v, &mut scratch).unwrap();
                    seq += 1;
                }
                Ok(None) => panic!("a clean end after a fault"),
                Err(e) => return (seq, Error::from(e), fault.elapsed()),
            }
        }
    });
    let (got, rerr, rtook) = reader.join().unwrap();
    let (sent, werr) = writer.join().unwrap();
    let wtook = fault.elapsed();
    expect_remote_dead(&rerr);
    expect_remote_dead(&werr);
    let report = rt.block_on(server).unwrap();
    let outcomes = rt.block_on(client).unwrap();
    println!(
        "{}: consumer PeerDead after {rtook:?} ({got} records), producer after {wtook:?} ({sent} sent); server: {:?}; client: {:?}",
        if stall { "stalled" } else { "cut" },
        report.channels[0].result,
        outcomes[0].result
    );
    assert!(got <= sent);
    if stall {
        assert!(
            matches!(outcomes[0].result, Err(LinkError::PeerSilent { .. })),
            "{outcomes:?}"
        );
        assert!(
            matches!(report.channels[0].result, Err(LinkError::PeerSilent { .. })),
            "{report:?}"
        );
    } else {
        assert!(outcomes[0].result.is_err() && report.channels[0].result.is_err());
    }
    assert!(rtook < Duration::from_secs(5) && wtook < Duration::from_secs(5));
}

#[test]
fn a_cut_connection_ends_both_sides_with_peer_dead() {
    through_proxy(false);
}

#[test]
fn a_stalled_connection_is_found_silent_by_both_sides() {
    through_proxy(true);
}

// ----- hostile peers --------------------------------------------------------------------------

fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.put_u32_le(8 + body.len() as u32);
    v.put_u32_le(0x5346_4E54);
    v.put_u8(1);
    v.put_u8(kind);
    v.put_u16_le(0);
    v.extend_from_slice(body);
    v
}

/// A fake server: accepts one connection, reads the request, then sends `reply`.
async fn fake_server(reply: Vec<u8>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = [0u8; 512];
        let _ = s.read(&mut buf).await;
        let _ = s.write_all(&reply).await;
        // Keep the connection open: the client must close it.
        let _ = s.read(&mut buf).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
    });
    addr
}

/// What a client sees from a server that answers `reply`.
fn client_facing(reply: Vec<u8>) -> (LinkError, Error) {
    let rt = runtime();
    let (tx, mut rx) = shmflow::pair(geometry()).unwrap();
    let outcomes = rt.block_on(async {
        let addr = fake_server(reply).await;
        let mut c = Client::connect(addr, Config::default()).await.unwrap();
        c.import("c", tx).unwrap();
        tokio::time::timeout(Duration::from_secs(10), c.run())
            .await
            .expect("the client must not hang")
    });
    // What came before the offending frame was valid and is delivered; then the error.
    let local = loop {
        match rx.recv() {
            Err(e) => break Error::from(e),
            Ok(Some(_)) => {}
            Ok(None) => panic!("a clean end from a hostile peer"),
        }
    };
    (
        outcomes.into_iter().next().unwrap().result.unwrap_err(),
        local,
    )
}

/// What a direct consumer sees from a sender that answers `reply`: the message of the
/// connection's `Error` it sent back (code 3, the peer broke the protocol), and its own error.
fn direct_facing(reply: Vec<u8>) -> (String, Error) {
    use std::io::Read;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let sender = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 512];
        let _ = s.read(&mut buf);
        s.write_all(&reply).unwrap();
        // Everything the consumer says until it closes (bounded: it must close).
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut told = Vec::new();
        let _ = s.read_to_end(&mut told);
        told
    });
    let mut rx = shmflow::net::connect_consumer(addr, "c", geometry(), Config::default()).unwrap();
    let local = loop {
        match rx.recv() {
            Err(e) => break Error::from(e),
            Ok(Some(_)) => {}
            Ok(None) => panic!("a clean end from a hostile peer"),
        }
    };
    let told = sender.join().unwrap();
    // The frames the consumer sent: its credit, then the `Error` (kind 6) for the connection.
    let mut at = 0;
    while at + 12 <= told.len() {
        let len = u32::from_le_bytes(told[at..at + 4].try_into().unwrap()) as usize;
        let kind = told[at + 9];
        let body = &told[at + 12..(at + 4 + len).min(told.len())];
        if kind == 6 && body.len() >= 10 {
            let channel = u32::from_le_bytes(body[..4].try_into().unwrap());
            let code = u32::from_le_bytes(body[4..8].try_into().unwrap());
            assert_eq!((channel, code), (u32::MAX, 3), "{told:?}");
            return (String::from_utf8_lossy(&body[10..]).into_owned(), local);
        }
        at += 4 + len;
    }
    panic!("the direct consumer told the sender nothing: {told:?}")
}

fn buffer(channel: u32, offset: u32, frames: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.put_u32_le(channel);
    b.put_u32_le(0);
    b.put_u32_le(offset);
    b.put_u32_le(0);
    b.extend_from_slice(frames);
    frame(2, &b)
}

fn whole(payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.put_u64_le(((0x5346_0001u64) << 32) | payload.len() as u64);
    v.extend_from_slice(payload);
    while v.len() % 8 != 0 {
        v.push(0);
    }
    v
}

#[test]
fn a_garbled_or_hostile_sender_gets_a_typed_error_and_the_consumer_peer_dead() {
    type Expect = fn(&ProtocolError) -> bool;
    let cases: Vec<(&str, Vec<u8>, Expect)> = vec![
        ("garbage", b"HTTP/1.1 200 OK\r\n\r\nhello".to_vec(), |e| {
            matches!(
                e,
                ProtocolError::Magic { .. } | ProtocolError::FrameLength { .. }
            )
        }),
        (
            "a frame of 4 GiB",
            {
                let mut v = vec![0xFF; 4];
                v.extend_from_slice(&0x5346_4E54u32.to_le_bytes());
                v
            },
            |e| matches!(e, ProtocolError::FrameLength { .. }),
        ),
        ("an unknown kind", frame(42, &[]), |e| {
            matches!(e, ProtocolError::Kind { found: 42 })
        }),
        (
            "a buffer for a channel never requested",
            buffer(9, 0, &whole(b"x")),
            |e| matches!(e, ProtocolError::Channel { channel: 9, .. }),
        ),
        (
            "a record frame longer than the segment",
            {
                let mut f = Vec::new();
                f.put_u64_le(((0x5346_0001u64) << 32) | 100_000);
                buffer(0, 0, &f)
            },
            |e| matches!(e, ProtocolError::Frame { .. }),
        ),
        (
            "a buffer that does not continue the segment",
            {
                let mut v = buffer(0, 0, &whole(b"first"));
                v.extend(buffer(0, 64, &whole(b"elsewhere")));
                v
            },
            |e| matches!(e, ProtocolError::Channel { .. }),
        ),
        (
            "more segments than credit",
            {
                // Five segments started against a credit of four.
                let mut v = Vec::new();
                for _ in 0..5 {
                    let mut seg = whole(&[7u8; 4000]);
                    seg.put_u64_le((0x5346_0007u64) << 32);
                    v.extend(buffer(0, 0, &seg));
                }
                v
            },
            |e| matches!(e, ProtocolError::Credit { .. }),
        ),
    ];
    for (what, reply, ok) in cases {
        let (e, local) = client_facing(reply.clone());
        match &e {
            LinkError::Protocol(p) if ok(p) => {}
            other => panic!("{what}: unexpected {other:?}"),
        }
        expect_remote_dead(&local);
        println!("{what}: {e}");
        // A direct consumer runs the same checks: the same error, told to the sender.
        let (told, local) = direct_facing(reply);
        assert_eq!(told, e.to_string(), "{what}: a direct consumer");
        expect_remote_dead(&local);
    }
}

#[test]
fn a_garbled_client_is_refused_and_the_channel_stays_for_a_real_one() {
    let rt = runtime();
    let (mut tx, rx) = shmflow::pair(geometry()).unwrap();
    let (tx_b, mut rx_b) = shmflow::pair(geometry()).unwrap();
    let report = rt.block_on(async {
        let mut s = Server::bind("127.0.0.1:0".parse().unwrap(), Config::default())
            .await
            .unwrap();
        s.export("c", rx).unwrap();
        let addr = s.local_addr().unwrap();
        let server = tokio::spawn(s.run());
        let mut rng = Rng::new(7);
        for _ in 0..3 {
            let mut junk = TcpStream::connect(addr).await.unwrap();
            let bytes: Vec<u8> = (0..4096).map(|_| rng.next() as u8).collect();
            let _ = junk.write_all(&bytes).await;
            let mut sink = Vec::new();
            // The server answers with an error and closes.
            let _ = tokio::time::timeout(Duration::from_secs(5), junk.read_to_end(&mut sink)).await;
        }
        // A peer that connects and says nothing is dropped after `dead_after`.
        let _silent = TcpStream::connect(addr).await.unwrap();
        let mut c = Client::connect(addr, Config::default()).await.unwrap();
        c.import("c", tx_b).unwrap();
        let client = tokio::spawn(c.run());
        tokio::task::spawn_blocking(move || {
            tx.send(b"after the junk").unwrap();
        })
        .await
        .unwrap();
        let got = tokio::task::spawn_blocking(move || {
            let got = rx_b.recv().unwrap().unwrap().to_vec().unwrap();
            // Read on to the end of the stream: dropped before the producer's close came
            // through both bridges, this consumer would end the channel as "consumer left".
            assert!(rx_b.recv().unwrap().is_none());
            got
        })
        .await
        .unwrap();
        assert_eq!(got, b"after the junk");
        let outcomes = client.await.unwrap();
        assert!(
            matches!(outcomes[0].result, Ok(Ended::Clean)),
            "{outcomes:?}"
        );
        server.await.unwrap()
    });
    assert!(
        matches!(report.channels[0].result, Ok(Ended::Clean)),
        "{report:?}"
    );
    assert!(report.refused.len() >= 3, "{report:?}");
    for (_, e) in &report.refused[..3] {
        assert!(matches!(e, LinkError::Protocol(_)), "{e}");
    }
}

#[test]
fn a_direct_producer_refuses_garbled_and_silent_receivers_and_waits_for_a_real_one() {
    use std::io::Read;
    let l =
        shmflow::net::Listener::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
    let addr = l.local_addr().unwrap();
    let peers = std::thread::spawn(move || {
        let mut rng = Rng::new(11);
        let mut answers = Vec::new();
        for k in 0..3 {
            let mut junk = std::net::TcpStream::connect(addr).unwrap();
            let bytes: Vec<u8> = if k == 1 {
                // Short and well framed, of an unknown kind: read whole, answered whole.
                frame(42, &[])
            } else {
                (0..4096).map(|_| rng.next() as u8).collect()
            };
            let _ = junk.write_all(&bytes);
            // The producer's side closes it (with an `Error` first, which a reset for the
            // bytes it left unread may discard), well before this read's 5 s run out.
            junk.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut told = Vec::new();
            answers.push((junk.read_to_end(&mut told).map_err(|e| e.kind()), told));
        }
        // One that connects and says nothing is dropped after `dead_after`.
        let _silent = std::net::TcpStream::connect(addr).unwrap();
        let mut rx =
            shmflow::net::connect_consumer(addr, "c", geometry(), Config::default()).unwrap();
        let got = rx.recv().unwrap().unwrap().to_vec().unwrap();
        assert!(rx.recv().unwrap().is_none());
        (answers, got)
    });
    let mut tx = l
        .accept_producer_timeout("c", geometry(), Duration::from_secs(20))
        .unwrap();
    tx.send(b"after the junk").unwrap();
    tx.close_timeout(Duration::from_secs(10)).unwrap();
    let (answers, got) = peers.join().unwrap();
    assert_eq!(got, b"after the junk");
    for (a, _) in &answers {
        use std::io::ErrorKind::{TimedOut, WouldBlock};
        assert!(!matches!(a, Err(WouldBlock | TimedOut)), "left open: {a:?}");
    }
    // The one read whole was told why: an `Error` (kind 6) for the connection, code 3.
    let told = &answers[1].1;
    assert!(told.len() >= 22 && told[9] == 6, "{told:?}");
    assert_eq!(
        told[12..20],
        [0xFF, 0xFF, 0xFF, 0xFF, 3, 0, 0, 0],
        "{told:?}"
    );
    let why = String::from_utf8_lossy(&told[22..]);
    assert!(why.contains("unknown message kind 42"), "{why}");
}

#[test]
fn plaintext_beyond_loopback_is_refused_unless_asked_for() {
    let rt = runtime();
    rt.block_on(async {
        let e = Server::bind("0.0.0.0:0".parse().unwrap(), Config::default())
            .await
            .unwrap_err();
        assert!(matches!(e, SetupError::PlaintextRefused { .. }), "{e}");
        assert!(e.to_string().contains("TLS"), "{e}");
        let e = Client::connect("192.0.2.1:9".parse().unwrap(), Config::default())
            .await
            .unwrap_err();
        assert!(matches!(e, SetupError::PlaintextRefused { .. }), "{e}");
        Server::bind(
            "0.0.0.0:0".parse().unwrap(),
            Config::default().insecure_plaintext(),
        )
        .await
        .unwrap();
    });
}

// ----- TLS ----------------------------------------------------------------------------------

#[test]
fn mutual_tls_carries_records_and_refuses_a_stranger() {
    let pki = Pki::new("shmflow test authority");
    let other = Pki::new("another authority");
    let rt = runtime();
    let (mut tx, rx) = shmflow::pair(geometry()).unwrap();
    let (tx_b, mut rx_b) = shmflow::pair(geometry()).unwrap();
    let (tx_c, _rx_c) = shmflow::pair(geometry()).unwrap();
    rt.block_on(async {
        let server_cfg = Config::default().tls(pki.tls("localhost"));
        let mut s = Server::bind("127.0.0.1:0".parse().unwrap(), server_cfg)
            .await
            .unwrap();
        s.export("c", rx).unwrap();
        let addr = s.local_addr().unwrap();
        let server = tokio::spawn(s.run());
        // A client whose certificate another authority signed is refused.
        let stranger = Client::connect(addr, Config::default().tls(other.tls("client"))).await;
        let refused = match stranger {
            Err(e) => e.to_string(),
            Ok(mut c) => {
                // TLS 1.3: the client learns of the refusal at its first read.
                c.import("c", tx_c).unwrap();
                let out = c.run().await;
                format!("{:?}", out[0].result)
            }
        };
        assert!(
            refused.contains("TLS")
                || refused.contains("Io")
                || refused.contains("closed")
                || refused.contains("Remote"),
            "{refused}"
        );
        let mut c = Client::connect(addr, Config::default().tls(pki.tls("client")))
            .await
            .unwrap();
        c.import("c", tx_b).unwrap();
        let client = tokio::spawn(c.run());
        tokio::task::spawn_blocking(move || {
            for i in 0..1000u32 {
                tx.send(&i.to_le_bytes()).unwrap();
            }
        })
        .await
        .unwrap();
        let n = tokio::task::spawn_blocking(move || {
            let mut n = 0u32;
            while let Some(r) = rx_b.recv().unwrap() {
                assert_eq!(r.as_bytes().unwrap(), &n.to_le_bytes());
                n += 1;
            }
            n
        })
        .await
        .unwrap();
        assert_eq!(n, 1000);
        assert!(matches!(client.await.unwrap()[0].result, Ok(Ended::Clean)));
        let report = server.await.unwrap();
        assert!(
            report
                .refused
                .iter()
                .any(|(_, e)| matches!(e, LinkError::Tls(_))),
            "{report:?}"
        );
    });
}

// ----- a gate mixing local and remote channels -------------------------------------------------

#[test]
fn a_gate_reads_a_local_and_a_remote_channel() {
    let name = common::unique_name("netgate");
    let mut gate = Gate::create(
        &name,
        GateGeometry::new(2)
            .with_exclusive(2)
            .with_floating(4)
            .with_segment_size(4096),
    )
    .unwrap();
    let local = Producer::open_channel(&name, 0).unwrap();
    let remote_in = Producer::open_channel(&name, 1).unwrap();
    let (remote_out, rx) = shmflow::pair(geometry()).unwrap();
    let rt = runtime();
    let bridge = rt.spawn(async move {
        let mut s = Server::bind("127.0.0.1:0".parse().unwrap(), Config::default())
            .await
            .unwrap();
        s.export("far", rx).unwrap();
        let addr = s.local_addr().unwrap();
        let server = tokio::spawn(s.run());
        let mut c = Client::connect(addr, Config::default()).await.unwrap();
        c.import("far", remote_in).unwrap();
        (c.run().await, server.await.unwrap())
    });
    let n = 5000u64;
    let writers: Vec<_> = [local, remote_out]
        .into_iter()
        .map(|mut p| {
            std::thread::spawn(move || {
                let mut rec = Vec::new();
                for seq in 0..n {
                    make_record(seq, len_of(seq), &mut rec);
                    p.send(&rec).unwrap();
                }
            })
        })
        .collect();
    let mut next = [0u64; 2];
    let mut ended = 0;
    let mut scratch = Vec::new();
    while let Some(m) = gate.recv().unwrap() {
        match m {
            GateMessage::Record { channel, record } => {
                let v = record.to_vec().unwrap();
                check_record(
                    next[channel as usize],
                    len_of(next[channel as usize]),
                    &v,
                    &mut scratch,
                )
                .unwrap();
                next[channel as usize] += 1;
            }
            GateMessage::EndOfPartition { .. } => ended += 1,
            other => panic!("{other:?}"),
        }
    }
    for w in writers {
        w.join().unwrap();
    }
    assert_eq!(next, [n, n]);
    assert_eq!(ended, 2);
    let (outcomes, report) = rt.block_on(bridge).unwrap();
    assert!(
        matches!(outcomes[0].result, Ok(Ended::Clean)),
        "{outcomes:?}"
    );
    assert!(matches!(report.channels[0].result, Ok(Ended::Clean)));
}

#[test]
fn a_remote_channel_in_a_gate_carries_aligned_and_unaligned_barriers() {
    use shmflow::{Alignment, Released};
    let name = common::unique_name("netbarrier");
    let mut gate = Gate::create(
        &name,
        GateGeometry::new(2)
            .with_exclusive(2)
            .with_floating(2)
            .with_segment_size(4096),
    )
    .unwrap();
    let local = Producer::open_channel(&name, 0).unwrap();
    let remote_in = Producer::open_channel(&name, 1).unwrap();
    let (remote_out, rx) = shmflow::pair(geometry()).unwrap();
    let rt = runtime();
    let bridge = rt.spawn(async move {
        let mut s = Server::bind("127.0.0.1:0".parse().unwrap(), Config::default())
            .await
            .unwrap();
        s.export("far", rx).unwrap();
        let addr = s.local_addr().unwrap();
        let server = tokio::spawn(s.run());
        let mut c = Client::connect(addr, Config::default()).await.unwrap();
        c.import("far", remote_in).unwrap();
        (c.run().await, server.await.unwrap())
    });
    // Each side: 50 records and aligned barrier 1; once the gate has released 1, 50 records,
    // unaligned barrier 2 and 50 records (sent at once, 2 could overtake 1, which a gate then
    // takes as subsumed by 2).
    let go = std::sync::Arc::new(std::sync::Barrier::new(3));
    let writers: Vec<_> = [local, remote_out]
        .into_iter()
        .map(|mut p| {
            let go = go.clone();
            std::thread::spawn(move || {
                let mut seq = 0u64;
                let mut records = |p: &mut Producer| {
                    for _ in 0..50 {
                        p.send(&seq.to_le_bytes()).unwrap();
                        seq += 1;
                    }
                };
                records(&mut p);
                p.send_barrier(1, Alignment::Aligned, b"").unwrap();
                go.wait();
                records(&mut p);
                p.send_barrier(2, Alignment::Unaligned, b"").unwrap();
                records(&mut p);
            })
        })
        .collect();
    let seq =
        |r: &shmflow::Record<'_>| u64::from_le_bytes(r.as_bytes().unwrap().try_into().unwrap());
    let mut next = [0u64; 2];
    let (mut released, mut ended, mut inflight_end) = (Vec::new(), 0, false);
    let mut unaligned = false;
    while let Some(m) = gate.recv_timeout(Duration::from_secs(30)).unwrap() {
        match m {
            GateMessage::Record { channel, record } => {
                let s = seq(&record);
                assert_eq!(s, next[channel as usize]);
                // Before 2's release: anything; after it, only what follows a channel's barrier.
                assert!(!unaligned || inflight_end || s >= 100, "{channel}:{s}");
                next[channel as usize] += 1;
            }
            GateMessage::InFlight {
                channel,
                checkpoint: 2,
                record,
            } => {
                let s = seq(&record);
                assert_eq!(s, next[channel as usize]);
                assert!((50..100).contains(&s), "{channel}:{s}");
                next[channel as usize] += 1;
            }
            GateMessage::Barrier {
                id: 1, released: r, ..
            } => {
                assert_eq!(r, Released::Aligned);
                assert_eq!(
                    next,
                    [50, 50],
                    "aligned across the local and the remote channel"
                );
                released.push(1);
                go.wait();
            }
            GateMessage::Barrier {
                id: 2, released: r, ..
            } => {
                assert_eq!(r, Released::Unaligned { timed_out: false });
                released.push(2);
                unaligned = true;
            }
            GateMessage::InFlightEnd { id: 2 } => {
                assert!(next.iter().all(|&n| n >= 100), "{next:?}");
                inflight_end = true;
            }
            GateMessage::EndOfPartition { .. } => ended += 1,
            other => panic!("{other:?}"),
        }
    }
    for w in writers {
        w.join().unwrap();
    }
    assert_eq!(released, [1, 2]);
    assert!(inflight_end);
    assert_eq!((next, ended), ([150, 150], 2));
    let (outcomes, _) = rt.block_on(bridge).unwrap();
    assert!(
        matches!(outcomes[0].result, Ok(Ended::Clean)),
        "{outcomes:?}"
    );
}

#[test]
fn a_client_claiming_absurd_credit_ends_that_channel_with_a_typed_error() {
    let rt = runtime();
    let (_tx, rx) = shmflow::pair(geometry()).unwrap();
    let report = rt.block_on(async {
        let mut s = Server::bind("127.0.0.1:0".parse().unwrap(), Config::default())
            .await
            .unwrap();
        s.export("a", rx).unwrap();
        let addr = s.local_addr().unwrap();
        let server = tokio::spawn(s.run());
        let mut c = TcpStream::connect(addr).await.unwrap();
        let mut body = Vec::new();
        body.put_u32_le(0);
        body.put_u32_le(u32::MAX); // credit: four billion segments
        body.put_u32_le(4096);
        body.put_u16_le(1);
        body.extend_from_slice(b"a");
        c.write_all(&frame(1, &body)).await.unwrap();
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut sink)).await;
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the server ends: its only channel ended")
            .unwrap()
    });
    match &report.channels[0].result {
        Err(LinkError::Protocol(ProtocolError::Credit { .. })) => {}
        other => panic!("{other:?}"),
    }
}
