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

#[path = "support/args.rs"]
mod args;

use shmflow::{FlushPolicy, Geometry};

const USAGE: &str = "usage: hotpath [RECORDS] [tuned|plain|async]

  RECORDS   records per run (default 1000000)
  MODE      tuned (default): Explicit flushes, claim, drain; plain: send and recv with every
            setting at its default; async: as plain, awaited (needs the tokio feature)";

fn main() {
    let a = args::parse(USAGE, &[], &[], 2);
    let n: u64 = a.pos(0, 1_000_000);
    let mode = a.pos_str(1).unwrap_or("tuned").to_owned();
    if !["tuned", "plain", "async"].contains(&mode.as_str()) {
        a.fail(&format!("unknown mode {mode:?}"));
    }
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
