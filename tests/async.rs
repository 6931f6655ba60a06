//! The async forms of the waiting calls (feature `tokio`): records between sync and async
//! ends in both directions and across processes, cancellation at every `.await`, closed and
//! dead peers seen by an awaiting task, gates, and many tasks waiting at once.

#![cfg(feature = "tokio")]

mod common;

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use common::*;
use shmflow::{
    Consumer, Gate, GateGeometry, GateMessage, Geometry, Message, Producer, RecvError, SendError,
    WaitStrategy,
};

/// The region a child process opens.
const NAME_VAR: &str = "SHMFLOW_TEST_NAME";

/// Every await in these tests ends within this, or the test fails instead of hanging.
const BOUND: Duration = Duration::from_secs(20);

fn small() -> Geometry {
    Geometry {
        segment_size: 4096,
        segment_count: 4,
    }
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Every record to the end of the stream, as "record LEN", and every aborted one as "aborted".
async fn records_and_aborts(mut rx: Consumer) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        match rx.recv_async().await {
            Ok(Some(r)) => match r.to_vec_async().await {
                Ok(v) => seen.push(format!("record {}", v.len())),
                Err(RecvError::RecordAborted(_)) => seen.push("aborted".into()),
                Err(e) => panic!("{e}"),
            },
            Ok(None) => break,
            Err(RecvError::RecordAborted(_)) => seen.push("aborted".into()),
            Err(e) => panic!("{e}"),
        }
    }
    seen
}

async fn bounded<F: std::future::Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(BOUND, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: did not complete within {BOUND:?}"),
    }
}

/// The futures cross `.await` in `tokio::spawn`: they must be `Send`.
#[test]
fn futures_are_send() {
    fn send<T: Send>(_: &T) {}
    let (mut tx, mut rx) = shmflow::pair(small()).unwrap();
    send(&rx.recv_async());
    send(&rx.recv_message_async());
    send(&tx.send_async(b"x"));
    send(&tx.send_async("x"));
    send(&tx.send_async(&vec![0u8; 3]));
    send(&tx.claim_async(8));
    send(&tx.stream_async());
    send(&tx.send_event_async(1, b""));
    send(&tx.send_priority_event_async(1, b""));
    send(&tx.flush_async());
    let mut gate = Gate::create_anonymous(GateGeometry::new(1)).unwrap().0;
    send(&gate.recv_async());
}

