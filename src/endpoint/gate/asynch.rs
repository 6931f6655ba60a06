//! The gate's waiting call as a future, for async tasks (feature `tokio`): the scan of its
//! `try_` form, and if it finds nothing a wait in the executor on the gate's park word until a
//! scan finds something, which is then delivered. A scan that finds nothing changes nothing,
//! so dropping the future loses no message.

use super::{Delivered, Gate, GateMessage, Pick};
use crate::endpoint::metrics::Waiting;
use crate::endpoint::waiting::spend_budget;
use crate::error::RecvError;
use crate::protocol::figures;
use crate::protocol::park::{self, Immediately};
use crate::region::bridge::Bridges;
use crate::region::os::Host;

impl Gate {
    /// Waits in the executor until a channel has something (a record, an event, its end or
    /// its producer's death). The time counts as the gate's idle time.
    async fn readable(&mut self) -> Result<Pick, RecvError> {
        // An alignment that may switch wakes the wait when its timeout passes.
        #[cfg(all(feature = "tokio", not(shmflow_loom)))]
        if let Some(at) = self.switch_instant() {
            return match tokio::time::timeout_at(at.into(), self.readable_any()).await {
                Ok(r) => r,
                Err(_) => Ok(Pick::Switch),
            };
        }
        self.readable_any().await
    }

    async fn readable_any(&mut self) -> Result<Pick, RecvError> {
        let shared = self.shared.clone();
        let gate = shared.gate.as_ref().expect("gate").gate_header();
        let _idle = Waiting::start(figures::gate_idle(gate));
        // Boxed: the waiting state is large and needed only here, so that the calls that
        // find their work done at once stay small futures.
        // SAFETY: the word is in the region that `shared`, owned by this future, maps.
        Box::pin(unsafe {
            park::wait_async::<Host, _, RecvError>(
                park::WaitOn {
                    word: shared.consumer_park(),
                    bell: shared.consumer_bell(),
                },
                &shared.name,
                Bridges::global(),
                self.wait,
                park::Notifier::Light,
                // Spaced looks: each reads the frame every producer is writing.
                park::Pace::SparseSpaced,
                |look| Ok(self.poll_pick(look)),
            )
        })
        .await
    }

    /// As [`Gate::recv`], waiting in the executor instead of blocking the thread. Dropping
    /// the future before it completes loses no message.
    ///
    /// # Errors
    /// As [`Gate::recv`].
    pub async fn recv_async(&mut self) -> Result<Option<GateMessage<'_>>, RecvError> {
        spend_budget(&mut self.coop).await;
        // The fast path of `Gate::recv_inner`, with the same conditions.
        if let Some((c, len, ptr)) = self.fast_pick() {
            // SAFETY: `len` and `ptr` are what `whole_now` of channel `c` just returned, and
            // nothing was read from it since.
            let record = unsafe { self.chans[c].record_at(len, ptr) };
            return Ok(Some(GateMessage::Record {
                channel: c as u32,
                record,
            }));
        }
        self.retire_finished();
        loop {
            if let Some(step) = self.cp.steps.pop_front() {
                return self.step_message(step).map(Some);
            }
            self.cp.tick();
            if !self.cp.steps.is_empty() {
                continue;
            }
            // What the scan picks is acted on once: a dead channel's pick, for one, is its
            // only report.
            let pick = match self.decide(Immediately) {
                Ok(pick) => pick,
                Err(crate::error::NotNow) => self.readable().await?,
            };
            let this: *mut Gate = self;
            // SAFETY: as in `Gate::recv_inner`: `this` is `self`, reborrowed for one call whose
            // result borrows it only on the path that returns it.
            match unsafe { &mut *this }.deliver(pick)? {
                Delivered::Message(m) => return Ok(Some(m)),
                Delivered::AllDone => return Ok(None),
                Delivered::Again => {}
            }
        }
    }
}
