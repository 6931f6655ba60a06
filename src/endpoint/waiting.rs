//! What the async forms of the ends share: the accounting of a wait however it ends, and the
//! executor's cooperative budget.

use crate::sync::AtomicU64;
use crate::sys::clock::monotonic_ns;

/// A wait in progress, shown live (`since`) and added to `total` when it ends — also when the
/// future that waits is dropped, which is why the counter lives in shared memory alone.
pub(crate) struct Waiting<'a> {
    since: &'a AtomicU64,
    total: &'a AtomicU64,
    start: u64,
}

impl<'a> Waiting<'a> {
    pub(crate) fn start(since: &'a AtomicU64, total: &'a AtomicU64) -> Waiting<'a> {
        let start = monotonic_ns();
        // Relaxed: a statistic.
        since.store(start, crate::sync::Ordering::Relaxed);
        Waiting {
            since,
            total,
            start,
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        // Relaxed: a statistic.
        self.since.store(0, crate::sync::Ordering::Relaxed);
        let waited = monotonic_ns().saturating_sub(self.start);
        crate::protocol::counters::add_owned(self.total, waited);
    }
}

/// How many calls that found their work done at once may pass between two looks at the
/// executor's budget.
const CALLS_PER_BUDGET_LOOK: u8 = 32;

/// Cooperative scheduling: a task that always finds records ready would never give its
/// thread back, so every [`CALLS_PER_BUDGET_LOOK`]th call spends a unit of tokio's budget and,
/// once the task has used its share, yields before doing anything (nothing is taken yet, so
/// a future dropped there loses nothing).
pub(crate) async fn spend_budget(calls: &mut u8) {
    std::future::poll_fn(|cx| poll_budget(calls, cx)).await
}

/// [`spend_budget`] for a hand-written future: `Pending` (the task is woken to run again
/// later) if the task has used its share. Nothing has been taken when it says so.
#[inline]
pub(crate) fn poll_budget(calls: &mut u8, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
    // A countdown: one decrement and one test per call.
    if *calls > 0 {
        *calls -= 1;
        return std::task::Poll::Ready(());
    }
    budget_look(calls, cx)
}

#[cold]
fn budget_look(calls: &mut u8, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
    #[cfg(not(loom))]
    {
        let restore = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        restore.made_progress();
    }
    #[cfg(loom)]
    let _ = cx;
    *calls = CALLS_PER_BUDGET_LOOK;
    std::task::Poll::Ready(())
}

/// A boxed future for the slow path of a hand-written one (`Send`, as the ends are).
pub(crate) type Slow<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Starts the slow path of a hand-written future: keeps `slow` in `slot` and polls it. Out of
/// line: only the calls that wait get here.
#[cold]
#[inline(never)]
pub(crate) fn start_slow<'a, T>(
    slot: &mut Option<Slow<'a, T>>,
    slow: Slow<'a, T>,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<T> {
    slot.insert(slow).as_mut().poll(cx)
}
