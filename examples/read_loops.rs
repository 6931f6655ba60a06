//! Reader loop shapes compared: `drain`, `while let Some(r) = rx.recv()?` and
//! `recv().unwrap()`, two threads, 64 B records, busy-poll, `Explicit` flush. Runs alternate
//! so that the host's noise spreads over all three; prints medians and spreads.
//!
//! ```text
//! cargo run --release --example read_loops [ROUNDS]
//! ```

use std::time::{Duration, Instant};

use clap::Parser;
use shmflow::{Consumer, FlushPolicy, Geometry, Result, WaitStrategy};

const N: u64 = 5_000_000;

#[inline(never)]
fn by_drain(c: &mut Consumer) -> Result<u64> {
    let (mut sum, mut n) = (0u64, 0u64);
    while n < N {
        let k = c.try_drain(usize::MAX, |r| {
            sum += u64::from(r.as_bytes().unwrap()[0]);
            Ok::<_, shmflow::Error>(())
        })?;
        n += k as u64;
        if k == 0 {
            std::hint::spin_loop();
        }
    }
    Ok(sum)
}

#[inline(never)]
fn by_recv_question_mark(c: &mut Consumer) -> Result<u64> {
    let (mut sum, mut n) = (0u64, 0u64);
    while let Some(r) = c.recv()? {
        sum += u64::from(r.as_bytes().unwrap()[0]);
        n += 1;
        if n == N {
            break;
        }
    }
    Ok(sum)
}

#[inline(never)]
fn by_recv_unwrap(c: &mut Consumer) -> Result<u64> {
    let (mut sum, mut n) = (0u64, 0u64);
    while let Some(r) = c.recv().unwrap() {
        sum += u64::from(r.as_bytes().unwrap()[0]);
        n += 1;
        if n == N {
            break;
        }
    }
    Ok(sum)
}

type Reader = fn(&mut Consumer) -> Result<u64>;

/// Reader loop shapes compared: `drain`, `while let Some(r) = rx.recv()?` and
/// `recv().unwrap()`, two threads, 64 B records.
#[derive(Parser)]
#[command(name = "read_loops")]
struct Args {
    /// Alternating runs of three ways to read a stream.
    #[arg(default_value_t = 11)]
    rounds: usize,
}

fn main() {
    let rounds = Args::parse().rounds;
    let readers: [(&str, Reader); 3] = [
        ("drain", by_drain),
        ("while let Some(r) = recv()?", by_recv_question_mark),
        ("recv().unwrap()", by_recv_unwrap),
    ];
    let mut rates = vec![Vec::new(); readers.len()];
    let spin = WaitStrategy::BusyPoll(Duration::from_millis(1));
    for _ in 0..rounds {
        for (i, (_, read)) in readers.iter().enumerate() {
            let (mut p, mut c) = shmflow::pair(Geometry::default()).unwrap();
            c.set_wait_strategy(spin);
            p.set_wait_strategy(spin);
            p.set_flush_policy(FlushPolicy::Explicit);
            let writer = std::thread::spawn(move || {
                for i in 0..N {
                    let mut claim = p.claim(64).unwrap();
                    claim.copy_from_slice(&[7u8; 64]);
                    claim.commit();
                    if i % 400 == 0 {
                        p.flush().unwrap();
                    }
                }
                p.flush().unwrap();
                p // dropped after the reader is done: no end of stream mid-run
            });
            let start = Instant::now();
            std::hint::black_box(read(&mut c).unwrap());
            rates[i].push(N as f64 / start.elapsed().as_secs_f64() / 1e6);
            drop(writer.join().unwrap());
        }
    }
    for ((name, _), r) in readers.iter().zip(&mut rates) {
        r.sort_by(f64::total_cmp);
        println!(
            "{name:30} median {:6.1} M records/s   min {:6.1}   max {:6.1}",
            r[r.len() / 2],
            r[0],
            r[r.len() - 1]
        );
    }
}
