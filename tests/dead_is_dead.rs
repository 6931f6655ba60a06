//! Once an end has seen its peer dead or gone, every later call on it says so at once; and a
//! caller that only ever polls with `try_` forms learns of a killed peer about as fast as a
//! blocked caller does. The peers are real child processes, killed with SIGKILL.

mod common;

use std::process::Child;
use std::time::{Duration, Instant};

use common::*;
use shmflow::{
    Consumer, End, FlushPolicy, Geometry, Producer, RecvError, RecvTimeoutError, SendError,
    SendTimeoutError, TryRecvError, TrySendError,
};

const G: Geometry = Geometry {
    segment_size: 4096,
    segment_count: 2,
};

/// A child that attaches as its role's end of the inherited region and then sleeps until it
/// is killed.
fn idle_child(role_name: &str) -> ! {
    let keep: Box<dyn std::any::Any> = match role_name {
        "producer" => {
            let mut p = Producer::from_env(FD_VAR).unwrap();
            p.set_flush_policy(FlushPolicy::EveryRecord);
            p.send(b"sent before dying").unwrap();
            Box::new(p)
        }
        _ => Box::new(Consumer::from_env(FD_VAR).unwrap()),
    };
    std::thread::sleep(Duration::from_secs(60));
    drop(keep);
    std::process::exit(3)
}

fn kill(mut child: Child) -> Instant {
    // SAFETY: kill(2) with a pid we spawned and have not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    Instant::now()
}

/// Upper bound on noticing a death: the liveness interval is 40 ms; leave room for a loaded
/// machine without turning this into a timing test.
const NOTICE: Duration = Duration::from_secs(2);

#[test]
fn a_consumer_that_only_polls_learns_of_a_killed_producer_and_it_stays_dead() {
    if let Some(r) = role() {
        idle_child(&r);
    }
    let (mut c, handle) = Consumer::create_anonymous(G).unwrap();
    let child = spawn(
        "a_consumer_that_only_polls_learns_of_a_killed_producer_and_it_stays_dead",
        "producer",
        &[],
        Some(&handle),
    );
    drop(handle);
    wait_attached(|| c.metrics().producer_state == shmflow::metrics::EndState::Attached);
    // The record committed before the death is delivered first.
    let start = Instant::now();
    loop {
        match c.try_recv() {
            Ok(Some(r)) => {
                assert_eq!(r.as_bytes().unwrap(), b"sent before dying");
                break;
            }
            Err(TryRecvError::Empty) if start.elapsed() < NOTICE => std::thread::yield_now(),
            other => panic!("expected the record, got {other:?}"),
        }
    }
    let killed = kill(child);
    let mut polls = 0u64;
    let err = loop {
        polls += 1;
        match c.try_recv() {
            Err(TryRecvError::Empty) => {
                assert!(killed.elapsed() < NOTICE, "still Empty after {polls} polls");
                std::thread::sleep(Duration::from_micros(100));
            }
            Err(TryRecvError::PeerDead(e)) => break e,
            other => panic!("expected PeerDead, got {other:?}"),
        }
    };
    let noticed = killed.elapsed();
    println!("a polling consumer noticed the kill after {noticed:?} ({polls} polls)");
    assert_eq!(err.end(), End::Producer);
    // Every later call says so at once, whatever its form.
    let t = Instant::now();
    assert!(matches!(c.try_recv(), Err(TryRecvError::PeerDead(_))));
    assert!(matches!(c.recv(), Err(RecvError::PeerDead(_))));
    assert!(matches!(
        c.recv_timeout(Duration::from_secs(30)),
        Err(RecvTimeoutError::PeerDead(_))
    ));
    assert!(matches!(
        c.recv_message_timeout(Duration::from_secs(30)),
        Err(RecvTimeoutError::PeerDead(_))
    ));
    let drained = c.drain(usize::MAX, |_| Ok::<_, RecvError>(()));
    assert!(
        matches!(drained, Err(RecvError::PeerDead(_))),
        "{drained:?}"
    );
    assert!(
        t.elapsed() < NOTICE,
        "later calls must not wait: {:?}",
        t.elapsed()
    );
}

