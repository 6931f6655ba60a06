//! The peer processes of `shmflow bench`: this binary re-executed as `shmflow __bench-role
//! ROLE ARGS…`, a hidden subcommand per role with typed arguments. [`Role::to_args`] writes the
//! command line that parses back into the same role; [`harness::child`](super::harness::child)
//! spawns it. Descriptors come in environment variables (`CH`, `PING`, `PONG`, `RAW`, `IN`,
//! `OUT`); a sink prints `count nanoseconds` on stdout for its parent.

use std::net::SocketAddr;

use clap::{Subcommand, ValueEnum};
use shmflow::Geometry;

use super::netem::Kind;
use super::openloop::Transport;
use super::remote::{RttWait, SinkRead};
use super::{asynch, case, floors, local, netem, openloop, remote};

/// How the echo of the round trips waits for its next number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum EchoWait {
    /// Busy-polls, as the spinning measures do.
    Spin,
    /// Parks at once (`WaitStrategy::Park`): every message is a futex wake-up.
    Parked,
    /// The default strategy (`WaitStrategy::Block`).
    Block,
}

/// A peer process of the benchmark.
#[derive(Subcommand, Clone, Debug, PartialEq)]
pub(crate) enum Role {
    /// Echoes every number from the channel PING into the channel PONG.
    Echo { wait: EchoWait },
    /// The spinning floor's peer, on the shared word of RAW.
    SpinFloor,
    /// The futex floor's peer, on the shared word of RAW.
    FutexFloor,
    /// Echoes 8-byte messages from the descriptor IN to OUT.
    EchoFd,
    /// Reads the channel CH tuned for throughput (busy-polling, `drain`, counters off).
    ShmSink,
    /// Reads the channel CH with the plain loop, every setting at its default.
    PlainSink,
    /// Reads length-prefixed records from the descriptor IN.
    FdSink,
    /// The open loop's receiver: messages of `len` bytes over `transport` (CH or IN), their
    /// latency counted from those scheduled at `from` (monotonic nanoseconds) on.
    OlSink {
        transport: Transport,
        len: usize,
        from: u64,
    },
    /// `bench --case`: echoes every record from the channel PING into the channel PONG,
    /// waiting as `wait` says (`block`, `park`, `busy-poll:DURATION`).
    CaseEcho { wait: String },
    /// `bench --case`: the open loop's receiver on the channel CH, waiting as `wait` says,
    /// counting the records scheduled at `from` on, then its CPU while nothing comes.
    CaseSink { wait: String, from: u64 },
    /// `bench --case`: the floor's peer, copying records of `len` bytes back on RAW.
    CaseFloor { len: usize },
    /// Reads the channel CH with `recv_async`.
    AsyncSink,
    /// Reads the channel CH with `drain_async`.
    AsyncDrainSink,
    /// Imports the channel "bench" served on loopback `port` into a channel of segments of the
    /// given shape, and reads it as `read` says.
    RemoteSink {
        port: u16,
        segment_size: u32,
        segment_count: u32,
        read: SinkRead,
    },
    /// Reads a raw TCP stream from loopback `port`.
    TcpSink { port: u16 },
    /// Reads 64 B records framed by hand over a raw TCP stream from loopback `port`.
    TcpFramedSink { port: u16 },
    /// Echoes 8-byte messages on a TCP connection to loopback `port`.
    TcpEcho { port: u16 },
    /// Echoes 8-byte messages from one TCP connection to loopback `port` into a second one.
    TcpEchoTwo { port: u16 },
    /// Imports "ping" from loopback `port` and echoes it into "pong", served on `back`.
    RemoteEcho { port: u16, back: u16 },
    /// A direct consumer of "bench" from loopback `port`, with segments of the given shape,
    /// reading as `read` says.
    DirectSink {
        port: u16,
        segment_size: u32,
        segment_count: u32,
        read: SinkRead,
    },
    /// Direct ends: "ping" from loopback `port`, echoed into "pong", accepted on `back`.
    DirectEcho { port: u16, back: u16, wait: RttWait },
    /// The sender across the delayed link: listens on `addr`, sends for `secs`.
    NetemSend {
        kind: Kind,
        addr: SocketAddr,
        secs: f64,
        segment_size: u32,
        segment_count: u32,
        len: usize,
    },
    /// The receiver across the delayed link: connects to `addr`, reads to the end.
    NetemRecv {
        kind: Kind,
        addr: SocketAddr,
        segment_size: u32,
        segment_count: u32,
        len: usize,
    },
}

