//! `shmflow bench --case`: the user's own case between two processes — a record size, an
//! offered rate, a wait strategy on each side and a pool — measured three ways in one run:
//!
//! - **round trip** at the rate: every 1/rate the sending process writes a record of `len`
//!   bytes and waits for it to come back (back to back if a round trip takes longer); both of
//!   its ends wait as `--send-wait` says, the echo's as `--recv-wait` says. Each round trip is
//!   timed from its send to its reply, so the host's pauses between round trips do not count,
//!   and the gap before each is the case's: what a wait strategy that parks after a spin
//!   window costs shows here. Every round trip after warm-up is kept: exact percentiles.
//!   Each is also counted from the time it was due, so that a stall charges the round trips
//!   it delayed (a closed loop otherwise leaves them out).
//! - **the floor**: the same round trips, at the same rate and length, between two processes on
//!   raw shared memory, both spinning ([`SpinEcho`]). The case's trials and the floor's run
//!   in adjacent pairs (the order swapped every pair), and the per-pair ratios of their p50s
//!   and p99s say how much of a tail is the host's, which the floor shares. Each trial's own
//!   p99 over its own p50 is given too: on a VM the host may place the two vCPUs near in one
//!   trial and far in the next, and the pooled p99 then is the far placement's body.
//! - **one way** (open loop, as `--open-loop` measures it): records of `len` bytes at `--rate`
//!   a second, each stamped with its scheduled time; the receiver (waiting as `--recv-wait`
//!   says) counts `now - scheduled` in an HdrHistogram, so a held-up sender shows as latency
//!   of every record that should have gone meanwhile.
//!   The round trips before which this process saw no pause of the host while it waited for
//!   the round trip's time are shown apart: one that follows a pause runs on caches the host
//!   has used meanwhile.
//! - **idle CPU**: after the last record the sender stays quiet for a second (0.3 s with
//!   `--quick`) before it closes; the receiver's CPU time over that second, as a fraction of a
//!   core, is what the wait strategy costs while nothing comes.

use std::process::Child;
use std::time::Duration;

use hdrhistogram::Histogram;
use shmflow::{Consumer, FlushPolicy, Geometry, Producer, WaitStrategy};

use super::floors::SpinEcho;
use super::harness::{child, finish, machine, one_cpu, set_affinity, RawFdOf};
use super::openloop::{clock_ns, now_ns, Paced, Schedule};
use super::report::{round3, summary};
use super::roles::Role;

/// The scheduled time of the record that starts the quiet period (no real schedule is this
/// late).
const QUIET: u64 = u64::MAX - 1;

/// The user's case.
#[derive(Clone, Debug)]
pub(crate) struct Case {
    pub(crate) len: usize,
    pub(crate) rate: u64,
    pub(crate) send_wait: String,
    pub(crate) recv_wait: String,
    pub(crate) pool: Geometry,
    /// The CPUs of the sending and of the receiving process, if pinned.
    pub(crate) pin: Option<(usize, usize)>,
    /// Round trips of each side (the case's, the floor's) in all.
    pub(crate) rounds: usize,
    /// Adjacent pairs of round-trip trials (the case's, the floor's) they are spread over.
    pub(crate) pairs: usize,
    pub(crate) warmup: Duration,
    pub(crate) measure: Duration,
    pub(crate) quiet: Duration,
}

/// A wait strategy as the command line spells it: `block`, `park`, or `busy-poll:DURATION`
/// (`busy-poll:50us`, `busy-poll:1ms`).
pub(crate) fn parse_wait(s: &str) -> Result<WaitStrategy, String> {
    match s {
        "block" => Ok(WaitStrategy::Block),
        "park" => Ok(WaitStrategy::Park),
        _ => {
            let d = s.strip_prefix("busy-poll:").ok_or_else(|| {
                format!(
                    "wait strategy {s:?}: block, park or busy-poll:DURATION (e.g. busy-poll:50us)"
                )
            })?;
            Ok(WaitStrategy::BusyPoll(parse_duration(d)?))
        }
    }
}

