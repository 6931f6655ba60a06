//! Instruction counts of the hot path, for callgrind (deterministic on a noisy host): one
//! thread writes batches of 64-byte records and reads them back.
//!
//! ```text
//! cargo build --release --example hotpath
//! valgrind --tool=callgrind target/release/examples/hotpath 200000 tuned
//! valgrind --tool=callgrind target/release/examples/hotpath 200000 plain
//! cargo build --release --features tokio --example hotpath
//! valgrind --tool=callgrind target/release/examples/hotpath 200000 async
//! ```
//!
//! `tuned`: `FlushPolicy::Explicit`, `claim`, one `flush` per batch, `drain`. `plain`: every
//! setting at its default, `send`, and `recv` record by record. `async`: as `plain`, with
//! `send_async` and `recv_async` awaited on a current-thread tokio runtime.

use shmflow::{FlushPolicy, Geometry};

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let mode = std::env::args().nth(2).unwrap_or_default();
    let plain = mode == "plain";
    let (mut p, mut c) = shmflow::pair(Geometry::default()).unwrap();
    #[cfg(feature = "tokio")]
    if mode == "async" {
        let rec = [7u8; 64];
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let sum = rt.block_on(async {
            let mut sum = 0u64;
            let mut sent = 0;
            while sent < n {
                for _ in 0..400 {
                    p.send_async(&rec).await.unwrap();
                }
                for _ in 0..400 {
                    let r = c.recv_async().await.unwrap().unwrap();
                    sum += r.as_bytes().unwrap()[0] as u64;
                }
                sent += 400;
            }
            sum
        });
        println!("{sum}");
        return;
    }
    if !plain {
        p.set_flush_policy(FlushPolicy::Explicit);
    }
    let rec = [7u8; 64];
    let mut sum = 0u64;
    let mut sent = 0;
    while sent < n {
        if plain {
            for _ in 0..400 {
                p.send(&rec).unwrap();
            }
            for _ in 0..400 {
                let r = c.recv().unwrap().unwrap();
                sum += r.as_bytes().unwrap()[0] as u64;
            }
        } else {
            for _ in 0..400 {
                let mut claim = p.claim(64).unwrap();
                claim.copy_from_slice(&rec);
                claim.commit();
            }
            p.flush().unwrap();
            c.drain(usize::MAX, |r| {
                sum += r.as_bytes().unwrap()[0] as u64;
                Ok::<_, shmflow::RecvError>(())
            })
            .unwrap();
        }
        sent += 400;
    }
    println!("{sum}");
}
