//! `shmflow bench --only async`: the async forms against the sync ones, in the same run and
//! between the same processes.
//!
//! Round trips: this process sends a number and awaits its echo; the peer is the sync `echo`
//! of the round-trip group, parking at once (`WaitStrategy::Park`) so that every message is
//! a wake-up on both sides. `rtt_async_current_*` awaits on a current-thread runtime (the
//! loop runs in `block_on`), `rtt_async_multi_*` in a task on a two-worker multi-thread
//! runtime; both with `WaitStrategy::Park`, so that every message is a sleep on the channel's
//! doorbell (the regions are handed to the peer with `PeerHandle::pass_to`), as
//! `rtt_sync_park_*` (the same loop, blocking, also `Park`) is a sleep on the futex.
//! `rtt_async_bridge_*` and `rtt_async_multi_bridge_*` are the current-thread and multi-thread
//! loops with the regions handed as bare descriptors: every message crosses the bridge thread
//! (how named regions wait).
//! `rtt_async_block_*` and `rtt_sync_block_*` are the current-thread and blocking loops with
//! every end at its default (`WaitStrategy::Block`: a bounded look before the doorbell or the
//! futex), what a user gets without tuning.
//! `tokio_uds_rtt_*` is the same loop on a tokio `UnixStream`, against the same peer process
//! kind (a blocking echo, the socket's default).
//!
//! Throughput: 64 B records, every setting at its default; `async_rps` has `send_async` on a
//! current-thread runtime in this process and `while let Some(r) = rx.recv_async().await?`
//! on one in the peer, `sync_plain_rps` the blocking `send` and `recv` loop; `async_drain_rps`
//! has the peer read with `drain_async` instead (the throughput-minded async reader).

use std::time::{Duration, Instant};

use shmflow::{Consumer, FlushPolicy, Geometry, Producer, WaitStrategy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::harness::{
    child, finished, parse_report, records_per_look, touch, LineRec, RawFdOf, REC, RTT_G,
};
use super::roles::{EchoWait, Role};

fn current() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn multi() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Round trips (sorted nanoseconds) after a warm-up of a tenth.
async fn time_rounds_async(rounds: usize, ping: &mut Producer, pong: &mut Consumer) -> Vec<u64> {
    let mut v = Vec::with_capacity(rounds);
    let warm = (rounds / 10).max(1000);
    for i in 0..warm + rounds {
        let t = Instant::now();
        ping.send_pod_async(&(i as u64)).await.unwrap();
        let r = pong.recv_async().await.unwrap().unwrap();
        assert_eq!(r.as_pod::<u64>(), Some(&(i as u64)));
        if i >= warm {
            v.push(t.elapsed().as_nanos() as u64);
        }
    }
    v.sort_unstable();
    v
}

/// How the round trip's end in this process waits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rtt {
    Sync,
    Current,
    /// `Sync`, every end at its default strategy (`Block`).
    SyncBlock,
    /// `Current`, every end at its default strategy (`Block`).
    CurrentBlock,
    Multi,
    /// `Current`, the regions handed without their doorbells: through the bridge.
    Bridge,
    /// `Multi`, through the bridge.
    MultiBridge,
}

pub(crate) fn rtt(rounds: usize, how: Rtt) -> Vec<u64> {
    let (mut ping, ping_peer) = Producer::create_anonymous(RTT_G).unwrap();
    let (mut pong, pong_peer) = Consumer::create_anonymous(RTT_G).unwrap();
    ping.set_flush_policy(FlushPolicy::EveryRecord);
    let (wait, mode) = if matches!(how, Rtt::SyncBlock | Rtt::CurrentBlock) {
        (WaitStrategy::Block, EchoWait::Block)
    } else {
        (WaitStrategy::Park, EchoWait::Parked)
    };
    ping.set_wait_strategy(wait);
    pong.set_wait_strategy(wait);
    let c = if matches!(how, Rtt::Bridge | Rtt::MultiBridge) {
        let fds = [
            ("PING", ping_peer.as_fd_raw()),
            ("PONG", pong_peer.as_fd_raw()),
        ];
        child(&Role::Echo { wait: mode }, &fds, |_| {})
    } else {
        child(&Role::Echo { wait: mode }, &[], |cmd| {
            ping_peer.pass_to(cmd, "PING");
            pong_peer.pass_to(cmd, "PONG");
        })
    };
    drop((ping_peer, pong_peer));
    let (v, ping, mut pong) = match how {
        Rtt::Sync | Rtt::SyncBlock => {
            let v = super::harness::time_rounds(rounds, |i| {
                ping.send_pod(&i).unwrap();
                let r = pong.recv().unwrap().unwrap();
                assert_eq!(r.as_pod::<u64>(), Some(&i));
            });
            (v, ping, pong)
        }
        Rtt::Current | Rtt::CurrentBlock | Rtt::Bridge => current().block_on(async move {
            let v = time_rounds_async(rounds, &mut ping, &mut pong).await;
            (v, ping, pong)
        }),
        Rtt::Multi | Rtt::MultiBridge => multi().block_on(async move {
            tokio::spawn(async move {
                let v = time_rounds_async(rounds, &mut ping, &mut pong).await;
                (v, ping, pong)
            })
            .await
            .unwrap()
        }),
    };
    drop(ping);
    while pong.recv().unwrap().is_some() {}
    finished(c);
    v
}

