//! What every benchmark group shares: spawning and finishing the measuring child processes
//! (each a hidden `__bench-role` subcommand of this binary, see `roles`, but for the raw ring,
//! a binary of its own beside this one: `companion`), passing descriptors
//! to them, pinning to a CPU, timing rounds, reading their reports, and naming the machine.
//! Every group depends on it; the groups never refer back to `bench`, and only `netem` to
//! another group (`remote`'s readers).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Instant;

use shmflow::Geometry;

use super::roles::Role;

pub(crate) const RTT_G: Geometry = Geometry {
    segment_size: 4096,
    segment_count: 4,
};

pub(crate) const REC: usize = 64;

/// Spawns this binary as the peer `role`, its stdout piped (its report), with the descriptors
/// `fds` left open across exec and named by the environment variables beside them; `setup`
/// adjusts the command before it is spawned.
/// A peer that cannot be started ends the bench with the reason and exit code 1, as a peer
/// that fails does ([`finished`]).
pub(crate) fn child(role: &Role, fds: &[(&str, RawFd)], setup: impl FnOnce(&mut Command)) -> Child {
    let exe = std::env::current_exe()
        .unwrap_or_else(|e| cannot_start(role, format!("this program's own path is unknown: {e}")));
    let mut cmd = Command::new(exe);
    cmd.arg("__bench-role")
        .args(role.to_args())
        .stdout(Stdio::piped());
    let raw: Vec<RawFd> = fds.iter().map(|f| f.1).collect();
    for (var, fd) in fds {
        cmd.env(var, fd.to_string());
    }
    // SAFETY: only fcntl between fork and exec (async-signal-safe); the fds stay open in the
    // parent until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            for &fd in &raw {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    setup(&mut cmd);
    let c = cmd
        .spawn()
        .unwrap_or_else(|e| cannot_start(role, e.to_string()));
    left().peers.push(c.id());
    c
}

/// The raw ring's binary, beside this one (see `floors::floor_stream`).
pub(crate) const RAW_RING: &str = "shmflow-raw-ring";

/// Starts `name`, a binary of this package installed beside this one, with `args`, its
/// standard output piped: a measuring peer as [`child`] starts them.
pub(crate) fn companion(name: &str, args: &[String]) -> Child {
    let exe = std::env::current_exe()
        .map(|e| e.with_file_name(name))
        .unwrap_or_else(|e| fail(&format!("this program's own path is unknown: {e}")));
    let c = Command::new(&exe)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            fail(&format!(
                "{} could not be started: {e} (it is built and installed with this program: \
                 `cargo build --release -p shmflow-cli`, `cargo install --path cli`)",
                exe.display()
            ))
        });
    left().peers.push(c.id());
    c
}

fn cannot_start(role: &Role, why: String) -> ! {
    fail(&format!(
        "the measuring peer process ({}) could not be started: {why}",
        role.to_args()[0]
    ))
}

/// What a bench that ends on a failure leaves undone: the measuring peers started and not
/// waited for yet (their process ids: ours until waited for, so never another process's),
/// and the commands that undo what the bench set up (the network namespaces of `netem`).
struct Left {
    peers: Vec<u32>,
    undo: Vec<Vec<String>>,
}

static LEFT: Mutex<Left> = Mutex::new(Left {
    peers: Vec::new(),
    undo: Vec::new(),
});

fn left() -> std::sync::MutexGuard<'static, Left> {
    LEFT.lock().unwrap_or_else(|e| e.into_inner())
}

/// `cmd` undoes what the bench just set up: [`fail`] runs it if the bench ends on a failure
/// before [`done_undo`] says it ran.
pub(crate) fn undo_on_failure(cmd: &[&str]) {
    left()
        .undo
        .push(cmd.iter().map(|s| s.to_string()).collect());
}

/// `cmd`, given to [`undo_on_failure`], ran.
pub(crate) fn done_undo(cmd: &[&str]) {
    let mut l = left();
    if let Some(i) = l.undo.iter().position(|u| u.iter().eq(cmd.iter())) {
        l.undo.remove(i);
    }
}

/// Ends the bench on a failure (the built-in groups' trials have no error path): prints
/// `why`, kills the measuring peers still running (a peer that spins or waits on a futex
/// would not notice this process leave), undoes what was set up, and exits with code 1.
pub(crate) fn fail(why: &str) -> ! {
    eprintln!("shmflow bench: {why}");
    let Left { peers, undo } = std::mem::replace(
        &mut *left(),
        Left {
            peers: Vec::new(),
            undo: Vec::new(),
        },
    );
    for pid in peers {
        // SAFETY: kill and waitpid on a child of this process that was not waited for (so
        // its id is still its own, at worst a zombie's).
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
            libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0);
        }
    }
    for cmd in undo.iter().rev() {
        let _ = Command::new(&cmd[0]).args(&cmd[1..]).status();
    }
    std::process::exit(1)
}

/// Makes a panic anywhere in this process (a trial's `unwrap`, in any thread) end the bench
/// as [`fail`] does, after the panic's own report: the measuring peers are killed and the set-up
/// is undone, where unwinding would leave peers spinning and namespaces behind.
pub(crate) fn fail_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        fail("a trial panicked (above); its peers are stopped");
    }));
}

/// Pins the child to CPU 0 (before it execs), as `pin(0)` pins this thread.
pub(crate) fn pin_cpu0() -> impl FnOnce(&mut Command) {
    |cmd: &mut Command| {
        let set = one_cpu(0);
        // SAFETY: only sched_setaffinity between fork and exec (a plain system call,
        // async-signal-safe); `set` is moved into the closure.
        unsafe {
            cmd.pre_exec(move || {
                let _ = set_affinity(&set);
                Ok(())
            });
        }
    }
}

