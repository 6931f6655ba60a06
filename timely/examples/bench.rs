//! timely's exchange pattern and a ping-pong dataflow between processes of one host, over
//! shmflow, a Unix socket and TCP on loopback, side by side in one run; and the memory of a
//! fast sender facing a slow receiver.
//!
//! ```text
//! cargo run --release -p shmflow-timely --example bench -- [--runs 5] [--quick]
//! ```
//!
//! Each case starts fresh processes of this binary (`-n 2` or `-n 4`, one worker each); the
//! transports alternate within every run, and a figure is the median of the runs (with the
//! lowest and highest). CPU seconds are every process's user + system time (`getrusage`),
//! per GB of records that crossed between processes.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use timely::dataflow::operators::{
    vec::{Filter, Map},
    Concat, ConnectLoop, Exchange, Feedback, Input, Inspect, Probe, ToStream,
};
use timely::dataflow::{InputHandle, ProbeHandle};

const ROLE: &str = "SHMFLOW_TIMELY_BENCH_ROLE";

const USAGE: &str = "usage: bench [--runs N] [--quick]

timely's exchange pattern (2 and 4 processes) and a ping-pong dataflow over shmflow, a Unix
socket and TCP on loopback, alternating, N runs (default 5; --quick: 2 runs of a tenth of the
records); then the peak memory of a fast sender and a slow receiver over TCP and shmflow.";

fn usage(why: &str) -> ! {
    eprintln!("{why}\n{USAGE}");
    std::process::exit(2)
}
const TRANSPORTS: [&str; 3] = ["shm", "unix", "tcp"];

fn main() {
    if let Ok(case) = std::env::var(ROLE) {
        process(&case);
        return;
    }
    let mut quick = false;
    let mut runs = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--runs" => match args.next().and_then(|v| v.parse::<usize>().ok()) {
                Some(n) if n > 0 => runs = Some(n),
                _ => usage("--runs takes a number of runs, at least 1"),
            },
            "--help" | "-h" => {
                println!("{USAGE}");
                return;
            }
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    drive(runs.unwrap_or(if quick { 2 } else { 5 }), quick);
}

/// What one process reports.
#[derive(Default, Clone, Debug)]
struct Report {
    /// Records sent by this process's workers, and the seconds they took.
    records: u64,
    secs: f64,
    /// Round trips completed.
    trips: u64,
    cpu_secs: f64,
    peak_rss_kib: u64,
}

fn cpu_secs() -> f64 {
    // SAFETY: getrusage fills the struct it is given, which lives across the call.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|v| v.parse().unwrap_or(0)))
        })
        .unwrap_or(0)
}

fn env_u64(name: &str) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name}"))
}

