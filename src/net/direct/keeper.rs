//! The keeper of a direct end: the thread that sends heartbeats while the end is silent and
//! does the end's chores (reading credit, forwarding, filling) while its thread is away.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::net::wire::Msg;
use crate::protocol::flush_signal::FlushSignal;

use super::sock::Sock;

/// Work the keeper does for an end while its thread is away (see [`Keeper`]); false once
/// the end has nothing more to say (the keeper then ends, with no heartbeat after).
pub(crate) type Chore = Box<dyn FnMut() -> bool + Send>;

/// What the keeper's thread is told, under its lock.
#[derive(Default)]
struct Orders {
    /// The buffer timeout (`FlushPolicy::Timeout`) the end defers records with, once it
    /// does: the keeper then looks every interval while records come.
    interval: Option<Duration>,
}

/// How long an end's thread makes no call before its keeper takes over what waits for
/// credit. A producer that stops calling adds between one and two of these to the wait of its
/// last segments (on top of the credit's own: the keeper's look restarts when a call lands
/// in it); a producer that keeps calling pays nothing for it, and looks for credit itself
/// (at least once per `AWAY` while it has none).
pub(crate) const AWAY: Duration = Duration::from_micros(500);

/// Waits until the end's thread has made no call (`calls` unchanged) for [`AWAY`]: true then,
/// false as soon as `done` says the wait is moot (the keeper is stopped, nothing waits any
/// more, a heartbeat is due: a thread that keeps calling without credit writes nothing). The
/// keeper's thread sleeps meanwhile (`park_timeout`: a wake or a stop cuts a sleep short and
/// the loop looks again).
fn away(calls: &AtomicU64, done: impl Fn() -> bool) -> bool {
    loop {
        // Relaxed: pairs with the Relaxed store of `Keeper::touch`, a hint with nothing
        // published through it: a stale count only moves when the keeper takes the end's
        // mutex (which orders everything it then reads), never what it does under it.
        let before = calls.load(Ordering::Relaxed);
        let start = Instant::now();
        while start.elapsed() < AWAY {
            std::thread::park_timeout(AWAY - start.elapsed().min(AWAY));
            if done() {
                return false;
            }
        }
        if calls.load(Ordering::Relaxed) == before {
            return true;
        }
    }
}

