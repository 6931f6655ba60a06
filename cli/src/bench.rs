//! `shmflow bench`: shmflow against the hardware floor and the OS, in one run, between two
//! processes every time (this binary re-executes itself as the peer: `__bench-role`).
//!
//! Latencies are exact percentiles of every round trip after warm-up (all samples kept and
//! sorted: no histogram bucketing error). Throughputs are the best of 3 runs of ≥ 1 s of
//! steady state (`--quick`: 1 run of 0.3 s, 20k round trips). Ratios are computed within the
//! run, so a slow host slows both sides of each ratio; `--runs N` repeats every selected group
//! N times, alternating, and reports the median and the spread of each measure and ratio.
//!
//! Modes: `rtt_spin_*` busy-polls on both sides; `rtt_block_*` and `rtt_same_cpu_p50_ns` park
//! on the futex between messages without spinning (`WaitStrategy::Park`), which is what the
//! futex floor does; `rtt_default_wait_*` and `rtt_same_cpu_default_wait_p50_ns` use the
//! default `WaitStrategy::Block` (a look every 5 µs for 50 µs, then park). `small_rps` and
//! `bulk_gbps` are the tuned best: `FlushPolicy::Explicit`, `claim`, busy-polling on both
//! sides, `drain`, per-record counters off, like the raw floors, which spin on their atomics.
//! `plain_rps` is every setting at its default: `send`, and `while let Some(r) = rx.recv()?`.
//! `--open-loop` measures latency at fixed offered rates instead (see `openloop.rs`).

use std::io::{BufReader, BufWriter, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use shmflow::{Consumer, FlushPolicy, Geometry, Producer, WaitStrategy};

use crate::harness::{
    child, env_fd, finish, machine, parse_report, pipe_pair, time_rounds, touch, uds_echo_child,
    RawFdOf, REC, RTT_G,
};

const SPIN: WaitStrategy = WaitStrategy::BusyPoll(Duration::from_secs(1));
pub(crate) const BULK: usize = 64 * 1024;

struct Cfg {
    rounds: usize,
    secs: f64,
    repeats: usize,
}

// ----- plumbing --------------------------------------------------------------------------------

/// A shared anonymous mapping of `len` bytes and its descriptor.
struct Raw {
    fd: OwnedFd,
    ptr: *mut u8,
    len: usize,
}

impl Raw {
    fn new(len: usize) -> Raw {
        // SAFETY: memfd_create with a valid name; checked.
        let fd = unsafe { libc::memfd_create(c"shmflow-bench".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain syscall.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), len as i64) }, 0);
        Raw::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> Raw {
        // SAFETY: a shared read-write mapping of the whole object; checked for failure.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        Raw {
            fd,
            ptr: ptr as *mut u8,
            len,
        }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(off + 8 <= self.len && off.is_multiple_of(8));
        // SAFETY: in bounds, aligned, and only ever accessed atomically by both processes.
        unsafe { &*(self.ptr.add(off) as *const AtomicU64) }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(off + 4 <= self.len && off.is_multiple_of(4));
        // SAFETY: as for `u64_at`.
        unsafe { &*(self.ptr.add(off) as *const AtomicU32) }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

fn futex_wait(w: &AtomicU32, expected: u32) {
    // SAFETY: a valid shared word; FUTEX_WAIT only reads it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            w.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            std::ptr::null::<libc::timespec>(),
        )
    };
}

fn futex_wake(w: &AtomicU32) {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_futex, w.as_ptr(), libc::FUTEX_WAKE, 1) };
}

fn pin_cpu0() -> impl FnOnce(&mut Command) {
    |cmd: &mut Command| {
        // SAFETY: sched_setaffinity in the child between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                pin(0);
                Ok(())
            });
        }
    }
}

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; sched_setaffinity on the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn unpin() {
    // SAFETY: as in `pin`, with every CPU.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in 0..libc::CPU_SETSIZE as usize {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn pct(v: &[u64], p: f64) -> f64 {
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)] as f64
}

// ----- round trips -----------------------------------------------------------------------------