/// The name clap knows `v` by.
fn value(v: impl ValueEnum) -> String {
    v.to_possible_value()
        .expect("no value is skipped")
        .get_name()
        .to_owned()
}

impl Role {
    /// The command line after `__bench-role` that parses into this role.
    pub(crate) fn to_args(&self) -> Vec<String> {
        let s = |v: &dyn ToString| v.to_string();
        let (name, args): (&str, Vec<String>) = match self {
            Role::Echo { wait } => ("echo", vec![value(*wait)]),
            Role::SpinFloor => ("spin-floor", vec![]),
            Role::FutexFloor => ("futex-floor", vec![]),
            Role::EchoFd => ("echo-fd", vec![]),
            Role::ShmSink => ("shm-sink", vec![]),
            Role::PlainSink => ("plain-sink", vec![]),
            Role::FdSink => ("fd-sink", vec![]),
            Role::OlSink {
                transport,
                len,
                from,
            } => ("ol-sink", vec![value(*transport), s(len), s(from)]),
            Role::CaseEcho { wait } => ("case-echo", vec![wait.clone()]),
            Role::CaseSink { wait, from } => ("case-sink", vec![wait.clone(), s(from)]),
            Role::CaseFloor { len } => ("case-floor", vec![s(len)]),
            Role::AsyncSink => ("async-sink", vec![]),
            Role::AsyncDrainSink => ("async-drain-sink", vec![]),
            Role::RemoteSink {
                port,
                segment_size,
                segment_count,
                read,
            } => (
                "remote-sink",
                vec![s(port), s(segment_size), s(segment_count), value(*read)],
            ),
            Role::TcpSink { port } => ("tcp-sink", vec![s(port)]),
            Role::TcpFramedSink { port } => ("tcp-framed-sink", vec![s(port)]),
            Role::TcpEcho { port } => ("tcp-echo", vec![s(port)]),
            Role::TcpEchoTwo { port } => ("tcp-echo-two", vec![s(port)]),
            Role::RemoteEcho { port, back } => ("remote-echo", vec![s(port), s(back)]),
            Role::DirectSink {
                port,
                segment_size,
                segment_count,
                read,
            } => (
                "direct-sink",
                vec![s(port), s(segment_size), s(segment_count), value(*read)],
            ),
            Role::DirectEcho { port, back, wait } => {
                ("direct-echo", vec![s(port), s(back), value(*wait)])
            }
            Role::NetemSend {
                kind,
                addr,
                secs,
                segment_size,
                segment_count,
                len,
            } => (
                "netem-send",
                vec![
                    value(*kind),
                    s(addr),
                    s(secs),
                    s(segment_size),
                    s(segment_count),
                    s(len),
                ],
            ),
            Role::NetemRecv {
                kind,
                addr,
                segment_size,
                segment_count,
                len,
            } => (
                "netem-recv",
                vec![
                    value(*kind),
                    s(addr),
                    s(segment_size),
                    s(segment_count),
                    s(len),
                ],
            ),
        };
        std::iter::once(name.to_owned()).chain(args).collect()
    }