/// The keeper of a direct end: a thread that sends a heartbeat whenever the end has written
/// nothing for `every`, so that the peer does not take an end whose thread is busy elsewhere
/// as dead; and runs its end's [`Chore`] (a sending end's reads what the receiver said and
/// forwards what is published; a receiving end's, if its consumer's thread is away, announces
/// credit and fills the end's segments from the socket)
/// - before each heartbeat it sends (the end silent for `every`), so that an idle end still
///   reads what its peer says;
/// - for a sending end, whenever the socket has something to read while `pending` is set
///   (segments waiting for credit when the producer's thread returned before the credit
///   came) and the end's thread has made no call for [`AWAY`] (a thread that keeps calling
///   hears its credit itself: were the keeper to forward meanwhile, the two would take turns
///   at the end's lock and at the CPUs, each turn a wake-up), and
/// - for a sending end, once per buffer timeout while records are deferred
///   (`FlushPolicy::Timeout`): the end marks each deferred record in a [`FlushSignal`], the
///   hand-off of the local buffer-timeout flusher (its loom model covers it), and the keeper
///   takes the mark each interval, and sleeps (until a mark, a heartbeat or the stop) when
///   there was none.
///
/// Stopped and joined on drop.
pub(crate) struct Keeper {
    /// Calls of the end's thread ([`Keeper::touch`]): the keeper takes the end for away
    /// once this stays the same for [`AWAY`].
    calls: Arc<CachePadded<AtomicU64>>,
    orders: Arc<(Mutex<Orders>, Condvar)>,
    stop: Arc<AtomicBool>,
    signal: Arc<FlushSignal>,
    /// The interval last told (so that a deferral takes the lock only when it changes).
    interval: Option<Duration>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Keeper {
    /// `pending`: the flag of [`Keeper::wake`] (never set for an end without a chore).
    pub(crate) fn start(
        sock: Arc<Sock>,
        every: Duration,
        pending: Arc<CachePadded<AtomicBool>>,
        mut chore: Option<Chore>,
    ) -> std::io::Result<Keeper> {
        let orders = Arc::new((Mutex::new(Orders::default()), Condvar::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let signal = Arc::new(FlushSignal::default());
        let calls = Arc::new(CachePadded::new(AtomicU64::new(0)));
        let (o, p, st, sig, n) = (
            orders.clone(),
            pending.clone(),
            stop.clone(),
            signal.clone(),
            calls.clone(),
        );
        let thread = std::thread::Builder::new()
            .name("shmflow-keeper".into())
            .spawn(move || {
                let (lock, cv) = &*o;
                let heartbeat_due = || {
                    let now = sock.epoch.elapsed().as_millis() as u64;
                    let last = sock.last_write_ms.load(Ordering::Relaxed);
                    now.saturating_sub(last) >= every.as_millis() as u64
                };
                // A heartbeat failed: none are sent any more.
                let mut mute = false;
                loop {
                    let interval = {
                        let mut g = lock.lock().unwrap_or_else(|p| p.into_inner());
                        // Relaxed: hints; the chore looks at the state itself, under its lock,
                        // and every change is followed by a notify under this lock (or, for
                        // the stop, an unpark too), so no wake-up is lost.
                        if !st.load(Ordering::Relaxed) && !p.load(Ordering::Relaxed) {
                            let wait = g.interval.map_or(every, |d| d.min(every));
                            g = cv
                                .wait_timeout(g, wait)
                                .unwrap_or_else(|p| p.into_inner())
                                .0;
                        }
                        g.interval
                    };
                    if st.load(Ordering::Relaxed) {
                        return;
                    }
                    if let Some(chore) = chore.as_mut() {
                        if interval.is_some() {
                            if sig.take() && !chore() {
                                return;
                            } else {
                                // Nothing deferred for an interval: sleep until the end marks
                                // a record, segments wait for credit, a heartbeat is due, or
                                // the stop (`wake` and `stop` unpark too).
                                sig.sleep(
                                    || {
                                        st.load(Ordering::Relaxed)
                                            || p.load(Ordering::Relaxed)
                                            || heartbeat_due()
                                    },
                                    || std::thread::park_timeout(every),
                                );
                            }
                        }
                        if p.load(Ordering::Relaxed)
                            && away(&n, || {
                                // Relaxed: hints, as above (the chore looks at the state
                                // under its lock). A muted keeper sends no heartbeat: one
                                // due must not cut this wait short for ever.
                                st.load(Ordering::Relaxed)
                                    || !p.load(Ordering::Relaxed)
                                    || (!mute && heartbeat_due())
                            })
                        {
                            // Until the peer says something (credit), or a heartbeat is due.
                            if let Ok(true) =
                                crate::sys::sock::wait_readable(sock.stream.as_fd(), every)
                            {
                                if !chore() {
                                    return;
                                }
                            }
                        }
                    }
                    if heartbeat_due() {
                        // An end silent for a heartbeat interval reads what its peer said
                        // meanwhile (heartbeats, credit, records, the channel's end): nothing
                        // else reads while its stage makes no call, and over a long silence
                        // the peer's heartbeats would fill this side's socket buffers until
                        // the peer's keeper, unable to write, took the link for stalled.
                        if let Some(chore) = chore.as_mut() {
                            if !p.load(Ordering::Relaxed) && !chore() {
                                return;
                            }
                        }
                        if !mute && sock.send(&Msg::Heartbeat).is_err() {
                            // The end's own calls find out. An end with a chore may still
                            // have reading to do (its writing side failed first): the chore
                            // goes on, with no more heartbeats, until it says it is done.
                            if chore.is_none() {
                                return;
                            }
                            mute = true;
                        }
                    }
                }
            })?;
        Ok(Keeper {
            calls,
            orders,
            stop,
            signal,
            interval: None,
            thread: Some(thread),
        })
    }

    /// The end's thread made a call (see [`AWAY`]).
    #[inline]
    pub(crate) fn touch(&self) {
        // Relaxed: pairs with the Relaxed loads in `away`; a hint of activity, nothing is
        // published through it (the end's mutex orders the state).
        self.calls.store(
            self.calls.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Relaxed,
        );
    }

    /// Wakes the keeper to look at its `pending` flag (set and cleared by whoever holds the
    /// end's state, the chore included; this after setting it).
    pub(crate) fn wake(&self) {
        let (lock, cv) = &*self.orders;
        {
            let _g = lock.lock().unwrap_or_else(|p| p.into_inner());
            cv.notify_one();
        }
        // It may sleep on the flush signal rather than on the condvar.
        if let Some(t) = self.thread.as_ref() {
            t.thread().unpark();
        }
    }

    /// A record was published and not forwarded: the keeper forwards it within `interval`
    /// if nothing else does (one atomic swap, and an unpark only when the keeper sleeps).
    #[inline]
    pub(crate) fn defer(&mut self, interval: Duration) {
        let thread = self.thread.as_ref().map(|t| t.thread());
        self.signal.mark(|| {
            if let Some(t) = thread {
                t.unpark();
            }
        });
        if self.interval != Some(interval) {
            self.set_interval(interval);
        }
    }

    #[cold]
    fn set_interval(&mut self, interval: Duration) {
        self.interval = Some(interval);
        let (lock, cv) = &*self.orders;
        lock.lock().unwrap_or_else(|p| p.into_inner()).interval = Some(interval);
        cv.notify_one();
    }

    /// Stops the keeper (the end has nothing more to say).
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        {
            let (lock, cv) = &*self.orders;
            let _g = lock.lock().unwrap_or_else(|p| p.into_inner());
            cv.notify_one();
        }
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.stop();
    }
}
