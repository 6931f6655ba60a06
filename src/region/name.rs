//! Who removes a named channel's name, and when: the name lives as long as a record that a
//! send accepted can still be read through it, as a POSIX message queue keeps its messages.
//!
//! - **The consumer** removes the name when its end detaches, whoever created it: it is the
//!   only reader the channel will ever have (an end attaches once), so nothing more can be
//!   read through the name.
//! - **The producer** removes the name when its end detaches, unless no consumer has attached
//!   yet and the stream holds something published (records, events): then the name
//!   **stays**, `shmflow list` shows the region as "ended, N unread", and the consumer that
//!   opens it later reads everything, then end of stream, and removes the name as it
//!   detaches. (A consumer that is attached has the region mapped: it reads everything
//!   whatever becomes of the name.)
//! - A gate's name goes with its consumer (the gate), as does a channel whose end never
//!   attached (the creator's fallback in `Mapping`'s `Drop`).
//! - A crashed process removes nothing: the name stays until the surviving end detaches, or
//!   `shmflow clean` removes it once no end is alive (`--unread` if a producer died after
//!   publishing before any consumer came: its records can still be read).
//!
//! Two ends can both want to remove the name (a consumer and a producer detaching at the same
//! time). The header's `name_claim` word decides: only the end whose CAS takes it from 0 to 1
//! unlinks. (Unlinking is by name: one removed behind the ends' back, by `rm` or by
//! `shmflow clean` racing an end that is attaching, and created again, can still be removed by
//! an old end; see the threat model.)
//!
//! No ordering between the two ends' decisions is needed: whatever the producer reads of the
//! consumer's state, a consumer that attached removes the name when it detaches.

use std::sync::atomic::Ordering as StdOrdering;

use crate::error::End;
use crate::protocol::ends::EndState;
use crate::region::view::{Backing, NameDuty, Shared};

/// What a detaching producer leaves behind, for [`settle`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Left {
    /// Nothing was ever published (no segment handed over, no priority event).
    Nothing,
    /// Something was published: a consumer that opens the name later reads it.
    Published,
}

/// Called by an end of a named channel right after it stored its final state (producer:
/// after its Release store of DETACHED or FAILED; consumer: likewise), once per end. Removes
/// the name or leaves it, following the rules above.
pub(crate) fn settle(shared: &Shared, me: End, left: Left) {
    let Backing::Mapped(m) = shared.backing();
    let name = match &m.name {
        NameDuty::None => return,
        NameDuty::Creator(n) | NameDuty::Opener(n) => n,
    };
    if shared.gate.is_some() {
        return;
    }
    m.name_settled.store(true, StdOrdering::Relaxed);
    let h = shared.header();
    let remove = match me {
        End::Consumer => true,
        End::Producer => {
            // Acquire (in `state`): pairs with the consumer's Release stores of its state
            // (attach, detach).
            match h.consumer_end().state() {
                EndState::Free => left == Left::Nothing,
                // Attached (it has the region mapped: it reads everything whatever the name
                // does; it may hold no name to remove, if it attached by descriptor),
                // detached, lost or dead.
                _ => true,
            }
        }
    };
    if !remove {
        return;
    }
    if h.claim_name() {
        // Failure (already removed by `shmflow clean` or by hand) leaves nothing to do.
        let _ = crate::sys::shm::unlink(name);
    }
}
