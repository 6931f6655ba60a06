//! Partitioned output: one producer-side writer over `N` channels (each possibly a channel of
//! another consumer's gate), with Flink's partitioners.
//!
//! Each record goes to the channel the partitioner picks, and only that channel's
//! backpressure can block it: a full channel never holds up a record routed elsewhere (use
//! the `try_` forms to not block at all). A broadcast record goes to every channel; the
//! blocking form writes it channel by channel, the `try_` form either writes it to every
//! channel or to none.

use std::time::{Duration, Instant};

use crate::endpoint::producer::{FlushPolicy, Producer};
use crate::error::{too_large, ConfigError, SendError, SendTimeoutError, TrySendError};
use crate::protocol::park::WaitStrategy;

#[cfg(feature = "tokio")]
mod asynch;
mod markers;

/// A key function: record → hash of its key.
pub type KeyFn = Box<dyn FnMut(&[u8]) -> u64 + Send>;

/// How a [`Partition`] picks the channel of a record.
#[non_exhaustive]
pub enum Partitioner {
    /// Channel 0, 1, …, N-1, 0, … (Flink's `rebalance`).
    RoundRobin,
    /// Every record to every channel (Flink's `broadcast`).
    Broadcast,
    /// `key(record) % N` (Flink's `keyBy`; the function should hash, e.g. FNV or SipHash of
    /// the key's bytes, so that keys spread over the channels).
    Key(KeyFn),
}

impl std::fmt::Debug for Partitioner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Partitioner::RoundRobin => "RoundRobin",
            Partitioner::Broadcast => "Broadcast",
            Partitioner::Key(_) => "Key(..)",
        })
    }
}

/// A writer over several channels.
pub struct Partition {
    outputs: Vec<Producer>,
    partitioner: Partitioner,
    next: usize,
    /// The last barrier id each channel has taken: a barrier call that stopped part-way
    /// (a timeout, a full channel) and is made again with the same id goes only to the
    /// channels that lack it, never twice to one (a gate takes a repeated id as a protocol
    /// error).
    barriers: Vec<Option<u64>>,
    /// The channel the next forwarded latency marker goes to (they go round-robin).
    next_marker: usize,
}

enum Route {
    One(usize),
    All,
}

