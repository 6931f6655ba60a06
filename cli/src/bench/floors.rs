//! The hardware floors `shmflow bench` holds shmflow against, and their peers: a round trip
//! on one shared word, busy-polled (`floor_spin_*`) or through the futex (`floor_futex_*`),
//! and a raw ring of 64 KiB slots in shared memory, busy-polled on both sides
//! (`floor_small_rps`, `floor_bulk_gbps`; both its sides run in `shmflow-raw-ring`, a binary
//! of its own: `src/bin/shmflow-raw-ring.rs`). No protocol, no checks: what moving the bytes
//! costs.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Child;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};

use super::bytes::RING_SOURCES;
use super::harness::{
    child, companion, env_fd, fail, finish, finished, parse_report, pin, pin_cpu0, time_rounds,
    unpin, RAW_RING,
};
use super::roles::Role;
use super::Cfg;

/// A shared mapping of `len` bytes of a memfd, and the memfd (which the peer maps too). The
/// mapping is raw (`MmapRaw`: pointers, never references to its bytes), as both processes
/// write it.
struct Raw {
    fd: File,
    map: MmapRaw,
}

impl Raw {
    /// A new memfd of `len` bytes, mapped.
    fn new(len: usize) -> Raw {
        // SAFETY: memfd_create with a valid name; checked.
        let fd = unsafe { libc::memfd_create(c"shmflow-bench".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let file = File::from(fd);
        file.set_len(len as u64).expect("sizing the memfd");
        Raw::map(file.into(), len)
    }

    /// Maps the first `len` bytes of `fd`, shared, read-write, its pages faulted in at once
    /// (`MAP_POPULATE`) so that no measure pays for them.
    fn map(fd: OwnedFd, len: usize) -> Raw {
        let fd = File::from(fd);
        let map = MmapOptions::new()
            .len(len)
            .populate()
            .map_raw(&fd)
            .expect("mapping the shared memory");
        Raw { fd, map }
    }

    /// The start of the mapping.
    fn ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(off + 8 <= self.map.len() && off.is_multiple_of(8));
        // SAFETY: in bounds, aligned, and only ever accessed atomically by both processes.
        unsafe { &*(self.ptr().add(off) as *const AtomicU64) }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(off + 4 <= self.map.len() && off.is_multiple_of(4));
        // SAFETY: as for `u64_at`.
        unsafe { &*(self.ptr().add(off) as *const AtomicU32) }
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

// ----- round trips -----------------------------------------------------------------------------

/// Round trips on one shared word, busy-polled on both sides (sorted nanoseconds).
pub(super) fn floor_spin(cfg: &Cfg) -> Vec<u64> {
    let raw = Raw::new(4096);
    let c = child(&Role::SpinFloor, &[("RAW", raw.fd.as_raw_fd())], |_| {});
    let w = raw.u64_at(0);
    let v = time_rounds(cfg.rounds, |_| {
        let x = w.load(Ordering::Acquire);
        w.store(x + 1, Ordering::Release);
        while w.load(Ordering::Acquire) != x + 2 {
            std::hint::spin_loop();
        }
    });
    w.store(u64::MAX, Ordering::Release);
    finished(c);
    v
}

/// The peer of [`floor_spin`]: answers each odd value of the word with the next one.
pub(super) fn spin_floor_peer() {
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

/// Round trips on one shared word, each side sleeping on the futex until the other wakes it
/// (sorted nanoseconds); `same_cpu`: both processes pinned to CPU 0.
pub(super) fn floor_futex(cfg: &Cfg, same_cpu: bool) -> Vec<u64> {
    let raw = Raw::new(4096);
    if same_cpu {
        pin(0);
    }
    let c = child(&Role::FutexFloor, &[("RAW", raw.fd.as_raw_fd())], |cmd| {
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
    finished(c);
    if same_cpu {
        unpin();
    }
    v
}

/// The peer of [`floor_futex`]: answers 1 with 2 and a wake-up, ends on 3.
pub(super) fn futex_floor_peer() {
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

/// The floor of `bench --case`: its round trip of `len` bytes on raw shared memory between
/// two processes, both spinning. A shared word (offset 0) says whose turn it is: odd, the
/// sender has written slot A (offset 64); even again, the peer has copied A out and its copy
/// back into slot B. No protocol, no checks, no waiting strategy: what the hardware (and the
/// host) allows a round trip of the case at its rate.
pub(super) struct SpinEcho {
    raw: Raw,
    child: Child,
    len: usize,
}

/// Slot A's offset; slot B follows it, line-aligned.
const ECHO_A: usize = 64;

fn echo_b(len: usize) -> usize {
    ECHO_A + len.next_multiple_of(64)
}

fn echo_map_len(len: usize) -> usize {
    (echo_b(len) + len.next_multiple_of(64)).next_multiple_of(4096)
}

/// Spins of a waiting side between two looks at whether its peer is still there.
const LOOK_EVERY: u32 = 1 << 14;

/// How long the sender waits for the floor's peer to answer before it gives up on it (a peer
/// stopped, or starved of CPU for good).
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// The environment variable that tells the floor's peer the process id of the process that
/// started it (the peer ends when its parent is another: that one is gone).
const PARENT: &str = "SHMFLOW_BENCH_PARENT";

impl SpinEcho {
    /// The shared memory and the peer process (`Role::CaseFloor`); `setup` adds to the
    /// peer's command (a pin to a CPU).
    pub(super) fn start(len: usize, setup: impl FnOnce(&mut std::process::Command)) -> SpinEcho {
        let raw = Raw::new(echo_map_len(len));
        let child = child(
            &Role::CaseFloor { len },
            &[("RAW", raw.fd.as_raw_fd())],
            |cmd| {
                cmd.env(PARENT, std::process::id().to_string());
                setup(cmd);
            },
        );
        SpinEcho { raw, child, len }
    }

    /// One round trip: `msg` (of the `len` given to `start`) out through slot A, the peer's
    /// copy back into `msg` from slot B. An error if the peer process ended meanwhile.
    pub(super) fn round(&mut self, msg: &mut [u8]) -> Result<(), String> {
        assert_eq!(msg.len(), self.len);
        let w = self.raw.u64_at(0);
        // Only this side moves the word from even to odd: it is even here.
        let x = w.load(Ordering::Relaxed);
        // SAFETY: slot A lies within the mapping (`echo_map_len`); the peer reads it only
        // after the Release store below, and has finished reading it before its own Release
        // store of an even value, which the Acquire load of the last round saw.
        unsafe {
            std::ptr::copy_nonoverlapping(msg.as_ptr(), self.raw.ptr().add(ECHO_A), self.len)
        };
        // SYNC POINT: pairs with the peer's Acquire load in `case_floor_peer`.
        w.store(x + 1, Ordering::Release);
        let mut spins = 0u32;
        let mut since: Option<Instant> = None;
        // SYNC POINT: pairs with the peer's Release store of x + 2 after its copy into B.
        while w.load(Ordering::Acquire) != x + 2 {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(LOOK_EVERY) {
                if let Ok(Some(status)) = self.child.try_wait() {
                    return Err(format!("the floor's peer process ended ({status})"));
                }
                if since.get_or_insert_with(Instant::now).elapsed() > ANSWER_WITHIN
                    && w.load(Ordering::Acquire) != x + 2
                {
                    // Stopped, or starved for good: ended here, so that `end` can wait for it.
                    let _ = self.child.kill();
                    return Err(format!(
                        "the floor's peer process did not answer within {} s",
                        ANSWER_WITHIN.as_secs()
                    ));
                }
            }
        }
        // SAFETY: slot B lies within the mapping; the peer wrote it before its Release store
        // of x + 2 (seen above) and writes it again only after the next odd value.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.raw.ptr().add(echo_b(self.len)),
                msg.as_mut_ptr(),
                self.len,
            )
        };
        Ok(())
    }

    /// Tells the peer to end and waits for it.
    pub(super) fn end(self) -> Result<(), String> {
        self.raw.u64_at(0).store(u64::MAX, Ordering::Release);
        finish(self.child).map(drop)
    }
}

/// The peer of [`SpinEcho`]: copies slot A out and back into slot B for each odd value of
/// the word, spinning; ends on `u64::MAX`, or when the process that started it is gone.
pub(super) fn case_floor_peer(len: usize) {
    let raw = Raw::map(env_fd("RAW"), echo_map_len(len));
    let w = raw.u64_at(0);
    // The process that started us, as it said (a parent gone before this line would
    // otherwise leave us the reaper's).
    let parent: Option<u32> = std::env::var(PARENT).ok().and_then(|p| p.parse().ok());
    let mut buf = vec![0u8; len];
    let mut spins = 0u32;
    loop {
        // SYNC POINT: pairs with the sender's Release stores in `SpinEcho::round` and `end`.
        let x = w.load(Ordering::Acquire);
        if x == u64::MAX {
            break;
        }
        if x % 2 == 1 {
            // SAFETY: both slots lie within the mapping; the sender wrote A before its
            // Release store of x (seen above) and touches neither slot again until it sees
            // x + 1 stored below.
            unsafe {
                std::ptr::copy_nonoverlapping(raw.ptr().add(ECHO_A), buf.as_mut_ptr(), len);
                std::ptr::copy_nonoverlapping(buf.as_ptr(), raw.ptr().add(echo_b(len)), len);
            }
            // SYNC POINT: pairs with the sender's Acquire load in `SpinEcho::round`.
            w.store(x + 1, Ordering::Release);
            continue;
        }
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(LOOK_EVERY) && Some(std::os::unix::process::parent_id()) != parent {
            break;
        }
    }
}

// ----- throughput ------------------------------------------------------------------------------

/// Records of `len` bytes through the raw ring (`shmflow-raw-ring`, a binary of its own) of
/// `pool` bytes for `cfg.secs`: (records, nanoseconds) as its reading side counted them.
pub(super) fn floor_stream(cfg: &Cfg, pool: usize, len: usize) -> (f64, f64) {
    static SAME_SOURCES: std::sync::Once = std::sync::Once::new();
    SAME_SOURCES.call_once(|| {
        let theirs = finished(companion(RAW_RING, &["source".to_string()]));
        let ours = format!("{RING_SOURCES:016x}");
        if theirs.trim() != ours {
            fail(&format!(
                "the {RAW_RING} beside this program was built from other sources (its \
                 fingerprint {:?}, this program's {ours}): build both with `cargo build \
                 --release -p shmflow-cli`",
                theirs.trim()
            ));
        }
    });
    let c = companion(
        RAW_RING,
        &[
            "stream".to_string(),
            pool.to_string(),
            len.to_string(),
            cfg.secs.to_string(),
        ],
    );
    parse_report(&finished(c))
}
