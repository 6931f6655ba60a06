//! The channel's behaviour with both ends in one process (threads): framing at every segment
//! boundary, every write and read API, flush policies, closing. Cross-process behaviour is in
//! `cross_process.rs`.

mod common;

use std::io::{Read, Write};
use std::thread;
use std::time::Duration;

use common::{check_record, make_record, wait_for};
use shmflow::{
    Consumer, FlushPolicy, Geometry, Producer, RecvTimeoutError, SendError, SendTimeoutError,
    TryRecvError, TrySendError,
};

const SEG: u32 = 4096;

fn pair(segments: u32) -> (Producer, Consumer) {
    shmflow::pair(Geometry {
        segment_size: SEG,
        segment_count: segments,
    })
    .unwrap()
}

/// Lengths around every interesting boundary of a 4 KiB segment.
fn boundary_lengths() -> Vec<usize> {
    let s = SEG as usize;
    let mut v = vec![0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65];
    for k in 1..=3 {
        for d in [-9i64, -8, -1, 0, 1, 8] {
            let l = (k * s) as i64 - 8 + d;
            v.push(l as usize);
            v.push((k * s) as i64 as usize + d.max(0) as usize);
        }
    }
    v.sort();
    v.dedup();
    v
}

#[test]
fn every_boundary_length_round_trips_at_every_start_offset() {
    let lens = boundary_lengths();
    // Offsets: records of `pad` bytes before each tested length shift where it starts.
    for pad in [0usize, 8, 24, 4000 - 8, 4096 - 24] {
        let (mut p, mut c) = pair(4);
        let lens2 = lens.clone();
        let writer = thread::spawn(move || {
            let mut buf = Vec::new();
            let mut seq = 0;
            for &len in &lens2 {
                make_record(seq, pad, &mut buf);
                p.send(&buf).unwrap();
                seq += 1;
                make_record(seq, len, &mut buf);
                p.send(&buf).unwrap();
                seq += 1;
            }
        });
        let mut scratch = Vec::new();
        let mut seq = 0;
        for &len in &lens {
            for l in [pad, len] {
                let r = c.recv().unwrap().expect("record");
                let fits = 8 + l <= SEG as usize;
                assert_eq!(
                    r.is_spanning(),
                    !fits,
                    "len {l}: spanning only when larger than a segment"
                );
                let v = r.to_vec().unwrap();
                check_record(seq, l, &v, &mut scratch).unwrap();
                seq += 1;
            }
        }
        writer.join().unwrap();
        assert!(
            c.recv().unwrap().is_none(),
            "end of stream after the producer is dropped"
        );
    }
}

#[test]
fn claim_pod_and_stream_apis() {
    #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
    #[repr(C)]
    struct Point {
        x: u64,
        y: f64,
    }
    let (mut p, mut c) = pair(2);
    let big: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
    let huge: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
    let (big2, huge2) = (big.clone(), huge.clone());
    let reader = thread::spawn(move || {
        let r = c.recv().unwrap().unwrap();
        assert_eq!(
            r.as_bytes().unwrap(),
            [1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]
        );
        drop(r);
        assert_eq!(c.recv().unwrap().unwrap().as_bytes().unwrap(), b"abc");
        let r = c.recv().unwrap().unwrap();
        assert_eq!(r.as_pod::<Point>(), Some(&Point { x: 7, y: 1.5 }));
        assert_eq!(r.as_pod::<u32>(), None, "size mismatch gives no view");
        drop(r);
        assert_eq!(
            c.recv().unwrap().unwrap().as_bytes().unwrap(),
            b"streamed 42"
        );
        let r = c.recv().unwrap().unwrap();
        assert!(
            !r.is_spanning(),
            "a streamed record that fits one segment must not span"
        );
        assert_eq!(r.as_bytes().unwrap(), &big2[..]);
        drop(r);
        let mut r = c.recv().unwrap().unwrap();
        assert!(r.is_spanning());
        let mut parts = Vec::new();
        let mut joined = Vec::new();
        while let Some(part) = r.next_part().unwrap() {
            parts.push(part.len());
            joined.extend_from_slice(part);
        }
        assert!(
            parts.len() >= 3,
            "10000 bytes over 4 KiB segments: {parts:?}"
        );
        assert_eq!(joined, huge2);
        drop(r);
        assert!(c.recv().unwrap().is_none());
    });
    let mut claim = p.claim(16).unwrap();
    claim[..8].copy_from_slice(&1u64.to_le_bytes());
    claim[8..].copy_from_slice(&2u64.to_le_bytes());
    claim.commit();
    {
        let _discarded = p.claim(100).unwrap(); // dropped uncommitted: never seen
    }
    let mut claim = p.claim(100).unwrap();
    claim[..3].copy_from_slice(b"abc");
    claim.commit_len(3);
    p.send_pod(&Point { x: 7, y: 1.5 }).unwrap();
    // A streamed record that fits stays whole; one that outgrows its segment's rest moves.
    let mut w = p.stream().unwrap();
    w.write_all(b"streamed ").unwrap();
    write!(w, "{}", 42).unwrap();
    w.finish().unwrap();
    let mut w = p.stream().unwrap();
    for chunk in big.chunks(7) {
        w.write_all(chunk).unwrap();
    }
    w.finish().unwrap();
    let mut w = p.stream().unwrap();
    w.write_all(&huge).unwrap();
    w.finish().unwrap();
    // Dropped stream writer: not seen.
    let mut w = p.stream().unwrap();
    w.write_all(b"never").unwrap();
    drop(w);
    assert!(matches!(
        p.claim(SEG as usize),
        Err(SendError::RecordTooLarge(_))
    ));
    drop(p);
    reader.join().unwrap();
}