fn rtt_shmflow(cfg: &Cfg, wait: WaitStrategy, same_cpu: bool) -> Vec<u64> {
    let (mut ping, ping_peer) = Producer::create_anonymous(RTT_G).unwrap();
    let (mut pong, pong_peer) = Consumer::create_anonymous(RTT_G).unwrap();
    ping.set_flush_policy(FlushPolicy::EveryRecord);
    ping.set_wait_strategy(wait);
    pong.set_wait_strategy(wait);
    let mode = match wait {
        SPIN => "spin",
        WaitStrategy::Park => "park",
        _ => "block",
    };
    let fds = [
        ("PING", ping_peer.as_fd_raw()),
        ("PONG", pong_peer.as_fd_raw()),
    ];
    if same_cpu {
        pin(0);
    }
    let c = child("echo", &[mode.into()], &fds, |cmd| {
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
    finish(c);
    if same_cpu {
        unpin();
    }
    v
}

fn floor_spin(cfg: &Cfg) -> Vec<u64> {
    let raw = Raw::new(4096);
    let c = child("spin-floor", &[], &[("RAW", raw.fd.as_raw_fd())], |_| {});
    let w = raw.u64_at(0);
    let v = time_rounds(cfg.rounds, |_| {
        let x = w.load(Ordering::Acquire);
        w.store(x + 1, Ordering::Release);
        while w.load(Ordering::Acquire) != x + 2 {
            std::hint::spin_loop();
        }
    });
    w.store(u64::MAX, Ordering::Release);
    finish(c);
    v
}

fn floor_futex(cfg: &Cfg, same_cpu: bool) -> Vec<u64> {
    let raw = Raw::new(4096);
    if same_cpu {
        pin(0);
    }
    let c = child("futex-floor", &[], &[("RAW", raw.fd.as_raw_fd())], |cmd| {
        if same_cpu {
            pin_cpu0()(cmd)
        }
    });
    let w = raw.u32_at(0);
    let v = time_rounds(cfg.rounds, |_| {
        w.store(1, Ordering::Release);
        futex_wake(w);
        loop {
            let x = w.load(Ordering::Acquire);
            if x == 2 {
                break;
            }
            futex_wait(w, x);
        }
    });
    w.store(3, Ordering::Release);
    futex_wake(w);
    finish(c);
    if same_cpu {
        unpin();
    }
    v
}

fn rtt_stream(cfg: &Cfg, pipe: bool) -> Vec<u64> {
    let (mut tx, mut rx, c): (Box<dyn Write>, Box<dyn Read>, Child) = if pipe {
        let (a_r, a_w) = pipe_pair();
        let (b_r, b_w) = pipe_pair();
        let c = child(
            "echo-fd",
            &[],
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
    finish(c);
    v
}

// ----- throughput ------------------------------------------------------------------------------

/// Best of `repeats`: the child reports "count nanos" for what it consumed.
fn best(cfg: &Cfg, mut run: impl FnMut() -> (f64, f64)) -> f64 {
    (0..cfg.repeats)
        .map(|_| {
            let (n, ns) = run();
            n / ns * 1e9
        })
        .fold(0.0, f64::max)
}

fn shmflow_stream(cfg: &Cfg, g: Geometry, len: usize) -> (f64, f64) {
    let (mut p, peer) = Producer::create_anonymous(g).unwrap();
    p.set_flush_policy(FlushPolicy::Explicit);
    p.set_wait_strategy(SPIN);
    p.set_metrics(false);
    let c = child(
        "shm-sink",
        &[len.to_string()],
        &[("CH", peer.as_fd_raw())],
        |_| {},
    );
    drop(peer);
    let buf = vec![0x5Au8; len];
    let whole = len <= p.max_unspanned_len();
    let end = Instant::now() + Duration::from_secs_f64(cfg.secs);
    'outer: loop {
        for _ in 0..64 {
            if whole {
                let mut claim = p.claim(len).unwrap();
                claim.copy_from_slice(&buf);
                claim.commit();
            } else {
                p.send(&buf).unwrap();
            }
        }
        if Instant::now() >= end {
            break 'outer;
        }
    }
    drop(p);
    parse_report(&finish(c))
}

/// The loop a user writes, on default settings: `send` on one side, and on the other
/// `while let Some(r) = rx.recv()? { … }` with `WaitStrategy::Block` and `EveryRecord`.
fn plain_stream(cfg: &Cfg) -> (f64, f64) {
    let (mut p, peer) = Producer::create_anonymous(Geometry::default()).unwrap();
    let c = child("plain-sink", &[], &[("CH", peer.as_fd_raw())], |_| {});
    drop(peer);
    let rec = [0x5Au8; REC];
    let end = Instant::now() + Duration::from_secs_f64(cfg.secs);
    while Instant::now() < end {
        for _ in 0..64 {
            p.send(&rec).unwrap();
        }
    }
    drop(p);
    parse_report(&finish(c))
}

/// Raw ring of 64 KiB slots: a 4 KiB header (`head`, `tail`, `done` on their own lines, then
/// each slot's used length), then the slots. Small records are packed `[u32 len][payload]`,
/// 8-aligned; a 64 KiB record fills a slot exactly.
const SLOT: usize = 64 * 1024;
const LENS: usize = 512;
fn raw_ring_len(slots: usize) -> usize {
    4096 + slots * SLOT
}

fn floor_stream(cfg: &Cfg, pool: usize, len: usize) -> (f64, f64) {
    let slots = (pool / SLOT).max(2);
    let raw = Raw::new(raw_ring_len(slots));
    let c = child(
        "raw-sink",
        &[slots.to_string(), len.to_string()],
        &[("RAW", raw.fd.as_raw_fd())],
        |_| {},
    );
    let (head, tail, done) = (raw.u64_at(0), raw.u64_at(128), raw.u64_at(256));
    let buf = vec![0x5Au8; len];
    let end = Instant::now() + Duration::from_secs_f64(cfg.secs);
    let mut t = 0u64;
    let frame = (4 + len + 7) & !7;
    while Instant::now() < end {
        for _ in 0..8 {
            while t - head.load(Ordering::Acquire) >= slots as u64 {
                std::hint::spin_loop();
            }
            let slot = (t % slots as u64) as usize;
            // SAFETY: the slot lies inside the mapping and is ours until we publish `tail`.
            let base = unsafe { raw.ptr.add(4096 + slot * SLOT) };
            let used = if len == SLOT {
                // SAFETY: exactly one slot.
                unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), base, SLOT) };
                SLOT
            } else {
                let mut off = 0;
                while off + frame <= SLOT {
                    // SAFETY: in bounds of the slot (checked by the loop condition).
                    unsafe {
                        (base.add(off) as *mut u32).write_unaligned(len as u32);
                        std::ptr::copy_nonoverlapping(buf.as_ptr(), base.add(off + 4), len);
                    }
                    off += frame;
                }
                off
            };
            raw.u64_at(LENS + slot * 8)
                .store(used as u64, Ordering::Relaxed);
            t += 1;
            tail.store(t, Ordering::Release);
        }
    }
    done.store(1, Ordering::Release);
    parse_report(&finish(c))
}

