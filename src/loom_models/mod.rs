//! loom models of shmflow's concurrent protocols, inside the crate (as tokio keeps its own),
//! driving the library's real ring, producer, consumer, gate, flusher signal and async waits
//! over a region on the heap (`support`). Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg shmflow_loom" LOOM_MAX_PREEMPTIONS=3 \
//!     cargo test -p shmflow --lib --release --target-dir target/loom loom_models
//! ```
//!
//! The cfg is shmflow's own (`shmflow_loom`, not `loom`): tokio, which the tests depend on,
//! drops its networking under `--cfg loom`. Under `--cfg shmflow_broken="…"` the library is
//! built with one ordering deliberately broken; `scripts/loom-broken.sh` asserts that the
//! model meant to catch it fails, for that reason.

mod support;

use loom::thread;

use crate::endpoint::producer::{FlushPolicy, Producer};
use crate::error::{SendError, TryRecvError};
use crate::protocol::park::WaitStrategy;
use support::{ring, GateRegion, Region};

/// Segments of 64 bytes: a 40-byte record (+ 8-byte header) fills one.
const SEG: u32 = 64;

/// Runs a model with at most `preemptions` forced preemptions (LOOM_MAX_PREEMPTIONS, if
/// set, overrides it for every model).
fn model_bounded(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(preemptions);
    }
    b.check(f);
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    model_bounded(3, f)
}

fn pattern(seq: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seq.wrapping_mul(31).wrapping_add(i as u8))
        .collect()
}

fn send(p: &mut Producer, seq: u8, len: usize) {
    p.send(&pattern(seq, len)).unwrap();
}

