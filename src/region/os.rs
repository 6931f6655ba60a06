//! The operating system as the protocol layer's waits need it ([`Os`], [`AsyncOs`]): futexes on
//! the region's park words, the doorbells of anonymous regions, the membarrier of the light
//! notification, the clock and the CPU. [`Host`] is the one the library runs on: [`Kernel`],
//! or under `--cfg shmflow_loom` the loom model (`sync::model::Modelled`).

#[cfg(all(feature = "tokio", not(shmflow_loom)))]
use crate::sync::AsyncOs;
#[cfg(not(shmflow_loom))]
use crate::sync::FutexWord;
use crate::sync::Os;

/// The operating system the library waits on.
#[cfg(not(shmflow_loom))]
pub(crate) type Host = Kernel;
/// The operating system the library waits on: the loom model.
#[cfg(shmflow_loom)]
pub(crate) type Host = crate::sync::Modelled;

/// The doorbell of the host.
pub(crate) type Bell = <Host as Os>::Bell;

/// Linux: `FUTEX_WAIT`/`FUTEX_WAKE` on the word in the mapping, a datagram on the doorbell,
/// `membarrier(GLOBAL_EXPEDITED)`, `sched_yield`, `sched_setaffinity` (a move off a shared
/// CPU), `CLOCK_MONOTONIC` (`sys`).
#[cfg(not(shmflow_loom))]
#[derive(Debug)]
pub(crate) struct Kernel;

#[cfg(not(shmflow_loom))]
impl Os for Kernel {
    type Bell = Doorbell;

    #[inline]
    fn futex_wait(
        word: &FutexWord,
        expected: u32,
        timeout: Option<std::time::Duration>,
        _deadline: bool,
    ) {
        crate::sys::futex::wait(word.atomic(), expected, timeout);
    }

    #[inline]
    fn futex_wake(word: &FutexWord) {
        crate::sys::futex::wake(word.atomic());
    }

    #[inline]
    fn ring(bell: &Doorbell) {
        bell.ring();
    }

    fn waiter_fence() -> bool {
        crate::sys::membarrier::global_expedited()
    }

    fn light_notify_available() -> bool {
        crate::sys::membarrier::register()
    }

    #[inline]
    fn yield_cpu() {
        std::thread::yield_now();
    }

    fn other_cpus() -> bool {
        crate::sys::cpu::other_cpus_allowed()
    }

    fn leave_cpu() -> bool {
        crate::sys::cpu::leave_this_cpu()
    }

    #[inline]
    fn now() -> std::time::Instant {
        std::time::Instant::now()
    }

    const POLLS_PER_CLOCK: u32 = 16;
}

#[cfg(all(feature = "tokio", not(shmflow_loom)))]
impl AsyncOs for Kernel {
    fn in_runtime() -> bool {
        tokio::runtime::Handle::try_current().is_ok()
    }

    fn yield_now() -> impl std::future::Future<Output = ()> + Send {
        tokio::task::yield_now()
    }

    type Watch = BellWatch;

    unsafe fn rung<'a>(
        bell: &'a Doorbell,
        watch: &'a mut Option<BellWatch>,
        timeout: std::time::Duration,
    ) -> impl std::future::Future<Output = std::io::Result<()>> + Send + 'a {
        // SAFETY: the caller's contract is `rung`'s.
        unsafe { bell.rung(watch, timeout) }
    }

    fn futex_waitv(
        words: &[(*const FutexWord, u32)],
        timeout: Option<std::time::Duration>,
    ) -> bool {
        // `FutexWord` is `repr(transparent)` over the `AtomicU32`: same address.
        let raw: Vec<(*const crate::sync::AtomicU32, u32)> = words
            .iter()
            .map(|&(w, v)| (w as *const crate::sync::AtomicU32, v))
            .collect();
        crate::sys::futex::waitv(&raw, timeout) != crate::sys::futex::Waitv::Unsupported
    }
}

/// A doorbell: a connected pair of Unix datagram sockets shared with the peer process
/// (`sys::bell`). A notifier rings it for a waiter that announced it sleeps on it rather than
/// on the futex word (an async task, asleep in its runtime's reactor).
#[cfg(not(shmflow_loom))]
#[derive(Debug)]
pub(crate) struct Doorbell {
    /// The end a waiter watches.
    wait: std::os::fd::OwnedFd,
    /// The end notifiers ring.
    ring: std::os::fd::OwnedFd,
}

