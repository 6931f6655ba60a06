//! Checkpoint barriers across real processes: each channel of a gate is written by a child
//! process that plays a script of records and barriers; the parent is the gate, and checks the
//! order of what it hands out against the scripts — alignment, a producer killed during an
//! alignment, a newer id cancelling, the timeout switch, and the records an unaligned barrier
//! overtook handed back exactly once.

mod common;

use std::time::{Duration, Instant};

use common::*;
use shmflow::{Alignment, Gate, GateGeometry, GateMessage, Producer, Released};

/// The child: plays `SCRIPT` on the channel it was handed. Steps, comma-separated: `r:N` (N
/// records, numbered on from the last), `b:ID:a|u|tMS` (a barrier: aligned, unaligned, aligned
/// with a timeout of MS milliseconds), `s:MS` (sleep), `hang` (wait to be killed); the
/// producer is dropped (a clean end) after the last step.
fn play() -> Result<(), String> {
    let script = std::env::var("SCRIPT").map_err(|e| e.to_string())?;
    let mut p = Producer::from_env(FD_VAR).map_err(|e| e.to_string())?;
    let mut seq = 0u64;
    for step in script.split(',') {
        let parts: Vec<&str> = step.split(':').collect();
        match parts[..] {
            ["r", n] => {
                for _ in 0..n.parse::<u64>().unwrap() {
                    p.send(&seq.to_le_bytes()).map_err(|e| e.to_string())?;
                    seq += 1;
                }
                p.flush().map_err(|e| e.to_string())?;
            }
            ["b", id, how] => {
                let alignment = match how {
                    "a" => Alignment::Aligned,
                    "u" => Alignment::Unaligned,
                    t => Alignment::AlignedWithTimeout(Duration::from_millis(
                        t[1..].parse().unwrap(),
                    )),
                };
                p.send_barrier(id.parse().unwrap(), alignment, b"")
                    .map_err(|e| e.to_string())?;
            }
            ["s", ms] => std::thread::sleep(Duration::from_millis(ms.parse().unwrap())),
            ["hang"] => std::thread::sleep(Duration::from_secs(600)),
            _ => return Err(format!("bad step {step}")),
        }
    }
    Ok(())
}

/// What the gate handed out, in order.
#[derive(Debug, PartialEq)]
enum Got {
    Rec(u32, u64),
    InFlight(u32, u64, u64),
    Barrier(u64, Released),
    Cancelled(u64),
    InFlightEnd(u64),
    End(u32),
    Dead(u32),
}

fn got(m: GateMessage<'_>) -> Got {
    let seq =
        |r: &shmflow::Record<'_>| u64::from_le_bytes(r.as_bytes().unwrap().try_into().unwrap());
    match m {
        GateMessage::Record { channel, record } => Got::Rec(channel, seq(&record)),
        GateMessage::InFlight {
            channel,
            checkpoint,
            record,
        } => Got::InFlight(channel, checkpoint, seq(&record)),
        GateMessage::Barrier { id, released, .. } => Got::Barrier(id, released),
        GateMessage::BarrierCancelled { id } => Got::Cancelled(id),
        GateMessage::InFlightEnd { id } => Got::InFlightEnd(id),
        GateMessage::EndOfPartition { channel } => Got::End(channel),
        GateMessage::ChannelDead { channel, .. } => Got::Dead(channel),
        other => panic!("unexpected {other:?}"),
    }
}

fn gate(channels: u32) -> (Gate, Vec<shmflow::PeerHandle>) {
    Gate::create_anonymous(
        GateGeometry::new(channels)
            .with_exclusive(4)
            .with_floating(2)
            .with_segment_size(4096),
    )
    .unwrap()
}

fn children(
    test: &str,
    handles: Vec<shmflow::PeerHandle>,
    scripts: &[&str],
) -> Vec<std::process::Child> {
    let kids = handles
        .iter()
        .zip(scripts)
        .map(|(h, s)| spawn(test, "player", &[("SCRIPT", s.to_string())], Some(h)))
        .collect();
    drop(handles);
    kids
}

/// Everything until every channel has ended, with a deadline.
fn read_all(gate: &mut Gate) -> Vec<Got> {
    let start = Instant::now();
    let mut out = Vec::new();
    while let Some(m) = gate.recv_timeout(Duration::from_secs(30)).unwrap() {
        out.push(got(m));
        assert!(start.elapsed() < Duration::from_secs(60), "{out:?}");
    }
    out
}

