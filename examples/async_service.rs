//! A tokio service that reads records from a channel fed by another process and serves them
//! on a TCP socket, with backpressure end to end: a slow TCP client makes the service stop
//! reading, and the feeding process then waits in `send`.
//!
//! ```text
//! cargo run --release --features tokio --example async_service -- --records 200000
//! ```
//!
//! The service creates an anonymous channel and hands it to a child process (this program
//! again, `--feed`), which sends `--records` numbered records with a checksum. It listens on
//! 127.0.0.1 (a free port), and streams every record to the client that connects, as a
//! length-prefixed frame. The example's own client connects, reads slowly for a while (the
//! feeder is held back: its backpressured time shows it), then at full speed, and checks
//! that every record arrived once, in order, intact. Exits non-zero otherwise.

use std::time::{Duration, Instant};

use clap::Parser;

use shmflow::{Consumer, Producer, WaitStrategy};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};

const FD_VAR: &str = "SHMFLOW_EXAMPLE_FD";

fn record(seq: u64, out: &mut Vec<u8>) {
    // 16..=80 bytes: the sequence number, a checksum, then bytes derived from both.
    let len = 16 + (seq % 65) as usize;
    out.clear();
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&[0; 8]);
    out.extend((16..len).map(|i| (seq as u8).wrapping_mul(7).wrapping_add(i as u8)));
    let sum = checksum(&out[16..]);
    out[8..16].copy_from_slice(&sum.to_le_bytes());
}

fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xCBF2_9CE4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01B3)
    })
}

/// The child: feeds the channel with a plain blocking producer.
fn feed(records: u64) -> Result<(), Box<dyn std::error::Error>> {
    let mut tx = Producer::from_env(FD_VAR)?;
    let mut buf = Vec::new();
    for seq in 0..records {
        record(seq, &mut buf);
        tx.send(&buf)?;
    }
    let m = tx.metrics();
    eprintln!(
        "feeder: {records} records sent, {:.0} ms of it waiting for the service (backpressure)",
        m.backpressured_ns as f64 / 1e6
    );
    Ok(())
}

/// The service: streams the channel's records to the client that connects, as they come.
/// A client that reads slowly fills the socket; the task then waits in `write_all` and stops
/// reading the channel, whose producer then waits for segments: backpressure end to end.
async fn serve(
    mut rx: Consumer,
    listener: TcpListener,
) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
    let (sock, peer) = listener.accept().await?;
    sock.set_nodelay(true)?;
    eprintln!("service: client {peer} connected");
    let mut out = BufWriter::new(sock);
    let mut n = 0u64;
    while let Some(r) = rx.recv_async().await? {
        let bytes = r.as_bytes().ok_or("a record larger than a segment")?;
        out.write_u32_le(bytes.len() as u32).await?;
        out.write_all(bytes).await?;
        n += 1;
    }
    out.flush().await?;
    out.into_inner().shutdown().await?;
    let idle = rx.metrics().idle_ns;
    eprintln!(
        "service: end of stream after {n} records ({:.0} ms waiting for records)",
        idle as f64 / 1e6
    );
    Ok(n)
}

/// The example's client: slow for the first `slow` records, then as fast as it can.
async fn client(
    addr: std::net::SocketAddr,
    records: u64,
    slow: u64,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let sock = TcpStream::connect(addr).await?;
    let mut rd = BufReader::new(sock);
    let mut buf = Vec::new();
    let mut want = Vec::new();
    for seq in 0..records {
        let len = rd.read_u32_le().await? as usize;
        buf.resize(len, 0);
        rd.read_exact(&mut buf).await?;
        record(seq, &mut want);
        if buf != want {
            return Err(format!("record {seq} differs").into());
        }
        if seq < slow && seq % 100 == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    if rd.read_u32_le().await.is_ok() {
        return Err("more records than were sent".into());
    }
    Ok(())
}

/// A tokio service serving over TCP the records a channel fed by another process carries, with
/// backpressure end to end.
#[derive(Parser)]
#[command(name = "async_service", args_override_self = true)]
struct Args {
    /// Records the feeding process sends; exits non-zero on any missing or garbled record.
    #[arg(long, value_name = "N", default_value_t = 200_000)]
    records: u64,
    /// Be the feeding process (the service starts it).
    #[arg(long, hide = true)]
    feed: bool,
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args = Args::parse();
    let records = args.records;
    if args.feed {
        return feed(records).map_err(|e| e.to_string().into());
    }

    let (mut rx, handle) = Consumer::create_anonymous(shmflow::Geometry::default())?;
    rx.set_wait_strategy(WaitStrategy::Park);
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(["--feed", "--records", &records.to_string()]);
    handle.pass_to(&mut cmd, FD_VAR);
    let mut feeder = cmd.spawn()?;
    drop(handle);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let start = Instant::now();
    let served = rt.block_on(async move {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        eprintln!("service: listening on {addr}");
        let client = tokio::spawn(client(addr, records, records / 10));
        // The service runs as a task on the runtime's workers (its futures are `Send`).
        let served = tokio::spawn(serve(rx, listener)).await??;
        client.await??;
        Ok::<u64, Box<dyn std::error::Error + Send + Sync>>(served)
    })?;
    let status = feeder.wait()?;
    if !status.success() {
        return Err(format!("the feeding process failed: {status}").into());
    }
    if served != records {
        return Err(format!("served {served} records, {records} were sent").into());
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "served {served} records from another process over TCP in {secs:.2} s ({:.0} records/s), every one checked",
        served as f64 / secs
    );
    Ok(())
}
