//! Fuzz target: the network bridges fed attacker-controlled bytes over a real loopback
//! connection.
//!
//! ```text
//! cd fuzz && ./seeds.py && RUSTC_BOOTSTRAP=1 cargo fuzz run wire -- -max_total_time=300
//! ```
//!
//! The first input byte picks the side under attack:
//! - even: a `Client` that requested two channels reads the rest of the input as the
//!   server's answer (decoder, frame checks of every buffer against its segment, credit
//!   arithmetic, writes into the local channels), and the local consumers read what arrived;
//! - odd: a `Server` exporting a channel reads the rest as a client's requests and credits.
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

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let bytes = rest.to_vec();
    rt().block_on(async move {
        if pick % 2 == 0 {
            attack_client(bytes).await
        } else {
            attack_server(bytes).await
        }
    });
});
