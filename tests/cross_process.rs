//! The channel between real processes: the test binary re-executes itself as the peer
//! (`SHMFLOW_TEST_ROLE` says which role), with an inherited memfd or a named region.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use shmflow::{
    Consumer, FlushPolicy, Geometry, OpenError, Producer, RecvTimeoutError, SendError,
    SendTimeoutError, TrySendError, WaitStrategy,
};

const SEG: u32 = 4096;

/// Record lengths of the big test: uniform in 0 ..= 3 × segment size.
fn lengths(seed: u64) -> impl FnMut() -> usize {
    let mut rng = Rng::new(seed);
    move || rng.below(3 * SEG as u64 + 1) as usize
}

#[test]
fn ten_million_records_of_random_length_arrive_in_order_intact() {
    let count = env_u64("SHMFLOW_TEST_RECORDS", 10_000_000);
    let seed = env_u64("SHMFLOW_TEST_SEED", 0x5EED);
    if role().as_deref() == Some("consumer") {
        child_main(|| {
            let mut c = Consumer::from_env(FD_VAR).map_err(|e| e.to_string())?;
            let mut next_len = lengths(seed);
            let (mut buf, mut scratch) = (Vec::new(), Vec::new());
            let (mut seq, mut bytes, mut spanning) = (0u64, 0u64, 0u64);
            while let Some(r) = c.recv().map_err(|e| e.to_string())? {
                let len = next_len();
                spanning += r.is_spanning() as u64;
                if let Some(b) = r.as_bytes() {
                    check_record(seq, len, b, &mut scratch)?;
                } else {
                    buf.clear();
                    r.read_all_into(&mut buf).map_err(|e| e.to_string())?;
                    check_record(seq, len, &buf, &mut scratch)?;
                }
                bytes += len as u64;
                seq += 1;
            }
            if seq != count {
                return Err(format!("got {seq} records, expected {count}"));
            }
            println!("consumer verified {seq} records, {bytes} bytes, {spanning} spanning");
            Ok(())
        });
    }
    let (mut p, handle) = Producer::create_anonymous(Geometry {
        segment_size: SEG,
        segment_count: 16,
    })
    .unwrap();
    p.set_flush_policy(FlushPolicy::Explicit);
    let child = spawn(
        "ten_million_records_of_random_length_arrive_in_order_intact",
        "consumer",
        &[
            ("SHMFLOW_TEST_RECORDS", count.to_string()),
            ("SHMFLOW_TEST_SEED", seed.to_string()),
        ],
        Some(&handle),
    );
    drop(handle);
    let start = Instant::now();
    let mut next_len = lengths(seed);
    let mut buf = Vec::new();
    for seq in 0..count {
        make_record(seq, next_len(), &mut buf);
        p.send(&buf).unwrap();
    }
    drop(p); // end of stream
    expect_success(child, "consumer");
    println!("{count} records in {:.1?}", start.elapsed());
}

/// Batches of 1 to 300 records of 24 bytes (claimed with `claim_batch`, some committed only
/// in part) from this process, checked one by one by a child: every record arrives once, whole
/// and in order, across many segments and waits for free ones.
#[test]
fn batches_of_records_arrive_in_order_in_another_process() {
    const RECORDS: u64 = 2_000_000;
    if role().as_deref() == Some("consumer") {
        child_main(|| {
            let mut c = Consumer::from_env(FD_VAR).map_err(|e| e.to_string())?;
            let mut seq = 0u64;
            while let Some(r) = c.recv().map_err(|e| e.to_string())? {
                let b = r.as_bytes().ok_or("a record of 24 bytes spans segments")?;
                let want = [seq, !seq, seq.wrapping_mul(0x9e37_79b9_7f4a_7c15)];
                if b != bytemuck::bytes_of(&want) {
                    return Err(format!("record {seq}: {b:?}"));
                }
                seq += 1;
            }
            if seq != RECORDS {
                return Err(format!("got {seq} records, expected {RECORDS}"));
            }
            println!("consumer verified {seq} records");
            Ok(())
        });
    }
    let (mut p, handle) = Producer::create_anonymous(Geometry {
        segment_size: SEG,
        segment_count: 4,
    })
    .unwrap();
    // The default flush policy: each batch published as it is committed.
    let child = spawn(
        "batches_of_records_arrive_in_order_in_another_process",
        "consumer",
        &[],
        Some(&handle),
    );
    drop(handle);
    let mut rng = Rng::new(7);
    let (mut seq, mut whole) = (0u64, 0u64);
    while seq < RECORDS {
        let want = (1 + rng.below(300)).min(RECORDS - seq) as usize;
        let mut batch = p.claim_batch(24, want).unwrap();
        assert!(
            (1..=want).contains(&batch.len()),
            "{} of {want}",
            batch.len()
        );
        whole += (batch.len() == want && want > 1) as u64;
        // Now and then only a part is committed; the rest of the room is claimed again.
        let n = if rng.below(8) == 0 {
            1 + rng.below(batch.len() as u64) as usize
        } else {
            batch.len()
        };
        for (i, r) in batch.iter_mut().take(n).enumerate() {
            let s = seq + i as u64;
            r.copy_from_slice(bytemuck::bytes_of(&[
                s,
                !s,
                s.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ]));
        }
        batch.commit_first(n);
        seq += n as u64;
    }
    drop(p);
    expect_success(child, "consumer");
    // 32-byte frames, 128 to a segment: most batches of a few hundred at most get all they
    // asked for (the others end at a segment's end).
    assert!(
        whole > 1000,
        "only {whole} batches got every record asked for"
    );
}