#[test]
fn a_producer_that_only_polls_learns_of_a_killed_consumer_and_it_stays_dead() {
    if let Some(r) = role() {
        idle_child(&r);
    }
    let (mut p, handle) = Producer::create_anonymous(G).unwrap();
    p.set_flush_policy(FlushPolicy::EveryRecord);
    let child = spawn(
        "a_producer_that_only_polls_learns_of_a_killed_consumer_and_it_stays_dead",
        "consumer",
        &[],
        Some(&handle),
    );
    drop(handle);
    wait_attached(|| p.metrics().consumer_state == shmflow::metrics::EndState::Attached);
    // Fill the pool: the consumer never reads, so the producer is out of segments.
    let rec = [1u8; 3000];
    while p.try_send(&rec).is_ok() {}
    let killed = kill(child);
    let err = loop {
        match p.try_send(&rec) {
            Err(TrySendError::Full) => {
                assert!(killed.elapsed() < NOTICE, "still Full long after the kill");
                std::thread::sleep(Duration::from_micros(100));
            }
            Err(TrySendError::PeerDead(e)) => break e,
            other => panic!("expected PeerDead, got {other:?}"),
        }
    };
    println!(
        "a polling producer noticed the kill after {:?}",
        killed.elapsed()
    );
    assert_eq!(err.end(), End::Consumer);
    let t = Instant::now();
    assert!(matches!(p.flush(), Err(SendError::PeerDead(_))));
    assert!(matches!(p.send(b"x"), Err(SendError::PeerDead(_))));
    assert!(matches!(p.try_send(b"x"), Err(TrySendError::PeerDead(_))));
    assert!(matches!(
        p.send_timeout(b"x", Duration::from_secs(30)),
        Err(SendTimeoutError::PeerDead(_))
    ));
    assert!(matches!(p.claim(8).err(), Some(SendError::PeerDead(_))));
    assert!(matches!(p.send_event(1, b"e"), Err(SendError::PeerDead(_))));
    assert!(matches!(
        p.send_priority_event(1, b"e"),
        Err(SendError::PeerDead(_))
    ));
    assert!(t.elapsed() < NOTICE, "later calls must not wait");
}

#[test]
fn a_consumer_that_left_is_closed_for_every_later_call() {
    let (mut p, handle) = Producer::create_anonymous(G).unwrap();
    let c = Consumer::from_fd(handle.into_fd()).unwrap();
    p.send(b"before").unwrap();
    drop(c);
    // The producer notices when it next needs a segment or flushes...
    assert!(matches!(p.flush(), Err(SendError::Closed(_))));
    // ...and from then on every call says so, even one that would fit in the segment in hand.
    assert!(matches!(p.send(b"small"), Err(SendError::Closed(_))));
    assert!(matches!(p.try_send(b"small"), Err(TrySendError::Closed(_))));
    assert!(matches!(p.claim(8).err(), Some(SendError::Closed(_))));
    assert!(matches!(p.flush(), Err(SendError::Closed(_))));
    assert!(p.is_closed());
}

#[test]
fn a_producer_dropped_while_panicking_ends_the_stream_as_failed() {
    if role().as_deref() == Some("panicker") {
        let mut p = Producer::from_env(FD_VAR).unwrap();
        p.set_flush_policy(FlushPolicy::EveryRecord);
        for i in 0..3u8 {
            p.send(&[i; 8]).unwrap();
        }
        // Unwinding drops the producer: the stream ends as failed, not cleanly.
        panic!("a stage fails with its producer in scope");
    }
    let (mut c, handle) = Consumer::create_anonymous(G).unwrap();
    let mut child = spawn_quiet(
        "a_producer_dropped_while_panicking_ends_the_stream_as_failed",
        "panicker",
        Some(&handle),
    );
    drop(handle);
    for i in 0..3u8 {
        let r = c
            .recv()
            .unwrap()
            .expect("every record committed before the panic");
        assert_eq!(r.as_bytes(), Some(&[i; 8][..]));
    }
    match c.recv() {
        Err(RecvError::ProducerFailed(e)) => assert_eq!(e.pid(), child.id()),
        Err(e) => panic!("expected ProducerFailed, got {e}"),
        Ok(r) => panic!("expected ProducerFailed, got {r:?}"),
    }
    // Distinct from a clean end, and it stays so.
    assert!(matches!(c.try_recv(), Err(TryRecvError::ProducerFailed(_))));
    assert_eq!(
        c.metrics().producer_state,
        shmflow::metrics::EndState::Failed
    );
    assert!(!child.wait().unwrap().success(), "the child panicked");
}