fn reap(kids: Vec<std::process::Child>) {
    for mut k in kids {
        let _ = k.wait();
    }
}

#[test]
fn barriers_align_the_channels_of_real_processes() {
    if role().is_some() {
        child_main(play);
    }
    let (mut g, handles) = gate(3);
    let script = "r:50,b:1:a,r:50,b:2:a,r:50";
    let kids = children(
        "barriers_align_the_channels_of_real_processes",
        handles,
        &[script, script, script],
    );
    let out = read_all(&mut g);
    reap(kids);
    // At each release, every channel has handed out exactly the records before the barrier.
    let mut next = [0u64; 3];
    let mut released = Vec::new();
    for m in &out {
        match *m {
            Got::Rec(c, s) => {
                assert_eq!(s, next[c as usize], "in order: {out:?}");
                next[c as usize] += 1;
            }
            Got::Barrier(id, how) => {
                assert_eq!(how, Released::Aligned);
                assert_eq!(next, [50 * id; 3], "aligned at {id}");
                released.push(id);
            }
            Got::End(c) => assert_eq!(next[c as usize], 150),
            ref other => panic!("{other:?}"),
        }
    }
    assert_eq!(released, [1, 2]);
}

#[test]
fn a_producer_killed_during_an_alignment_no_longer_counts() {
    if role().is_some() {
        child_main(play);
    }
    let (mut g, handles) = gate(2);
    let mut kids = children(
        "a_producer_killed_during_an_alignment_no_longer_counts",
        handles,
        &["r:10,b:1:a,r:10", "r:10,hang"],
    );
    // Both channels' first records, then nothing: channel 0 is held at its barrier.
    let mut out = Vec::new();
    while out.len() < 20 {
        out.push(got(g
            .recv_timeout(Duration::from_secs(30))
            .unwrap()
            .unwrap()));
    }
    assert!(
        out.iter().all(|m| matches!(m, Got::Rec(_, s) if *s < 10)),
        "{out:?}"
    );
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        matches!(g.try_recv(), Err(shmflow::TryRecvError::Empty)),
        "held"
    );
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(kids[1].id() as i32, libc::SIGKILL) };
    let _ = kids[1].wait();
    let rest = read_all(&mut g);
    reap(kids);
    assert_eq!(
        rest[..2],
        [Got::Dead(1), Got::Barrier(1, Released::Aligned)],
        "{rest:?}"
    );
    let after: Vec<_> = (10..20)
        .map(|s| Got::Rec(0, s))
        .chain([Got::End(0)])
        .collect();
    assert_eq!(rest[2..], after[..]);
}

#[test]
fn a_producer_that_ends_during_an_alignment_no_longer_counts() {
    if role().is_some() {
        child_main(play);
    }
    let (mut g, handles) = gate(2);
    let kids = children(
        "a_producer_that_ends_during_an_alignment_no_longer_counts",
        handles,
        // Channel 1 ends cleanly, without the barrier, after channel 0 is held.
        &["r:10,b:1:a,r:10", "r:10,s:500"],
    );
    let out = read_all(&mut g);
    reap(kids);
    let at = |x: &Got| {
        out.iter()
            .position(|m| m == x)
            .unwrap_or_else(|| panic!("{x:?}: {out:?}"))
    };
    assert!(
        at(&Got::End(1)) < at(&Got::Barrier(1, Released::Aligned)),
        "{out:?}"
    );
    assert!(
        at(&Got::Barrier(1, Released::Aligned)) < at(&Got::Rec(0, 10)),
        "{out:?}"
    );
    assert!(
        at(&Got::Rec(0, 9)) < at(&Got::Barrier(1, Released::Aligned)),
        "{out:?}"
    );
    assert_eq!(out.last(), Some(&Got::End(0)));
}

