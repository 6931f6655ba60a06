//! `shmflow demo`: the demonstrations, each between processes of this binary. `backpressure`
//! is Flink's backpressure experiment, `checkpoints` checkpoint barriers through a
//! backpressured gate. Their child processes are this binary re-executed as `shmflow
//! __demo-role ROLE ARGS…`, a hidden subcommand per role ([`Role`]).

mod backpressure;
mod checkpoints;

use std::process::{Child, Command};

use clap::{Subcommand, ValueEnum};

/// The demonstrations.
#[derive(Subcommand, Debug)]
pub(crate) enum Cmd {
    /// Flink's backpressure experiment between two processes: after a calibration phase, the
    /// producer at 60 % with the consumer keeping up, the consumer slowed to 30 %, both at
    /// 100 %, the consumer at 30 % again, both at 100 %; a CSV and an SVG of throughput,
    /// backpressure and pool usage. It judges each phase against its targets: exit 2 if one
    /// missed them (saying which), 3 if the calibration was too disturbed to judge ("host too
    /// busy").
    Backpressure(backpressure::Args),
    /// Checkpoint barriers through a backpressured gate, read at a fixed rate by this process
    /// from producer processes writing flat out: aligned barriers, aligned barriers with
    /// buffer debloating, and unaligned ones, one mode after the other. Reports each mode's
    /// barrier delay and checkpoint duration (p50/p99), bytes in flight and throughput, with
    /// the expected shape as goals; writes CSVs, a JSON summary and an SVG.
    Checkpoints(checkpoints::Args),
}

/// Runs the demonstration `cmd`.
pub(crate) fn main(cmd: &Cmd) -> Result<(), String> {
    match cmd {
        Cmd::Backpressure(args) => backpressure::main(args),
        Cmd::Checkpoints(args) => checkpoints::main(args),
    }
}

/// A child process of a demonstration.
#[derive(Subcommand, Clone, Debug, PartialEq)]
pub(crate) enum Role {
    /// The consumer of `demo backpressure`: reads the region `name`, paced by the phases
    /// `phases` from `start_ns` on, `phase_ns` each; with `port`, `name` is its own region,
    /// fed from the producer's channel served on that loopback port.
    Consumer {
        name: String,
        start_ns: u64,
        phase_ns: u64,
        phases: String,
        port: Option<u16>,
    },
    /// A producer of `demo checkpoints`: writes into the channel `channel` of the gate `name`
    /// from `start_ns` to `end_ns`, a barrier every `interval_ns`, as the mode `mode` wants.
    CheckpointProducer {
        name: String,
        channel: u32,
        start_ns: u64,
        end_ns: u64,
        interval_ns: u64,
        mode: checkpoints::Mode,
    },
}

impl Role {
    /// The command line after `__demo-role` that parses into this role.
    fn to_args(&self) -> Vec<String> {
        match self {
            Role::Consumer {
                name,
                start_ns,
                phase_ns,
                phases,
                port,
            } => [
                "consumer",
                name,
                &start_ns.to_string(),
                &phase_ns.to_string(),
                phases,
            ]
            .iter()
            .map(|a| a.to_string())
            .chain(port.map(|p| p.to_string()))
            .collect(),
            Role::CheckpointProducer {
                name,
                channel,
                start_ns,
                end_ns,
                interval_ns,
                mode,
            } => vec![
                "checkpoint-producer".to_owned(),
                name.clone(),
                channel.to_string(),
                start_ns.to_string(),
                end_ns.to_string(),
                interval_ns.to_string(),
                mode.to_possible_value()
                    .expect("no mode is skipped")
                    .get_name()
                    .to_owned(),
            ],
        }
    }

    /// Starts this binary as the child playing this role.
    fn spawn(&self) -> Result<Child, String> {
        Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
            .arg("__demo-role")
            .args(self.to_args())
            .spawn()
            .map_err(|e| e.to_string())
    }

    /// Plays the role in this process.
    pub(crate) fn run(self) -> Result<(), String> {
        match self {
            Role::Consumer {
                name,
                start_ns,
                phase_ns,
                phases,
                port,
            } => backpressure::consumer(&name, start_ns, phase_ns, &phases, port),
            Role::CheckpointProducer {
                name,
                channel,
                start_ns,
                end_ns,
                interval_ns,
                mode,
            } => checkpoints::producer(&name, channel, start_ns, end_ns, interval_ns, mode),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Child {
        #[command(subcommand)]
        role: Role,
    }

    #[test]
    fn every_role_parses_back_from_its_command_line() {
        let consumer = |port| Role::Consumer {
            name: "/shmflow-demo-12-in".into(),
            start_ns: 1_234_567_890_123,
            phase_ns: 3_000_000_000,
            phases: "60:100,60:30,100:100".into(),
            port,
        };
        let producer = |mode| Role::CheckpointProducer {
            name: "/shmflow-demo-ckpt-12-aligned".into(),
            channel: 3,
            start_ns: 5,
            end_ns: 12_000_000_005,
            interval_ns: 1_000_000_000,
            mode,
        };
        let roles = [
            consumer(None),
            consumer(Some(40_123)),
            producer(checkpoints::Mode::Aligned),
            producer(checkpoints::Mode::Debloated),
            producer(checkpoints::Mode::Unaligned),
        ];
        for role in roles {
            let argv = std::iter::once("__demo-role".to_owned()).chain(role.to_args());
            let parsed = Child::try_parse_from(argv)
                .unwrap_or_else(|e| panic!("{role:?}: {:?}: {e}", role.to_args()));
            assert_eq!(parsed.role, role);
        }
    }
}