#[test]
fn a_batch_claims_what_fits_the_segment_and_sends_what_is_committed() {
    let (mut tx, mut rx) = pair(2);
    // Before any segment is in hand, a batch of none claims nothing and takes no segment.
    let mut none = tx.claim_batch(100, 0).unwrap();
    assert!(none.is_empty() && none.iter_mut().next().is_none());
    none.commit();
    tx.set_flush_policy(FlushPolicy::Explicit);
    // 100-byte records take 112 bytes with their headers: 36 fit a 4 KiB segment.
    let per_segment = SEG as usize / 112;
    let mut b = tx.claim_batch(100, 1000).unwrap();
    assert_eq!(b.len(), per_segment);
    for (i, r) in b.iter_mut().enumerate() {
        r.fill(i as u8);
    }
    b.record_mut(3).fill(0xEE);
    b.commit_first(5);
    // The room of the three records not committed is claimed again, with the rest.
    let mut b = tx.claim_batch(100, 2).unwrap();
    assert_eq!(b.len(), 2);
    b.iter_mut().for_each(|r| r.fill(0x77));
    drop(b); // sends nothing
    assert_eq!(
        tx.claim_batch(100, 0).unwrap().len(),
        0,
        "max 0 claims nothing"
    );
    let mut b = tx.claim_batch(100, 1).unwrap();
    b.record_mut(0).fill(0x55);
    b.commit();
    tx.flush().unwrap();
    let mut got = Vec::new();
    while let Ok(Some(r)) = rx.try_recv() {
        let b = r.as_bytes().unwrap();
        assert_eq!(b.len(), 100);
        assert!(b.iter().all(|&x| x == b[0]), "a record of one byte value");
        got.push(b[0]);
    }
    assert_eq!(got, [0, 1, 2, 0xEE, 4, 0x55]);
}

