//! `shmflow`: look at live shmflow regions, clean up after crashed processes, measure, and run
//! the backpressure experiment. `shmflow --help` and `shmflow COMMAND --help` say how.
//!
//! Exit codes: 0 on success; 1 when the command failed (the message says why: a region that
//! does not exist or is not shmflow's, an I/O error, a failed demo); 2 for a command line that
//! does not parse (clap's usage message).
//!
//! This file is the command line and its dispatch; each command is a module: `inspect` (`list`,
//! `clean`, `stat`), `top`, `export`, `bench`, `remote` and `demo`.

mod bench;
mod demo;
mod export;
mod inspect;
mod latency;
mod remote;
mod top;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// Look at and manage shmflow's shared-memory regions in /dev/shm.
#[derive(Parser, Debug)]
#[command(name = "shmflow", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// The shmflow regions in /dev/shm with geometry and ends, then any other object there.
    List,
    /// Remove every shmflow region whose ends are all dead (never one with a live end). A
    /// channel whose stream ended with records no consumer has read yet is kept for its
    /// consumer unless --unread is given.
    Clean {
        /// Also remove ended channels whose records no consumer has read, discarding them.
        #[arg(long)]
        unread: bool,
        /// Only these regions (e.g. /orders); every region in /dev/shm if none is named.
        names: Vec<String>,
    },
    /// Watch a region (channel or gate) live, read-only: it never attaches as an end. Stops
    /// by itself (exit 0) once every end has come and gone, after printing the final state.
    Stat {
        /// The region's name, e.g. /orders.
        #[arg(required_unless_present = "pipeline")]
        name: Option<String>,
        /// A shmflow-pipeline checkpoint directory instead: its supervisor's figures
        /// (numRestarts, numberOfCompletedCheckpoints, lastCheckpointDuration, ...).
        #[arg(long, conflicts_with = "name")]
        pipeline: Option<PathBuf>,
        /// One JSON object per sample instead of the screen view.
        #[arg(long)]
        json: bool,
        /// Milliseconds between samples [default: 1000, or 200 with --json].
        #[arg(long)]
        interval_ms: Option<u64>,
        /// Samples to take [default: unbounded, or 1 with --json].
        #[arg(long)]
        count: Option<u64>,
    },
    /// A live view of every channel and gate on the machine, sorted by backpressure: levels in
    /// colour, pool usage as bars, rates with sparklines, credit and backlog of remote links;
    /// Enter opens a gate's channels, / filters, q quits. Read-only, like stat.
    Top {
        /// Milliseconds between refreshes.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// Also a line per shmflow-pipeline checkpoint directory (repeatable): its state,
        /// restarts, checkpoints and last failure.
        #[arg(long)]
        pipeline: Vec<PathBuf>,
    },
    /// Serve every channel's and gate's metrics to Prometheus at http://LISTEN/metrics, with
    /// Flink's names (backPressuredTimeMsPerSecond, outPoolUsage, numRecordsOut, ...) and
    /// labels region, channel and end. Read-only, like stat.
    Export {
        /// Address to listen on (port 0: any free port; the address is printed).
        #[arg(long, default_value = "127.0.0.1:9187")]
        listen: std::net::SocketAddr,
        /// Also a shmflow-pipeline checkpoint directory's figures (repeatable).
        #[arg(long)]
        pipeline: Vec<PathBuf>,
        /// Milliseconds between the exporter's own samples: each rate gauge covers the last
        /// interval, whoever scrapes and however often.
        #[arg(long, default_value_t = 1000)]
        sample_ms: u64,
    },
    /// Measure shmflow against the hardware floor and the OS, between two processes.
    Bench(bench::BenchArgs),
    /// Wire local channels to a remote peer over TCP, with credit-based flow control.
    Remote {
        #[command(subcommand)]
        cmd: remote::RemoteCmd,
    },
    /// Run a demonstration.
    Demo {
        #[command(subcommand)]
        demo: demo::Cmd,
    },
    /// Internal: a peer process of `bench`.
    #[command(name = "__bench-role", hide = true)]
    BenchRole {
        #[command(subcommand)]
        role: bench::Role,
    },
    /// Internal: a child process of `demo`.
    #[command(name = "__demo-role", hide = true)]
    DemoRole {
        #[command(subcommand)]
        role: demo::Role,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.command {
        Cmd::List => inspect::list(),
        Cmd::Clean { unread, names } => inspect::clean(unread, &names),
        Cmd::Stat {
            name,
            pipeline,
            json,
            interval_ms,
            count,
        } => inspect::stat(name, pipeline, json, interval_ms, count),
        Cmd::Top {
            interval_ms,
            pipeline,
        } => top::main(Duration::from_millis(interval_ms.max(50)), pipeline),
        Cmd::Export {
            listen,
            pipeline,
            sample_ms,
        } => export::main(listen, pipeline, Duration::from_millis(sample_ms.max(10))),
        Cmd::Bench(args) => bench::main(&args),
        Cmd::Demo { demo } => demo::main(&demo),
        Cmd::Remote { cmd } => remote::main(cmd),
        Cmd::BenchRole { role } => role.run(),
        Cmd::DemoRole { role } => role.run(),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shmflow: {e}");
            ExitCode::FAILURE
        }
    }
}
