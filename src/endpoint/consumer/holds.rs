//! Segments kept out of the pool after the consumer moved past them, for callers that hand out
//! views of records that outlive the borrow of [`Record`] (language bindings: a Python
//! `memoryview`, a numpy array over a record's bytes). A held segment is not given back to the
//! producer when the consumer finishes it; it goes back when its last hold is released.

use super::{Consumer, Record};
use crate::error::RecvError;

/// One hold on the segment a record sits in, from [`Record::hold_segment`]: until it is given
/// to [`Consumer::release_hold`], the segment's bytes stay as they were when the record was
/// received (the producer cannot reuse the segment), even after the consumer moved on.
///
/// A hold that is dropped instead of released keeps its segment out of the pool for the
/// consumer's life: the producer then has one segment fewer. Holding every segment of the
/// channel stops the stream (the producer waits for a segment that never comes back); a
/// caller that holds should look at [`Consumer::held_segments`] before it waits.
#[derive(Debug)]
#[must_use = "a hold keeps its segment from the producer until it is released"]
pub struct SegmentHold {
    seg: u32,
    /// The consumer that gave it ([`Holds::id`]), so that a hold cannot be released by
    /// another.
    owner: u64,
}

impl SegmentHold {
    /// The index of the held segment in the channel's pool.
    pub fn segment(&self) -> u32 {
        self.seg
    }
}

/// A segment with holds: how many, and where the consumer stopped reading it once it moved
/// past it (`None` while it is still the segment in hand).
#[derive(Debug, Clone, Copy)]
struct Held {
    seg: u32,
    count: u32,
    finished: Option<usize>,
}

/// The consumer's held segments (a short list: one per segment that holds still reach).
#[derive(Debug)]
pub(super) struct Holds {
    list: Vec<Held>,
    /// This consumer's number among the ends of the process.
    id: u64,
}

impl Default for Holds {
    fn default() -> Holds {
        Holds {
            list: Vec::new(),
            id: crate::endpoint::next_end_id(),
        }
    }
}

impl Record<'_> {
    /// Keeps the segment this record sits in from going back to the producer until the hold
    /// is released with [`Consumer::release_hold`], so that the record's bytes can be read
    /// through a raw pointer after the record is dropped and the consumer has moved on. `None`
    /// for a record that spans segments (read it part by part, or copy it) and for a record
    /// from a [`Gate`](crate::Gate), whose segments the gate lends and takes back itself.
    ///
    /// This is for bindings that hand out views that the borrow checker cannot follow (a
    /// Python `memoryview`): in Rust, reading the record while it lives, or copying it,
    /// needs no hold.
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::{Geometry, TrySendError};
    ///
    /// let (mut tx, mut rx) = shmflow::pair(Geometry { segment_size: 4096, segment_count: 2 })?;
    /// tx.send(&[7u8; 4000])?; // one record per segment
    /// let (ptr, hold) = {
    ///     let mut r = rx.recv()?.unwrap();
    ///     let ptr = r.as_bytes().unwrap().as_ptr();
    ///     (ptr, r.hold_segment().unwrap())
    /// };
    /// tx.send(&[8u8; 4000])?;
    /// assert_eq!(rx.recv()?.unwrap().as_bytes().unwrap()[0], 8); // the consumer moved on
    /// // The first segment did not go back: the producer has none free.
    /// assert!(matches!(tx.try_send(&[9u8; 4000]), Err(TrySendError::Full)));
    /// // SAFETY: the hold keeps the segment, and the bytes in it, from the producer.
    /// assert_eq!(unsafe { *ptr }, 7);
    /// rx.release_hold(hold)?;
    /// tx.try_send(&[9u8; 4000])?; // it went back
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    pub fn hold_segment(&mut self) -> Option<SegmentHold> {
        if self.is_spanning()
            || matches!(
                self.consumer.recycler,
                crate::protocol::pool::Recycler::Lent(_)
            )
        {
            return None;
        }
        let seg = self.consumer.cur.as_ref()?.seg;
        let holds = &mut self.consumer.holds.list;
        match holds.iter_mut().find(|h| h.seg == seg) {
            Some(h) => h.count += 1,
            None => holds.push(Held {
                seg,
                count: 1,
                finished: None,
            }),
        }
        Some(SegmentHold {
            seg,
            owner: self.consumer.owner_id(),
        })
    }
}

impl Consumer {
    /// Releases a hold from [`Record::hold_segment`]: once the last hold on its segment is
    /// released and the consumer has moved past the segment, the segment goes back to the
    /// producer (who is woken if it waits for one).
    ///
    /// # Errors
    /// [`RecvError::Corrupt`] if the producer broke the return ring's protocol while the
    /// segment was held (the segment could not be given back).
    ///
    /// # Panics
    /// If the hold came from another consumer.
    pub fn release_hold(&mut self, hold: SegmentHold) -> Result<(), RecvError> {
        assert_eq!(
            hold.owner,
            self.owner_id(),
            "a segment hold released by a consumer that did not give it"
        );
        let list = &mut self.holds.list;
        let Some(i) = list.iter().position(|h| h.seg == hold.seg) else {
            unreachable!("a hold this consumer gave is in its list until released");
        };
        list[i].count -= 1;
        if list[i].count > 0 {
            return Ok(());
        }
        let h = list.swap_remove(i);
        match h.finished {
            Some(rd) => Ok(self.recycle(h.seg, rd)?),
            None => Ok(()),
        }
    }

    /// Segments that holds keep out of the pool although the consumer has moved past them.
    /// When it reaches the channel's segment count, the producer cannot get a segment until
    /// a hold is released: a reader that holds views and waits for more would wait forever.
    /// (With buffer debloating on, held segments count against the producer's cap, so it
    /// stops earlier.)
    pub fn held_segments(&self) -> usize {
        self.holds
            .list
            .iter()
            .filter(|h| h.finished.is_some())
            .count()
    }

    /// The segment `seg`, finished up to `rd`, stays out of the pool if it is held.
    pub(super) fn keep_if_held(&mut self, seg: u32, rd: usize) -> bool {
        match self.holds.list.iter_mut().find(|h| h.seg == seg) {
            Some(h) => {
                h.finished = Some(rd);
                true
            }
            None => false,
        }
    }

    fn owner_id(&self) -> u64 {
        self.holds.id
    }

    /// The segment `seg` (just taken from the data ring) is held: a correct producer cannot
    /// have had it back.
    pub(super) fn is_held(&self, seg: u32) -> bool {
        !self.holds.list.is_empty() && self.holds.list.iter().any(|h| h.seg == seg)
    }
}
