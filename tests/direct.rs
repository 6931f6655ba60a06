//! Direct network ends (`net::Listener::accept_producer`, `net::connect_consumer`): records
//! cross loopback with no bridge, between threads and between processes, and against the
//! bridges on the other side.
#![cfg(feature = "net")]

use std::time::Duration;

use shmflow::net::{connect_consumer, Config, Listener};
use shmflow::{FlushPolicy, Geometry, RecvError};

fn small() -> Geometry {
    Geometry {
        segment_size: 4096,
        segment_count: 4,
    }
}

fn listener() -> (Listener, std::net::SocketAddr) {
    let l = Listener::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

#[test]
fn records_cross_between_direct_ends_in_order() {
    for policy in [FlushPolicy::EveryRecord, FlushPolicy::Explicit] {
        let (l, addr) = listener();
        let reader = std::thread::spawn(move || {
            let mut rx = connect_consumer(addr, "nums", small(), Config::default()).unwrap();
            let mut next = 0u64;
            while let Some(r) = rx.recv().unwrap() {
                let v = *r.as_pod::<u64>().unwrap();
                assert_eq!(v, next);
                next += 1;
            }
            next
        });
        let mut tx = l.accept_producer("nums", small()).unwrap();
        tx.set_flush_policy(policy);
        for i in 0..100_000u64 {
            tx.send_pod(&i).unwrap();
        }
        tx.close_timeout(Duration::from_secs(20)).unwrap();
        assert_eq!(reader.join().unwrap(), 100_000, "{policy:?}");
    }
}

#[test]
fn a_record_larger_than_a_segment_crosses_whole() {
    let (l, addr) = listener();
    let reader = std::thread::spawn(move || {
        let mut rx = connect_consumer(addr, "big", small(), Config::default()).unwrap();
        let mut got = Vec::new();
        while let Some(mut r) = rx.recv().unwrap() {
            let mut v = Vec::new();
            match r.as_bytes() {
                Some(b) => v.extend_from_slice(b),
                None => {
                    while let Some(part) = r.next_part().unwrap() {
                        v.extend_from_slice(part);
                    }
                }
            }
            got.push(v);
        }
        got
    });
    let mut tx = l.accept_producer("big", small()).unwrap();
    let big: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
    tx.send(&big).unwrap();
    tx.send(b"after").unwrap();
    drop(tx);
    let got = reader.join().unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0], big);
    assert_eq!(got[1], b"after");
}

#[test]
fn a_consumer_that_leaves_closes_the_direct_producer() {
    let (l, addr) = listener();
    let reader = std::thread::spawn(move || {
        let mut rx = connect_consumer(addr, "c", small(), Config::default()).unwrap();
        assert!(rx.recv().unwrap().is_some());
    });
    let mut tx = l.accept_producer("c", small()).unwrap();
    let mut res = Ok(());
    for _ in 0..1_000_000 {
        res = tx.send(&[7u8; 100]);
        if res.is_err() {
            break;
        }
    }
    reader.join().unwrap();
    assert!(matches!(res, Err(shmflow::SendError::Closed(_))), "{res:?}");
}

#[test]
fn a_direct_consumer_sees_a_silent_sender_dead() {
    let raw = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = raw.local_addr().unwrap();
    let cfg = Config::default().heartbeat(Duration::from_millis(20), Duration::from_millis(200));
    let mut rx = connect_consumer(addr, "s", small(), cfg).unwrap();
    let (_held, _) = raw.accept().unwrap();
    match rx.recv() {
        Err(RecvError::PeerDead(e)) => assert!(e.is_remote(), "{e}"),
        other => panic!("{:?}", other.map(|r| r.is_some())),
    };
}

#[test]
fn round_trips_over_two_direct_channels() {
    let g = small();
    let (l, addr) = listener();
    let (l2, back) = listener();
    let echo = std::thread::spawn(move || {
        let mut ping = connect_consumer(addr, "ping", g, Config::default()).unwrap();
        let mut pong = l2.accept_producer("pong", g).unwrap();
        while let Some(r) = ping.recv().unwrap() {
            let v = *r.as_pod::<u64>().unwrap();
            pong.send_pod(&v).unwrap();
        }
    });
    let mut ping = l.accept_producer("ping", g).unwrap();
    let mut pong = connect_consumer(back, "pong", g, Config::default()).unwrap();
    for i in 0..20_000u64 {
        ping.send_pod(&i).unwrap();
        let r = pong.recv().unwrap().unwrap();
        assert_eq!(r.as_pod::<u64>(), Some(&i));
    }
    drop(ping);
    assert!(pong.recv().unwrap().is_none());
    echo.join().unwrap();
}
