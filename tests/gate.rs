//! Gates: many producers into one consumer, with exclusive and floating segments.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use shmflow::{Error, Gate, GateGeometry, GateMessage, Partition, Partitioner, Producer};

fn small(channels: u32, exclusive: u32, floating: u32) -> GateGeometry {
    GateGeometry {
        channels,
        exclusive,
        floating,
        segment_size: 4096,
    }
}

#[test]
fn records_from_every_channel_arrive_in_order_per_channel_then_end() {
    let name = unique_name("gate-basic");
    let mut gate = Gate::create(&name, small(3, 2, 4)).unwrap();
    let mut ps: Vec<Producer> = (0..3)
        .map(|c| Producer::open_channel(&name, c).unwrap())
        .collect();
    let n = 5_000u64;
    let writers: Vec<_> = ps
        .drain(..)
        .enumerate()
        .map(|(c, mut p)| {
            std::thread::spawn(move || {
                for i in 0..n {
                    let mut rec = (c as u64).to_le_bytes().to_vec();
                    rec.extend_from_slice(&i.to_le_bytes());
                    rec.resize(16 + (i as usize % 300), c as u8);
                    p.send(&rec).unwrap();
                }
            })
        })
        .collect();
    let mut next = [0u64; 3];
    let mut ended = [false; 3];
    while let Some(m) = gate.recv().unwrap() {
        match m {
            GateMessage::Record { channel, record } => {
                let b = record.as_bytes().unwrap();
                assert_eq!(
                    u64::from_le_bytes(b[..8].try_into().unwrap()),
                    channel as u64
                );
                assert_eq!(
                    u64::from_le_bytes(b[8..16].try_into().unwrap()),
                    next[channel]
                );
                assert!(b[16..].iter().all(|&x| x == channel as u8));
                next[channel] += 1;
            }
            GateMessage::EndOfPartition { channel } => {
                assert_eq!(next[channel], n, "end comes after every record");
                assert!(!ended[channel]);
                ended[channel] = true;
            }
            other => panic!("unexpected message on channel {}", other.channel()),
        }
    }
    assert_eq!(ended, [true; 3]);
    for w in writers {
        w.join().unwrap();
    }
    // Every floating segment is back in the pool.
    assert_eq!(gate.floating_free(), 4);
}

#[test]
fn a_single_channel_open_of_a_gate_names_what_it_is() {
    let name = unique_name("gate-magic");
    let _gate = Gate::create(&name, small(2, 2, 2)).unwrap();
    let e = shmflow::Consumer::open(&name).err().unwrap();
    assert!(matches!(e, Error::BadMagic { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("is a shmflow gate, not a shmflow channel"),
        "{e}"
    );
    let e = Producer::open_channel(&name, 2).err().unwrap();
    assert!(
        matches!(
            e,
            Error::InvalidConfig {
                field: "channel",
                ..
            }
        ),
        "{e}"
    );
    let _p = Producer::open_channel(&name, 1).unwrap();
    assert!(matches!(
        Producer::open_channel(&name, 1),
        Err(Error::AlreadyAttached { .. })
    ));
}

#[test]
fn partition_round_robin_key_and_broadcast() {
    let name = unique_name("gate-part");
    let mut gate = Gate::create(&name, small(3, 2, 2)).unwrap();
    let outs = |name: &str| {
        (0..3)
            .map(|c| Producer::open_channel(name, c).unwrap())
            .collect()
    };
    let mut rr = Partition::new(outs(&name), Partitioner::RoundRobin).unwrap();
    for i in 0..6u8 {
        rr.send(&[i]).unwrap();
    }
    rr.flush().unwrap();
    let mut got = HashMap::<usize, Vec<u8>>::new();
    for _ in 0..6 {
        match gate.recv_timeout(Duration::from_secs(5)).unwrap().unwrap() {
            GateMessage::Record { channel, record } => got
                .entry(channel)
                .or_default()
                .push(record.as_bytes().unwrap()[0]),
            _ => panic!("records only"),
        }
    }
    assert_eq!(got[&0], vec![0, 3]);
    assert_eq!(got[&1], vec![1, 4]);
    assert_eq!(got[&2], vec![2, 5]);
    let mut producers = rr.into_outputs();
    // Broadcast: every channel gets the record.
    let mut bc = Partition::new(std::mem::take(&mut producers), Partitioner::Broadcast).unwrap();
    bc.try_send(b"all").unwrap();
    bc.send(b"all2").unwrap();
    bc.flush().unwrap();
    let mut seen = [0; 3];
    for _ in 0..6 {
        if let GateMessage::Record { channel, record } =
            gate.recv_timeout(Duration::from_secs(5)).unwrap().unwrap()
        {
            let b = record.as_bytes().unwrap();
            assert!(b == b"all" || b == b"all2");
            seen[channel] += 1;
        }
    }
    assert_eq!(seen, [2, 2, 2]);
    // By key: the same key always goes to the same channel.
    let mut by_key = Partition::new(
        bc.into_outputs(),
        Partitioner::Key(Box::new(|r: &[u8]| r[0] as u64)),
    )
    .unwrap();
    for k in [5u8, 7, 5, 9, 7, 5] {
        by_key.send(&[k]).unwrap();
    }
    by_key.flush().unwrap();
    for _ in 0..6 {
        if let GateMessage::Record { channel, record } =
            gate.recv_timeout(Duration::from_secs(5)).unwrap().unwrap()
        {
            assert_eq!(record.as_bytes().unwrap()[0] as usize % 3, channel);
        }
    }
}
