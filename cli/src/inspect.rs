//! `shmflow list`, `shmflow clean` and `shmflow stat`: the regions in /dev/shm, read without
//! attaching as an end. One module each, with `stat --json`'s objects in `json` and a
//! `shmflow-pipeline` checkpoint directory (which `stat`, `top` and `export` read) in
//! `pipeline`; here is what the three share: how an end's state, a checkpoint's release,
//! durations and sizes read.

mod clean;
mod json;
mod list;
pub(crate) mod pipeline;
mod stat;

use shmflow::metrics::EndState;

pub(crate) use clean::clean;
pub(crate) use list::list;
pub(crate) use stat::stat;

/// An end as `list` and `stat` show it: its state, and its pid while it is attached.
fn end(state: EndState, pid: u32, alive: bool) -> String {
    match state {
        EndState::Free => "-".into(),
        EndState::Attached if alive => format!("pid {pid}"),
        EndState::Attached => format!("pid {pid} (dead)"),
        EndState::Detached => "detached".into(),
        EndState::Failed => "failed".into(),
        EndState::Lost => "lost (remote)".into(),
        EndState::Invalid(s) => format!("state {s}?"),
    }
}

/// What an ended channel still holds for its consumer.
fn unread(r: &shmflow::monitor::RegionInfo) -> String {
    match r.unread_records() {
        0 => format!(
            "{} segment(s)",
            r.snapshot
                .segments_acquired
                .saturating_sub(r.snapshot.segments_returned)
        ),
        n => format!("{n} record(s)"),
    }
}

/// How a checkpoint was released, as `stat` says it.
fn released_name(r: Option<shmflow::Released>) -> &'static str {
    match r {
        None => "none",
        Some(shmflow::Released::Aligned) => "aligned",
        Some(shmflow::Released::Unaligned { timed_out: true }) => "unaligned (alignment timed out)",
        Some(shmflow::Released::Unaligned { .. }) => "unaligned",
        Some(_) => "other",
    }
}

/// Nanoseconds in the unit that reads best (ns, µs, ms or s).
pub(crate) fn duration_ns(ns: u64) -> String {
    match ns {
        0..=9_999 => format!("{ns} ns"),
        10_000..=999_999 => format!("{:.1} µs", ns as f64 / 1e3),
        1_000_000..=999_999_999 => format!("{:.1} ms", ns as f64 / 1e6),
        _ => format!("{:.2} s", ns as f64 / 1e9),
    }
}

/// Bytes in the unit that reads best (B, KiB or MiB).
pub(crate) fn bytes_text(b: u64) -> String {
    match b {
        0..=9_999 => format!("{b} B"),
        10_000..=9_999_999 => format!("{:.1} KiB", b as f64 / 1024.0),
        _ => format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0)),
    }
}
