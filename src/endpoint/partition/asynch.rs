//! The async forms (feature `tokio`): each waits in the executor where its blocking form would
//! block, on the one channel it picks (or on each in turn, for a broadcast). Dropping a future
//! sends nothing to the channel it was waiting for; a broadcast dropped part-way has reached
//! the channels before that one, as with `send_timeout`. A round-robin partition moves on only
//! once a record went out.

use super::{Partition, Route};
use crate::error::SendError;

impl Partition {
    /// As [`Partition::send`], waiting in the executor.
    ///
    /// # Errors
    /// As [`Partition::send`].
    pub async fn send_async(&mut self, record: &[u8]) -> Result<(), SendError> {
        match self.route(record) {
            Route::One(c) => {
                self.outputs[c].send_async(record).await?;
                self.next = c + 1;
                Ok(())
            }
            Route::All => {
                for p in self.outputs.iter_mut() {
                    p.send_async(record).await?;
                }
                Ok(())
            }
        }
    }

    /// As [`Partition::send_keyed`], waiting in the executor.
    ///
    /// # Errors
    /// As [`Producer::send`](crate::endpoint::producer::Producer::send).
    pub async fn send_keyed_async(&mut self, key: u64, record: &[u8]) -> Result<(), SendError> {
        let c = self.key_channel(key);
        self.outputs[c].send_async(record).await
    }

    /// As [`Partition::send_to`], waiting in the executor.
    ///
    /// # Errors
    /// As [`Producer::send`](crate::endpoint::producer::Producer::send).
    ///
    /// # Panics
    /// If `c` is not below [`Partition::channels`].
    pub async fn send_to_async(&mut self, c: u32, record: &[u8]) -> Result<(), SendError> {
        self.outputs[c as usize].send_async(record).await
    }

    /// As [`Partition::send_event`], waiting in the executor.
    ///
    /// # Errors
    /// As [`Producer::send_event`](crate::endpoint::producer::Producer::send_event), from the first channel that fails.
    pub async fn send_event_async(&mut self, kind: u32, payload: &[u8]) -> Result<(), SendError> {
        for p in self.outputs.iter_mut() {
            p.send_event_async(kind, payload).await?;
        }
        Ok(())
    }

    /// As [`Partition::send_barrier`], waiting in the executor (as
    /// [`Producer::send_barrier_async`](crate::endpoint::producer::Producer::send_barrier_async)); a future dropped part-way leaves the barrier on the
    /// channels before the one it waited for, and a call again with the same `id` reaches the
    /// rest.
    ///
    /// # Errors
    /// As [`Partition::send_barrier`].
    pub async fn send_barrier_async(
        &mut self,
        id: u64,
        alignment: crate::endpoint::event::Alignment,
        payload: &[u8],
    ) -> Result<(), SendError> {
        for (p, last) in self.outputs.iter_mut().zip(self.barriers.iter_mut()) {
            if *last != Some(id) {
                p.send_barrier_async(id, alignment, payload).await?;
                *last = Some(id);
            }
        }
        Ok(())
    }

    /// As [`Partition::forward_barrier`], waiting in the executor (as
    /// [`Partition::send_barrier_async`]).
    ///
    /// # Errors
    /// As [`Partition::send_barrier`].
    pub async fn forward_barrier_async(
        &mut self,
        id: u64,
        alignment: crate::endpoint::event::Alignment,
        emitted_ns: u64,
        payload: &[u8],
    ) -> Result<(), SendError> {
        for (p, last) in self.outputs.iter_mut().zip(self.barriers.iter_mut()) {
            if *last != Some(id) {
                p.forward_barrier_async(id, alignment, emitted_ns, payload)
                    .await?;
                *last = Some(id);
            }
        }
        Ok(())
    }

    /// As [`Partition::send_priority_event`], waiting in the executor.
    ///
    /// # Errors
    /// As [`Producer::send_priority_event`](crate::endpoint::producer::Producer::send_priority_event), from the first channel that fails.
    pub async fn send_priority_event_async(
        &mut self,
        kind: u32,
        payload: &[u8],
    ) -> Result<(), SendError> {
        for p in self.outputs.iter_mut() {
            p.send_priority_event_async(kind, payload).await?;
        }
        Ok(())
    }

    /// As [`Partition::flush`], with [`Producer::flush_async`](crate::endpoint::producer::Producer::flush_async) on every channel.
    ///
    /// # Errors
    /// As [`Producer::flush`](crate::endpoint::producer::Producer::flush), from the first channel that fails.
    pub async fn flush_async(&mut self) -> Result<(), SendError> {
        for p in self.outputs.iter_mut() {
            p.flush_async().await?;
        }
        Ok(())
    }
}
