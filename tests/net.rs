//! Remote channels over TCP on loopback: records, spanning records, events and priority
//! events arrive intact and in order; credit stops one channel without stopping the others;
//! a gate mixes local and remote channels.

mod common;

use std::time::{Duration, Instant};

use shmflow::net::{Client, Config, Ended, Server};
use shmflow::{Geometry, Message, Producer};

fn geometry() -> Geometry {
    Geometry {
        segment_size: 4096,
        segment_count: 4,
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

fn write_all(mut tx: Producer, n: u64) {
    for i in 0..n {
        if i % 100 == 0 {
            tx.send_event(7, &i.to_le_bytes()).unwrap();
        }
        tx.send(&record(i)).unwrap();
    }
}

async fn bridge(
    server_side: shmflow::Consumer,
    client_side: Producer,
) -> (shmflow::net::ServeReport, Vec<shmflow::net::ChannelOutcome>) {
    let mut server = Server::bind("127.0.0.1:0".parse().unwrap(), Config::default())
        .await
        .unwrap();
    let addr = server.local_addr().unwrap();
    server.export("chan", server_side).unwrap();
    let serving = tokio::spawn(server.run());
    let mut client = Client::connect(addr, Config::default()).await.unwrap();
    client.import("chan", client_side).unwrap();
    let outcomes = client.run().await;
    (serving.await.unwrap(), outcomes)
}

/// How channel `name` ended, as text.
fn of(name: &str, v: &[shmflow::net::ChannelOutcome]) -> String {
    v.iter()
        .find(|c| c.name == name)
        .map(|c| format!("{:?}", c.result))
        .unwrap()
}

/// Channels "a" and "b" over one connection: the server serves `outs`, the client feeds `ins`.
async fn two_channels(
    outs: [shmflow::Consumer; 2],
    ins: [Producer; 2],
) -> (
    tokio::task::JoinHandle<shmflow::net::ServeReport>,
    tokio::task::JoinHandle<Vec<shmflow::net::ChannelOutcome>>,
) {
    let [rx_a, rx_b] = outs;
    let [in_a, in_b] = ins;
    let mut server = Server::bind("127.0.0.1:0".parse().unwrap(), Config::default())
        .await
        .unwrap();
    let addr = server.local_addr().unwrap();
    server.export("a", rx_a).unwrap();
    server.export("b", rx_b).unwrap();
    let serving = tokio::spawn(server.run());
    let mut client = Client::connect(addr, Config::default()).await.unwrap();
    client.import("a", in_a).unwrap();
    client.import("b", in_b).unwrap();
    (serving, tokio::spawn(client.run()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_events_and_spanning_records_arrive_in_order() {
    let (tx_a, rx_a) = shmflow::pair(geometry()).unwrap();
    let (tx_b, mut rx_b) = shmflow::pair(geometry()).unwrap();
    let n = 3000;
    let writer = std::thread::spawn(move || write_all(tx_a, n));
    let reader = std::thread::spawn(move || {
        let mut i = 0u64;
        let mut events = 0;
        while let Some(m) = rx_b.recv_message().unwrap() {
            match m {
                Message::Record(r) => {
                    assert_eq!(r.to_vec().unwrap(), record(i), "record {i}");
                    i += 1;
                }
                Message::Event(e) => {
                    assert_eq!(e.kind, 7);
                    assert_eq!(e.payload, &(events * 100u64).to_le_bytes());
                    events += 1;
                }
                other => panic!("unexpected message {other:?}"),
            }
        }
        (i, events)
    });
    let (report, outcomes) = bridge(rx_a, tx_b).await;
    eprintln!("{report:?}\n{outcomes:?}");
    writer.join().unwrap();
    assert_eq!(reader.join().unwrap(), (n, n.div_ceil(100)));
    assert_eq!(outcomes.len(), 1);
    assert!(
        matches!(outcomes[0].result, Ok(Ended::Clean)),
        "{outcomes:?}"
    );
    assert!(
        matches!(report.channels[0].result, Ok(Ended::Clean)),
        "{report:?}"
    );
    assert!(report.refused.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_consumer_blocks_the_remote_producer() {
    let (mut tx_a, rx_a) = shmflow::pair(geometry()).unwrap();
    let (tx_b, mut rx_b) = shmflow::pair(geometry()).unwrap();
    let bridging = tokio::spawn(bridge(rx_a, tx_b));
    // Nobody reads on the far side: the producer fills its own four segments, the four
    // the receiver credited, and then blocks.
    let writer = std::thread::spawn(move || {
        let mut sent = 0u64;
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(600) {
            match tx_a.send_timeout(&[1u8; 1000], Duration::from_millis(100)) {
                Ok(()) => sent += 1,
                Err(shmflow::SendTimeoutError::Timeout) => break,
                Err(e) => panic!("{e}"),
            }
        }
        let bp = tx_a.metrics().backpressured_ns;
        (tx_a, sent, bp)
    });
    let (tx_a, sent, bp) = tokio::task::spawn_blocking(move || writer.join().unwrap())
        .await
        .unwrap();
    // 4 records of 1000 bytes per 4 KiB segment; at most 8 segments in both channels,
    // plus the one being written.
    assert!(sent <= 4 * 9, "sent {sent} records with nobody reading");
    assert!(sent >= 4 * 4, "sent only {sent}");
    assert!(bp > 0);
    // What `shmflow stat` shows of both bridges: no credit left, segments waiting at the
    // sender, the receiver's segments sent and not given back.
    let out = tx_a.metrics().link.expect("the sending bridge's figures");
    assert!(out.sending);
    assert_eq!(out.credit, 0, "{out:?}");
    assert!(out.backlog >= 1, "{out:?}");
    assert!(out.in_flight_bytes >= 4 * 4000, "{out:?}");
    assert_eq!(out.wire_bytes, out.in_flight_bytes, "{out:?}");
    let inn = rx_b.metrics().link.expect("the receiving bridge's figures");
    assert!(!inn.sending);
    assert_eq!(inn.credit, 0, "{inn:?}");
    assert_eq!(inn.wire_bytes, out.wire_bytes, "{inn:?}");
    // A priority event overtakes the records that wait for credit, across the link too.
    let mut tx_a = tx_a;
    tx_a.send_priority_event(5, b"urgent").unwrap();
    // It comes before the last of the records that wait for credit (without the overtaking
    // it would come after every record sent before it).
    let mut before = 0u64;
    loop {
        match rx_b.recv_message_timeout(Duration::from_secs(5)).unwrap() {
            Some(Message::Event(e)) => {
                assert_eq!((e.kind, e.payload), (5, &b"urgent"[..]));
                break;
            }
            Some(Message::Record(_)) => before += 1,
            other => panic!("expected records or the event, got {other:?}"),
        }
        assert!(
            before < sent,
            "the event came after every record sent before it"
        );
    }
    // Reading on the far side lets everything through.
    let reader = std::thread::spawn(move || {
        let mut n = before;
        while let Some(r) = rx_b.recv().unwrap() {
            assert_eq!(r.as_bytes().unwrap(), &[1u8; 1000][..]);
            n += 1;
        }
        n
    });
    drop(tx_a);
    let (_, outcomes) = bridging.await.unwrap();
    assert_eq!(reader.join().unwrap(), sent);
    assert!(
        matches!(outcomes[0].result, Ok(Ended::Clean)),
        "{outcomes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_leaves_closes_its_channel_alone() {
    let (mut tx_a, rx_a) = shmflow::pair(geometry()).unwrap();
    let (mut tx_b, rx_b) = shmflow::pair(geometry()).unwrap();
    let (in_a, mut out_a) = shmflow::pair(geometry()).unwrap();
    let (in_b, mut out_b) = shmflow::pair(geometry()).unwrap();
    let (serving, running) = two_channels([rx_a, rx_b], [in_a, in_b]).await;
    // Both producers stream; channel a's reader leaves after 100 records.
    let wa = std::thread::spawn(move || {
        let mut n = 0u64;
        loop {
            match tx_a.send(&n.to_le_bytes()) {
                Ok(()) => n += 1,
                Err(shmflow::SendError::Closed(_)) => return n,
                Err(e) => panic!("{e}"),
            }
        }
    });
    let wb = std::thread::spawn(move || {
        for n in 0..20_000u64 {
            tx_b.send(&n.to_le_bytes()).unwrap();
        }
    });
    let ra = std::thread::spawn(move || {
        for n in 0..100u64 {
            let r = out_a.recv().unwrap().unwrap();
            assert_eq!(r.as_bytes().unwrap(), &n.to_le_bytes());
        }
    });
    let rb = std::thread::spawn(move || {
        let mut n = 0u64;
        while let Some(r) = out_b.recv().unwrap() {
            assert_eq!(r.as_bytes().unwrap(), &n.to_le_bytes());
            n += 1;
        }
        n
    });
    ra.join().unwrap();
    let sent_a = tokio::task::spawn_blocking(move || wa.join().unwrap())
        .await
        .unwrap();
    wb.join().unwrap();
    let got_b = tokio::task::spawn_blocking(move || rb.join().unwrap())
        .await
        .unwrap();
    assert!(sent_a >= 100);
    assert_eq!(got_b, 20_000);
    let outcomes = running.await.unwrap();
    let report = serving.await.unwrap();
    assert_eq!(of("a", &outcomes), "Ok(ConsumerLeft)", "{outcomes:?}");
    assert_eq!(of("b", &outcomes), "Ok(Clean)", "{outcomes:?}");
    assert_eq!(of("a", &report.channels), "Ok(ConsumerLeft)", "{report:?}");
    assert_eq!(of("b", &report.channels), "Ok(Clean)", "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_bridge_is_a_lost_peer_not_a_clean_end() {
    let (mut tx_a, rx_a) = shmflow::pair(geometry()).unwrap();
    let (tx_b, mut rx_b) = shmflow::pair(geometry()).unwrap();
    let mut server = Server::bind("127.0.0.1:0".parse().unwrap(), Config::default())
        .await
        .unwrap();
    let addr = server.local_addr().unwrap();
    server.export("c", rx_a).unwrap();
    let serving = tokio::spawn(server.run());
    let mut client = Client::connect(addr, Config::default()).await.unwrap();
    client.import("c", tx_b).unwrap();
    let running = tokio::spawn(client.run());
    tx_a.send(b"one").unwrap();
    let got = tokio::task::spawn_blocking(move || {
        let first = rx_b.recv().unwrap().unwrap().to_vec().unwrap();
        (first, rx_b)
    })
    .await
    .unwrap();
    assert_eq!(got.0, b"one");
    let mut rx_b = got.1;
    // The receiving bridge is dropped in the middle of the stream (its runtime task
    // aborted): its consumer must not see a clean end.
    running.abort();
    let _ = running.await;
    let end = tokio::task::spawn_blocking(move || rx_b.recv().map(|r| r.is_some()))
        .await
        .unwrap();
    match end {
        Err(shmflow::RecvError::PeerDead(e)) => assert!(e.is_remote()),
        other => panic!("expected PeerDead, got {other:?}"),
    }
    // The server sees the connection go and its producer learns it too.
    let report = serving.await.unwrap();
    assert!(report.channels[0].result.is_err(), "{report:?}");
    // (A send that finds a free segment does not look at the consumer; a flush does.)
    let flushed =
        tokio::task::spawn_blocking(move || tx_a.send(b"two").and_then(|()| tx_a.flush()))
            .await
            .unwrap();
    match flushed {
        Err(shmflow::SendError::PeerDead(e)) => assert!(e.is_remote()),
        other => panic!("expected PeerDead, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_loses_its_upstream_passes_the_loss_on() {
    // A ──▶ B (imports, then exports again) ──▶ C. The A→B link breaks in the middle of a
    // segment: C's consumer must learn it (not wait for ever), and B's sending task must end.
    let (mut tx_a, rx_a) = shmflow::pair(geometry()).unwrap();
    let (in_b, out_b) = shmflow::pair(geometry()).unwrap();
    let (in_c, mut rx_c) = shmflow::pair(geometry()).unwrap();
    let mut server_a = Server::bind("127.0.0.1:0".parse().unwrap(), Config::default())
        .await
        .unwrap();
    let addr_a = server_a.local_addr().unwrap();
    server_a.export("x", rx_a).unwrap();
    let serving_a = tokio::spawn(server_a.run());
    let mut server_b = Server::bind("127.0.0.1:0".parse().unwrap(), Config::default())
        .await
        .unwrap();
    let addr_b = server_b.local_addr().unwrap();
    server_b.export("x", out_b).unwrap();
    let serving_b = tokio::spawn(server_b.run());
    let mut client_b = Client::connect(addr_a, Config::default()).await.unwrap();
    client_b.import("x", in_b).unwrap();
    let running_b = tokio::spawn(client_b.run());
    let mut client_c = Client::connect(addr_b, Config::default()).await.unwrap();
    client_c.import("x", in_c).unwrap();
    let running_c = tokio::spawn(client_c.run());
    tx_a.send(b"through two links").unwrap();
    let rx_c = tokio::task::spawn_blocking(move || {
        assert_eq!(
            rx_c.recv().unwrap().unwrap().to_vec().unwrap(),
            b"through two links"
        );
        rx_c
    })
    .await
    .unwrap();
    // The middle of a segment: cut A→B by dropping B's client.
    running_b.abort();
    let _ = running_b.await;
    let mut rx_c = rx_c;
    let end = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tokio::task::spawn_blocking(move || rx_c.recv().map(|r| r.is_some())),
    )
    .await
    .expect("C learns of the loss")
    .unwrap();
    assert!(
        matches!(end, Err(shmflow::RecvError::PeerDead(_))),
        "{end:?}"
    );
    let report_b = tokio::time::timeout(std::time::Duration::from_secs(10), serving_b)
        .await
        .expect("B's sending side ends")
        .unwrap();
    assert!(
        matches!(report_b.channels[0].result, Ok(Ended::ProducerDead)),
        "{report_b:?}"
    );
    let _ = running_c.await;
    drop(tx_a);
    let _ = serving_a.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_takes_no_priority_events_stops_its_channel_alone() {
    // Priority events are not covered by credit: a far consumer that never reads lets them
    // pile up at the receiver. That must end its channel, not stall the connection's other
    // channels behind it.
    let (mut tx_a, rx_a) = shmflow::pair(geometry()).unwrap();
    let (mut tx_b, rx_b) = shmflow::pair(geometry()).unwrap();
    let (in_a, out_a) = shmflow::pair(geometry()).unwrap();
    let (in_b, mut out_b) = shmflow::pair(geometry()).unwrap();
    let (serving, running) = two_channels([rx_a, rx_b], [in_a, in_b]).await;
    let wa = std::thread::spawn(move || {
        let mut n = 0u64;
        loop {
            match tx_a.send_priority_event_timeout(3, &n.to_le_bytes(), Duration::from_secs(5)) {
                Ok(()) => n += 1,
                // The channel was ended by the far side, which told the sender why.
                Err(shmflow::SendTimeoutError::PeerDead(e)) if e.is_remote() => return n,
                Err(e) => panic!("after {n} events: {e}"),
            }
        }
    });
    let wb = std::thread::spawn(move || {
        for n in 0..20_000u64 {
            tx_b.send(&n.to_le_bytes()).unwrap();
        }
    });
    let rb = std::thread::spawn(move || {
        let mut n = 0u64;
        while let Some(r) = out_b.recv().unwrap() {
            assert_eq!(r.as_bytes().unwrap(), &n.to_le_bytes());
            n += 1;
        }
        n
    });
    let got_b = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::task::spawn_blocking(move || {
            wb.join().unwrap();
            rb.join().unwrap()
        }),
    )
    .await
    .expect("channel b is not held up by channel a")
    .unwrap();
    assert_eq!(got_b, 20_000);
    let sent_a = tokio::task::spawn_blocking(move || wa.join().unwrap())
        .await
        .unwrap();
    let outcomes = running.await.unwrap();
    let report = serving.await.unwrap();
    let a = outcomes.iter().find(|c| c.name == "a").unwrap();
    assert!(
        matches!(a.result, Err(shmflow::net::LinkError::PriorityEventsUnread)),
        "{outcomes:?}"
    );
    assert_eq!(of("b", &outcomes), "Ok(Clean)", "{outcomes:?}");
    // The sender is told why.
    assert!(of("a", &report.channels).contains("priority"), "{report:?}");
    assert_eq!(of("b", &report.channels), "Ok(Clean)", "{report:?}");
    // The far consumer gets the events that reached its lane, in order, then the failure.
    let mut out_a = out_a;
    let mut k = 0u64;
    let end = loop {
        match out_a.recv_message() {
            Ok(Some(Message::Event(e))) => {
                assert_eq!((e.kind, e.payload), (3, &k.to_le_bytes()[..]));
                k += 1;
            }
            other => break format!("{other:?}"),
        }
    };
    // The lane's four; the channel was ended by the bound (4 in the lane, 256 waiting, one
    // more), not by anything else.
    assert_eq!(k, 4, "{k} of {sent_a} events");
    assert!(sent_a > 4 + 256, "{sent_a} events sent");
    assert!(end.contains("Err"), "{end}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_sent_after_a_waiting_priority_event_stay_behind_it() {
    // The far consumer starts late: 12 priority events find its lane (4 slots) full, and the
    // records sent after each must still come after it, as on one machine.
    let (mut tx_a, rx_a) = shmflow::pair(geometry()).unwrap();
    let (tx_b, mut rx_b) = shmflow::pair(geometry()).unwrap();
    let bridging = tokio::spawn(bridge(rx_a, tx_b));
    // Twelve records of 8 bytes fit the credit: the writer does not block.
    for i in 0..12u64 {
        tx_a.send_priority_event(9, &i.to_le_bytes()).unwrap();
        tx_a.send(&i.to_le_bytes()).unwrap();
    }
    drop(tx_a);
    // Until what reached the far channel stops growing: four events fill its lane, and what
    // follows the fifth is held (frames of 16 bytes; all twelve would be 192). Priority
    // events overtake at the sender too, so even none may have been written.
    let mut written = u64::MAX;
    let mut still = 0;
    while still < 6 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = rx_b.metrics().bytes_written;
        still = if now == written { still + 1 } else { 0 };
        written = now;
    }
    assert!(
        written < 12 * 16,
        "nothing was held: {written} bytes written"
    );
    let reader = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        while let Some(m) = rx_b.recv_message().unwrap() {
            match m {
                Message::Event(e) => {
                    assert_eq!(e.kind, 9);
                    seen.push(('e', u64::from_le_bytes(e.payload.try_into().unwrap())));
                }
                Message::Record(r) => seen.push(('r', *r.as_pod::<u64>().unwrap())),
                other => panic!("unexpected message {other:?}"),
            }
        }
        seen
    });
    let (_, outcomes) = bridging.await.unwrap();
    assert!(
        matches!(outcomes[0].result, Ok(Ended::Clean)),
        "{outcomes:?}"
    );
    let seen = reader.await.unwrap();
    assert_eq!(seen.len(), 24, "{seen:?}");
    for i in 0..12u64 {
        let e = seen.iter().position(|&x| x == ('e', i)).unwrap();
        let r = seen.iter().position(|&x| x == ('r', i)).unwrap();
        assert!(e < r, "record {i} came before its event: {seen:?}");
    }
    let order = |k| seen.iter().filter(move |x| x.0 == k).map(|x| x.1);
    assert!(order('e').eq(0..12), "{seen:?}");
    assert!(order('r').eq(0..12), "{seen:?}");
}

/// Channel "b"'s consumer has left (it is cancelled at the receiver, and its sender sends
/// nothing more for it, not even `Close`), and channel "a"'s end waits behind priority events
/// that its consumer, starting late, has no room for yet, when the server's side goes away
/// (its `run` dropped): "a" still arrives whole and ends clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_channel_does_not_cut_what_another_holds_at_the_end() {
    let (mut tx_a, rx_a) = shmflow::pair(geometry()).unwrap();
    let (in_a, mut out_a) = shmflow::pair(geometry()).unwrap();
    let (mut tx_b, rx_b) = shmflow::pair(geometry()).unwrap();
    let (in_b, out_b) = shmflow::pair(geometry()).unwrap();
    drop(out_b);
    let (serving, client) = two_channels([rx_a, rx_b], [in_a, in_b]).await;
    // "b" streams until the receiver, finding its consumer gone, cancels it.
    let wb = std::thread::spawn(move || loop {
        match tx_b.send(&record(0)) {
            Ok(()) => {}
            Err(shmflow::SendError::Closed(_)) => return,
            Err(e) => panic!("{e}"),
        }
    });
    tokio::task::spawn_blocking(move || wb.join().unwrap())
        .await
        .unwrap();
    for i in 0..12u64 {
        tx_a.send_priority_event(9, &i.to_le_bytes()).unwrap();
        tx_a.send(&i.to_le_bytes()).unwrap();
    }
    // Returns once the sending bridge has read everything, the end included; its `Close`
    // follows at once.
    tokio::task::spawn_blocking(move || tx_a.close_timeout(Duration::from_secs(20)).unwrap())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    serving.abort();
    let reader = tokio::task::spawn_blocking(move || {
        let mut n = 0;
        while let Some(m) = out_a.recv_message().unwrap() {
            assert!(matches!(m, Message::Event(_) | Message::Record(_)), "{m:?}");
            n += 1;
        }
        n
    });
    let outcomes = tokio::time::timeout(Duration::from_secs(20), client)
        .await
        .expect("the client ends")
        .unwrap();
    assert_eq!(of("a", &outcomes), "Ok(Clean)", "{outcomes:?}");
    assert_eq!(of("b", &outcomes), "Ok(ConsumerLeft)", "{outcomes:?}");
    assert_eq!(reader.await.unwrap(), 24);
}

/// The bridges count what crosses them as a reader and a writer would: records and payload
/// bytes (so `shmflow stat` shows real record rates for a bridge's end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridges_count_records_and_payload_bytes() {
    let (a, b) = (
        common::unique_name("net-count-a"),
        common::unique_name("net-count-b"),
    );
    let tx_a = Producer::create(&a, geometry()).unwrap();
    let rx_a = shmflow::Consumer::open(&a).unwrap();
    let tx_b = Producer::create(&b, geometry()).unwrap();
    let mut rx_b = shmflow::Consumer::open(&b).unwrap();
    let (mon_a, mon_b) = (
        shmflow::monitor::Monitor::open(&a).unwrap(),
        shmflow::monitor::Monitor::open(&b).unwrap(),
    );
    let n = 500;
    let payload: u64 = (0..n).map(|i| record(i).len() as u64).sum();
    let writer = std::thread::spawn(move || write_all(tx_a, n));
    let reader = std::thread::spawn(move || {
        let mut i = 0u64;
        while let Some(r) = rx_b.recv().unwrap() {
            assert_eq!(r.to_vec().unwrap(), record(i));
            i += 1;
        }
        i
    });
    let (_report, outcomes) = bridge(rx_a, tx_b).await;
    writer.join().unwrap();
    assert_eq!(reader.join().unwrap(), n, "{outcomes:?}");
    let (sa, sb) = (mon_a.snapshot(), mon_b.snapshot());
    assert_eq!(
        (sa.records_read, sa.bytes_read),
        (n, payload),
        "sending bridge"
    );
    assert_eq!(
        (sb.records_written, sb.bytes_written),
        (n, payload),
        "receiving bridge"
    );
}

/// Buffer debloating across the link: the consumer behind a receiving bridge reads slowly
/// with a debloating target, and the credit the bridge announces never lets more than the
/// consumer's cap be in flight (segments it holds plus credit unspent), where without the cap
/// the sender would be credited every free segment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_credit_a_receiver_announces_stays_within_its_consumers_cap() {
    let g = Geometry {
        segment_size: 16 * 1024,
        segment_count: 16,
    };
    let (mut tx_a, rx_a) = shmflow::pair(g).unwrap();
    let (tx_b, mut rx_b) = shmflow::pair(g).unwrap();
    rx_b.set_debloat_target(Some(Duration::from_millis(10)));
    let writer = std::thread::spawn(move || {
        let rec = [7u8; 1000];
        while tx_a.send(&rec).is_ok() {}
    });
    let reader = std::thread::spawn(move || common::read_slowly_under_a_cap(&mut rx_b));
    let bridging = tokio::spawn(bridge(rx_a, tx_b));
    let seen = tokio::task::spawn_blocking(move || reader.join().unwrap())
        .await
        .unwrap();
    // The reader is gone: the link ends, and so does the writer.
    let _ = bridging.await.unwrap();
    writer.join().unwrap();
    common::assert_cap_held(&seen, "bridges");
}
