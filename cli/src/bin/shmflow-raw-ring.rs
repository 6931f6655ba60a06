//! The raw ring `shmflow bench` holds shmflow's streams against (`floor_small_rps`,
//! `floor_bulk_gbps`), in a binary of its own: a ring of 64 KiB slots in shared memory between
//! two processes, busy-polled on both sides, no protocol, no checks — what moving the bytes
//! costs. Its own binary so that its machine code, and where its loops fall in memory, change
//! only when this file (or the compiler) does: in the `shmflow` binary, a change anywhere in
//! the library moved the ring's loops and with them its rate by up to ~20 % on some CPUs.
//!
//! ```text
//! shmflow-raw-ring stream POOL_BYTES RECORD_LEN SECS   # prints "records nanoseconds"
//! shmflow-raw-ring source                              # prints the sources' fingerprint
//! ```
//!
//! `stream` starts its peer (`sink`, this binary again) on a memfd it passes down, writes
//! records of `RECORD_LEN` bytes for `SECS` seconds and prints the records and nanoseconds
//! the peer counted from its first record to the last. Either side ends when the other is
//! gone (no spin without a look at its peer). `source` prints a fingerprint of the sources
//! the binary was built from, which `shmflow bench` checks against its own before it runs
//! the ring.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};

#[path = "../bench/bytes.rs"]
mod bytes;
use bytes::{touch, LineBuf, RING_SOURCES};

/// Slot size: a 64 KiB record fills one exactly.
const SLOT: usize = 64 * 1024;
/// Where each slot's used length is kept (after `head`, `tail`, `done` on lines of their own),
/// a word a slot to the end of the 4 KiB header.
const LENS: usize = 512;
/// Slots the header has room for: 448 (a ring of 28 MiB).
const MAX_SLOTS: usize = (4096 - LENS) / 8;
/// A record's length word before its payload: 8 bytes, as a shmflow frame's header, so that
/// payloads start 8 bytes into their frame in both.
const LEN_WORD: usize = 8;
/// Spins of a waiting side between two looks at whether its peer is still there.
const LOOK_EVERY: u32 = 1 << 14;
/// The environment variable that names the memfd's descriptor in the peer.
const FD_VAR: &str = "SHMFLOW_RAW_RING_FD";
/// The environment variable that tells the peer the process id of the writer that started it
/// (the peer ends when its parent is another: the writer is gone, perhaps before the peer
/// first looked).
const PARENT_VAR: &str = "SHMFLOW_RAW_RING_PARENT";

fn ring_len(slots: usize) -> usize {
    4096 + slots * SLOT
}

/// The shared mapping, raw (`MmapRaw`: pointers, never references to its bytes, as both
/// processes write it).
struct Ring {
    map: MmapRaw,
    slots: usize,
}

impl Ring {
    /// Maps a ring of `slots` slots from `fd`, which must be that long.
    fn map(fd: &File, slots: usize) -> Result<Ring, String> {
        if !(2..=MAX_SLOTS).contains(&slots) {
            return Err(format!("a ring has 2 to {MAX_SLOTS} slots, not {slots}"));
        }
        let size = fd
            .metadata()
            .map_err(|e| format!("the ring's size: {e}"))?
            .len();
        if size < ring_len(slots) as u64 {
            return Err(format!(
                "the ring's memory is {size} bytes, not the {} of {slots} slots",
                ring_len(slots)
            ));
        }
        let map = MmapOptions::new()
            .len(ring_len(slots))
            .populate()
            .map_raw(fd)
            .map_err(|e| format!("mapping the ring: {e}"))?;
        Ok(Ring { map, slots })
    }

