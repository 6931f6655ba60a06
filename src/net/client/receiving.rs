//! One imported channel's receiving state machine, apart from the socket and the runtime: it
//! checks each buffer that arrives (frames, credit, place in its segment), writes it into the
//! local producer's segments, asks the gate for floating segments as the sender's backlog
//! needs, and holds what arrives behind a priority event that finds the lane full, in order,
//! until the event goes in. What it writes into is a [`Segments`], so that it can be driven
//! here, in unit tests, without a region or a connection.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use crate::endpoint::producer::raw::Refused;
use crate::endpoint::producer::Producer;
use crate::error::{Halt, NotNow, SendError};
use crate::net::error::{LinkError, ProtocolError};
use crate::net::link::Held;
use crate::net::wire::{self, Closed, Frames};
pub(crate) use crate::protocol::lane::Entry;

/// What the machine writes into: the local producer's raw operations.
pub(crate) trait Segments {
    /// Writes checked frames at `offset` of the segment in hand (`offset == 0`: a fresh one);
    /// `checked` is what the check found in them.
    fn write(
        &mut self,
        offset: usize,
        frames: &[u8],
        checked: Frames,
    ) -> Result<Result<(), Refused>, SendError>;
    /// Free segments: what may be announced as credit (0 if the region cannot say).
    fn free(&mut self) -> u64;
    /// Segments taken and not given back yet: what the consumer has in hand or still to read.
    fn unread(&self) -> u64;
    /// Segments the consumer's buffer-debloating cap lets be taken now (`u64::MAX`: no cap).
    fn cap_room(&self) -> u64 {
        u64::MAX
    }
    /// Floating segments asked for and not granted yet.
    fn unmet(&self) -> u64;
    /// Asks the gate for `n` more floating segments.
    fn ask(&mut self, n: u64);
    /// Puts a priority event in the lane if it has room.
    fn try_priority(&mut self, entry: Entry, payload: &[u8])
        -> Result<(), Halt<NotNow, SendError>>;
}

impl Segments for Held<Producer> {
    fn write(
        &mut self,
        offset: usize,
        frames: &[u8],
        checked: Frames,
    ) -> Result<Result<(), Refused>, SendError> {
        self.raw_write(offset, frames, checked.ends, checked.tally)
    }

    fn free(&mut self) -> u64 {
        self.raw_free().unwrap_or(0)
    }

    fn unread(&self) -> u64 {
        self.raw_unread()
    }

    fn cap_room(&self) -> u64 {
        Producer::cap_room(self)
    }

    fn unmet(&self) -> u64 {
        self.raw_unmet()
    }

    fn ask(&mut self, n: u64) {
        self.raw_ask(n)
    }

    fn try_priority(
        &mut self,
        entry: Entry,
        payload: &[u8],
    ) -> Result<(), Halt<NotNow, SendError>> {
        self.priority_inner(entry, payload, crate::protocol::park::Immediately)
    }
}

/// A message of one channel, as the connection's reader takes it.
pub(crate) enum In {
    Buffer {
        backlog: u32,
        offset: u32,
        frames: Bytes,
    },
    Priority {
        entry: Entry,
        payload: Bytes,
    },
    Close(Closed),
    Error {
        code: u32,
        message: String,
    },
}

/// The credit a receiving channel has announced and the sender has not spent yet, and the
/// state of the frames received.
#[derive(Clone, Copy)]
pub(crate) struct Credit {
    pub(crate) announced: u64,
    pub(crate) started: u64,
}

impl Credit {
    pub(crate) fn outstanding(&self) -> u64 {
        self.announced - self.started
    }

    /// Credit to announce now, of `free` segments free in a channel of `segments` whose
    /// local consumer has `unread` segments in hand or still to read: every free segment the
    /// sender has no credit for, or 0 while a message for them would cost more than it
    /// brings. Announcements wait for a batch of a quarter of the pool (at least one segment)
    /// as long as the sender holds at least half the pool in credit (it has that much to send
    /// before it runs short), or the consumer has at least half the pool to read (it is the
    /// stream's pace then, and has more to read than the batch takes to arrive). Either way the
    /// stream does not slow for it, and a stream of small segments costs one credit message
    /// (and one wake of the sender) per several segments, not one each. Small pools (fewer
    /// than 8 segments, whose quarter is under 2) are announced segment by segment; so are the
    /// free segments of a consumer held to a buffer-debloating cap under half the pool (it has
    /// no more than the cap to read), unless its sender holds half the pool.
    pub(crate) fn due(&self, free: u64, unread: u64, segments: u64) -> u64 {
        let out = self.outstanding();
        let add = free.saturating_sub(out);
        let short = out * 2 < segments && unread * 2 < segments;
        if add >= batch(segments) || (add > 0 && short) {
            add
        } else {
            0
        }
    }
}

