//! Streams records through the bridges over loopback for a few seconds: a producer thread
//! writing into a local channel that a [`Server`] forwards (on a runtime of one worker), a
//! [`Client`] writing into its own local channel (another runtime of one worker), and a
//! consumer thread reading it in place, all in one process, or with `--process` the client
//! and the consumer in a child, as `shmflow bench --only remote` has them. Prints the rate
//! and the CPU seconds per GB both processes spent, and fails if a record was lost: for
//! profiling the bridges.
//!
//! ```text
//! cargo build --release --features net --example bridge_stream
//! perf record -g target/release/examples/bridge_stream --len 64 --secs 3
//! ```

use std::time::{Duration, Instant};

use clap::Parser;

use shmflow::net::{Client, Config, Server};
use shmflow::Geometry;

/// Streams records through the bridges over loopback and prints the rate and the CPU seconds
/// per GB: for profiling the bridges.
#[derive(Parser)]
#[command(name = "bridge_stream", args_override_self = true)]
struct Args {
    /// Record size.
    #[arg(long, value_name = "BYTES", default_value_t = 64)]
    len: usize,
    /// How long to send.
    #[arg(long, value_name = "S", default_value_t = 3.0)]
    secs: f64,
    /// The receiving bridge and its consumer run in a child process (this program, with
    /// --sink-at).
    #[arg(long)]
    process: bool,
    /// Be the child of --process: receive from the server at this address.
    #[arg(long, value_name = "ADDR", hide = true)]
    sink_at: Option<std::net::SocketAddr>,
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
}

/// CPU seconds (user + system) of every thread of this process and of its waited-for
/// children so far.
fn cpu_s() -> f64 {
    let of = |who| {
        // SAFETY: `getrusage` fills the zeroed struct it is given and reads nothing else.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `u` is a valid, writable `rusage`.
        unsafe { libc::getrusage(who, &mut u) };
        let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
        t(u.ru_utime) + t(u.ru_stime)
    };
    of(libc::RUSAGE_SELF) + of(libc::RUSAGE_CHILDREN)
}

type Counted = Result<(u64, u64), Box<dyn std::error::Error + Send + Sync>>;

/// The receiving side: a client importing the channel into a local one, and a consumer
/// thread reading it in place: (records, bytes).
fn receive(addr: std::net::SocketAddr) -> Counted {
    let rt = runtime()?;
    let (rtx, mut rrx) = shmflow::pair(Geometry::default())?;
    let client = rt.spawn(async move {
        let mut c = Client::connect(addr, Config::default()).await?;
        c.import("s", rtx)?;
        Ok::<_, shmflow::net::SetupError>(c.run().await)
    });
    let (mut n, mut bytes) = (0u64, 0u64);
    while let Some(mut r) = rrx.recv()? {
        match r.as_bytes() {
            Some(b) => bytes += b.len() as u64,
            None => {
                while let Some(p) = r.next_part()? {
                    bytes += p.len() as u64;
                }
            }
        }
        n += 1;
    }
    let imported = rt.block_on(client)??;
    if let Some(e) = imported.iter().find_map(|o| o.result.as_ref().err()) {
        return Err(e.to_string().into());
    }
    Ok((n, bytes))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    let (len, secs) = (a.len, a.secs);
    if let Some(at) = a.sink_at {
        // The child of `--process`: receives and prints what it counted.
        let (n, bytes) = receive(at).map_err(|e| e.to_string())?;
        println!("{n} {bytes}");
        return Ok(());
    }
    let send_rt = runtime()?;
    let (mut tx, rx) = shmflow::pair(Geometry::default())?;
    let (server, addr) = send_rt.block_on(async {
        let mut s = Server::bind("127.0.0.1:0".parse()?, Config::default()).await?;
        s.export("s", rx)?;
        let addr = s.local_addr()?;
        Ok::<_, Box<dyn std::error::Error>>((tokio::spawn(s.run()), addr))
    })?;
    let (start, cpu0) = (Instant::now(), cpu_s());
    let child = if a.process {
        let mut cmd = std::process::Command::new(std::env::current_exe()?);
        cmd.args(["--sink-at", &addr.to_string()])
            .stdout(std::process::Stdio::piped());
        Some(cmd.spawn()?)
    } else {
        None
    };
    let reader = std::thread::spawn(move || -> Counted {
        let Some(child) = child else {
            return receive(addr);
        };
        let out = child.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut it = text.split_whitespace().map(str::parse::<u64>);
        match (it.next(), it.next()) {
            (Some(Ok(n)), Some(Ok(bytes))) if out.status.success() => Ok((n, bytes)),
            _ => Err(format!("the receiving process: {} {text}", out.status).into()),
        }
    });
    let rec = vec![7u8; len];
    let mut sent = 0u64;
    while start.elapsed() < Duration::from_secs_f64(secs) {
        for _ in 0..64 {
            tx.send(&rec)?;
        }
        sent += 64;
    }
    drop(tx);
    let served = send_rt.block_on(server)?;
    let (n, bytes) = reader
        .join()
        .expect("the reader thread")
        .map_err(|e| e.to_string())?;
    if n != sent || bytes != sent * len as u64 {
        return Err(format!("{sent} records sent, {n} ({bytes} bytes) received").into());
    }
    let (s, cpu) = (start.elapsed().as_secs_f64(), cpu_s() - cpu0);
    if let Some(e) = served.channels.iter().find_map(|o| o.result.as_ref().err()) {
        return Err(e.to_string().into());
    }
    println!(
        "{n} records of {len} B, {:.3} GB/s, {:.0} records/s, {:.2} CPU s/GB",
        bytes as f64 / s / 1e9,
        n as f64 / s,
        cpu / (bytes as f64 / 1e9)
    );
    Ok(())
}
