//! What the async forms of the ends share: the executor's cooperative budget and the boxed
//! slow path of the hand-written futures.

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
    #[cfg(not(shmflow_loom))]
    {
        let restore = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        restore.made_progress();
    }
    #[cfg(shmflow_loom)]
    let _ = cx;
    *calls = CALLS_PER_BUDGET_LOOK;
    std::task::Poll::Ready(())
}

/// Bytes of segment that cost one unit of the executor's budget: about 32 records of 64
/// bytes, as [`CALLS_PER_BUDGET_LOOK`] calls do.
const BYTES_PER_BUDGET_UNIT: usize = 2048;

/// The most units one segment costs: well under tokio's 128 a turn, so that a task with a
/// fresh budget always gets through (a segment of 256 KiB or more would otherwise ask for
/// more than a turn has, and never be taken).
const MAX_UNITS_PER_SEGMENT: usize = 16;

/// The budget of a sender that writes records into the segment in hand without looking at
/// the executor (a look per record costs more than the write): spent when a record does not
/// fit in the segment in hand (or none is in hand), one unit per [`BYTES_PER_BUDGET_UNIT`] of
/// the segment size, at least one and at most [`MAX_UNITS_PER_SEGMENT`]. `Pending` if the
/// task has used its share (nothing is sent then; tokio wakes the task).
#[cold]
#[inline(never)]
pub(crate) fn segment_budget(
    seg_size: usize,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<()> {
    let units = (seg_size / BYTES_PER_BUDGET_UNIT).clamp(1, MAX_UNITS_PER_SEGMENT);
    #[cfg(not(shmflow_loom))]
    for _ in 0..units {
        let restore = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        restore.made_progress();
    }
    #[cfg(shmflow_loom)]
    let _ = (units, cx);
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
