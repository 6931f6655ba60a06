//! Direct network ends (`net::Listener::accept_producer`, `net::connect_consumer`): records,
//! spanning records, events, priority events and barriers cross loopback intact and in order,
//! credit blocks the producer, a consumer that leaves closes the channel, a silent or broken
//! peer is reported — for two direct ends, and for a direct end facing a bridge on either side
//! (`net::Client` receiving from a direct producer, `net::Server` sending to a direct
//! consumer), since both speak one protocol.
#![cfg(feature = "net")]

mod common;
#[path = "common/pki.rs"]
mod pki;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use shmflow::net::{connect_consumer, connect_gate_channel, Client, Config, Listener, Server};
use shmflow::{
    Alignment, Consumer, FlushPolicy, Gate, GateGeometry, GateMessage, Geometry, Message, Producer,
    RecvError, RecvTimeoutError, Released, SendError, TryRecvError, WaitStrategy,
};

fn small() -> Geometry {
    Geometry {
        segment_size: 4096,
        segment_count: 4,
    }
}

fn listener() -> (Listener, SocketAddr) {
    listener_with(Config::default())
}

fn listener_with(config: Config) -> (Listener, SocketAddr) {
    let l = Listener::bind("127.0.0.1:0".parse().unwrap(), config).unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

/// Which ends face each other.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// A direct producer, a direct consumer.
    Direct,
    /// A direct producer; a `Client` bridge feeding a local channel.
    DirectToBridge,
    /// A local channel a `Server` bridge forwards; a direct consumer.
    BridgeToDirect,
}

const KINDS: [Kind; 3] = [Kind::Direct, Kind::DirectToBridge, Kind::BridgeToDirect];

/// A producer here and a consumer there, over loopback, and the thread that runs the bridge
/// (if any) until its channel ends.
fn remote_pair(
    kind: Kind,
    g: Geometry,
) -> (Producer, Consumer, Option<std::thread::JoinHandle<()>>) {
    remote_pair_with(kind, g, Config::default(), Config::default())
}

/// As [`remote_pair`], the sending side with `tx_cfg` and the receiving side with `rx_cfg`.
fn remote_pair_with(
    kind: Kind,
    g: Geometry,
    tx_cfg: Config,
    rx_cfg: Config,
) -> (Producer, Consumer, Option<std::thread::JoinHandle<()>>) {
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    match kind {
        Kind::Direct => {
            let (l, addr) = listener_with(tx_cfg);
            let rx = std::thread::spawn(move || connect_consumer(addr, "chan", g, rx_cfg));
            let tx = l.accept_producer("chan", g).unwrap();
            (tx, rx.join().unwrap().unwrap(), None)
        }
        Kind::DirectToBridge => {
            let (l, addr) = listener_with(tx_cfg);
            let (local_tx, rx) = shmflow::pair(g).unwrap();
            let bridge = std::thread::spawn(move || {
                rt().block_on(async move {
                    let mut c = Client::connect(addr, rx_cfg).await.unwrap();
                    c.import("chan", local_tx).unwrap();
                    let out = c.run().await;
                    eprintln!("client: {out:?}");
                })
            });
            let tx = l.accept_producer("chan", g).unwrap();
            (tx, rx, Some(bridge))
        }
        Kind::BridgeToDirect => {
            let (tx, local_rx) = shmflow::pair(g).unwrap();
            let (addr_tx, addr_rx) = std::sync::mpsc::channel();
            let bridge = std::thread::spawn(move || {
                rt().block_on(async move {
                    let mut s = Server::bind("127.0.0.1:0".parse().unwrap(), tx_cfg)
                        .await
                        .unwrap();
                    addr_tx.send(s.local_addr().unwrap()).unwrap();
                    s.export("chan", local_rx).unwrap();
                    let out = s.run().await;
                    eprintln!("server: {out:?}");
                })
            });
            let addr = addr_rx.recv().unwrap();
            let rx = connect_consumer(addr, "chan", g, rx_cfg).unwrap();
            (tx, rx, Some(bridge))
        }
    }
}

fn record(i: u64) -> Vec<u8> {
    // Sizes from 0 to well past a segment, so that some records span.
    let len = match i % 7 {
        0 => 0,
        1 => 8,
        2 => 64,
        3 => 1000,
        4 => 4088,
        5 => 9000,
        _ => 200,
    };
    (0..len).map(|k| (i as usize * 31 + k) as u8).collect()
}

#[test]
fn records_events_and_spanning_records_arrive_in_order() {
    for kind in KINDS {
        for policy in [
            FlushPolicy::EveryRecord,
            FlushPolicy::Explicit,
            FlushPolicy::Timeout(Duration::from_millis(1)),
        ] {
            let (mut tx, mut rx, bridge) = remote_pair(kind, small());
            let n = 3000u64;
            let reader = std::thread::spawn(move || {
                let (mut i, mut events) = (0u64, 0u64);
                while let Some(m) = rx.recv_message().unwrap() {
                    match m {
                        Message::Record(r) => {
                            assert_eq!(r.to_vec().unwrap(), record(i), "record {i}");
                            i += 1;
                        }
                        Message::Event(e) => {
                            assert_eq!(e.kind, 7);
                            assert_eq!(e.payload, &(events * 100).to_le_bytes());
                            events += 1;
                        }
                        other => panic!("unexpected message {other:?}"),
                    }
                }
                // What the receiving side counted as written, as it checked the frames.
                let m = rx.metrics();
                (i, events, m.records_written, m.bytes_written)
            });
            tx.set_flush_policy(policy);
            let mut bytes = 0u64;
            for i in 0..n {
                if i % 100 == 0 {
                    tx.send_event(7, &i.to_le_bytes()).unwrap();
                }
                let r = record(i);
                bytes += r.len() as u64;
                tx.send(&r).unwrap();
            }
            if kind != Kind::BridgeToDirect {
                // A direct sending end counts what it forwarded as a reader would (once
                // `flush` returns, everything is on the wire).
                tx.flush().unwrap();
                let m = tx.metrics();
                assert_eq!(
                    (m.records_read, m.bytes_read),
                    (n, bytes),
                    "{kind:?} {policy:?}"
                );
            }
            tx.close_timeout(Duration::from_secs(20))
                .unwrap_or_else(|e| panic!("{kind:?} {policy:?}: {e}"));
            assert_eq!(
                reader.join().unwrap(),
                (n, n / 100, n, bytes),
                "{kind:?} {policy:?}"
            );
            if let Some(b) = bridge {
                b.join().unwrap();
            }
        }
    }
}

/// What a reader saw, in order.
#[derive(Debug, PartialEq)]
enum Seen {
    Record(u64),
    /// A barrier: its id, and whether it was the announcement from the priority lane.
    Barrier(u64, bool),
}

