//! Fuzz target: a reader and a writer over a region whose bytes are attacker-controlled.
//!
//! ```text
//! cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run region -- -runs=10000000
//! ```
//!
//! The first input byte picks a mode:
//! - 0: the whole region image (header included) comes from the input, then both ends try to
//!   open it — exercises every check of `open`;
//! - 1: a live channel (both ends attached, some records written and read), then the input
//!   overwrites the region from the start (header, cursors, ring slots, frame headers,
//!   segments), then both ends keep working;
//! - 2: a live channel, then the input is a list of 8-byte patches `(offset u16, value u64)`
//!   applied to it — corrupts a few fields of a plausible state, the most realistic attack.
//!
//! Success is the absence of a crash: every call must return (the loops are bounded and all
//! calls are non-blocking) with `Ok` or a typed error, and no access may leave the region
//! (AddressSanitizer and the mapping's bounds would catch it).
#![no_main]

mod common;

use std::os::fd::OwnedFd;

use common::{apply_patches, read_parts};
use libfuzzer_sys::fuzz_target;
use shmflow::{Consumer, FlushPolicy, Geometry, Producer};

const G: Geometry = Geometry {
    segment_size: 4096,
    segment_count: 3,
};

fn raw_map(fd: &OwnedFd) -> memmap2::MmapMut {
    // SAFETY: a second shared mapping of the region, written while the ends use it: that is
    // the attack. Nothing in this process reads it as Rust data.
    unsafe { memmap2::MmapMut::map_mut(fd).unwrap() }
}

fn exercise(p: Option<&mut Producer>, c: Option<&mut Consumer>, seed: u8) {
    if let Some(c) = c {
        c.set_max_record_len(1 << 20);
        for _ in 0..24 {
            match c.try_recv() {
                Ok(Some(r)) => {
                    read_parts(r);
                }
                Ok(None) => break,
                Err(_) => {}
            }
        }
        let _ = c.try_drain(16, |r| {
            let _ = r.as_bytes();
            Ok::<_, shmflow::RecvError>(())
        });
        // Events and the priority lane: kinds, lengths and lane cursors are peer-written too.
        for _ in 0..8 {
            match c.try_recv_message() {
                Ok(Some(shmflow::Message::Record(r))) => {
                    read_parts(r);
                }
                Ok(Some(shmflow::Message::Event(e))) => {
                    let _ = e.payload.iter().map(|&b| u64::from(b)).sum::<u64>();
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => {}
            }
        }
    }
    if let Some(p) = p {
        let rec = vec![seed; (seed as usize) * 37];
        for i in 0..10 {
            let _ = match i % 5 {
                0 => p.try_send(&rec).is_ok(),
                1 => p.flush().is_ok(),
                2 => p
                    .try_send_event(u32::from(seed), &rec[..rec.len().min(64)])
                    .is_ok(),
                3 => p.try_send_priority_event(7, &[seed; 16]).is_ok(),
                _ => p.try_claim(16).map(|c| c.commit()).is_ok(),
            };
        }
    }
}

fn live_pair() -> (Producer, Consumer, memmap2::MmapMut) {
    let (mut p, handle) = Producer::create_anonymous(G).unwrap();
    p.set_flush_policy(FlushPolicy::EveryRecord);
    let fd = handle.into_fd();
    let map = raw_map(&fd);
    let mut c = Consumer::from_fd(fd).unwrap();
    for i in 0..5u8 {
        p.send(&vec![i; 700 * i as usize]).unwrap();
    }
    // Something in both event paths, so patches land on live event state as well.
    p.send_event(3, b"in order").unwrap();
    p.send_priority_event(4, b"overtakes").unwrap();
    for _ in 0..2 {
        let _ = c.try_recv().unwrap().unwrap().to_vec();
    }
    (p, c, map)
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 3 {
        0 => {
            // Build a region image from the input and open it.
            let (p, handle) = Producer::create_anonymous(G).unwrap();
            let fd = handle.into_fd();
            drop(p); // the image replaces everything anyway
            let mut map = raw_map(&fd);
            let n = rest.len().min(map.len());
            map[..n].copy_from_slice(&rest[..n]);
            let fd2 = fd.try_clone().unwrap();
            if let Ok(mut c) = Consumer::from_fd(fd) {
                exercise(None, Some(&mut c), mode);
            }
            if let Ok(mut p) = Producer::from_fd(fd2) {
                exercise(Some(&mut p), None, mode);
            }
        }
        1 => {
            let (mut p, mut c, mut map) = live_pair();
            let n = rest.len().min(map.len());
            map[..n].copy_from_slice(&rest[..n]);
            exercise(Some(&mut p), Some(&mut c), mode);
            exercise(Some(&mut p), Some(&mut c), mode.wrapping_add(1));
        }
        _ => {
            let (mut p, mut c, mut map) = live_pair();
            apply_patches(&mut map, rest);
            exercise(Some(&mut p), Some(&mut c), mode);
            exercise(Some(&mut p), Some(&mut c), mode.wrapping_add(7));
        }
    }
});
