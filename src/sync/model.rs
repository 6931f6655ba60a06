//! loom side of the shim: loom's atomics, and a futex modelled with its real semantics.

use std::time::Duration;

pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64};
pub(crate) use loom::sync::Arc;
use loom::sync::Condvar;

/// The futex, modelled: `wait` sleeps only if the word still equals `expected`, checked under
/// the kernel's lock that `wake` takes, so the check and the sleep are atomic with respect to a
/// wake. A wake with no sleeper is lost (a condition variable remembers nothing), exactly like
/// `FUTEX_WAKE` — a primitive that remembered it would hide lost wake-ups. One lock and one
/// condition variable stand for the kernel's futex table, so that [`futex_waitv`] can sleep on
/// several words; each word's wakes are counted, and a sleeper returns only when one of its own
/// words was woken (a wake of another word does not end its sleep: no spurious wake-up that
/// could hide a lost one).
#[derive(Default)]
pub(crate) struct FutexWord {
    word: AtomicU32,
}

struct Kernel {
    /// Wakes so far, by word address.
    wakes: Mutex<std::collections::HashMap<usize, u64>>,
    sleepers: Condvar,
}

loom::lazy_static! {
    static ref KERNEL: Kernel = Kernel {
        wakes: Mutex::new(std::collections::HashMap::new()),
        sleepers: Condvar::new(),
    };
}

impl FutexWord {
    pub(crate) fn atomic(&self) -> &AtomicU32 {
        &self.word
    }
}

/// Timeouts are ignored: a model that only ends because a timer fired would hide a lost
/// wake-up, so under loom every wait is unbounded and loom reports the deadlock.
fn futex_wait(word: &FutexWord, expected: u32) {
    futex_waitv(&[(word as *const FutexWord, expected)], None);
}

fn futex_wake(word: &FutexWord) {
    let mut wakes = KERNEL.wakes.lock().unwrap();
    *wakes.entry(word as *const FutexWord as usize).or_default() += 1;
    KERNEL.sleepers.notify_all();
}

/// The doorbell (a datagram socket pair and the reactor's readiness), modelled: a count of
/// queued rings and the waiting task's waker. `ring` adds to the counter, then takes the waker under the lock and wakes it;
/// `rung` takes the counter under the lock, or leaves its waker there. A ring with no waiter
/// is kept (the count), as the socket keeps its datagrams. Timeouts are ignored (see
/// [`futex_wait`]).
#[derive(Default, Debug)]
pub(crate) struct Bell {
    count: AtomicU64,
    waker: loom::sync::Mutex<Option<std::task::Waker>>,
}

impl Bell {
    pub(crate) fn ring(&self) {
        // Release: pairs with the Acquire swap in `rung` (the socket's queue).
        self.count.fetch_add(1, super::Ordering::Release);
        let waker = self.waker.lock().unwrap().take();
        if let Some(w) = waker {
            w.wake();
        }
    }

    pub(crate) async fn rung(&self, _timeout: Duration) -> std::io::Result<()> {
        std::future::poll_fn(|cx| {
            let mut slot = self.waker.lock().unwrap();
            // Acquire: pairs with the Release increment in `ring`.
            if self.count.swap(0, super::Ordering::Acquire) > 0 {
                return std::task::Poll::Ready(Ok(()));
            }
            *slot = Some(cx.waker().clone());
            std::task::Poll::Pending
        })
        .await
    }
}

/// `futex_waitv`, modelled as [`futex_wait`] on several words (timeouts ignored). Unlike
/// the kernel, the model reads the words itself: every model keeps its words alive.
fn futex_waitv(words: &[(*const FutexWord, u32)], _timeout: Option<Duration>) -> bool {
    let mut wakes = KERNEL.wakes.lock().unwrap();
    if words.iter().any(|&(w, v)| {
        // SAFETY: the models keep every region, and so every word, alive until they end.
        let w = unsafe { &*w };
        w.word.load(super::Ordering::Relaxed) != v
    }) {
        return true;
    }
    let seen = |wakes: &std::collections::HashMap<usize, u64>| -> Vec<u64> {
        words
            .iter()
            .map(|&(w, _)| wakes.get(&(w as usize)).copied().unwrap_or(0))
            .collect()
    };
    let before = seen(&wakes);
    loop {
        wakes = KERNEL.sleepers.wait(wakes).unwrap();
        if seen(&wakes) != before {
            return true;
        }
    }
}

pub(crate) use loom::sync::{Mutex, MutexGuard};

/// Locks `m` (loom's mutex does not poison).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap()
}

pub(crate) fn spin_loop() {
    loom::thread::yield_now();
}