/// What a batch claimed and not committed leaves behind (the frames it claimed room for) is
/// never read: not before anything else is published, and not after records of other lengths
/// (sent, or committed from batches re-claimed over that room) end where they end, on either
/// flush policy, over segments used again and again; the reader then finds nothing more.
#[test]
fn the_room_of_records_claimed_and_not_committed_is_never_read() {
    for explicit in [false, true] {
        let (mut tx, mut rx) = pair(2);
        if explicit {
            tx.set_flush_policy(FlushPolicy::Explicit);
        }
        let mut sent = Vec::new();
        // 300 rounds of up to ~600 bytes go round the two 4 KiB segments many times.
        for round in 0..300usize {
            let tag = round as u8;
            // Room for up to 20 records of 8 bytes claimed, all handed out, 0 to 2 committed.
            let mut b = tx.claim_batch(8, 20).unwrap();
            b.iter_mut().for_each(|r| r.fill(0xEE));
            let keep = (round % 3).min(b.len());
            for i in 0..keep {
                b.record_mut(i).fill(tag);
                sent.push(vec![tag; 8]);
            }
            b.commit_first(keep);
            if !explicit && keep == 0 {
                // Nothing published since the last read: a dropped batch shows nothing,
                // not even its first frame, whose header it must hold back.
                assert!(
                    matches!(rx.try_recv(), Err(TryRecvError::Empty)),
                    "round {round}: a record before anything was committed"
                );
            }
            // Room re-claimed with another length, part of it handed out, then dropped.
            let mut b = tx.claim_batch(24, 10).unwrap();
            b.iter_mut().take(round % 5).for_each(|r| r.fill(0xDD));
            drop(b);
            // Re-claimed once more, records handed out from the second on, committed.
            let len = [16usize, 40, 3][round % 3];
            let mut b = tx.claim_batch(len, 3).unwrap();
            let n = b.len();
            for r in b.iter_mut().skip(1) {
                r.fill(tag ^ 0x80);
            }
            b.record_mut(0).fill(tag ^ 0x80);
            b.commit();
            sent.extend((0..n).map(|_| vec![tag ^ 0x80; len]));
            // And one record of another length sent over what is left.
            let r = vec![0x40 ^ tag; [8usize, 100, 5, 64][round % 4]];
            tx.send(&r).unwrap();
            sent.push(r);
            tx.flush().unwrap();
            for want in sent.drain(..) {
                let r = rx.try_recv().unwrap().expect("a committed record");
                assert_eq!(r.as_bytes(), Some(&want[..]), "round {round}");
            }
            assert!(
                matches!(rx.try_recv(), Err(TryRecvError::Empty)),
                "round {round}: nothing after the last record sent"
            );
        }
    }
    // A batch whose records were handed out only in part by `iter_mut` (and one by
    // `record_mut`): the commit frames every record it sends, handed out or not (in a fresh
    // region, where a header not written is a 0 that would end the stream there).
    {
        let (mut tx, mut rx) = pair(2);
        let mut b = tx.claim_batch(8, 6).unwrap();
        for r in b.iter_mut().take(2) {
            r.fill(0x11);
        }
        b.record_mut(4).fill(0x44);
        b.commit_first(5);
        tx.send(b"after").unwrap();
        tx.flush().unwrap();
        let got: Vec<Vec<u8>> = (0..6)
            .map(|_| rx.try_recv().unwrap().expect("a record").to_vec().unwrap())
            .collect();
        assert_eq!(got[..2], [[0x11; 8], [0x11; 8]]);
        assert!(
            got[2..4].iter().all(|r| r.len() == 8),
            "records 2 and 3 framed"
        );
        assert_eq!(got[4], [0x44; 8]);
        assert_eq!(got[5], b"after");
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    }
}

#[test]
fn a_batch_waits_for_a_segment_and_refuses_what_cannot_fit() {
    let (mut tx, mut rx) = pair(2);
    tx.set_flush_policy(FlushPolicy::Explicit);
    assert!(matches!(
        tx.claim_batch(SEG as usize, 1),
        Err(SendError::RecordTooLarge(_))
    ));
    // Two segments of 32 records of 120 bytes; the third batch finds none free.
    for _ in 0..2 {
        let b = tx.claim_batch(120, usize::MAX).unwrap();
        assert_eq!(b.len(), 32);
        b.commit();
    }
    assert!(matches!(
        tx.try_claim_batch(120, 1),
        Err(TrySendError::Full)
    ));
    assert!(matches!(
        tx.claim_batch_timeout(120, 1, Duration::from_millis(20)),
        Err(SendTimeoutError::Timeout)
    ));
    // A batch of none after that finds no segment in hand, and claims nothing.
    assert_eq!(tx.claim_batch(120, 0).unwrap().len(), 0);
    // Once the consumer hands the first segment back, a batch goes on in it.
    let reader = thread::spawn(move || {
        let mut n = 0;
        while let Some(r) = rx.recv().unwrap() {
            assert_eq!(r.len(), Some(120));
            n += 1;
        }
        n
    });
    let b = tx.claim_batch(120, 40).unwrap();
    assert_eq!(b.len(), 32);
    b.commit();
    drop(tx);
    assert_eq!(reader.join().unwrap(), 96);
}

#[test]
fn batches_on_the_default_policy_are_seen_at_once_with_their_counts() {
    // Every record published as it is committed: each batch at its commit, with no flush.
    let (mut tx, mut rx) = pair(4);
    let mut b = tx.claim_batch(8, 4).unwrap();
    for (i, r) in b.iter_mut().enumerate() {
        r.copy_from_slice(&(i as u64).to_le_bytes());
    }
    b.commit();
    for i in 0..4u64 {
        let r = rx
            .try_recv()
            .unwrap()
            .expect("a committed record, without a flush");
        assert_eq!(r.as_pod::<u64>(), Some(&i));
    }
    // 29 batches of 7 records of 8 bytes (16 with the header: 256 to a segment, so no
    // segment is handed over meanwhile), not read yet: 4 + 7k is never a multiple of 64.
    let mut sent = 4u64;
    for _ in 0..29 {
        let mut b = tx.claim_batch(8, 7).unwrap();
        assert_eq!(b.len(), 7);
        for r in b.iter_mut() {
            r.copy_from_slice(&sent.to_le_bytes());
            sent += 1;
        }
        b.commit();
    }
    // The producer's counts go out every 64 records: the batches that stepped over 64, 128
    // and 192 published them, so the region's count (the consumer has read 4) lags by less
    // than 64.
    let m = rx.metrics();
    assert!(
        m.records_written <= sent && sent - m.records_written < 64,
        "{sent} sent, {} counted",
        m.records_written
    );
    for i in 4..sent {
        let r = rx
            .try_recv()
            .unwrap()
            .expect("a committed record, without a flush");
        assert_eq!(r.as_pod::<u64>(), Some(&i));
    }
}