/// A sync producer thread and an async consumer, then the reverse, with parked ends (every
/// wait a sleep) and with the default strategy; on a pair with doorbells and on one whose
/// consumer opened the region from a bare descriptor (through the bridge).
#[test]
fn sync_and_async_ends_interoperate_both_ways() {
    let pairs: [fn(Geometry) -> (Producer, Consumer); 2] =
        [|g| shmflow::pair(g).unwrap(), bell_less_pair];
    for (wait, make) in [WaitStrategy::Park, WaitStrategy::Block]
        .into_iter()
        .flat_map(|w| pairs.map(|m| (w, m)))
    {
        const N: u64 = 20_000;
        // sync → async
        let (mut tx, mut rx) = make(small());
        rx.set_wait_strategy(wait);
        tx.set_wait_strategy(wait);
        let writer = std::thread::spawn(move || {
            let mut buf = Vec::new();
            for seq in 0..N {
                make_record(seq, (seq % 300) as usize, &mut buf);
                tx.send(&buf).unwrap();
                if seq % 1000 == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        current_thread().block_on(async {
            let mut scratch = Vec::new();
            let mut seq = 0;
            while let Some(r) = bounded("recv_async", rx.recv_async()).await.unwrap() {
                check_record(
                    seq,
                    (seq % 300) as usize,
                    r.as_bytes().unwrap(),
                    &mut scratch,
                )
                .unwrap();
                seq += 1;
            }
            assert_eq!(seq, N);
        });
        writer.join().unwrap();

        // async → sync
        let (mut tx, mut rx) = make(small());
        rx.set_wait_strategy(wait);
        tx.set_wait_strategy(wait);
        let reader = std::thread::spawn(move || {
            let mut scratch = Vec::new();
            let mut seq = 0;
            while let Some(r) = rx.recv().unwrap() {
                check_record(
                    seq,
                    (seq % 5000) as usize,
                    &r.to_vec().unwrap(),
                    &mut scratch,
                )
                .unwrap();
                seq += 1;
                if seq % 1000 == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            seq
        });
        multi_thread().block_on(async move {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                for seq in 0..N {
                    make_record(seq, (seq % 5000) as usize, &mut buf);
                    bounded("send_async", tx.send_async(&buf)).await.unwrap();
                }
            })
            .await
            .unwrap();
        });
        assert_eq!(reader.join().unwrap(), N);
    }
}

/// Both ends async in one runtime, records larger than the whole pool included (they go out
/// part by part), events and priority events in order, claims and streamed records.
#[test]
fn async_to_async_with_every_kind_of_message() {
    current_thread().block_on(async {
        let (mut tx, mut rx) = shmflow::pair(small()).unwrap();
        let big = vec![7u8; 40_000]; // ten segments' worth, the pool holds four
        let writer = tokio::spawn(async move {
            tx.send_async(b"first").await.unwrap();
            tx.send_async(&big).await.unwrap();
            let mut c = tx.claim_async(8).await.unwrap();
            c.copy_from_slice(&9u64.to_le_bytes());
            c.commit();
            tx.send_event_async(3, b"event").await.unwrap();
            let mut w = tx.stream_async().await.unwrap();
            w.write_async(&vec![1u8; 9000]).await.unwrap();
            w.finish().unwrap();
            tx.send_priority_event_async(4, b"urgent").await.unwrap();
            tx.flush_async().await.unwrap();
        });
        let mut got = Vec::new();
        while let Some(m) = bounded("recv_message_async", rx.recv_message_async())
            .await
            .unwrap()
        {
            match m {
                Message::Record(r) => {
                    let v = r.to_vec_async().await.unwrap();
                    got.push(format!("record {} {}", v.len(), v[0]));
                }
                Message::Event(e) => got.push(format!(
                    "event {} {}",
                    e.kind,
                    String::from_utf8_lossy(e.payload)
                )),
                other => panic!("unexpected message {other:?}"),
            }
        }
        writer.await.unwrap();
        let want = vec![
            "record 5 102".to_string(),
            "record 40000 7".to_string(),
            "record 8 9".to_string(),
            "event 3 event".to_string(),
            "record 9000 1".to_string(),
        ];
        // The priority event may overtake what was queued before it, never what followed.
        let prio = got
            .iter()
            .position(|m| m == "event 4 urgent")
            .expect("the priority event arrives");
        got.remove(prio);
        assert_eq!(got, want);
    });
}

/// Awaited barriers wait for room like records: an aligned one for a segment, an unaligned
/// one also for a lane slot; each arrives in its place, its announcement ahead.
#[test]
fn awaited_barriers_wait_for_room_and_arrive_in_place() {
    current_thread().block_on(async {
        let (mut tx, mut rx) = shmflow::pair(small()).unwrap();
        let writer = tokio::spawn(async move {
            for i in 0..20u64 {
                tx.send_async(&vec![i as u8; 3000]).await.unwrap();
                if i % 5 == 4 {
                    let alignment = if i % 10 == 4 {
                        shmflow::Alignment::Aligned
                    } else {
                        shmflow::Alignment::Unaligned
                    };
                    tx.send_barrier_async(i, alignment, b"").await.unwrap();
                }
            }
            tx.forward_barrier_async(100, shmflow::Alignment::Aligned, 1, b"")
                .await
                .unwrap();
            tx.flush_async().await.unwrap();
        });
        let mut got = Vec::new();
        while let Some(m) = bounded("recv_message_async", rx.recv_message_async())
            .await
            .unwrap()
        {
            match m {
                Message::Record(r) => got.push(format!("r{}", r.as_bytes().unwrap()[0])),
                Message::Barrier(b) if b.priority => got.push(format!("!{}", b.id)),
                Message::Barrier(b) => got.push(format!("B{}@{}", b.id, b.emitted_ns)),
                other => panic!("unexpected message {other:?}"),
            }
            // A slow reader: the pool of four stays full while the writer waits.
            tokio::task::yield_now().await;
        }
        writer.await.unwrap();
        let in_band: Vec<&str> = got
            .iter()
            .filter(|m| !m.starts_with('!'))
            .map(|m| m.split('@').next().unwrap())
            .collect();
        let mut want: Vec<String> = Vec::new();
        for i in 0..20u64 {
            want.push(format!("r{i}"));
            if i % 5 == 4 {
                want.push(format!("B{i}"));
            }
        }
        want.push("B100".into());
        assert_eq!(in_band, want);
        assert!(
            got.contains(&"B100@1".to_string()),
            "the forwarded time is kept"
        );
        // Each unaligned barrier's announcement comes before the barrier itself.
        for id in [9u64, 19] {
            let ann = got.iter().position(|m| *m == format!("!{id}"));
            let own = got.iter().position(|m| m.starts_with(&format!("B{id}@")));
            assert!(ann.is_some() && ann < own, "{id}: {got:?}");
        }
    });
}

/// `send_async` takes its record as any bytes by reference (slice, array, `Vec`, `str`,
/// `String`); arrays that fill segments to their end and wait for the next one (the pool of
/// four is full until the reader frees it) arrive whole and in order.
#[test]
fn send_async_takes_bytes_in_any_form() {
    current_thread().block_on(async {
        let (mut tx, mut rx) = shmflow::pair(small()).unwrap();
        let writer = tokio::spawn(async move {
            let owned = vec![2u8; 100];
            let text = String::from("three");
            tx.send_async(&[1u8; 0]).await.unwrap();
            tx.send_async(&owned).await.unwrap();
            tx.send_async(&owned[..10]).await.unwrap();
            tx.send_async("three").await.unwrap();
            tx.send_async(&text).await.unwrap();
            let f = tx.send_async(&[4u8; 1000]);
            assert!(format!("{f:?}").contains("len: 1000"), "{f:?}");
            f.await.unwrap();
            // Sixty records of 1000 B: about fifteen segments through a pool of four.
            for i in 0..60u8 {
                let mut rec = [i; 1000];
                rec[999] = !i;
                tx.send_async(&rec).await.unwrap();
            }
        });
        let mut got = Vec::new();
        while let Some(r) = bounded("recv_async", rx.recv_async()).await.unwrap() {
            got.push(r.as_bytes().unwrap().to_vec());
        }
        writer.await.unwrap();
        assert_eq!(got.len(), 6 + 60);
        assert_eq!(got[0], b"");
        assert_eq!(got[1], vec![2u8; 100]);
        assert_eq!(got[2], vec![2u8; 10]);
        assert_eq!(got[3], b"three");
        assert_eq!(got[4], b"three");
        assert_eq!(got[5], vec![4u8; 1000]);
        for (i, r) in got[6..].iter().enumerate() {
            let i = i as u8;
            assert_eq!(r.len(), 1000);
            assert!(r[..999].iter().all(|&b| b == i), "record {i}");
            assert_eq!(r[999], !i, "record {i}");
        }
    });
}

/// Dropping `recv_async` while it waits (a timeout around it, again and again) loses no
/// record: every record arrives once, in order.
#[test]
fn a_dropped_recv_loses_nothing() {
    const N: u64 = 100;
    let (mut tx, mut rx) = shmflow::pair(small()).unwrap();
    rx.set_wait_strategy(WaitStrategy::Park);
    let writer = std::thread::spawn(move || {
        let mut buf = Vec::new();
        for seq in 0..N {
            make_record(seq, 64, &mut buf);
            tx.send(&buf).unwrap();
            std::thread::sleep(Duration::from_millis(3));
        }
    });
    let timeouts = current_thread().block_on(async {
        let mut scratch = Vec::new();
        let (mut seq, mut timeouts) = (0, 0u64);
        let start = Instant::now();
        loop {
            assert!(start.elapsed() < BOUND, "stuck at record {seq}");
            // Shorter than the gaps between records (tokio's timer counts milliseconds): most
            // calls are dropped waiting.
            match tokio::time::timeout(Duration::from_millis(1), rx.recv_async()).await {
                Err(_) => timeouts += 1,
                Ok(Ok(Some(r))) => {
                    check_record(seq, 64, r.as_bytes().unwrap(), &mut scratch).unwrap();
                    seq += 1;
                }
                Ok(Ok(None)) => break,
                Ok(Err(e)) => panic!("{e}"),
            }
        }
        assert_eq!(seq, N);
        timeouts
    });
    writer.join().unwrap();
    assert!(timeouts > 0, "no call was dropped while waiting");
    println!("{N} records, {timeouts} dropped recv futures");
}

/// Dropping `send_async` or `claim_async` while they wait for a segment publishes nothing:
/// the consumer sees exactly the records whose sends completed.
#[test]
fn a_dropped_send_or_claim_publishes_nothing() {
    current_thread().block_on(async {
        let (mut tx, mut rx) = shmflow::pair(small()).unwrap();
        // Fill the pool: nobody reads.
        let mut sent = 0u64;
        let mut buf = Vec::new();
        loop {
            make_record(sent, 1500, &mut buf);
            match tx.try_send(&buf) {
                Ok(()) => sent += 1,
                Err(shmflow::TrySendError::Full) => break,
                Err(e) => panic!("{e}"),
            }
        }
        // Each of these waits for a segment and is dropped by its timeout.
        make_record(1_000_000, 1500, &mut buf);
        let short = Duration::from_millis(20);
        assert!(tokio::time::timeout(short, tx.send_async(&buf))
            .await
            .is_err());
        assert!(tokio::time::timeout(short, tx.claim_async(1000))
            .await
            .is_err());
        // A spanning record that the pool can hold whole waits for all its segments first.
        let span = vec![3u8; 9000];
        assert!(tokio::time::timeout(short, tx.send_async(&span))
            .await
            .is_err());
        assert!(tokio::time::timeout(short, tx.send_event_async(1, b"e"))
            .await
            .is_err());
        // The time spent waiting counts as backpressure, though every wait was dropped.
        assert!(tx.metrics().backpressured_ns >= 4 * short.as_nanos() as u64 / 2);
        drop(tx);
        let mut scratch = Vec::new();
        let mut seq = 0;
        while let Some(r) = rx.recv_async().await.unwrap() {
            check_record(seq, 1500, r.as_bytes().unwrap(), &mut scratch).unwrap();
            seq += 1;
        }
        assert_eq!(seq, sent, "exactly the completed sends arrive");
    });
}

/// A record larger than the pool that is dropped half-way is reported aborted, never handed
/// over in part, and the channel goes on.
#[test]
fn a_dropped_send_larger_than_the_pool_is_aborted() {
    current_thread().block_on(async {
        let (mut tx, rx) = shmflow::pair(small()).unwrap();
        let big = vec![5u8; 100_000];
        assert!(
            tokio::time::timeout(Duration::from_millis(50), tx.send_async(&big))
                .await
                .is_err()
        );
        let reader = tokio::spawn(records_and_aborts(rx));
        tx.send_async(b"after").await.unwrap();
        tx.flush_async().await.unwrap();
        drop(tx);
        let seen = bounded("reader", reader).await.unwrap();
        assert_eq!(seen, vec!["aborted".to_string(), "record 5".to_string()]);
    });
}

/// The end of the stream and a consumer that leaves reach awaiting tasks.
#[test]
fn closed_peers_end_awaiting_calls() {
    current_thread().block_on(async {
        let (tx, mut rx) = shmflow::pair(small()).unwrap();
        let closer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            drop(tx);
        });
        assert!(bounded("recv_async", rx.recv_async())
            .await
            .unwrap()
            .is_none());
        closer.await.unwrap();

        let (mut tx, rx) = shmflow::pair(small()).unwrap();
        let leaver = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            drop(rx);
        });
        let err = bounded("send_async", async {
            loop {
                if let Err(e) = tx.send_async(&[0u8; 1000]).await {
                    return e;
                }
            }
        })
        .await;
        assert!(matches!(err, SendError::Closed(_)), "{err}");
        leaver.await.unwrap();
    });
}

