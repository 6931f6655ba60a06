//! A gate whose channels are written by real child processes; one producer is killed with
//! SIGKILL mid-stream. The gate must report that channel dead (after delivering everything it
//! committed, as an intact in-order prefix), keep serving the others to their ends, and get
//! back every floating segment the dead channel held.

mod common;

use std::time::Duration;

use common::*;
use shmflow::{Gate, GateGeometry, GateMessage, Producer};

const FLOATING: u32 = 4;
const PER_CHANNEL: u64 = 4000;

fn len_of(rng: &mut Rng) -> usize {
    16 + rng.below(3000) as usize
}

#[test]
fn a_killed_producer_is_reported_dead_and_the_gate_serves_the_rest() {
    if role().as_deref() == Some("producer") {
        child_main(|| {
            let c: u64 = std::env::var("CHANNEL").unwrap().parse().unwrap();
            let mut p = Producer::from_env(FD_VAR).map_err(|e| e.to_string())?;
            let mut lens = Rng::new(c);
            let mut buf = Vec::new();
            // Channel 1 sends until it is killed; the others send PER_CHANNEL and end.
            let n = if c == 1 { u64::MAX } else { PER_CHANNEL };
            for seq in 0..n {
                make_record(seq, len_of(&mut lens), &mut buf);
                p.send(&buf).map_err(|e| e.to_string())?;
            }
            Ok(())
        });
    }
    let trials = env_u64("SHMFLOW_GATE_KILL_TRIALS", 5);
    let mut rng = Rng::new(0x6A7E);
    for trial in 0..trials {
        let gg = GateGeometry::new(3)
            .with_exclusive(2)
            .with_floating(FLOATING)
            .with_segment_size(8192);
        let (mut gate, handles) = Gate::create_anonymous(gg).unwrap();
        let mut kids: Vec<_> = handles
            .iter()
            .enumerate()
            .map(|(c, h)| {
                spawn(
                    "a_killed_producer_is_reported_dead_and_the_gate_serves_the_rest",
                    "producer",
                    &[("CHANNEL", c.to_string())],
                    Some(h),
                )
            })
            .collect();
        drop(handles);
        let kill_after = 50 + rng.below(2000);
        let mut next = [0u64; 3];
        let mut lens: Vec<Rng> = (0..3).map(Rng::new).collect();
        let mut scratch = Vec::new();
        let mut ended = [false; 3];
        let mut dead = false;
        let mut killed = false;
        let mut max_held_by_1 = 0;
        loop {
            if !killed && next[1] >= kill_after {
                max_held_by_1 = gate.metrics().channels[1].floating_held;
                // SAFETY: kill(2) on our own child.
                unsafe { libc::kill(kids[1].id() as i32, libc::SIGKILL) };
                killed = true;
            }
            let msg = gate
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|e| panic!("trial {trial}: {e}"));
            let Some(msg) = msg else { break };
            match msg {
                GateMessage::Record { channel, record } => {
                    let b = record.as_bytes().expect("records fit a segment");
                    let len = len_of(&mut lens[channel as usize]);
                    check_record(next[channel as usize], len, b, &mut scratch)
                        .unwrap_or_else(|e| panic!("trial {trial}, channel {channel}: {e}"));
                    next[channel as usize] += 1;
                }
                GateMessage::EndOfPartition { channel } => {
                    assert_ne!(channel, 1, "the killed producer never ends cleanly");
                    assert_eq!(next[channel as usize], PER_CHANNEL);
                    ended[channel as usize] = true;
                }
                GateMessage::ChannelDead { channel, error } => {
                    assert_eq!(channel, 1);
                    assert!(killed, "dead only after the kill");
                    assert_eq!(error.end(), shmflow::End::Producer, "{error}");
                    dead = true;
                }
                GateMessage::Event { .. } => panic!("no events sent"),
                GateMessage::ChannelFailed { channel, .. } => {
                    panic!("channel {channel}: no producer panics here")
                }
                other => panic!("unexpected message {other:?}"),
            }
        }
        assert!(ended[0] && ended[2] && dead, "trial {trial}");
        assert_eq!(
            gate.floating_free(),
            FLOATING as usize,
            "trial {trial}: every floating segment is back (channel 1 held {max_held_by_1})"
        );
        assert!(gate.metrics().channels.iter().all(|c| c.floating_held == 0));
        for (c, k) in kids.iter_mut().enumerate() {
            let st = k.wait().unwrap();
            assert_eq!(st.success(), c != 1, "trial {trial}: channel {c} exit {st}");
        }
        eprintln!(
            "trial {trial}: channel 1 killed after {} records (delivered {}), others {} each",
            kill_after, next[1], PER_CHANNEL
        );
    }
}

#[test]
fn a_gate_whose_consumer_crashed_is_stale_and_can_be_cleaned() {
    if role().as_deref() == Some("gate-creator") {
        let _g = Gate::create(&std::env::var("NAME").unwrap(), GateGeometry::new(2)).unwrap();
        println!("ready");
        std::thread::sleep(Duration::from_secs(60));
        std::process::exit(3);
    }
    use std::io::BufRead;
    let name = unique_name("gate-stale");
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "a_gate_whose_consumer_crashed_is_stale_and_can_be_cleaned",
        "--nocapture",
    ])
    .env(ROLE, "gate-creator")
    .env("NAME", &name)
    .stdout(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("ready") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "creator exited early"
        );
    }
    // A producer attaches and stays: the gate is not stale while it lives. It fills its
    // channel (the gate's process never reads) and blocks in `send` when the gate dies.
    let mut p = Producer::open_channel(&name, 1).unwrap();
    p.set_flush_policy(shmflow::FlushPolicy::EveryRecord);
    let blocked = std::thread::spawn(move || {
        while p.try_send(&[1; 4000]).is_ok() {}
        let r = p.send(&[2; 4000]);
        (p, r, std::time::Instant::now())
    });
    let monitor = shmflow::monitor::GateMonitor::open(&name).unwrap();
    wait_for("the producer to block in send", || {
        monitor.snapshot().channels[1].snapshot.backpressured_ns > 0
    });
    let killed = std::time::Instant::now();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let (p, r, returned) = blocked.join().unwrap();
    assert!(matches!(r, Err(shmflow::SendError::PeerDead(_))), "{r:?}");
    let noticed = returned.saturating_duration_since(killed);
    println!("the blocked producer noticed the gate's death after {noticed:?}");
    // The liveness bound is 100 ms; leave room for a loaded machine without making it a race.
    assert!(noticed < Duration::from_secs(2), "{noticed:?}");
    assert!(matches!(
        Gate::create(&name, GateGeometry::new(2)),
        Err(shmflow::OpenError::AlreadyExists { .. })
    ));
    assert!(
        !shmflow::monitor::remove_if_stale(&name).unwrap(),
        "a live producer keeps it"
    );
    drop(p);
    let e = Gate::create(&name, GateGeometry::new(2)).err().unwrap();
    assert!(matches!(e, shmflow::OpenError::Stale { .. }), "{e}");
    assert!(e.to_string().contains("shmflow clean"), "{e}");
    assert!(shmflow::monitor::remove_if_stale(&name).unwrap());
    let _g = Gate::create(&name, GateGeometry::new(2)).unwrap();
}