#[test]
fn a_gate_reports_a_channel_whose_producer_panicked() {
    use shmflow::{Gate, GateGeometry, GateMessage};
    let name = common::unique_name("gate-panicked");
    let mut gate = Gate::create(&name, GateGeometry::new(2)).unwrap();
    let n = name.clone();
    let t = std::thread::spawn(move || {
        let mut p = Producer::open_channel(&n, 1).unwrap();
        p.send(b"before").unwrap();
        p.flush().unwrap();
        panic!("the stage fails");
    });
    assert!(t.join().is_err());
    let clean = Producer::open_channel(&name, 0).unwrap();
    drop(clean);
    let mut seen = Vec::new();
    while let Some(m) = gate.recv().unwrap() {
        seen.push(match m {
            GateMessage::Record { channel, record } => {
                format!(
                    "{channel}:{}",
                    String::from_utf8_lossy(record.as_bytes().unwrap())
                )
            }
            GateMessage::EndOfPartition { channel } => format!("{channel}:end"),
            GateMessage::ChannelFailed { channel, .. } => format!("{channel}:failed"),
            other => panic!("{other:?}"),
        });
    }
    seen.sort();
    assert_eq!(seen, ["0:end", "1:before", "1:failed"]);
}

/// A child that holds the inherited handle without attaching, until it is killed.
fn holding_child() -> ! {
    std::thread::sleep(Duration::from_secs(60));
    std::process::exit(3)
}

#[test]
fn a_consumer_whose_producer_is_killed_before_attaching_is_told_it_never_attached() {
    if role().is_some() {
        holding_child();
    }
    let (mut c, handle) = Consumer::create_anonymous(G).unwrap();
    let child = spawn(
        "a_consumer_whose_producer_is_killed_before_attaching_is_told_it_never_attached",
        "holder",
        &[],
        Some(&handle),
    );
    drop(handle);
    // While the child holds the handle, a producer may still come: the consumer waits.
    assert!(matches!(
        c.recv_timeout(Duration::from_millis(200)),
        Err(RecvTimeoutError::Timeout)
    ));
    let killed = kill(child);
    let err = match c.recv() {
        Err(RecvError::PeerDead(e)) => e,
        other => panic!("expected PeerDead, got {other:?}"),
    };
    println!("noticed after {:?}: {err}", killed.elapsed());
    assert!(killed.elapsed() < NOTICE, "{:?}", killed.elapsed());
    assert!(err.never_attached(), "{err}");
    assert_eq!((err.end(), err.pid()), (End::Producer, 0));
    assert!(
        err.to_string().contains("no producer ever attached"),
        "{err}"
    );
    // Every later call says so at once.
    assert!(matches!(c.try_recv(), Err(TryRecvError::PeerDead(e)) if e.never_attached()));
}