    /// A header word: `head`, `tail`, `done`, or a slot's used length (below `LENS + 8 *
    /// MAX_SLOTS = 4096`, so never in a slot).
    fn word(&self, off: usize) -> &AtomicU64 {
        assert!(off + 8 <= 4096 && off.is_multiple_of(8));
        // SAFETY: in bounds (the header lies within every mapping `map` accepts), aligned, and
        // the header's words are only ever accessed atomically by both processes.
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const AtomicU64) }
    }

    /// The start of slot `i` (of `slots`).
    fn slot(&self, i: usize) -> *mut u8 {
        assert!(i < self.slots);
        // SAFETY: `4096 + i * SLOT + SLOT <= ring_len(slots)`: inside the mapping.
        unsafe { self.map.as_mut_ptr().add(4096 + i * SLOT) }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg =
        |i: usize| -> Result<&str, String> { args.get(i).map(String::as_str).ok_or_else(usage) };
    let num = |i: usize| -> Result<usize, String> {
        arg(i)?
            .parse::<usize>()
            .map_err(|e| format!("argument {i}: {e}\n{}", usage()))
    };
    let run = || -> Result<(), String> {
        match args.first().map(String::as_str) {
            Some("stream") => {
                let (pool, len) = (num(1)?, num(2)?);
                let secs = arg(3)?
                    .parse::<f64>()
                    .ok()
                    .and_then(|s| Duration::try_from_secs_f64(s).ok())
                    .filter(|d| !d.is_zero());
                let (Some(secs), true, true) =
                    (secs, (8..=SLOT).contains(&len), pool <= MAX_SLOTS * SLOT)
                else {
                    return Err(format!(
                        "POOL_BYTES must be at most {} MiB, RECORD_LEN 8 to {SLOT}, SECS a \
                         number of seconds above 0\n{}",
                        (MAX_SLOTS * SLOT) >> 20,
                        usage()
                    ));
                };
                let (n, ns) = stream((pool / SLOT).max(2), len, secs)?;
                println!("{n} {ns}");
                Ok(())
            }
            Some("sink") => sink(num(1)?, num(2)?),
            Some("source") => {
                println!("{RING_SOURCES:016x}");
                Ok(())
            }
            _ => Err(usage()),
        }
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shmflow-raw-ring: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> String {
    "usage: shmflow-raw-ring stream POOL_BYTES RECORD_LEN SECS | shmflow-raw-ring source"
        .to_string()
}

/// The writing side: starts the sink on a fresh memfd, writes for `secs`, and returns what
/// the sink counted.
fn stream(slots: usize, len: usize, secs: Duration) -> Result<(String, String), String> {
    // SAFETY: memfd_create with a valid name; checked. Without MFD_CLOEXEC: the sink
    // inherits it (this binary starts no other program).
    let fd = unsafe { libc::memfd_create(c"shmflow-raw-ring".as_ptr(), 0) };
    if fd < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor, ours.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(ring_len(slots) as u64)
        .map_err(|e| format!("sizing the memfd: {e}"))?;
    let ring = Ring::map(&file, slots)?;
    let exe = std::env::current_exe().map_err(|e| format!("this program's own path: {e}"))?;
    let mut child = Command::new(exe)
        .args(["sink", &slots.to_string(), &len.to_string()])
        .env(FD_VAR, file.as_raw_fd().to_string())
        .env(PARENT_VAR, std::process::id().to_string())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the sink: {e}"))?;
    let wrote = write(&ring, len, secs, &mut child);
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for the sink: {e}"))?;
    wrote?;
    if !status.success() {
        return Err(format!("the sink failed ({status})"));
    }
    let mut it = out.split_whitespace();
    match (it.next(), it.next()) {
        (Some(n), Some(ns)) => Ok((n.to_string(), ns.to_string())),
        _ => Err(format!("the sink printed {out:?}")),
    }
}

#[inline(never)]
fn write(ring: &Ring, len: usize, secs: Duration, child: &mut Child) -> Result<(), String> {
    let slots = ring.slots;
    let (head, tail, done) = (ring.word(0), ring.word(128), ring.word(256));
    let line = LineBuf::new(len);
    let buf = line.bytes();
    let frame = (LEN_WORD + len + 7) & !7;
    let end = Instant::now() + secs;
    let mut t = 0u64;
    let mut spins = 0u32;
    while Instant::now() < end {
        for _ in 0..8 {
            // SYNC POINT: pairs with the sink's Release store of `head` after it read a slot.
            while t - head.load(Ordering::Acquire) >= slots as u64 {
                std::hint::spin_loop();
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(LOOK_EVERY) {
                    if let Ok(Some(status)) = child.try_wait() {
                        return Err(format!("the sink ended early ({status})"));
                    }
                }
            }
            let slot = (t % slots as u64) as usize;
            let base = ring.slot(slot);
            let used = if len == SLOT {
                // SAFETY: exactly one slot, ours until `tail` is published.
                unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), base, SLOT) };
                SLOT
            } else {
                let mut off = 0;
                while off + frame <= SLOT {
                    // SAFETY: inside the slot (the loop's condition), ours until `tail` is
                    // published.
                    unsafe {
                        (base.add(off) as *mut u64).write_unaligned(len as u64);
                        std::ptr::copy_nonoverlapping(buf.as_ptr(), base.add(off + LEN_WORD), len);
                    }
                    off += frame;
                }
                off
            };
            // Relaxed: published by the Release store of `tail` below (SYNC POINT there).
            ring.word(LENS + slot * 8)
                .store(used as u64, Ordering::Relaxed);
            t += 1;
            // SYNC POINT: pairs with the sink's Acquire load of `tail`.
            tail.store(t, Ordering::Release);
        }
    }
    // SYNC POINT: pairs with the sink's Acquire load of `done`.
    done.store(1, Ordering::Release);
    Ok(())
}