/// Race detection over segment bytes: one loom cell per 8-byte word of every segment. The
/// writer registers a write of the words it fills, the reader a read of the words it views;
/// loom fails the model if the two are not ordered by happens-before (for instance because a
/// commit store was too weak).
pub(crate) struct ByteTracker {
    words_per_segment: usize,
    cells: Vec<loom::cell::UnsafeCell<()>>,
}

impl ByteTracker {
    pub(crate) fn new(segments: usize, segment_size: usize) -> Self {
        let words_per_segment = segment_size / 8;
        let cells = (0..segments * words_per_segment)
            .map(|_| loom::cell::UnsafeCell::new(()))
            .collect();
        ByteTracker {
            words_per_segment,
            cells,
        }
    }

    fn words(&self, seg: usize, off: usize, len: usize) -> &[loom::cell::UnsafeCell<()>] {
        let first = seg * self.words_per_segment + off / 8;
        let last = seg * self.words_per_segment + (off + len).div_ceil(8);
        &self.cells[first..last]
    }

    pub(crate) fn write(&self, seg: usize, off: usize, len: usize) {
        for c in self.words(seg, off, len) {
            c.with_mut(|_| ());
        }
    }

    pub(crate) fn read(&self, seg: usize, off: usize, len: usize) {
        for c in self.words(seg, off, len) {
            c.with(|_| ());
        }
    }
}

/// The asymmetric barrier, modelled as what it guarantees: a SeqCst fence on each side, the
/// notifier's between its publication and its load of the park word, and loom explores every
/// order of the two fences. (The heavy half puts the notifier's barrier at some point of its
/// execution; why a point before the publication or after the load gives no weaker outcome
/// is argued in docs/PROTOCOL.md.)
pub(crate) fn notifier_fence() {
    loom::sync::atomic::fence(super::Ordering::SeqCst);
}

/// The operating system, modelled: the futex above, the doorbell model, the asymmetric
/// barrier as a SeqCst fence (see [`notifier_fence`]), loom's yield, and a clock that moves
/// one step (`sys::clock::STEP`) at every look, so that every spin phase of production code ends after the
/// fewest looks it makes (each look is a scheduling point for loom) and the same code runs
/// deterministically in every execution.
pub(crate) struct Modelled;

impl super::Os for Modelled {
    type Bell = Bell;

    /// A sleep with a deadline times out: loom moves to another thread, and the clock moves
    /// by the nap, so that a `_timeout` call gives up after a few looks whoever else runs.
    /// (A wake-up that comes meanwhile is seen by the look after the sleep, as a real one
    /// would be.) Any other sleep lasts until it is woken.
    fn futex_wait(word: &FutexWord, expected: u32, timeout: Option<Duration>, deadline: bool) {
        if deadline {
            loom::thread::yield_now();
            crate::sys::clock::advance(timeout.unwrap_or(crate::sys::clock::STEP));
            return;
        }
        futex_wait(word, expected)
    }

    fn futex_wake(word: &FutexWord) {
        futex_wake(word)
    }

    fn ring(bell: &Bell) {
        bell.ring()
    }

    fn waiter_fence() -> bool {
        loom::sync::atomic::fence(super::Ordering::SeqCst);
        true
    }

    /// The models always use the light notification on the per-record path.
    fn light_notify_available() -> bool {
        true
    }

    fn yield_cpu() {
        loom::thread::yield_now();
    }

    /// Loom runs every modelled thread on one OS thread: there is no other CPU.
    fn other_cpus() -> bool {
        false
    }

    fn leave_cpu() -> bool {
        false
    }

    /// The modelled clock (`sys::clock`): one step per look.
    fn now() -> std::time::Instant {
        crate::sys::clock::now()
    }

    const POLLS_PER_CLOCK: u32 = 1;
}

impl super::AsyncOs for Modelled {
    fn in_runtime() -> bool {
        true
    }

    async fn yield_now() {
        let mut yielded = false;
        std::future::poll_fn(|cx| {
            if yielded {
                return std::task::Poll::Ready(());
            }
            yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        })
        .await
    }

    /// (Nothing to register in the model.)
    type Watch = ();

    unsafe fn rung<'a>(
        bell: &'a Bell,
        _watch: &'a mut Option<()>,
        timeout: Duration,
    ) -> impl std::future::Future<Output = std::io::Result<()>> + Send + 'a {
        bell.rung(timeout)
    }

    fn futex_waitv(words: &[(*const FutexWord, u32)], timeout: Option<Duration>) -> bool {
        futex_waitv(words, timeout)
    }
}
