//! The buffer-timeout flusher (Flink's OutputFlusher): a thread that wakes a parked consumer
//! at most one interval after the producer published a record without waking it.

use std::sync::atomic::{AtomicBool, Ordering as StdOrdering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::protocol::counters::Local;
use crate::region::view::Shared;
use crate::sync::Arc;

struct State {
    /// Set (Release) by the producer after it published frames; taken (Acquire) by the
    /// flusher, so that the commit store happens before the flusher's notifying swap.
    pending: AtomicBool,
    stop: AtomicBool,
}

pub(crate) struct Flusher {
    interval: Duration,
    state: std::sync::Arc<State>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    pub(crate) fn start(shared: Arc<Shared>, interval: Duration) -> Flusher {
        let state = std::sync::Arc::new(State {
            pending: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let st = state.clone();
        let requested = interval;
        let interval = interval.max(Duration::from_micros(10));
        let thread = std::thread::Builder::new()
            .name("shmflow-flusher".into())
            .spawn(move || {
                let mut wakes = Local::default();
                while !st.stop.load(StdOrdering::Acquire) {
                    std::thread::park_timeout(interval);
                    if st.pending.swap(false, StdOrdering::Acquire) {
                        let h = shared.header();
                        if crate::protocol::park::notify(shared.consumer_park()) {
                            wakes.add(&h.producer_counters.flusher_wakes, 1);
                        }
                    }
                }
            })
            .expect("spawning the shmflow flusher thread");
        Flusher {
            interval: requested,
            state,
            thread: Some(thread),
        }
    }

    /// The interval it was started with (as requested).
    pub(crate) fn interval(&self) -> Duration {
        self.interval
    }

    /// Called by the producer after every publication. Always a store, never skipped when the
    /// flag is already set: the flusher's Acquire must see the *latest* commit store, or a
    /// consumer parking in between could miss it until the next record.
    #[inline]
    pub(crate) fn mark_pending(&self) {
        self.state.pending.store(true, StdOrdering::Release);
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.state.stop.store(true, StdOrdering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