#[test]
fn barriers_cross_in_their_place_and_an_unaligned_one_is_announced_ahead() {
    for kind in KINDS {
        let (mut tx, mut rx, bridge) = remote_pair(kind, small());
        let reader = std::thread::spawn(move || {
            let mut seen = Vec::new();
            while let Some(m) = rx.recv_message().unwrap() {
                match m {
                    Message::Record(r) => {
                        let b = r.to_vec().unwrap();
                        seen.push(Seen::Record(u64::from_le_bytes(b[..8].try_into().unwrap())));
                    }
                    Message::Barrier(b) => {
                        assert_eq!(b.payload, &b.id.to_le_bytes(), "{kind:?}");
                        seen.push(Seen::Barrier(b.id, b.priority));
                    }
                    other => panic!("{kind:?}: unexpected message {other:?}"),
                }
            }
            seen
        });
        let rec = |i: u64| {
            let mut v = i.to_le_bytes().to_vec();
            v.resize(200, 0x42);
            v
        };
        for i in 0..300 {
            tx.send(&rec(i)).unwrap();
            match i {
                99 => tx.send_barrier(1, Alignment::Aligned, &1u64.to_le_bytes()),
                199 => tx.send_barrier(2, Alignment::Unaligned, &2u64.to_le_bytes()),
                _ => Ok(()),
            }
            .unwrap();
        }
        tx.close_timeout(Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        let seen = reader.join().unwrap();
        // In their place, between the records sent before and after them.
        let at = |s: &Seen| seen.iter().position(|x| x == s).unwrap();
        let records: Vec<u64> = seen
            .iter()
            .filter_map(|s| match s {
                Seen::Record(i) => Some(*i),
                _ => None,
            })
            .collect();
        assert_eq!(records, (0..300).collect::<Vec<_>>(), "{kind:?}");
        let (b1, b2) = (at(&Seen::Barrier(1, false)), at(&Seen::Barrier(2, false)));
        assert_eq!(b1, at(&Seen::Record(99)) + 1, "{kind:?}: {seen:?}");
        assert!(b2 > at(&Seen::Record(199)), "{kind:?}: {seen:?}");
        assert_eq!(b2, at(&Seen::Record(200)) - 1, "{kind:?}: {seen:?}");
        // The unaligned one announced through the priority lane, ahead of its place; the
        // aligned one not at all.
        assert!(at(&Seen::Barrier(2, true)) < b2, "{kind:?}: {seen:?}");
        assert!(
            !seen.contains(&Seen::Barrier(1, true)),
            "{kind:?}: {seen:?}"
        );
        if let Some(b) = bridge {
            b.join().unwrap();
        }
    }
}

#[test]
fn a_record_sent_is_on_its_way_when_send_returns() {
    // A lone record with the default policy arrives while the producer waits elsewhere
    // (here: for the answer), in a round trip over two channels; under every wait strategy
    // of the receiving ends (a bounded look that reads the socket without waiting, a busy
    // poll, a blocking read at once).
    let waits = [
        WaitStrategy::Block,
        WaitStrategy::BusyPoll(Duration::from_micros(20)),
        WaitStrategy::Park,
    ];
    for kind in KINDS {
        for wait in waits {
            let (mut ping, mut ping_rx, b1) = remote_pair(kind, small());
            let (mut pong_tx, mut pong, b2) = remote_pair(kind, small());
            ping_rx.set_wait_strategy(wait);
            pong.set_wait_strategy(wait);
            // Nothing sent yet: a bounded wait ends with nothing, whatever the look before it.
            assert!(
                matches!(
                    pong.recv_timeout(Duration::from_millis(2)),
                    Err(RecvTimeoutError::Timeout)
                ),
                "{kind:?} {wait:?}"
            );
            let echo = std::thread::spawn(move || {
                while let Some(r) = ping_rx.recv().unwrap() {
                    let v = *r.as_pod::<u64>().unwrap();
                    pong_tx.send_pod(&v).unwrap();
                }
            });
            // Enough to go round every segment of both channels many times.
            for i in 0..2_000u64 {
                ping.send_pod(&i).unwrap();
                let r = pong.recv().unwrap().unwrap();
                assert_eq!(r.as_pod::<u64>(), Some(&i), "{kind:?} {wait:?}");
            }
            drop(ping);
            assert!(pong.recv().unwrap().is_none());
            echo.join().unwrap();
            for b in [b1, b2].into_iter().flatten() {
                b.join().unwrap();
            }
        }
    }
}

#[test]
fn under_a_timeout_policy_a_record_goes_out_within_the_interval_with_no_further_call() {
    for kind in [Kind::Direct, Kind::DirectToBridge] {
        let (mut tx, mut rx, bridge) = remote_pair(kind, small());
        tx.set_flush_policy(FlushPolicy::Timeout(Duration::from_millis(5)));
        for i in 0..3u64 {
            tx.send_pod(&i).unwrap();
            // The producer makes no call while the consumer waits: the keeper forwards.
            let r = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(
                r.and_then(|r| r.as_pod::<u64>().copied()),
                Some(i),
                "{kind:?}"
            );
        }
        drop(tx);
        assert!(rx.recv().unwrap().is_none());
        if let Some(b) = bridge {
            b.join().unwrap();
        }
    }
}

#[test]
fn segments_waiting_for_credit_go_out_when_it_comes_while_the_producer_makes_no_call() {
    for kind in [Kind::Direct, Kind::DirectToBridge] {
        let (mut tx, mut rx, bridge) = remote_pair(kind, small());
        // Six segments' worth (4 records of 1000 B each) with nobody reading: four go out on
        // the receiver's credit, the others wait for it in the sender's own segments.
        let n = 4 * 6u64;
        for i in 0..n {
            let mut r = vec![(i % 251) as u8; 1000];
            r[..8].copy_from_slice(&i.to_le_bytes());
            tx.send(&r).unwrap();
        }
        // Nobody reads: a flush that may not wait for the credit says so, and sends nothing
        // twice.
        assert!(
            matches!(tx.try_flush(), Err(shmflow::TrySendError::Full)),
            "{kind:?}"
        );
        assert!(
            matches!(
                tx.flush_timeout(Duration::from_millis(20)),
                Err(shmflow::SendTimeoutError::Timeout)
            ),
            "{kind:?}"
        );
        // Now the consumer reads, and the producer's thread makes no call until it has all:
        // the credit it hands back is taken, and what waited forwarded, by the sending end's
        // keeper.
        let reader = std::thread::spawn(move || {
            for i in 0..n {
                let r = match rx.recv_timeout(Duration::from_secs(10)) {
                    Ok(Some(r)) => r,
                    other => panic!("{kind:?}: record {i}: {other:?}"),
                };
                let b = r.as_bytes().unwrap();
                assert_eq!(b[..8], i.to_le_bytes(), "{kind:?}");
                assert!(b[8..].iter().all(|&x| x == (i % 251) as u8), "{kind:?}");
            }
            rx
        });
        let mut rx = reader.join().unwrap();
        tx.close_timeout(Duration::from_secs(20)).unwrap();
        assert!(rx.recv().unwrap().is_none(), "{kind:?}");
        if let Some(b) = bridge {
            b.join().unwrap();
        }
    }
}

#[test]
fn a_producer_that_keeps_sending_within_a_segment_takes_the_credit_that_comes() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    for kind in [Kind::Direct, Kind::DirectToBridge] {
        let (mut tx, mut rx, bridge) = remote_pair(kind, small());
        // Four segments of four 1000 B records spend the credit; a fifth segment waits for
        // it with one record and room for 193 records of 8 B (16 B frames) more.
        for _ in 0..17 {
            tx.send(&[1u8; 1000]).unwrap();
        }
        let got = Arc::new(AtomicBool::new(false));
        let flag = got.clone();
        let reader = std::thread::spawn(move || {
            for i in 0..17 {
                match rx.recv_timeout(Duration::from_secs(20)) {
                    Ok(Some(r)) => assert_eq!(r.len(), Some(1000), "{kind:?}: record {i}"),
                    other => panic!("{kind:?}: record {i}: {other:?}"),
                }
            }
            flag.store(true, Ordering::Release);
            let mut small = 0;
            while let Some(r) = rx.recv().unwrap() {
                assert_eq!(r.len(), Some(8), "{kind:?}");
                small += 1;
            }
            small
        });
        // The producer keeps sending small records into the waiting segment, a call more
        // often than its keeper would take it for away: the credit its consumer hands back
        // must reach it through these calls, before the segment fills and a new one is
        // published.
        let mut sent = 0u64;
        while !got.load(Ordering::Acquire) {
            assert!(
                sent < 193,
                "{kind:?}: the waiting segment filled before its credit was taken"
            );
            tx.send(&sent.to_le_bytes()).unwrap();
            sent += 1;
            std::thread::sleep(Duration::from_micros(200));
        }
        tx.close_timeout(Duration::from_secs(20)).unwrap();
        assert_eq!(reader.join().unwrap(), sent, "{kind:?}");
        if let Some(b) = bridge {
            b.join().unwrap();
        }
    }
}

#[test]
fn a_slow_consumer_blocks_the_remote_producer_and_a_priority_event_overtakes() {
    for kind in KINDS {
        let (mut tx, mut rx, bridge) = remote_pair(kind, small());
        // Nobody reads: the producer fills what credit and its own segments allow (and a
        // bridge's), then blocks.
        let mut sent = 0u64;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(2) {
            match tx.send_timeout(&[1u8; 1000], Duration::from_millis(200)) {
                Ok(()) => sent += 1,
                Err(shmflow::SendTimeoutError::Timeout) => break,
                Err(e) => panic!("{kind:?}: {e}"),
            }
        }
        // 4 records of 1000 bytes per 4 KiB segment, at most 4 segments per channel on the
        // way (12 with a bridge's local channel), plus the one being written.
        let most = if kind == Kind::Direct { 4 * 9 } else { 4 * 13 };
        assert!(
            sent <= most,
            "{kind:?}: sent {sent} records with nobody reading"
        );
        assert!(sent >= 4 * 4, "{kind:?}: sent only {sent}");
        assert!(tx.metrics().backpressured_ns > 0);
        if kind != Kind::BridgeToDirect {
            // What `metrics().link` shows of a direct sending end: no credit left, the
            // receiver's four segments' worth on the wire.
            let link = tx.metrics().link.expect("the sending end's figures");
            assert!(link.sending, "{link:?}");
            assert_eq!(link.credit, 0, "{kind:?}: {link:?}");
            assert!(link.wire_bytes >= 4 * 4000, "{kind:?}: {link:?}");
        }
        // A priority event overtakes the records that wait for credit: it comes before the
        // last of them (without the overtaking it would come after every record sent).
        tx.send_priority_event(5, b"urgent").unwrap();
        let mut before = 0u64;
        loop {
            match rx.recv_message_timeout(Duration::from_secs(5)).unwrap() {
                Some(Message::Event(e)) => {
                    assert_eq!((e.kind, e.payload), (5, &b"urgent"[..]));
                    break;
                }
                Some(Message::Record(_)) => before += 1,
                other => panic!("{kind:?}: expected records or the event, got {other:?}"),
            }
            assert!(
                before < sent,
                "{kind:?}: the event came after every record sent before it"
            );
        }
        let reader = std::thread::spawn(move || {
            let mut n = before;
            while let Some(r) = rx.recv().unwrap() {
                assert_eq!(r.as_bytes().unwrap(), &[1u8; 1000][..]);
                n += 1;
            }
            n
        });
        tx.close_timeout(Duration::from_secs(20)).unwrap();
        assert_eq!(reader.join().unwrap(), sent, "{kind:?}");
        if let Some(b) = bridge {
            b.join().unwrap();
        }
    }
}

