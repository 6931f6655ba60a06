//! Streams records between two direct network ends over loopback for a few seconds (a sender
//! thread and a reader thread, or with `--process` a reading child process, as the bench has
//! it; no bridge) and prints the rate: for profiling the direct ends.
//!
//! ```text
//! cargo build --release --features net --example direct_stream
//! perf record -g target/release/examples/direct_stream --len 65536 --secs 3
//! ```

use std::time::{Duration, Instant};

use clap::Parser;

use shmflow::net::{connect_consumer, connect_gate_channel, Config, Listener};
use shmflow::{FlushPolicy, Gate, GateGeometry, GateMessage, Geometry};

/// Streams records between two direct network ends over loopback and prints the rate: for
/// profiling the direct ends.
#[derive(Parser)]
#[command(name = "direct_stream", args_override_self = true)]
struct Args {
    /// Record size.
    #[arg(long, value_name = "BYTES", default_value_t = 65536)]
    len: usize,
    /// Segment size [default: the default geometry's].
    #[arg(long, value_name = "BYTES")]
    segment: Option<u32>,
    /// Segments in the pool [default: the default geometry's].
    #[arg(long, value_name = "N", conflicts_with = "gate")]
    segments: Option<u32>,
    /// How long to send.
    #[arg(long, value_name = "S", default_value_t = 3.0)]
    secs: f64,
    /// every (each record as it is sent), explicit (whole segments), or a buffer timeout in
    /// microseconds.
    #[arg(long, value_name = "P", default_value = "every", value_parser = policy)]
    policy: FlushPolicy,
    /// Mutual TLS, with certificates of a throwaway authority.
    #[arg(long)]
    tls: bool,
    /// The receiving end is channel 0 of a gate (2 exclusive, 8 floating segments), which
    /// reads with the gate's segments.
    #[arg(long, conflicts_with = "segment")]
    gate: bool,
    /// The reading end runs in a child process (this program, with --sink-at), a plain
    /// consumer without TLS.
    #[arg(long, conflicts_with_all = ["gate", "tls"])]
    process: bool,
    /// Be the child of --process: read from the sender at this address.
    #[arg(long, value_name = "ADDR", hide = true)]
    sink_at: Option<std::net::SocketAddr>,
}

/// `--policy`: `every`, `explicit`, or microseconds.
fn policy(p: &str) -> Result<FlushPolicy, String> {
    match p {
        "every" => Ok(FlushPolicy::EveryRecord),
        "explicit" => Ok(FlushPolicy::Explicit),
        us => us
            .parse()
            .map(|us| FlushPolicy::Timeout(Duration::from_micros(us)))
            .map_err(|_| format!("unknown policy {us:?}")),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    let (len, secs, policy) = (a.len, a.secs, a.policy);
    let (tx_cfg, rx_cfg) = if a.tls {
        tls_configs()?
    } else {
        (Config::default(), Config::default())
    };
    let l = Listener::bind("127.0.0.1:0".parse()?, tx_cfg)?;
    let addr = l.local_addr()?;
    type Counted = Result<(u64, u64), Box<dyn std::error::Error + Send + Sync>>;
    let gate = a.gate;
    let g = if gate {
        Geometry {
            segment_size: GateGeometry::new(1).segment_size,
            ..Geometry::default()
        }
    } else {
        let d = Geometry::default();
        Geometry {
            segment_size: a.segment.unwrap_or(d.segment_size),
            segment_count: a.segments.unwrap_or(d.segment_count),
        }
    };
    if let Some(at) = a.sink_at {
        // The child of `--process`: reads and prints what it counted.
        let mut rx = connect_consumer(at, "s", g, rx_cfg)?;
        let (mut n, mut bytes) = (0u64, 0u64);
        while let Some(mut r) = rx.recv()? {
            bytes += record_len(&mut r)?;
            n += 1;
        }
        println!("{n} {bytes}");
        return Ok(());
    }
    let child = if a.process {
        let mut cmd = std::process::Command::new(std::env::current_exe()?);
        cmd.args(["--sink-at", &addr.to_string()])
            .args(["--segment", &g.segment_size.to_string()])
            .args(["--segments", &g.segment_count.to_string()])
            .stdout(std::process::Stdio::piped());
        Some(cmd.spawn()?)
    } else {
        None
    };
    let in_thread = child.is_none();
    let reader = std::thread::spawn(move || -> Counted {
        if !in_thread {
            let out = child.expect("the child").wait_with_output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            let mut it = text.split_whitespace().map(str::parse::<u64>);
            return match (it.next(), it.next()) {
                (Some(Ok(n)), Some(Ok(bytes))) if out.status.success() => Ok((n, bytes)),
                _ => Err(format!("the reading process: {} {text}", out.status).into()),
            };
        }
        let (mut n, mut bytes) = (0u64, 0u64);
        if gate {
            let (mut gate, _handles) = Gate::create_anonymous(GateGeometry::new(1))?;
            connect_gate_channel(addr, "s", &mut gate, 0, rx_cfg)?;
            while let Some(m) = gate.recv()? {
                if let GateMessage::Record { mut record, .. } = m {
                    bytes += record_len(&mut record)?;
                    n += 1;
                }
            }
            return Ok((n, bytes));
        }
        let mut rx = connect_consumer(addr, "s", g, rx_cfg)?;
        while let Some(mut r) = rx.recv()? {
            bytes += record_len(&mut r)?;
            n += 1;
        }
        Ok((n, bytes))
    });
    // (A reader that failed before it connected: not a wait for ever.)
    let mut tx = l.accept_producer_timeout("s", g, Duration::from_secs(30))?;
    tx.set_flush_policy(policy);
    let rec = vec![7u8; len];
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs_f64(secs) {
        for _ in 0..64 {
            tx.send(&rec)?;
        }
    }
    tx.close_timeout(Duration::from_secs(30))?;
    let (n, bytes) = reader
        .join()
        .expect("the reader thread")
        .map_err(|e| e.to_string())?;
    let s = start.elapsed().as_secs_f64();
    println!(
        "{n} records, {:.3} GB/s, {:.1} M records/s",
        bytes as f64 / s / 1e9,
        n as f64 / s / 1e6
    );
    Ok(())
}

/// The bytes of a record, read in place (a record spanning segments part by part).
fn record_len(r: &mut shmflow::Record<'_>) -> Result<u64, shmflow::RecvError> {
    if let Some(b) = r.as_bytes() {
        return Ok(b.len() as u64);
    }
    let mut len = 0;
    while let Some(p) = r.next_part()? {
        len += p.len() as u64;
    }
    Ok(len)
}

/// Configs for both sides, with certificates a throwaway authority signed (rcgen).
fn tls_configs() -> Result<(Config, Config), Box<dyn std::error::Error>> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate()?;
    let ca = params.self_signed(&ca_key)?;
    let side = |name: &str| -> Result<Config, Box<dyn std::error::Error>> {
        let key = rcgen::KeyPair::generate()?;
        let cert =
            rcgen::CertificateParams::new(vec![name.to_owned()])?.signed_by(&key, &ca, &ca_key)?;
        let tls = shmflow::net::Tls::from_pem(
            cert.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
            ca.pem().as_bytes(),
            "localhost",
        )?;
        Ok(Config::default().tls(tls))
    };
    Ok((side("localhost")?, side("client")?))
}