/// Model 1: Ring push/pop across wrap-around: every value popped once, in order. Capacity 3, four
/// values: the fourth reuses slot 0, whose old value differs, so a stale slot read shows.
#[test]
fn ring_fifo_across_wrap_around() {
    const VALUES: [u32; 4] = [1, 2, 0, 2];
    model(|| {
        let (mut tx, mut rx) = ring(3);
        let t = thread::spawn(move || {
            let mut got = Vec::new();
            while got.len() < VALUES.len() {
                match rx.pop().unwrap() {
                    Some(v) => got.push(v),
                    None => thread::yield_now(),
                }
            }
            got
        });
        let mut pushed = 0;
        while pushed < VALUES.len() {
            match tx.push(VALUES[pushed]) {
                Ok(true) => pushed += 1,
                // Full (which a channel never lets happen): wait for a pop.
                Ok(false) => thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(t.join().unwrap(), VALUES);
    });
}

/// Model 2: Segment conservation: three one-segment records through two segments; every record is
/// read once, in order, and at the end every segment is in exactly one place.
#[test]
fn segments_are_conserved_and_records_read_once_in_order() {
    // Both sides block and wake here: the largest model, so one preemption less.
    model_bounded(2, || {
        let region = Region::new(SEG, 2);
        let mut p = region.producer();
        let mut c = region.consumer();
        p.set_flush_policy(FlushPolicy::EveryRecord);
        let t = thread::spawn(move || {
            for seq in 0..3 {
                send(&mut p, seq, 40);
            }
            // Dropping ends the stream.
        });
        for seq in 0..3u8 {
            let r = c.recv().unwrap().expect("a record");
            assert_eq!(r.as_bytes().unwrap(), &pattern(seq, 40)[..]);
        }
        assert!(c.recv().unwrap().is_none());
        t.join().unwrap();
        let held = c.held_segment();
        assert_eq!(
            region.census(held),
            vec![1, 1],
            "every segment in exactly one place"
        );
    });
}

/// Model 3: Commit visibility: the consumer never sees bytes of a record before they are
/// committed. The byte tracker makes loom check every read of segment bytes against the
/// writes (a read not ordered after the write by happens-before is a causality violation),
/// and the pattern is checked as well.
#[test]
fn consumer_never_reads_uncommitted_bytes() {
    model(|| {
        let region = Region::new(SEG * 2, 2);
        let mut p = region.producer();
        let mut c = region.consumer();
        p.set_flush_policy(FlushPolicy::EveryRecord);
        let t = thread::spawn(move || {
            send(&mut p, 1, 16);
            send(&mut p, 2, 24);
            p
        });
        let mut seen = 0;
        while seen < 2 {
            match c.try_recv() {
                Ok(Some(r)) => {
                    seen += 1;
                    let want = if seen == 1 {
                        pattern(1, 16)
                    } else {
                        pattern(2, 24)
                    };
                    assert_eq!(r.as_bytes().unwrap(), &want[..]);
                }
                Ok(None) => panic!("end of stream before both records"),
                Err(TryRecvError::Empty) => thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        drop(t.join().unwrap());
    });
}

/// Model 4: The producer parks on an empty return ring while the consumer returns a segment: it
/// always wakes (no lost wake-up, no deadlock — loom reports a deadlock as a failure).
#[test]
fn producer_waiting_for_a_segment_always_wakes() {
    model(|| {
        let region = Region::new(SEG, 2);
        let mut p = region.producer();
        let mut c = region.consumer();
        p.set_flush_policy(FlushPolicy::EveryRecord);
        send(&mut p, 0, 40);
        send(&mut p, 1, 40); // both segments out: the next send must wait for a return
        let t = thread::spawn(move || {
            send(&mut p, 2, 40);
            p
        });
        for seq in 0..3u8 {
            let r = c.recv().unwrap().expect("record");
            assert_eq!(r.as_bytes().unwrap(), &pattern(seq, 40)[..]);
        }
        drop(t.join().unwrap());
    });
}

/// Model 5: The consumer parks on no data while the producer publishes with an explicit flush: it
/// always wakes.
#[test]
fn consumer_waiting_for_data_always_wakes() {
    model(|| {
        let region = Region::new(SEG, 2);
        let mut p = region.producer();
        let mut c = region.consumer();
        p.set_flush_policy(FlushPolicy::Explicit);
        let t = thread::spawn(move || {
            send(&mut p, 7, 8);
            p.flush().unwrap();
            p
        });
        let r = c.recv().unwrap().expect("record");
        assert_eq!(r.as_bytes().unwrap(), &pattern(7, 8)[..]);
        drop(r);
        drop(t.join().unwrap());
    });
}

/// Model 6a: The producer detaches while the consumer parks: the consumer reads what was committed
/// and then gets end of stream, never hangs.
#[test]
fn producer_drop_while_consumer_parks_ends_the_stream() {
    model(|| {
        let region = Region::new(SEG, 2);
        let mut p = region.producer();
        let mut c = region.consumer();
        p.set_flush_policy(FlushPolicy::Explicit);
        let t = thread::spawn(move || {
            send(&mut p, 3, 8); // unflushed: the drop publishes it
            drop(p);
        });
        assert_eq!(
            c.recv()
                .unwrap()
                .expect("the committed record")
                .as_bytes()
                .unwrap(),
            &pattern(3, 8)[..]
        );
        assert!(c.recv().unwrap().is_none(), "end of stream");
        t.join().unwrap();
    });
}

/// Model 6b: The consumer detaches while the producer parks on a full pool: the producer's send
/// returns `Closed`, never hangs.
#[test]
fn consumer_drop_while_producer_parks_gives_closed() {
    model(|| {
        let region = Region::new(SEG, 2);
        let mut p = region.producer();
        let c = region.consumer();
        p.set_flush_policy(FlushPolicy::EveryRecord);
        send(&mut p, 0, 40);
        send(&mut p, 1, 40);
        let t = thread::spawn(move || drop(c));
        let r = p.send(&pattern(2, 40));
        assert!(matches!(r, Err(SendError::Closed(_))), "got {r:?}");
        t.join().unwrap();
    });
}

/// Model 7 (gates): floating-segment lending. One channel with one exclusive segment and one
/// floating segment; the producer sends records that each fill a segment, so it runs out and
/// announces a backlog while the gate reads, lends the floating segment, and takes segments
/// back. Every record arrives once, in order; the end of the partition comes last; the
/// floating segment is back in the pool and the exclusive one in exactly one place. At least
/// one explored execution must have lent the floating segment, or the model proved nothing.
#[test]
fn gate_lends_floating_segments_and_gets_them_back() {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    static LENT: AtomicUsize = AtomicUsize::new(0);
    const RECORDS: u8 = 2;
    model_bounded(2, || {
        let region = GateRegion::new(1, 1, 1);
        let mut gate = region.gate();
        let mut p = region.producer(0);
        p.set_flush_policy(FlushPolicy::EveryRecord);
        let t = thread::spawn(move || {
            for seq in 0..RECORDS {
                send(&mut p, seq, 40);
            }
        });
        for seq in 0..RECORDS {
            match gate.recv().unwrap().expect("a message") {
                crate::endpoint::gate::GateMessage::Record { channel: 0, record } => {
                    assert_eq!(record.as_bytes().unwrap(), &pattern(seq, 40)[..])
                }
                _ => panic!("record {seq} expected"),
            }
        }
        assert!(matches!(
            gate.recv().unwrap(),
            Some(crate::endpoint::gate::GateMessage::EndOfPartition { channel: 0 })
        ));
        assert!(gate.recv().unwrap().is_none());
        t.join().unwrap();
        assert_eq!(gate.floating_free(), 1, "the floating segment came back");
        assert_eq!(region.exclusive_census(0, None), vec![1]);
        if gate.metrics().channels[0].snapshot.segments_taken > RECORDS as u64 - 1
            && region.lent(0) > 0
        {
            LENT.fetch_add(1, Relaxed);
        }
    });
    assert!(
        LENT.load(Relaxed) > 0,
        "no execution lent the floating segment"
    );
}

/// Model 8: The buffer-timeout flusher sleeps without a timer while nothing is pending; a
/// publication marked while it goes to sleep is never left without a wake-up (a lost one is a
/// flusher parked forever: a deadlock). Its interval timer is left out: a timeout is a
/// spurious wake-up, which the protocol must not need.
#[test]
fn flusher_sleeping_without_a_timer_never_misses_a_publication() {
    use loom::sync::atomic::{AtomicU64, Ordering};
    use loom::sync::Arc;
    use support::FlushSignal;
    model(|| {
        let signal = Arc::new(FlushSignal::default());
        let published = Arc::new(AtomicU64::new(0));
        let (s, p) = (signal.clone(), published.clone());
        let flusher = thread::spawn(move || loop {
            if s.take() {
                // Every publication marked before the one taken is visible (Acquire).
                if p.load(Ordering::Relaxed) == 2 {
                    break;
                }
            } else {
                s.sleep(|| false);
            }
        });
        let handle = flusher.thread().clone();
        for i in 1..=2 {
            // The producer's commit store (Relaxed here: the mark's RMW orders it).
            published.store(i, Ordering::Relaxed);
            signal.mark(&handle);
        }
        flusher.join().unwrap();
    });
}

/// Model 9: The consumer parks on no data while the producer publishes record by record with
/// the default policy, notifying with a plain load of the park word (the asymmetric barrier,
/// modelled as a SeqCst fence on each side): it always wakes, for each of two records.
#[test]
fn consumer_waiting_for_records_published_one_by_one_always_wakes() {
    model(|| {
        let region = Region::new(SEG, 2);
        let mut p = region.producer();
        let mut c = region.consumer();
        assert_eq!(p.flush_policy(), FlushPolicy::EveryRecord);
        let t = thread::spawn(move || {
            send(&mut p, 1, 8);
            send(&mut p, 2, 8);
            p
        });
        for seq in 1..=2 {
            let r = c.recv().unwrap().expect("record");
            assert_eq!(r.as_bytes().unwrap(), &pattern(seq, 8)[..]);
        }
        drop(t.join().unwrap());
    });
}

/// Model 9b: A notifier tells the word it wakes with the read-modify-write only
/// (`park::rmw_notifier`, as a receiving bridge does for its consumer) while the waiter may be
/// announcing itself, then publishes and notifies with the light notification. A waiter whose
/// announcing RMW reads the bit parks without the heavy barrier, one that does not issues it;
/// the light notification reads the bit (its own write) and takes the RMW. The waiter always
/// wakes. (Broken variant `light_ignores_no_fence`: the light notification looks at `PARKED`
/// alone, so a waiter that skipped the barrier can be missed.)
#[test]
fn waiter_of_an_rmw_only_notifier_parks_without_the_barrier_and_wakes() {
    use crate::protocol::park;
    use crate::region::os::Host;
    model(|| {
        let word = std::sync::Arc::new(support::ParkWord::new());
        let published = std::sync::Arc::new(crate::sync::AtomicU32::new(0));
        let (w, p) = (word.clone(), published.clone());
        let notifier = thread::spawn(move || {
            park::rmw_notifier(w.word());
            // Release: pairs with the waiter's Acquire look.
            p.store(1, crate::sync::Ordering::Release);
            park::notify_light::<Host>(w.word(), || None);
        });
        let got = park::wait_for::<Host, _, _, std::convert::Infallible>(
            word.word(),
            WaitStrategy::Park,
            crate::protocol::park::Forever,
            park::Notifier::Light,
            park::Pace::Sparse,
            |_| Ok((published.load(crate::sync::Ordering::Acquire) == 1).then_some(())),
        );
        assert!(got.is_ok());
        notifier.join().unwrap();
    });
}

/// Model 10: The async wait protocol alone: a task (in `block_on`) announces itself on a
/// park word, re-checks, and registers with the bridge thread, which sleeps on the word and
/// its own nudge word (the modelled `futex_waitv`); a notifier publishes and notifies with the
/// read-modify-write. The task is always woken.
#[test]
fn async_waiter_through_the_bridge_always_wakes() {
    model(|| {
        let word = std::sync::Arc::new(support::ParkWord::new());
        let bridge = thread::spawn(support::serve_bridge);
        let notifier = {
            let word = word.clone();
            thread::spawn(move || word.publish())
        };
        loom::future::block_on(word.wait());
        notifier.join().unwrap();
        support::stop_bridge();
        bridge.join().unwrap();
    });
}

/// Model 10b: The async wait protocol with the doorbell: a task announces itself on the park
/// word with the doorbell bit, re-checks, and sleeps on the doorbell (the modelled doorbell and
/// reactor); a notifier publishes, clears the bits with its read-modify-write and rings the
/// bell. The task is always woken, and no bridge thread is involved.
#[test]
fn async_waiter_on_the_doorbell_always_wakes() {
    model(|| {
        let word = std::sync::Arc::new(support::ParkWord::with_doorbell());
        let notifier = {
            let word = word.clone();
            thread::spawn(move || word.publish())
        };
        loom::future::block_on(word.wait());
        notifier.join().unwrap();
    });
}

/// Model 11: An async consumer waits for a record through the bridge while the producer
/// publishes it with the default policy (the light notification, the asymmetric barrier
/// modelled as a SeqCst fence on each side): the real consumer and producer, always woken.
#[test]
fn async_consumer_waiting_through_the_bridge_always_wakes() {
    model_bounded(2, || {
        let region = Region::new(SEG, 2);
        let mut p = region.producer();
        let mut c = region.consumer();
        c.set_wait_strategy(WaitStrategy::Park);
        let bridge = thread::spawn(support::serve_bridge);
        let t = thread::spawn(move || {
            send(&mut p, 1, 8);
            p
        });
        loom::future::block_on(async {
            let r = c.recv_async().await.unwrap().expect("record");
            assert_eq!(r.as_bytes().unwrap(), &pattern(1, 8)[..]);
        });
        drop(t.join().unwrap());
        support::stop_bridge();
        bridge.join().unwrap();
    });
}

/// Model 12a (buffer debloating): the consumer caps the producer at one segment in flight; the
/// producer's second record needs a second segment and waits for the cap. The consumer reads
/// the first record and finishes its segment (publishing its count of finished segments, then
/// returning the segment and waking the producer): the producer always wakes, finds room under
/// the cap and sends; both records arrive in order.
#[test]
fn producer_held_back_by_the_cap_wakes_when_a_segment_is_done() {
    model(|| {
        let region = Region::new(SEG, 3);
        let mut p = region.producer();
        let mut c = region.consumer();
        c.publish_cap(1);
        p.set_flush_policy(FlushPolicy::EveryRecord);
        send(&mut p, 0, 40);
        let t = thread::spawn(move || {
            send(&mut p, 1, 40); // a second segment: beyond the cap until the first is done
            p
        });
        for seq in 0..2u8 {
            let r = c.recv().unwrap().expect("record");
            assert_eq!(r.as_bytes().unwrap(), &pattern(seq, 40)[..]);
        }
        drop(t.join().unwrap());
    });
}

/// Model 12b (buffer debloating): the producer waits at a cap of one segment while free
/// segments sit in its return ring; the consumer, reading nothing, raises the cap (as it does
/// when it reads faster) once the producer has announced that it parks (or at once: both
/// orders are explored): the producer always wakes and sends. (Without the wait for the
/// announcement, loom's yields in the producer's spin phase always let the raise in first.)
#[test]
fn producer_held_back_by_the_cap_wakes_when_it_rises() {
    model(|| {
        let region = Region::new(SEG, 3);
        let mut p = region.producer();
        let mut c = region.consumer();
        c.publish_cap(1);
        p.set_flush_policy(FlushPolicy::EveryRecord);
        send(&mut p, 0, 40);
        let t = thread::spawn(move || {
            send(&mut p, 1, 40);
            p
        });
        let park = region.producer_park();
        let mut looks = 0;
        while park.load(loom::sync::atomic::Ordering::Relaxed) & crate::protocol::park::PARKED == 0
            && looks < 3
        {
            looks += 1;
            thread::yield_now();
        }
        c.publish_cap(2);
        let p = t.join().unwrap();
        for seq in 0..2u8 {
            let r = c.recv().unwrap().expect("record");
            assert_eq!(r.as_bytes().unwrap(), &pattern(seq, 40)[..]);
        }
        drop(p);
    });
}

/// Model 13: A gate waits on its park word for a remote channel whose socket a watcher thread
/// watches: the watcher marks the channel, then rings the word (`mark_then_notify`, the real
/// step); the waiting gate's looks take the mark (`take_mark`). The gate always wakes and
/// sees the mark, for marks of two channels in two rounds.
#[test]
fn a_gate_waiting_for_a_marked_socket_always_wakes() {
    use crate::protocol::park;
    use crate::region::os::Host;
    model(|| {
        let word = std::sync::Arc::new(support::ParkWord::new());
        let marks: std::sync::Arc<[crate::sync::AtomicU32]> =
            (0..2).map(|_| crate::sync::AtomicU32::new(0)).collect();
        let (w, m) = (word.clone(), marks.clone());
        let watcher = thread::spawn(move || {
            park::mark_then_notify::<Host>(&m, &[1], w.word(), None);
            park::mark_then_notify::<Host>(&m, &[0], w.word(), None);
        });
        let mut seen = [false; 2];
        while !(seen[0] && seen[1]) {
            let got = park::wait_for::<Host, _, _, std::convert::Infallible>(
                word.word(),
                WaitStrategy::Park,
                crate::protocol::park::Forever,
                park::Notifier::Rmw,
                park::Pace::Sparse,
                |_| {
                    let mut any = false;
                    for (c, s) in seen.iter_mut().enumerate() {
                        if park::take_mark(&marks[c]) {
                            *s = true;
                            any = true;
                        }
                    }
                    Ok(any.then_some(()))
                },
            );
            assert!(got.is_ok());
        }
        watcher.join().unwrap();
    });
}

/// Model 14: The priority lane alone (four slots in the header): the producer pushes six
/// events, the fifth and sixth into reused slots (waiting for room when the lane is full), while
/// the consumer pops. Every event comes out once, in order, with its kind and its whole payload
/// (two words: a stale word of a reused slot shows).
#[test]
fn priority_lane_hands_over_every_event_whole_and_in_order() {
    model_bounded(2, || {
        let (mut tx, mut rx) = support::lane();
        let payload = |k: u32| [k as u8; 12];
        let t = thread::spawn(move || {
            for k in 1..=6u32 {
                while !tx.push(k, &payload(k)) {
                    thread::yield_now();
                }
            }
        });
        for k in 1..=6u32 {
            let got = loop {
                match rx.pop() {
                    Some(e) => break e,
                    None => thread::yield_now(),
                }
            };
            assert_eq!(got, (k, payload(k).to_vec()), "event {k}");
        }
        t.join().unwrap();
    });
}