#[test]
fn priority_events_beyond_the_lane_wait_in_the_socket_for_a_direct_consumer() {
    // Priority events are not covered by credit. A direct consumer that is away (nothing
    // reads the socket but its own calls) while hundreds arrive, with records between them,
    // gets all of them in order once it reads: what does not fit its lane waits in the
    // socket, not in a queue that would end the channel when it overflows.
    for kind in [Kind::Direct, Kind::BridgeToDirect] {
        let (mut tx, mut rx, bridge) = remote_pair(kind, small());
        let n = 600u64;
        // The writer sends everything while the consumer is away (600 records of 8 bytes fit
        // in the receiver's credit; events take none).
        let (done_tx, done) = std::sync::mpsc::channel();
        let writer = std::thread::spawn(move || {
            for i in 0..n {
                tx.send_priority_event(3, &i.to_le_bytes()).unwrap();
                tx.send(&i.to_le_bytes()).unwrap();
            }
            tx.flush().unwrap();
            done_tx.send(()).unwrap();
            tx
        });
        done.recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{kind:?}: the writer blocked with the consumer away"));
        drop(writer.join().unwrap());
        let (mut events, mut records) = (0u64, 0u64);
        while let Some(m) = rx.recv_message().unwrap() {
            match m {
                Message::Event(e) => {
                    assert_eq!(
                        (e.kind, e.payload),
                        (3, &events.to_le_bytes()[..]),
                        "{kind:?}"
                    );
                    events += 1;
                }
                Message::Record(r) => {
                    assert_eq!(r.as_pod::<u64>(), Some(&records), "{kind:?}");
                    records += 1;
                    // Each record comes after the event sent before it.
                    assert!(
                        events >= records,
                        "{kind:?}: record {records} before its event"
                    );
                }
                other => panic!("{kind:?}: unexpected message {other:?}"),
            }
        }
        assert_eq!((events, records), (n, n), "{kind:?}");
        if let Some(b) = bridge {
            b.join().unwrap();
        }
    }
}

#[test]
fn a_reader_of_records_gets_them_past_more_priority_events_than_the_lane_holds() {
    // `recv` skips events, while it waits too: a direct consumer waiting for a record behind
    // more priority events than its lane holds gets it (and so does `recv_async`).
    for kind in KINDS {
        for asynch in [false, true] {
            let (mut tx, mut rx, bridge) = remote_pair(kind, small());
            let (done_tx, done_rx) = std::sync::mpsc::channel();
            let (started_tx, started) = std::sync::mpsc::channel();
            let reader = std::thread::spawn(move || {
                let mut got = Vec::new();
                // The writer starts once the reader is about to wait for its first record.
                started_tx.send(()).unwrap();
                if asynch {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap()
                        .block_on(async {
                            while let Some(r) = rx.recv_async().await.unwrap() {
                                got.push(*r.as_pod::<u64>().unwrap());
                            }
                        });
                } else {
                    while let Some(r) = rx.recv().unwrap() {
                        got.push(*r.as_pod::<u64>().unwrap());
                    }
                }
                done_tx.send(()).unwrap();
                got
            });
            started.recv_timeout(Duration::from_secs(10)).unwrap();
            for i in 0..5u64 {
                for k in 0..20u64 {
                    tx.send_priority_event_timeout(3, &k.to_le_bytes(), Duration::from_secs(10))
                        .unwrap_or_else(|e| panic!("{kind:?} async {asynch}: {e}"));
                }
                tx.send_pod(&i).unwrap();
            }
            drop(tx);
            done_rx
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("{kind:?} async {asynch}: the records never came"));
            assert_eq!(
                reader.join().unwrap(),
                (0..5).collect::<Vec<_>>(),
                "{kind:?}"
            );
            if let Some(b) = bridge {
                b.join().unwrap();
            }
        }
    }
}

#[test]
fn a_direct_sender_is_told_why_a_bridge_ended_its_channel() {
    // A bridge's consumer that takes no priority events: the bridge reads on its own, so they
    // pile up there (the lane's four, then 256 held behind it), and one more ends the channel.
    // The bridge says why, and the direct sender hears it (before its next event: events need
    // no credit, so it would otherwise never read) and carries it in its error.
    let (mut tx, mut rx, bridge) = remote_pair(Kind::DirectToBridge, small());
    let mut n = 0u64;
    let told = loop {
        match tx.send_priority_event_timeout(3, &n.to_le_bytes(), Duration::from_secs(10)) {
            Ok(()) => n += 1,
            Err(shmflow::SendTimeoutError::PeerDead(e)) if e.is_remote() => break e,
            Err(e) => panic!("after {n} events: {e}"),
        }
    };
    assert!(n > 4 + 256, "{n} events sent");
    assert!(
        told.cause().is_some_and(|c| c.contains("priority")),
        "{told:?}"
    );
    assert!(told.to_string().contains("priority"), "{told}");
    // The consumer gets the events that reached its lane, in order, then the failure.
    let mut k = 0u64;
    let end = loop {
        match rx.recv_message() {
            Ok(Some(Message::Event(e))) => {
                assert_eq!((e.kind, e.payload), (3, &k.to_le_bytes()[..]));
                k += 1;
            }
            other => break format!("{other:?}"),
        }
    };
    assert_eq!(k, 4, "{k} of {n} events");
    assert!(end.contains("Err"), "{end}");
    drop(tx);
    drop(rx);
    if let Some(b) = bridge {
        b.join().unwrap();
    }
}

#[test]
fn records_sent_after_a_waiting_priority_event_stay_behind_it() {
    // The consumer starts late: twelve priority events find its lane (four slots) full, and
    // the records sent after each must still come after it, as on one machine.
    for kind in KINDS {
        let (mut tx, mut rx, bridge) = remote_pair(kind, small());
        // Twelve records of 8 bytes fit the credit: the writer does not block.
        for i in 0..12u64 {
            tx.send_priority_event(9, &i.to_le_bytes()).unwrap();
            tx.send(&i.to_le_bytes()).unwrap();
        }
        // The consumer starts once everything is sent: what its lane does not hold waits.
        drop(tx);
        let mut seen = Vec::new();
        while let Some(m) = rx.recv_message().unwrap() {
            match m {
                Message::Event(e) => {
                    assert_eq!(e.kind, 9);
                    seen.push(('e', u64::from_le_bytes(e.payload.try_into().unwrap())));
                }
                Message::Record(r) => seen.push(('r', *r.as_pod::<u64>().unwrap())),
                other => panic!("{kind:?}: unexpected message {other:?}"),
            }
        }
        assert_eq!(seen.len(), 24, "{kind:?}: {seen:?}");
        for i in 0..12u64 {
            let e = seen.iter().position(|&x| x == ('e', i)).unwrap();
            let r = seen.iter().position(|&x| x == ('r', i)).unwrap();
            assert!(
                e < r,
                "{kind:?}: record {i} came before its event: {seen:?}"
            );
        }
        let order = |k| seen.iter().filter(move |x| x.0 == k).map(|x| x.1);
        assert!(order('e').eq(0..12), "{kind:?}: {seen:?}");
        assert!(order('r').eq(0..12), "{kind:?}: {seen:?}");
        if let Some(b) = bridge {
            b.join().unwrap();
        }
    }
}

#[test]
fn the_credit_a_receiving_end_announces_stays_within_its_consumers_cap() {
    // Buffer debloating across the link: the consumer reads slowly with a debloating target,
    // and the credit announced never lets more than its cap be in flight (segments it holds
    // plus credit unspent), where without the cap the sender would be credited every free
    // segment.
    let g = Geometry {
        segment_size: 16 * 1024,
        segment_count: 16,
    };
    for kind in KINDS {
        let (mut tx, mut rx, bridge) = remote_pair(kind, g);
        rx.set_debloat_target(Some(Duration::from_millis(10)));
        let writer = std::thread::spawn(move || {
            let rec = [7u8; 1000];
            while tx.send(&rec).is_ok() {}
        });
        let seen = common::read_slowly_under_a_cap(&mut rx);
        // The reader leaves: the link ends, and so does the writer.
        drop(rx);
        writer.join().unwrap();
        if let Some(b) = bridge {
            b.join().unwrap();
        }
        common::assert_cap_held(&seen, &format!("{kind:?}"));
    }
}