#[test]
fn io_read_and_partial_reads_of_spanning_records() {
    let (mut p, mut c) = pair(3);
    let huge: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
    let h2 = huge.clone();
    let w = thread::spawn(move || {
        p.send(&h2).unwrap();
        p.send(&h2).unwrap(); // dropped half-read by the reader below
        p.send(b"after").unwrap();
    });
    let mut r = c.recv().unwrap().unwrap();
    let mut got = Vec::new();
    r.read_to_end(&mut got).unwrap();
    assert_eq!(got, huge);
    drop(r);
    let mut r = c.recv().unwrap().unwrap();
    let first = r.next_part().unwrap().unwrap().len();
    assert!(first > 0);
    drop(r); // the rest is skipped
             // io::Read through a small buffer, on a record in one segment.
    let mut r = c.recv().unwrap().unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 2];
    loop {
        let n = std::io::Read::read(&mut r, &mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, b"after");
    drop(r);
    w.join().unwrap();
    assert!(c.recv().unwrap().is_none());
}

#[test]
fn explicit_policy_hides_records_until_flush() {
    let (mut p, mut c) = pair(4);
    p.set_flush_policy(FlushPolicy::Explicit);
    p.send(b"one").unwrap();
    assert!(matches!(c.try_recv(), Err(TryRecvError::Empty)));
    p.flush().unwrap();
    assert_eq!(c.try_recv().unwrap().unwrap().as_bytes().unwrap(), b"one");
    assert!(matches!(
        c.recv_timeout(Duration::from_millis(20)),
        Err(RecvTimeoutError::Timeout)
    ));
    p.set_flush_policy(FlushPolicy::EveryRecord);
    p.send(b"two").unwrap();
    assert_eq!(c.try_recv().unwrap().unwrap().as_bytes().unwrap(), b"two");
}

#[test]
fn try_and_timeout_sends_respect_the_pool() {
    let (mut p, mut c) = pair(2);
    p.set_flush_policy(FlushPolicy::EveryRecord);
    let rec = vec![9u8; 3000]; // one per segment
    p.try_send(&rec).unwrap();
    p.try_send(&rec).unwrap();
    // Both segments are with the consumer (unread): nothing is free.
    assert!(matches!(p.try_send(&rec), Err(TrySendError::Full)));
    assert!(matches!(
        p.send_timeout(&rec, Duration::from_millis(30)),
        Err(SendTimeoutError::Timeout)
    ));
    assert!(matches!(p.try_claim(3000), Err(TrySendError::Full)));
    assert!(matches!(
        p.try_send_pod(&[7u64; 256]),
        Err(TrySendError::Full)
    ));
    assert!(matches!(
        p.send_pod_timeout(&[7u64; 256], Duration::from_millis(20)),
        Err(SendTimeoutError::Timeout)
    ));
    assert!(matches!(
        p.send_event_timeout(1, &[0; 200], Duration::from_millis(20)),
        Err(SendTimeoutError::Timeout)
    ));
    // A spanning record that needs both segments: all or nothing.
    let big = vec![1u8; 6000];
    assert!(matches!(p.try_send(&big), Err(TrySendError::Full)));
    assert_eq!(c.recv().unwrap().unwrap().len(), Some(3000));
    assert_eq!(c.recv().unwrap().unwrap().len(), Some(3000));
    // Reading the second record returned the first segment.
    p.try_send(&rec).unwrap();
    assert_eq!(c.try_recv().unwrap().unwrap().len(), Some(3000));
    assert!(matches!(c.try_recv(), Err(TryRecvError::Empty)));
    drop(p);
    assert!(
        c.try_recv().unwrap().is_none(),
        "end of stream from try_recv too"
    );
}

#[test]
fn dropping_the_consumer_unblocks_the_producer_with_closed() {
    let (mut p, c) = pair(2);
    let rec = vec![0u8; 3000];
    p.send(&rec).unwrap();
    p.send(&rec).unwrap();
    let t = thread::spawn(move || p.send(&rec));
    wait_for("the producer to wait for room", || {
        c.metrics().backpressured_ns > 0
    });
    drop(c);
    assert!(matches!(t.join().unwrap(), Err(SendError::Closed(_))));
}