#[test]
fn producer_blocks_while_the_consumer_holds_every_segment() {
    if role().as_deref() == Some("consumer") {
        child_main(|| {
            let mut c = Consumer::from_env(FD_VAR).map_err(|e| e.to_string())?;
            // Hold everything until the parent says go.
            let mut go = [0u8; 1];
            std::io::stdin()
                .read_exact(&mut go)
                .map_err(|e| e.to_string())?;
            let mut n = 0;
            while let Some(r) = c.recv().map_err(|e| e.to_string())? {
                if r.len() != Some(3000) {
                    return Err(format!("record {n} has length {:?}", r.len()));
                }
                n += 1;
            }
            if n != 6 {
                return Err(format!("{n} records instead of 6"));
            }
            Ok(())
        });
    }
    let (mut p, handle) = Producer::create_anonymous(Geometry {
        segment_size: SEG,
        segment_count: 4,
    })
    .unwrap();
    p.set_flush_policy(FlushPolicy::EveryRecord);
    let mut child = spawn_with_stdin(
        "producer_blocks_while_the_consumer_holds_every_segment",
        "consumer",
        &[],
        Some(&handle),
        Stdio::piped(),
    );
    drop(handle);
    let rec = vec![7u8; 3000]; // one record per segment
    for _ in 0..4 {
        p.send(&rec).unwrap();
    }
    assert!(
        matches!(p.try_send(&rec), Err(TrySendError::Full)),
        "pool exhausted: try_send must not block"
    );
    assert!(matches!(
        p.send_timeout(&rec, Duration::from_millis(50)),
        Err(SendTimeoutError::Timeout)
    ));
    let (tx, rx) = mpsc::channel();
    let sender = std::thread::spawn(move || {
        let r = p.send(&rec);
        tx.send(r.is_ok()).unwrap();
        p.send(&rec).unwrap();
        p
    });
    // No segment can come back while the consumer holds them: the send must still be waiting.
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "send completed with no free segment"
    );
    child.stdin.as_mut().unwrap().write_all(b"g").unwrap();
    assert!(
        rx.recv_timeout(Duration::from_secs(30)).unwrap(),
        "send resumed and succeeded"
    );
    drop(sender.join().unwrap());
    expect_success(child, "consumer");
}

#[test]
fn producer_exit_ends_the_stream_after_every_committed_record() {
    if role().as_deref() == Some("producer") {
        child_main(|| {
            let mut p = Producer::from_env(FD_VAR).map_err(|e| e.to_string())?;
            p.set_flush_policy(FlushPolicy::Explicit);
            let mut buf = Vec::new();
            for seq in 0..10_000u64 {
                make_record(seq, (seq % 5000) as usize, &mut buf);
                p.send(&buf).map_err(|e| e.to_string())?;
            }
            Ok(()) // exit drops the producer without a flush: drop publishes and detaches
        });
    }
    let (mut c, handle) = Consumer::create_anonymous(Geometry {
        segment_size: SEG,
        segment_count: 4,
    })
    .unwrap();
    let child = spawn(
        "producer_exit_ends_the_stream_after_every_committed_record",
        "producer",
        &[],
        Some(&handle),
    );
    drop(handle);
    let mut scratch = Vec::new();
    let mut seq = 0u64;
    while let Some(r) = c.recv().unwrap() {
        let v = r.to_vec().unwrap();
        check_record(seq, (seq % 5000) as usize, &v, &mut scratch).unwrap();
        seq += 1;
    }
    assert_eq!(seq, 10_000);
    assert!(
        c.recv().unwrap().is_none(),
        "end of stream stays end of stream"
    );
    expect_success(child, "producer");
}