#[test]
fn a_consumer_that_leaves_closes_the_channel() {
    for kind in KINDS {
        let (mut tx, mut rx, bridge) = remote_pair(kind, small());
        let reader = std::thread::spawn(move || {
            for n in 0..100u64 {
                let r = rx.recv().unwrap().unwrap();
                assert_eq!(r.as_bytes().unwrap(), &n.to_le_bytes());
            }
        });
        let mut n = 0u64;
        let err = loop {
            match tx.send(&n.to_le_bytes()) {
                Ok(()) => n += 1,
                Err(e) => break e,
            }
        };
        reader.join().unwrap();
        assert!(n >= 100);
        assert!(matches!(err, SendError::Closed(_)), "{kind:?}: {err:?}");
        if let Some(b) = bridge {
            b.join().unwrap();
        }
    }
}

#[test]
fn an_idle_direct_sender_hears_that_its_receiver_left() {
    // Nothing the producer calls reads the socket while it is idle: its keeper does. (A
    // direct receiver says `Cancel` when its consumer leaves; a bridge says it when the next
    // buffer comes, so only the direct pairing shows it.)
    let cfg = || Config::default().heartbeat(Duration::from_millis(20), Duration::from_secs(5));
    for kind in [Kind::Direct] {
        let (mut tx, mut rx, bridge) = remote_pair_with(kind, small(), cfg(), cfg());
        tx.send(b"one").unwrap();
        assert_eq!(rx.recv().unwrap().unwrap().as_bytes().unwrap(), b"one");
        drop(rx);
        let start = Instant::now();
        while !tx.is_closed() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{kind:?}: the idle sender never heard the receiver leave"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(tx);
        if let Some(b) = bridge {
            b.join().unwrap();
        }
    }
}

#[test]
fn records_arrive_whole_and_in_order_while_the_receiving_keeper_fills_between_the_consumers_calls()
{
    // Heartbeats every millisecond and a consumer that pauses now and then: the receiving
    // end's keeper fills the segments whenever the consumer's thread is away, and the
    // consumer's own waits (blocking, a look, a bounded wait, async) take over from it and
    // back, through small and large buffers (some half-read when a wait ends).
    let cfg = || Config::default().heartbeat(Duration::from_millis(1), Duration::from_secs(5));
    let g = Geometry {
        segment_size: 16384,
        segment_count: 4,
    };
    for way in 0..4 {
        let (l, addr) = listener_with(cfg());
        let rx = std::thread::spawn(move || connect_consumer(addr, "chan", g, cfg()));
        let mut tx = l.accept_producer("chan", g).unwrap();
        let mut rx = rx.join().unwrap().unwrap();
        let n = 1500u64;
        let writer = std::thread::spawn(move || {
            tx.set_flush_policy(FlushPolicy::Explicit);
            for i in 0..n {
                tx.send(&record(i)).unwrap();
                if i % 97 == 0 {
                    tx.flush().unwrap();
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            tx.close_timeout(Duration::from_secs(30)).unwrap();
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut i = 0u64;
        let start = Instant::now();
        loop {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "way {way}: stuck at {i}"
            );
            // `None`: the wait ended with nothing; `Some(None)`: the end of the stream.
            let got: Option<Option<Vec<u8>>> = match way {
                0 => Some(rx.recv().unwrap().map(|r| r.to_vec().unwrap())),
                1 => match rx.try_recv() {
                    Ok(r) => Some(r.map(|r| r.to_vec().unwrap())),
                    Err(TryRecvError::Empty) => {
                        std::thread::sleep(Duration::from_micros(300));
                        None
                    }
                    Err(e) => panic!("way {way}: {e}"),
                },
                2 => match rx.recv_timeout(Duration::from_micros(700)) {
                    Ok(r) => Some(r.map(|r| r.to_vec().unwrap())),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(e) => panic!("way {way}: {e}"),
                },
                _ => rt.block_on(async {
                    let wait = tokio::time::timeout(Duration::from_micros(700), rx.recv_async());
                    wait.await
                        .ok()
                        .map(|r| r.unwrap().map(|r| r.to_vec().unwrap()))
                }),
            };
            let Some(got) = got else { continue };
            let Some(v) = got else { break };
            assert_eq!(v, record(i), "way {way}: record {i}");
            i += 1;
            if i % 61 == 0 {
                // Away for a few heartbeats.
                std::thread::sleep(Duration::from_millis(4));
            }
        }
        assert_eq!(i, n, "way {way}");
        writer.join().unwrap();
    }
}

/// Bytes waiting to be read in the established loopback TCP socket whose peer port is `port`
/// (from `/proc/net/tcp`), if there is one.
fn rx_queue_towards(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let rem_port = u16::from_str_radix(f.get(2)?.split(':').nth(1)?, 16).ok()?;
        if rem_port != port || *f.get(3)? != "01" {
            return None;
        }
        u64::from_str_radix(f.get(4)?.split(':').nth(1)?, 16).ok()
    })
}

#[test]
fn an_idle_direct_receiver_takes_in_records_and_heartbeats_while_its_consumer_makes_no_call() {
    // The sender's heartbeats (every 2 ms) would pile up in the receiver's socket while its
    // consumer makes no call (and, over hours, fill the buffers until the sender's writes
    // stalled); the receiving end's keeper reads them, and writes what records came into
    // the end's segments, ready for the consumer's next call.
    let cfg = || Config::default().heartbeat(Duration::from_millis(2), Duration::from_secs(5));
    let (l, addr) = listener_with(cfg());
    let rx = std::thread::spawn(move || connect_consumer(addr, "chan", small(), cfg()));
    let mut tx = l.accept_producer("chan", small()).unwrap();
    let mut rx = rx.join().unwrap().unwrap();
    for i in 0..3u64 {
        tx.send(&i.to_le_bytes()).unwrap();
    }
    tx.flush().unwrap();
    // The records are taken in with no call of the consumer.
    let start = Instant::now();
    while rx.metrics().link.map_or(0, |l| l.wire_bytes) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the records stayed in the socket"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The heartbeats too: the socket stays about empty (without the keeper's reads it would
    // hold 12 bytes more every 2 ms), at least at one of these looks.
    std::thread::sleep(Duration::from_millis(300));
    let mut least = u64::MAX;
    for _ in 0..20 {
        least = least.min(rx_queue_towards(addr.port()).expect("the receiver's socket"));
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(least < 200, "{least} bytes waited in the receiver's socket");
    for i in 0..3u64 {
        let r = rx.try_recv().unwrap().expect("taken in already");
        assert_eq!(*r.as_pod::<u64>().unwrap(), i);
    }
    drop(tx);
    assert!(rx.recv().unwrap().is_none());
}

#[test]
fn a_record_larger_than_a_segment_crosses_whole() {
    let (mut tx, mut rx, _) = remote_pair(Kind::Direct, small());
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        while let Some(r) = rx.recv().unwrap() {
            got.push(r.to_vec().unwrap());
        }
        got
    });
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
fn a_direct_consumer_sees_a_silent_sender_dead() {
    // Whichever way it waits: a blocking read times out itself; an async wait and a consumer
    // that only looks have the keeper to find the silence, and are told.
    for way in ["recv", "try_recv", "recv_async"] {
        let raw = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = raw.local_addr().unwrap();
        let cfg =
            Config::default().heartbeat(Duration::from_millis(20), Duration::from_millis(200));
        let mut rx = connect_consumer(addr, "s", small(), cfg).unwrap();
        let (_held, _) = raw.accept().unwrap();
        let start = Instant::now();
        let got = match way {
            "recv" => rx.recv().map(|r| r.is_some()),
            "try_recv" => loop {
                match rx.try_recv() {
                    Err(TryRecvError::Empty) => {
                        assert!(start.elapsed() < Duration::from_secs(20), "never told");
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(TryRecvError::PeerDead(e)) => break Err(RecvError::PeerDead(e)),
                    other => panic!("{:?}", other.map(|r| r.is_some())),
                }
            },
            _ => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    tokio::time::timeout(Duration::from_secs(20), rx.recv_async())
                        .await
                        .expect("never told")
                        .map(|r| r.is_some())
                }),
        };
        match got {
            Err(RecvError::PeerDead(e)) => {
                assert!(e.is_remote(), "{way}: {e}");
                assert!(e.to_string().contains("sent nothing"), "{way}: {e}");
            }
            other => panic!("{way}: {other:?}"),
        };
        assert!(start.elapsed() < Duration::from_secs(20), "{way}");
    }
}