/// 64 B records written with `form` until the producer fails: how many were accepted, and
/// whether it failed with `Closed` (else what it failed with).
fn send_until_refused(p: &mut Producer, form: &str) -> (usize, Result<(), String>) {
    let rec = [7u8; 64];
    let closed = |e: SendError| match e {
        SendError::Closed(_) => Ok(()),
        e => Err(e.to_string()),
    };
    let mut sent = 0;
    loop {
        let r = match form {
            "send" => p.send(&rec).map(|()| 1).map_err(closed),
            "claim" => p
                .claim(64)
                .map(|mut c| {
                    c.copy_from_slice(&rec);
                    c.commit();
                    1
                })
                .map_err(closed),
            "batch" => p
                .claim_batch(64, 4)
                .map(|mut b| {
                    for r in b.iter_mut() {
                        r.copy_from_slice(&rec);
                    }
                    let n = b.len();
                    b.commit();
                    n
                })
                .map_err(closed),
            "stream" => match p.stream() {
                Ok(mut w) => match w.write_all(&rec) {
                    // A record that outgrows the segment in hand takes the next one in the
                    // write, which fails as `send` does (`Closed` as `BrokenPipe`).
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(Ok(())),
                    Err(e) => Err(Err(e.to_string())),
                    Ok(()) => w.finish().map(|()| 1).map_err(|e| Err(e.to_string())),
                },
                Err(e) => Err(closed(e)),
            },
            _ => unreachable!(),
        };
        match r {
            Ok(n) => sent += n,
            Err(e) => return (sent, e),
        }
        assert!(
            sent < 1_000_000,
            "{form}: the producer never noticed the consumer left"
        );
    }
}

#[test]
fn a_producer_finds_its_consumer_gone_at_the_next_segment_with_free_segments_left() {
    // 64 free segments: the producer never waits, so only the look at each segment taken
    // can find that the consumer left. What fits the segment in hand is accepted, exactly.
    let per_segment = SEG as usize / 72;
    for policy in [FlushPolicy::EveryRecord, FlushPolicy::Explicit] {
        for form in ["send", "claim", "batch", "stream"] {
            // The consumer leaves before anything is sent, with full segments sent, and with
            // the segment in hand partly written.
            for before in [0, 3 * per_segment, 3 * per_segment + 10] {
                let (mut p, mut c) = pair(64);
                p.set_flush_policy(policy);
                for _ in 0..before {
                    p.send(&[1u8; 64]).unwrap();
                }
                p.flush().unwrap();
                for _ in 0..before {
                    c.recv()
                        .unwrap()
                        .expect("a record sent before the consumer left");
                }
                drop(c);
                let (sent, err) = send_until_refused(&mut p, form);
                assert_eq!(err, Ok(()), "{form}, {policy:?}: not Closed");
                let room = (per_segment - before % per_segment) % per_segment;
                assert_eq!(
                    sent, room,
                    "{form}, {policy:?}, {before} sent before: records accepted after the \
                     consumer left, against the room left in the segment in hand"
                );
                assert!(matches!(p.send(b"x"), Err(SendError::Closed(_))));
            }
        }
    }
}

#[test]
fn buffer_timeout_makes_a_lone_record_visible() {
    let (mut p, mut c) = pair(4);
    p.set_flush_policy(FlushPolicy::Timeout(Duration::from_millis(5)));
    let t = thread::spawn(move || c.recv().unwrap().unwrap().to_vec().unwrap());
    wait_for("the consumer to wait", || p.metrics().idle_ns > 0);
    p.send(b"lonely").unwrap();
    // No flush, producer stays alive and idle.
    assert_eq!(t.join().unwrap(), b"lonely");
    drop(p);
}

#[test]
fn drain_hands_over_what_is_there() {
    let (mut p, mut c) = pair(4);
    p.set_flush_policy(FlushPolicy::Explicit);
    for i in 0..100u32 {
        p.send(&i.to_le_bytes()).unwrap();
    }
    p.flush().unwrap();
    let mut seen = Vec::new();
    let n = c
        .try_drain(usize::MAX, |r| {
            seen.push(u32::from_le_bytes(
                r.as_bytes().unwrap().try_into().unwrap(),
            ));
            Ok::<_, shmflow::RecvError>(())
        })
        .unwrap();
    assert_eq!(n, 100);
    assert_eq!(seen, (0..100).collect::<Vec<_>>());
    assert_eq!(
        c.try_drain(10, |_| Ok::<_, shmflow::RecvError>(()))
            .unwrap(),
        0
    );
    assert!(!c.is_ended(), "empty, but the producer is still there");
    p.send(b"last").unwrap();
    drop(p);
    assert!(c.is_closed() && !c.is_ended(), "a record is left");
    assert_eq!(
        c.try_drain(1, |_| Ok::<_, shmflow::RecvError>(())).unwrap(),
        1
    );
    assert!(
        !c.is_ended(),
        "drain stopped at its max, before looking further"
    );
    assert_eq!(
        c.try_drain(10, |_| Ok::<_, shmflow::RecvError>(()))
            .unwrap(),
        0
    );
    assert!(c.is_ended());
    assert!(c.recv().unwrap().is_none());
    assert!(c.is_ended());
}

