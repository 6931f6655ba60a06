use super::*;
use tokio_util::codec::Decoder;

#[test]
fn the_peers_error_codes_are_named() {
    for (wire, name) in [
        (code::UNKNOWN_CHANNEL, RemoteCode::UnknownChannel),
        (code::GEOMETRY, RemoteCode::SegmentSize),
        (code::PROTOCOL, RemoteCode::Protocol),
        (code::LOCAL, RemoteCode::LocalFailure),
        (77, RemoteCode::Other(77)),
    ] {
        assert!(matches!(
            LinkError::remote(wire, String::new()),
            LinkError::Remote { code, .. } if code == name
        ));
    }
}

fn round_trip(m: Msg) {
    let mut b = BytesMut::new();
    m.encode(&mut b);
    let got = Codec::new(1 << 16).decode(&mut b).unwrap().unwrap();
    assert_eq!(got, m);
    assert!(b.is_empty());
}

#[test]
fn every_message_round_trips() {
    round_trip(Msg::Request {
        channel: 3,
        credit: 2,
        segment_size: 4096,
        name: "words-0".into(),
    });
    round_trip(Msg::Buffer {
        channel: 1,
        backlog: 7,
        offset: 64,
        frames: Bytes::from(vec![1u8; 24]),
    });
    round_trip(Msg::AddCredit {
        channel: 9,
        credit: 4,
    });
    for how in [Closed::Clean, Closed::Failed, Closed::ProducerDead] {
        round_trip(Msg::Close { channel: 0, how });
    }
    round_trip(Msg::Cancel { channel: 5 });
    round_trip(Msg::Error {
        channel: CONNECTION,
        code: code::PROTOCOL,
        message: "bad".into(),
    });
    round_trip(Msg::Heartbeat);
    round_trip(Msg::Priority {
        channel: 2,
        kind: 11,
        payload: Bytes::from_static(b"barrier"),
    });
    round_trip(Msg::Announce {
        channel: 3,
        payload: Bytes::from(vec![7u8; 30]),
    });
}

#[test]
fn a_frame_longer_than_allowed_is_refused_before_it_is_buffered() {
    let mut b = BytesMut::new();
    b.put_u32_le(u32::MAX);
    b.put_u32_le(MAGIC);
    let err = Codec::new(4096).decode(&mut b).unwrap_err();
    assert!(
        matches!(err, LinkError::Protocol(ProtocolError::FrameLength { .. })),
        "{err}"
    );
    assert!(b.capacity() < 1 << 20);
}

#[test]
fn wrong_magic_version_and_kind_are_refused() {
    let mut good = BytesMut::new();
    Msg::Heartbeat.encode(&mut good);
    for (at, value, want) in [
        (4usize, 0x11u8, "magic"),
        (8, 9, "version"),
        (9, 99, "kind"),
    ] {
        let mut b = good.clone();
        b[at] = value;
        let err = Codec::new(0).decode(&mut b).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
    }
}

/// A whole record's frame of `len` zero bytes, padded to its end.
fn whole(len: u32) -> Vec<u8> {
    let mut v = frame::encode(len, frame::WHOLE).to_le_bytes().to_vec();
    v.resize(frame::next_frame(0, len as usize), 0);
    v
}

#[test]
fn frames_are_checked_against_the_segment() {
    let seg = 4096;
    let mut span = false;
    let one = check_frames(0, &whole(5), seg, &mut span).unwrap();
    assert!(!one.ends);
    assert_eq!(
        one.tally,
        frame::Tally {
            records: 1,
            payload: 5
        }
    );
    let mut sealed = whole(5);
    sealed.extend_from_slice(&whole(9));
    sealed.extend_from_slice(&frame::encode(0, frame::SEAL).to_le_bytes());
    let two = check_frames(0, &sealed, seg, &mut span).unwrap();
    assert!(two.ends);
    assert_eq!(two.tally.records, 2);
    assert_eq!(two.tally.payload, 14);
    // A length past the segment, a frame past the buffer, garbage, misalignment.
    assert!(check_frames(0, &whole(5000)[..8], seg, &mut span).is_err());
    assert!(check_frames(0, &whole(64)[..16], seg, &mut span).is_err());
    assert!(check_frames(0, &[0xAB; 16], seg, &mut span).is_err());
    assert!(check_frames(4, &whole(0), seg, &mut span).is_err());
    assert!(check_frames(seg - 8, &whole(8), seg, &mut span).is_err());
    assert!(check_frames(0, &[], seg, &mut span).is_err());
    assert!(check_frames(0, &whole(5)[..12], seg, &mut span).is_err());
    let mut partial = whole(5);
    partial.extend_from_slice(&[1, 2, 3, 4]);
    assert!(check_frames(0, &partial, seg, &mut span).is_err());
}

