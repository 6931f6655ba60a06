//! Instruction counts of the hot path, for callgrind (deterministic on a noisy host):
//! one thread sends batches of 64-byte records and drains them.
//!
//! ```text
//! cargo build --release --example hotpath
//! valgrind --tool=callgrind target/release/examples/hotpath 200000
//! ```

use shmflow::{FlushPolicy, Geometry};

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let (mut p, mut c) = shmflow::pair(Geometry::default()).unwrap();
    p.set_flush_policy(FlushPolicy::Explicit);
    let rec = [7u8; 64];
    let mut sum = 0u64;
    let mut sent = 0;
    while sent < n {
        for _ in 0..400 {
            let mut claim = p.claim(64).unwrap();
            claim.copy_from_slice(&rec);
            claim.commit();
        }
        sent += 400;
        p.flush().unwrap();
        c.drain(usize::MAX, |r| {
            sum += r.as_bytes().unwrap()[0] as u64;
            Ok::<_, shmflow::RecvError>(())
        })
        .unwrap();
    }
    println!("{sum}");
}
