//! Fuzz target: the network bridges fed attacker-controlled bytes over a real loopback
//! connection.
//!
//! ```text
//! cd fuzz && ./seeds.py && RUSTC_BOOTSTRAP=1 cargo fuzz run wire -- -max_total_time=300
//! ```
//!
//! The first input byte picks the side under attack (its value modulo 4):
//! - 0: a `Client` that requested two channels reads the rest of the input as the
//!   server's answer (decoder, frame checks of every buffer against its segment, credit
//!   arithmetic, writes into the local channels), and the local consumers read what arrived;
//! - 1: a `Server` exporting a channel reads the rest as a client's requests and credits;
//! - 2: a direct consumer (`net::connect_consumer`) reads the rest as its sender's messages
//!   (large buffers go straight into its segments), and its reader reads what arrived;
//! - 3: a direct producer (`net::Listener::accept_producer_timeout`) reads the rest as its
//!   receiver's request and credits while it sends.
//!
//! A valid prefix can be built from the second byte on: inputs that start with a well-formed
//! `Request` or `Buffer` reach the deeper checks. Success is the absence of a crash: no panic,
//! no unbounded allocation, every call returns (the peer closes after its bytes, so every run
//! ends within the bridges' own deadlines).
#![no_main]

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use shmflow::net::{Client, Config, Server};
use shmflow::Geometry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    })
}

fn geometry() -> Geometry {
    Geometry {
        segment_size: 4096,
        segment_count: 2,
    }
}

fn config() -> Config {
    Config::default().heartbeat(Duration::from_millis(20), Duration::from_millis(40))
}

async fn attack_client(bytes: Vec<u8>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let peer = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let _ = s.write_all(&bytes).await;
        let _ = s.shutdown().await;
        let mut sink = [0u8; 4096];
        while let Ok(n) = s.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    });
    let (tx0, mut rx0) = shmflow::pair(geometry()).unwrap();
    let (tx1, mut rx1) = shmflow::pair(geometry()).unwrap();
    let mut c = Client::connect(addr, config()).await.unwrap();
    c.import("a", tx0).unwrap();
    c.import("b", tx1).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), c.run())
        .await
        .expect("the client must end");
    for rx in [&mut rx0, &mut rx1] {
        while let Ok(Some(r)) = rx.try_recv() {
            let mut r = r;
            while let Ok(Some(part)) = r.try_next_part() {
                std::hint::black_box(part);
            }
        }
    }
    let _ = peer.await;
}

async fn attack_server(bytes: Vec<u8>) {
    let (_tx, rx) = shmflow::pair(geometry()).unwrap();
    let mut s = Server::bind("127.0.0.1:0".parse().unwrap(), config())
        .await
        .unwrap();
    s.export("a", rx).unwrap();
    let addr: SocketAddr = s.local_addr().unwrap();
    let server = tokio::spawn(s.run());
    let mut c = TcpStream::connect(addr).await.unwrap();
    let _ = c.write_all(&bytes).await;
    let _ = c.shutdown().await;
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut sink)).await;
    drop(c);
    // The connection was answered and closed: what the input could do is done. (The
    // server itself runs until its channel ends.)
    server.abort();
    let _ = server.await;
}

/// A raw peer on loopback that sends `bytes`, ends its side, and reads until the other
/// side closes.
fn raw_peer(stream: std::net::TcpStream, bytes: Vec<u8>) -> std::thread::JoinHandle<()> {
    use std::io::{Read, Write};
    std::thread::spawn(move || {
        let mut s = stream;
        let _ = s.write_all(&bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut sink = [0u8; 4096];
        while let Ok(n) = s.read(&mut sink) {
            if n == 0 {
                break;
            }
        }
    })
}

fn attack_direct_consumer(bytes: Vec<u8>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        raw_peer(s, bytes).join().unwrap();
    });
    let mut rx = shmflow::net::connect_consumer(addr, "a", geometry(), config()).unwrap();
    // Ends: the peer closes after its bytes, which ends the stream one way or another.
    while let Ok(Some(mut r)) = rx.recv() {
        while let Ok(Some(part)) = r.next_part() {
            std::hint::black_box(part);
        }
    }
    drop(rx);
    peer.join().unwrap();
}

fn attack_direct_producer(bytes: Vec<u8>) {
    let l = shmflow::net::Listener::bind("127.0.0.1:0".parse().unwrap(), config()).unwrap();
    let addr = l.local_addr().unwrap();
    let peer = raw_peer(std::net::TcpStream::connect(addr).unwrap(), bytes);
    if let Ok(mut tx) = l.accept_producer_timeout("a", geometry(), Duration::from_millis(200)) {
        for i in 0..64u64 {
            if tx
                .send_timeout(&i.to_le_bytes().repeat(100), Duration::from_millis(50))
                .is_err()
            {
                break;
            }
        }
        let _ = tx.close_timeout(Duration::from_millis(200));
    }
    peer.join().unwrap();
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let bytes = rest.to_vec();
    match pick % 4 {
        0 => rt().block_on(attack_client(bytes)),
        1 => rt().block_on(attack_server(bytes)),
        2 => attack_direct_consumer(bytes),
        _ => attack_direct_producer(bytes),
    }
});
