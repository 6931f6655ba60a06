//! timely clusters over shmflow across real processes: a word count on 1, 2 and 4 processes of
//! one host gives the counts of the text, and a killed process ends the others with an error.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use timely::dataflow::operators::{Exchange, Inspect, Probe, ToStream};
use timely::dataflow::ProbeHandle;

/// What a test process is (unset in the test itself).
const ROLE: &str = "SHMFLOW_TIMELY_TEST_ROLE";
/// A process's timely arguments, separated by spaces.
const ARGS: &str = "SHMFLOW_TIMELY_TEST_ARGS";
/// Every process of a test ends within this, or the test fails.
const BOUND: Duration = Duration::from_secs(60);

/// The text: line `i` of `LINES`.
const LINES: u64 = 20_000;
fn line(i: u64) -> String {
    let words = [
        "apple", "pear", "fig", "plum", "kiwi", "lime", "date", "yuzu",
    ];
    (0..(i % 7 + 1))
        .map(|k| format!("{}{}", words[((i * 31 + k * 7) % 8) as usize], (i + k) % 50))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The counts the whole text gives.
fn expected() -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for i in 0..LINES {
        for w in line(i).split(' ') {
            *m.entry(w.to_string()).or_insert(0) += 1;
        }
    }
    m
}

fn hash(w: &str) -> u64 {
    // FNV-1a: the same in every process.
    w.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// A process of the cluster: counts the words of its workers' share of the lines, exchanged
/// by word, and prints each worker's counts as `WC word count` lines.
fn word_count_process() {
    let args: Vec<String> = std::env::var(ARGS)
        .unwrap()
        .split(' ')
        .map(String::from)
        .collect();
    let stall = std::env::var("SHMFLOW_TIMELY_TEST_STALL").is_ok();
    let guards = shmflow_timely::execute_from_args(
        std::iter::once("word-count".to_string()).chain(args),
        move |worker| {
            let (index, peers) = (worker.index() as u64, worker.peers() as u64);
            let counts = std::rc::Rc::new(std::cell::RefCell::new(BTreeMap::<String, u64>::new()));
            let c = counts.clone();
            let probe = ProbeHandle::new();
            worker.dataflow::<u64, _, _>(|scope| {
                (0..LINES)
                    .filter(move |i| i % peers == index)
                    .flat_map(|i| line(i).split(' ').map(String::from).collect::<Vec<_>>())
                    .to_stream(scope)
                    .container::<Vec<String>>()
                    .exchange(|w: &String| hash(w))
                    .inspect(move |w: &String| {
                        *c.borrow_mut().entry(w.clone()).or_insert(0) += 1;
                    })
                    .probe_with(&probe);
            });
            if stall {
                // Stands still, holding its links, until it is killed.
                println!("STALLING");
                std::thread::sleep(Duration::from_secs(600));
            }
            while !probe.done() {
                worker.step();
            }
            let m = counts.borrow().clone();
            m
        },
    )
    .expect("the cluster starts");
    let mut failed = false;
    for r in guards.join() {
        match r {
            Ok(m) => {
                for (w, c) in m {
                    println!("WC {w} {c}");
                }
            }
            Err(e) => {
                eprintln!("a worker failed: {e}");
                failed = true;
            }
        }
    }
    std::process::exit(if failed { 1 } else { 0 });
}

/// Addresses for `n` processes of this host, from port `offset` on in a range of this test
/// run's own (their abstract Unix names are what the processes of one host bind).
fn addresses(n: usize, offset: u16) -> Vec<String> {
    let base = 20_000 + (std::process::id() % 20_000) as u16;
    (0..n)
        .map(|i| format!("127.0.0.1:{}", base + offset + i as u16))
        .collect()
}

/// Starts process `p` of `n` with `workers` worker threads each, reporting its links.
fn spawn(
    test: &str,
    hostfile: &std::path::Path,
    n: usize,
    p: usize,
    workers: usize,
    env: &[(&str, &str)],
) -> Child {
    spawn_in(None, test, hostfile, n, p, workers, env)
}

/// As [`spawn`], in network namespace `ns` if given.
fn spawn_in(
    ns: Option<&str>,
    test: &str,
    hostfile: &std::path::Path,
    n: usize,
    p: usize,
    workers: usize,
    env: &[(&str, &str)],
) -> Child {
    let args = format!("-w {workers} -n {n} -p {p} -r -h {}", hostfile.display());
    let exe = std::env::current_exe().unwrap();
    let mut c = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    c.args([
        "--exact",
        test,
        "--nocapture",
        "--test-threads=1",
        "--include-ignored",
    ])
    .env(ROLE, "process")
    .env(ARGS, args)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

/// Waits for `child` up to the deadline; its exit status and output, or `None` if it did not
/// end (it is killed then).
fn wait_bounded(child: &mut Child, deadline: Instant) -> Option<(bool, String, String)> {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = std::io::read_to_string(child.stdout.take().unwrap()).unwrap();
            let err = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
            return Some((status.success(), out, err));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The processes of a cluster, killed when dropped, so that a failed assertion leaves none
/// of them running.
struct Cluster(Vec<Child>);

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Adds the `WC word count` lines of a process's output to `got`; each word is counted by one
/// worker only.
fn add_counts(out: &str, got: &mut BTreeMap<String, u64>) {
    // (The first may follow the test harness's "test … " on its line.)
    for l in out
        .lines()
        .filter_map(|l| l.split_once("WC ").map(|(_, l)| l))
    {
        let (w, c) = l.rsplit_once(' ').unwrap();
        let fresh = got
            .insert(w.to_string(), c.parse::<u64>().unwrap())
            .is_none();
        assert!(fresh, "{w} counted twice");
    }
}

fn hostfile(addresses: &[String], name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("shmflow-timely-{}-{name}", std::process::id()));
    std::fs::write(&path, addresses.join("\n") + "\n").unwrap();
    path
}

#[test]
fn a_word_count_on_one_two_and_four_processes_gives_the_texts_counts() {
    if std::env::var(ROLE).is_ok() {
        word_count_process();
    }
    let want = expected();
    for (n, workers) in [(1, 2), (2, 1), (4, 1), (2, 2)] {
        let addrs = addresses(n, 0);
        let file = hostfile(&addrs, &format!("wc-{n}-{workers}"));
        let mut children = Cluster(
            (0..n)
                .map(|p| {
                    spawn(
                        "a_word_count_on_one_two_and_four_processes_gives_the_texts_counts",
                        &file,
                        n,
                        p,
                        workers,
                        &[],
                    )
                })
                .collect(),
        );
        let deadline = Instant::now() + BOUND;
        let mut got = BTreeMap::new();
        for (p, c) in children.0.iter_mut().enumerate() {
            let (ok, out, err) = wait_bounded(c, deadline)
                .unwrap_or_else(|| panic!("process {p} of {n} did not end within {BOUND:?}"));
            assert!(ok, "process {p} of {n} failed: {err}");
            add_counts(&out, &mut got);
        }
        std::fs::remove_file(&file).unwrap();
        assert_eq!(got, want, "{n} processes of {workers} workers");
    }
}

#[test]
fn a_killed_process_ends_the_others_with_an_error() {
    if std::env::var(ROLE).is_ok() {
        word_count_process();
    }
    let test = "a_killed_process_ends_the_others_with_an_error";
    let shm_before = dev_shm();
    // Other addresses than the word count's, which may run at the same time.
    let addrs = addresses(3, 10);
    let file = hostfile(&addrs, "kill");
    let mut stalled = Cluster(vec![spawn(
        test,
        &file,
        3,
        2,
        1,
        &[("SHMFLOW_TIMELY_TEST_STALL", "1")],
    )]);
    let victim = &mut stalled.0[0];
    let mut others = Cluster((0..2).map(|p| spawn(test, &file, 3, p, 1, &[])).collect());
    // Once the victim stands still, the cluster is connected.
    let mut lines = BufReader::new(victim.stdout.take().unwrap()).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.contains("STALLING") => break,
            Some(Ok(_)) => {}
            other => panic!("the victim ended before it stalled: {other:?}"),
        }
    }
    // Its links live in anonymous memory (memfd), which a crash cannot leave behind, and in
    // nothing under /dev/shm.
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", victim.id())).unwrap();
    assert!(
        maps.lines().any(|l| l.contains("/memfd:shmflow")),
        "the victim maps no shmflow memfd region:\n{maps}"
    );
    assert!(
        !maps.contains("/dev/shm/"),
        "the victim maps a file of /dev/shm:\n{maps}"
    );
    victim.kill().unwrap();
    victim.wait().unwrap();
    let deadline = Instant::now() + BOUND;
    for (p, c) in others.0.iter_mut().enumerate() {
        let (ok, _, err) = wait_bounded(c, deadline)
            .unwrap_or_else(|| panic!("process {p} went on after its peer was killed"));
        assert!(
            !ok,
            "process {p} ended successfully after its peer was killed"
        );
        assert!(
            err.contains("timely communication error"),
            "process {p} failed otherwise: {err}"
        );
    }
    std::fs::remove_file(&file).unwrap();
    let left: Vec<_> = dev_shm().difference(&shm_before).cloned().collect();
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}

/// The names in /dev/shm that shmflow or this crate could have made (other programs of the
/// machine may come and go there meanwhile).
fn dev_shm() -> std::collections::BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .expect("/dev/shm can be listed")
        .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.contains("shmflow") || n.contains("timely"))
        .collect()
}