#[test]
fn drain_waits_for_the_first_record_and_the_timeout_forms_give_up() {
    let (mut p, mut c) = pair(4);
    let t = std::time::Instant::now();
    let n = c
        .drain_timeout(10, std::time::Duration::from_millis(50), |_| {
            Ok::<_, shmflow::RecvError>(())
        })
        .unwrap();
    assert_eq!(n, 0, "nothing came");
    assert!(t.elapsed() >= std::time::Duration::from_millis(50));
    assert!(!c.is_ended());
    let writer = std::thread::spawn(move || {
        for i in 0..3u32 {
            p.send(&i.to_le_bytes()).unwrap();
        }
        p.close();
    });
    let mut seen = Vec::new();
    loop {
        let n = c
            .drain(usize::MAX, |r| {
                seen.push(r.as_bytes().unwrap().to_vec());
                Ok::<_, shmflow::RecvError>(())
            })
            .unwrap();
        if n == 0 {
            break;
        }
    }
    writer.join().unwrap();
    assert_eq!(seen.len(), 3);
    assert!(c.is_ended());
    let later = std::time::Instant::now() + std::time::Duration::from_secs(5);
    assert_eq!(
        c.drain_deadline(10, later, |_| Ok::<_, shmflow::RecvError>(()))
            .unwrap(),
        0,
        "the end of the stream returns at once"
    );
}

#[test]
fn a_failed_stream_never_reads_as_ended() {
    let (p, mut c) = pair(4);
    p.fail();
    let r = c.drain(10, |_| Ok::<_, shmflow::RecvError>(()));
    assert!(
        matches!(r, Err(shmflow::RecvError::ProducerFailed(_))),
        "{r:?}"
    );
    assert!(c.is_closed() && !c.is_ended());
}

#[test]
fn stream_has_try_and_timeout_forms() {
    let (mut p, mut c) = pair(2);
    p.set_flush_policy(FlushPolicy::EveryRecord);
    let rec = vec![5u8; 4088]; // fills a segment exactly
    p.send(&rec).unwrap();
    p.send(&rec).unwrap(); // both segments with the consumer, the current one full
    assert!(matches!(p.try_stream().err(), Some(TrySendError::Full)));
    assert!(matches!(
        p.stream_timeout(Duration::from_millis(20)).err(),
        Some(SendTimeoutError::Timeout)
    ));
    // Free one segment; a streamed record that outgrows it times out and is discarded.
    assert_eq!(c.recv().unwrap().unwrap().len(), Some(4088));
    assert_eq!(c.recv().unwrap().unwrap().len(), Some(4088));
    let mut w = p.stream_timeout(Duration::from_millis(20)).unwrap();
    w.write_all(&[1u8; 5000]).unwrap_err(); // spans into a segment the consumer still holds
    drop(w);
    // The consumer sees the aborted spanning record as RecordAborted, then the stream goes on.
    p.flush().unwrap();
    let t = thread::spawn(move || {
        p.send(b"next").unwrap();
        p
    });
    let mut results = Vec::new();
    for _ in 0..2 {
        match c.recv() {
            Ok(Some(r)) => results.push(r.to_vec().map_err(|e| e.to_string())),
            other => panic!("{:?}", other.map(|_| ())),
        }
    }
    assert!(
        results[0].as_ref().is_err_and(|e| e.contains("abandoned")),
        "{results:?}"
    );
    assert_eq!(results[1].as_deref(), Ok(&b"next"[..]));
    drop(t.join().unwrap());
}

/// A record of `len` bytes: a 1 MiB block of varied bytes, repeated, each MiB stamped with its
/// index so a part delivered twice or out of place cannot compare equal.
fn big_record(len: usize) -> Vec<u8> {
    const MIB: usize = 1 << 20;
    let block: Vec<u8> = (0..MIB as u64)
        .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
        .collect();
    let mut v = Vec::with_capacity(len);
    let mut k = 0u64;
    while v.len() < len {
        let take = (len - v.len()).min(MIB);
        let start = v.len();
        v.extend_from_slice(&block[..take]);
        let stamp = k.to_le_bytes();
        let n = take.min(8);
        v[start..start + n].copy_from_slice(&stamp[..n]);
        k += 1;
    }
    v
}