/// The batch credit waits for while the consumer has the pool to read: a quarter of it.
fn batch(segments: u64) -> u64 {
    (segments / 4).max(1)
}

/// Priority events that may wait for room in one channel's lane. Priority events are outside
/// credit: a channel whose consumer takes none while its sender keeps sending them is ended
/// when this many wait, so that they cannot pile up without bound.
pub(crate) const PRIORITY_WAITING: usize = 256;

/// One channel's state between messages.
pub(crate) struct Receiving<S> {
    pub(crate) p: S,
    pub(crate) id: u32,
    pub(crate) seg_size: usize,
    pub(crate) segments: u64,
    pub(crate) credit: Credit,
    /// Inside a record that spans segments (for the frame check).
    pub(crate) in_span: bool,
    /// Where the segment being received continues: `None` when the next buffer must start
    /// one (offset 0, with credit).
    pub(crate) cont: Option<usize>,
    pub(crate) backlog: u64,
    pub(crate) wire: u64,
    /// What arrived while a priority event waits for room in the lane, in order (the front is
    /// that event). Its buffers were checked as they arrived, within credit, and the parts of
    /// one segment are joined into one entry, so it holds at most the credited segments'
    /// bytes in at most one entry per segment, plus at most `PRIORITY_WAITING` priority
    /// events.
    pub(crate) held: VecDeque<Waiting>,
    pub(crate) held_priority: usize,
}

/// A message held behind a priority event.
pub(crate) enum Waiting {
    /// A buffer, checked (`checked`: what the check found, whether it ends its segment), or
    /// several that continue each other joined.
    Buffer {
        backlog: u32,
        offset: usize,
        frames: BytesMut,
        checked: Frames,
    },
    Priority {
        entry: Entry,
        payload: Bytes,
    },
    /// The channel's end.
    Last(Last),
}

/// The sender's end of a channel: `Close` or `Error`.
#[derive(Debug)]
pub(crate) enum Last {
    Close(Closed),
    Error { code: u32, message: String },
}

/// Why a channel ends.
#[derive(Debug)]
pub(crate) enum Stop {
    /// The sender's `Close` or `Error`.
    Sender(Last),
    /// The local consumer left or broke.
    Consumer(SendError),
    /// The sender broke the protocol: the channel and the connection fail.
    Broken(LinkError),
    /// The consumer takes no priority events (see `PRIORITY_WAITING`).
    PriorityUnread,
}

impl<S: Segments> Receiving<S> {
    /// A channel that writes into `p` (segments of `seg_size` bytes, `segments` of them),
    /// its sender given `credit` segments of credit with the request.
    pub(crate) fn new(p: S, id: u32, seg_size: usize, segments: u64, credit: u64) -> Self {
        Receiving {
            p,
            id,
            seg_size,
            segments,
            credit: Credit {
                announced: credit,
                started: 0,
            },
            in_span: false,
            cont: None,
            backlog: 0,
            wire: 0,
            held: VecDeque::new(),
            held_priority: 0,
        }
    }

    /// Checks a buffer as it arrives (frames, credit, place in the segment), before it is
    /// written or held: what the check found.
    pub(crate) fn admit(&mut self, offset: usize, frames: &[u8]) -> Result<Frames, Stop> {
        let checked = wire::check_frames(offset, frames, self.seg_size, &mut self.in_span)
            .map_err(|e| Stop::Broken(e.into()))?;
        self.place(offset, frames.len(), checked.ends)?;
        Ok(checked)
    }

