//! Instruction counts of the hot path, for callgrind (deterministic on a noisy host): one
//! thread writes batches of 64-byte records and reads them back.
//!
//! ```text
//! cargo build --release --example hotpath
//! valgrind --tool=callgrind target/release/examples/hotpath 200000 tuned
//! valgrind --tool=callgrind target/release/examples/hotpath 200000 plain
//! valgrind --tool=callgrind target/release/examples/hotpath 200000 batch
//! valgrind --tool=callgrind target/release/examples/hotpath 200000 gate
//! cargo build --release --features tokio --example hotpath
//! valgrind --tool=callgrind target/release/examples/hotpath 200000 async
//! valgrind --tool=callgrind target/release/examples/hotpath 200000 async-send
//! valgrind --tool=callgrind target/release/examples/hotpath 200000 async-recv
//! ```
//!
//! `tuned`: `FlushPolicy::Explicit`, `claim`, one `flush` per batch, `drain`. `batch`: as
//! `tuned`, the records claimed and committed by `claim_batch` (as many as fit the segment in
//! hand, up to those left of the 400). `gate`: as `plain`, read through a gate of one channel
//! with `Gate::recv`. `plain`: every
//! setting at its default, `send`, and `recv` record by record. `async`: as `plain`, with
//! `send_async` and `recv_async` awaited on a current-thread tokio runtime; `async-send` and
//! `async-recv` await only that side (the other blocking, in the same task), to tell the two
//! sides' costs apart.

use clap::{CommandFactory, Parser, ValueEnum};
use shmflow::{FlushPolicy, Geometry};

/// Instruction counts of the hot path, for callgrind: one thread writes batches of 64-byte
/// records and reads them back.
#[derive(Parser)]
#[command(name = "hotpath")]
struct Args {
    /// Records per run.
    #[arg(default_value_t = 1_000_000)]
    records: u64,
    /// How both sides are written.
    #[arg(value_enum, default_value_t = Mode::Tuned)]
    mode: Mode,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Explicit flushes, claim, drain.
    Tuned,
    /// As tuned, with claim_batch.
    Batch,
    /// send and recv with every setting at its default.
    Plain,
    /// As plain, read through a gate of one channel.
    Gate,
    /// As plain, awaited (needs the tokio feature).
    Async,
    /// Only the sending side awaited.
    AsyncSend,
    /// Only the receiving side awaited.
    AsyncRecv,
}

fn main() {
    let Args { records: n, mode } = Args::parse();
    let is_async = matches!(mode, Mode::Async | Mode::AsyncSend | Mode::AsyncRecv);
    let plain = mode == Mode::Plain;
    let (mut p, mut c) = shmflow::pair(Geometry::default()).unwrap();
    #[cfg(feature = "tokio")]
    if is_async {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // One loop per mode, each compiled on its own, so that no mode pays for another's branches.
        let sum = rt.block_on(async {
            match mode {
                Mode::Async => awaited::<true, true>(&mut p, &mut c, n).await,
                Mode::AsyncSend => awaited::<true, false>(&mut p, &mut c, n).await,
                _ => awaited::<false, true>(&mut p, &mut c, n).await,
            }
        });
        println!("{sum}");
        return;
    }
    if is_async {
        Args::command()
            .error(
                clap::error::ErrorKind::InvalidValue,
                "the async modes need the tokio feature",
            )
            .exit();
    }
    if mode == Mode::Gate {
        println!("{}", through_a_gate(n));
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
            if mode == Mode::Batch {
                let mut done = 0;
                while done < 400 {
                    let mut batch = p.claim_batch(64, 400 - done).unwrap();
                    for r in batch.iter_mut() {
                        r.copy_from_slice(&rec);
                    }
                    done += batch.len();
                    batch.commit();
                }
            } else {
                for _ in 0..400 {
                    let mut claim = p.claim(64).unwrap();
                    claim.copy_from_slice(&rec);
                    claim.commit();
                }
            }
            p.flush().unwrap();
            c.try_drain(usize::MAX, |r| {
                sum += r.as_bytes().unwrap()[0] as u64;
                Ok::<_, shmflow::RecvError>(())
            })
            .unwrap();
        }
        sent += 400;
    }
    println!("{sum}");
}

/// Sends `n` 64 B records in batches of 400 into a gate's one channel, each batch read back
/// with `Gate::recv`.
fn through_a_gate(n: u64) -> u64 {
    let (mut gate, handles) =
        shmflow::Gate::create_anonymous(shmflow::GateGeometry::new(1)).unwrap();
    let mut p = shmflow::Producer::from_handle(handles.into_iter().next().unwrap()).unwrap();
    let rec = [7u8; 64];
    let mut sum = 0u64;
    let mut sent = 0;
    while sent < n {
        for _ in 0..400 {
            p.send(&rec).unwrap();
        }
        p.flush().unwrap();
        let mut got = 0;
        while got < 400 {
            if let shmflow::GateMessage::Record { record, .. } = gate.recv().unwrap().unwrap() {
                sum += record.as_bytes().unwrap()[0] as u64;
                got += 1;
            }
        }
        sent += 400;
    }
    sum
}

/// Sends and receives `n` 64 B records in batches of 400, awaiting the sends if `SEND` and the
/// receives if `RECV` (the other side blocking, in the same task).
#[cfg(feature = "tokio")]
async fn awaited<const SEND: bool, const RECV: bool>(
    p: &mut shmflow::Producer,
    c: &mut shmflow::Consumer,
    n: u64,
) -> u64 {
    let rec = [7u8; 64];
    let mut sum = 0u64;
    let mut sent = 0;
    while sent < n {
        for _ in 0..400 {
            if SEND {
                p.send_async(&rec).await.unwrap();
            } else {
                p.send(&rec).unwrap();
            }
        }
        for _ in 0..400 {
            let r = if RECV {
                c.recv_async().await.unwrap().unwrap()
            } else {
                c.recv().unwrap().unwrap()
            };
            sum += r.as_bytes().unwrap()[0] as u64;
        }
        sent += 400;
    }
    sum
}
