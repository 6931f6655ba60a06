//! The consumer read segment by segment, for the network bridge that forwards a channel's
//! segments to a remote receiver as they are (feature `net`). Frames are validated as a
//! reader validates them, but not decoded into records: what is forwarded is the published
//! part of a segment, byte for byte, so the receiver writes it into a segment of its own at
//! the same offset.

use super::{Consumer, UncleanEnd};
use crate::endpoint::metrics::Waiting;
use crate::error::RecvError;
use crate::protocol::figures;
use crate::protocol::lane::Entry;

/// The forwarding read fails as a reader does.
type Result<T> = std::result::Result<T, RecvError>;
use crate::protocol::frame::{self, HEADER};
use crate::protocol::park::{self, Look, WaitStrategy};

/// Published frames of the segment in hand, not forwarded yet: bytes `at..end`. The
/// segment stays in hand until [`Consumer::raw_done`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Chunk {
    /// First byte (a frame boundary; 0 for the first chunk of a segment).
    pub(crate) at: usize,
    /// Just past the last frame.
    pub(crate) end: usize,
    /// The segment is finished with this chunk (read to its end, or sealed).
    pub(crate) ends_segment: bool,
    /// A spanning record is open after the chunk (taken on at `raw_done`: a chunk polled
    /// and not forwarded is walked again).
    in_span: bool,
    /// Records the chunk completes (whole frames and last parts), and their payload bytes
    /// in it: what `shmflow stat` shows as read by the bridge, as a reader would count them.
    records: u64,
    payload: u64,
}

/// What [`Consumer::raw_poll`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RawPoll {
    Chunk(Chunk),
    /// Frames are there, and a priority event waits in the lane: it goes first (take it with
    /// [`Consumer::raw_priority`], then poll again). The look at the lane comes after the
    /// frames were read with Acquire, which pairs with the producer's Release commit of them,
    /// so an event pushed before them is seen here, and a sender that forwards events first
    /// keeps each record after the events sent before it, as a local consumer (which looks
    /// at the lane before the segments) would.
    Priority,
    /// Nothing published yet.
    Empty,
    /// A segment is waiting, but the caller may not start one.
    NeedCredit,
    /// The producer detached and everything it published was handed out.
    Ended(RawEnd),
}

/// How the stream ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RawEnd {
    Clean,
    Failed,
    /// The producer died, or it was itself a bridge that lost its peer.
    Dead,
}

impl Consumer {
    /// The published frames of the segment in hand that were not handed out yet, validated.
    /// With no segment in hand, takes the next one only if `may_start` (the bridge has a
    /// credit for it).
    pub(crate) fn raw_poll(&mut self, may_start: bool) -> Result<RawPoll> {
        loop {
            let Some(c) = self.cur else {
                if self.data.ready(&self.shared.data_ring())? == 0 {
                    // Detached, then nothing in the ring: the ring is read after the state,
                    // so nothing sealed before the detach can be missed.
                    if self.producer_detached() && self.data.ready(&self.shared.data_ring())? == 0 {
                        return Ok(RawPoll::Ended(match self.producer_end() {
                            Some(UncleanEnd::Failed(_)) => RawEnd::Failed,
                            Some(UncleanEnd::Lost(_)) => RawEnd::Dead,
                            None => RawEnd::Clean,
                        }));
                    }
                    return Ok(RawPoll::Empty);
                }
                if !may_start {
                    return Ok(RawPoll::NeedCredit);
                }
                self.take_next()?;
                continue;
            };
            let seg_size = self.seg_size;
            let mut at = c.rd;
            let mut ends = false;
            let mut in_span = self.in_span;
            let (mut records, mut payload) = (0u64, 0u64);
            while at + HEADER <= seg_size {
                // Acquire: pairs with the producer's Release store of the first header of
                // what it publishes (as in `poll_frame`).
                let word = frame::load(self.shared.word(c.seg, at));
                if word == 0 {
                    break;
                }
                // The common frame first: a whole record outside a spanning one that fits
                // the segment (as `frame::check` accepts it).
                let (len, kind) = frame::decode(word);
                if kind == frame::WHOLE && !in_span && len as usize <= seg_size - at - HEADER {
                    records += 1;
                    payload += len as u64;
                    let step = frame::next_frame(at, len as usize) - at;
                    at += step;
                    // A run of records of one length: each next header is where the last
                    // one's step puts it, so its place does not wait for the load before
                    // (the loads overlap, where a walk that decodes each header to find the
                    // next is a chain of dependent loads). The same word, at a place that
                    // holds the whole frame, is the same valid frame; anything else (0
                    // included) goes to the general walk, each load still Acquire and in
                    // order.
                    while at + step <= seg_size && frame::load(self.shared.word(c.seg, at)) == word
                    {
                        records += 1;
                        payload += len as u64;
                        at += step;
                    }
                    continue;
                }
                let f = match frame::check(at, word, seg_size, in_span) {
                    Ok(f) => f,
                    Err(v) => return Err(self.corrupt(v.field, v.expected, v.found).into()),
                };
                in_span = frame::span_after(f.kind, in_span);
                match f.kind {
                    frame::WHOLE | frame::LAST => {
                        records += 1;
                        payload += f.len as u64;
                    }
                    frame::FIRST | frame::MIDDLE => payload += f.len as u64,
                    _ => {}
                }
                if f.kind == frame::SEAL {
                    at += HEADER;
                    ends = true;
                    break;
                }
                at = frame::next_frame(at, f.len);
            }
            if at + HEADER > seg_size {
                ends = true;
            }
            if at == c.rd && !ends {
                // A producer that detached in the middle of a segment (a bridge that lost its
                // own peer leaves one unsealed): once the state says so and the word is still
                // 0 (loaded again after the state's Acquire), nothing more will come.
                if self.producer_detached() && frame::load(self.shared.word(c.seg, c.rd)) == 0 {
                    self.release_current()?;
                    self.in_span = false;
                    continue;
                }
                return Ok(RawPoll::Empty);
            }
            if self.prio_pending() {
                return Ok(RawPoll::Priority);
            }
            return Ok(RawPoll::Chunk(Chunk {
                at: c.rd,
                end: at,
                ends_segment: ends,
                in_span,
                records,
                payload,
            }));
        }
    }