/// The same loop over a tokio `UnixStream`, the peer a blocking echo.
pub(crate) fn tokio_uds_rtt(rounds: usize) -> Vec<u64> {
    let (mine, c) = super::harness::uds_echo_child();
    mine.set_nonblocking(true).unwrap();
    let v = current().block_on(async move {
        let mut s = tokio::net::UnixStream::from_std(mine).unwrap();
        let mut v = Vec::with_capacity(rounds);
        let warm = (rounds / 10).max(1000);
        let mut buf = [0u8; 8];
        for i in 0..warm + rounds {
            let t = Instant::now();
            s.write_all(&(i as u64).to_le_bytes()).await.unwrap();
            s.read_exact(&mut buf).await.unwrap();
            if i >= warm {
                v.push(t.elapsed().as_nanos() as u64);
            }
        }
        v.sort_unstable();
        v
    });
    finished(c);
    v
}

/// 64 B records at default settings, async on both ends: (records, nanoseconds) as the peer
/// counted them.
pub(crate) fn async_stream(secs: f64, drain: bool) -> (f64, f64) {
    let (mut p, peer) = Producer::create_anonymous(Geometry::default()).unwrap();
    let sink = if drain {
        Role::AsyncDrainSink
    } else {
        Role::AsyncSink
    };
    let c = child(&sink, &[], |cmd| peer.pass_to(cmd, "CH"));
    drop(peer);
    // As the blocking loop's record: 64 bytes of a length the compiler sees.
    let rec = LineRec::new();
    current().block_on(async move {
        let end = Instant::now() + Duration::from_secs_f64(secs);
        while Instant::now() < end {
            for _ in 0..records_per_look(REC) {
                p.send_async(&rec.0).await.unwrap();
            }
        }
    });
    parse_report(&finished(c))
}

/// The peer of [`async_stream`]: the plain loop, awaited, or (`drain`) `drain_async`.
pub(crate) fn async_sink(drain: bool) -> Result<(), String> {
    let mut c = Consumer::from_env("CH").map_err(|e| e.to_string())?;
    let (n, sum, start) = current()
        .block_on(async move {
            let (mut n, mut sum, mut start) = (0u64, 0u64, None);
            if drain {
                loop {
                    let k = c
                        .drain_async(usize::MAX, |r| {
                            start.get_or_insert_with(Instant::now);
                            if let Some(b) = r.as_bytes() {
                                sum = sum.wrapping_add(touch(b));
                            }
                            Ok::<_, shmflow::RecvError>(())
                        })
                        .await?;
                    if k == 0 {
                        break;
                    }
                    n += k as u64;
                }
            } else {
                while let Some(r) = c.recv_async().await? {
                    start.get_or_insert_with(Instant::now);
                    if let Some(b) = r.as_bytes() {
                        sum = sum.wrapping_add(touch(b));
                    }
                    n += 1;
                }
            }
            Ok::<_, shmflow::RecvError>((n, sum, start))
        })
        .map_err(|e| e.to_string())?;
    std::hint::black_box(sum);
    let ns = start.map(|s| s.elapsed().as_nanos()).unwrap_or(1);
    println!("{n} {ns}");
    Ok(())
}
