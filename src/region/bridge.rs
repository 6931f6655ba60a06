//! The bridge between park words and async tasks: one thread per process (per
//! [`WORDS_PER_BRIDGE`] words waited on at once) sleeps on every park word that an async
//! waiter of this process announced itself on, with one `futex_waitv`, and wakes the task
//! when its word changes.
//!
//! It serves the waits that cannot use a doorbell (a socket registered with the runtime's
//! reactor, see `park`): regions opened by name, where no descriptor travels with the region
//! and any process of the user may attach; anonymous regions opened from a bare descriptor,
//! or whose peer has not attached yet; and tasks of executors other than tokio's. Why a thread that waits on the futex words for these, rather than handing a
//! doorbell over a Unix socket: the notifiers stay exactly as they are. A notifier, in any
//! process, sync or async, wakes a parked peer with `FUTEX_WAKE` on the park word, which wakes
//! a thread in `FUTEX_WAIT` and the bridge in `futex_waitv` alike; it needs no descriptor of
//! the waiter's, so a named region needs no rendezvous beside its name, a peer that restarts
//! and reopens it needs none either, and the per-record path of the producer pays nothing for
//! async consumers. The price is one thread per process, asleep unless a word changes, and one
//! more wake-up per sleep (the bridge wakes the task's runtime thread), which the doorbell
//! saves.
//!
//! The protocol, for a task T waiting on word P of the region, and the bridge B:
//!
//! ```text
//! T: announce on P (as a thread would: protocol::park::wait_async); re-check; register (P, v) with B:
//!    lock; push entry; unlock; fetch_add(nudge, 1) (Release); wake(nudge)
//! B: g = load(nudge) (Acquire); lock; for each entry: if load(P) != v, wake its task and
//!    drop it; unlock; futex_waitv([nudge = g, P1 = v1, …]); repeat
//! ```
//!
//! SYNC POINT: T's push + Release increment of the nudge word ↔ B's Acquire load of it before it
//! takes the list. If B's load reads the increment, its list holds T's entry; if not, the
//! nudge word differs from `g` when the kernel looks, or T's wake comes after B sleeps: either
//! way B takes the list again. And for the entry's word: B loads P after T's announcement
//! (the mutex orders them); if the notifier's RMW that clears `PARKED` comes before B's look,
//! B sees the change and wakes T; if after, the kernel sees P changed when B goes to sleep, or
//! the notifier's `FUTEX_WAKE` finds B asleep. No wake-up is lost.
//!
//! Memory: B reads a word only while its entry is in the list, under the lock; a task's future
//! removes its entry under the same lock before it completes or is dropped, and holds an `Arc`
//! of the word's region meanwhile (a future leaked with `mem::forget` leaks the mapping too:
//! [`Bridges::sleep`] is `unsafe` for this). B's `futex_waitv` may still hold the address of a word
//! whose region was unmapped since: the kernel then fails the call or compares other memory
//! (a spurious return, or a sleep until a nudge or a timeout), and writes nothing.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::region::os::Host;
use crate::sync::{lock, Arc, AsyncOs, FutexWord, Mutex, Ordering, Os};

/// Words one bridge waits on at most (`futex_waitv` takes 128; one is the bridge's nudge word).
const WORDS_PER_BRIDGE: usize = 127;

/// How often a bridge looks at its words where the kernel has no `futex_waitv` (before Linux
/// 5.16).
#[cfg(not(shmflow_loom))]
const POLL_WITHOUT_WAITV: Duration = Duration::from_millis(1);

/// One entry: a task waiting for a word to change.
struct Entry {
    id: u64,
    /// The word: alive while the entry is in the list (the contract of [`Bridges::sleep`]).
    word: *const FutexWord,
    /// What the word held when the task announced itself.
    expected: u32,
    /// The task to wake.
    waker: Waker,
    /// When the task wants to look anyway (its peer's liveness), even if nothing changed.
    #[cfg(not(shmflow_loom))]
    due: std::time::Instant,
}

// SAFETY: `word` is only read (atomically, through `&FutexWord`, which is `Sync`) while the
// entry is in the list, where the memory is alive (the contract of `Bridges::sleep`): the entry
// may move to the bridge thread.
unsafe impl Send for Entry {}

impl Entry {
    fn word(&self) -> &FutexWord {
        // SAFETY: an entry in the list points to a live word (the contract of `Bridges::sleep`).
        unsafe { &*self.word }
    }
}

#[derive(Default)]
struct State {
    entries: Vec<Entry>,
    next_id: u64,
    #[cfg(shmflow_loom)]
    stop: bool,
}

/// One bridge thread's list and nudge word.
pub(crate) struct Bridge {
    /// The bridge's own futex word, the first of every wait: bumped and woken by every change
    /// of the list.
    nudge: FutexWord,
    state: Mutex<State>,
}

