//! Segments held past the consumer's reading (`Record::hold_segment`): they stay out of the
//! pool, their bytes stay as received, and they go back when the last hold is released.

use shmflow::{Geometry, TrySendError};

const G: Geometry = Geometry {
    segment_size: 4096,
    segment_count: 3,
};

/// One record per segment.
fn big(b: u8) -> Vec<u8> {
    vec![b; 4000]
}

#[test]
fn held_segments_keep_their_bytes_until_the_last_hold_goes() {
    let (mut tx, mut rx) = shmflow::pair(G).unwrap();
    let mut held = Vec::new();
    for i in 0..3u8 {
        tx.send(&big(i)).unwrap();
        let mut r = rx.recv().unwrap().unwrap();
        let ptr = r.as_bytes().unwrap().as_ptr();
        // Two holds on one segment: it goes back after both.
        held.push((i, ptr, r.hold_segment().unwrap(), r.hold_segment().unwrap()));
    }
    // The consumer moved past the first two; the third is still in its hand.
    assert_eq!(rx.held_segments(), 2);
    assert!(matches!(tx.try_send(&big(9)), Err(TrySendError::Full)));
    for (i, ptr, _, _) in &held {
        // SAFETY: the holds keep each segment from the producer.
        let bytes = unsafe { std::slice::from_raw_parts(*ptr, 4000) };
        assert!(bytes.iter().all(|b| b == i), "segment {i} was rewritten");
    }
    let (_, _, a, b) = held.remove(0);
    rx.release_hold(a).unwrap();
    assert!(matches!(tx.try_send(&big(9)), Err(TrySendError::Full)));
    rx.release_hold(b).unwrap();
    assert_eq!(rx.held_segments(), 1);
    tx.try_send(&big(3)).unwrap();
    assert_eq!(rx.recv().unwrap().unwrap().as_bytes().unwrap()[0], 3);
    // Released in any order.
    let (_, _, a2, b2) = held.pop().unwrap();
    let (_, _, a1, b1) = held.pop().unwrap();
    for h in [b2, a1, a2, b1] {
        rx.release_hold(h).unwrap();
    }
    assert_eq!(rx.held_segments(), 0);
    for i in 0..10u8 {
        tx.send(&big(i)).unwrap();
        assert_eq!(rx.recv().unwrap().unwrap().as_bytes().unwrap()[0], i);
    }
}

#[test]
fn a_spanning_record_cannot_be_held() {
    let (mut tx, mut rx) = shmflow::pair(G).unwrap();
    let writer = std::thread::spawn(move || tx.send(&vec![1u8; 10_000]).unwrap());
    let mut r = rx.recv().unwrap().unwrap();
    assert!(r.is_spanning());
    assert!(r.hold_segment().is_none());
    assert_eq!(r.to_vec().unwrap().len(), 10_000);
    writer.join().unwrap();
}

#[test]
#[should_panic(expected = "did not give it")]
fn a_hold_goes_back_only_to_its_own_consumer() {
    let (mut tx, mut rx) = shmflow::pair(G).unwrap();
    let (_tx2, mut rx2) = shmflow::pair(G).unwrap();
    tx.send(b"x").unwrap();
    let hold = rx.recv().unwrap().unwrap().hold_segment().unwrap();
    let _ = rx2.release_hold(hold);
}

#[test]
fn a_detached_claim_is_refused_once_the_producer_moved_on() {
    let (mut tx, mut rx) = shmflow::pair(G).unwrap();
    let (claim, _ptr) = tx.claim(8).unwrap().detach();
    assert_eq!(claim.len(), 8);
    // Writing anything else first makes the claim stale: committing it would write over the
    // record just sent.
    tx.send(b"other").unwrap();
    let e = tx.commit_detached(claim, 8).unwrap_err();
    assert!(e.to_string().contains("stale"), "{e}");
    // A claim from another producer is refused too.
    let (mut tx2, _rx2) = shmflow::pair(G).unwrap();
    let (foreign, _) = tx2.claim(8).unwrap().detach();
    assert!(tx.commit_detached(foreign, 8).is_err());
    // A fresh one goes through, with the length asked for.
    let (claim, ptr) = tx.claim(8).unwrap().detach();
    // SAFETY: the producer is not used until the commit.
    unsafe {
        ptr.as_ptr()
            .copy_from_nonoverlapping(b"abcdefgh".as_ptr(), 8)
    };
    tx.commit_detached(claim, 3).unwrap();
    tx.flush().unwrap();
    assert_eq!(rx.recv().unwrap().unwrap().as_bytes(), Some(&b"other"[..]));
    assert_eq!(rx.recv().unwrap().unwrap().as_bytes(), Some(&b"abc"[..]));
}
