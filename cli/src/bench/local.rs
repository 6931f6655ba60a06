//! shmflow between two local processes against the OS's pipes and Unix sockets, and the
//! peers of those measures: round trips (`rtt_*`, `uds_rtt_*`, `pipe_rtt_*`) and streams of
//! records (`small_rps`, `plain_rps`, `bulk_gbps`, `*_batched_rps`).

use std::io::{BufReader, BufWriter, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::process::Child;
use std::time::{Duration, Instant};

use shmflow::{Consumer, FlushPolicy, Geometry, LatencyMarkers, Producer, WaitStrategy};

use super::harness::{
    child, env_fd, finished, parse_report, pin, pin_cpu0, pipe_pair, records_per_look,
    send_batched, time_rounds, touch, uds_echo_child, unpin, LineBuf, LineRec, RawFdOf, REC, RTT_G,
};
use super::roles::{EchoWait, Role};
use super::{Cfg, BULK, SPIN};

// ----- round trips -----------------------------------------------------------------------------

/// Round trips of a number over two channels, this side waiting as `wait` says (sorted
/// nanoseconds); `same_cpu`: both processes pinned to CPU 0.
pub(super) fn rtt_shmflow(cfg: &Cfg, wait: WaitStrategy, same_cpu: bool) -> Vec<u64> {
    let (mut ping, ping_peer) = Producer::create_anonymous(RTT_G).unwrap();
    let (mut pong, pong_peer) = Consumer::create_anonymous(RTT_G).unwrap();
    ping.set_flush_policy(FlushPolicy::EveryRecord);
    ping.set_wait_strategy(wait);
    pong.set_wait_strategy(wait);
    // The echo spins when this side spins, and otherwise waits at the default strategy
    // (`Block`), also when this side parks.
    let mode = match wait {
        SPIN => EchoWait::Spin,
        _ => EchoWait::Block,
    };
    let fds = [
        ("PING", ping_peer.as_fd_raw()),
        ("PONG", pong_peer.as_fd_raw()),
    ];
    if same_cpu {
        pin(0);
    }
    let c = child(&Role::Echo { wait: mode }, &fds, |cmd| {
        if same_cpu {
            pin_cpu0()(cmd)
        }
    });
    drop((ping_peer, pong_peer));
    let v = time_rounds(cfg.rounds, |i| {
        ping.send_pod(&i).unwrap();
        let r = pong.recv().unwrap().unwrap();
        assert_eq!(r.as_pod::<u64>(), Some(&i));
    });
    drop(ping);
    while pong.recv().unwrap().is_some() {}
    finished(c);
    if same_cpu {
        unpin();
    }
    v
}

/// The peer of [`rtt_shmflow`] and of the async round trips: echoes every number from the
/// channel `PING` into the channel `PONG`, its ends waiting as `wait` says.
pub(super) fn echo(wait: EchoWait) -> Result<(), String> {
    let wait = match wait {
        EchoWait::Spin => SPIN,
        // Both ends park at once: every message is a futex wake-up (the async group).
        EchoWait::Parked => WaitStrategy::Park,
        EchoWait::Block => WaitStrategy::Block,
    };
    let mut ping = Consumer::from_env("PING").map_err(|e| e.to_string())?;
    let mut pong = Producer::from_env("PONG").map_err(|e| e.to_string())?;
    ping.set_wait_strategy(wait);
    pong.set_wait_strategy(wait);
    pong.set_flush_policy(FlushPolicy::EveryRecord);
    loop {
        let v = match ping.recv().map_err(|e| e.to_string())? {
            Some(r) => *r.as_pod::<u64>().ok_or("not a u64")?,
            None => break,
        };
        pong.send_pod(&v).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Round trips of 8 bytes over a pipe pair or a Unix socket (sorted nanoseconds).
pub(super) fn rtt_stream(cfg: &Cfg, pipe: bool) -> Vec<u64> {
    let (mut tx, mut rx, c): (Box<dyn Write>, Box<dyn Read>, Child) = if pipe {
        let (a_r, a_w) = pipe_pair();
        let (b_r, b_w) = pipe_pair();
        let c = child(
            &Role::EchoFd,
            &[("IN", a_r.as_raw_fd()), ("OUT", b_w.as_raw_fd())],
            |_| {},
        );
        drop((a_r, b_w));
        (
            Box::new(std::fs::File::from(a_w)),
            Box::new(std::fs::File::from(b_r)),
            c,
        )
    } else {
        let (mine, c) = uds_echo_child();
        (Box::new(mine.try_clone().unwrap()), Box::new(mine), c)
    };
    let mut buf = [0u8; 8];
    let v = time_rounds(cfg.rounds, |i| {
        tx.write_all(&i.to_le_bytes()).unwrap();
        rx.read_exact(&mut buf).unwrap();
    });
    // Both: a socket stays open while either clone lives, and the peer waits for EOF.
    drop((tx, rx));
    finished(c);
    v
}

/// The peer of [`rtt_stream`]: echoes 8-byte messages from the descriptor `IN` to `OUT` (one
/// descriptor for both when they are a socket).
pub(super) fn echo_fd() {
    // A socket comes as one descriptor for both directions: own it once.
    let same = std::env::var("IN").ok() == std::env::var("OUT").ok();
    let mut r = std::fs::File::from(env_fd("IN"));
    let mut w = if same {
        r.try_clone().unwrap()
    } else {
        std::fs::File::from(env_fd("OUT"))
    };
    let mut buf = [0u8; 8];
    while r.read_exact(&mut buf).is_ok() {
        w.write_all(&buf).unwrap();
    }
}

// ----- throughput ------------------------------------------------------------------------------

/// Records of `len` bytes for `cfg.secs`, tuned (see the module `bench`): (records,
/// nanoseconds) as the peer counted them.
pub(super) fn shmflow_stream(cfg: &Cfg, g: Geometry, len: usize) -> (f64, f64) {
    tuned_stream(cfg.secs, g, len, None)
}

/// [`shmflow_stream`] for `secs`, with latency markers every `markers` (none: off).
pub(super) fn tuned_stream(
    secs: f64,
    g: Geometry,
    len: usize,
    markers: Option<Duration>,
) -> (f64, f64) {
    let (mut p, peer) = Producer::create_anonymous(g).unwrap();
    p.set_flush_policy(FlushPolicy::Explicit);
    p.set_wait_strategy(SPIN);
    p.set_metrics(false);
    p.set_latency_markers(markers.map(|m| LatencyMarkers::every(m, "bench")));
    let c = child(&Role::ShmSink, &[("CH", peer.as_fd_raw())], |_| {});
    drop(peer);
    let line = LineBuf::new(len);
    let buf = line.bytes();
    let whole = len <= p.max_unspanned_len();
    let per_look = records_per_look(len);
    let end = Instant::now() + Duration::from_secs_f64(secs);
    'outer: loop {
        for _ in 0..per_look {
            if whole {
                let mut claim = p.claim(len).unwrap();
                claim.copy_from_slice(buf);
                claim.commit();
            } else {
                p.send(buf).unwrap();
            }
        }
        if Instant::now() >= end {
            break 'outer;
        }
    }
    drop(p);
    parse_report(&finished(c))
}

/// [`shmflow_stream`] with records claimed 64 at a time (`claim_batch`, as many as fit the
/// segment in hand), each copied in, the batch committed at once: (records, nanoseconds) as
/// the peer counted them. `len` must fit a segment.
pub(super) fn batch_stream(cfg: &Cfg, g: Geometry, len: usize) -> (f64, f64) {
    let (mut p, peer) = Producer::create_anonymous(g).unwrap();
    p.set_flush_policy(FlushPolicy::Explicit);
    p.set_wait_strategy(SPIN);
    p.set_metrics(false);
    let c = child(&Role::ShmSink, &[("CH", peer.as_fd_raw())], |_| {});
    drop(peer);
    let line = LineBuf::new(len);
    let buf = line.bytes();
    let per_look = records_per_look(len);
    let end = Instant::now() + Duration::from_secs_f64(cfg.secs);
    while Instant::now() < end {
        send_batched(&mut p, buf, per_look);
    }
    drop(p);
    parse_report(&finished(c))
}

/// The loop a user writes, on default settings: `send` on one side, and on the other
/// `while let Some(r) = rx.recv()? { … }` with `WaitStrategy::Block` and `EveryRecord`.
pub(super) fn plain_stream(cfg: &Cfg) -> (f64, f64) {
    plain_stream_for(cfg.secs, None)
}

/// [`plain_stream`] for `secs`, with latency markers every `markers` (none: off).
pub(super) fn plain_stream_for(secs: f64, markers: Option<Duration>) -> (f64, f64) {
    let (mut p, peer) = Producer::create_anonymous(Geometry::default()).unwrap();
    p.set_latency_markers(markers.map(|m| LatencyMarkers::every(m, "bench")));
    let c = child(&Role::PlainSink, &[("CH", peer.as_fd_raw())], |_| {});
    drop(peer);
    let rec = LineRec::new();
    let rec = &rec.0;
    let per_look = records_per_look(REC);
    let end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        for _ in 0..per_look {
            p.send(rec).unwrap();
        }
    }
    drop(p);
    parse_report(&finished(c))
}

/// 64 B records, length-prefixed, through a pipe or a Unix socket with 64 KiB buffers on both
/// sides: (records, nanoseconds) as the peer counted them.
pub(super) fn os_stream(cfg: &Cfg, pipe: bool) -> (f64, f64) {
    let (w, c): (Box<dyn Write>, Child) = if pipe {
        let (r, w) = pipe_pair();
        let c = child(&Role::FdSink, &[("IN", r.as_raw_fd())], |_| {});
        drop(r);
        (Box::new(std::fs::File::from(w)), c)
    } else {
        let (mine, theirs) = UnixStream::pair().unwrap();
        let c = child(&Role::FdSink, &[("IN", theirs.as_raw_fd())], |_| {});
        drop(theirs);
        (Box::new(mine), c)
    };
    let mut w = BufWriter::with_capacity(64 * 1024, w);
    let rec = LineRec::new();
    let rec = &rec.0;
    let end = Instant::now() + Duration::from_secs_f64(cfg.secs);
    while Instant::now() < end {
        for _ in 0..1024 {
            w.write_all(&(REC as u32).to_le_bytes()).unwrap();
            w.write_all(rec).unwrap();
        }
    }
    w.flush().unwrap();
    drop(w);
    parse_report(&finished(c))
}

// ----- the peers of the streams ----------------------------------------------------------------

/// The peer of [`shmflow_stream`]: reads the channel `CH` busy-polling, without per-record
/// counters; prints `records nanoseconds`.
pub(super) fn shm_sink() -> Result<(), String> {
    let mut c = Consumer::from_env("CH").map_err(|e| e.to_string())?;
    c.set_wait_strategy(SPIN);
    c.set_metrics(false);
    let (n, sum, start) = sink_records(&mut c)?;
    std::hint::black_box(sum);
    let ns = start.map(|s| s.elapsed().as_nanos()).unwrap_or(1);
    println!("{n} {ns}");
    Ok(())
}

/// The peer of [`plain_stream`] and of the async group's `sync_plain_rps`: the plain loop on
/// the channel `CH`, every setting at its default; prints `records nanoseconds`.
pub(super) fn plain_sink() -> Result<(), String> {
    let mut c = Consumer::from_env("CH").map_err(|e| e.to_string())?;
    let (n, sum, start) = plain_records(&mut c).map_err(|e| e.to_string())?;
    std::hint::black_box(sum);
    let ns = start.map(|s| s.elapsed().as_nanos()).unwrap_or(1);
    println!("{n} {ns}");
    Ok(())
}

/// The peer of [`os_stream`]: reads length-prefixed records from the descriptor `IN` to its
/// end; prints `records nanoseconds`.
pub(super) fn fd_sink() {
    let mut r = BufReader::with_capacity(64 * 1024, std::fs::File::from(env_fd("IN")));
    let (mut n, mut sum, mut start) = (0u64, 0u64, None);
    let mut len = [0u8; 4];
    let mut buf = vec![0u8; BULK];
    while r.read_exact(&mut len).is_ok() {
        start.get_or_insert_with(Instant::now);
        let l = u32::from_le_bytes(len) as usize;
        r.read_exact(&mut buf[..l]).unwrap();
        sum = sum.wrapping_add(touch(&buf[..l]));
        n += 1;
    }
    std::hint::black_box(sum);
    println!("{n} {}", start.map(|s| s.elapsed().as_nanos()).unwrap_or(1));
}

/// The sink's loop, as a throughput-minded reader writes it: `drain` everything that is
/// there (in place when in one segment, part by part otherwise), and block in `recv` only when
/// nothing is. (A plain `while let Some(r) = c.recv()?` loop runs at about half the speed for
/// 64 B records: moving the 80-byte `Result<Option<Record>>` through `?` or `map_err` costs a
/// store-forwarding stall per record; see the README.)
#[inline(never)]
pub(super) fn sink_records(c: &mut Consumer) -> Result<(u64, u64, Option<Instant>), String> {
    // A function inlined where it is called, with the rare path (a record spanning segments,
    // never one of 64 B) in a call of its own: a closure with that loop in it is left a call
    // per record in some builds (in `try_drain`, about 0.6x the speed).
    // (The rare path returns its sum rather than adding to `sum`: a total whose address
    // goes to a call is stored to memory on every record.)
    #[inline(always)]
    fn read(r: shmflow::Record<'_>, sum: &mut u64) -> shmflow::Result<()> {
        let s = match r.as_bytes() {
            Some(b) => touch(b),
            None => read_parts(r)?,
        };
        *sum = sum.wrapping_add(s);
        Ok(())
    }
    #[cold]
    #[inline(never)]
    fn read_parts(mut r: shmflow::Record<'_>) -> shmflow::Result<u64> {
        let mut sum = 0u64;
        while let Some(part) = r.next_part()? {
            sum = sum.wrapping_add(touch(part));
        }
        Ok(sum)
    }
    /// `try_drain` in a call of its own, the closure inlined into its loop: (records, their
    /// bytes' sum), the sum in a local of the call, which the compiler keeps in a register
    /// across the loop (as the raw ring's reader keeps its own).
    #[inline(never)]
    fn drain_now(c: &mut Consumer) -> shmflow::Result<(usize, u64)> {
        let mut part = 0u64;
        let k = c.try_drain(usize::MAX, |r| read(r, &mut part))?;
        Ok((k, part))
    }
    let (mut n, mut sum, mut start) = (0u64, 0u64, None);
    loop {
        if start.is_some() {
            let (k, part) = drain_now(c).map_err(|e| e.to_string())?;
            sum = sum.wrapping_add(part);
            n += k as u64;
            if k > 0 {
                continue;
            }
        }
        match c.recv().map_err(|e| e.to_string())? {
            Some(r) => {
                start.get_or_insert_with(Instant::now);
                read(r, &mut sum).map_err(|e| e.to_string())?;
                n += 1;
            }
            None => return Ok((n, sum, start)),
        }
    }
}

/// The plain loop: every record read in place, every byte touched.
#[inline(never)]
fn plain_records(c: &mut Consumer) -> Result<(u64, u64, Option<Instant>), shmflow::Error> {
    let (mut n, mut sum, mut start) = (0u64, 0u64, None);
    while let Some(r) = c.recv()? {
        start.get_or_insert_with(Instant::now);
        if let Some(b) = r.as_bytes() {
            sum = sum.wrapping_add(touch(b));
        }
        n += 1;
    }
    Ok((n, sum, start))
}
