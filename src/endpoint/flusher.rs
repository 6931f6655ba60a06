//! The buffer-timeout flusher (Flink's OutputFlusher): a thread that wakes a parked consumer
//! at most one interval after the producer published a record without waking it, and sleeps
//! without a timer while nothing is pending (see `protocol::flush_signal`).

use std::sync::atomic::{AtomicBool, Ordering as StdOrdering};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::protocol::counters::Local;
use crate::protocol::flush_signal::FlushSignal;
use crate::region::view::Shared;
use crate::sync::Arc;

struct State {
    signal: FlushSignal,
    /// Set (Release) by `Drop`, read (Acquire) by the thread before each sleep.
    stop: AtomicBool,
}

pub(crate) struct Flusher {
    interval: Duration,
    /// Written by the producer's thread at every publication, read by the flusher's: on
    /// lines of its own, so that no other state of the process shares them.
    state: std::sync::Arc<CachePadded<State>>,
    /// `None` when the system refused the thread: the producer then wakes the consumer itself
    /// after each publication (what `FlushPolicy::EveryRecord` does), until the policy changes.
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    pub(crate) fn start(shared: Arc<Shared>, interval: Duration) -> Flusher {
        let state = std::sync::Arc::new(CachePadded::new(State {
            signal: FlushSignal::default(),
            stop: AtomicBool::new(false),
        }));
        let st = state.clone();
        let requested = interval;
        let interval = interval.max(Duration::from_micros(10));
        let thread = std::thread::Builder::new()
            .name("shmflow-flusher".into())
            .spawn(move || {
                let mut wakes = Local::default();
                let stopped = || st.stop.load(StdOrdering::Acquire);
                let wake_if_marked = |wakes: &mut Local| {
                    let marked = st.signal.take();
                    if marked
                        && crate::protocol::park::notify::<crate::region::os::Host>(
                            shared.consumer_park(),
                            shared.consumer_bell(),
                        )
                    {
                        crate::protocol::figures::flusher_woke(shared.header(), wakes);
                    }
                    marked
                };
                while !stopped() {
                    std::thread::park_timeout(interval);
                    if !wake_if_marked(&mut wakes) {
                        // A whole interval with nothing published: no timer until there is.
                        st.signal.sleep(stopped, std::thread::park);
                    }
                }
                // Stopped (the policy changed, or the producer is going): a publication marked
                // since the last look still gets its wake-up.
                wake_if_marked(&mut wakes);
            })
            // Out of threads (a limit, memory): no panic; the producer wakes its consumer
            // itself (see `mark_pending`).
            .ok();
        Flusher {
            interval: requested,
            state,
            thread,
        }
    }

    /// The interval it was started with (as requested).
    pub(crate) fn interval(&self) -> Duration {
        self.interval
    }

    /// Called by the producer after every publication (see `FlushSignal::mark`). False when
    /// there is no thread (the system refused it): the caller wakes the consumer itself.
    #[inline]
    #[must_use]
    pub(crate) fn mark_pending(&self) -> bool {
        match &self.thread {
            Some(t) => {
                self.state.signal.mark(|| t.thread().unpark());
                true
            }
            None => false,
        }
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