/// A process of a case's cluster.
fn process(case: &str) {
    let args: Vec<String> = std::env::var("SHMFLOW_TIMELY_BENCH_ARGS")
        .unwrap()
        .split(' ')
        .map(String::from)
        .collect();
    let config = timely::Config::from_args(args.into_iter()).expect("timely options");
    let options = shmflow_timely::Options::from_env().expect("SHMFLOW_TIMELY_LOCAL");
    let guards = match case {
        "exchange" => {
            let (batch, rounds) = (env_u64("BATCH"), env_u64("ROUNDS"));
            shmflow_timely::execute(config, options, move |worker| {
                let mut input = InputHandle::new();
                let probe = worker.dataflow(|scope| {
                    scope
                        .input_from(&mut input)
                        .container::<Vec<u64>>()
                        .exchange(|&x: &u64| x)
                        .probe()
                        .0
                });
                let t = Instant::now();
                for round in 0..rounds {
                    for i in 0..batch {
                        input.send(i.wrapping_mul(0x9e3779b97f4a7c15));
                    }
                    input.advance_to(round + 1);
                    while probe.less_than(input.time()) {
                        worker.step_or_park(None);
                    }
                }
                Report {
                    records: batch * rounds,
                    secs: t.elapsed().as_secs_f64(),
                    ..Report::default()
                }
            })
        }
        "pingpong" => {
            let iterations = env_u64("ITERATIONS");
            shmflow_timely::execute(config, options, move |worker| {
                let (index, peers) = (worker.index(), worker.peers());
                let probe = ProbeHandle::new();
                worker.dataflow::<u64, _, _>(|scope| {
                    let (helper, cycle) = scope.feedback(1);
                    // One record; each trip around the loop moves it to the other process.
                    (0..1u64)
                        .filter(move |&i| (i as usize) % peers == index)
                        .to_stream(scope)
                        .container::<Vec<u64>>()
                        .concat(cycle)
                        .exchange(|&x: &u64| x)
                        .map_in_place(|x: &mut u64| *x += 1)
                        .filter(move |&x: &u64| x <= iterations)
                        .probe_with(&probe)
                        .connect_loop(helper);
                });
                let t = Instant::now();
                while !probe.done() {
                    worker.step_or_park(None);
                }
                Report {
                    trips: iterations / 2,
                    secs: t.elapsed().as_secs_f64(),
                    ..Report::default()
                }
            })
        }
        "backpressure" => {
            // Process 0's worker sends as fast as it can; process 1's worker, which receives
            // everything, takes 5 ms per batch.
            let (batch, rounds) = (env_u64("BATCH"), env_u64("ROUNDS"));
            shmflow_timely::execute(config, options, move |worker| {
                let index = worker.index();
                let mut input = InputHandle::new();
                let probe = worker.dataflow(|scope| {
                    scope
                        .input_from(&mut input)
                        .container::<Vec<u64>>()
                        .exchange(|_: &u64| 1)
                        .inspect_core(|event| {
                            if event.is_ok() {
                                std::thread::sleep(Duration::from_millis(5));
                            }
                        })
                        .probe()
                        .0
                });
                let t = Instant::now();
                if index == 0 {
                    for round in 0..rounds {
                        for i in 0..batch {
                            input.send(i);
                        }
                        input.advance_to(round + 1);
                        worker.step();
                    }
                }
                drop(input);
                while !probe.done() {
                    worker.step_or_park(None);
                }
                Report {
                    records: if index == 0 { batch * rounds } else { 0 },
                    secs: t.elapsed().as_secs_f64(),
                    ..Report::default()
                }
            })
        }
        other => panic!("unknown case {other}"),
    }
    .expect("the cluster starts");
    let mut total = Report::default();
    for r in guards.join() {
        let r = r.expect("a worker failed");
        total.records += r.records;
        total.trips += r.trips;
        total.secs = total.secs.max(r.secs);
    }
    println!(
        "\nREPORT {} {} {} {} {}",
        total.records,
        total.secs,
        total.trips,
        cpu_secs(),
        peak_rss_kib()
    );
}

/// Runs one case on `n` processes over `transport`; the reports of every process.
fn run(
    case: &str,
    transport: &str,
    n: usize,
    env: &[(&str, String)],
    port: &mut u16,
) -> Vec<Report> {
    let addrs: Vec<String> = (0..n)
        .map(|i| format!("127.0.0.1:{}", *port + i as u16))
        .collect();
    *port += n as u16;
    let hostfile =
        std::env::temp_dir().join(format!("shmflow-timely-bench-{}", std::process::id()));
    std::fs::write(&hostfile, addrs.join("\n") + "\n").unwrap();
    let children: Vec<_> = (0..n)
        .map(|p| {
            let mut c = Command::new(std::env::current_exe().unwrap());
            c.env(ROLE, case)
                .env("SHMFLOW_TIMELY_LOCAL", transport)
                .env(
                    "SHMFLOW_TIMELY_BENCH_ARGS",
                    format!("-w 1 -n {n} -p {p} -h {}", hostfile.display()),
                )
                .stdout(Stdio::piped());
            for (k, v) in env {
                c.env(k, v);
            }
            c.spawn().unwrap()
        })
        .collect();
    let reports = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "a {case} process over {transport} failed"
            );
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix("REPORT "))
                .expect("a report");
            let v: Vec<&str> = line.split(' ').collect();
            Report {
                records: v[0].parse().unwrap(),
                secs: v[1].parse().unwrap(),
                trips: v[2].parse().unwrap(),
                cpu_secs: v[3].parse().unwrap(),
                peak_rss_kib: v[4].parse().unwrap(),
            }
        })
        .collect();
    let _ = std::fs::remove_file(&hostfile);
    reports
}

