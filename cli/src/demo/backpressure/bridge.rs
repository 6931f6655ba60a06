//! `shmflow demo backpressure --remote`: the two bridges. The producer's channel is served on
//! a loopback port by a `net::Server` in this process; the consumer's channel, in the child, is
//! fed by a `net::Client`.

use std::time::Duration;

use shmflow::monitor::Monitor;
use shmflow::net::{Client, Config, Server};
use shmflow::{Consumer, Geometry, Producer};

pub(super) struct Bridge {
    pub(super) port: u16,
    pub(super) thread: std::thread::JoinHandle<Result<(), String>>,
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

/// Serves the producer's channel `name` on a loopback port.
pub(super) fn serve(name: &str) -> Result<Bridge, String> {
    let consumer = Consumer::open(name).map_err(|e| e.to_string())?;
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let port = std_listener.local_addr().map_err(|e| e.to_string())?.port();
    drop(std_listener);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        runtime()?.block_on(async move {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let mut s = match Server::bind(addr, Config::default()).await {
                Ok(s) => {
                    let _ = ready_tx.send(None);
                    s
                }
                Err(e) => {
                    let _ = ready_tx.send(Some(e.to_string()));
                    return Err(e.to_string());
                }
            };
            s.export("demo", consumer).map_err(|e| e.to_string())?;
            for o in s.run().await.channels {
                o.result.map_err(|e| format!("{}: {e}", o.name))?;
            }
            Ok(())
        })
    });
    if let Ok(Some(e)) = ready_rx.recv() {
        return Err(e);
    }
    Ok(Bridge { port, thread })
}

/// The geometry of the producer's region (the consumer's must have the same segments).
pub(super) fn geometry_of_demo(in_name: &str) -> Result<Geometry, String> {
    let out = in_name
        .strip_suffix("-in")
        .ok_or("a region name ending in -in")?;
    Ok(Monitor::open(out).map_err(|e| e.to_string())?.geometry())
}

/// Feeds the local channel `name` from the channel served on `port`.
pub(super) fn receive(
    name: &str,
    port: u16,
) -> Result<std::thread::JoinHandle<Result<(), String>>, String> {
    let producer = Producer::open(name).map_err(|e| e.to_string())?;
    Ok(std::thread::spawn(move || {
        runtime()?.block_on(async move {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let start = std::time::Instant::now();
            let mut c = loop {
                match Client::connect(addr, Config::default()).await {
                    Ok(c) => break c,
                    Err(e) if start.elapsed() > Duration::from_secs(10) => {
                        return Err(e.to_string())
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            };
            c.import("demo", producer).map_err(|e| e.to_string())?;
            for o in c.run().await {
                o.result.map_err(|e| format!("{}: {e}", o.name))?;
            }
            Ok(())
        })
    }))
}

/// A read-only view of the consumer's region, once the child has made it.
pub(super) fn monitor(name: &str) -> Result<Monitor, String> {
    let start = std::time::Instant::now();
    loop {
        match Monitor::open(name) {
            Ok(m) => return Ok(m),
            Err(_) if start.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}