#[test]
fn records_of_more_than_a_gibibyte_round_trip() {
    // The issue asks for records up to at least 1 GiB: one sent as a slice and read part by
    // part in place, one streamed through io::Write in odd-sized pieces and read as one Vec.
    let len = (1usize << 30) + 13;
    let record = std::sync::Arc::new(big_record(len));
    let (p, mut c) = {
        let (p, c) = shmflow::pair(Geometry {
            segment_size: 32 * 1024,
            segment_count: 16,
        })
        .unwrap();
        (p, c)
    };
    let src = record.clone();
    let writer = thread::spawn(move || {
        let mut p = p;
        p.send(&src).unwrap();
        let mut w = p.stream().unwrap();
        for piece in src.chunks(1_000_003) {
            w.write_all(piece).unwrap();
        }
        w.finish().unwrap();
    });

    let mut r = c.recv().unwrap().expect("the first big record");
    assert!(r.is_spanning());
    let mut at = 0usize;
    let mut parts = 0usize;
    while let Some(part) = r.next_part().unwrap() {
        assert!(
            at + part.len() <= len && part == &record[at..at + part.len()],
            "part {parts} at offset {at} ({} bytes) differs from what was sent",
            part.len()
        );
        at += part.len();
        parts += 1;
    }
    assert_eq!(at, len, "the parts add up to the record");
    assert!(
        parts > len / (32 * 1024),
        "a 1 GiB record spans every segment many times"
    );
    drop(r);

    let whole = c
        .recv()
        .unwrap()
        .expect("the streamed record")
        .to_vec()
        .unwrap();
    assert_eq!(whole.len(), len);
    assert!(whole == *record, "the streamed record arrives intact");
    writer.join().unwrap();
    assert!(c.recv().unwrap().is_none());
}

#[test]
fn parts_of_a_spanning_record_have_try_and_timeout_forms() {
    use std::sync::mpsc;
    let (mut p, mut c) = pair(4);
    p.set_flush_policy(FlushPolicy::EveryRecord);
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let first: Vec<u8> = (0..6000u32).map(|i| i as u8).collect();
    let rest: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    let (f2, r2) = (first.clone(), rest.clone());
    let writer = thread::spawn(move || {
        // Two records, each stalled half-way: its first segment is out, the rest waits.
        for _ in 0..2 {
            let mut w = p.stream().unwrap();
            w.write_all(&f2).unwrap(); // fills the first segment: that part is published
            go_rx.recv().unwrap();
            w.write_all(&r2).unwrap();
            w.finish().unwrap();
        }
        p.send(b"after").unwrap();
    });

    let mut whole = Vec::new();
    {
        let mut r = c.recv().unwrap().expect("a record");
        assert!(r.is_spanning());
        whole.extend_from_slice(r.next_part().unwrap().expect("the first part"));
        // The producer stalls: neither form waits past its bound, and the record survives.
        assert!(matches!(r.try_next_part(), Err(TryRecvError::Empty)));
        assert!(matches!(
            r.next_part_timeout(Duration::from_millis(30)),
            Err(RecvTimeoutError::Timeout)
        ));
        go_tx.send(()).unwrap();
        while let Some(part) = r.next_part_timeout(Duration::from_secs(10)).unwrap() {
            whole.extend_from_slice(part);
        }
    }
    let mut expected = first.clone();
    expected.extend_from_slice(&rest);
    assert!(
        whole == expected,
        "resumed after WouldBlock and Timeout, intact"
    );

    // The whole record within a deadline: times out while the producer stalls; the next
    // read skips what is left of it and gets the record after.
    let r = c.recv().unwrap().expect("the second record");
    assert!(matches!(
        r.to_vec_timeout(Duration::from_millis(30)),
        Err(RecvTimeoutError::Timeout)
    ));
    go_tx.send(()).unwrap();
    let next = c
        .recv()
        .unwrap()
        .expect("the record after")
        .to_vec()
        .unwrap();
    assert_eq!(next, b"after");
    writer.join().unwrap();
}