#[cfg(not(shmflow_loom))]
impl Doorbell {
    /// A fresh doorbell.
    pub(crate) fn new() -> std::io::Result<Doorbell> {
        let (wait, ring) = crate::sys::bell::create()?;
        Ok(Doorbell { wait, ring })
    }

    /// A doorbell from the two ends handed over by the peer (checked by the caller).
    pub(crate) fn from_fds(wait: std::os::fd::OwnedFd, ring: std::os::fd::OwnedFd) -> Doorbell {
        Doorbell { wait, ring }
    }

    /// The two ends (wait, ring), to hand to a child.
    pub(crate) fn fds(&self) -> [std::os::fd::BorrowedFd<'_>; 2] {
        use std::os::fd::AsFd;
        [self.wait.as_fd(), self.ring.as_fd()]
    }

    /// Rings: the waiter's reactor sees the wait end readable. Never blocks.
    pub(crate) fn ring(&self) {
        use std::os::fd::AsFd;
        crate::sys::bell::ring(self.ring.as_fd());
    }

    /// Waits in the current tokio runtime's reactor until the bell rings (a ring since the
    /// last wait counts) or `timeout` passes, and takes the rings. The wait end is registered
    /// with the reactor at the first call of a wait, in `watch`, and stays registered for
    /// the wait's next calls (each registration costs two system calls). The runtime needs
    /// its IO and time drivers (`enable_io`, `enable_time`; `#[tokio::main]` enables both).
    ///
    /// # Safety
    /// `watch` is dropped before `self` (it names `self`'s descriptor without owning it),
    /// and is used with `self` only.
    #[cfg(feature = "tokio")]
    pub(crate) async unsafe fn rung(
        &self,
        watch: &mut Option<BellWatch>,
        timeout: std::time::Duration,
    ) -> std::io::Result<()> {
        use std::os::fd::{AsFd, AsRawFd};
        use tokio::io::unix::AsyncFd;
        use tokio::io::Interest;
        let reg = match watch {
            Some(w) => &w.reg,
            None => {
                // SAFETY: the descriptor is `self.wait`, open as long as `self`; the
                // registration lives in `watch`, which the caller drops before `self`, and
                // deregisters when dropped.
                let reg = unsafe {
                    AsyncFd::register_with_interest(Raw(self.wait.as_raw_fd()), Interest::READABLE)
                }?;
                &watch.insert(BellWatch { reg }).reg
            }
        };
        let wait = async {
            loop {
                let mut ready = reg.readable().await?;
                if crate::sys::bell::drain(self.wait.as_fd()) {
                    return Ok::<(), std::io::Error>(());
                }
                ready.clear_ready();
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(r) => r,
            Err(_) => Ok(()),
        }
    }
}

/// A doorbell's wait end as registered with a tokio runtime's reactor, for one wait (see
/// [`Doorbell::rung`]): it names the doorbell's descriptor, and is dropped before it.
#[cfg(all(feature = "tokio", not(shmflow_loom)))]
pub(crate) struct BellWatch {
    reg: tokio::io::unix::AsyncFd<Raw>,
}

/// A descriptor's number, for a registration that must not close it (the doorbell owns it).
#[cfg(all(feature = "tokio", not(shmflow_loom)))]
struct Raw(std::os::fd::RawFd);

#[cfg(all(feature = "tokio", not(shmflow_loom)))]
impl std::os::fd::AsRawFd for Raw {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0
    }
}

#[cfg(all(test, not(shmflow_loom)))]
mod park_tests {
    //! `protocol::park` on the real OS: wake-ups across threads, deadlines, the word's bits.
    use super::Kernel;
    use crate::error::{Halt, NotNow, TimedOut};
    use crate::protocol::park::*;
    use crate::sync::{AtomicU32, FutexWord, Ordering};
    use std::convert::Infallible;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    fn word() -> FutexWord {
        FutexWord(AtomicU32::new(0))
    }