#[test]
fn a_blocking_direct_read_tells_a_silent_sender_dead_after_the_deadline_once() {
    // The read's timeout is set a little short of the silence deadline: the read after it
    // must ask only for what is left, not for the whole deadline again (which told the
    // silence after nearly twice the deadline). Bounds with wide margins either side: the
    // deadline is never cut short, and the second half is not waited again.
    let dead_after = Duration::from_millis(1000);
    let raw = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = raw.local_addr().unwrap();
    // `heartbeat` sets the silence deadline. The keeper cannot be what tells it: the blocking
    // read holds the end's lock, which the keeper only tries, so the read's own deadline is
    // what this measures.
    let cfg = Config::default().heartbeat(Duration::from_millis(500), dead_after);
    let mut rx = connect_consumer(addr, "s", small(), cfg).unwrap();
    let (_held, _) = raw.accept().unwrap();
    let start = Instant::now();
    let got = rx.recv().map(|r| r.is_some());
    let took = start.elapsed();
    assert!(
        matches!(got, Err(RecvError::PeerDead(ref e)) if e.is_remote()),
        "{got:?}"
    );
    assert!(took >= dead_after - Duration::from_millis(50), "{took:?}");
    assert!(took < dead_after * 9 / 5, "told after {took:?}");
}

#[test]
fn a_direct_producer_sees_a_silent_receiver_dead() {
    use std::io::Write;
    let cfg = Config::default().heartbeat(Duration::from_millis(20), Duration::from_millis(200));
    let l = Listener::bind("127.0.0.1:0".parse().unwrap(), cfg).unwrap();
    let addr = l.local_addr().unwrap();
    // A receiver that requests the channel with one segment of credit, then says nothing.
    let mut raw = std::net::TcpStream::connect(addr).unwrap();
    let name = b"chan";
    let mut req = Vec::new();
    req.extend_from_slice(&(8u32 + 14 + name.len() as u32).to_le_bytes());
    req.extend_from_slice(&0x5346_4E54u32.to_le_bytes());
    req.extend_from_slice(&[1, 1, 0, 0]);
    req.extend_from_slice(&0u32.to_le_bytes());
    req.extend_from_slice(&1u32.to_le_bytes());
    req.extend_from_slice(&4096u32.to_le_bytes());
    req.extend_from_slice(&(name.len() as u16).to_le_bytes());
    req.extend_from_slice(name);
    raw.write_all(&req).unwrap();
    let mut tx = l.accept_producer("chan", small()).unwrap();
    let start = Instant::now();
    let err = loop {
        if let Err(e) = tx.send(&[3u8; 1000]) {
            break e;
        }
    };
    assert!(
        matches!(err, SendError::PeerDead(ref e) if e.is_remote()),
        "{err:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn garbage_from_the_sender_is_a_lost_peer_not_a_panic() {
    use std::io::{Read, Write};
    let raw = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = raw.local_addr().unwrap();
    let mut rx = connect_consumer(addr, "g", small(), Config::default()).unwrap();
    let (mut s, _) = raw.accept().unwrap();
    let mut req = [0u8; 64];
    let _ = s.read(&mut req).unwrap();
    // A Buffer whose frame claims more bytes than its segment has.
    let mut m = Vec::new();
    let frames = [0xFFu8; 16];
    m.extend_from_slice(&(8u32 + 16 + frames.len() as u32).to_le_bytes());
    m.extend_from_slice(&0x5346_4E54u32.to_le_bytes());
    m.extend_from_slice(&[1, 2, 0, 0]);
    for w in [0u32, 0, 0, 0] {
        m.extend_from_slice(&w.to_le_bytes());
    }
    m.extend_from_slice(&frames);
    s.write_all(&m).unwrap();
    match rx.recv() {
        Err(RecvError::PeerDead(e)) => assert!(e.is_remote(), "{e}"),
        other => panic!("{:?}", other.map(|r| r.is_some())),
    };
    // The sender is told why.
    let mut said = Vec::new();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.read_to_end(&mut said);
    assert!(
        String::from_utf8_lossy(&said).contains("frame"),
        "{:?}",
        String::from_utf8_lossy(&said)
    );
}

#[test]
fn a_wrong_name_waits_for_the_right_one_and_a_wrong_size_is_an_error() {
    let (l, addr) = listener();
    let other = Geometry {
        segment_size: 8192,
        segment_count: 4,
    };
    let wrong = std::thread::spawn(move || {
        let mut rx = connect_consumer(addr, "nope", small(), Config::default()).unwrap();
        // Refused: the stream ends as failed.
        assert!(rx.recv().is_err());
        let mut rx = connect_consumer(addr, "chan", other, Config::default()).unwrap();
        assert!(rx.recv().is_err());
    });
    match l.accept_producer("chan", small()) {
        Err(shmflow::net::SetupError::Handshake(shmflow::net::LinkError::SegmentSize {
            ours: 4096,
            theirs: 8192,
        })) => {}
        other => panic!("{other:?}"),
    }
    wrong.join().unwrap();
    // A geometry the region cannot have fails before any peer is met.
    let bad = Geometry {
        segment_size: 1000,
        segment_count: 4,
    };
    assert!(l.accept_producer("chan", bad).is_err());
    assert!(connect_consumer(addr, "chan", bad, Config::default()).is_err());
}

#[tokio::test(flavor = "current_thread")]
async fn async_calls_on_direct_ends_wait_for_the_socket() {
    // One thread runs both ends' tasks: every wait must give the thread back.
    let (l, addr) = listener();
    let g = small();
    let accept = tokio::task::spawn_blocking(move || l.accept_producer("a", g).unwrap());
    let mut rx = tokio::task::spawn_blocking(move || {
        connect_consumer(addr, "a", g, Config::default()).unwrap()
    })
    .await
    .unwrap();
    let mut tx = accept.await.unwrap();
    let n = 20_000u64;
    let writer = tokio::spawn(async move {
        for i in 0..n {
            // Four segments of credit: the producer waits for credit many times.
            tx.send_async(&i.to_le_bytes()).await.unwrap();
        }
        tx
    });
    let mut got = 0u64;
    while got < n {
        let r = rx.recv_async().await.unwrap().unwrap();
        assert_eq!(r.as_bytes().unwrap(), &got.to_le_bytes());
        got += 1;
    }
    let tx = writer.await.unwrap();
    drop(tx);
    assert!(rx.recv_async().await.unwrap().is_none());
}

/// A peer on loopback that sends `bytes`, ends its side, and reads until the other side
/// closes (bounded).
fn raw_peer(mut s: std::net::TcpStream, bytes: Vec<u8>) -> std::thread::JoinHandle<()> {
    use std::io::{Read, Write};
    std::thread::spawn(move || {
        let _ = s.write_all(&bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut sink = [0u8; 4096];
        while let Ok(n) = s.read(&mut sink) {
            if n == 0 {
                break;
            }
        }
    })
}

fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut f = (8 + body.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(&0x5346_4E54u32.to_le_bytes());
    f.extend_from_slice(&[1, kind, 0, 0]);
    f.extend_from_slice(body);
    f
}

fn words(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Whole frames of a record each, as a segment holds them.
fn whole(payload: &[u8]) -> Vec<u8> {
    let mut f = words(&[payload.len() as u32, 0x5346_0001]);
    f.extend_from_slice(payload);
    f.resize(f.len().div_ceil(8) * 8, 0);
    f
}

#[test]
fn mutated_messages_end_a_direct_end_cleanly_or_with_an_error_never_a_panic_or_a_hang() {
    let cfg = || Config::default().heartbeat(Duration::from_millis(20), Duration::from_millis(60));
    // Well-formed exchanges, then mutated copies of them.
    let mut big = words(&[0, 1, 0, 0]);
    // Past the size from which a buffer is read straight into its segment.
    big.extend_from_slice(&whole(&[9u8; 10_000]));
    let big_geometry = Geometry {
        segment_size: 16384,
        segment_count: 4,
    };
    let mut to_consumer = frame(
        2,
        &[words(&[0, 1, 0, 0]), whole(b"hello"), whole(b"")].concat(),
    );
    to_consumer.extend_from_slice(&frame(
        2,
        &[words(&[0, 0, 24, 0]), whole(&[7u8; 40])].concat(),
    ));
    to_consumer.extend_from_slice(&frame(8, &[words(&[0, 9]), b"p".to_vec()].concat()));
    to_consumer.extend_from_slice(&frame(4, &words(&[0, 0])));
    let mut to_producer = frame(1, &[words(&[0, 2, 4096]), vec![1, 0, b'a']].concat());
    to_producer.extend_from_slice(&frame(3, &words(&[0, 3])));
    to_producer.extend_from_slice(&frame(7, &[]));
    to_producer.extend_from_slice(&frame(5, &words(&[0])));
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..60 {
        let consumer_side = round % 2 == 0;
        let mut bytes = if consumer_side {
            to_consumer.clone()
        } else {
            to_producer.clone()
        };
        let large = round % 4 == 0;
        if large {
            bytes = frame(2, &big);
        }
        // Flip a few bytes past the first frame head (round 0 and 1 stay well-formed).
        for _ in 0..(round / 2).min(6) {
            let at = (next() as usize) % bytes.len();
            bytes[at] ^= (next() as u8) | 1;
        }
        let start = Instant::now();
        if consumer_side {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let peer = std::thread::spawn(move || {
                let (s, _) = l.accept().unwrap();
                raw_peer(s, bytes).join().unwrap();
            });
            let g = if large { big_geometry } else { small() };
            let mut rx = connect_consumer(addr, "a", g, cfg()).unwrap();
            let mut n = 0;
            while let Ok(Some(r)) = rx.recv() {
                let v = r.to_vec();
                if round == 0 {
                    assert_eq!(v.unwrap(), vec![9u8; 10_000]);
                }
                n += 1;
            }
            let whole_input = if large { 1 } else { 3 };
            assert!(round > 1 || n == whole_input, "round {round}: {n} records");
            drop(rx);
            peer.join().unwrap();
        } else {
            let l = Listener::bind("127.0.0.1:0".parse().unwrap(), cfg()).unwrap();
            let addr = l.local_addr().unwrap();
            let peer = raw_peer(std::net::TcpStream::connect(addr).unwrap(), bytes);
            let got = l.accept_producer_timeout("a", small(), Duration::from_millis(300));
            if let Ok(mut tx) = got {
                for i in 0..64u64 {
                    if tx
                        .send_timeout(&i.to_le_bytes().repeat(100), Duration::from_millis(50))
                        .is_err()
                    {
                        break;
                    }
                }
                let _ = tx.close_timeout(Duration::from_millis(300));
            } else {
                assert!(round > 1, "round {round}: {got:?}");
            }
            peer.join().unwrap();
        }
        assert!(start.elapsed() < Duration::from_secs(20), "round {round}");
    }
}

// ----- TLS ----------------------------------------------------------------------------------

/// Both sides' configs with certificates one authority signed (the sender's for the name the
/// receiver checks).
fn tls_configs(pki: &pki::Pki) -> (Config, Config) {
    (
        Config::default().tls(pki.tls("localhost")),
        Config::default().tls(pki.tls("client")),
    )
}

#[test]
fn over_tls_records_events_and_whole_segments_cross_every_pairing() {
    let pki = pki::Pki::new("shmflow test authority");
    // Small segments (every record kind, spanning ones among them) and 64 KiB ones (buffers
    // large enough to be read straight into their segment, records of 60 KiB).
    let big = Geometry {
        segment_size: 64 << 10,
        segment_count: 8,
    };
    for kind in KINDS {
        for (g, big_records) in [(small(), false), (big, true)] {
            let (tx_cfg, rx_cfg) = tls_configs(&pki);
            let (mut tx, mut rx, bridge) = remote_pair_with(kind, g, tx_cfg, rx_cfg);
            let n = if big_records { 400u64 } else { 3000 };
            let make = move |i: u64| -> Vec<u8> {
                if big_records {
                    (0..60_000usize)
                        .map(|k| (i as usize * 7 + k) as u8)
                        .collect()
                } else {
                    record(i)
                }
            };
            let reader = std::thread::spawn(move || {
                let (mut i, mut events) = (0u64, 0u64);
                while let Some(m) = rx.recv_message().unwrap() {
                    match m {
                        Message::Record(r) => {
                            assert_eq!(r.to_vec().unwrap(), make(i), "record {i}");
                            i += 1;
                        }
                        Message::Event(e) => {
                            assert_eq!(e.payload, &(events * 100).to_le_bytes());
                            events += 1;
                        }
                        other => panic!("unexpected message {other:?}"),
                    }
                }
                (i, events)
            });
            tx.set_flush_policy(FlushPolicy::Explicit);
            for i in 0..n {
                if i % 100 == 0 {
                    tx.send_event(7, &i.to_le_bytes()).unwrap();
                }
                tx.send(&make(i)).unwrap();
            }
            tx.close_timeout(Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("{kind:?} {}: {e}", g.segment_size));
            assert_eq!(
                reader.join().unwrap(),
                (n, n / 100),
                "{kind:?} {}",
                g.segment_size
            );
            if let Some(b) = bridge {
                b.join().unwrap();
            }
        }
    }
}

#[test]
fn over_tls_a_round_trip_under_every_wait_strategy_and_a_barrier_in_its_place() {
    let pki = pki::Pki::new("shmflow test authority");
    for kind in KINDS {
        for wait in [
            WaitStrategy::Block,
            WaitStrategy::Park,
            WaitStrategy::BusyPoll(Duration::from_micros(200)),
        ] {
            let (tx_cfg, rx_cfg) = tls_configs(&pki);
            let (mut tx, mut rx, bridge) = remote_pair_with(kind, small(), tx_cfg, rx_cfg);
            rx.set_wait_strategy(wait);
            let reader = std::thread::spawn(move || {
                let mut seen = Vec::new();
                while let Some(m) = rx.recv_message().unwrap() {
                    match m {
                        Message::Record(r) => seen.push(r.to_vec().unwrap()[0] as u64),
                        Message::Barrier(b) => seen.push(1000 + b.id),
                        other => panic!("unexpected message {other:?}"),
                    }
                }
                seen
            });
            for i in 0..20u8 {
                tx.send(&[i]).unwrap();
                if i == 9 {
                    tx.send_barrier(1, Alignment::Aligned, &[]).unwrap();
                }
            }
            tx.close_timeout(Duration::from_secs(20)).unwrap();
            let mut want: Vec<u64> = (0..10).collect();
            want.push(1001);
            want.extend(10..20);
            assert_eq!(reader.join().unwrap(), want, "{kind:?} {wait:?}");
            if let Some(b) = bridge {
                b.join().unwrap();
            }
        }
    }
}

#[test]
fn a_tls_listener_refuses_a_stranger_and_a_plaintext_peer_and_serves_the_next() {
    let pki = pki::Pki::new("shmflow test authority");
    let other = pki::Pki::new("another authority");
    let (tx_cfg, rx_cfg) = tls_configs(&pki);
    let pki_ca = pki.ca_pem.clone();
    let (l, addr) = listener_with(tx_cfg);
    let g = small();
    let receivers = std::thread::spawn(move || {
        // A receiver that trusts another authority refuses the listener's certificate; one
        // that trusts the right one but whose own certificate another authority signed is
        // refused by the listener: at the end of its handshake, or (TLS 1.3: the server
        // checks the client's certificate after the client is done) at its first read.
        let (cert, key) = other.issue("client");
        let strangers = [
            Config::default().tls(other.tls("client")),
            Config::default().tls(
                shmflow::net::Tls::from_pem(
                    cert.as_bytes(),
                    key.as_bytes(),
                    pki_ca.as_bytes(),
                    "localhost",
                )
                .unwrap(),
            ),
        ];
        for stranger in strangers {
            let refused = match connect_consumer(addr, "chan", g, stranger) {
                Err(e) => e.to_string(),
                Ok(mut rx) => match rx.recv() {
                    Err(e) => e.to_string(),
                    Ok(r) => panic!("a stranger was served: {:?}", r.map(|r| r.to_vec())),
                },
            };
            assert!(refused.contains("TLS"), "{refused}");
        }
        // A receiver without TLS: the listener's handshake fails on its request, and the
        // receiver is told nothing it could take for records.
        let mut plain = std::net::TcpStream::connect(addr).unwrap();
        let _ = std::io::Write::write_all(&mut plain, b"\x00\x00\x00\x10hello, plaintext");
        plain
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut answer = Vec::new();
        let _ = std::io::Read::read_to_end(&mut plain, &mut answer);
        // Whatever came (a TLS alert, or nothing) is not a message of the protocol.
        assert!(answer.first().is_none_or(|b| *b == 0x15), "{answer:?}");
        // A receiver with the right certificate is served.
        let mut rx = connect_consumer(addr, "chan", g, rx_cfg).unwrap();
        let mut got = Vec::new();
        while let Some(r) = rx.recv().unwrap() {
            got.push(r.to_vec().unwrap());
        }
        got
    });
    let mut tx = l.accept_producer("chan", g).unwrap();
    tx.send(b"for the trusted one").unwrap();
    tx.close_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(
        receivers.join().unwrap(),
        vec![b"for the trusted one".to_vec()]
    );
}

#[test]
fn a_tls_consumer_facing_a_plaintext_sender_fails_its_handshake() {
    let (l, addr) = listener();
    let waiting = std::thread::spawn(move || {
        l.accept_producer_timeout("chan", small(), Duration::from_secs(5))
            .map(|_| ())
    });
    let pki = pki::Pki::new("shmflow test authority");
    let (_, rx_cfg) = tls_configs(&pki);
    let e = connect_consumer(addr, "chan", small(), rx_cfg).unwrap_err();
    assert!(
        matches!(
            e,
            shmflow::net::SetupError::Handshake(shmflow::net::LinkError::Tls(_))
        ),
        "{e}"
    );
    // The plaintext listener took the client's hello for a broken request, and waited on.
    assert!(waiting.join().unwrap().is_err());
}

// ----- Gate channels ------------------------------------------------------------------------

/// A gate of three channels of 4 KiB segments: two exclusive each, four floating.
fn gate(tag: &str) -> (Gate, String) {
    let name = format!("/shmflow-test-direct-gate-{tag}-{}", std::process::id());
    let g = GateGeometry::new(3)
        .with_exclusive(2)
        .with_floating(4)
        .with_segment_size(4096);
    (Gate::create(&name, g).unwrap(), name)
}

/// Record `i` of channel `c`: its number, its channel, and a length that varies.
fn gate_record(c: u8, i: u64) -> Vec<u8> {
    let mut v = i.to_le_bytes().to_vec();
    v.push(c);
    v.resize(9 + (i as usize * 37) % 1500, c);
    v
}

/// Sends `n` records of channel `c`, barrier 1 after the first half, and closes.
fn send_gate_records(mut tx: Producer, c: u8, n: u64) {
    tx.set_flush_policy(FlushPolicy::Explicit);
    for i in 0..n {
        tx.send(&gate_record(c, i)).unwrap();
        if i == n / 2 {
            tx.send_barrier(1, Alignment::Aligned, b"cp").unwrap();
        }
    }
    tx.close_timeout(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("channel {c}: {e}"));
}

/// What a gate reader saw: records per channel (checked in order), released barriers, ended
/// channels, and the most floating segments a remote channel held at once.
#[derive(Debug, Default, PartialEq)]
struct GateSeen {
    records: [u64; 3],
    barriers: Vec<(u64, Released)>,
    ended: Vec<u32>,
    floating_held: u64,
}

impl GateSeen {
    fn take(&mut self, m: GateMessage<'_>) {
        match m {
            GateMessage::Record { channel, record } => {
                let i = self.records[channel as usize];
                assert_eq!(
                    record.to_vec().unwrap(),
                    gate_record(channel as u8, i),
                    "channel {channel} record {i}"
                );
                self.records[channel as usize] += 1;
            }
            GateMessage::Barrier {
                id,
                released,
                payload,
                ..
            } => {
                assert_eq!(payload, b"cp");
                self.barriers.push((id, released));
            }
            GateMessage::EndOfPartition { channel } => self.ended.push(channel),
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn a_gate_reads_remote_channels_beside_a_local_one_with_floating_segments_and_a_barrier() {
    // (Blocking and async reads; the direct channel over TLS in the second.)
    let n = 3000u64;
    for asynch in [false, true] {
        let (mut gate, name) = gate(if asynch { "async" } else { "sync" });
        let g = Geometry {
            segment_size: 4096,
            segment_count: 4,
        };
        // Channel 0: a direct sender (over TLS with the async reader).
        let pki = pki::Pki::new("shmflow test authority");
        let (tx_cfg, rx_cfg) = if asynch {
            tls_configs(&pki)
        } else {
            (Config::default(), Config::default())
        };
        let (l, addr0) = listener_with(tx_cfg);
        let direct = std::thread::spawn(move || {
            send_gate_records(l.accept_producer("a", g).unwrap(), 0, n);
        });
        connect_gate_channel(addr0, "a", &mut gate, 0, rx_cfg).unwrap();
        // Channel 1: a bridge forwarding a local channel.
        let (tx1, rx1) = shmflow::pair(g).unwrap();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let bridge = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async move {
                    let mut s = Server::bind("127.0.0.1:0".parse().unwrap(), Config::default())
                        .await
                        .unwrap();
                    addr_tx.send(s.local_addr().unwrap()).unwrap();
                    s.export("b", rx1).unwrap();
                    s.run().await;
                })
        });
        connect_gate_channel(
            addr_rx.recv().unwrap(),
            "b",
            &mut gate,
            1,
            Config::default(),
        )
        .unwrap();
        let bridged = std::thread::spawn(move || send_gate_records(tx1, 1, n));
        // Channel 2: a local producer.
        let local_tx = Producer::open_channel(&name, 2).unwrap();
        let local = std::thread::spawn(move || send_gate_records(local_tx, 2, n));
        let mut seen = GateSeen::default();
        let mut k = 0u64;
        let mut sample = |gate: &Gate, seen: &mut GateSeen| {
            k += 1;
            if k % 64 == 0 {
                let m = gate.metrics();
                let held = m.channels[..2].iter().map(|c| c.floating_held).max();
                seen.floating_held = seen.floating_held.max(held.unwrap_or(0));
            }
        };
        if asynch {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                loop {
                    match gate.recv_async().await.unwrap() {
                        Some(m) => seen.take(m),
                        None => break,
                    }
                    sample(&gate, &mut seen);
                }
            });
        } else {
            loop {
                match gate.recv().unwrap() {
                    Some(m) => seen.take(m),
                    None => break,
                }
                sample(&gate, &mut seen);
            }
        }
        for t in [direct, bridged, local, bridge] {
            t.join().unwrap();
        }
        seen.ended.sort();
        assert_eq!(seen.records, [n; 3], "async {asynch}");
        assert_eq!(
            seen.barriers,
            vec![(1, Released::Aligned)],
            "async {asynch}"
        );
        assert_eq!(seen.ended, vec![0, 1, 2], "async {asynch}");
        // The remote senders' backlog asked for floating segments, and got them as credit.
        assert!(seen.floating_held > 0, "async {asynch}: {seen:?}");
    }
}

#[test]
fn a_gate_reads_every_record_while_its_remote_channels_keepers_fill_between_its_calls() {
    // Heartbeats every millisecond and a reader that pauses: while the gate's thread is away,
    // each remote channel's keeper fills the channel's segments (lent floating ones among
    // them), and the gate, blocking or waiting with a deadline, takes over from them and
    // back. Every record arrives, in order, with the barrier and the ends.
    let n = 1500u64;
    let cfg = || Config::default().heartbeat(Duration::from_millis(1), Duration::from_secs(5));
    for bounded in [false, true] {
        let (mut gate, name) = gate(if bounded { "keeper-bounded" } else { "keeper" });
        let g = Geometry {
            segment_size: 4096,
            segment_count: 4,
        };
        let mut senders = Vec::new();
        for c in 0..2u8 {
            let (l, addr) = listener_with(cfg());
            let chan = format!("k{c}");
            let accept = chan.clone();
            senders.push(std::thread::spawn(move || {
                send_gate_records(l.accept_producer(&accept, g).unwrap(), c, n);
            }));
            connect_gate_channel(addr, &chan, &mut gate, c as usize, cfg()).unwrap();
        }
        let local_tx = Producer::open_channel(&name, 2).unwrap();
        senders.push(std::thread::spawn(move || {
            send_gate_records(local_tx, 2, n)
        }));
        let mut seen = GateSeen::default();
        let (mut k, start) = (0u64, Instant::now());
        loop {
            assert!(start.elapsed() < Duration::from_secs(90), "stuck: {seen:?}");
            let m = if bounded {
                match gate.recv_timeout(Duration::from_micros(700)) {
                    Ok(m) => m,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(e) => panic!("{e}"),
                }
            } else {
                gate.recv().unwrap()
            };
            let Some(m) = m else { break };
            seen.take(m);
            k += 1;
            if k % 61 == 0 {
                // Away for a few heartbeats.
                std::thread::sleep(Duration::from_millis(4));
            }
        }
        for t in senders {
            t.join().unwrap();
        }
        seen.ended.sort();
        assert_eq!(seen.records, [n; 3], "bounded {bounded}");
        assert_eq!(
            seen.barriers,
            vec![(1, Released::Aligned)],
            "bounded {bounded}"
        );
        assert_eq!(seen.ended, vec![0, 1, 2], "bounded {bounded}");
    }
}

#[test]
fn a_gate_channel_whose_remote_sender_vanishes_is_dead_and_the_others_go_on() {
    let (mut gate, name) = gate("vanish");
    // A sender that takes the request, sends one record's worth of nothing, and vanishes.
    let raw = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = raw.local_addr().unwrap();
    let (linked_tx, linked) = std::sync::mpsc::channel::<()>();
    let vanishing = std::thread::spawn(move || {
        let (mut s, _) = raw.accept().unwrap();
        let mut head = [0u8; 64];
        let _ = std::io::Read::read(&mut s, &mut head);
        // Gone once the gate has linked the channel.
        let _ = linked.recv_timeout(Duration::from_secs(20));
        drop(s);
    });
    connect_gate_channel(addr, "gone", &mut gate, 0, Config::default()).unwrap();
    linked_tx.send(()).unwrap();
    let mut tx = Producer::open_channel(&name, 1).unwrap();
    for i in 0..10 {
        tx.send(&gate_record(1, i)).unwrap();
    }
    drop(tx);
    drop(Producer::open_channel(&name, 2).unwrap());
    let (mut records, mut dead, mut ended) = (0, Vec::new(), Vec::new());
    while let Some(m) = gate.recv().unwrap() {
        match m {
            GateMessage::Record { channel: 1, .. } => records += 1,
            GateMessage::ChannelDead { channel, error } => {
                dead.push((channel, error.is_remote(), error.to_string()))
            }
            GateMessage::EndOfPartition { channel } => ended.push(channel),
            other => panic!("unexpected {other:?}"),
        }
    }
    vanishing.join().unwrap();
    assert_eq!(records, 10);
    ended.sort();
    assert_eq!(ended, vec![1, 2]);
    assert_eq!(dead.len(), 1, "{dead:?}");
    let (channel, remote, message) = &dead[0];
    assert_eq!(*channel, 0);
    assert!(*remote, "{message}");
    assert!(
        message.contains("link to the remote producer ended"),
        "{message}"
    );
}

#[test]
fn a_gate_channel_that_cannot_take_a_remote_producer_is_an_error() {
    let (mut gate, _name) = gate("refuse");
    let (l, addr) = listener();
    let g = Geometry {
        segment_size: 4096,
        segment_count: 4,
    };
    let sender = std::thread::spawn(move || {
        let mut tx = l.accept_producer("a", g).unwrap();
        tx.send(b"x").unwrap();
        let _ = tx.close_timeout(Duration::from_secs(10));
    });
    let e = connect_gate_channel(addr, "a", &mut gate, 3, Config::default()).unwrap_err();
    assert!(
        matches!(e, shmflow::net::SetupError::GateChannel { channel: 3, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("3 channels"), "{e}");
    connect_gate_channel(addr, "a", &mut gate, 0, Config::default()).unwrap();
    let e = connect_gate_channel(addr, "a", &mut gate, 0, Config::default()).unwrap_err();
    assert!(e.to_string().contains("remote producer already"), "{e}");
    drop(gate);
    sender.join().unwrap();
}

#[test]
fn a_gate_channel_whose_connection_failed_can_be_connected_again() {
    let (mut gate, name) = gate("retry");
    let g = Geometry {
        segment_size: 4096,
        segment_count: 4,
    };
    // Nobody listens there.
    let nobody = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let e = connect_gate_channel(nobody, "a", &mut gate, 0, Config::default()).unwrap_err();
    assert!(matches!(e, shmflow::net::SetupError::Io { .. }), "{e}");
    // A TLS receiver facing a plaintext sender: the handshake fails.
    let (l, addr) = listener();
    let pki = pki::Pki::new("shmflow test authority");
    let (_, tls) = tls_configs(&pki);
    let e = connect_gate_channel(addr, "a", &mut gate, 0, tls).unwrap_err();
    assert!(
        matches!(
            e,
            shmflow::net::SetupError::Handshake(shmflow::net::LinkError::Tls(_))
        ),
        "{e}"
    );
    // Neither attempt touched the channel: the next one is served in full.
    let sender = std::thread::spawn(move || {
        let mut tx = l.accept_producer("a", g).unwrap();
        for i in 0..10 {
            tx.send(&gate_record(0, i)).unwrap();
        }
        tx.close_timeout(Duration::from_secs(20)).unwrap();
    });
    connect_gate_channel(addr, "a", &mut gate, 0, Config::default()).unwrap();
    drop(Producer::open_channel(&name, 1).unwrap());
    drop(Producer::open_channel(&name, 2).unwrap());
    let mut seen = GateSeen::default();
    while let Some(m) = gate.recv().unwrap() {
        seen.take(m);
    }
    sender.join().unwrap();
    seen.ended.sort();
    assert_eq!(seen.records, [10, 0, 0]);
    assert_eq!(seen.ended, vec![0, 1, 2]);
}

#[test]
fn a_remote_channel_stalled_half_way_through_a_buffer_does_not_hold_up_the_gate() {
    let name = format!("/shmflow-test-direct-gate-stall-{}", std::process::id());
    let mut gate = Gate::create(
        &name,
        GateGeometry::new(2)
            .with_exclusive(2)
            .with_floating(2)
            .with_segment_size(16384),
    )
    .unwrap();
    // A sender that sends the first half of a 10 KB buffer, then nothing for as long as the
    // test runs (a link whose window closed half-way through a segment).
    let raw = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = raw.local_addr().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let stalled = std::thread::spawn(move || {
        let (mut s, _) = raw.accept().unwrap();
        let mut body = words(&[0, 1, 0, 0]);
        body.extend_from_slice(&whole(&[9u8; 10_000]));
        let msg = frame(2, &body);
        std::io::Write::write_all(&mut s, &msg[..5000]).unwrap();
        let _ = done_rx.recv_timeout(Duration::from_secs(60));
    });
    // A silent peer is dead only after two minutes: the gate must not wait for it meanwhile.
    let patient = Config::default().heartbeat(Duration::from_secs(1), Duration::from_secs(120));
    connect_gate_channel(addr, "stalled", &mut gate, 0, patient).unwrap();
    let mut tx = Producer::open_channel(&name, 1).unwrap();
    let local = std::thread::spawn(move || {
        for i in 0..100 {
            tx.send(&gate_record(1, i)).unwrap();
        }
    });
    let mut seen = GateSeen::default();
    while !seen.ended.contains(&1) {
        let m = gate
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("the local channel was held up: {e} after {seen:?}"));
        seen.take(m.expect("channel 0 is open"));
    }
    local.join().unwrap();
    assert_eq!(seen.records, [0, 100, 0]);
    done_tx.send(()).unwrap();
    drop(gate);
    stalled.join().unwrap();
}

#[test]
fn a_direct_consumer_waits_no_longer_than_asked_for_a_buffer_half_way_across() {
    // A large buffer is read straight into its segment; half of it came, and the rest comes
    // much later. `try_recv`, `recv_timeout` and an async wait under a timeout return on
    // time meanwhile (a silent peer is dead only after two minutes), and the record is whole
    // once the rest comes.
    let raw = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = raw.local_addr().unwrap();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let payload: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
    let mut body = words(&[0, 1, 0, 0]);
    body.extend_from_slice(&whole(&payload));
    let mut msg = frame(2, &body);
    msg.extend_from_slice(&frame(4, &words(&[0, 0])));
    let sender = std::thread::spawn(move || {
        let (mut s, _) = raw.accept().unwrap();
        std::io::Write::write_all(&mut s, &msg[..5000]).unwrap();
        go_rx.recv_timeout(Duration::from_secs(60)).unwrap();
        std::io::Write::write_all(&mut s, &msg[5000..7000]).unwrap();
        go_rx.recv_timeout(Duration::from_secs(60)).unwrap();
        std::io::Write::write_all(&mut s, &msg[7000..]).unwrap();
        // Hold the connection until the receiver leaves.
        let mut rest = Vec::new();
        let _ = std::io::Read::read_to_end(&mut s, &mut rest);
    });
    let patient = Config::default().heartbeat(Duration::from_secs(1), Duration::from_secs(120));
    let g = Geometry {
        segment_size: 16384,
        segment_count: 4,
    };
    let mut rx = connect_consumer(addr, "a", g, patient).unwrap();
    // Far less than the two minutes a read of the rest would wait, far more than any of
    // these calls needs.
    let prompt = Duration::from_secs(30);
    let start = Instant::now();
    // Until the first half is surely there, and then some.
    let end = Instant::now() + Duration::from_millis(300);
    while Instant::now() < end {
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(start.elapsed() < prompt, "try_recv waited for the rest");
    go_tx.send(()).unwrap();
    let start = Instant::now();
    assert!(matches!(
        rx.recv_timeout(Duration::from_millis(200)),
        Err(RecvTimeoutError::Timeout)
    ));
    assert!(start.elapsed() < prompt, "recv_timeout waited for the rest");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let start = Instant::now();
    rt.block_on(async {
        let r = tokio::time::timeout(Duration::from_millis(200), rx.recv_async()).await;
        assert!(
            r.is_err(),
            "nothing whole arrived, yet: {:?}",
            r.map(|r| r.is_ok())
        );
    });
    assert!(start.elapsed() < prompt, "recv_async held its thread");
    go_tx.send(()).unwrap();
    let r = rx.recv().unwrap().expect("the record");
    assert_eq!(r.as_bytes().unwrap(), &payload[..]);
    drop(r);
    assert!(rx.recv().unwrap().is_none(), "the clean end after it");
    drop(rx);
    sender.join().unwrap();
}
