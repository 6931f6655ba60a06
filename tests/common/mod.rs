//! Shared helpers of the integration tests: re-executing the test binary as a child process,
//! and records that carry their own sequence number and checksum.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shmflow::PeerHandle;

/// Environment variable that tells a re-executed test binary which role to play.
pub(crate) const ROLE: &str = "SHMFLOW_TEST_ROLE";
/// Environment variable carrying an inherited region descriptor.
pub(crate) const FD_VAR: &str = "SHMFLOW_TEST_FD";

/// The role this process plays, if it is a child.
pub(crate) fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// Runs `test` of this test binary again as a child process playing `role`.
pub(crate) fn spawn(
    test: &str,
    role: &str,
    env: &[(&str, String)],
    handle: Option<&PeerHandle>,
) -> Child {
    spawn_with_stdin(test, role, env, handle, Stdio::null())
}

/// For a test that forks: runs `test` again in a process of its own, as `as_role`, so that
/// the fork copies no thread of the harness. True in that process (run the test's body);
/// false in the harness's, once that process succeeded.
pub(crate) fn in_a_process_of_its_own(test: &str, as_role: &str) -> bool {
    if role().as_deref() == Some(as_role) {
        return true;
    }
    let status = spawn(test, as_role, &[], None).wait().unwrap();
    assert!(status.success(), "the child failed: {status}");
    false
}

/// As [`spawn`], with the child's stdin given (a pipe lets the parent pace the child).
pub(crate) fn spawn_with_stdin(
    test: &str,
    role: &str,
    env: &[(&str, String)],
    handle: Option<&PeerHandle>,
    stdin: Stdio,
) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        test,
        "--nocapture",
        "--test-threads=1",
        "--include-ignored",
    ])
    .env(ROLE, role)
    .stdin(stdin);
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some(h) = handle {
        h.pass_to(&mut cmd, FD_VAR);
    }
    cmd.spawn().expect("spawning a child test process")
}

/// As [`spawn`], handing the child several regions, each in its own variable.
pub(crate) fn spawn_with_handles(test: &str, role: &str, handles: &[(&str, &PeerHandle)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .stdin(Stdio::null());
    for (var, h) in handles {
        h.pass_to(&mut cmd, var);
    }
    cmd.spawn().expect("spawning a child test process")
}

/// As [`spawn`], with the child's output discarded: for a child that fails on purpose (its
/// test harness would print a failure that is the point of the test).
pub(crate) fn spawn_quiet(test: &str, role: &str, handle: Option<&PeerHandle>) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(h) = handle {
        h.pass_to(&mut cmd, FD_VAR);
    }
    cmd.spawn().expect("spawning a child test process")
}

/// Waits for a child and asserts it succeeded.
pub(crate) fn expect_success(mut child: Child, what: &str) {
    let status = child.wait().unwrap();
    assert!(status.success(), "{what} child failed: {status}");
}

/// In a child: runs `body`, exiting 0 on success and 1 (after printing) on failure, so that
/// the child never falls through into the rest of the test harness.
pub(crate) fn child_main(body: impl FnOnce() -> Result<(), String>) -> ! {
    match body() {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("child failed: {e}");
            std::process::exit(1)
        }
    }
}

/// xorshift64*: small, fast, deterministic.
#[derive(Clone)]
pub(crate) struct Rng(pub u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
}

/// A 64-bit checksum (multiply-xor over words), good enough to catch torn or shifted data.
pub(crate) fn checksum(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325 ^ bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().unwrap());
        h = (h ^ w).wrapping_mul(0x0000_0100_0000_01B3).rotate_left(29);
    }
    for &b in chunks.remainder() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

/// Fills `out` with record `seq` of `len` bytes: `[seq][checksum of the rest][random…]` when
/// it is at least 16 bytes, else bytes derived from `seq` alone.
pub(crate) fn make_record(seq: u64, len: usize, out: &mut Vec<u8>) {
    out.clear();
    out.resize(len, 0);
    let mut rng = Rng::new(seq ^ 0xA5A5);
    let mut words = out.chunks_exact_mut(8);
    for w in &mut words {
        w.copy_from_slice(&rng.next().to_le_bytes());
    }
    let tail = rng.next().to_le_bytes();
    let rem = words.into_remainder();
    let n = rem.len();
    rem.copy_from_slice(&tail[..n]);
    if len >= 16 {
        out[..8].copy_from_slice(&seq.to_le_bytes());
        let sum = checksum(&out[16..]);
        out[8..16].copy_from_slice(&sum.to_le_bytes());
    }
}

/// Checks record `seq` of expected length `len`.
pub(crate) fn check_record(
    seq: u64,
    len: usize,
    got: &[u8],
    scratch: &mut Vec<u8>,
) -> Result<(), String> {
    if got.len() != len {
        return Err(format!(
            "record {seq}: length {} instead of {len}",
            got.len()
        ));
    }
    if len >= 16 {
        let s = u64::from_le_bytes(got[..8].try_into().unwrap());
        if s != seq {
            return Err(format!("record {seq}: carries sequence number {s}"));
        }
        let sum = u64::from_le_bytes(got[8..16].try_into().unwrap());
        if sum != checksum(&got[16..]) {
            return Err(format!("record {seq}: checksum mismatch"));
        }
        return Ok(());
    }
    make_record(seq, len, scratch);
    if got != &scratch[..] {
        return Err(format!("record {seq}: bytes differ"));
    }
    Ok(())
}