#[test]
fn consumer_exit_makes_the_blocked_producer_fail_with_closed() {
    if role().as_deref() == Some("consumer") {
        child_main(|| {
            let mut c = Consumer::from_env(FD_VAR).map_err(|e| e.to_string())?;
            let r = c.recv().map_err(|e| e.to_string())?;
            if r.is_none() {
                return Err("no record".into());
            }
            Ok(()) // exit: the consumer detaches
        });
    }
    let (mut p, handle) = Producer::create_anonymous(Geometry {
        segment_size: SEG,
        segment_count: 2,
    })
    .unwrap();
    p.set_flush_policy(FlushPolicy::EveryRecord);
    let child = spawn(
        "consumer_exit_makes_the_blocked_producer_fail_with_closed",
        "consumer",
        &[],
        Some(&handle),
    );
    drop(handle);
    let rec = vec![1u8; 3000];
    let mut sent = 0;
    let err = loop {
        match p.send(&rec) {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent < 1000, "the producer never noticed the consumer left");
    };
    assert!(matches!(err, SendError::Closed(_)), "got {err}");
    assert!(p.is_closed());
    assert!(matches!(p.flush(), Err(SendError::Closed(_))));
    expect_success(child, "consumer");
}

#[test]
fn a_streaming_producer_finds_its_consumer_process_gone_at_the_next_segment() {
    const RECORDS: usize = 1000;
    if role().as_deref() == Some("consumer") {
        child_main(|| {
            let mut c = Consumer::from_env(FD_VAR).map_err(|e| e.to_string())?;
            for _ in 0..RECORDS {
                if c.recv().map_err(|e| e.to_string())?.is_none() {
                    return Err("the stream ended early".into());
                }
            }
            Ok(()) // exit: the consumer detaches, with most of the pool free
        });
    }
    let test = "a_streaming_producer_finds_its_consumer_process_gone_at_the_next_segment";
    let (mut p, handle) = Producer::create_anonymous(Geometry {
        segment_size: SEG,
        segment_count: 64,
    })
    .unwrap();
    let mut child = spawn(test, "consumer", &[], Some(&handle));
    drop(handle);
    let rec = [3u8; 64];
    for _ in 0..RECORDS {
        p.send(&rec).unwrap();
    }
    assert!(child.wait().unwrap().success(), "the consumer failed");
    // The consumer's process is gone and the pool has free segments: what the producer
    // accepts now is what the segment in hand has room for.
    let per_segment = SEG as usize / 72;
    let room = per_segment - RECORDS % per_segment;
    let mut sent = 0;
    let err = loop {
        match p.send(&rec) {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
        assert!(
            sent <= room,
            "{sent} records accepted after the consumer's process exited"
        );
    };
    assert!(matches!(err, SendError::Closed(_)), "got {err}");
    assert_eq!(
        sent, room,
        "records accepted after the consumer's process exited"
    );
}

#[test]
fn buffer_timeout_publishes_a_lone_record_without_flush() {
    if let Some(r) = role() {
        child_main(|| {
            let mut p = Producer::from_env(FD_VAR).map_err(|e| e.to_string())?;
            p.set_flush_policy(if r == "timeout" {
                FlushPolicy::Timeout(Duration::from_millis(5))
            } else {
                FlushPolicy::Explicit
            });
            p.send(b"lone record").map_err(|e| e.to_string())?;
            // Stay alive and idle: no flush, no further record, until the parent says so.
            let mut line = String::new();
            BufReader::new(std::io::stdin())
                .read_line(&mut line)
                .map_err(|e| e.to_string())?;
            Ok(())
        });
    }
    for policy in ["timeout", "explicit"] {
        let (mut c, handle) = Consumer::create_anonymous(Geometry {
            segment_size: SEG,
            segment_count: 4,
        })
        .unwrap();
        let mut child = spawn_with_stdin(
            "buffer_timeout_publishes_a_lone_record_without_flush",
            policy,
            &[],
            Some(&handle),
            Stdio::piped(),
        );
        drop(handle);
        let got = c.recv_timeout(Duration::from_secs(if policy == "timeout" {
            10
        } else {
            1
        }));
        match (policy, got) {
            ("timeout", Ok(Some(r))) => assert_eq!(r.as_bytes().unwrap(), b"lone record"),
            ("explicit", Err(RecvTimeoutError::Timeout)) => {} // the control: without the timeout it stays unpublished
            (p, other) => panic!("{p}: unexpected {:?}", other.map(|r| r.map(|r| r.len()))),
        }
        child.stdin.as_mut().unwrap().write_all(b"done\n").unwrap();
        expect_success(child, policy);
        if policy == "explicit" {
            // The producer's exit published it.
            assert_eq!(
                c.recv().unwrap().unwrap().as_bytes().unwrap(),
                b"lone record"
            );
        }
    }
}

#[test]
fn blocking_mode_works_with_both_processes_on_one_cpu() {
    let rounds = env_u64("SHMFLOW_TEST_ROUNDS", 20_000);
    if role().as_deref() == Some("echo") {
        child_main(|| {
            let ping =
                Consumer::open(&std::env::var("PING").unwrap()).map_err(|e| e.to_string())?;
            let pong =
                Producer::open(&std::env::var("PONG").unwrap()).map_err(|e| e.to_string())?;
            echo(ping, pong)
        });
    }
    pin_to_cpu(0);
    let (ping_name, pong_name) = (unique_name("ping"), unique_name("pong"));
    let g = Geometry {
        segment_size: SEG,
        segment_count: 4,
    };
    let mut ping = Producer::create(&ping_name, g).unwrap();
    let mut pong = Consumer::create(&pong_name, g).unwrap();
    ping.set_flush_policy(FlushPolicy::EveryRecord);
    ping.set_wait_strategy(WaitStrategy::Block);
    pong.set_wait_strategy(WaitStrategy::Block);
    let child = spawn(
        "blocking_mode_works_with_both_processes_on_one_cpu",
        "echo",
        &[("PING", ping_name.clone()), ("PONG", pong_name.clone())],
        None,
    );
    let start = Instant::now();
    for i in 0..rounds {
        ping.send(&i.to_le_bytes()).unwrap();
        let r = pong.recv().unwrap().expect("echo");
        assert_eq!(r.as_pod::<u64>(), Some(&i));
    }
    let el = start.elapsed();
    drop(ping);
    assert!(pong.recv().unwrap().is_none());
    expect_success(child, "echo");
    println!(
        "one CPU, blocking mode: {rounds} round trips, median-free mean {:.1} µs",
        el.as_secs_f64() * 1e6 / rounds as f64
    );
}

fn echo(mut ping: Consumer, mut pong: Producer) -> Result<(), String> {
    pong.set_flush_policy(FlushPolicy::EveryRecord);
    while let Some(r) = ping.recv().map_err(|e| e.to_string())? {
        let v = *r.as_pod::<u64>().ok_or("not a u64")?;
        drop(r);
        pong.send_pod(&v).map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[test]
fn a_second_producer_in_another_process_is_refused() {
    if role().as_deref() == Some("intruder") {
        child_main(|| match Producer::open(&std::env::var("NAME").unwrap()) {
            Err(OpenError::AlreadyAttached {
                end: shmflow::End::Producer,
                pid,
                ..
            }) if pid == std::os::unix::process::parent_id() => Ok(()),
            other => Err(format!(
                "expected AlreadyAttached naming the parent, got {:?}",
                other.map(|_| ())
            )),
        });
    }
    let name = unique_name("intruder");
    let _p = Producer::create(&name, Geometry::default()).unwrap();
    let child = spawn(
        "a_second_producer_in_another_process_is_refused",
        "intruder",
        &[("NAME", name.clone())],
        None,
    );
    expect_success(child, "intruder");
}

/// One child takes two channels of one anonymous gate, each handed with its doorbells (the
/// gate's doorbell is in both handles): both attach, and every record of both arrives.
#[test]
fn one_child_takes_two_channels_of_a_gate() {
    const N: u64 = 200;
    if role().as_deref() == Some("two-channels") {
        child_main(|| {
            let mut a = Producer::from_env("SHMFLOW_TEST_FD_A").map_err(|e| e.to_string())?;
            let mut b = Producer::from_env("SHMFLOW_TEST_FD_B").map_err(|e| e.to_string())?;
            for i in 0..N {
                a.send(&i.to_le_bytes()).map_err(|e| e.to_string())?;
                b.send(&(i + N).to_le_bytes()).map_err(|e| e.to_string())?;
            }
            Ok(())
        });
    }
    let (mut gate, handles) =
        shmflow::Gate::create_anonymous(shmflow::GateGeometry::new(2)).unwrap();
    let child = spawn_with_handles(
        "one_child_takes_two_channels_of_a_gate",
        "two-channels",
        &[
            ("SHMFLOW_TEST_FD_A", &handles[0]),
            ("SHMFLOW_TEST_FD_B", &handles[1]),
        ],
    );
    drop(handles);
    let (mut next, mut ended) = ([0u64, N], [false; 2]);
    while ended != [true, true] {
        match gate.recv().unwrap().expect("a gate message") {
            shmflow::GateMessage::Record { channel, record } => {
                assert_eq!(
                    record.as_pod::<u64>(),
                    Some(&next[channel as usize]),
                    "channel {channel}"
                );
                next[channel as usize] += 1;
            }
            shmflow::GateMessage::EndOfPartition { channel } => ended[channel as usize] = true,
            other => panic!("unexpected message on channel {:?}", other.channel()),
        }
    }
    assert_eq!(next, [N, 2 * N]);
    expect_success(child, "two channels");
}