fn os_stream(cfg: &Cfg, pipe: bool) -> (f64, f64) {
    let (w, c): (Box<dyn Write>, Child) = if pipe {
        let (r, w) = pipe_pair();
        let c = child("fd-sink", &[], &[("IN", r.as_raw_fd())], |_| {});
        drop(r);
        (Box::new(std::fs::File::from(w)), c)
    } else {
        let (mine, theirs) = UnixStream::pair().unwrap();
        let c = child("fd-sink", &[], &[("IN", theirs.as_raw_fd())], |_| {});
        drop(theirs);
        (Box::new(mine), c)
    };
    let mut w = BufWriter::with_capacity(64 * 1024, w);
    let rec = [0x5Au8; REC];
    let end = Instant::now() + Duration::from_secs_f64(cfg.secs);
    while Instant::now() < end {
        for _ in 0..1024 {
            w.write_all(&(REC as u32).to_le_bytes()).unwrap();
            w.write_all(&rec).unwrap();
        }
    }
    w.flush().unwrap();
    drop(w);
    parse_report(&finish(c))
}

// ----- the peer --------------------------------------------------------------------------------

pub(crate) fn role(args: &[String]) -> Result<(), String> {
    let kind = args.first().ok_or("bench role")?.as_str();
    match kind {
        "echo" => {
            let wait = match args.get(1).map(String::as_str) {
                Some("spin") => SPIN,
                // Both ends park at once: every message is a futex wake-up (the async group).
                Some("parked") => WaitStrategy::Park,
                _ => WaitStrategy::Block,
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
        }
        "spin-floor" => {
            let raw = Raw::map(env_fd("RAW"), 4096);
            let w = raw.u64_at(0);
            loop {
                let x = w.load(Ordering::Acquire);
                if x == u64::MAX {
                    break;
                }
                if x % 2 == 1 {
                    w.store(x + 1, Ordering::Release);
                }
                std::hint::spin_loop();
            }
        }
        "futex-floor" => {
            let raw = Raw::map(env_fd("RAW"), 4096);
            let w = raw.u32_at(0);
            loop {
                let x = w.load(Ordering::Acquire);
                match x {
                    1 => {
                        w.store(2, Ordering::Release);
                        futex_wake(w);
                    }
                    3 => break,
                    _ => futex_wait(w, x),
                }
            }
        }
        "echo-fd" => {
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
        "shm-sink" => {
            let mut c = Consumer::from_env("CH").map_err(|e| e.to_string())?;
            c.set_wait_strategy(SPIN);
            c.set_metrics(false);
            let (n, sum, start) = sink_records(&mut c)?;
            std::hint::black_box(sum);
            let ns = start.map(|s| s.elapsed().as_nanos()).unwrap_or(1);
            println!("{n} {ns}");
        }
        "plain-sink" => {
            let mut c = Consumer::from_env("CH").map_err(|e| e.to_string())?;
            let (n, sum, start) = plain_records(&mut c).map_err(|e| e.to_string())?;
            std::hint::black_box(sum);
            let ns = start.map(|s| s.elapsed().as_nanos()).unwrap_or(1);
            println!("{n} {ns}");
        }
        "raw-sink" => {
            let slots: usize = args[1].parse().unwrap();
            let len: usize = args[2].parse().unwrap();
            let raw = Raw::map(env_fd("RAW"), raw_ring_len(slots));
            let (head, tail, done) = (raw.u64_at(0), raw.u64_at(128), raw.u64_at(256));
            let frame = (4 + len + 7) & !7;
            let (mut h, mut n, mut sum, mut start) = (0u64, 0u64, 0u64, None);
            loop {
                let t = tail.load(Ordering::Acquire);
                if h == t {
                    if done.load(Ordering::Acquire) == 1 && tail.load(Ordering::Acquire) == h {
                        break;
                    }
                    std::hint::spin_loop();
                    continue;
                }
                start.get_or_insert_with(Instant::now);
                while h < t {
                    let slot = (h % slots as u64) as usize;
                    // SAFETY: the slot is published (Acquire on tail) and inside the mapping.
                    let base = unsafe { raw.ptr.add(4096 + slot * SLOT) };
                    let used =
                        (raw.u64_at(LENS + slot * 8).load(Ordering::Relaxed) as usize).min(SLOT);
                    if len == SLOT {
                        // SAFETY: one whole slot.
                        sum = sum
                            .wrapping_add(touch(unsafe { std::slice::from_raw_parts(base, used) }));
                        n += 1;
                    }
                    let mut off = if len == SLOT { used } else { 0 };
                    while off < used {
                        // SAFETY: within the slot.
                        let l = unsafe { (base.add(off) as *const u32).read_unaligned() } as usize;
                        // SAFETY: the record lies within the slot (the producer wrote it so).
                        let payload = unsafe {
                            std::slice::from_raw_parts(base.add(off + 4), l.min(SLOT - off - 4))
                        };
                        sum = sum.wrapping_add(touch(payload));
                        n += 1;
                        off += frame;
                    }
                    h += 1;
                    head.store(h, Ordering::Release);
                }
            }
            std::hint::black_box(sum);
            println!("{n} {}", start.map(|s| s.elapsed().as_nanos()).unwrap_or(1));
        }
        "fd-sink" => {
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
        "ol-sink" => return crate::openloop::sink(args),
        "async-sink" => return crate::asyncbench::async_sink(false),
        "async-drain-sink" => return crate::asyncbench::async_sink(true),
        "remote-sink" => return crate::remotebench::remote_sink(port_arg(args, 1)?),
        "tcp-sink" => return crate::remotebench::tcp_sink(port_arg(args, 1)?),
        "tcp-framed-sink" => return crate::remotebench::tcp_framed_sink(port_arg(args, 1)?),
        "tcp-echo-two" => return crate::remotebench::tcp_echo_two(port_arg(args, 1)?),
        "tcp-echo" => return crate::remotebench::tcp_echo(port_arg(args, 1)?),
        "remote-echo" => {
            return crate::remotebench::remote_echo(port_arg(args, 1)?, port_arg(args, 2)?)
        }
        "netem-send" => return crate::netembench::send(args),
        "netem-recv" => return crate::netembench::recv(args),
        "direct-sink" => {
            let n = |i: usize| -> Result<u32, String> {
                args.get(i)
                    .and_then(|a| a.parse().ok())
                    .ok_or_else(|| format!("direct-sink: argument {i} must be a number"))
            };
            let g = Geometry {
                segment_size: n(2)?,
                segment_count: n(3)?,
            };
            return crate::remotebench::direct_sink(port_arg(args, 1)?, g);
        }
        "direct-echo" => {
            let wait = crate::remotebench::RttWait::parse(args.get(3).map_or("block", |s| s))?;
            return crate::remotebench::direct_echo(port_arg(args, 1)?, port_arg(args, 2)?, wait);
        }
        other => return Err(format!("unknown bench role {other}")),
    }
    Ok(())
}

/// Reads every 8-byte word of a payload (and the tail bytes): "the consumer reads every byte".
/// The sink's loop, as a throughput-minded reader writes it: `drain` everything that is
/// there (in place when in one segment, part by part otherwise), and block in `recv` only when
/// nothing is. (A plain `while let Some(r) = c.recv()?` loop runs at about half the speed for
/// 64 B records: moving the 80-byte `Result<Option<Record>>` through `?` or `map_err` costs a
/// store-forwarding stall per record; see the README.)
#[inline(never)]
fn sink_records(c: &mut Consumer) -> Result<(u64, u64, Option<Instant>), String> {
    let (mut n, mut sum, mut start) = (0u64, 0u64, None);
    let read = |mut r: shmflow::Record<'_>, sum: &mut u64| -> shmflow::Result<()> {
        if let Some(b) = r.as_bytes() {
            *sum = sum.wrapping_add(touch(b));
        } else {
            while let Some(part) = r.next_part()? {
                *sum = sum.wrapping_add(touch(part));
            }
        }
        Ok(())
    };
    loop {
        if start.is_some() {
            let k = c
                .try_drain(usize::MAX, |r| read(r, &mut sum))
                .map_err(|e| e.to_string())?;
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

// ----- the report ------------------------------------------------------------------------------

/// Arguments of `shmflow bench`.
#[derive(clap::Args, Debug)]
pub(crate) struct BenchArgs {
    /// One short run of each measure (0.3 s, 20k round trips) instead of the best of 3.
    #[arg(long)]
    quick: bool,
    /// One JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Run one group only (for profiling). `netem` (remote channels across a delayed link
    /// between two network namespaces; needs root) runs only when named here.
    #[arg(long, value_parser = ["spin", "block", "same_cpu", "small", "bulk", "pool", "async", "remote", "netem"])]
    only: Option<String>,
    /// Repeat the selected groups this many times, alternating, and report the median and
    /// the spread (min..max) of each measure and of each ratio (computed within each run).
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Latency at fixed offered rates instead (Aeron's load-test method): for every length and
    /// rate, shmflow (default and busy-poll), a Unix socket and a pipe in turn.
    #[arg(long)]
    open_loop: bool,
    /// Open loop: message lengths in bytes (at least 8).
    #[arg(long, value_delimiter = ',', default_values_t = [32usize, 288, 1344])]
    lengths: Vec<usize>,
    /// Open loop: offered rates in messages per second.
    #[arg(long, value_delimiter = ',', default_values_t = [100_000u64, 500_000, 1_000_000])]
    rates: Vec<u64>,
    /// Open loop: seconds sent before measuring.
    #[arg(long, default_value_t = 1.0)]
    warmup_secs: f64,
    /// Open loop: seconds measured per case (`--quick`: 0.2 s, warm-up 0.1 s).
    #[arg(long, default_value_t = 3.0)]
    secs: f64,
    /// Open loop: write the percentile plot (SVG) here.
    #[arg(long)]
    svg: Option<String>,
}

pub(crate) fn main(args: &BenchArgs) -> Result<(), String> {
    let quick = args.quick;
    let json = args.json;
    if args.open_loop {
        let secs = |s: f64, what: &str| {
            Duration::try_from_secs_f64(s).map_err(|_| format!("--{what} {s}: not a duration"))
        };
        let plan = crate::openloop::Plan {
            lengths: args.lengths.clone(),
            rates: args.rates.clone(),
            warmup: if quick {
                Duration::from_millis(100)
            } else {
                secs(args.warmup_secs, "warmup-secs")?
            },
            measure: if quick {
                Duration::from_millis(200)
            } else {
                secs(args.secs, "secs")?
            },
        };
        return crate::openloop::main(&plan, json, args.svg.as_deref());
    }
    let cfg = if quick {
        Cfg {
            rounds: 20_000,
            secs: 0.3,
            repeats: 1,
        }
    } else {
        Cfg {
            rounds: 100_000,
            secs: 1.0,
            repeats: 3,
        }
    };
    let runs: Vec<Vec<(&'static str, f64)>> = (0..args.runs.max(1))
        .map(|i| {
            if !json && args.runs > 1 {
                eprintln!("run {} of {}", i + 1, args.runs);
            }
            one_run(&cfg, args.only.as_deref(), json)
        })
        .collect();
    let per_run_ratios: Vec<_> = runs.iter().map(|r| ratios(r)).collect();
    // Median, min and max over the runs of each measure and ratio.
    let summary = |values: Vec<f64>| -> (f64, f64, f64) {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return (f64::NAN, f64::NAN, f64::NAN);
        }
        v.sort_by(f64::total_cmp);
        let mid = if v.len() % 2 == 1 {
            v[v.len() / 2]
        } else {
            (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
        };
        (mid, v[0], v[v.len() - 1])
    };
    let measures: Vec<(&str, (f64, f64, f64))> = runs[0]
        .iter()
        .enumerate()
        .map(|(i, (k, _))| (*k, summary(runs.iter().map(|r| r[i].1).collect())))
        .collect();
    let ratio_rows: Vec<(&str, (f64, f64, f64), &str)> = per_run_ratios[0]
        .iter()
        .enumerate()
        .map(|(i, (k, _, goal))| {
            (
                *k,
                summary(per_run_ratios.iter().map(|r| r[i].1).collect()),
                *goal,
            )
        })
        .collect();
    let n = runs.len();
    let (cpu, cores, kernel) = machine();
    if json {
        let mut obj = serde_json::Map::new();
        obj.insert(
            "machine".into(),
            serde_json::json!({ "cpu": cpu, "cores": cores, "kernel": kernel }),
        );
        obj.insert("quick".into(), quick.into());
        obj.insert("runs".into(), n.into());
        let mut spread = serde_json::Map::new();
        for (k, (mid, lo, hi)) in &measures {
            obj.insert((*k).into(), serde_json::json!(round3(*mid)));
            spread.insert((*k).into(), serde_json::json!([round3(*lo), round3(*hi)]));
        }
        let ratios: serde_json::Map<String, serde_json::Value> = ratio_rows
            .iter()
            .map(|(k, (mid, _, _), _)| ((*k).to_owned(), serde_json::json!(round3(*mid))))
            .collect();
        for (k, (_, lo, hi), _) in &ratio_rows {
            spread.insert((*k).into(), serde_json::json!([round3(*lo), round3(*hi)]));
        }
        obj.insert("ratios".into(), ratios.into());
        obj.insert("spread".into(), spread.into());
        println!("{}", serde_json::Value::Object(obj));
    } else {
        println!(
            "machine: {cpu}, {cores} cores, Linux {kernel}{}{}",
            if quick { " (quick run)" } else { "" },
            if n > 1 {
                format!("; median [min..max] of {n} alternating runs")
            } else {
                String::new()
            }
        );
        let cell = |(mid, lo, hi): (f64, f64, f64)| {
            if n > 1 {
                format!("{mid:>12.2} [{lo:.2}..{hi:.2}]")
            } else {
                format!("{mid:>12.2}")
            }
        };
        println!("{:<34} {:>12}", "measure", "value");
        for (k, v) in &measures {
            println!("{k:<34} {}", cell(*v));
        }
        println!("\n{:<34} {:>12}  goal", "ratio (within each run)", "value");
        for (k, v, goal) in &ratio_rows {
            // A ratio of groups that were not run is left out.
            if v.0.is_finite() {
                println!("{k:<34} {}  {goal}", cell(*v));
            }
        }
    }
    Ok(())
}

/// One run of every selected group: (measure, value) in order.
fn one_run(cfg: &Cfg, only: Option<&str>, json: bool) -> Vec<(&'static str, f64)> {
    let pool = Geometry::default();
    let pool_bytes = pool.segment_size as usize * pool.segment_count as usize;
    let mut r: Vec<(&'static str, f64)> = Vec::new();
    let mut note = |k: &'static str, v: f64| {
        if !json {
            eprintln!("  {k:<24} {v:>14.1}");
        }
        r.push((k, v));
    };
    // `--only GROUP` runs one group, for profiling.
    let want = |g: &str| only.is_none_or(|o| o == g);
    if want("spin") {
        let v = rtt_shmflow(cfg, SPIN, false);
        note("rtt_spin_p50_ns", pct(&v, 0.5));
        note("rtt_spin_p99_ns", pct(&v, 0.99));
        note("rtt_spin_p999_ns", pct(&v, 0.999));
        note("floor_spin_p50_ns", pct(&floor_spin(cfg), 0.5));
    }
    if want("block") {
        let v = rtt_shmflow(cfg, WaitStrategy::Park, false);
        note("rtt_block_p50_ns", pct(&v, 0.5));
        note("rtt_block_p99_ns", pct(&v, 0.99));
        let v = rtt_shmflow(cfg, WaitStrategy::Block, false);
        note("rtt_default_wait_p50_ns", pct(&v, 0.5));
        note("rtt_default_wait_p99_ns", pct(&v, 0.99));
        note("floor_futex_p50_ns", pct(&floor_futex(cfg, false), 0.5));
        note("uds_rtt_p50_ns", pct(&rtt_stream(cfg, false), 0.5));
        note("pipe_rtt_p50_ns", pct(&rtt_stream(cfg, true), 0.5));
    }
    if want("same_cpu") {
        note(
            "rtt_same_cpu_p50_ns",
            pct(&rtt_shmflow(cfg, WaitStrategy::Park, true), 0.5),
        );
        note(
            "rtt_same_cpu_default_wait_p50_ns",
            pct(&rtt_shmflow(cfg, WaitStrategy::Block, true), 0.5),
        );
        note(
            "floor_futex_same_cpu_p50_ns",
            pct(&floor_futex(cfg, true), 0.5),
        );
    }
    if want("small") {
        note("small_rps", best(cfg, || shmflow_stream(cfg, pool, REC)));
        note("plain_rps", best(cfg, || plain_stream(cfg)));
        note(
            "floor_small_rps",
            best(cfg, || floor_stream(cfg, pool_bytes, REC)),
        );
        note("uds_batched_rps", best(cfg, || os_stream(cfg, false)));
        note("pipe_batched_rps", best(cfg, || os_stream(cfg, true)));
    }
    let gb = |(n, ns): (f64, f64)| (n * BULK as f64, ns);
    if want("bulk") {
        note(
            "bulk_gbps",
            best(cfg, || gb(shmflow_stream(cfg, pool, BULK))) / 1e9,
        );
        note(
            "floor_bulk_gbps",
            best(cfg, || gb(floor_stream(cfg, pool_bytes, BULK))) / 1e9,
        );
    }
    if want("async") {
        use crate::asyncbench::{rtt, Rtt};
        // Alternating, so that a slow moment of the host falls on both sides of each ratio.
        let (mut sync, mut cur, mut multi, mut bridge, mut multi_bridge) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut sync_block, mut cur_block, mut uds) = (Vec::new(), Vec::new(), Vec::new());
        // Alternating, so that a slow moment of the host falls on every figure of a ratio.
        for _ in 0..2 {
            sync.extend(rtt(cfg.rounds / 2, Rtt::Sync));
            cur.extend(rtt(cfg.rounds / 2, Rtt::Current));
            multi.extend(rtt(cfg.rounds / 2, Rtt::Multi));
            bridge.extend(rtt(cfg.rounds / 2, Rtt::Bridge));
            multi_bridge.extend(rtt(cfg.rounds / 2, Rtt::MultiBridge));
            sync_block.extend(rtt(cfg.rounds / 2, Rtt::SyncBlock));
            cur_block.extend(rtt(cfg.rounds / 2, Rtt::CurrentBlock));
            uds.extend(crate::asyncbench::tokio_uds_rtt(cfg.rounds / 2));
        }
        for v in [
            &mut sync,
            &mut cur,
            &mut multi,
            &mut bridge,
            &mut multi_bridge,
            &mut sync_block,
            &mut cur_block,
            &mut uds,
        ] {
            v.sort_unstable();
        }
        note("rtt_sync_park_p50_ns", pct(&sync, 0.5));
        note("rtt_async_current_p50_ns", pct(&cur, 0.5));
        note("rtt_async_current_p99_ns", pct(&cur, 0.99));
        note("rtt_async_multi_p50_ns", pct(&multi, 0.5));
        note("rtt_async_multi_p99_ns", pct(&multi, 0.99));
        note("rtt_async_bridge_p50_ns", pct(&bridge, 0.5));
        note("rtt_async_multi_bridge_p50_ns", pct(&multi_bridge, 0.5));
        note("rtt_sync_block_p50_ns", pct(&sync_block, 0.5));
        note("rtt_async_block_p50_ns", pct(&cur_block, 0.5));
        note("rtt_async_block_p99_ns", pct(&cur_block, 0.99));
        note("tokio_uds_rtt_p50_ns", pct(&uds, 0.5));
        // The best of each, the three tried in turn: the host's slow spells (a stream 5-10x
        // slower for seconds) then fall on every side of `async_vs_sync_plain` alike, where
        // trying one form's repeats after the other's paired whichever spell each fell in.
        let (mut sync_plain, mut plain, mut drain) = (0.0f64, 0.0f64, 0.0f64);
        let rate = |(n, ns): (f64, f64)| n / ns * 1e9;
        for _ in 0..cfg.repeats {
            sync_plain = sync_plain.max(rate(plain_stream(cfg)));
            plain = plain.max(rate(crate::asyncbench::async_stream(cfg.secs, false)));
            drain = drain.max(rate(crate::asyncbench::async_stream(cfg.secs, true)));
        }
        note("sync_plain_rps", sync_plain);
        note("async_rps", plain);
        note("async_drain_rps", drain);
    }
    if only == Some("netem") {
        crate::netembench::measure(&mut note);
    }
    if want("remote") {
        use crate::remotebench::{
            direct_rtt, direct_stream, remote_rtt, remote_stream, tcp_framed_stream, tcp_rtt,
            tcp_stream, RttWait, Streamed, Writes,
        };
        // Alternating, so that a slow moment of the host falls on both sides of each ratio.
        let (mut remote, mut direct, mut tcp) = (Vec::new(), Vec::new(), Vec::new());
        let (mut tcp_two, mut direct_park) = (Vec::new(), Vec::new());
        for _ in 0..2 {
            remote.extend(remote_rtt(cfg.rounds / 4));
            direct.extend(direct_rtt(cfg.rounds / 4, RttWait::Block));
            direct_park.extend(direct_rtt(cfg.rounds / 4, RttWait::Park));
            tcp.extend(tcp_rtt(cfg.rounds / 4));
            tcp_two.extend(crate::remotebench::tcp_rtt_two(cfg.rounds / 4));
        }
        for v in [
            &mut remote,
            &mut direct,
            &mut direct_park,
            &mut tcp,
            &mut tcp_two,
        ] {
            v.sort_unstable();
        }
        note("remote_rtt_p50_ns", pct(&remote, 0.5));
        note("remote_rtt_p99_ns", pct(&remote, 0.99));
        note("direct_rtt_p50_ns", pct(&direct, 0.5));
        note("direct_rtt_p99_ns", pct(&direct, 0.99));
        note("direct_rtt_park_p50_ns", pct(&direct_park, 0.5));
        note("tcp_pingpong_rtt_p50_ns", pct(&tcp, 0.5));
        note("tcp_two_conn_rtt_p50_ns", pct(&tcp_two, 0.5));
        // Each figure the median of the repeats; CPU per GB from the same runs.
        let (mut small, mut bulk, mut raw) = (Vec::new(), Vec::new(), Vec::new());
        let (mut dsmall, mut dsmall_each, mut dbulk) = (Vec::new(), Vec::new(), Vec::new());
        let mut dsmall_timeout = Vec::new();
        let (mut dsmall_wide, mut cpu_direct_small_wide) = (Vec::new(), Vec::new());
        let (mut dbulk_send, mut cpu_direct_send) = (Vec::new(), Vec::new());
        let (mut cpu_tcp, mut cpu_bridged, mut cpu_direct) = (Vec::new(), Vec::new(), Vec::new());
        let (mut cpu_bridged_small, mut cpu_direct_small) = (Vec::new(), Vec::new());
        let (mut framed, mut cpu_framed) = (Vec::new(), Vec::new());
        for _ in 0..cfg.repeats {
            let rate = |s: &Streamed, len: usize| s.count / s.ns * 1e9 * len as f64;
            let s = tcp_stream(cfg.secs);
            raw.push(s.count / s.ns);
            cpu_tcp.push(s.cpu_s_per_gb(s.count));
            let s = tcp_framed_stream(cfg.secs);
            framed.push(rate(&s, 1));
            cpu_framed.push(s.cpu_s_per_gb(s.count * REC as f64));
            let s = remote_stream(cfg.secs, REC);
            small.push(rate(&s, 1));
            cpu_bridged_small.push(s.cpu_s_per_gb(s.count * REC as f64));
            let s = direct_stream(cfg.secs, REC, FlushPolicy::Explicit, Writes::Send);
            dsmall.push(rate(&s, 1));
            cpu_direct_small.push(s.cpu_s_per_gb(s.count * REC as f64));
            let s = direct_stream(cfg.secs, REC, FlushPolicy::Explicit, Writes::SendWide);
            dsmall_wide.push(rate(&s, 1));
            cpu_direct_small_wide.push(s.cpu_s_per_gb(s.count * REC as f64));
            let s = direct_stream(
                cfg.secs,
                REC,
                FlushPolicy::Timeout(Duration::from_millis(1)),
                Writes::Send,
            );
            dsmall_timeout.push(rate(&s, 1));
            let s = direct_stream(cfg.secs, REC, FlushPolicy::EveryRecord, Writes::Send);
            dsmall_each.push(rate(&s, 1));
            let s = remote_stream(cfg.secs, BULK);
            bulk.push(rate(&s, BULK) / 1e9);
            cpu_bridged.push(s.cpu_s_per_gb(s.count * BULK as f64));
            let s = direct_stream(cfg.secs, BULK, FlushPolicy::EveryRecord, Writes::InPlace);
            dbulk.push(rate(&s, BULK) / 1e9);
            cpu_direct.push(s.cpu_s_per_gb(s.count * BULK as f64));
            let s = direct_stream(cfg.secs, BULK, FlushPolicy::EveryRecord, Writes::Send);
            dbulk_send.push(rate(&s, BULK) / 1e9);
            cpu_direct_send.push(s.cpu_s_per_gb(s.count * BULK as f64));
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let raw = med(&mut raw);
        note("remote_small_rps", med(&mut small));
        note("direct_small_rps", med(&mut dsmall));
        note("direct_small_timeout_1ms_rps", med(&mut dsmall_timeout));
        note("direct_small_every_record_rps", med(&mut dsmall_each));
        note("tcp_64k_rps64", raw * 1e9 / REC as f64);
        note("tcp_framed_rps64", med(&mut framed));
        note("tcp_framed_cpu_s_per_gb", med(&mut cpu_framed));
        note("remote_bulk_gbps", med(&mut bulk));
        note("direct_bulk_gbps", med(&mut dbulk));
        note("direct_bulk_send_gbps", med(&mut dbulk_send));
        note("tcp_64k_gbps", raw);
        note("tcp_64k_cpu_s_per_gb", med(&mut cpu_tcp));
        note("remote_bulk_cpu_s_per_gb", med(&mut cpu_bridged));
        note("direct_bulk_cpu_s_per_gb", med(&mut cpu_direct));
        note("direct_bulk_send_cpu_s_per_gb", med(&mut cpu_direct_send));
        note("remote_small_cpu_s_per_gb", med(&mut cpu_bridged_small));
        note("direct_small_cpu_s_per_gb", med(&mut cpu_direct_small));
        note("direct_small_64k_seg_rps", med(&mut dsmall_wide));
        note(
            "direct_small_64k_seg_cpu_s_per_gb",
            med(&mut cpu_direct_small_wide),
        );
    }
    if want("pool") {
        note(
            "small_tiny_pool_rps",
            best(cfg, || {
                shmflow_stream(
                    cfg,
                    Geometry {
                        segment_size: 4096,
                        segment_count: 2,
                    },
                    REC,
                )
            }),
        );
    }
    r
}

/// Every ratio: its name, numerator, denominator (measures of the same run) and goal.
const RATIOS: [(&str, &str, &str, &str); 41] = [
    (
        "direct_small_vs_tcp_64k",
        "direct_small_rps",
        "tcp_64k_rps64",
        ">= 0.8",
    ),
    (
        "direct_small_vs_tcp_framed",
        "direct_small_rps",
        "tcp_framed_rps64",
        "(for reference)",
    ),
    (
        "direct_small_cpu_per_gb_vs_tcp_framed",
        "direct_small_cpu_s_per_gb",
        "tcp_framed_cpu_s_per_gb",
        "(for reference)",
    ),
    (
        "direct_bulk_vs_tcp_64k",
        "direct_bulk_gbps",
        "tcp_64k_gbps",
        ">= 0.8",
    ),
    (
        "direct_bulk_send_vs_tcp_64k",
        "direct_bulk_send_gbps",
        "tcp_64k_gbps",
        "(for reference)",
    ),
    (
        "direct_bulk_send_cpu_per_gb_vs_tcp",
        "direct_bulk_send_cpu_s_per_gb",
        "tcp_64k_cpu_s_per_gb",
        "(for reference)",
    ),
    (
        "direct_rtt_vs_tcp_pingpong",
        "direct_rtt_p50_ns",
        "tcp_pingpong_rtt_p50_ns",
        "<= 1.3",
    ),
    (
        "direct_rtt_park_vs_tcp_pingpong",
        "direct_rtt_park_p50_ns",
        "tcp_pingpong_rtt_p50_ns",
        "(for reference)",
    ),
    (
        "direct_rtt_vs_tcp_two_conn",
        "direct_rtt_p50_ns",
        "tcp_two_conn_rtt_p50_ns",
        "(for reference)",
    ),
    (
        "direct_bulk_cpu_per_gb_vs_tcp",
        "direct_bulk_cpu_s_per_gb",
        "tcp_64k_cpu_s_per_gb",
        "<= 1.3",
    ),
    (
        "remote_bulk_cpu_per_gb_vs_tcp",
        "remote_bulk_cpu_s_per_gb",
        "tcp_64k_cpu_s_per_gb",
        "<= 1.3",
    ),
    (
        "remote_small_cpu_per_gb_vs_tcp",
        "remote_small_cpu_s_per_gb",
        "tcp_64k_cpu_s_per_gb",
        "<= 1.3",
    ),
    (
        "direct_small_cpu_per_gb_vs_tcp",
        "direct_small_cpu_s_per_gb",
        "tcp_64k_cpu_s_per_gb",
        "<= 1.3",
    ),
    (
        "direct_small_64k_seg_vs_tcp_64k",
        "direct_small_64k_seg_rps",
        "tcp_64k_rps64",
        "(for reference)",
    ),
    (
        "direct_small_64k_seg_cpu_per_gb_vs_tcp",
        "direct_small_64k_seg_cpu_s_per_gb",
        "tcp_64k_cpu_s_per_gb",
        "(for reference)",
    ),
    (
        "remote_small_vs_tcp_64k",
        "remote_small_rps",
        "tcp_64k_rps64",
        ">= 0.8",
    ),
    (
        "remote_bulk_vs_tcp_64k",
        "remote_bulk_gbps",
        "tcp_64k_gbps",
        ">= 0.8",
    ),
    (
        "remote_rtt_vs_tcp_pingpong",
        "remote_rtt_p50_ns",
        "tcp_pingpong_rtt_p50_ns",
        "<= 1.3",
    ),
    (
        "rtt_spin_vs_floor",
        "rtt_spin_p50_ns",
        "floor_spin_p50_ns",
        "<= 2.5",
    ),
    (
        "rtt_block_vs_futex_floor",
        "rtt_block_p50_ns",
        "floor_futex_p50_ns",
        "<= 1.2",
    ),
    (
        "small_vs_uds_batched",
        "small_rps",
        "uds_batched_rps",
        ">= 3",
    ),
    ("small_vs_floor", "small_rps", "floor_small_rps", ">= 0.8"),
    ("plain_vs_small", "plain_rps", "small_rps", ">= 0.7"),
    ("bulk_vs_floor", "bulk_gbps", "floor_bulk_gbps", ">= 0.8"),
    (
        "async_rtt_current_vs_sync_park",
        "rtt_async_current_p50_ns",
        "rtt_sync_park_p50_ns",
        "<= 1.5",
    ),
    (
        "async_rtt_multi_vs_sync_park",
        "rtt_async_multi_p50_ns",
        "rtt_sync_park_p50_ns",
        "<= 1.5",
    ),
    (
        "async_rtt_doorbell_vs_bridge",
        "rtt_async_current_p50_ns",
        "rtt_async_bridge_p50_ns",
        "(lower is better)",
    ),
    (
        "async_rtt_current_vs_tokio_uds",
        "rtt_async_current_p50_ns",
        "tokio_uds_rtt_p50_ns",
        "(lower is better)",
    ),
    (
        "async_rtt_block_vs_tokio_uds",
        "rtt_async_block_p50_ns",
        "tokio_uds_rtt_p50_ns",
        "<= 0.7",
    ),
    (
        "async_rtt_block_vs_sync_block",
        "rtt_async_block_p50_ns",
        "rtt_sync_block_p50_ns",
        "<= 1.3",
    ),
    (
        "async_vs_sync_plain",
        "async_rps",
        "sync_plain_rps",
        ">= 0.8",
    ),
    (
        "async_drain_vs_sync_plain",
        "async_drain_rps",
        "sync_plain_rps",
        "(for reference)",
    ),
    (
        "same_cpu_vs_futex_floor_same_cpu",
        "rtt_same_cpu_p50_ns",
        "floor_futex_same_cpu_p50_ns",
        "<= 2",
    ),
    (
        "netem1_direct_vs_tcp",
        "netem1_direct_mbs",
        "netem1_tcp_mbs",
        ">= 0.8",
    ),
    (
        "netem1_remote_vs_tcp",
        "netem1_remote_mbs",
        "netem1_tcp_mbs",
        ">= 0.8",
    ),
    (
        "netem1_direct_pool4_vs_bound",
        "netem1_direct_pool4_mbs",
        "netem1_pool4_bound_mbs",
        "<= 1",
    ),
    (
        "netem1_remote_pool4_vs_bound",
        "netem1_remote_pool4_mbs",
        "netem1_pool4_bound_mbs",
        "<= 1",
    ),
    (
        "netem10_direct_vs_tcp",
        "netem10_direct_mbs",
        "netem10_tcp_mbs",
        ">= 0.8",
    ),
    (
        "netem10_remote_vs_tcp",
        "netem10_remote_mbs",
        "netem10_tcp_mbs",
        ">= 0.8",
    ),
    (
        "netem10_direct_pool4_vs_bound",
        "netem10_direct_pool4_mbs",
        "netem10_pool4_bound_mbs",
        "<= 1",
    ),
    (
        "netem10_remote_pool4_vs_bound",
        "netem10_remote_pool4_mbs",
        "netem10_pool4_bound_mbs",
        "<= 1",
    ),
];

/// The ratios of one run's measures, with their goals (NaN where a group was not run).
fn ratios(r: &[(&'static str, f64)]) -> Vec<(&'static str, f64, &'static str)> {
    let get = |k: &str| r.iter().find(|x| x.0 == k).map(|x| x.1).unwrap_or(f64::NAN);
    RATIOS
        .iter()
        .map(|&(name, num, den, goal)| (name, get(num) / get(den), goal))
        .collect()
}

/// Three decimals, as the figures are reported (a float that is not finite becomes `null`).
fn round3(v: f64) -> Option<f64> {
    v.is_finite().then(|| (v * 1000.0).round() / 1000.0)
}

/// The `i`-th argument of a bench role, as a port.
fn port_arg(args: &[String], i: usize) -> Result<u16, String> {
    args.get(i)
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("bench role {:?}: argument {i} must be a port", args.first()))
}