/// A region name unique to this process and `tag`.
pub(crate) fn unique_name(tag: &str) -> String {
    format!("/shmflow-test-{}-{tag}", std::process::id())
}

/// Pins the calling thread (and children spawned after) to one CPU.
pub(crate) fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes within it; sched_setaffinity(0)
    // applies to the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

/// A number from the environment, or `default`.
pub(crate) fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Waits (up to 10 s) until a child has attached its end, as `attached` reports.
pub(crate) fn wait_attached(attached: impl Fn() -> bool) {
    wait_for("the peer to attach", attached);
}

/// Looks at `cond` until it holds (a state another thread or process reaches: a peer
/// attached, a peer waiting), failing the test after 10 s.
pub(crate) fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "waited 10 s for {what}"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// The bytes of a live, freshly made channel region (4 KiB × 2 segments, its producer
/// attached): for tests that need a valid region image in an object shmflow did not make.
pub(crate) fn region_image() -> Vec<u8> {
    use std::io::Read;
    use std::os::fd::AsFd;
    let (_tx, handle) = shmflow::Producer::create_anonymous(shmflow::Geometry {
        segment_size: 4096,
        segment_count: 2,
    })
    .unwrap();
    let mut image = Vec::new();
    let mut f = std::fs::File::from(handle.as_fd().try_clone_to_owned().unwrap());
    f.read_to_end(&mut image).unwrap();
    image
}

/// A second, writable shared mapping of the named region, for tests that corrupt it while its
/// ends use it: that is the attack under test.
pub(crate) fn map_region_mut(name: &str) -> memmap2::MmapMut {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/dev/shm{name}"))
        .unwrap();
    // SAFETY: a shared mapping of a region that other mappings (the ends') also write. The
    // caller only writes through it with plain byte stores and never reads it as Rust data
    // other than bytes; the ends validate everything they read from shared memory.
    unsafe { memmap2::MmapMut::map_mut(&file).unwrap() }
}

/// What a slow reader with a debloating target saw of its cap (see [`read_slowly_under_a_cap`]).
#[derive(Debug)]
pub(crate) struct CapSeen {
    /// The cap it settled on, in segments.
    pub(crate) cap: u64,
    /// The most segments in flight or credited while the cap stood.
    pub(crate) worst: u64,
    /// Looks taken while the cap stood.
    pub(crate) samples: u64,
    /// Records read.
    pub(crate) read: u64,
}

/// Reads records of 1000 bytes of 7 for 2.5 s at about 2 MB/s (500 µs of work each): after
/// each, looks at the consumer's cap and, once 1.5 s have passed and as long as the cap stands,
/// at what is in flight or credited (segments in flight plus the link's unspent credit).
pub(crate) fn read_slowly_under_a_cap(rx: &mut shmflow::Consumer) -> CapSeen {
    let start = Instant::now();
    let (mut worst, mut cap, mut samples, mut read) = (0, 0, 0, 0);
    while start.elapsed() < Duration::from_millis(2500) {
        let r = rx.recv().unwrap().expect("the writer streams");
        assert_eq!(r.as_bytes().unwrap(), &[7u8; 1000][..]);
        drop(r);
        read += 1;
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(500) {
            std::hint::spin_loop();
        }
        let m = rx.metrics();
        let credit = m.link.map_or(0, |l| l.credit);
        if start.elapsed() > Duration::from_millis(1500) && m.segment_cap == cap {
            worst = worst.max(m.segments_in_flight + credit);
            samples += 1;
        }
        if m.segment_cap != cap {
            (cap, worst, samples) = (m.segment_cap, 0, 0);
        }
    }
    CapSeen {
        cap,
        worst,
        samples,
        read,
    }
}

/// The cap held across the link: it settled at 2 to 4 segments (a 10 ms target at about
/// 2 MB/s of 16 KiB segments), was looked at often, and never more than it (two segments of
/// slack: the credit figure is published at the announcement, which may come after two
/// buffers are written) was in flight or credited.
pub(crate) fn assert_cap_held(seen: &CapSeen, what: &str) {
    println!("{what}: {seen:?}");
    assert!((2..=4).contains(&seen.cap), "{what}: {seen:?}");
    assert!(seen.samples > 100, "{what}: {seen:?}");
    assert!(seen.worst <= seen.cap + 2, "{what}: {seen:?}");
}

/// Fails a test that needs root when it runs as another user: such tests are `#[ignore]`d
/// with the reason, and CI runs them as root (`--ignored`).
pub(crate) fn require_root(why: &str) {
    // SAFETY: geteuid(2) has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test needs root ({why}); run it as root, as CI does with --ignored"
    );
}

/// Waits for the forked child `pid` up to `bound`, killing it if it has not ended by then;
/// its wait status, or `None` if it had to be killed.
pub(crate) fn wait_forked(pid: libc::pid_t, bound: Duration) -> Option<i32> {
    let deadline = Instant::now() + bound;
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer; WNOHANG returns at once.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(status);
        }
        assert!(r == 0, "waitpid: {}", std::io::Error::last_os_error());
        if Instant::now() > deadline {
            // SAFETY: kills and reaps the child made by the caller.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