impl Partition {
    /// A partition over `outputs` (at least one).
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::{Geometry, Partition, Partitioner};
    ///
    /// let (tx0, mut rx0) = shmflow::pair(Geometry::default())?;
    /// let (tx1, mut rx1) = shmflow::pair(Geometry::default())?;
    /// let mut part = Partition::new(vec![tx0, tx1], Partitioner::RoundRobin)?;
    /// for word in ["a", "b", "c"] {
    ///     part.send(word.as_bytes())?;
    /// }
    /// drop(part);
    /// let count = |rx: &mut shmflow::Consumer| -> shmflow::Result<usize> {
    ///     let mut n = 0;
    ///     while rx.recv()?.is_some() {
    ///         n += 1;
    ///     }
    ///     Ok(n)
    /// };
    /// assert_eq!((count(&mut rx0)?, count(&mut rx1)?), (2, 1));
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`ConfigError`] if `outputs` is empty.
    pub fn new(outputs: Vec<Producer>, partitioner: Partitioner) -> Result<Partition, ConfigError> {
        if outputs.is_empty() {
            return Err(ConfigError::new(
                "partition",
                "outputs",
                "at least one channel",
                0,
            ));
        }
        let barriers = vec![None; outputs.len()];
        Ok(Partition {
            outputs,
            partitioner,
            next: 0,
            barriers,
            next_marker: 0,
        })
    }

    /// Number of channels.
    pub fn channels(&self) -> u32 {
        self.outputs.len() as u32
    }

    /// Channel `i`'s producer (for its metrics, or to write to it directly).
    ///
    /// # Panics
    /// If `i` is not below [`Partition::channels`].
    pub fn output(&mut self, i: u32) -> &mut Producer {
        &mut self.outputs[i as usize]
    }

    /// Gives the producers back.
    pub fn into_outputs(self) -> Vec<Producer> {
        self.outputs
    }

    /// Sets the flush policy of every channel.
    pub fn set_flush_policy(&mut self, policy: FlushPolicy) {
        self.outputs
            .iter_mut()
            .for_each(|p| p.set_flush_policy(policy));
    }

    /// Sets the wait strategy of every channel.
    pub fn set_wait_strategy(&mut self, wait: WaitStrategy) {
        self.outputs
            .iter_mut()
            .for_each(|p| p.set_wait_strategy(wait));
    }

    /// The channel `record` would go to (without advancing round-robin); `None` for
    /// broadcast.
    pub fn channel_of(&mut self, record: &[u8]) -> Option<u32> {
        match self.route(record) {
            Route::One(c) => Some(c as u32),
            Route::All => None,
        }
    }

    fn route(&mut self, record: &[u8]) -> Route {
        let n = self.outputs.len();
        match &mut self.partitioner {
            Partitioner::RoundRobin => Route::One(self.next % n),
            Partitioner::Broadcast => Route::All,
            Partitioner::Key(f) => Route::One((f(record) % n as u64) as usize),
        }
    }

    /// Sends `record` where the partitioner says, blocking while that channel (or, for
    /// broadcast, each channel in turn) has no free segment.
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::{Geometry, Partition, Partitioner};
    ///
    /// let (a, mut rx_a) = shmflow::pair(Geometry::default())?;
    /// let (b, mut rx_b) = shmflow::pair(Geometry::default())?;
    /// // By key: the same key always goes to the same channel.
    /// let mut part = Partition::new(vec![a, b], Partitioner::Key(Box::new(|r: &[u8]| r[0] as u64)))?;
    /// part.send(&[1, 10])?;
    /// part.send(&[1, 11])?;
    /// part.flush()?;
    /// assert!(rx_b.recv()?.is_some() && rx_b.recv()?.is_some()); // 1 % 2 == 1
    /// assert!(rx_a.try_recv().is_err());
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Producer::send`], from the channel the record goes to (for broadcast, the first
    /// channel that fails; the channels before it have the record).
    pub fn send(&mut self, record: &[u8]) -> Result<(), SendError> {
        match self.route(record) {
            Route::One(c) => {
                self.outputs[c].send(record)?;
                self.next = c + 1;
                Ok(())
            }
            Route::All => self.outputs.iter_mut().try_for_each(|p| p.send(record)),
        }
    }

    /// As [`Partition::send`], or [`TrySendError::Full`] — with nothing sent — if the channel
    /// (for broadcast: any channel) has no room now. A broadcast `try_send` takes records that
    /// fit in one segment only ([`TrySendError::RecordTooLarge`] otherwise; use `send`).
    pub fn try_send(&mut self, record: &[u8]) -> Result<(), TrySendError> {
        match self.route(record) {
            Route::One(c) => {
                self.outputs[c].try_send(record)?;
                self.next = c + 1;
                Ok(())
            }
            Route::All => {
                let max = self.outputs[0].max_unspanned_len();
                if record.len() > max {
                    return Err(too_large(
                        self.outputs[0].region_name(),
                        "a record broadcast with try_send (one segment at most)",
                        record.len() as u64,
                        max as u64,
                    )
                    .into());
                }
                // Claim room everywhere first; dropping the claims on failure writes nothing.
                let mut claims = Vec::with_capacity(self.outputs.len());
                for p in self.outputs.iter_mut() {
                    claims.push(p.try_claim(record.len())?);
                }
                for mut c in claims {
                    c.copy_from_slice(record);
                    c.commit();
                }
                Ok(())
            }
        }
    }

    /// As [`Partition::send`], waiting at most `timeout` in all
    /// ([`SendTimeoutError::Timeout`]). For one
    /// channel nothing is sent on timeout; a broadcast that times out has reached the channels
    /// before the one that was full (in channel order) and not the rest — use `try_send` for
    /// all-or-nothing.
    pub fn send_timeout(
        &mut self,
        record: &[u8],
        timeout: Duration,
    ) -> Result<(), SendTimeoutError> {
        match crate::sync::now().checked_add(timeout) {
            Some(deadline) => self.send_deadline(record, deadline),
            None => Ok(self.send(record)?),
        }
    }

    /// As [`Partition::send_timeout`], with the deadline as an instant.
    pub fn send_deadline(
        &mut self,
        record: &[u8],
        deadline: Instant,
    ) -> Result<(), SendTimeoutError> {
        match self.route(record) {
            Route::One(c) => {
                self.outputs[c].send_deadline(record, deadline)?;
                self.next = c + 1;
                Ok(())
            }
            Route::All => self
                .outputs
                .iter_mut()
                .try_for_each(|p| p.send_deadline(record, deadline)),
        }
    }

    fn key_channel(&self, key: u64) -> usize {
        (key % self.outputs.len() as u64) as usize
    }

    /// Sends `record` to the channel of `key` (`key % N`), whatever the partitioner.
    ///
    /// # Errors
    /// As [`Producer::send`].
    pub fn send_keyed(&mut self, key: u64, record: &[u8]) -> Result<(), SendError> {
        let c = self.key_channel(key);
        self.outputs[c].send(record)
    }

    /// As [`Partition::send_keyed`], or [`TrySendError::Full`] — with nothing sent — if the
    /// key's channel has no room now.
    ///
    /// # Errors
    /// As [`Producer::try_send`].
    pub fn try_send_keyed(&mut self, key: u64, record: &[u8]) -> Result<(), TrySendError> {
        let c = self.key_channel(key);
        self.outputs[c].try_send(record)
    }

    /// As [`Partition::send_keyed`], waiting at most `timeout` ([`SendTimeoutError::Timeout`],
    /// with nothing sent).
    ///
    /// # Errors
    /// As [`Producer::send_timeout`].
    pub fn send_keyed_timeout(
        &mut self,
        key: u64,
        record: &[u8],
        timeout: Duration,
    ) -> Result<(), SendTimeoutError> {
        let c = self.key_channel(key);
        self.outputs[c].send_timeout(record, timeout)
    }

    /// As [`Partition::send_keyed_timeout`], waiting until `deadline` at most.
    ///
    /// # Errors
    /// As [`Producer::send_deadline`].
    pub fn send_keyed_deadline(
        &mut self,
        key: u64,
        record: &[u8],
        deadline: Instant,
    ) -> Result<(), SendTimeoutError> {
        let c = self.key_channel(key);
        self.outputs[c].send_deadline(record, deadline)
    }

    /// Sends `record` to channel `c`, whatever the partitioner.
    ///
    /// # Errors
    /// As [`Producer::send`].
    ///
    /// # Panics
    /// If `c` is not below [`Partition::channels`].
    pub fn send_to(&mut self, c: u32, record: &[u8]) -> Result<(), SendError> {
        self.outputs[c as usize].send(record)
    }

    /// As [`Partition::send_to`], or [`TrySendError::Full`] — with nothing sent — if channel
    /// `c` has no room now.
    ///
    /// # Errors
    /// As [`Producer::try_send`].
    ///
    /// # Panics
    /// If `c` is not below [`Partition::channels`].
    pub fn try_send_to(&mut self, c: u32, record: &[u8]) -> Result<(), TrySendError> {
        self.outputs[c as usize].try_send(record)
    }

    /// As [`Partition::send_to`], waiting at most `timeout` ([`SendTimeoutError::Timeout`],
    /// with nothing sent).
    ///
    /// # Errors
    /// As [`Producer::send_timeout`].
    ///
    /// # Panics
    /// If `c` is not below [`Partition::channels`].
    pub fn send_to_timeout(
        &mut self,
        c: u32,
        record: &[u8],
        timeout: Duration,
    ) -> Result<(), SendTimeoutError> {
        self.outputs[c as usize].send_timeout(record, timeout)
    }

    /// As [`Partition::send_to_timeout`], waiting until `deadline` at most.
    ///
    /// # Errors
    /// As [`Producer::send_deadline`].
    ///
    /// # Panics
    /// If `c` is not below [`Partition::channels`].
    pub fn send_to_deadline(
        &mut self,
        c: u32,
        record: &[u8],
        deadline: Instant,
    ) -> Result<(), SendTimeoutError> {
        self.outputs[c as usize].send_deadline(record, deadline)
    }

    /// Sends an event to every channel, in order with the records (Flink broadcasts events).
    ///
    /// # Errors
    /// As [`Producer::send_event`], from the first channel that fails.
    pub fn send_event(&mut self, kind: u32, payload: &[u8]) -> Result<(), SendError> {
        self.outputs
            .iter_mut()
            .try_for_each(|p| p.send_event(kind, payload))
    }

    /// As [`Partition::send_event`], or [`TrySendError::Full`] — with nothing sent to any
    /// channel — if one of them has no room now: room is made on every channel before the
    /// event is written to any.
    ///
    /// # Errors
    /// As [`Producer::try_send_event`], from the first channel that fails.
    pub fn try_send_event(&mut self, kind: u32, payload: &[u8]) -> Result<(), TrySendError> {
        crate::endpoint::event::check_payload(self.outputs[0].region_name(), payload)?;
        for p in self.outputs.iter_mut() {
            p.reserve_event(payload.len())?;
        }
        self.outputs
            .iter_mut()
            .try_for_each(|p| p.try_send_event(kind, payload))
    }

    /// As [`Partition::send_event`], waiting at most `timeout` in all
    /// ([`SendTimeoutError::Timeout`]): the channels before the one that was full have the
    /// event, the rest do not (use `try_send_event` for all or nothing).
    ///
    /// # Errors
    /// As [`Producer::send_event_timeout`], from the first channel that fails.
    pub fn send_event_timeout(
        &mut self,
        kind: u32,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(), SendTimeoutError> {
        let deadline = deadline_after(timeout);
        self.outputs
            .iter_mut()
            .try_for_each(|p| p.send_event_deadline(kind, payload, deadline))
    }

    /// As [`Partition::send_event_timeout`], waiting until `deadline` at most.
    ///
    /// # Errors
    /// As [`Producer::send_event_deadline`], from the first channel that fails.
    pub fn send_event_deadline(
        &mut self,
        kind: u32,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), SendTimeoutError> {
        self.outputs
            .iter_mut()
            .try_for_each(|p| p.send_event_deadline(kind, payload, deadline))
    }

    /// Sends checkpoint barrier `id` to every channel (as
    /// [`Producer::send_barrier`]), each after the records already sent to it: every
    /// downstream gate aligns on it. A call made again with the same `id` after one that
    /// stopped part-way (an error, a timeout, a full channel) sends it only to the channels
    /// that lack it.
    ///
    /// # Errors
    /// As [`Producer::send_barrier`], from the first channel that fails (the channels before
    /// it have the barrier).
    pub fn send_barrier(
        &mut self,
        id: u64,
        alignment: crate::endpoint::event::Alignment,
        payload: &[u8],
    ) -> Result<(), SendError> {
        self.each_barrier(id, |p| p.send_barrier(id, alignment, payload))
    }

    /// As [`Partition::send_barrier`], or [`TrySendError::Full`] at the first channel that has
    /// no room now (the channels before it have the barrier; call again with the same `id`
    /// to reach the rest).
    ///
    /// # Errors
    /// As [`Producer::try_send_barrier`], from the first channel that fails.
    pub fn try_send_barrier(
        &mut self,
        id: u64,
        alignment: crate::endpoint::event::Alignment,
        payload: &[u8],
    ) -> Result<(), TrySendError> {
        self.each_barrier(id, |p| p.try_send_barrier(id, alignment, payload))
    }

    /// As [`Partition::send_barrier`], waiting at most `timeout` in all
    /// ([`SendTimeoutError::Timeout`]; call again with the same `id` to reach the channels
    /// that lack it).
    ///
    /// # Errors
    /// As [`Producer::send_barrier_timeout`], from the first channel that fails.
    pub fn send_barrier_timeout(
        &mut self,
        id: u64,
        alignment: crate::endpoint::event::Alignment,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(), SendTimeoutError> {
        self.send_barrier_deadline(id, alignment, payload, deadline_after(timeout))
    }

    /// As [`Partition::send_barrier_timeout`], waiting until `deadline` at most.
    ///
    /// # Errors
    /// As [`Producer::send_barrier_deadline`], from the first channel that fails.
    pub fn send_barrier_deadline(
        &mut self,
        id: u64,
        alignment: crate::endpoint::event::Alignment,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), SendTimeoutError> {
        self.each_barrier(id, |p| {
            p.send_barrier_deadline(id, alignment, payload, deadline)
        })
    }

    /// Passes a released barrier on to every channel, keeping its first sender's time (as
    /// [`Producer::forward_barrier`]).
    ///
    /// # Errors
    /// As [`Partition::send_barrier`].
    pub fn forward_barrier(
        &mut self,
        id: u64,
        alignment: crate::endpoint::event::Alignment,
        emitted_ns: u64,
        payload: &[u8],
    ) -> Result<(), SendError> {
        self.each_barrier(id, |p| {
            p.forward_barrier(id, alignment, emitted_ns, payload)
        })
    }

    /// As [`Partition::forward_barrier`], or [`TrySendError::Full`] at the first channel with
    /// no room now (as [`Partition::try_send_barrier`]).
    ///
    /// # Errors
    /// As [`Producer::try_forward_barrier`], from the first channel that fails.
    pub fn try_forward_barrier(
        &mut self,
        id: u64,
        alignment: crate::endpoint::event::Alignment,
        emitted_ns: u64,
        payload: &[u8],
    ) -> Result<(), TrySendError> {
        self.each_barrier(id, |p| {
            p.try_forward_barrier(id, alignment, emitted_ns, payload)
        })
    }

    /// As [`Partition::forward_barrier`], waiting at most `timeout` in all (as
    /// [`Partition::send_barrier_timeout`]).
    ///
    /// # Errors
    /// As [`Producer::forward_barrier_timeout`], from the first channel that fails.
    pub fn forward_barrier_timeout(
        &mut self,
        id: u64,
        alignment: crate::endpoint::event::Alignment,
        emitted_ns: u64,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(), SendTimeoutError> {
        let deadline = deadline_after(timeout);
        self.forward_barrier_deadline(id, alignment, emitted_ns, payload, deadline)
    }

    /// As [`Partition::forward_barrier_timeout`], waiting until `deadline` at most.
    ///
    /// # Errors
    /// As [`Producer::forward_barrier_deadline`], from the first channel that fails.
    pub fn forward_barrier_deadline(
        &mut self,
        id: u64,
        alignment: crate::endpoint::event::Alignment,
        emitted_ns: u64,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), SendTimeoutError> {
        self.each_barrier(id, |p| {
            p.forward_barrier_deadline(id, alignment, emitted_ns, payload, deadline)
        })
    }

    /// Runs `send` on every channel that has not taken barrier `id` yet, in channel order,
    /// stopping at the first that fails.
    fn each_barrier<E>(
        &mut self,
        id: u64,
        mut send: impl FnMut(&mut Producer) -> Result<(), E>,
    ) -> Result<(), E> {
        for (p, last) in self.outputs.iter_mut().zip(self.barriers.iter_mut()) {
            if *last != Some(id) {
                send(p)?;
                *last = Some(id);
            }
        }
        Ok(())
    }

    /// Sends a priority event to every channel (see [`Producer::send_priority_event`]).
    ///
    /// # Errors
    /// As [`Producer::send_priority_event`], from the first channel that fails.
    pub fn send_priority_event(&mut self, kind: u32, payload: &[u8]) -> Result<(), SendError> {
        self.outputs
            .iter_mut()
            .try_for_each(|p| p.send_priority_event(kind, payload))
    }

    /// As [`Partition::send_priority_event`], or [`TrySendError::Full`] — with nothing sent
    /// to any channel — if one of the lanes is full now.
    ///
    /// # Errors
    /// As [`Producer::try_send_priority_event`], from the first channel that fails.
    pub fn try_send_priority_event(
        &mut self,
        kind: u32,
        payload: &[u8],
    ) -> Result<(), TrySendError> {
        crate::endpoint::event::check_payload(self.outputs[0].region_name(), payload)?;
        if !self.outputs.iter().all(Producer::lane_room) {
            return Err(TrySendError::Full);
        }
        self.outputs
            .iter_mut()
            .try_for_each(|p| p.try_send_priority_event(kind, payload))
    }

    /// As [`Partition::send_priority_event`], waiting at most `timeout` in all for room in
    /// each lane (the channels before the one that was full have the event; use
    /// `try_send_priority_event` for all or nothing).
    ///
    /// # Errors
    /// As [`Producer::send_priority_event_timeout`], from the first channel that fails.
    pub fn send_priority_event_timeout(
        &mut self,
        kind: u32,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(), SendTimeoutError> {
        self.send_priority_event_deadline(kind, payload, deadline_after(timeout))
    }

    /// As [`Partition::send_priority_event_timeout`], waiting until `deadline` at most.
    ///
    /// # Errors
    /// As [`Producer::send_priority_event_deadline`], from the first channel that fails.
    pub fn send_priority_event_deadline(
        &mut self,
        kind: u32,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), SendTimeoutError> {
        self.outputs
            .iter_mut()
            .try_for_each(|p| p.send_priority_event_deadline(kind, payload, deadline))
    }

    /// Makes everything sent visible on every channel (see [`Producer::flush`]).
    ///
    /// # Errors
    /// As [`Producer::flush`], from the first channel that fails.
    pub fn flush(&mut self) -> Result<(), SendError> {
        self.outputs.iter_mut().try_for_each(|p| p.flush())
    }

    /// As [`Partition::flush`], with [`Producer::try_flush`] on every channel: every channel
    /// is flushed, and [`TrySendError::Full`] says a direct network end still waits for
    /// credit.
    ///
    /// # Errors
    /// As [`Producer::try_flush`], the first error of all the channels.
    pub fn try_flush(&mut self) -> Result<(), TrySendError> {
        let mut first = Ok(());
        for p in self.outputs.iter_mut() {
            let r = p.try_flush();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// As [`Partition::flush`], waiting at most `timeout` in all for credit.
    ///
    /// # Errors
    /// As [`Producer::flush_timeout`], from the first channel that fails.
    pub fn flush_timeout(&mut self, timeout: Duration) -> Result<(), SendTimeoutError> {
        self.flush_deadline(deadline_after(timeout))
    }

    /// As [`Partition::flush_timeout`], waiting until `deadline` at most.
    ///
    /// # Errors
    /// As [`Producer::flush_deadline`], from the first channel that fails.
    pub fn flush_deadline(&mut self, deadline: Instant) -> Result<(), SendTimeoutError> {
        self.outputs
            .iter_mut()
            .try_for_each(|p| p.flush_deadline(deadline))
    }

    /// Ends every channel as failed (see [`Producer::fail`]).
    pub fn fail(self) {
        self.outputs.into_iter().for_each(Producer::fail);
    }
}

/// `timeout` from now, or as good as never if that overflows.
fn deadline_after(timeout: Duration) -> Instant {
    let now = crate::sync::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365 * 30))
}

impl std::fmt::Debug for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partition")
            .field("outputs", &self.outputs)
            .field("partitioner", &self.partitioner)
            .finish_non_exhaustive()
    }
}