/// `50us`, `200µs`, `1ms`, `2s`, `500ns`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .ok_or_else(|| format!("duration {s:?}: a number and a unit (ns, us, ms, s)"))?;
    let (n, unit) = s.split_at(split);
    let n: f64 = n
        .parse()
        .map_err(|_| format!("duration {s:?}: {n:?} is not a number"))?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(format!("duration {s:?}: the unit is ns, us, ms or s")),
    };
    Duration::try_from_secs_f64(n * scale).map_err(|e| format!("duration {s:?}: {e}"))
}

/// A pool as `SEGMENT_SIZE:COUNT`, the size in bytes or with `KiB`/`MiB` (`32KiB:16`).
pub(crate) fn parse_pool(s: &str) -> Result<Geometry, String> {
    let (size, count) = s
        .split_once(':')
        .ok_or_else(|| format!("pool {s:?}: SEGMENT_SIZE:COUNT, e.g. 32KiB:16"))?;
    let (digits, scale) = if let Some(n) = size.strip_suffix("KiB") {
        (n, 1024)
    } else if let Some(n) = size.strip_suffix("MiB") {
        (n, 1024 * 1024)
    } else {
        (size, 1)
    };
    let bad = |what: &str| format!("pool {s:?}: {what} is not a whole number");
    let segment_size = digits
        .parse::<u32>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| bad("the segment size"))?;
    let segment_count = count.parse::<u32>().map_err(|_| bad("the count"))?;
    let g = Geometry {
        segment_size,
        segment_count,
    };
    g.validate("the pool")
        .map_err(|e| format!("pool {s:?}: {e}"))?;
    Ok(g)
}

/// `SENDER,RECEIVER`: the CPUs of `--pin`.
pub(crate) fn parse_pin(s: &str) -> Result<(usize, usize), String> {
    let cpu = |c: &str| {
        c.trim()
            .parse::<usize>()
            .ok()
            .filter(|&c| c < libc::CPU_SETSIZE as usize)
            .ok_or_else(|| {
                format!(
                    "pin {s:?}: {c:?} is not a CPU number (0 to {})",
                    libc::CPU_SETSIZE - 1
                )
            })
    };
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("pin {s:?}: SENDER,RECEIVER, two CPU numbers such as 0,1"))?;
    Ok((cpu(a)?, cpu(b)?))
}