    /// Admits `len` bytes of checked frames at `offset` (`ends`: they end their segment):
    /// spends a credit for a new segment, or checks that they continue the segment being
    /// received.
    pub(crate) fn place(&mut self, offset: usize, len: usize, ends: bool) -> Result<(), Stop> {
        let id = self.id;
        if offset == 0 && self.cont.is_none() {
            if self.credit.outstanding() == 0 {
                return Err(Stop::Broken(
                    ProtocolError::Credit {
                        channel: id,
                        detail: "a segment sent without credit".into(),
                    }
                    .into(),
                ));
            }
            self.credit.started += 1;
        } else if self.cont != Some(offset) {
            return Err(misplaced(id, offset, self.cont.unwrap_or(0)));
        }
        self.cont = (!ends).then_some(offset + len);
        Ok(())
    }

    /// Writes an admitted buffer into the producer's segment; asks the gate for floating
    /// segments as the backlog needs.
    pub(crate) fn write(
        &mut self,
        backlog: u32,
        offset: usize,
        frames: &[u8],
        checked: Frames,
    ) -> Result<(), Stop> {
        match self.p.write(offset, frames, checked) {
            Ok(Ok(())) => {}
            Ok(Err(r)) => return Err(self.refused(r)),
            Err(e) => return Err(Stop::Consumer(e)),
        }
        self.wrote(backlog, frames.len());
        Ok(())
    }

    /// Why the producer refused a buffer: the sender broke the protocol.
    pub(crate) fn refused(&self, r: Refused) -> Stop {
        let id = self.id;
        match r {
            Refused::NoCredit => Stop::Broken(
                ProtocolError::Credit {
                    channel: id,
                    detail: "a segment sent without a free segment to take it".into(),
                }
                .into(),
            ),
            Refused::Misplaced { expected, found } => misplaced(id, found, expected),
            Refused::Shape => Stop::Broken(
                ProtocolError::Channel {
                    channel: id,
                    detail: "a buffer that does not fit the segment".into(),
                }
                .into(),
            ),
        }
    }

    /// After `len` bytes were written: the sender's backlog, and the floating segments it
    /// needs.
    pub(crate) fn wrote(&mut self, backlog: u32, len: usize) {
        self.backlog = (backlog as u64).min(self.segments);
        self.wire += len as u64;
        // Flink's floating buffers: ask the gate for what the backlog needs beyond the credit
        // the sender has or is about to get, and no more than the consumer's cap lets in.
        let free = self.p.free();
        let short = self.backlog.min(self.p.cap_room()).saturating_sub(free);
        let unmet = self.p.unmet();
        if short > unmet {
            self.p.ask(short - unmet);
        }
    }

    /// Puts a priority event in the lane if there is room and nothing waits before it, else
    /// holds it.
    pub(crate) fn priority(&mut self, entry: Entry, payload: &[u8]) -> Result<(), Stop> {
        if self.held.is_empty() {
            match self.p.try_priority(entry, payload) {
                Ok(()) => return Ok(()),
                Err(Halt::Expired(NotNow)) => {}
                Err(Halt::Failed(e)) => return Err(Stop::Consumer(e)),
            }
        }
        self.held_priority += 1;
        if self.held_priority > PRIORITY_WAITING {
            return Err(Stop::PriorityUnread);
        }
        // Copied: a slice of the connection's read buffer would keep the whole buffer alive.
        self.held.push_back(Waiting::Priority {
            entry,
            payload: Bytes::copy_from_slice(payload),
        });
        Ok(())
    }

    /// Handles one message that arrived: written or put in the lane, or held if a priority
    /// event waits (see `held`).
    pub(crate) fn take(&mut self, input: In) -> Result<(), Stop> {
        match input {
            In::Buffer {
                backlog,
                offset,
                frames,
            } => self.take_buffer(backlog, offset, &frames),
            In::Priority { entry, payload } => self.priority(entry, &payload),
            In::Close(how) => self.last(Last::Close(how)),
            In::Error { code, message } => self.last(Last::Error { code, message }),
        }
    }

    /// Handles a buffer that arrived: written, or held (copied) behind a priority event.
    pub(crate) fn take_buffer(
        &mut self,
        backlog: u32,
        offset: u32,
        frames: &[u8],
    ) -> Result<(), Stop> {
        let offset = offset as usize;
        let checked = self.admit(offset, frames)?;
        if self.held.is_empty() {
            return self.write(backlog, offset, frames, checked);
        }
        // Copied (a slice of the connection's read buffer would keep the whole buffer
        // alive), onto the held part of the same segment if it continues it.
        if let Some(Waiting::Buffer {
            backlog: b,
            offset: at,
            frames: f,
            checked: c,
        }) = self.held.back_mut()
        {
            if !c.ends && *at + f.len() == offset {
                f.extend_from_slice(frames);
                *b = backlog;
                c.ends = checked.ends;
                c.tally.merge(checked.tally);
                return Ok(());
            }
        }
        self.held.push_back(Waiting::Buffer {
            backlog,
            offset,
            frames: BytesMut::from(frames),
            checked,
        });
        Ok(())
    }

