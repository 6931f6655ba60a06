//! timely dataflow clusters whose processes exchange through shmflow on one host and TCP
//! between hosts.
//!
//! timely runs a computation as a cluster of processes that exchange over TCP, between
//! processes of one host too. This crate starts the same cluster from the same inputs
//! (`-w`, `-n`, `-p`, `-h hostfile`, `-z`) but links every two processes of one host with a
//! pair of shmflow channels (anonymous shared memory, handed over a Unix socket at start-up),
//! and keeps TCP between hosts. A timely program changes one line:
//!
//! ```no_run
//! use timely::dataflow::operators::{Exchange, Inspect, ToStream};
//!
//! // was: timely::execute_from_args(std::env::args(), |worker| {
//! shmflow_timely::execute_from_args(std::env::args(), |worker| {
//!     let index = worker.index();
//!     worker.dataflow::<u64, _, _>(|scope| {
//!         (0..10u64)
//!             .to_stream(scope)
//!             .container::<Vec<u64>>()
//!             .exchange(|x: &u64| *x)
//!             .inspect(move |x: &u64| println!("worker {index}: {x}"));
//!     });
//! })
//! .unwrap();
//! ```
//!
//! Two processes are on one host when their hostfile addresses have the same host part
//! (`localhost:2101` and `localhost:2102`, the default without `-h`). Between them, a write of
//! timely's send thread is a record in a channel whose pool is bounded ([`Options::geometry`]).
//!
//! # What the link changes, and what it cannot
//!
//! timely reaches a link through its `Stream` trait (`Read + Write`): a send thread per link
//! copies the workers' serialized batches into the link, a receive thread per link copies them
//! out into buffers for the workers. Measured (docs/BENCHMARKS.md): the ping-pong round trip
//! over shmflow is 0.59× TCP's; the exchange pattern moves about as many records as over TCP
//! or a Unix socket (1.1× on 2 processes, 1.0× on 4). The exchange is CPU-bound, and each
//! process's worker thread takes about 60 % of its CPU over either link (its serialization,
//! queues and operators; the send and receive threads take the rest), so even a link that cost
//! nothing would make it at most about 1.6× faster on two CPUs. Nor does the bounded
//! pool hold a fast sender back: the receive thread reads every link as soon as bytes arrive,
//! into an unbounded queue per worker, so a slow worker's backlog grows in its own process
//! whatever the link. Both need a seam above `Stream`: an allocator whose pushers serialize
//! straight into a claimed segment and whose pullers read records in place from a held one,
//! with a worker that waits while its peer's pool is full (timely's allocators are a closed
//! enum, `AllocatorBuilder`, and `Worker` takes only that enum, so this is a change to timely).
//! Such a wait must not stop the worker from receiving: every operator of a dataflow runs on
//! the one worker thread and an exchange goes both ways, so two workers that each wait for the
//! other's pool would never free it.
//!
//! A process that dies ends the others: their network threads see `PeerDead` (or a closed
//! socket) and fail with timely's "timely communication error", as over TCP. The channels are
//! anonymous (memfd): nothing is left in /dev/shm, whatever ends the processes.

#![warn(missing_docs)]

mod cluster;
mod stream;

pub use cluster::{connect, Local, Options};
pub use stream::{Link, ShmStream};

use timely::communication::allocator::zero_copy::initialize::initialize_networking_from_sockets;
use timely::communication::allocator::ProcessBuilder;
use timely::communication::{AllocatorBuilder, Hooks, WorkerGuards};
use timely::worker::Worker;
use timely::CommunicationConfig;

/// As `timely::execute_from_args`: the same options (`-w`, `-n`, `-p`, `-h`, `-r`, `-z`), with
/// the processes of one host linked through shmflow ([`Options::from_env`]: the environment
/// variable `SHMFLOW_TIMELY_LOCAL=unix|tcp` links them otherwise, for comparison).
///
/// # Errors
/// As `timely::execute_from_args`, and the failures of [`connect`] as text.
pub fn execute_from_args<I, T, F>(args: I, func: F) -> Result<WorkerGuards<T>, String>
where
    I: Iterator<Item = String>,
    T: Send + 'static,
    F: Fn(&mut Worker) -> T + Send + Sync + 'static,
{
    let config = timely::Config::from_args(args)?;
    execute(config, Options::from_env()?, func)
}

/// As `timely::execute`, linking the processes of a cluster as `options` says. A
/// configuration of one process runs as timely runs it.
///
/// # Errors
/// As `timely::execute`, and the failures of [`connect`] as text.
pub fn execute<T, F>(
    config: timely::Config,
    options: Options,
    func: F,
) -> Result<WorkerGuards<T>, String>
where
    T: Send + 'static,
    F: Fn(&mut Worker) -> T + Send + Sync + 'static,
{
    let CommunicationConfig::Cluster {
        threads,
        process,
        addresses,
        report,
        zerocopy,
    } = config.communication
    else {
        return timely::execute(config, func);
    };
    let links = connect(&addresses, process, &options)
        .map_err(|e| format!("process {process} ({}): {e}", addresses[process]))?;
    if report {
        for (j, l) in links.iter().enumerate() {
            if let Some(l) = l {
                let how = match l {
                    Link::Shm(_) => "shmflow",
                    Link::Tcp(_) => "tcp",
                    Link::Unix(_) => "unix",
                };
                println!(
                    "process {process}:\tlinked to process {j} ({}) by {how}",
                    addresses[j]
                );
            }
        }
    }
    let hooks = Hooks::default();
    let local = if zerocopy {
        ProcessBuilder::new_bytes_vector(threads, hooks.refill.clone(), hooks.spill.clone())
    } else {
        ProcessBuilder::new_typed_vector(threads, hooks.refill.clone(), hooks.spill.clone())
    };
    let (builders, guard) =
        initialize_networking_from_sockets(local, links, process, threads, hooks)
            .map_err(|e| format!("failed to initialize networking: {e}"))?;
    timely::execute::execute_from(
        builders.into_iter().map(AllocatorBuilder::Tcp).collect(),
        Box::new(guard),
        config.worker,
        func,
    )
}
