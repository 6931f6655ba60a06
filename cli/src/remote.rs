//! `shmflow remote`: wires existing local channels to a remote peer over TCP.
//!
//! `serve` reads local channels (as their consumer) and offers them under names; `connect`
//! requests them by name and writes them into local channels or gate channels (as their
//! producer). The stages at both ends use their channels as on one machine.

use std::net::SocketAddr;

use clap::{Args, Subcommand};
use shmflow::net::{Client, Config, Tls};
use shmflow::{Consumer, Geometry, Producer};

#[derive(Subcommand, Debug)]
pub(crate) enum RemoteCmd {
    /// Serve local channels to remote receivers: this side is each channel's consumer and
    /// forwards its segments as the receiver gives credit. Exits when every channel ended.
    Serve {
        /// Address to listen on (loopback unless TLS is given, or --insecure-plaintext).
        #[arg(long)]
        listen: SocketAddr,
        /// NAME=REGION: offer the local channel REGION (opened, or created if it does not
        /// exist yet) under NAME. Repeat for more channels.
        #[arg(long = "export", value_name = "NAME=REGION", required = true)]
        exports: Vec<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Connect to a server and feed remote channels into local ones: this side is each local
    /// channel's producer. Exits when every channel ended.
    Connect {
        /// The server's address.
        addr: SocketAddr,
        /// NAME=REGION or NAME=GATE:CHANNEL: write the remote channel NAME into the local
        /// channel REGION (opened or created), or into channel CHANNEL of the local gate GATE.
        /// Repeat for more channels.
        #[arg(long = "import", value_name = "NAME=REGION", required = true)]
        imports: Vec<String>,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Args, Debug)]
pub(crate) struct Common {
    /// Bytes per segment of channels this command creates (both ends need the same size).
    #[arg(long, default_value_t = Geometry::default().segment_size)]
    segment_size: u32,
    /// Segments of channels this command creates.
    #[arg(long, default_value_t = Geometry::default().segment_count)]
    segments: u32,
    /// PEM certificate chain of this side (mutual TLS: with --key and --ca).
    #[arg(long, requires_all = ["key", "ca"])]
    cert: Option<std::path::PathBuf>,
    /// PEM private key of this side.
    #[arg(long)]
    key: Option<std::path::PathBuf>,
    /// PEM certificate of the authority that signs both sides' certificates.
    #[arg(long)]
    ca: Option<std::path::PathBuf>,
    /// The name the server's certificate carries (checked by `connect`).
    #[arg(long, default_value = "localhost")]
    server_name: String,
    /// Allow plaintext on an address other than loopback. INSECURE: anyone on the path can
    /// read and inject records.
    #[arg(long)]
    insecure_plaintext: bool,
}

impl Common {
    fn config(&self) -> Result<Config, String> {
        let mut config = Config::default();
        if let (Some(cert), Some(key), Some(ca)) = (&self.cert, &self.key, &self.ca) {
            let read = |p: &std::path::Path| {
                std::fs::read(p).map_err(|e| format!("reading {}: {e}", p.display()))
            };
            let tls = Tls::from_pem(&read(cert)?, &read(key)?, &read(ca)?, &self.server_name)
                .map_err(|e| e.to_string())?;
            config = config.tls(tls);
        }
        if self.insecure_plaintext {
            eprintln!(
                "shmflow remote: WARNING: plaintext allowed beyond loopback; records can be \
                 read and forged on the path"
            );
            config = config.insecure_plaintext();
        }
        Ok(config)
    }

    fn geometry(&self) -> Geometry {
        Geometry {
            segment_size: self.segment_size,
            segment_count: self.segments,
        }
    }
}

fn split(spec: &str) -> Result<(&str, &str), String> {
    spec.split_once('=')
        .filter(|(n, r)| !n.is_empty() && !r.is_empty())
        .ok_or_else(|| format!("{spec:?}: expected NAME=REGION"))
}

pub(crate) fn main(cmd: RemoteCmd) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;
    rt.block_on(async move {
        match cmd {
            RemoteCmd::Serve {
                listen,
                exports,
                common,
            } => serve(listen, &exports, &common).await,
            RemoteCmd::Connect {
                addr,
                imports,
                common,
            } => connect(addr, &imports, &common).await,
        }
    })
}

async fn serve(listen: SocketAddr, exports: &[String], common: &Common) -> Result<(), String> {
    let mut server = shmflow::net::Server::bind(listen, common.config()?)
        .await
        .map_err(setup_error)?;
    for spec in exports {
        let (name, region) = split(spec)?;
        let consumer = Consumer::builder()
            .geometry(common.geometry())
            .open_or_create(region)
            .map_err(|e| e.to_string())?;
        server.export(name, consumer).map_err(|e| e.to_string())?;
    }
    let addr = server.local_addr().map_err(|e| e.to_string())?;
    eprintln!(
        "shmflow remote: serving {} channel(s) on {addr}",
        exports.len()
    );
    let report = server.run().await;
    for (peer, e) in &report.refused {
        let peer = peer.map_or("?".to_string(), |p| p.to_string());
        eprintln!("shmflow remote: refused a connection from {peer}: {e}");
    }
    outcomes(&report.channels)
}

async fn connect(addr: SocketAddr, imports: &[String], common: &Common) -> Result<(), String> {
    let mut client = Client::connect(addr, common.config()?)
        .await
        .map_err(setup_error)?;
    for spec in imports {
        let (name, target) = split(spec)?;
        let producer = match target.rsplit_once(':') {
            Some((gate, ch)) if ch.parse::<u32>().is_ok() => {
                Producer::open_channel(gate, ch.parse().expect("checked"))
            }
            _ => Producer::builder()
                .geometry(common.geometry())
                .open_or_create(target),
        }
        .map_err(|e| e.to_string())?;
        client.import(name, producer).map_err(|e| e.to_string())?;
    }
    eprintln!(
        "shmflow remote: receiving {} channel(s) from {addr}",
        imports.len()
    );
    outcomes(&client.run().await)
}

/// A setup error in the command's terms: the flags, not the library's calls.
fn setup_error(e: shmflow::net::SetupError) -> String {
    match e {
        shmflow::net::SetupError::PlaintextRefused { addr } => format!(
            "{addr} is not a loopback address: beyond loopback remote channels need mutual TLS \
             (--cert, --key and --ca), or --insecure-plaintext to allow plaintext on purpose"
        ),
        other => other.to_string(),
    }
}

fn outcomes(channels: &[shmflow::net::ChannelOutcome]) -> Result<(), String> {
    let mut failed = 0;
    for c in channels {
        match &c.result {
            Ok(end) => eprintln!("shmflow remote: {}: ended ({end:?})", c.name),
            Err(e) => {
                failed += 1;
                eprintln!("shmflow remote: {}: {e}", c.name);
            }
        }
    }
    if failed > 0 {
        return Err(format!("{failed} channel(s) failed"));
    }
    Ok(())
}