/// A child process that feeds a named channel and then is killed: the awaiting consumer
/// gets every record committed before, then `PeerDead`; the reverse for a blocked async
/// producer whose consumer is killed.
#[test]
fn dead_peers_reach_awaiting_tasks() {
    let name = std::env::var(NAME_VAR).unwrap_or_else(|_| unique_name("async-dead"));
    match role().as_deref() {
        Some("producer") => child_main(|| {
            let mut tx = Producer::open(&name).map_err(|e| e.to_string())?;
            for i in 0..100u64 {
                tx.send(&i.to_le_bytes()).map_err(|e| e.to_string())?;
            }
            tx.flush().map_err(|e| e.to_string())?;
            std::thread::sleep(Duration::from_secs(60));
            Ok(())
        }),
        Some("consumer") => child_main(|| {
            let mut rx = Consumer::open(&format!("{name}-rev")).map_err(|e| e.to_string())?;
            let _first = rx.recv().map_err(|e| e.to_string())?;
            std::thread::sleep(Duration::from_secs(60));
            Ok(())
        }),
        Some(_) => return,
        None => {}
    }
    let rt = current_thread();
    // An awaiting consumer, its producer killed.
    let mut rx = Consumer::create(&name, small()).unwrap();
    let mut child = spawn(
        "dead_peers_reach_awaiting_tasks",
        "producer",
        &[(NAME_VAR, name.clone())],
        None,
    );
    rt.block_on(async {
        for i in 0..100u64 {
            let r = bounded("recv_async", rx.recv_async())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(r.as_pod::<u64>(), Some(&i));
        }
        let waiting = tokio::spawn(async move {
            let r = bounded("recv_async", rx.recv_async()).await;
            (r.map(|o| o.is_some()), Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        child.kill().unwrap();
        let killed = Instant::now();
        child.wait().unwrap();
        let (r, seen) = waiting.await.unwrap();
        assert!(matches!(r, Err(RecvError::PeerDead(_))), "{r:?}");
        println!(
            "awaiting consumer saw its producer dead after {:?}",
            seen - killed
        );
    });
    // An awaiting producer, blocked by backpressure, its consumer killed.
    let mut tx = Producer::create(&format!("{name}-rev"), small()).unwrap();
    let mut child = spawn(
        "dead_peers_reach_awaiting_tasks",
        "consumer",
        &[(NAME_VAR, name.clone())],
        None,
    );
    rt.block_on(async {
        let blocked = tokio::spawn(async move {
            loop {
                if let Err(e) = bounded("send_async", tx.send_async(&[1u8; 2000])).await {
                    return (e, Instant::now());
                }
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        child.kill().unwrap();
        let killed = Instant::now();
        child.wait().unwrap();
        let (e, seen) = blocked.await.unwrap();
        assert!(matches!(e, SendError::PeerDead(_)), "{e}");
        println!(
            "awaiting producer saw its consumer dead after {:?}",
            seen - killed
        );
    });
}

/// A gate read by a task: records from a sync producer in another process, then its death.
#[test]
fn a_gate_is_read_by_a_task() {
    let name = std::env::var(NAME_VAR).unwrap_or_else(|_| unique_name("async-gate"));
    if let Some(r) = role() {
        if r == "channel" {
            child_main(|| {
                let mut tx = Producer::open_channel(&name, 1).map_err(|e| e.to_string())?;
                for i in 0..1000u64 {
                    tx.send(&i.to_le_bytes()).map_err(|e| e.to_string())?;
                }
                tx.flush().map_err(|e| e.to_string())?;
                std::thread::sleep(Duration::from_secs(60));
                Ok(())
            });
        }
        return;
    }
    let mut gate = Gate::create(&name, GateGeometry::new(2)).unwrap();
    gate.set_wait_strategy(WaitStrategy::Park);
    let local = Producer::open_channel(&name, 0).unwrap();
    let mut child = spawn(
        "a_gate_is_read_by_a_task",
        "channel",
        &[(NAME_VAR, name.clone())],
        None,
    );
    multi_thread().block_on(async move {
        let reader = tokio::spawn(async move {
            let (mut records, mut ended, mut dead) = (0u64, 0, 0);
            while let Some(m) = bounded("gate recv_async", gate.recv_async()).await.unwrap() {
                match m {
                    GateMessage::Record { channel, record } => {
                        assert_eq!(channel, 1);
                        assert_eq!(record.as_pod::<u64>(), Some(&records));
                        records += 1;
                    }
                    GateMessage::EndOfPartition { channel } => {
                        assert_eq!(channel, 0);
                        ended += 1;
                    }
                    GateMessage::ChannelDead { channel, .. } => {
                        assert_eq!(channel, 1);
                        dead += 1;
                    }
                    other => panic!("{other:?}"),
                }
            }
            (records, ended, dead)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(local);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(bounded("gate reader", reader).await.unwrap(), (1000, 1, 1));
    });
}

/// A pair whose consumer opened the region from a bare descriptor: its async waits sleep
/// through the bridge thread (as on a named region), not on a doorbell.
fn bell_less_pair(g: Geometry) -> (Producer, Consumer) {
    let (tx, handle) = Producer::create_anonymous(g).unwrap();
    let rx = Consumer::from_fd(handle.as_fd()).unwrap();
    (tx, rx)
}

/// More tasks wait at once than one `futex_waitv` can watch (their regions opened from bare
/// descriptors, so that they wait through the bridge): every one is woken.
#[test]
fn hundreds_of_waiting_tasks_are_all_woken() {
    const TASKS: usize = 300;
    multi_thread().block_on(async {
        let mut producers = Vec::new();
        let mut readers = Vec::new();
        for _ in 0..TASKS {
            let (tx, mut rx) = bell_less_pair(Geometry {
                segment_size: 4096,
                segment_count: 2,
            });
            rx.set_wait_strategy(WaitStrategy::Park);
            producers.push(tx);
            readers.push(tokio::spawn(async move {
                let r = rx.recv_async().await.unwrap().unwrap();
                r.as_pod::<u64>().copied()
            }));
        }
        // Let every task park.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for (i, tx) in producers.iter_mut().enumerate() {
            tx.send(&(i as u64).to_le_bytes()).unwrap();
        }
        for (i, r) in readers.into_iter().enumerate() {
            assert_eq!(bounded("reader", r).await.unwrap(), Some(i as u64));
        }
    });
}

/// Idle time of an awaiting consumer is counted, also for waits whose future was dropped.
#[test]
fn awaiting_counts_as_idle_time() {
    current_thread().block_on(async {
        let (_tx, mut rx) = shmflow::pair(small()).unwrap();
        rx.set_wait_strategy(WaitStrategy::Park);
        for _ in 0..5 {
            assert!(
                tokio::time::timeout(Duration::from_millis(20), rx.recv_async())
                    .await
                    .is_err()
            );
        }
        let idle = rx.metrics().idle_ns;
        assert!(
            idle >= 5 * 15_000_000,
            "idle {idle} ns after 100 ms of waits"
        );
    });
}

/// Dropping `next_part_async` while it waits for the next part leaves the record as it was:
/// the next call returns that part, and the record arrives whole.
#[test]
fn a_dropped_part_read_loses_nothing() {
    use std::io::Write;
    let (mut tx, mut rx) = shmflow::pair(small()).unwrap();
    let mut want = Vec::new();
    make_record(7, 30_000, &mut want);
    let sent = want.clone();
    let writer = std::thread::spawn(move || {
        let mut w = tx.stream().unwrap();
        for chunk in sent.chunks(3000) {
            w.write_all(chunk).unwrap();
            std::thread::sleep(Duration::from_millis(3));
        }
        w.finish().unwrap();
    });
    let (got, timeouts) = current_thread().block_on(async {
        let mut r = bounded("recv_async", rx.recv_async())
            .await
            .unwrap()
            .unwrap();
        let (mut got, mut timeouts) = (Vec::new(), 0u64);
        let start = Instant::now();
        loop {
            assert!(start.elapsed() < BOUND, "stuck after {} bytes", got.len());
            match tokio::time::timeout(Duration::from_millis(1), r.next_part_async()).await {
                Err(_) => timeouts += 1,
                Ok(Ok(Some(part))) => got.extend_from_slice(part),
                Ok(Ok(None)) => break,
                Ok(Err(e)) => panic!("{e}"),
            }
        }
        (got, timeouts)
    });
    writer.join().unwrap();
    assert!(timeouts > 0, "no part read was dropped while waiting");
    assert_eq!(got, want);
}

/// Dropping `write_async` while it waits for a segment spoils the record: later writes and
/// `finish` fail, the record is aborted (parts were out), and the next record goes through.
#[test]
fn a_dropped_streamed_write_discards_the_record() {
    current_thread().block_on(async {
        let (mut tx, rx) = shmflow::pair(small()).unwrap();
        {
            let mut w = tx.stream_async().await.unwrap();
            w.write_async(&[1u8; 1000]).await.unwrap();
            // Nobody reads: the pool runs dry part-way through this write.
            let big = vec![2u8; 50_000];
            assert!(
                tokio::time::timeout(Duration::from_millis(30), w.write_async(&big))
                    .await
                    .is_err()
            );
            // How much of `big` went in is unknown: the record cannot be finished.
            assert!(matches!(
                w.write_async(b"more").await,
                Err(shmflow::WriteError::RecordAborted(_))
            ));
            assert!(matches!(
                w.finish(),
                Err(shmflow::WriteError::RecordAborted(_))
            ));
        }
        let reader = tokio::spawn(records_and_aborts(rx));
        tx.send_async(b"next").await.unwrap();
        drop(tx);
        let seen = bounded("reader", reader).await.unwrap();
        assert_eq!(seen, vec!["aborted".to_string(), "record 4".to_string()]);
    });
}

/// A `recv_message_async` dropped while it waits (watching for priority events) leaves no
/// trace: a later plain `recv` that skips the rest of a dropped record and finds a priority
/// event pending reads on correctly.
#[test]
fn a_dropped_message_wait_leaves_plain_reads_intact() {
    use std::io::Write;
    use std::sync::mpsc;
    let (mut tx, mut rx) = shmflow::pair(small()).unwrap();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let producer = std::thread::spawn(move || {
        {
            let mut w = tx.stream().unwrap();
            w.write_all(&[1u8; 6000]).unwrap(); // the first part is out
            ready_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            w.write_all(&[1u8; 6000]).unwrap();
            w.finish().unwrap();
        }
        tx.send_priority_event(7, b"p").unwrap();
        tx.send(b"after").unwrap();
        ready_tx.send(()).unwrap();
        go_rx.recv().unwrap();
    });
    ready_rx.recv().unwrap();
    current_thread().block_on(async {
        // The spanning record, dropped unread: the consumer skips its rest later.
        match bounded("recv_message_async", rx.recv_message_async())
            .await
            .unwrap()
        {
            Some(Message::Record(r)) => assert!(r.is_spanning()),
            other => panic!("{other:?}"),
        }
        // Waits for the rest (watching for priority events) and is dropped.
        assert!(
            tokio::time::timeout(Duration::from_millis(5), rx.recv_message_async())
                .await
                .is_err()
        );
    });
    go_tx.send(()).unwrap();
    ready_rx.recv().unwrap();
    // A plain read skips the rest of the record and the priority event.
    let r = rx.recv().unwrap().unwrap();
    assert_eq!(r.as_bytes(), Some(&b"after"[..]));
    drop(r);
    go_tx.send(()).unwrap();
    producer.join().unwrap();
    assert!(rx.recv().unwrap().is_none());
}

/// User and system CPU time, in clock ticks, of this process's bridge threads.
fn bridge_cpu_ticks() -> Result<u64, String> {
    let mut total = 0;
    let mut found = false;
    for t in std::fs::read_dir("/proc/self/task").map_err(|e| e.to_string())? {
        let dir = t.map_err(|e| e.to_string())?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() != "shmflow-bridge" {
            continue;
        }
        found = true;
        let stat = std::fs::read_to_string(dir.join("stat")).map_err(|e| e.to_string())?;
        // After the command name (in parentheses): state is field 3, utime 14, stime 15.
        let rest = &stat[stat.rfind(')').ok_or("stat")? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        total += f[11].parse::<u64>().map_err(|e| e.to_string())?;
        total += f[12].parse::<u64>().map_err(|e| e.to_string())?;
    }
    if !found {
        return Err("no bridge thread".into());
    }
    Ok(total)
}

/// Refuses `futex_waitv` (syscall 449 on x86_64) with `EPERM` in this thread and the threads
/// it starts, as a container's seccomp profile that does not list it does.
#[cfg(target_arch = "x86_64")]
fn refuse_futex_waitv() -> Result<(), String> {
    const LD_NR: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    let filter = [
        libc::sock_filter {
            code: LD_NR,
            jt: 0,
            jf: 0,
            k: 0,
        }, // the syscall number
        libc::sock_filter {
            code: JEQ,
            jt: 0,
            jf: 1,
            k: libc::SYS_futex_waitv as u32,
        },
        libc::sock_filter {
            code: RET,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        },
        libc::sock_filter {
            code: RET,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: plain prctl calls; `prog` and the filter it points to outlive them.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog) != 0
        {
            return Err(format!("seccomp: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Where `futex_waitv` is refused (a seccomp filter), the bridge falls back to looking at its
/// words every millisecond instead of retrying at once: awaiting tasks still get every record,
/// and the bridge thread stays mostly asleep (its CPU time, from `/proc`, is a small part of
/// the half second the records take). In a child process that installs the filter before
/// anything async starts.
#[cfg(target_arch = "x86_64")]
#[test]
fn async_waits_work_where_futex_waitv_is_refused() {
    if let Some(r) = role() {
        if r == "no-waitv" {
            child_main(|| {
                refuse_futex_waitv()?;
                // Opened from a bare descriptor: no doorbell, the waits go through the bridge.
                let (mut tx, mut rx) = bell_less_pair(small());
                rx.set_wait_strategy(WaitStrategy::Park);
                const N: u64 = 100;
                let writer = std::thread::spawn(move || {
                    for i in 0..N {
                        std::thread::sleep(Duration::from_millis(5));
                        tx.send(&i.to_le_bytes()).unwrap();
                    }
                });
                current_thread().block_on(async {
                    for i in 0..N {
                        let r = bounded("recv_async", rx.recv_async())
                            .await
                            .map_err(|e| e.to_string())?
                            .ok_or("early end")?;
                        if r.as_pod::<u64>() != Some(&i) {
                            return Err(format!("record {i} differs"));
                        }
                    }
                    Ok::<(), String>(())
                })?;
                writer.join().map_err(|_| "writer panicked")?;
                // A bridge that retried the refused call at once would have spun for the whole
                // half second (about 50 ticks of 10 ms).
                let ticks = bridge_cpu_ticks()?;
                println!("bridge thread CPU time: {ticks} ticks of 10 ms");
                if ticks > 20 {
                    return Err(format!("the bridge spun: {ticks} ticks of CPU in 0.5 s"));
                }
                Ok(())
            });
        }
        return;
    }
    let child = spawn(
        "async_waits_work_where_futex_waitv_is_refused",
        "no-waitv",
        &[],
        None,
    );
    expect_success(child, "futex_waitv refused");
}

/// One `drain_async` (bounded in time) of records that hold their index as a `u64`, checked
/// in order from `seen`; how many it handed out.
async fn drain_in_order(rx: &mut Consumer, seen: &mut u64) -> usize {
    bounded(
        "drain_async",
        rx.drain_async(usize::MAX, |r| {
            assert_eq!(r.as_pod::<u64>(), Some(&*seen));
            *seen += 1;
            Ok::<_, shmflow::Error>(())
        }),
    )
    .await
    .unwrap()
}

/// `drain_async` hands out everything there is, waits when there is nothing, and says 0 only
/// at the end of the stream.
#[test]
fn drain_async_reads_every_record_then_the_end() {
    const N: u64 = 50_000;
    let (mut tx, mut rx) = shmflow::pair(small()).unwrap();
    let writer = std::thread::spawn(move || {
        for i in 0..N {
            tx.send(&i.to_le_bytes()).unwrap();
            if i % 5000 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    });
    let (seen, calls) = current_thread().block_on(async {
        let (mut seen, mut calls) = (0u64, 0u64);
        loop {
            let n = drain_in_order(&mut rx, &mut seen).await;
            calls += 1;
            if n == 0 {
                break;
            }
        }
        (seen, calls)
    });
    writer.join().unwrap();
    assert_eq!(seen, N);
    assert!(calls < N, "{calls} calls for {N} records: no batching");
}

/// A `drain_async` that stopped where a streaming writer is leaves it alone for a gap before
/// it looks again (its first poll yields even though records are there); dropped in that gap,
/// it has taken nothing, and the next call reads every record in order.
#[test]
fn a_drain_async_dropped_while_it_leaves_the_writer_alone_loses_nothing() {
    let (mut tx, mut rx) = shmflow::pair(small()).unwrap();
    current_thread().block_on(async {
        let mut seen = 0u64;
        for i in 0..100u64 {
            tx.send(&i.to_le_bytes()).unwrap();
        }
        let n = drain_in_order(&mut rx, &mut seen).await;
        assert_eq!((n, seen), (100, 100));
        for i in 100..200u64 {
            tx.send(&i.to_le_bytes()).unwrap();
        }
        {
            let mut gap = std::pin::pin!(rx.drain_async(
                usize::MAX,
                |_| -> Result<(), shmflow::Error> {
                    panic!("a record was handed out before the gap")
                }
            ));
            let first = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(std::future::Future::poll(gap.as_mut(), cx))
            })
            .await;
            assert!(
                first.is_pending(),
                "the call after catching up looked at once: {first:?}"
            );
        }
        while seen < 200 {
            let n = drain_in_order(&mut rx, &mut seen).await;
            assert!(n > 0);
        }
        drop(tx);
        assert_eq!(
            rx.drain_async(usize::MAX, |_| Ok::<_, shmflow::Error>(()))
                .await
                .unwrap(),
            0
        );
    });
}

/// A task whose sends and receives never wait still gives its thread back: on a
/// current-thread runtime, a task that counts its turns gets some while 40 000 records go
/// into a pool that holds them all (the producer never waits) and come out again (the
/// consumer never waits). Without the executor's budget it would get none until the end.
#[test]
fn tasks_that_never_wait_still_let_others_run() {
    use std::sync::atomic::{AtomicU64, Ordering};
    const N: u64 = 40_000;
    let g = Geometry {
        segment_size: 64 * 1024,
        segment_count: 64,
    };
    let (mut tx, mut rx) = shmflow::pair(g).unwrap();
    current_thread().block_on(async {
        let turns = std::sync::Arc::new(AtomicU64::new(0));
        let counter = {
            let turns = turns.clone();
            tokio::spawn(async move {
                loop {
                    turns.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            })
        };
        let rec = [7u8; 64];
        for _ in 0..N {
            tx.send_async(&rec).await.unwrap();
        }
        let while_sending = turns.swap(0, Ordering::Relaxed);
        tx.flush_async().await.unwrap();
        for _ in 0..N {
            assert_eq!(rx.recv_async().await.unwrap().unwrap().len(), Some(64));
        }
        let while_receiving = turns.load(Ordering::Relaxed);
        counter.abort();
        // 40 000 records of 64 bytes fill about 2.8 MiB: the producer spends its budget by
        // the segment (a unit per 2 KiB), the consumer every 32nd record; tokio's budget is
        // 128 units a turn.
        assert!(
            while_sending >= 5,
            "{while_sending} turns for others while sending"
        );
        assert!(
            while_receiving >= 5,
            "{while_receiving} turns for others while receiving"
        );
    });
}

/// Segments larger than a turn's budget can pay for at once (tokio gives 128 units a turn)
/// still go out: `send_async` into 1 MiB segments completes.
#[test]
fn send_async_into_large_segments_completes() {
    let g = Geometry {
        segment_size: 1 << 20,
        segment_count: 4,
    };
    let (mut tx, mut rx) = shmflow::pair(g).unwrap();
    current_thread().block_on(async {
        for i in 0..1000u64 {
            bounded("send_async", tx.send_async(&i.to_le_bytes()))
                .await
                .unwrap();
        }
        drop(tx);
        let mut seen = 0u64;
        while let Some(r) = bounded("recv_async", rx.recv_async()).await.unwrap() {
            assert_eq!(r.as_pod::<u64>(), Some(&seen));
            seen += 1;
        }
        assert_eq!(seen, 1000);
    });
}

/// A partition's async sends: round-robin over two channels, then an event to both, read by
/// two tasks of a multi-thread runtime.
#[test]
fn a_partition_sends_from_a_task() {
    use shmflow::{Partition, Partitioner};
    multi_thread().block_on(async {
        let (tx_a, rx_a) = shmflow::pair(small()).unwrap();
        let (tx_b, rx_b) = shmflow::pair(small()).unwrap();
        let mut part = Partition::new(vec![tx_a, tx_b], Partitioner::RoundRobin).unwrap();
        let read = |mut rx: Consumer| {
            tokio::spawn(async move {
                let mut got = Vec::new();
                while let Some(m) = rx.recv_message_async().await.unwrap() {
                    match m {
                        Message::Record(r) => got.push(r.to_vec_async().await.unwrap()),
                        Message::Event(e) => got.push(format!("event {}", e.kind).into_bytes()),
                        other => panic!("unexpected message {other:?}"),
                    }
                }
                got
            })
        };
        for i in 0..6u8 {
            part.send_async(&[i]).await.unwrap();
        }
        part.send_event_async(9, b"").await.unwrap();
        let (a, b) = (read(rx_a), read(rx_b));
        drop(part);
        let a = bounded("reader a", a).await.unwrap();
        let b = bounded("reader b", b).await.unwrap();
        assert_eq!(a, vec![vec![0], vec![2], vec![4], b"event 9".to_vec()]);
        assert_eq!(b, vec![vec![1], vec![3], vec![5], b"event 9".to_vec()]);
    });
}

/// A wait at least this long ended at the waiter's periodic look (40 ms), not at a wake-up:
/// the peers in these tests never pause for more than a few milliseconds.
const LOOK_ENDED: Duration = Duration::from_millis(35);

/// `Err` unless the waiter slept (`wakes` wake-ups) and the wake-ups reached it: at most two
/// waits (a stall of a loaded machine) ended late, where a notifier that rang nobody would
/// leave every wait to end at the look.
fn rung_not_looked(wakes: u64, late: usize) -> Result<(), String> {
    if wakes == 0 {
        return Err("the waiter never slept".into());
    }
    if late > 2 {
        return Err(format!(
            "{late} of {wakes} waits ended at the 40 ms look: wake-ups were lost"
        ));
    }
    Ok(())
}

/// `Err` unless this process has never started a bridge thread: its async waits all slept on
/// doorbells.
fn no_bridge_thread() -> Result<(), String> {
    match bridge_cpu_ticks() {
        Err(e) if e == "no bridge thread" => Ok(()),
        Err(e) => Err(e),
        Ok(_) => Err("a bridge thread was started: a wait slept on the futex".into()),
    }
}

/// An anonymous channel handed to a child carries its doorbells: a parked async consumer and
/// a parked async producer in the child sleep in the reactor (no bridge thread is ever started
/// there), are woken by the sync parent's notifications (its wake count), and get every record.
#[test]
fn async_ends_of_a_handed_channel_sleep_on_its_doorbells() {
    const N: u64 = 3000;
    match role().as_deref() {
        Some("async-consumer") => {
            child_main(|| {
                let mut rx = Consumer::from_env(FD_VAR).map_err(|e| e.to_string())?;
                rx.set_wait_strategy(WaitStrategy::Park);
                let mut slow = 0;
                current_thread().block_on(async {
                    for i in 0..N {
                        let t = Instant::now();
                        let r = bounded("recv_async", rx.recv_async())
                            .await
                            .map_err(|e| e.to_string())?
                            .ok_or("early end")?;
                        slow += usize::from(t.elapsed() >= LOOK_ENDED);
                        if r.as_pod::<u64>() != Some(&i) {
                            return Err(format!("record {i} differs"));
                        }
                    }
                    match bounded("recv_async", rx.recv_async()).await {
                        Ok(None) => Ok(()),
                        other => Err(format!("expected the end, got {other:?}")),
                    }
                })?;
                let wakes = rx.metrics().producer_wakes;
                println!("the producer woke the awaiting consumer {wakes} times; {slow} waits ended late");
                rung_not_looked(wakes, slow)?;
                no_bridge_thread()
            })
        }
        Some("async-producer") => {
            child_main(|| {
                let mut tx = Producer::from_env(FD_VAR).map_err(|e| e.to_string())?;
                tx.set_wait_strategy(WaitStrategy::Park);
                let mut slow = 0;
                current_thread().block_on(async {
                    for i in 0..N {
                        let t = Instant::now();
                        bounded("send_async", tx.send_async(&i.to_le_bytes()))
                            .await
                            .map_err(|e| e.to_string())?;
                        slow += usize::from(t.elapsed() >= LOOK_ENDED);
                    }
                    Ok::<(), String>(())
                })?;
                let wakes = tx.metrics().consumer_wakes;
                println!("the consumer woke the awaiting producer {wakes} times; {slow} waits ended late");
                rung_not_looked(wakes, slow)?;
                no_bridge_thread()
            })
        }
        Some(_) => return,
        None => {}
    }
    let test = "async_ends_of_a_handed_channel_sleep_on_its_doorbells";
    // A sync producer here, paced so that the child's consumer parks.
    let (mut tx, handle) = Producer::create_anonymous(small()).unwrap();
    tx.set_wait_strategy(WaitStrategy::Park);
    let child = spawn(test, "async-consumer", &[], Some(&handle));
    drop(handle);
    for i in 0..N {
        if i % 50 == 0 {
            std::thread::sleep(Duration::from_millis(3));
        }
        tx.send(&i.to_le_bytes()).unwrap();
    }
    drop(tx);
    expect_success(child, "async consumer");
    // A sync consumer here, slower than the child's producer, which waits for segments.
    let (mut rx, handle) = Consumer::create_anonymous(small()).unwrap();
    rx.set_wait_strategy(WaitStrategy::Park);
    let child = spawn(test, "async-producer", &[], Some(&handle));
    drop(handle);
    for i in 0..N {
        if i % 200 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
        let r = rx.recv().unwrap().unwrap();
        assert_eq!(r.as_pod::<u64>(), Some(&i));
    }
    assert!(rx.recv().unwrap().is_none());
    expect_success(child, "async producer");
}

/// A gate's channels handed to children carry the gate's doorbell: a parked
/// `Gate::recv_async` sleeps in the reactor (no bridge thread is ever started in its process)
/// and reads every record of both children, then sees one SIGKILLed within the dead-peer
/// bound. The gate is read in a child of the test too, a process of its own.
#[test]
fn an_awaiting_gate_sleeps_on_its_doorbell_and_sees_a_killed_channel() {
    const N: u64 = 500;
    let test = "an_awaiting_gate_sleeps_on_its_doorbell_and_sees_a_killed_channel";
    match role().as_deref() {
        Some("producer") => child_main(|| {
            let mut tx = Producer::from_env(FD_VAR).map_err(|e| e.to_string())?;
            // Paced, so that the gate sleeps often over a quarter of a second.
            for i in 0..N {
                if i % 10 == 0 {
                    std::thread::sleep(Duration::from_millis(5));
                }
                tx.send(&i.to_le_bytes()).map_err(|e| e.to_string())?;
            }
            tx.flush().map_err(|e| e.to_string())?;
            // Stays until killed.
            std::thread::sleep(Duration::from_secs(60));
            Ok(())
        }),
        Some("gate") => child_main(|| {
            let (mut gate, handles) =
                Gate::create_anonymous(GateGeometry::new(2)).map_err(|e| e.to_string())?;
            gate.set_wait_strategy(WaitStrategy::Park);
            let mut children: Vec<_> = handles
                .iter()
                .map(|h| spawn(test, "producer", &[], Some(h)))
                .collect();
            drop(handles);
            let rt = current_thread();
            let mut next = [0u64; 2];
            let mut slow = 0;
            rt.block_on(async {
                while next != [N, N] {
                    let t = Instant::now();
                    let got = bounded("gate recv_async", gate.recv_async()).await;
                    slow += usize::from(t.elapsed() >= LOOK_ENDED);
                    match got {
                        Ok(Some(GateMessage::Record { channel, record })) => {
                            if record.as_pod::<u64>() != Some(&next[channel as usize]) {
                                return Err(format!(
                                    "channel {channel}: record {} differs",
                                    next[channel as usize]
                                ));
                            }
                            next[channel as usize] += 1;
                        }
                        other => {
                            return Err(format!(
                                "unexpected {:?}",
                                other.map(|m| m.map(|m| m.channel()))
                            ))
                        }
                    }
                }
                Ok(())
            })?;
            let wakes: u64 = gate
                .metrics()
                .channels
                .iter()
                .map(|c| c.snapshot.producer_wakes)
                .sum();
            println!("the producers woke the awaiting gate {wakes} times; {slow} waits ended late");
            rung_not_looked(wakes, slow)?;
            no_bridge_thread()?;
            children[0].kill().map_err(|e| e.to_string())?;
            let killed = Instant::now();
            children[0].wait().map_err(|e| e.to_string())?;
            let seen = rt.block_on(async {
                match bounded("gate recv_async", gate.recv_async()).await {
                    Ok(Some(GateMessage::ChannelDead { channel: 0, .. })) => Ok(Instant::now()),
                    other => Err(format!(
                        "unexpected {:?}",
                        other.map(|m| m.map(|m| m.channel()))
                    )),
                }
            })?;
            println!(
                "the awaiting gate saw channel 0 killed after {:?}",
                seen - killed
            );
            children[1].kill().map_err(|e| e.to_string())?;
            children[1].wait().map_err(|e| e.to_string())?;
            if seen - killed > Duration::from_secs(1) {
                return Err(format!("channel 0's death seen after {:?}", seen - killed));
            }
            no_bridge_thread()
        }),
        Some(_) => return,
        None => {}
    }
    expect_success(spawn(test, "gate", &[], None), "gate reader");
}

/// Where the process has too few descriptors for a gate's doorbells (two per park word), the
/// gate is made without them: its channels are handed and attached as before, and an awaiting
/// gate is woken through the bridge.
#[test]
fn a_gate_made_without_descriptors_to_spare_goes_without_doorbells() {
    let test = "a_gate_made_without_descriptors_to_spare_goes_without_doorbells";
    match role().as_deref() {
        Some("low-limit") => child_main(|| {
            let limit = libc::rlimit {
                rlim_cur: 96,
                rlim_max: 96,
            };
            // SAFETY: setrlimit reads the struct, which lives across the call.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
                return Err("setrlimit refused".into());
            }
            // 51 park words need 102 descriptors for doorbells, more than the limit allows.
            let (mut gate, handles) =
                Gate::create_anonymous(GateGeometry::new(50)).map_err(|e| e.to_string())?;
            gate.set_wait_strategy(WaitStrategy::Park);
            let kid = spawn(test, "producer", &[], Some(&handles[7]));
            drop(handles);
            let got = current_thread().block_on(async {
                let mut got = Vec::new();
                while got.len() < 10 {
                    match bounded("gate recv_async", gate.recv_async()).await {
                        Ok(Some(GateMessage::Record { channel: 7, record })) => {
                            got.push(*record.as_pod::<u64>().ok_or("not a u64")?)
                        }
                        // The channels whose handles were dropped unused.
                        Ok(Some(GateMessage::ChannelDead { channel, error }))
                            if channel != 7 && error.never_attached() => {}
                        other => {
                            return Err(format!(
                                "unexpected {:?}",
                                other.map(|m| m.map(|m| m.channel()))
                            ))
                        }
                    }
                }
                Ok::<_, String>(got)
            });
            expect_success(kid, "producer of channel 7");
            let got = got?;
            if got != (0..10).collect::<Vec<u64>>() {
                return Err(format!("records {got:?}"));
            }
            match bridge_cpu_ticks() {
                Ok(_) => Ok(()),
                Err(e) => Err(format!(
                    "the gate's waits did not go through the bridge: {e}"
                )),
            }
        }),
        Some("producer") => child_main(|| {
            let mut tx = Producer::from_env(FD_VAR).map_err(|e| e.to_string())?;
            for i in 0..10u64 {
                std::thread::sleep(Duration::from_millis(3));
                tx.send(&i.to_le_bytes()).map_err(|e| e.to_string())?;
            }
            Ok(())
        }),
        Some(_) => return,
        None => {}
    }
    expect_success(
        spawn(test, "low-limit", &[], None),
        "gate under a low limit",
    );
}

/// A child made by `fork` after this process's async waits started the bridge thread
/// inherits the thread's bookkeeping but not the thread: its own waits still complete (it
/// starts a bridge of its own).
#[test]
fn a_forked_child_waits_through_a_bridge_of_its_own() {
    // Runs in a child of its own, so that the fork below copies no thread of the harness
    // (which may be inside the bridge's bookkeeping for another test).
    if !in_a_process_of_its_own(
        "a_forked_child_waits_through_a_bridge_of_its_own",
        "fork-bridge",
    ) {
        return;
    }
    // The parent's wait, through the bridge.
    current_thread().block_on(async {
        let (mut tx, mut rx) = bell_less_pair(small());
        let reader = tokio::spawn(async move { rx.recv_async().await.unwrap().is_some() });
        tokio::time::sleep(Duration::from_millis(50)).await;
        tx.send(b"parent").unwrap();
        assert!(bounded("parent's reader", reader).await.unwrap());
    });
    let (mut tx, mut rx) = bell_less_pair(small());
    // SAFETY: the child only runs this test's code (a runtime of its own, the two ends made
    // above) and leaves with `_exit`, never returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            current_thread().block_on(async move {
                let reader = tokio::spawn(async move {
                    rx.recv_async()
                        .await
                        .map(|r| r.and_then(|r| r.to_vec().ok()))
                });
                tokio::time::sleep(Duration::from_millis(50)).await;
                tx.send(b"child").unwrap();
                matches!(
                    tokio::time::timeout(BOUND, reader).await,
                    Ok(Ok(Ok(Some(v)))) if v == b"child"
                )
            })
        }));
        // SAFETY: ends the child at once (no destructors, no harness).
        unsafe { libc::_exit(if matches!(ok, Ok(true)) { 0 } else { 1 }) };
    }
    let status = wait_forked(pid, 2 * BOUND).expect("the forked child ended");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the forked child's wait did not complete (status {status:#x})"
    );
    std::process::exit(0);
}

/// Wakes by unparking the thread that polls.
struct Unpark(std::thread::Thread);

impl std::task::Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

#[test]
fn a_wait_under_way_at_fork_completes_in_the_child() {
    // A process of its own: the fork below copies no thread of the harness.
    if !in_a_process_of_its_own(
        "a_wait_under_way_at_fork_completes_in_the_child",
        "fork-inherited-wait",
    ) {
        return;
    }
    use std::future::Future;
    let (mut tx, mut rx) = bell_less_pair(small());
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    // Polled outside any runtime, with nothing sent, until it sleeps through the bridge (the
    // bridge's thread is started by the first wait registered with it).
    let mut wait = Box::pin(rx.recv_async());
    let bridged = || {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .any(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.trim() == "shmflow-bridge")
            })
    };
    let start = Instant::now();
    while !bridged() {
        assert!(wait.as_mut().poll(&mut cx).is_pending());
        assert!(start.elapsed() < BOUND, "the wait never went to the bridge");
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: the child only runs this test's code (the two ends and the future made above)
    // and leaves with `_exit`, never returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // The child's thread is a new one: its own waker.
            let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
            let mut cx = std::task::Context::from_waker(&waker);
            tx.send(b"child").unwrap();
            let start = Instant::now();
            while start.elapsed() < BOUND {
                if let std::task::Poll::Ready(r) = wait.as_mut().poll(&mut cx) {
                    return matches!(r, Ok(Some(r)) if r.as_bytes() == Some(&b"child"[..]));
                }
                std::thread::park_timeout(Duration::from_millis(100));
            }
            false
        }));
        // SAFETY: ends the child at once (no destructors, no harness).
        unsafe { libc::_exit(if matches!(ok, Ok(true)) { 0 } else { 1 }) };
    }
    let status = wait_forked(pid, 2 * BOUND).expect("the forked child ended");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the wait the child inherited did not complete (status {status:#x})"
    );
    drop(wait);
    std::process::exit(0);
}