/// Pins the calling thread to `cpu` (below `CPU_SETSIZE`), if it may run there.
pub(crate) fn pin(cpu: usize) {
    let _ = set_affinity(&one_cpu(cpu));
}

/// The set of the one CPU `cpu` (below `CPU_SETSIZE`).
pub(crate) fn one_cpu(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: `cpu_set_t` is a plain bit array: all zeros is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the caller keeps `cpu` below CPU_SETSIZE, the set's number of bits.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    set
}

/// Sets the calling thread's affinity to `set` (a plain system call: callable between fork
/// and exec).
pub(crate) fn set_affinity(set: &libc::cpu_set_t) -> std::io::Result<()> {
    // SAFETY: `set` is a valid `cpu_set_t` of the size given; 0 is the calling thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Lets the calling thread run on every CPU again.
pub(crate) fn unpin() {
    // SAFETY: as in `pin`, with every CPU.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in 0..libc::CPU_SETSIZE as usize {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The descriptor the parent passed in the environment variable `var`, now ours.
pub(crate) fn env_fd(var: &str) -> OwnedFd {
    let fd: RawFd = std::env::var(var).expect(var).parse().expect(var);
    // SAFETY: the parent passed this descriptor for us to own.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Waits for a measuring peer and returns its report (its stdout). A peer that failed has
/// printed its own message on the shared stderr; this says that it failed and how it ended.
pub(crate) fn finish(c: Child) -> Result<String, String> {
    let id = c.id();
    let out = c.wait_with_output();
    left().peers.retain(|&p| p != id);
    let out = out.map_err(|e| format!("waiting for the measuring peer process: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the measuring peer process failed ({}); its own message, if any, is above",
            out.status
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// [`finish`] for the built-in groups, whose trials have no error path: a failed peer ends
/// the whole bench with its message and exit code 1.
pub(crate) fn finished(c: Child) -> String {
    finish(c).unwrap_or_else(|e| fail(&e))
}

/// Times `rounds` round trips after a warm-up of a tenth; returns sorted nanoseconds.
pub(crate) fn time_rounds(rounds: usize, mut once: impl FnMut(u64)) -> Vec<u64> {
    for i in 0..(rounds / 10).max(1000) {
        once(i as u64);
    }
    let mut v = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let t = Instant::now();
        once(i as u64);
        v.push(t.elapsed().as_nanos() as u64);
    }
    v.sort_unstable();
    v
}

pub(crate) trait RawFdOf {
    fn as_fd_raw(&self) -> RawFd;
}

impl RawFdOf for shmflow::PeerHandle {
    fn as_fd_raw(&self) -> RawFd {
        use std::os::fd::AsFd;
        self.as_fd().as_raw_fd()
    }
}

/// A peer that echoes what it reads from its end of a Unix socket pair: this end, and the peer.
pub(crate) fn uds_echo_child() -> (UnixStream, Child) {
    let (mine, theirs) = UnixStream::pair().unwrap();
    let c = child(
        &Role::EchoFd,
        &[("IN", theirs.as_raw_fd()), ("OUT", theirs.as_raw_fd())],
        |_| {},
    );
    (mine, c)
}

pub(crate) fn pipe_pair() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: valid out-array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: fresh descriptors.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

pub(crate) fn parse_report(s: &str) -> (f64, f64) {
    let mut it = s.split_whitespace().map(|x| x.parse::<f64>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

/// Records a sending loop writes between two looks at the clock: about 512 KiB of them, as the
/// raw ring's loop writes between its looks (8 slots of 64 KiB), and at least 64. A look costs
/// tens of nanoseconds (`clock_gettime`), as much as a few dozen 64 B records take: looking
/// every 64 records would charge the transport a cost the floor does not pay.
pub(crate) fn records_per_look(len: usize) -> usize {
    ((512 * 1024) / len.max(1)).clamp(64, 8192)
}

/// Sends `n` copies of `rec` as batches of up to 64 records (`claim_batch`, each record copied
/// into its place, one commit a batch): the sending loop of the tuned streams of small records.
#[inline(always)]
pub(crate) fn send_batched(p: &mut shmflow::Producer, rec: &[u8], n: usize) {
    let mut sent = 0;
    while sent < n {
        let mut batch = p.claim_batch(rec.len(), (n - sent).min(64)).unwrap();
        for r in batch.iter_mut() {
            r.copy_from_slice(rec);
        }
        sent += batch.len();
        batch.commit();
    }
}

/// A 64 B record of 0x5A bytes on a cache line of its own, for the sending loops that copy one
/// record again and again: where a record's source starts within a line changes what each copy
/// costs (a load that crosses a line), so every loop, the floor's too, copies from the same
/// place in a line, whatever the heap or the stack frame of the build put before it.
#[repr(C, align(64))]
pub(crate) struct LineRec(pub(crate) [u8; REC]);

impl LineRec {
    pub(crate) fn new() -> LineRec {
        LineRec([0x5A; REC])
    }
}

pub(crate) use super::bytes::{touch, LineBuf};

pub(crate) fn machine() -> (String, usize, String) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    // SAFETY: zeroed utsname is a valid out-buffer.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    unsafe { libc::uname(&mut u) };
    // SAFETY: uname NUL-terminates its fields.
    let kernel = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    (cpu, cores, kernel)
}
