//! Streams records of a given size between two direct network ends over loopback for a few
//! seconds (a sender thread and a reader thread) and prints the rate: for profiling the
//! direct ends (`perf record -g target/release/examples/direct_stream 65536 3`).
//!
//! Usage: `direct_stream [record bytes] [seconds] [explicit]`

use std::time::{Duration, Instant};

use shmflow::net::{connect_consumer, Config, Listener};
use shmflow::{FlushPolicy, Geometry};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let len: usize = args.next().map_or(Ok(65536), |a| a.parse())?;
    let secs: f64 = args.next().map_or(Ok(3.0), |a| a.parse())?;
    let explicit = args.next().is_some_and(|a| a == "explicit");
    let l = Listener::bind("127.0.0.1:0".parse()?, Config::default())?;
    let addr = l.local_addr()?;
    let reader = std::thread::spawn(
        move || -> Result<(u64, u64), Box<dyn std::error::Error + Send + Sync>> {
            let mut rx = connect_consumer(addr, "s", Geometry::default(), Config::default())?;
            let (mut n, mut bytes) = (0u64, 0u64);
            while let Some(mut r) = rx.recv()? {
                match r.as_bytes() {
                    Some(b) => bytes += b.len() as u64,
                    None => {
                        while let Some(p) = r.next_part()? {
                            bytes += p.len() as u64;
                        }
                    }
                }
                n += 1;
            }
            Ok((n, bytes))
        },
    );
    let mut tx = l.accept_producer("s", Geometry::default())?;
    if explicit {
        tx.set_flush_policy(FlushPolicy::Explicit);
    }
    let rec = vec![7u8; len];
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs_f64(secs) {
        for _ in 0..64 {
            tx.send(&rec)?;
        }
    }
    tx.close_timeout(Duration::from_secs(30))?;
    let (n, bytes) = reader.join().expect("reader").map_err(|e| e.to_string())?;
    let s = start.elapsed().as_secs_f64();
    println!(
        "{n} records, {:.3} GB/s, {:.1} M records/s",
        bytes as f64 / s / 1e9,
        n as f64 / s / 1e6
    );
    Ok(())
}