    /// The bytes of `chunk` (from the last [`Consumer::raw_poll`]). A hostile producer could
    /// rewrite them under us after they were checked: the receiver checks them again.
    pub(crate) fn raw_bytes(&self, chunk: &Chunk) -> &[u8] {
        self.view(chunk.at, chunk.end - chunk.at)
    }

    /// `chunk` was forwarded: moves past it, and gives the segment back if it is finished.
    pub(crate) fn raw_done(&mut self, chunk: Chunk) -> Result<()> {
        let h = self.shared.header();
        let c = &mut self.counters;
        figures::chunk_read(
            h,
            &mut c.records,
            &mut c.bytes,
            chunk.records,
            chunk.payload,
        );
        if let Some(c) = &mut self.cur {
            c.rd = chunk.end;
        }
        self.in_span = chunk.in_span;
        if chunk.ends_segment {
            self.release_current()?;
        }
        Ok(())
    }

    /// A priority event (or a barrier's announcement) waiting in the lane, taken out (the
    /// bridge forwards it at once: it overtakes the segments, as it does on one machine).
    pub(crate) fn raw_priority(&mut self) -> Result<Option<(Entry, bytes::Bytes)>> {
        if !self.prio_pending() {
            return Ok(None);
        }
        Ok(self
            .pop_priority()?
            .map(|(e, len)| (e, bytes::Bytes::copy_from_slice(&self.prio_buf[..len]))))
    }

    /// The bridge wakes the producer once per `batch` segments it gives back, and makes the
    /// wake-ups it holds before it waits ([`Consumer::raw_wake_owed`]; its own waits here do).
    pub(crate) fn raw_batch_wakes(&mut self, batch: u8) {
        self.owed = crate::endpoint::owed::Owed::new(batch);
    }

    /// Makes the wake-ups held back (see [`Consumer::raw_batch_wakes`]): before the bridge
    /// waits for its peer or the remote side, so that the producer does not sleep on segments
    /// that are free while the bridge waits.
    pub(crate) fn raw_wake_owed(&mut self) {
        if self.owed.settle() {
            self.wake_producer();
        }
    }

    /// Segments published after the one in hand (the backlog the bridge announces).
    pub(crate) fn raw_backlog(&mut self) -> Result<u64> {
        Ok(self.data.ready(&self.shared.data_ring())?)
    }

    /// Waits in the executor until [`Consumer::raw_poll`] would find something new (a frame
    /// at the read position, a segment in the data ring, a priority event), or the producer
    /// ends or dies (`Err(PeerDead)` once nothing it published is left). Unlike the reader's
    /// wait, it never moves past a frame: every frame, SEALs included, is forwarded.
    pub(crate) async fn raw_readable(&mut self) -> Result<()> {
        self.raw_wake_owed();
        let shared = self.shared.clone();
        let _idle = Waiting::start(figures::consumer_idle(shared.header()));
        self.park_async(self.wait, park::Pace::Sparse, Consumer::raw_look)
            .await
    }

    /// Waits in the executor until a priority event is pending: for a bridge that has
    /// segments to send and no credit, so that priority events still overtake them.
    pub(crate) async fn raw_priority_wait(&mut self) -> Result<()> {
        self.raw_wake_owed();
        self.park_async(WaitStrategy::Park, park::Pace::Sparse, |c, _| {
            Ok(c.prio_pending().then_some(()))
        })
        .await
    }

