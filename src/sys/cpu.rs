//! The CPU a thread runs on.

use nix::sched::{sched_getaffinity, sched_getcpu, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// Whether the calling thread may run on a CPU other than the one it runs on (false if that
/// cannot be told).
pub(crate) fn other_cpus_allowed() -> bool {
    let (Ok(here), Ok(allowed)) = (sched_getcpu(), sched_getaffinity(Pid::from_raw(0))) else {
        return false;
    };
    (0..CpuSet::count()).any(|c| c != here && allowed.is_set(c).unwrap_or(false))
}

/// Moves the calling thread off the CPU it runs on, to another CPU it may run on (the kernel
/// chooses which), and leaves it free to run anywhere it could before: its affinity is
/// narrowed to exclude this CPU (the kernel migrates it at once) and then widened again. A
/// thread that may run on every online CPU gets every CPU back, those brought online later
/// too; any other gets back the CPUs in effect before the move (those its own affinity and
/// its cpuset allow), so that a later widening of its cpuset no longer reaches it. False, and
/// nothing changed, if the thread may run on this CPU only or a call failed.
///
/// Between the two calls the thread's affinity is not the one its owner set: a change made by
/// another thread in that window is undone.
pub(crate) fn leave_this_cpu() -> bool {
    let Ok(here) = sched_getcpu() else {
        return false;
    };
    let me = Pid::from_raw(0);
    let Ok(allowed) = sched_getaffinity(me) else {
        return false;
    };
    let mut elsewhere = allowed;
    if elsewhere.unset(here).is_err() {
        return false;
    }
    let others = (0..CpuSet::count()).any(|c| elsewhere.is_set(c).unwrap_or(false));
    if !others {
        return false;
    }
    // The kernel moves the thread before the call returns.
    if sched_setaffinity(me, &elsewhere).is_err() {
        return false;
    }
    // Put back: the thread stays where the kernel moved it until the scheduler moves it
    // again. This cannot fail where the narrowing did (the set is the one the kernel gave,
    // or every CPU, and holds the CPU the thread now runs on) unless the CPUs change
    // meanwhile: it is tried twice; should both fail, the thread keeps the narrower set,
    // which still holds every CPU it may run on but one.
    let back = if cpus_in(&allowed) == online_cpus() {
        every_cpu()
    } else {
        allowed
    };
    if sched_setaffinity(me, &back).is_err() {
        let _ = sched_setaffinity(me, &back);
    }
    true
}

/// How many CPUs `set` holds.
fn cpus_in(set: &CpuSet) -> usize {
    (0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .count()
}

/// How many CPUs are online (0 if that cannot be told).
fn online_cpus() -> usize {
    // SAFETY: sysconf reads a system variable; no pointer is involved.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(0)
}

/// The set of every CPU number a `CpuSet` can hold.
fn every_cpu() -> CpuSet {
    let mut all = CpuSet::new();
    for c in 0..CpuSet::count() {
        // Every `c` is below `CpuSet::count()`: never an error.
        let _ = all.set(c);
    }
    all
}

#[cfg(all(test, not(shmflow_loom)))]
mod tests {
    use super::*;

    fn affinity() -> CpuSet {
        sched_getaffinity(Pid::from_raw(0)).unwrap()
    }

    fn cpus(set: &CpuSet) -> Vec<usize> {
        (0..CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap())
            .collect()
    }

    #[test]
    fn a_thread_leaves_its_cpu_and_keeps_its_affinity() {
        std::thread::spawn(|| {
            let allowed = affinity();
            if cpus(&allowed).len() < 2 {
                eprintln!("skipped: this thread may run on one CPU only");
                return;
            }
            assert!(other_cpus_allowed());
            // The scheduler may move the thread back between the move and the look at its
            // CPU; three tries make that a non-event.
            let moved = (0..3).any(|_| {
                let before = sched_getcpu().unwrap();
                assert!(leave_this_cpu());
                // Every CPU it had, online ones all or the same set.
                assert_eq!(cpus(&affinity()), cpus(&allowed));
                sched_getcpu().unwrap() != before
            });
            assert!(moved, "three moves left the thread on its CPU");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_allowed_on_one_cpu_stays_there() {
        std::thread::spawn(|| {
            let here = sched_getcpu().unwrap();
            let mut one = CpuSet::new();
            one.set(here).unwrap();
            sched_setaffinity(Pid::from_raw(0), &one).unwrap();
            assert!(!other_cpus_allowed());
            assert!(!leave_this_cpu());
            assert_eq!(cpus(&affinity()), vec![here]);
            assert_eq!(sched_getcpu().unwrap(), here);
        })
        .join()
        .unwrap();
    }
}