fn median(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let m = if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
    };
    (m, s[0], s[s.len() - 1])
}

fn fmt((m, lo, hi): (f64, f64, f64)) -> String {
    format!("{m:.3} ({lo:.3}-{hi:.3})")
}

fn drive(runs: usize, quick: bool) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    println!(
        "CPU: {cpu}; {} CPUs; {runs} runs, transports alternating",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let scale = if quick { 10 } else { 1 };
    let mut port = 21_000 + (std::process::id() % 20_000) as u16;
    // (case label, n): per transport, per run.
    type PerTransport = Vec<Vec<f64>>;
    let mut rate: Vec<((&str, usize), PerTransport)> = vec![
        (("exchange", 2), vec![Vec::new(); 3]),
        (("exchange", 4), vec![Vec::new(); 3]),
    ];
    let mut cpu_per_gb: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); 3]; 2];
    let mut rtt: Vec<Vec<f64>> = vec![Vec::new(); 3];
    for _ in 0..runs {
        for (t, transport) in TRANSPORTS.iter().enumerate() {
            for (k, ((_, n), per)) in rate.iter_mut().enumerate() {
                let env = [
                    ("BATCH", "10000".to_string()),
                    ("ROUNDS", (1000 / scale).to_string()),
                ];
                let r = run("exchange", transport, *n, &env, &mut port);
                let records: u64 = r.iter().map(|r| r.records).sum();
                let secs = r.iter().map(|r| r.secs).fold(0.0, f64::max);
                per[t].push(records as f64 / secs / 1e6);
                // Of every record, (n - 1) / n crosses to another process: 8 bytes each.
                let crossed_gb = records as f64 * 8.0 * (*n as f64 - 1.0) / *n as f64 / 1e9;
                let cpu: f64 = r.iter().map(|r| r.cpu_secs).sum();
                cpu_per_gb[k][t].push(cpu / crossed_gb);
            }
            let iterations = 20_000 / scale as u64;
            let r = run(
                "pingpong",
                transport,
                2,
                &[("ITERATIONS", iterations.to_string())],
                &mut port,
            );
            let trips = iterations / 2;
            let secs = r.iter().map(|r| r.secs).fold(0.0, f64::max);
            rtt[t].push(secs / trips as f64 * 1e6);
        }
    }
    for (k, ((case, n), per)) in rate.iter().enumerate() {
        println!("\n{case} on {n} processes, one worker each (M records/s, all workers)");
        for (t, transport) in TRANSPORTS.iter().enumerate() {
            println!(
                "  {transport:5} {}   CPU s per GB crossed {}",
                fmt(median(&per[t])),
                fmt(median(&cpu_per_gb[k][t]))
            );
        }
        let ratio: Vec<f64> = per[0].iter().zip(&per[2]).map(|(s, t)| s / t).collect();
        println!("  shm / tcp, per run: {}  (goal >= 2)", fmt(median(&ratio)));
    }
    println!("\nping-pong dataflow between 2 processes: round trip (us)");
    for (t, transport) in TRANSPORTS.iter().enumerate() {
        println!("  {transport:5} {}", fmt(median(&rtt[t])));
    }
    let ratio: Vec<f64> = rtt[0].iter().zip(&rtt[2]).map(|(s, t)| s / t).collect();
    println!(
        "  shm / tcp, per run: {}  (goal <= 0.5)",
        fmt(median(&ratio))
    );

    println!("\na fast sender facing a slow receiver (5 ms per batch): peak RSS (MiB)");
    for transport in ["tcp", "shm"] {
        let env = [
            ("BATCH", "10000".to_string()),
            ("ROUNDS", (400 / scale).to_string()),
        ];
        let r = run("backpressure", transport, 2, &env, &mut port);
        println!(
            "  {transport:5} sender {:.0}, receiver {:.0}, {:.1} s",
            r[0].peak_rss_kib as f64 / 1024.0,
            r[1].peak_rss_kib as f64 / 1024.0,
            r.iter().map(|r| r.secs).fold(0.0, f64::max)
        );
    }
}
