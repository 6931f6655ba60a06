//! What a gate asks of the consumer of each of its channels: to look without reading
//! ([`Consumer::ready`]), to take one message now, to lend and take back floating segments,
//! to report its backlog, and to be abandoned when its producer dies.

use super::{Consumer, Message, Record};
use crate::error::{CorruptError, Halt, Lost, RecvError};
use crate::protocol::figures;
use crate::protocol::park::{self, Immediately, Look};

use super::Got;
use crate::region::os::Host;

impl Consumer {
    /// Gates: the channel's lending state (`None` for a channel of its own).
    pub(crate) fn lending(&mut self) -> Option<&mut crate::protocol::pool::Lending> {
        self.recycler.lending()
    }

    /// Gates: segments this channel's producer asked for and was not given.
    pub(crate) fn backlog(&mut self) -> u64 {
        let h = self.shared.header();
        self.recycler.lending().map_or(0, |l| l.backlog(h))
    }

    /// Gates: hands a floating segment to this channel's producer (through its return ring).
    pub(crate) fn grant(&mut self, seg: u32) -> Result<(), Box<CorruptError>> {
        self.give(seg)?;
        let h = self.shared.header();
        if let Some(l) = self.recycler.lending() {
            l.grant(h, seg);
        }
        Ok(())
    }

    /// Gates, the fast path: the next record, when what comes next is a whole one committed
    /// in the segment in hand and no priority event waits (not in a span, not skipping): its
    /// length and place, counted as read. Take it with [`Consumer::record_at`]. `None`
    /// leaves the channel as it was.
    #[inline]
    pub(crate) fn whole_now(&mut self) -> Option<(usize, *const u8)> {
        let (len, ptr) = self.fast_whole()?;
        // SYNC POINT (as in `message_inner`): the lane is looked at after the header's
        // Acquire load in `fast_whole`, which pairs with the producer's Release commit of the
        // frame; a priority event pushed before the frame is seen here and goes first.
        #[cfg(not(shmflow_broken = "gate_fast_ignores_lane"))]
        if self.prio_pending() {
            self.unread_whole(len);
            return None;
        }
        self.count_record(len as u64);
        Some((len, ptr))
    }

    /// Gates: the record [`Consumer::whole_now`] returned, borrowing this end as a record
    /// does.
    ///
    /// # Safety
    /// `len` and `ptr` are what the last `whole_now` of this end returned, with nothing read
    /// or released since (the segment is still in hand, the bytes within it).
    #[inline]
    pub(crate) unsafe fn record_at(&mut self, len: usize, ptr: *const u8) -> Record<'_> {
        Record::single(self, ptr, len)
    }

    /// Gates: the next message without waiting.
    pub(crate) fn message_now(&mut self) -> Got<Option<Message<'_>>, Immediately> {
        self.message_inner(Immediately)
    }

    /// Gates: records and payload bytes its producer has published beyond what this end has
    /// read (this end's counts published first; the producer's are as it last published
    /// them, at most `COUNTS_EVERY` records or a segment behind).
    pub(crate) fn unread(&mut self) -> (u64, u64) {
        self.publish_counts();
        figures::read_unread(self.shared.header())
    }

    /// Gates: `records` records of `bytes` payload bytes were handed out as in-flight data.
    pub(crate) fn count_inflight(&self, records: u64, bytes: u64) {
        figures::channel_inflight(self.shared.header(), records, bytes);
    }

    /// Gates: what the last released checkpoint held back on this channel, how long it held
    /// it, and its barrier's delay on this channel.
    pub(crate) fn set_held(&self, records: u64, bytes: u64, held_ns: u64, delay_ns: u64) {
        figures::channel_held(self.shared.header(), records, bytes, held_ns, delay_ns);
    }

    /// Gates: is a priority event (or a barrier's announcement) waiting in the lane? For a
    /// channel held by an alignment, whose records are not read.
    pub(crate) fn prio_waiting(&self) -> bool {
        self.prio_pending()
    }

    /// Gates: is there something to read on this channel, without reading it?
    /// `Message` means a `try_recv_message` now returns a message, the end, or an error —
    /// never "nothing yet".
    pub(crate) fn ready(&mut self) -> Result<Ready, RecvError> {
        if self.prio_pending() {
            return Ok(Ready::Message);
        }
        if self.skipping {
            match self.skip_rest(Immediately) {
                // A producer that died in the middle of the record being skipped: the gate
                // learns of the death through its own look and reports `ChannelDead`.
                Err(Halt::Expired(_)) | Err(Halt::Failed(RecvError::PeerDead(_))) => {
                    return Ok(Ready::Empty)
                }
                Err(Halt::Failed(e)) => return Err(e),
                Ok(()) => {}
            }
        }
        if self.poll_frame()?.is_some() {
            return Ok(Ready::Message);
        }
        if self.producer_detached() {
            // Everything sealed before the detach is visible now: look once more.
            return Ok(if self.poll_frame()?.is_some() {
                Ready::Message
            } else {
                Ready::Ended
            });
        }
        Ok(Ready::Empty)
    }

    /// This end's creator made its producer's handle (`create_anonymous`): a producer that
    /// never attached is gone once every descriptor of the handle is closed.
    pub(crate) fn expect_handle(&mut self) {
        if let Some(l) = &mut self.liveness {
            l.expect_handle();
        }
    }

    /// Gates: `Err(PeerDead)` if this channel's producer died (a syscall).
    pub(crate) fn check_producer(&mut self) -> Result<(), Lost> {
        match &mut self.liveness {
            Some(l) => l.check(self.shared.header(), &self.shared.name, Look::Now),
            None => Ok(()),
        }
    }

    /// Gates: the channel is closed; forget the segment in hand. `reclaim` (the producer is
    /// gone): every floating segment the channel holds goes back to the gate. Otherwise the
    /// producer may still write them: they are left out, and this end detaches so that the
    /// producer's next call fails.
    pub(crate) fn abandon(&mut self, reclaim: bool) {
        self.cur = None;
        self.in_span = false;
        self.skipping = false;
        let h = self.shared.header();
        if reclaim {
            self.recycler.reclaim_all(h);
        } else {
            self.recycler.forget_all(h);
            // Our last reads of the region happen before the producer sees us gone.
            h.consumer_end().leave(crate::protocol::ends::Leave::Clean);
            park::notify::<Host>(h.producer_park(), self.shared.producer_bell());
        }
    }
}

/// What a gate sees when it looks at one of its channels without reading.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ready {
    /// A message (or an error to report) is there.
    Message,
    /// Nothing yet.
    Empty,
    /// The producer detached and everything it committed has been read.
    Ended,
}