#[test]
fn a_claim_of_any_length_that_does_not_fit_is_refused_not_wrapped() {
    let (mut p, mut c) = shmflow::pair(Geometry {
        segment_size: 4096,
        segment_count: 2,
    })
    .unwrap();
    // Lengths whose sum with the frame header would wrap around, with and without a segment
    // in hand.
    for len in [usize::MAX, usize::MAX - 7, usize::MAX - 8, 4089, 1 << 40] {
        assert!(
            matches!(p.claim(len), Err(shmflow::SendError::RecordTooLarge(_))),
            "claim({len})"
        );
        assert!(matches!(
            p.try_claim(len),
            Err(shmflow::TrySendError::RecordTooLarge(_))
        ));
        p.send(b"x").unwrap();
    }
    // The largest that fits still does, and the channel is intact.
    let mut claim = p.claim(4088).unwrap();
    claim.fill(7);
    claim.commit();
    for _ in 0..5 {
        assert_eq!(c.recv().unwrap().unwrap().as_bytes(), Some(&b"x"[..]));
    }
    assert_eq!(c.recv().unwrap().unwrap().len(), Some(4088));
}

#[test]
fn a_reader_of_records_skips_priority_events_while_it_waits() {
    // A consumer blocked in `recv` (which skips events) while the producer sends more
    // priority events than the lane holds: the producer never waits for room for long, and
    // the record sent after them arrives. Under every wait strategy, blocking and async.
    for wait in [
        shmflow::WaitStrategy::Block,
        shmflow::WaitStrategy::BusyPoll(Duration::from_micros(20)),
        shmflow::WaitStrategy::Park,
    ] {
        for asynch in [false, cfg!(feature = "tokio")] {
            let (mut p, mut c) = pair(4);
            c.set_wait_strategy(wait);
            let (done_tx, done_rx) = std::sync::mpsc::channel();
            let reader = thread::spawn(move || {
                let got = if asynch {
                    recv_async_to_vec(&mut c)
                } else {
                    c.recv().map(|r| r.map(|r| r.to_vec().unwrap()))
                };
                done_tx.send(()).unwrap();
                got
            });
            wait_for("the reader to wait", || p.metrics().idle_ns > 0);
            for i in 0..20u64 {
                p.send_priority_event_timeout(3, &i.to_le_bytes(), Duration::from_secs(10))
                    .unwrap_or_else(|e| panic!("{wait:?} async {asynch}: event {i}: {e}"));
            }
            p.send(b"after the events").unwrap();
            done_rx
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("{wait:?} async {asynch}: the record never came"));
            let got = reader.join().unwrap().unwrap();
            assert_eq!(got.as_deref(), Some(&b"after the events"[..]), "{wait:?}");
        }
    }
}

/// `recv_async` on a current-thread runtime, the record copied out.
#[cfg(feature = "tokio")]
fn recv_async_to_vec(c: &mut Consumer) -> Result<Option<Vec<u8>>, shmflow::RecvError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async { c.recv_async().await.map(|r| r.map(|r| r.to_vec().unwrap())) })
}

#[cfg(not(feature = "tokio"))]
fn recv_async_to_vec(_: &mut Consumer) -> Result<Option<Vec<u8>>, shmflow::RecvError> {
    unreachable!("the async form needs the tokio feature")
}

#[test]
fn what_a_drain_closure_does_with_a_record_leaves_the_records_after_it_whole_and_in_order() {
    // Each record read in another way inside `try_drain`'s closure: in place, part by part, as
    // an `io::Read`, and held past its segment; the records after each must come whole and in
    // order (the drain keeps its place in the segment across the closure).
    let (mut tx, mut rx) = pair(4);
    let total = 100u64;
    let record = |i: u64| {
        let mut r = vec![i as u8; 100];
        r[..8].copy_from_slice(&i.to_le_bytes());
        r
    };
    for i in 0..total {
        tx.send(&record(i)).unwrap();
    }
    drop(tx);
    let (mut next, mut holds) = (0u64, Vec::new());
    while next < total {
        let n = rx
            .try_drain(usize::MAX, |mut r| {
                let bytes = match next % 4 {
                    0 => r.as_bytes().unwrap().to_vec(),
                    1 => {
                        let b = r.next_part()?.unwrap().to_vec();
                        assert_eq!(r.next_part()?, None, "a record in one segment has one part");
                        b
                    }
                    2 => {
                        let mut b = Vec::new();
                        r.read_to_end(&mut b).unwrap();
                        b
                    }
                    _ => {
                        let b = r.as_bytes().unwrap().to_vec();
                        holds.push(r.hold_segment().expect("a record of one segment is held"));
                        b
                    }
                };
                assert_eq!(bytes, record(next), "record {next}");
                next += 1;
                Ok::<_, shmflow::Error>(())
            })
            .unwrap();
        assert!(n > 0 || rx.is_ended(), "nothing drained at record {next}");
        if n == 0 {
            break;
        }
    }
    assert_eq!(next, total);
    for h in holds {
        rx.release_hold(h).unwrap();
    }
    assert!(rx.recv().unwrap().is_none());
}