/// The reading side: reads the ring to its end, touching every record; prints `records
/// nanoseconds`. Ends with an error if the writer is gone before it said `done`.
fn sink(slots: usize, len: usize) -> Result<(), String> {
    let fd: i32 = std::env::var(FD_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{FD_VAR} is not set: `sink` is started by `stream`"))?;
    if !(8..=SLOT).contains(&len) {
        return Err(format!("sink: records of {len} bytes (8 to {SLOT})"));
    }
    // SAFETY: the descriptor `stream` passed down, ours from here on.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let ring = Ring::map(&file, slots)?;
    let parent: u32 = std::env::var(PARENT_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{PARENT_VAR} is not set: `sink` is started by `stream`"))?;
    let (n, sum, ns) = read(&ring, len, parent)?;
    std::hint::black_box(sum);
    println!("{n} {ns}");
    Ok(())
}

#[inline(never)]
fn read(ring: &Ring, len: usize, parent: u32) -> Result<(u64, u64, u128), String> {
    let slots = ring.slots;
    let (head, tail, done) = (ring.word(0), ring.word(128), ring.word(256));
    let frame = (LEN_WORD + len + 7) & !7;
    let (mut h, mut n, mut sum, mut start) = (0u64, 0u64, 0u64, None);
    let mut spins = 0u32;
    loop {
        // SYNC POINT: pairs with the writer's Release store of `tail`.
        let t = tail.load(Ordering::Acquire);
        if h == t {
            // SYNC POINT: both pair with the writer's Release stores, of `done` (after its
            // last `tail`) and of `tail`: `done` seen, a `tail` still at `h` is the last.
            if done.load(Ordering::Acquire) == 1 && tail.load(Ordering::Acquire) == h {
                break;
            }
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(LOOK_EVERY) && std::os::unix::process::parent_id() != parent {
                return Err("the writer is gone".to_string());
            }
            continue;
        }
        start.get_or_insert_with(Instant::now);
        while h < t {
            let slot = (h % slots as u64) as usize;
            let base = ring.slot(slot);
            // Relaxed: the Acquire load of `tail` above ordered it after the writer's store
            // (SYNC POINT there).
            let used = (ring.word(LENS + slot * 8).load(Ordering::Relaxed) as usize).min(SLOT);
            if len == SLOT {
                // SAFETY: one whole published slot (Acquire on `tail`).
                sum = sum.wrapping_add(touch(unsafe { std::slice::from_raw_parts(base, used) }));
                n += 1;
            }
            let mut off = if len == SLOT { used } else { 0 };
            while off + LEN_WORD <= used {
                // SAFETY: within the published slot.
                let l = unsafe { (base.add(off) as *const u64).read_unaligned() } as usize;
                // SAFETY: the record lies within the slot (the writer wrote it so).
                let payload = unsafe {
                    std::slice::from_raw_parts(
                        base.add(off + LEN_WORD),
                        l.min(SLOT - off - LEN_WORD),
                    )
                };
                sum = sum.wrapping_add(touch(payload));
                n += 1;
                off += frame;
            }
            h += 1;
            // SYNC POINT: pairs with the writer's Acquire load of `head`.
            head.store(h, Ordering::Release);
        }
    }
    Ok((n, sum, start.map(|s| s.elapsed().as_nanos()).unwrap_or(1)))
}