    /// What [`Consumer::raw_readable`] looks at.
    fn raw_look(&mut self, look: Look) -> Result<Option<()>> {
        if self.prio_pending() {
            return Ok(Some(()));
        }
        if self.raw_pending()? || self.producer_detached() {
            return Ok(Some(()));
        }
        if let Some(l) = &mut self.liveness {
            if let Err(e) = l.check(self.shared.header(), &self.shared.name, look) {
                // Forward first what it published before dying.
                return if self.raw_pending()? {
                    Ok(Some(()))
                } else {
                    Err(e.into())
                };
            }
        }
        Ok(None)
    }

    /// A frame at the read position, or a segment waiting in the data ring.
    fn raw_pending(&mut self) -> Result<bool> {
        Ok(match self.cur {
            // Acquire: as in `raw_poll` (the frame is read again there).
            Some(c) if c.rd + HEADER <= self.seg_size => {
                frame::load(self.shared.word(c.seg, c.rd)) != 0
            }
            Some(_) => true,
            None => self.data.ready(&self.shared.data_ring())? > 0,
        })
    }

    /// Publishes the sending bridge's figures for `shmflow stat`.
    pub(crate) fn raw_figures(&self, credit: u64, backlog: u64, in_flight: u64, wire: u64) {
        figures::link_sending(self.shared.header(), credit, backlog, in_flight, wire);
    }

    /// The bridge lost its remote peer: detach as `LOST`, so that the producer's calls
    /// report the consumer dead.
    pub(crate) fn raw_lose(mut self) {
        self.detach_as = crate::protocol::ends::Leave::Lost;
        drop(self);
    }
}

#[cfg(all(test, not(shmflow_loom)))]
mod tests {
    use super::*;
    use crate::endpoint::producer::Producer;
    use crate::protocol::abi::Geometry;

    /// A channel in an anonymous region, both ends here.
    fn pair(g: Geometry) -> (Producer, Consumer) {
        let (p, handle) = Producer::create_anonymous(g).unwrap();
        (p, Consumer::from_handle(handle).unwrap())
    }

    /// The published part of the segment in hand: (start, end, ends the segment, records,
    /// payload bytes), handed out.
    fn chunk(c: &mut Consumer) -> (usize, usize, bool, u64, u64) {
        match c.raw_poll(true).unwrap() {
            RawPoll::Chunk(ch) => {
                let got = (ch.at, ch.end, ch.ends_segment, ch.records, ch.payload);
                c.raw_done(ch).unwrap();
                got
            }
            other => panic!("expected a chunk, got {other:?}"),
        }
    }

    #[test]
    fn runs_of_one_length_and_the_lengths_between_them_are_walked_to_the_last_frame() {
        let (mut p, mut c) = pair(Geometry {
            segment_size: 4096,
            segment_count: 4,
        });
        // 10 × 64 B (72 B frames), one of 100 B (112), 3 × 64 B, 5 × 24 B (32).
        let lens = [[64; 10].as_slice(), &[100], &[64; 3], &[24; 5]].concat();
        for &len in &lens {
            p.send(&vec![1u8; len]).unwrap();
        }
        assert_eq!(chunk(&mut c), (0, 720 + 112 + 216 + 160, false, 19, 1052));
        // Nothing new: the walk stops at the 0 after the last frame, not at a stale word.
        assert_eq!(c.raw_poll(true).unwrap(), RawPoll::Empty);
        // One more of the first run's length, after the other lengths.
        p.send(&[2u8; 64]).unwrap();
        assert_eq!(chunk(&mut c), (1208, 1280, false, 1, 64));
    }

    #[test]
    fn a_run_that_reaches_the_segment_end_ends_the_segment_and_the_next_run_starts_at_zero() {
        let (mut p, mut c) = pair(Geometry {
            segment_size: 4096,
            segment_count: 4,
        });
        // 56 frames of 72 B fill 4032 B: the 57th does not fit, the segment is sealed.
        for _ in 0..57 {
            p.send(&[3u8; 64]).unwrap();
        }
        let (at, end, ends, records, payload) = chunk(&mut c);
        assert_eq!((at, records, payload), (0, 56, 56 * 64));
        assert!(ends, "the sealed segment is finished");
        assert!(
            end >= 4032,
            "the chunk takes the seal after the frames: {end}"
        );
        // The first segment went back: its stale frames are not walked again, and the
        // next one starts at 0 with the 57th record.
        assert_eq!(chunk(&mut c), (0, 72, false, 1, 64));
        // A second lap over the segments (stale words of the same value behind the 0).
        for _ in 0..3 * 57 {
            p.send(&[4u8; 64]).unwrap();
            while let RawPoll::Chunk(ch) = c.raw_poll(true).unwrap() {
                c.raw_done(ch).unwrap();
            }
        }
        p.send(&[5u8; 24]).unwrap();
        let (_, _, _, records, payload) = chunk(&mut c);
        assert_eq!((records, payload), (1, 24));
    }
}