impl Bridge {
    fn new() -> Bridge {
        Bridge {
            nudge: FutexWord::default(),
            state: Mutex::new(State::default()),
        }
    }

    /// Nudges the bridge: it takes its list again. SYNC POINT: the Release increment
    /// ↔ the bridge's Acquire load at the top of its loop (see the module docs).
    fn nudge(&self) {
        self.nudge.atomic().fetch_add(1, Ordering::Release);
        Host::futex_wake(&self.nudge);
    }

    fn register(&self, word: &FutexWord, expected: u32, nap: Duration, waker: Waker) -> u64 {
        let id;
        {
            let mut st = lock(&self.state);
            id = st.next_id;
            st.next_id += 1;
            #[cfg(shmflow_loom)]
            let _ = nap;
            st.entries.push(Entry {
                id,
                word,
                expected,
                waker,
                #[cfg(not(shmflow_loom))]
                due: std::time::Instant::now() + nap,
            });
        }
        self.nudge();
        id
    }

    fn len(&self) -> usize {
        lock(&self.state).entries.len()
    }

    /// Serves the list until the process ends (under loom: until `Bridge::stop`).
    pub(crate) fn serve(&self) {
        // The nudge word first, then every word waited on.
        let mut list: Vec<(*const FutexWord, u32)> = Vec::new();
        #[cfg(not(shmflow_loom))]
        let mut waitv = true;
        loop {
            // SYNC POINT: Acquire, pairs with the Release increment in `nudge`.
            #[cfg(not(shmflow_broken = "bridge_late_nudge"))]
            let gen = self.nudge.atomic().load(Ordering::Acquire);
            let mut wake = Vec::new();
            #[cfg(not(shmflow_loom))]
            let mut timeout: Option<Duration> = None;
            {
                let mut st = lock(&self.state);
                #[cfg(shmflow_loom)]
                if st.stop {
                    return;
                }
                #[cfg(not(shmflow_loom))]
                let now = std::time::Instant::now();
                st.entries.retain(|e| {
                    let changed = crate::protocol::park::changed(e.word(), e.expected);
                    #[cfg(not(shmflow_loom))]
                    let changed = changed || now >= e.due;
                    if changed {
                        wake.push(e.waker.clone());
                        return false;
                    }
                    #[cfg(not(shmflow_loom))]
                    {
                        let left = e.due - now;
                        timeout = Some(timeout.map_or(left, |t: Duration| t.min(left)));
                    }
                    true
                });
                list.clear();
                list.push((&self.nudge, 0));
                list.extend(st.entries.iter().map(|e| (e.word, e.expected)));
            }
            for w in wake {
                w.wake();
            }
            // Broken on purpose (loom only): the nudge word read after the list was taken lets a
            // registration made in between go unseen.
            #[cfg(shmflow_broken = "bridge_late_nudge")]
            let gen = self.nudge.atomic().load(Ordering::Acquire);
            list[0].1 = gen;
            #[cfg(not(shmflow_loom))]
            {
                if waitv {
                    waitv = Host::futex_waitv(&list, timeout);
                }
                if !waitv {
                    // No futex_waitv: sleep on the nudge word and look at the words every
                    // millisecond.
                    let nap = if list.len() == 1 {
                        timeout
                    } else {
                        Some(timeout.map_or(POLL_WITHOUT_WAITV, |t| t.min(POLL_WITHOUT_WAITV)))
                    };
                    Host::futex_wait(&self.nudge, gen, nap, false);
                }
            }
            #[cfg(shmflow_loom)]
            Host::futex_waitv(&list, None);
        }
    }

    /// Ends [`Bridge::serve`] (loom models only).
    #[cfg(shmflow_loom)]
    pub(crate) fn stop(&self) {
        lock(&self.state).stop = true;
        self.nudge();
    }
}

/// How many times this process's line of descent went through `fork` (in a child made by
/// `fork`, one more than in its parent): a [`Sleep`] registered under another count was
/// registered with a bridge of the parent, which no thread serves here. Relaxed: set in the
/// child's handler while it has one thread, read by its threads started after.
#[cfg(not(shmflow_loom))]
static FORKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[cfg(not(shmflow_loom))]
fn fork_count() -> u64 {
    FORKS.load(Ordering::Relaxed)
}

/// (Loom models do not fork.)
#[cfg(shmflow_loom)]
fn fork_count() -> u64 {
    0
}

#[cfg(not(shmflow_loom))]
thread_local! {
    /// The list of bridges, held by the forking thread across a `fork` ([`on_fork_prepare`]).
    static HELD_FOR_FORK: std::cell::RefCell<Option<crate::sync::MutexGuard<'static, Vec<Arc<Bridge>>>>> =
        const { std::cell::RefCell::new(None) };
}