    /// The sender ended the channel: now, or after what is held.
    pub(crate) fn last(&mut self, last: Last) -> Result<(), Stop> {
        if self.held.is_empty() {
            return Err(Stop::Sender(last));
        }
        self.held.push_back(Waiting::Last(last));
        Ok(())
    }

    /// The front priority event went into the lane: what was held behind it goes now, up to
    /// the next priority event that finds no room (it stays at the front).
    pub(crate) fn release(&mut self) -> Result<(), Stop> {
        self.held.pop_front();
        self.held_priority -= 1;
        loop {
            if let Some(Waiting::Priority { entry, payload }) = self.held.front() {
                match self.p.try_priority(*entry, payload) {
                    Ok(()) => {}
                    Err(Halt::Expired(NotNow)) => return Ok(()),
                    Err(Halt::Failed(e)) => return Err(Stop::Consumer(e)),
                }
            }
            match self.held.pop_front() {
                None => return Ok(()),
                Some(Waiting::Priority { .. }) => self.held_priority -= 1,
                Some(Waiting::Buffer {
                    backlog,
                    offset,
                    frames,
                    checked,
                }) => self.write(backlog, offset, &frames, checked)?,
                Some(Waiting::Last(last)) => return Err(Stop::Sender(last)),
            }
        }
    }
}