#[test]
fn a_newer_barrier_cancels_across_processes() {
    if role().is_some() {
        child_main(play);
    }
    let (mut g, handles) = gate(2);
    let kids = children(
        "a_newer_barrier_cancels_across_processes",
        handles,
        // Channel 1 never has checkpoint 1, and waits so that channel 0 is held at 1 first.
        &["b:1:a,r:5,b:2:a,r:5", "r:5,s:1000,b:2:a,r:5"],
    );
    let out = read_all(&mut g);
    reap(kids);
    let at = |x: &Got| {
        out.iter()
            .position(|m| m == x)
            .unwrap_or_else(|| panic!("{x:?}: {out:?}"))
    };
    assert!(
        at(&Got::Cancelled(1)) < at(&Got::Rec(0, 0)),
        "held at 1 until cancelled: {out:?}"
    );
    assert!(at(&Got::Rec(0, 4)) < at(&Got::Barrier(2, Released::Aligned)));
    assert!(at(&Got::Rec(1, 4)) < at(&Got::Barrier(2, Released::Aligned)));
    assert!(at(&Got::Barrier(2, Released::Aligned)) < at(&Got::Rec(0, 5)));
    assert!(
        !out.iter().any(|m| matches!(m, Got::Barrier(1, _))),
        "{out:?}"
    );
}

#[test]
fn an_alignment_timeout_switches_across_processes() {
    if role().is_some() {
        child_main(play);
    }
    let (mut g, handles) = gate(2);
    let kids = children(
        "an_alignment_timeout_switches_across_processes",
        handles,
        &["b:1:t100,r:5", "r:5,s:1000,b:1:t100,r:5"],
    );
    let out = read_all(&mut g);
    reap(kids);
    let switched = out
        .iter()
        .position(|m| *m == Got::Barrier(1, Released::Unaligned { timed_out: true }))
        .unwrap_or_else(|| panic!("{out:?}"));
    let end = out
        .iter()
        .position(|m| *m == Got::InFlightEnd(1))
        .expect("end");
    // Channel 0 was held until the switch; channel 1's records before its barrier that came
    // after the switch are in flight, each once, in order; those after it are plain.
    assert!(
        out[..switched].iter().all(|m| !matches!(m, Got::Rec(0, _))),
        "{out:?}"
    );
    let ch1: Vec<u64> = out
        .iter()
        .filter_map(|m| match m {
            Got::Rec(1, s) | Got::InFlight(1, 1, s) => Some(*s),
            _ => None,
        })
        .collect();
    assert_eq!(ch1, (0..10).collect::<Vec<_>>());
    for (i, m) in out.iter().enumerate() {
        if let Got::InFlight(1, 1, s) = m {
            assert!(i > switched && i < end && *s < 5, "{out:?}");
        }
        if let Got::Rec(1, s) = m {
            assert!(*s >= 5 || i < switched, "{out:?}");
        }
    }
}

#[test]
fn overtaken_records_are_handed_back_exactly_once_across_processes() {
    if role().is_some() {
        child_main(play);
    }
    let (mut g, handles) = gate(2);
    let mut kids = children(
        "overtaken_records_are_handed_back_exactly_once_across_processes",
        handles,
        &["r:150,b:1:u,r:100", "r:60,b:1:u,r:40"],
    );
    // Everything is written before the gate reads: the barriers overtake it all.
    for k in &mut kids {
        assert!(k.wait().unwrap().success());
    }
    let out = read_all(&mut g);
    assert_eq!(
        out[0],
        Got::Barrier(1, Released::Unaligned { timed_out: false }),
        "{out:?}"
    );
    for (c, before, after) in [(0u32, 150u64, 100u64), (1, 60, 40)] {
        let inflight: Vec<u64> = out
            .iter()
            .filter_map(|m| match m {
                Got::InFlight(x, 1, s) if *x == c => Some(*s),
                _ => None,
            })
            .collect();
        assert_eq!(inflight, (0..before).collect::<Vec<_>>(), "channel {c}");
        let plain: Vec<u64> = out
            .iter()
            .filter_map(|m| match m {
                Got::Rec(x, s) if *x == c => Some(*s),
                _ => None,
            })
            .collect();
        assert_eq!(
            plain,
            (before..before + after).collect::<Vec<_>>(),
            "channel {c}"
        );
    }
    // Per channel, the overtaken records all come before the ones after its barrier; the
    // in-flight data ends once every channel is past its barrier.
    let end = out
        .iter()
        .position(|m| *m == Got::InFlightEnd(1))
        .expect("end");
    for c in 0..2 {
        let last_inflight = out
            .iter()
            .rposition(|m| matches!(m, Got::InFlight(x, ..) if *x == c))
            .unwrap();
        let first_plain = out
            .iter()
            .position(|m| matches!(m, Got::Rec(x, _) if *x == c))
            .unwrap();
        assert!(
            last_inflight < first_plain && last_inflight < end,
            "{out:?}"
        );
    }
}