    /// Plays the role in this process.
    pub(crate) fn run(self) -> Result<(), String> {
        let geometry = |segment_size, segment_count| Geometry {
            segment_size,
            segment_count,
        };
        match self {
            Role::Echo { wait } => local::echo(wait),
            Role::SpinFloor => {
                floors::spin_floor_peer();
                Ok(())
            }
            Role::FutexFloor => {
                floors::futex_floor_peer();
                Ok(())
            }
            Role::EchoFd => {
                local::echo_fd();
                Ok(())
            }
            Role::ShmSink => local::shm_sink(),
            Role::PlainSink => local::plain_sink(),
            Role::FdSink => {
                local::fd_sink();
                Ok(())
            }
            Role::OlSink {
                transport,
                len,
                from,
            } => openloop::sink(transport, len, from),
            Role::CaseEcho { wait } => case::echo(&wait),
            Role::CaseSink { wait, from } => case::sink(&wait, from),
            Role::CaseFloor { len } => {
                floors::case_floor_peer(len);
                Ok(())
            }
            Role::AsyncSink => asynch::async_sink(false),
            Role::AsyncDrainSink => asynch::async_sink(true),
            Role::RemoteSink {
                port,
                segment_size,
                segment_count,
                read,
            } => remote::remote_sink(port, geometry(segment_size, segment_count), read),
            Role::TcpSink { port } => remote::tcp_sink(port),
            Role::TcpFramedSink { port } => remote::tcp_framed_sink(port),
            Role::TcpEcho { port } => remote::tcp_echo(port),
            Role::TcpEchoTwo { port } => remote::tcp_echo_two(port),
            Role::RemoteEcho { port, back } => remote::remote_echo(port, back),
            Role::DirectSink {
                port,
                segment_size,
                segment_count,
                read,
            } => remote::direct_sink(port, geometry(segment_size, segment_count), read),
            Role::DirectEcho { port, back, wait } => remote::direct_echo(port, back, wait),
            Role::NetemSend {
                kind,
                addr,
                secs,
                segment_size,
                segment_count,
                len,
            } => netem::send(kind, addr, secs, geometry(segment_size, segment_count), len),
            Role::NetemRecv {
                kind,
                addr,
                segment_size,
                segment_count,
                len,
            } => netem::recv(kind, addr, geometry(segment_size, segment_count), len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Peer {
        #[command(subcommand)]
        role: Role,
    }

    #[test]
    fn every_role_parses_back_from_its_command_line() {
        let addr: SocketAddr = "10.233.0.1:7431".parse().unwrap();
        let roles = [
            Role::Echo {
                wait: EchoWait::Spin,
            },
            Role::Echo {
                wait: EchoWait::Parked,
            },
            Role::Echo {
                wait: EchoWait::Block,
            },
            Role::SpinFloor,
            Role::FutexFloor,
            Role::EchoFd,
            Role::ShmSink,
            Role::PlainSink,
            Role::FdSink,
            Role::OlSink {
                transport: Transport::ShmflowDefault,
                len: 32,
                from: 123_456_789_012,
            },
            Role::OlSink {
                transport: Transport::ShmflowBusyPoll,
                len: 288,
                from: 1,
            },
            Role::OlSink {
                transport: Transport::Uds,
                len: 8,
                from: 0,
            },
            Role::OlSink {
                transport: Transport::Pipe,
                len: 1344,
                from: u64::MAX,
            },
            Role::CaseEcho {
                wait: "busy-poll:50us".into(),
            },
            Role::CaseSink {
                wait: "block".into(),
                from: 42,
            },
            Role::CaseFloor { len: 256 },
            Role::AsyncSink,
            Role::AsyncDrainSink,
            Role::RemoteSink {
                port: 1,
                segment_size: 32 << 10,
                segment_count: 64,
                read: SinkRead::Drain,
            },
            Role::TcpSink { port: 2 },
            Role::TcpFramedSink { port: 3 },
            Role::TcpEcho { port: 4 },
            Role::TcpEchoTwo { port: 5 },
            Role::RemoteEcho {
                port: 6,
                back: 65535,
            },
            Role::DirectSink {
                port: 7,
                segment_size: 256 << 10,
                segment_count: 8,
                read: SinkRead::Recv,
            },
            Role::DirectEcho {
                port: 8,
                back: 9,
                wait: RttWait::Block,
            },
            Role::DirectEcho {
                port: 8,
                back: 9,
                wait: RttWait::Park,
            },
            Role::NetemSend {
                kind: Kind::Remote,
                addr,
                secs: 3.0,
                segment_size: 32 << 10,
                segment_count: 4,
                len: 32760,
            },
            Role::NetemSend {
                kind: Kind::Ping,
                addr: "127.0.0.1:0".parse().unwrap(),
                secs: 0.25,
                segment_size: 1,
                segment_count: 2,
                len: 8,
            },
            Role::NetemRecv {
                kind: Kind::Tcp,
                addr,
                segment_size: 256 << 10,
                segment_count: 512,
                len: 65536,
            },
            Role::NetemRecv {
                kind: Kind::Direct,
                addr,
                segment_size: 1,
                segment_count: 1,
                len: 1,
            },
        ];
        for role in roles {
            let argv = std::iter::once("__bench-role".to_owned()).chain(role.to_args());
            let parsed = Peer::try_parse_from(argv)
                .unwrap_or_else(|e| panic!("{role:?}: {:?}: {e}", role.to_args()));
            assert_eq!(parsed.role, role);
        }
    }
}