/// A buffer that does not start where the channel's segment continues.
pub(crate) fn misplaced(channel: u32, found: usize, expected: usize) -> Stop {
    Stop::Broken(
        ProtocolError::Channel {
            channel,
            detail: format!(
                "a buffer at offset {found}, where the segment continues at {expected}"
            ),
        }
        .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::frame;

    const SEG: usize = 4096;

    #[test]
    fn credit_is_announced_in_batches_while_the_sender_holds_or_the_consumer_has_half_the_pool() {
        // 64 segments, 5 announced and unspent, the consumer has 59 to read.
        let c = Credit {
            announced: 100,
            started: 95,
        };
        let out = c.outstanding();
        assert_eq!(out, 5);
        // 1 to 15 segments given back wait for a batch of a quarter of the pool...
        for add in 1..16 {
            assert_eq!(c.due(out + add, 59 - add, 64), 0, "{add} free");
        }
        assert_eq!(c.due(out + 16, 59 - 16, 64), 16);
        // ...unless the consumer has less than half the pool to read: then at once.
        assert_eq!(c.due(out + 1, 31, 64), 1);
        let low = Credit {
            announced: 100,
            started: 70,
        };
        assert_eq!(low.outstanding(), 30);
        assert_eq!(low.due(31, 33, 64), 0);
        assert_eq!(low.due(33, 31, 64), 3);
        // A sender that holds half the pool gets batches, however little the consumer has
        // to read.
        let rich = Credit {
            announced: 100,
            started: 60,
        };
        assert_eq!(rich.due(50, 14, 64), 0);
        assert_eq!(rich.due(56, 8, 64), 16);
        // Under a buffer-debloating cap of 2 segments: each at once, unless the sender
        // holds half the pool.
        assert_eq!(c.due(out + 1, 1, 64), 1);
        assert_eq!(rich.due(41, 2, 64), 0);
        // Nothing free beyond the credit: nothing to say.
        assert_eq!(c.due(out, 0, 64), 0);
        assert_eq!(c.due(0, 0, 64), 0);
        // Pools of fewer than 8 segments: segment by segment.
        let small = Credit {
            announced: 3,
            started: 2,
        };
        assert_eq!(small.due(2, 1, 3), 1);
    }

    /// A producer's segments without a region: `free` segments for credit, a lane of `room`
    /// priority events, and what was written, in order.
    #[derive(Default)]
    struct Fake {
        free: u64,
        unmet: u64,
        asked: u64,
        room: usize,
        lane: Vec<u32>,
        written: Vec<(usize, usize, bool)>,
        /// Everything that reached the consumer, in order: `b` a buffer, `p` a priority event.
        order: Vec<char>,
    }

    impl Segments for Fake {
        fn write(
            &mut self,
            offset: usize,
            frames: &[u8],
            checked: Frames,
        ) -> Result<Result<(), Refused>, SendError> {
            if offset == 0 {
                if self.free == 0 {
                    return Ok(Err(Refused::NoCredit));
                }
                self.free -= 1;
            }
            self.written.push((offset, frames.len(), checked.ends));
            self.order.push('b');
            Ok(Ok(()))
        }
        fn free(&mut self) -> u64 {
            self.free
        }
        fn unread(&self) -> u64 {
            0
        }
        fn unmet(&self) -> u64 {
            self.unmet
        }
        fn ask(&mut self, n: u64) {
            self.asked += n;
            self.unmet += n;
        }
        fn try_priority(
            &mut self,
            entry: Entry,
            _payload: &[u8],
        ) -> Result<(), Halt<NotNow, SendError>> {
            let kind = entry.kind;
            if self.lane.len() >= self.room {
                return Err(Halt::Expired(NotNow));
            }
            self.lane.push(kind);
            self.order.push('p');
            Ok(())
        }
    }

    fn machine(credit: u64, fake: Fake) -> Receiving<Fake> {
        Receiving::new(fake, 3, SEG, 8, credit)
    }

    /// One whole record of `len` bytes, with a SEAL after it if `seal`.
    fn frames(len: u32, seal: bool) -> Bytes {
        let mut v = frame::encode(len, frame::WHOLE).to_le_bytes().to_vec();
        v.resize(frame::next_frame(0, len as usize), 0);
        if seal {
            v.extend_from_slice(&frame::encode(0, frame::SEAL).to_le_bytes());
        }
        Bytes::from(v)
    }

    fn buffer(backlog: u32, offset: u32, frames: Bytes) -> In {
        In::Buffer {
            backlog,
            offset,
            frames,
        }
    }

    fn broken(r: Result<(), Stop>) -> String {
        match r {
            Err(Stop::Broken(e)) => e.to_string(),
            Err(_) => panic!("stopped, but not as broken"),
            Ok(()) => panic!("accepted"),
        }
    }

    #[test]
    fn a_segment_needs_credit_and_its_parts_continue_it() {
        let mut m = machine(
            1,
            Fake {
                free: 4,
                ..Fake::default()
            },
        );
        let first = frames(8, false);
        let n = first.len();
        m.take(buffer(0, 0, first)).unwrap();
        assert_eq!((m.credit.started, m.cont), (1, Some(n)));
        // The rest of the segment, where it continues: no new credit spent.
        m.take(buffer(0, n as u32, frames(8, true))).unwrap();
        assert_eq!((m.credit.started, m.cont), (1, None));
        assert_eq!(m.p.written, [(0, n, false), (n, n + 8, true)]);
        assert_eq!(m.wire, (2 * n + 8) as u64);
        // A new segment, but the one credit is spent.
        let e = broken(m.take(buffer(0, 0, frames(8, true))));
        assert!(e.contains("without credit"), "{e}");
    }

    #[test]
    fn a_part_out_of_place_or_out_of_shape_breaks_the_channel() {
        let mut m = machine(
            2,
            Fake {
                free: 4,
                ..Fake::default()
            },
        );
        // Continuing a segment that was never started.
        let e = broken(m.take(buffer(0, 64, frames(8, false))));
        assert!(
            e.contains("offset 64") && e.contains("continues at 0"),
            "{e}"
        );
        let mut m = machine(
            2,
            Fake {
                free: 4,
                ..Fake::default()
            },
        );
        m.take(buffer(0, 0, frames(8, false))).unwrap();
        // A gap after the first part.
        let e = broken(m.take(buffer(0, 100, frames(8, false))));
        assert!(e.contains("offset 100"), "{e}");
        // Garbage instead of frames.
        let mut m = machine(
            2,
            Fake {
                free: 4,
                ..Fake::default()
            },
        );
        assert!(matches!(
            m.take(buffer(0, 0, Bytes::from_static(&[0xAB; 16]))),
            Err(Stop::Broken(_))
        ));
        assert!(
            m.p.written.is_empty(),
            "nothing of a broken buffer is written"
        );
    }

    #[test]
    fn the_backlog_asks_for_floating_segments_once() {
        let mut m = machine(
            4,
            Fake {
                free: 2,
                ..Fake::default()
            },
        );
        m.take(buffer(5, 0, frames(8, true))).unwrap();
        // Backlog 5 against 1 free segment left: 4 asked for.
        assert_eq!((m.backlog, m.p.asked), (5, 4));
        m.take(buffer(5, 0, frames(8, true))).unwrap();
        // Still 4 unmet: the next buffer asks only for what the backlog needs beyond them
        // (5 short, no segment free).
        assert_eq!(m.p.asked, 5);
        // A backlog larger than the pool counts as the pool.
        m.p.free = 1;
        m.take(buffer(u32::MAX, 0, frames(8, true))).unwrap();
        assert_eq!(m.backlog, 8);
    }

    #[test]
    fn what_follows_a_waiting_priority_event_is_held_in_order() {
        let mut m = machine(
            4,
            Fake {
                free: 4,
                room: 1,
                ..Fake::default()
            },
        );
        m.take(In::Priority {
            entry: Entry::event(1),
            payload: Bytes::new(),
        })
        .unwrap();
        assert_eq!(m.p.lane, [1], "room for one: it goes in at once");
        // The lane is full: the next event waits, and the buffers after it wait behind it.
        m.take(In::Priority {
            entry: Entry::event(2),
            payload: Bytes::new(),
        })
        .unwrap();
        let a = frames(8, false);
        let n = a.len();
        m.take(buffer(0, 0, a)).unwrap();
        m.take(buffer(0, n as u32, frames(8, true))).unwrap();
        m.take(In::Close(Closed::Clean)).unwrap();
        assert!(m.p.written.is_empty());
        // Two parts of one segment were joined into one held entry.
        assert_eq!(m.held.len(), 3, "the event, one joined buffer, the close");
        // The consumer takes event 1; event 2 goes in, then the buffer, then the end.
        m.p.lane.clear();
        match m.release() {
            Err(Stop::Sender(Last::Close(Closed::Clean))) => {}
            _ => panic!("the close comes last"),
        }
        assert_eq!(m.p.order, ['p', 'b'], "event 1 first, then the held buffer");
        assert_eq!(m.p.written, [(0, 2 * n + 8, true)]);
    }

    #[test]
    fn release_stops_at_the_next_event_that_finds_no_room() {
        let mut m = machine(
            4,
            Fake {
                free: 4,
                room: 0,
                ..Fake::default()
            },
        );
        m.held.push_back(Waiting::Priority {
            entry: Entry::event(1),
            payload: Bytes::new(),
        });
        m.held_priority = 1;
        m.take(buffer(0, 0, frames(8, true))).unwrap();
        m.take(In::Priority {
            entry: Entry::event(2),
            payload: Bytes::new(),
        })
        .unwrap();
        m.take(buffer(0, 0, frames(8, true))).unwrap();
        // Event 1 went in by the async path; event 2 still finds no room.
        m.release().unwrap();
        assert_eq!(m.p.written.len(), 1, "only the buffer before event 2");
        assert_eq!(m.held.len(), 2);
        assert!(matches!(
            m.held.front(),
            Some(Waiting::Priority {
                entry: Entry { kind: 2, .. },
                ..
            })
        ));
        m.p.room = 1;
        m.release().unwrap();
        assert_eq!(m.p.written.len(), 2);
        assert!(m.held.is_empty() && m.held_priority == 0);
    }

    #[test]
    fn priority_events_that_are_never_taken_end_the_channel() {
        let mut m = machine(
            4,
            Fake {
                room: 0,
                ..Fake::default()
            },
        );
        for k in 0..PRIORITY_WAITING as u32 {
            m.take(In::Priority {
                entry: Entry::event(k),
                payload: Bytes::new(),
            })
            .unwrap();
        }
        assert!(matches!(
            m.take(In::Priority {
                entry: Entry::event(0),
                payload: Bytes::new()
            }),
            Err(Stop::PriorityUnread)
        ));
    }

    #[test]
    fn the_senders_end_comes_at_once_when_nothing_waits() {
        let mut m = machine(1, Fake::default());
        assert!(matches!(
            m.take(In::Error {
                code: 7,
                message: "gone".into()
            }),
            Err(Stop::Sender(Last::Error { code: 7, .. }))
        ));
    }
}