#[test]
fn a_producer_whose_consumer_is_killed_before_attaching_stops_waiting_for_room() {
    if role().is_some() {
        holding_child();
    }
    let (mut p, handle) = Producer::create_anonymous(G).unwrap();
    p.set_flush_policy(FlushPolicy::EveryRecord);
    let child = spawn(
        "a_producer_whose_consumer_is_killed_before_attaching_stops_waiting_for_room",
        "holder",
        &[],
        Some(&handle),
    );
    drop(handle);
    let rec = [1u8; 3000];
    while p.try_send(&rec).is_ok() {}
    assert!(matches!(
        p.send_timeout(&rec, Duration::from_millis(200)),
        Err(SendTimeoutError::Timeout)
    ));
    let killed = kill(child);
    let err = match p.send(&rec) {
        Err(SendError::PeerDead(e)) => e,
        other => panic!("expected PeerDead, got {other:?}"),
    };
    assert!(killed.elapsed() < NOTICE, "{:?}", killed.elapsed());
    assert!(err.never_attached(), "{err}");
    assert_eq!(err.end(), End::Consumer);
    assert!(
        err.to_string().contains("no consumer ever attached"),
        "{err}"
    );
}

#[test]
fn a_handle_dropped_unused_ends_the_wait_and_a_kept_one_does_not() {
    let (mut c, handle) = Consumer::create_anonymous(G).unwrap();
    assert!(matches!(
        c.recv_timeout(Duration::from_millis(100)),
        Err(RecvTimeoutError::Timeout)
    ));
    drop(handle);
    assert!(matches!(c.recv(), Err(RecvError::PeerDead(e)) if e.never_attached()));
    // A handle taken by a thread of this process: its producer attaches and ends the stream.
    let (mut c, handle) = Consumer::create_anonymous(G).unwrap();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let mut p = Producer::from_handle(handle).unwrap();
        p.send(b"late but here").unwrap();
    });
    assert_eq!(
        c.recv().unwrap().unwrap().as_bytes(),
        Some(&b"late but here"[..])
    );
    assert!(c.recv().unwrap().is_none());
    t.join().unwrap();
}

#[test]
fn a_gate_reports_a_channel_whose_handle_is_gone_unused_and_goes_on() {
    use shmflow::{Gate, GateGeometry, GateMessage};
    let (mut gate, handles) = Gate::create_anonymous(GateGeometry::new(3)).unwrap();
    let mut handles = handles.into_iter();
    let mut p0 = Producer::from_handle(handles.next().unwrap()).unwrap();
    let unused = handles.next().unwrap();
    let kept = handles.next().unwrap();
    p0.send(b"zero").unwrap();
    p0.flush().unwrap();
    drop(unused);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match gate.recv_timeout(Duration::from_secs(10)).unwrap() {
            Some(GateMessage::Record { channel, record }) => seen.push(format!(
                "{channel}:{}",
                String::from_utf8_lossy(record.as_bytes().unwrap())
            )),
            Some(GateMessage::ChannelDead { channel, error }) => {
                assert!(error.never_attached(), "{error}");
                seen.push(format!("{channel}:never attached"));
            }
            other => panic!("{other:?}"),
        }
    }
    seen.sort();
    assert_eq!(seen, ["0:zero", "1:never attached"]);
    // The kept handle's channel is waited for; the channel that ended ends.
    drop(p0);
    assert!(matches!(
        gate.recv_timeout(Duration::from_secs(10)).unwrap(),
        Some(GateMessage::EndOfPartition { channel: 0 })
    ));
    assert!(matches!(
        gate.recv_timeout(Duration::from_millis(200)),
        Err(shmflow::RecvTimeoutError::Timeout)
    ));
    drop(kept);
    assert!(matches!(
        gate.recv_timeout(Duration::from_secs(10)).unwrap(),
        Some(GateMessage::ChannelDead { channel: 2, .. })
    ));
    assert!(gate.recv().unwrap().is_none());
}

#[test]
fn close_timeout_stops_waiting_for_a_consumer_whose_handle_is_gone_unused() {
    let (mut p, handle) = Producer::create_anonymous(G).unwrap();
    p.send(b"never read").unwrap();
    drop(handle);
    let t = Instant::now();
    match p.close_timeout(Duration::from_secs(30)) {
        Err(shmflow::CloseError::PeerDead(e)) => assert!(e.never_attached(), "{e}"),
        other => panic!("expected PeerDead, got {other:?}"),
    }
    assert!(t.elapsed() < NOTICE, "{:?}", t.elapsed());
}