#[test]
fn runs_of_one_frame_length_are_checked_and_counted_frame_by_frame() {
    let seg = 4096;
    let run = |len: u32, n: usize| whole(len).repeat(n);
    let mut span = false;
    // Runs, a run cut by another length, a run of one.
    let b = [run(64, 10), run(100, 1), run(64, 3), run(24, 5)].concat();
    let f = check_frames(0, &b, seg, &mut span).unwrap();
    assert_eq!(
        (f.ends, f.tally.records, f.tally.payload),
        (false, 19, 1052)
    );
    // A run to the segment's last byte ends it.
    let f = check_frames(0, &run(56, 64), seg, &mut span).unwrap();
    assert_eq!((f.ends, f.tally.records), (true, 64));
    // A run whose last frame is cut by the buffer's end, or whose next word is garbage
    // (a length past the segment, a kind that does not exist), is refused.
    let cut = run(64, 10);
    assert!(check_frames(0, &cut[..cut.len() - 8], seg, &mut span).is_err());
    for bad in [frame::encode(5000, frame::WHOLE), 0xFFFF_FFFF_0000_0040] {
        let mut b = run(64, 4);
        b[3 * 72..3 * 72 + 8].copy_from_slice(&bad.to_le_bytes());
        assert!(check_frames(0, &b, seg, &mut span).is_err(), "{bad:#x}");
    }
    assert!(!span);
}

#[test]
fn frames_are_counted_as_they_are_checked_across_spanning_parts() {
    let seg = 4096;
    let frame = |kind: u32, len: usize| {
        let mut v = frame::encode(len as u32, kind).to_le_bytes().to_vec();
        v.resize(frame::next_frame(0, len), 0);
        v
    };
    let tally = |records, payload| frame::Tally { records, payload };
    // A whole record, an event, and the first part of a record that runs to the
    // segment's end.
    let mut first = frame(frame::WHOLE, 5);
    first.extend_from_slice(&frame(frame::EVENT, 8));
    first.extend_from_slice(&frame(frame::FIRST, seg - 32 - 8));
    let mut span = false;
    let f = check_frames(0, &first, seg, &mut span).unwrap();
    assert_eq!((f.ends, span, f.tally), (true, true, tally(1, 5 + 4056)));
    // A middle part fills the next segment; the last part ends the record, and a whole
    // one follows; an aborted record counts its parts' bytes and no record.
    let f = check_frames(0, &frame(frame::MIDDLE, seg - 8), seg, &mut span).unwrap();
    assert_eq!((f.ends, span, f.tally), (true, true, tally(0, 4088)));
    let mut last = frame(frame::LAST, 10);
    last.extend_from_slice(&frame(frame::WHOLE, 3));
    // (A `FIRST` part that does not run to the segment's end is refused.)
    let mut short_first = last.clone();
    short_first.extend_from_slice(&frame(frame::FIRST, 100));
    assert!(check_frames(0, &short_first, seg, &mut span.clone()).is_err());
    let f = check_frames(0, &last, seg, &mut span).unwrap();
    assert_eq!((f.ends, span, f.tally), (false, false, tally(2, 13)));
    let mut aborted = frame(frame::FIRST, seg - 8);
    let f = check_frames(0, &aborted, seg, &mut span).unwrap();
    assert_eq!((span, f.tally), (true, tally(0, 4088)));
    aborted = frame(frame::ABORT, 0);
    let f = check_frames(0, &aborted, seg, &mut span).unwrap();
    assert_eq!((span, f.tally), (false, tally(0, 0)));
}