    /// A poll that yields once `flag` is set.
    fn ready(flag: &AtomicBool) -> impl FnMut(Look) -> Result<Option<()>, Infallible> + '_ {
        // Acquire: pairs with the Release store that publishes the flag.
        move |_| Ok(flag.load(Ordering::Acquire).then_some(()))
    }

    #[test]
    fn nobody_parked_means_no_wake() {
        let w = word();
        assert!(!notify::<Kernel>(&w, None));
        assert!(!notify_light::<Kernel>(&w, || None));
        assert_eq!(w.atomic().load(Ordering::Relaxed), 0);
    }

    /// The handshake on the real kernel: the waiter announces, the notifier sees the
    /// announcement (`notify` returns true) and clears it, and the waiter ends with the value.
    /// A lost wake-up would not fail this test (the waiter looks again after its 40 ms nap):
    /// that is the loom models' job, which explore every interleaving.
    #[test]
    fn a_parked_waiter_is_woken_by_the_notification_after_the_publication() {
        for strategy in [WaitStrategy::Park, WaitStrategy::Block] {
            let (w, flag) = (word(), AtomicBool::new(false));
            std::thread::scope(|s| {
                let waiter = s.spawn(|| {
                    wait_for::<Kernel, _, _, _>(
                        &w,
                        strategy,
                        Forever,
                        Notifier::Rmw,
                        Pace::Sparse,
                        ready(&flag),
                    )
                });
                // Wait until the waiter has announced itself, then publish and notify.
                while w.atomic().load(Ordering::Acquire) & PARKED == 0 {
                    std::thread::yield_now();
                }
                flag.store(true, Ordering::Release);
                assert!(
                    notify::<Kernel>(&w, None),
                    "{strategy:?}: the waiter announced itself"
                );
                waiter.join().unwrap().unwrap();
            });
            assert_eq!(w.atomic().load(Ordering::Relaxed) & PARKED, 0);
        }
    }

    #[test]
    fn deadlines_end_the_wait_with_the_right_error() {
        let (w, flag) = (word(), AtomicBool::new(false));
        let now = wait_for::<Kernel, _, _, _>(
            &w,
            WaitStrategy::Block,
            Immediately,
            Notifier::Rmw,
            Pace::Sparse,
            ready(&flag),
        );
        assert!(matches!(now, Err(Halt::Expired(NotNow))));
        let later = wait_for::<Kernel, _, _, _>(
            &w,
            WaitStrategy::Park,
            Until::after(Duration::from_millis(5)),
            Notifier::Rmw,
            Pace::Sparse,
            ready(&flag),
        );
        assert!(matches!(later, Err(Halt::Expired(TimedOut))));
        assert_eq!(w.atomic().load(Ordering::Relaxed) & PARKED, 0, "withdrawn");
        flag.store(true, Ordering::Release);
        let there = wait_for::<Kernel, _, _, _>(
            &w,
            WaitStrategy::Park,
            Immediately,
            Notifier::Rmw,
            Pace::Sparse,
            ready(&flag),
        );
        assert!(there.is_ok(), "a value there now is taken even by a try");
    }

    #[test]
    fn a_failing_poll_ends_the_wait_and_withdraws_the_announcement() {
        let w = word();
        let mut looks = Vec::new();
        let r = wait_for::<Kernel, (), _, &str>(
            &w,
            WaitStrategy::Park,
            Forever,
            Notifier::Rmw,
            Pace::Sparse,
            |look| {
                looks.push(look);
                // The re-check after the announcement fails (a dead peer, say).
                if w.atomic().load(Ordering::Relaxed) & PARKED != 0 {
                    return Err("the peer died");
                }
                Ok(None)
            },
        );
        assert!(matches!(r, Err(Halt::Failed("the peer died"))));
        assert_eq!(looks, [Look::Quick, Look::Quick]);
        assert_eq!(w.atomic().load(Ordering::Relaxed) & PARKED, 0);
    }

    #[test]
    fn a_word_is_ringable_or_bell_less_never_both() {
        let w = word();
        mark_ringable(&w);
        assert!(ringable(&w));
        assert!(!mark_bell_less(&w), "a waiter may sleep on the bell");
        let w = word();
        assert!(mark_bell_less(&w));
        assert!(!ringable(&w));
        assert_eq!(w.atomic().load(Ordering::Relaxed) & BELL_LESS, BELL_LESS);
    }

    #[test]
    fn a_notifier_without_the_bell_wakes_the_futex_of_a_doorbell_waiter() {
        // A waiter announced `DOORBELL`; a notifier that holds no bell clears both bits and
        // wakes the futex (the waiter's nap ends its sleep, see the module docs).
        let w = word();
        w.atomic().store(PARKED | DOORBELL, Ordering::Relaxed);
        assert!(notify::<Kernel>(&w, None));
        assert_eq!(w.atomic().load(Ordering::Relaxed), 0);
    }
}