/// Before a `fork`: a task of another thread may hold the list while it registers, and a
/// child that inherited it held would hang at its first async wait. The forking thread holds
/// it across the fork instead. (A thread whose locals are gone takes no part.)
#[cfg(not(shmflow_loom))]
extern "C" fn on_fork_prepare() {
    let _ = HELD_FOR_FORK.try_with(|h| *h.borrow_mut() = Some(lock(&Bridges::global().list)));
}

/// After a `fork`, in the parent: the list is released.
#[cfg(not(shmflow_loom))]
extern "C" fn on_fork_parent() {
    let _ = HELD_FOR_FORK.try_with(|h| drop(h.borrow_mut().take()));
}

/// After a `fork`, in the child (its only thread): the list is released and the count of
/// forks moved on. Only the unlock and an atomic store: what a child of a threaded process may
/// do.
#[cfg(not(shmflow_loom))]
extern "C" fn on_fork_child() {
    let _ = HELD_FOR_FORK.try_with(|h| drop(h.borrow_mut().take()));
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// The bridges of a process: a new one (and its thread) for every [`WORDS_PER_BRIDGE`] words
/// waited on at once.
pub(crate) struct Bridges {
    list: Mutex<Vec<Arc<Bridge>>>,
    /// The process that started the bridges in `list`. A child made by `fork` inherits the
    /// list but not the threads that serve it: its first registration finds another pid and
    /// starts afresh. Relaxed: read and written under the lock of `list`.
    #[cfg(not(shmflow_loom))]
    started_in: std::sync::atomic::AtomicU32,
    /// [`fork_count`] in the process that started them: a child made by `fork` may get a pid
    /// that an ended process had, never the count its parent had. Relaxed, under the lock.
    #[cfg(not(shmflow_loom))]
    started_forks: std::sync::atomic::AtomicU64,
}

impl Bridges {
    /// The process's bridges.
    #[cfg(not(shmflow_loom))]
    pub(crate) fn global() -> &'static Bridges {
        // A plain static, made at compile time: no initialization that a `fork` in another
        // thread could catch half-way and leave a child waiting on for good.
        static GLOBAL: Bridges = Bridges {
            list: Mutex::new(Vec::new()),
            started_in: std::sync::atomic::AtomicU32::new(0),
            started_forks: std::sync::atomic::AtomicU64::new(0),
        };
        &GLOBAL
    }

    /// Registers the `fork` handlers, once per process, before the list is first locked for a
    /// registration. A flag, not a `Once`: a `Once` caught running by a `fork` would leave the
    /// child waiting on it. (A thread that finds the flag set while another is still
    /// registering goes on: a fork in that moment goes without the handlers, as does one
    /// where the system refused them.)
    #[cfg(not(shmflow_loom))]
    fn register_fork_handlers() {
        static REGISTERED: std::sync::atomic::AtomicBool =
            std::sync::atomic::AtomicBool::new(false);
        if !REGISTERED.swap(true, Ordering::Relaxed) {
            let _ = crate::sys::fork::at_fork(on_fork_prepare, on_fork_parent, on_fork_child);
        }
    }

    /// The model's bridges: one bridge, served by the model in a thread of its own
    /// ([`Bridges::first`], [`Bridge::serve`]); fresh in every execution.
    #[cfg(shmflow_loom)]
    pub(crate) fn global() -> &'static Bridges {
        loom::lazy_static! {
            static ref GLOBAL: Bridges = Bridges {
                list: Mutex::new(vec![Arc::new(Bridge::new())]),
            };
        }
        &GLOBAL
    }

    /// The first bridge (loom models serve it themselves).
    #[cfg(shmflow_loom)]
    pub(crate) fn first(&self) -> Arc<Bridge> {
        lock(&self.list)[0].clone()
    }

    /// Registers a task waiting on `word` with a bridge that has room for it (started if
    /// need be). The list stays locked until the entry is in, so that no bridge ever holds
    /// more than [`WORDS_PER_BRIDGE`] entries.
    fn register(
        &self,
        word: &FutexWord,
        expected: u32,
        nap: Duration,
        waker: Waker,
    ) -> std::io::Result<(Arc<Bridge>, u64)> {
        #[cfg(not(shmflow_loom))]
        Bridges::register_fork_handlers();
        #[cfg_attr(shmflow_loom, allow(unused_mut))]
        let mut list = lock(&self.list);
        #[cfg(not(shmflow_loom))]
        {
            let me = std::process::id();
            let forks = fork_count();
            let pid_moved = self.started_in.swap(me, Ordering::Relaxed) != me;
            if self.started_forks.swap(forks, Ordering::Relaxed) != forks || pid_moved {
                // The parent's bridges, if this process was forked with some: no thread serves
                // them here. Leaked, not dropped: their entries hold the parent's wakers,
                // whose drop could run the parent's tasks' destructors in this process.
                std::mem::forget(std::mem::take(&mut *list));
            }
        }
        let bridge = match list.iter().find(|b| b.len() < WORDS_PER_BRIDGE) {
            Some(b) => b.clone(),
            None => {
                #[cfg(not(shmflow_loom))]
                {
                    let b = Arc::new(Bridge::new());
                    let served = b.clone();
                    std::thread::Builder::new()
                        .name("shmflow-bridge".into())
                        .spawn(move || served.serve())?;
                    list.push(b.clone());
                    b
                }
                #[cfg(shmflow_loom)]
                list[0].clone()
            }
        };
        let id = bridge.register(word, expected, nap, waker);
        drop(list);
        Ok((bridge, id))
    }

    /// Sleeps until `word` no longer holds `expected`, or `nap` has passed, without blocking
    /// the thread: the future completes when the bridge sees the change. Dropping it withdraws
    /// the request.
    ///
    /// # Safety
    /// The bridge thread reads `word` until the future completes or is dropped; a future that
    /// is leaked (`mem::forget`) is never withdrawn. `word` must stay in memory that long: in
    /// the callers it lives in a region mapped by an `Arc` that the same future owns, so a
    /// leaked future leaks the mapping with it.
    pub(crate) unsafe fn sleep<'a>(
        &'a self,
        word: &'a FutexWord,
        expected: u32,
        nap: Duration,
    ) -> Sleep<'a> {
        Sleep {
            bridges: self,
            word,
            expected,
            nap,
            reg: None,
        }
    }
}