/// The CPUs the calling thread may run on.
fn allowed_cpus() -> Result<Vec<usize>, String> {
    // SAFETY: all zeros is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable `cpu_set_t` of the size given.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0
    {
        return Err(format!(
            "--pin: the CPUs this process may run on are unknown: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` < CPU_SETSIZE, the set's number of bits.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Sorted CPU numbers as ranges, the way /proc lists them: `0-3,6`.
fn cpu_list(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// Pins the calling thread to `cpu`.
fn pin_this_thread(cpu: usize) -> Result<(), String> {
    set_affinity(&one_cpu(cpu))
        .map_err(|e| format!("--pin: this process cannot run on CPU {cpu}: {e}"))
}

/// Makes a child process start pinned to `cpu` (before it runs any of its own code).
fn pin_child(cmd: &mut std::process::Command, cpu: usize) {
    use std::os::unix::process::CommandExt;
    let set = one_cpu(cpu);
    // SAFETY: only sched_setaffinity between fork and exec (a plain system call,
    // async-signal-safe); `set` is moved into the closure.
    unsafe {
        cmd.pre_exec(move || set_affinity(&set));
    }
}

/// Pins a child as `pin` says (its receiving side's CPU), if at all.
fn pinned(pin: Option<(usize, usize)>) -> impl FnOnce(&mut std::process::Command) {
    move |cmd| {
        if let Some((_, receiver)) = pin {
            pin_child(cmd, receiver);
        }
    }
}

/// `segment_size:count` as [`parse_pool`] reads it.
fn pool_arg(g: Geometry) -> String {
    format!("{}:{}", g.segment_size, g.segment_count)
}

/// Round trips (sorted nanoseconds): all of them, and those before which this process saw
/// no pause of the host (no gap of 10 µs or more between two reads of the clock while it
/// waited for the round trip's time); and each round trip counted from the time it was due
/// rather than from its send, so that one that held up the next ones is charged for their
/// wait too (a closed loop otherwise leaves out the round trips a stall delayed).
#[derive(Default)]
struct Trips {
    all: Vec<u64>,
    clean: Vec<u64>,
    from_schedule: Vec<u64>,
}

impl Trips {
    /// Adds `t`'s round trips, keeping the whole sorted.
    fn extend(&mut self, t: Trips) {
        self.all.extend(t.all);
        self.clean.extend(t.clean);
        self.from_schedule.extend(t.from_schedule);
        self.all.sort_unstable();
        self.clean.sort_unstable();
        self.from_schedule.sort_unstable();
    }
}

/// p50, p99, p99.9 and max of sorted `v` (nearest rank: the smallest value with at least a
/// fraction p of them at or below); zeros for none.
fn at(v: &[u64]) -> [u64; 4] {
    if v.is_empty() {
        return [0; 4];
    }
    let pct = |p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1];
    [pct(0.5), pct(0.99), pct(0.999), v[v.len() - 1]]
}

/// `rounds` round trips, one every 1/rate (back to back when one takes longer), after a
/// warm-up back to back (pages, caches, branch predictors); `one(i)` makes round trip `i`.
fn paced(
    case: &Case,
    rounds: usize,
    mut one: impl FnMut(u64) -> Result<(), String>,
) -> Result<Trips, String> {
    // Each reply is waited for after a gap as long as the case's, the gap in which a waiting
    // end may park.
    let interval_ns = 1e9 / case.rate as f64;
    let warm = (rounds / 10).max(1000);
    let mut t = Trips {
        all: Vec::with_capacity(rounds),
        clean: Vec::with_capacity(rounds),
        from_schedule: Vec::with_capacity(rounds),
    };
    let mut start = 0;
    for i in 0..warm + rounds {
        if i == warm {
            start = now_ns();
        }
        let sched = match i.checked_sub(warm) {
            Some(k) => start + (k as f64 * interval_ns) as u64,
            None => 0,
        };
        let (mut prev, mut paused) = (now_ns(), false);
        while prev < sched {
            std::hint::spin_loop();
            let now = now_ns();
            paused |= now - prev >= 10_000;
            prev = now;
        }
        let began = now_ns();
        one(i as u64)?;
        if i >= warm {
            let end = now_ns();
            let took = end - began;
            t.all.push(took);
            t.from_schedule.push(end - sched.min(began));
            if !paused {
                t.clean.push(took);
            }
        }
    }
    t.all.sort_unstable();
    t.clean.sort_unstable();
    t.from_schedule.sort_unstable();
    Ok(t)
}

/// `rounds` round trips of the case through shmflow: a channel to an echo process and a
/// second one back, each end waiting as the case says.
fn shmflow_trips(case: &Case, rounds: usize) -> Result<Trips, String> {
    let wait = parse_wait(&case.send_wait)?;
    let (mut ping, ping_peer) = Producer::create_anonymous(case.pool).map_err(|e| e.to_string())?;
    let (mut pong, pong_peer) = Consumer::create_anonymous(case.pool).map_err(|e| e.to_string())?;
    ping.set_flush_policy(FlushPolicy::EveryRecord);
    ping.set_wait_strategy(wait);
    pong.set_wait_strategy(wait);
    let echo = Role::CaseEcho {
        wait: case.recv_wait.clone(),
    };
    let fds = [
        ("PING", ping_peer.as_fd_raw()),
        ("PONG", pong_peer.as_fd_raw()),
    ];
    let c = child(&echo, &fds, pinned(case.pin));
    drop((ping_peer, pong_peer));
    let mut msg = vec![0x5Au8; case.len];
    let trips = paced(case, rounds, |i| {
        msg[..8].copy_from_slice(&i.to_le_bytes());
        ping.send(&msg).map_err(|e| e.to_string())?;
        match pong.recv().map_err(|e| e.to_string())? {
            Some(r) if r.len() == Some(msg.len()) => Ok(()),
            Some(r) => Err(format!("the echo sent {:?} bytes back", r.len())),
            None => Err("the echo ended early".into()),
        }
    });
    drop(ping);
    while matches!(pong.recv(), Ok(Some(_))) {}
    // A failed send or receive says more than the echo's exit that follows from it.
    let ended = finish(c);
    let trips = trips?;
    ended.map(|_| trips)
}

/// `rounds` round trips of the case's records on the floor ([`SpinEcho`]): raw shared
/// memory, both processes spinning.
fn floor_trips(case: &Case, rounds: usize) -> Result<Trips, String> {
    let mut echo = SpinEcho::start(case.len, pinned(case.pin));
    let mut msg = vec![0x5Au8; case.len];
    let trips = paced(case, rounds, |i| {
        msg[..8].copy_from_slice(&i.to_le_bytes());
        echo.round(&mut msg)?;
        if msg[..8] != i.to_le_bytes() {
            return Err(format!("the floor's peer sent back {:?}", &msg[..8]));
        }
        Ok(())
    });
    let ended = echo.end();
    let trips = trips?;
    ended.map(|_| trips)
}

/// The case's round trips and the floor's, in `case.pairs` adjacent pairs of trials (the
/// case's first in even pairs, the floor's in odd ones), `case.rounds` of each in all
/// (rounded up to a multiple of the pairs).
struct Compared {
    case: Trips,
    floor: Trips,
    /// Per pair: the case's p50 over the floor's, and the same of the p99s.
    p50: Vec<f64>,
    p99: Vec<f64>,
    /// Per trial: its p99 over its own p50, the case's and the floor's. The host places the
    /// two vCPUs near or far from one trial to the next (p50s of about 0.2 or 0.6 µs on the
    /// machines of docs/BENCHMARKS.md), and percentiles pooled over trials of both take the far
    /// ones as their p99: this is the tail under one placement.
    case_tail: Vec<f64>,
    floor_tail: Vec<f64>,
    /// The same, of the round trips counted from the time they were due.
    case_sched_tail: Vec<f64>,
    floor_sched_tail: Vec<f64>,
}

fn compared(case: &Case) -> Result<Compared, String> {
    let per = case.rounds.div_ceil(case.pairs);
    let mut out = Compared {
        case: Trips::default(),
        floor: Trips::default(),
        p50: Vec::new(),
        p99: Vec::new(),
        case_tail: Vec::new(),
        floor_tail: Vec::new(),
        case_sched_tail: Vec::new(),
        floor_sched_tail: Vec::new(),
    };
    for k in 0..case.pairs {
        let (c, f) = if k % 2 == 0 {
            let c = shmflow_trips(case, per)?;
            (c, floor_trips(case, per)?)
        } else {
            let f = floor_trips(case, per)?;
            (shmflow_trips(case, per)?, f)
        };
        let (ca, fa) = (at(&c.all), at(&f.all));
        out.p50.push(ca[0] as f64 / fa[0].max(1) as f64);
        out.p99.push(ca[1] as f64 / fa[1].max(1) as f64);
        out.case_tail.push(ca[1] as f64 / ca[0].max(1) as f64);
        out.floor_tail.push(fa[1] as f64 / fa[0].max(1) as f64);
        let (cs, fs) = (at(&c.from_schedule), at(&f.from_schedule));
        out.case_sched_tail.push(cs[1] as f64 / cs[0].max(1) as f64);
        out.floor_sched_tail
            .push(fs[1] as f64 / fs[0].max(1) as f64);
        out.case.extend(c);
        out.floor.extend(f);
    }
    Ok(out)
}

/// The echo of [`shmflow_trips`]: every record from `PING` back into `PONG`, both ends waiting
/// as `wait` says.
pub(crate) fn echo(wait: &str) -> Result<(), String> {
    let wait = parse_wait(wait)?;
    let mut ping = Consumer::from_env("PING").map_err(|e| e.to_string())?;
    let mut pong = Producer::from_env("PONG").map_err(|e| e.to_string())?;
    ping.set_wait_strategy(wait);
    pong.set_wait_strategy(wait);
    pong.set_flush_policy(FlushPolicy::EveryRecord);
    let mut buf = Vec::new();
    while let Some(r) = ping.recv().map_err(|e| e.to_string())? {
        buf.clear();
        r.read_all_into(&mut buf).map_err(|e| e.to_string())?;
        pong.send(&buf).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// This process's CPU time, in nanoseconds.
fn cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// What the open loop measured.
struct OneWay {
    /// Records sent in the measured seconds, per second.
    achieved: f64,
    /// How far behind its schedule the sender was at the end.
    lag: Duration,
    /// Nanoseconds at p50, p99, p99.9, and the max.
    at: [u64; 4],
    count: u64,
    /// The receiver's CPU while nothing came, in cores.
    idle_cpu: f64,
}

/// The open loop at the case's rate, then the quiet period.
fn one_way(case: &Case) -> Result<OneWay, String> {
    let interval_ns = 1e9 / case.rate as f64;
    let warm = case.warmup.as_nanos() as u64;
    let total = warm + case.measure.as_nanos() as u64;
    let start = now_ns() + 50_000_000;
    let from = start + warm;
    let (mut p, peer) = Producer::create_anonymous(case.pool).map_err(|e| e.to_string())?;
    p.set_wait_strategy(parse_wait(&case.send_wait)?);
    let sink = Role::CaseSink {
        wait: case.recv_wait.clone(),
        from,
    };
    let c: Child = child(&sink, &[("CH", peer.as_fd_raw())], pinned(case.pin));
    drop(peer);
    let mut msg = vec![0x5Au8; case.len];
    // The sends, then the quiet period; the receiver is waited for whatever they return.
    let mut sends = || -> Result<Paced, String> {
        let paced = Schedule {
            start,
            interval_ns,
            end: start + total,
            from,
        }
        .run(|sched| {
            msg[..8].copy_from_slice(&sched.to_le_bytes());
            p.send(&msg).map_err(|e| e.to_string())
        })?;
        msg[..8].copy_from_slice(&QUIET.to_le_bytes());
        p.send(&msg).map_err(|e| e.to_string())?;
        p.flush().map_err(|e| e.to_string())?;
        std::thread::sleep(case.quiet);
        Ok(paced)
    };
    let sent = sends();
    drop(p);
    let report = finish(c);
    let Paced { sent, lag, last } = sent?;
    let report = report?;
    let v: Vec<f64> = report
        .split_whitespace()
        .map(|w| w.parse::<f64>().map_err(|e| format!("{w:?}: {e}")))
        .collect::<Result<_, _>>()?;
    let [count, p50, p99, p999, max, idle_cpu] = v[..] else {
        return Err(format!("the receiver's report {report:?} is not 6 figures"));
    };
    if count as u64 != sent {
        return Err(format!(
            "sent {sent} measured records, the receiver counted {count}"
        ));
    }
    Ok(OneWay {
        achieved: sent as f64
            / (last.saturating_sub(from) as f64 / 1e9).max(case.measure.as_secs_f64() * 0.999),
        lag: Duration::from_nanos(lag),
        at: [p50 as u64, p99 as u64, p999 as u64, max as u64],
        count: count as u64,
        idle_cpu,
    })
}

/// The receiver of [`one_way`]: the loop a user writes, waiting as `wait` says; prints the
/// count, p50, p99, p99.9 and max of the records scheduled at `from` or later, and its CPU
/// over the quiet period in cores.
pub(crate) fn sink(wait: &str, from: u64) -> Result<(), String> {
    let mut h =
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).map_err(|e| e.to_string())?;
    let mut c = Consumer::from_env("CH").map_err(|e| e.to_string())?;
    c.set_wait_strategy(parse_wait(wait)?);
    let mut quiet_from: Option<(u64, u64)> = None;
    while let Some(r) = c.recv().map_err(|e| e.to_string())? {
        let now = now_ns();
        let b = r.as_bytes().ok_or("a record in one segment")?;
        let sched = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
        if sched == QUIET {
            quiet_from = Some((now, cpu_ns()));
        } else if sched >= from {
            h.saturating_record(now.saturating_sub(sched).max(1));
        }
    }
    let (wall0, cpu0) = quiet_from.ok_or("the stream ended without its quiet period")?;
    let idle = (cpu_ns() - cpu0) as f64 / (now_ns() - wall0).max(1) as f64;
    println!(
        "{} {} {} {} {} {idle:.4}",
        h.len(),
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.max()
    );
    Ok(())
}

fn us(ns: u64) -> String {
    format!("{:.2} µs", ns as f64 / 1e3)
}

/// The host's own pauses: one thread reading the clock in a loop for `secs`; every gap of
/// 10 µs or more between two reads is time the thread did not run (an interrupt, another
/// task, the hypervisor). (pauses a second, the fraction of time lost, the longest in ns).
fn host_pauses(secs: Duration) -> (f64, f64, u64) {
    let start = now_ns();
    let end = start + secs.as_nanos() as u64;
    let (mut prev, mut n, mut lost, mut longest) = (start, 0u64, 0u64, 0u64);
    while prev < end {
        let now = now_ns();
        let gap = now - prev;
        if gap >= 10_000 {
            n += 1;
            lost += gap;
            longest = longest.max(gap);
        }
        prev = now;
    }
    let wall = (prev - start) as f64;
    (n as f64 / wall * 1e9, lost as f64 / wall, longest)
}

/// A `(median, min, max)` of ratios as JSON.
fn spread_json((median, min, max): (f64, f64, f64)) -> serde_json::Value {
    serde_json::json!({ "median": round3(median), "min": round3(min), "max": round3(max) })
}

/// Runs the case and prints its figures (or one JSON object).
pub(crate) fn main(case: &Case, json: bool) -> Result<(), String> {
    // Both spelled right before anything runs.
    parse_wait(&case.send_wait)?;
    parse_wait(&case.recv_wait)?;
    if case.len < 8 {
        return Err(format!("--len {}: at least 8 bytes", case.len));
    }
    if case.len > case.pool.segment_size as usize - 16 {
        return Err(format!(
            "--len {}: a record must fit one segment of the pool (at most {} bytes)",
            case.len,
            case.pool.segment_size - 16
        ));
    }
    if case.rate == 0 {
        return Err("--rate 0: at least one record a second".into());
    }
    if case.pairs > case.rounds {
        return Err(format!(
            "--pairs {}: at most {} at --rate {} (one round trip of each side a pair)",
            case.pairs, case.rounds, case.rate
        ));
    }
    // Before the pin, which narrows what this thread sees of the machine.
    let (cpu, cores, kernel) = machine();
    if let Some((sender, receiver)) = case.pin {
        let allowed = allowed_cpus()?;
        for cpu in [sender, receiver] {
            if !allowed.contains(&cpu) {
                return Err(format!(
                    "--pin {sender},{receiver}: this process may not run on CPU {cpu} (it may on {})",
                    cpu_list(&allowed)
                ));
            }
        }
        // The trials run on this thread, and the children start here before their own pin.
        pin_this_thread(sender)?;
    }
    let pauses = host_pauses(case.quiet);
    let cmp = compared(case)?;
    let (rtt, clean) = (&cmp.case.all, &cmp.case.clean);
    let (rtt_at, clean_at) = (at(rtt), at(clean));
    let (floor_at, floor_clean_at) = (at(&cmp.floor.all), at(&cmp.floor.clean));
    let (p50_vs, p99_vs) = (summary(cmp.p50.clone()), summary(cmp.p99.clone()));
    let (case_tail, floor_tail) = (
        summary(cmp.case_tail.clone()),
        summary(cmp.floor_tail.clone()),
    );
    let (case_sched_tail, floor_sched_tail) = (
        summary(cmp.case_sched_tail.clone()),
        summary(cmp.floor_sched_tail.clone()),
    );
    let (sched_at, floor_sched_at) = (at(&cmp.case.from_schedule), at(&cmp.floor.from_schedule));
    let ow = one_way(case)?;
    let sustained = ow.lag < Duration::from_millis(1);
    if json {
        let v = serde_json::json!({
            "machine": { "cpu": cpu, "cores": cores, "kernel": kernel },
            "case": {
                "len": case.len,
                "rate": case.rate,
                "send_wait": case.send_wait,
                "recv_wait": case.recv_wait,
                "pool": pool_arg(case.pool),
                "pin": case.pin.map(|(s, r)| [s, r]),
            },
            "round_trip_ns": {
                "count": rtt.len(), "p50": rtt_at[0], "p99": rtt_at[1], "p999": rtt_at[2],
                "max": rtt_at[3],
            },
            "round_trip_no_pause_seen_ns": {
                "count": clean.len(), "p50": clean_at[0], "p99": clean_at[1],
                "p999": clean_at[2], "max": clean_at[3],
            },
            "round_trip_from_schedule_ns": {
                "count": cmp.case.from_schedule.len(), "p50": sched_at[0], "p99": sched_at[1],
                "p999": sched_at[2], "max": sched_at[3],
            },
            "floor_round_trip_ns": {
                "count": cmp.floor.all.len(), "p50": floor_at[0], "p99": floor_at[1],
                "p999": floor_at[2], "max": floor_at[3],
            },
            "floor_round_trip_no_pause_seen_ns": {
                "count": cmp.floor.clean.len(), "p50": floor_clean_at[0],
                "p99": floor_clean_at[1], "p999": floor_clean_at[2], "max": floor_clean_at[3],
            },
            "floor_round_trip_from_schedule_ns": {
                "count": cmp.floor.from_schedule.len(), "p50": floor_sched_at[0],
                "p99": floor_sched_at[1], "p999": floor_sched_at[2], "max": floor_sched_at[3],
            },
            "round_trip_vs_floor": {
                "pairs": case.pairs,
                "p50": spread_json(p50_vs),
                "p99": spread_json(p99_vs),
            },
            "p99_over_p50_per_trial": {
                "trials": case.pairs,
                "round_trip": spread_json(case_tail),
                "floor": spread_json(floor_tail),
                "round_trip_each": cmp.case_tail.iter().map(|&r| round3(r)).collect::<Vec<_>>(),
                "floor_each": cmp.floor_tail.iter().map(|&r| round3(r)).collect::<Vec<_>>(),
                "round_trip_from_schedule": spread_json(case_sched_tail),
                "floor_from_schedule": spread_json(floor_sched_tail),
            },
            "one_way_ns": {
                "count": ow.count, "p50": ow.at[0], "p99": ow.at[1], "p999": ow.at[2],
                "max": ow.at[3], "achieved_rate": ow.achieved.round(), "sustained": sustained,
            },
            "receiver_idle_cpu_cores": ow.idle_cpu,
            "host_pauses": {
                "per_second": pauses.0, "time_lost": pauses.1, "longest_ns": pauses.2,
            },
        });
        println!("{v}");
        return Ok(());
    }
    println!("machine: {cpu}, {cores} cores, Linux {kernel}");
    println!(
        "case: {} B records, {} records/s, sender waits {}, receiver waits {}, pool {} × {} B",
        case.len,
        case.rate,
        case.send_wait,
        case.recv_wait,
        case.pool.segment_count,
        case.pool.segment_size
    );
    if let Some((sender, receiver)) = case.pin {
        println!("pinned: the sending process to CPU {sender}, the receiving one to CPU {receiver} (the floor's alike)");
    }
    println!(
        "{:<30} {:>12} {:>12} {:>12} {:>12}",
        "", "p50", "p99", "p99.9", "max"
    );
    let row = |name: &str, at: [u64; 4]| {
        println!(
            "{name:<30} {:>12} {:>12} {:>12} {:>12}",
            us(at[0]),
            us(at[1]),
            us(at[2]),
            us(at[3])
        )
    };
    row(&format!("round trip ({} at the rate)", rtt.len()), rtt_at);
    row(
        &format!("  no host pause before ({})", clean.len()),
        clean_at,
    );
    row("  from the time it was due", sched_at);
    row(
        &format!("floor on raw memory ({})", cmp.floor.all.len()),
        floor_at,
    );
    row(
        &format!("  no host pause before ({})", cmp.floor.clean.len()),
        floor_clean_at,
    );
    row("  from the time it was due", floor_sched_at);
    row(&format!("one way ({} records)", ow.count), ow.at);
    println!(
        "one way: {:.0} records/s achieved{}",
        ow.achieved,
        if sustained {
            String::new()
        } else {
            format!(
                ", NOT sustained (the sender ended {:.1} ms behind its schedule)",
                ow.lag.as_secs_f64() * 1e3
            )
        }
    );
    println!(
        "round trip / floor, per pair of trials ({} pairs): p50 {:.2} [{:.2}..{:.2}], \
         p99 {:.2} [{:.2}..{:.2}]",
        case.pairs, p50_vs.0, p50_vs.1, p50_vs.2, p99_vs.0, p99_vs.1, p99_vs.2
    );
    println!(
        "  (the floor: the same round trips between two processes on raw shared memory,\n   \
         both spinning, no protocol: what this machine allows at the rate)"
    );
    println!(
        "p99 / p50 within each trial ({} trials each): round trip {:.2} [{:.2}..{:.2}], \
         floor {:.2} [{:.2}..{:.2}]",
        case.pairs, case_tail.0, case_tail.1, case_tail.2, floor_tail.0, floor_tail.1, floor_tail.2
    );
    println!(
        "  from the time it was due: round trip {:.2} [{:.2}..{:.2}], floor {:.2} [{:.2}..{:.2}]",
        case_sched_tail.0,
        case_sched_tail.1,
        case_sched_tail.2,
        floor_sched_tail.0,
        floor_sched_tail.1,
        floor_sched_tail.2
    );
    println!(
        "  (the host may place the two vCPUs differently from one trial to the next; the\n   \
         pooled percentiles above then mix placements. From the time it was due: a round\n   \
         trip that held up the next ones charges them their wait too)"
    );
    println!(
        "receiver idle: {:.1} % of a core over {:.1} s without records",
        ow.idle_cpu * 100.0,
        case.quiet.as_secs_f64()
    );
    println!(
        "host: a spinning thread paused {:.0} times a second (>= 10 µs; {:.2} % of the time, \
         longest {}): percentiles beyond that fraction measure the host",
        pauses.0,
        pauses.1 * 100.0,
        us(pauses.2)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_strategies_and_pools_parse_as_the_docs_spell_them() {
        assert_eq!(parse_wait("block"), Ok(WaitStrategy::Block));
        assert_eq!(parse_wait("park"), Ok(WaitStrategy::Park));
        assert_eq!(
            parse_wait("busy-poll:50us"),
            Ok(WaitStrategy::BusyPoll(Duration::from_micros(50)))
        );
        assert_eq!(
            parse_wait("busy-poll:1.5ms"),
            Ok(WaitStrategy::BusyPoll(Duration::from_micros(1500)))
        );
        assert!(parse_wait("spin")
            .unwrap_err()
            .contains("busy-poll:DURATION"));
        assert!(parse_wait("busy-poll:5").unwrap_err().contains("unit"));
        assert!(parse_wait("busy-poll:5h").unwrap_err().contains("unit"));
        assert_eq!(
            parse_pool("32KiB:16"),
            Ok(Geometry {
                segment_size: 32 * 1024,
                segment_count: 16
            })
        );
        assert_eq!(parse_pool("4096:2").map(pool_arg), Ok("4096:2".into()));
        assert!(parse_pool("32KiB")
            .unwrap_err()
            .contains("SEGMENT_SIZE:COUNT"));
        assert!(parse_pool("100:2").is_err(), "not a valid geometry");
    }

    #[test]
    fn pins_parse_as_two_cpu_numbers_and_cpu_sets_print_as_proc_lists_them() {
        assert_eq!(parse_pin("0,1"), Ok((0, 1)));
        assert_eq!(parse_pin(" 3, 3"), Ok((3, 3)));
        assert!(parse_pin("0").unwrap_err().contains("SENDER,RECEIVER"));
        assert!(parse_pin("0,x").unwrap_err().contains("not a CPU number"));
        assert!(parse_pin("0,1024").unwrap_err().contains("0 to 1023"));
        assert_eq!(cpu_list(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
        assert_eq!(cpu_list(&[5]), "5");
        assert_eq!(cpu_list(&[]), "");
    }
}