impl crate::protocol::park::Watcher for Bridges {
    unsafe fn watch<'a>(
        &'a self,
        word: &'a FutexWord,
        expected: u32,
        nap: Duration,
    ) -> impl Future<Output = std::io::Result<()>> + Send + 'a {
        // SAFETY: the caller holds `watch`'s contract, which is `sleep`'s (the word stays in
        // memory until the future completes or is dropped).
        unsafe { self.sleep(word, expected, nap) }
    }
}

/// See [`Bridges::sleep`].
pub(crate) struct Sleep<'a> {
    bridges: &'a Bridges,
    word: &'a FutexWord,
    expected: u32,
    nap: Duration,
    /// The bridge and entry, once registered, and [`fork_count`] then.
    reg: Option<(Arc<Bridge>, u64, u64)>,
}

impl Sleep<'_> {
    /// Forgets a registration made before a `fork` that made this process: its bridge is the
    /// parent's, served by no thread here, and its entry is left there untouched (its lock
    /// may have been copied held; the bridge and the parent's wakers in it are never dropped
    /// here, see `Bridges::register`). A registration of this process stays in place.
    fn forget_inherited(&mut self) {
        if self.reg.as_ref().is_some_and(|r| r.2 != fork_count()) {
            if let Some((bridge, _, _)) = self.reg.take() {
                std::mem::forget(bridge);
            }
        }
    }
}

impl Future for Sleep<'_> {
    /// `Err` if no bridge thread could be started.
    type Output = std::io::Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        // A wait inherited through `fork` registers again, with a bridge of this process.
        this.forget_inherited();
        match &this.reg {
            None => {
                let (bridge, id) = this.bridges.register(
                    this.word,
                    this.expected,
                    this.nap,
                    cx.waker().clone(),
                )?;
                this.reg = Some((bridge, id, fork_count()));
                Poll::Pending
            }
            Some((bridge, id, _)) => {
                let mut st = lock(&bridge.state);
                match st.entries.iter_mut().find(|e| e.id == *id) {
                    // Gone from the list: the bridge woke us.
                    None => {
                        drop(st);
                        this.reg = None;
                        Poll::Ready(Ok(()))
                    }
                    Some(e) => {
                        if !e.waker.will_wake(cx.waker()) {
                            e.waker = cx.waker().clone();
                        }
                        Poll::Pending
                    }
                }
            }
        }
    }
}

impl Drop for Sleep<'_> {
    fn drop(&mut self) {
        self.forget_inherited();
        if let Some((bridge, id, _)) = self.reg.take() {
            let mut st = lock(&bridge.state);
            if let Some(i) = st.entries.iter().position(|e| e.id == id) {
                // Out of the list before the word's region can go (see the module docs); the
                // bridge stops waiting on it at its next look.
                st.entries.swap_remove(i);
                drop(st);
                bridge.nudge();
            }
        }
    }
}

impl std::fmt::Debug for Sleep<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sleep")
            .field("expected", &self.expected)
            .field("registered", &self.reg.is_some())
            .finish()
    }
}
