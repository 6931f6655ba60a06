//! `shmflow clean`: removes the regions whose ends are all dead, and says why each other one
//! stays.

use shmflow::monitor::{list_gates, list_regions, remove_if_stale, remove_stale_and_unread};
use shmflow::OpenError;

use super::unread;

/// Removes every shmflow region whose ends are all dead; never one with a live end, and a
/// channel waiting for its consumer only with `unread`.
pub(crate) fn clean(unread_too: bool, names: &[String]) -> Result<(), String> {
    let mut removed = 0;
    let wanted = |n: &str| names.is_empty() || names.iter().any(|w| w == n);
    let mut channels = list_regions().map_err(|e| e.to_string())?;
    channels.retain(|r| wanted(&r.name));
    let mut gates = list_gates().map_err(|e| e.to_string())?;
    gates.retain(|g| wanted(&g.0));
    let mut errors = 0;
    for n in names {
        if !channels.iter().any(|r| &r.name == n) && !gates.iter().any(|g| &g.0 == n) {
            eprintln!("shmflow: {n}: not a shmflow region in /dev/shm (see `shmflow list`)");
            errors += 1;
        }
    }
    // Why each live region stays.
    for r in channels.iter().filter(|r| !r.is_stale()) {
        let s = &r.snapshot;
        let who: Vec<String> = [
            (r.producer_alive, "producer", s.producer_pid),
            (r.consumer_alive, "consumer", s.consumer_pid),
        ]
        .iter()
        .filter(|(alive, _, _)| *alive)
        .map(|(_, end, pid)| format!("its {end} (pid {pid}) is alive"))
        .collect();
        println!("kept {} ({})", r.name, who.join(", "));
    }
    for (name, g) in gates.iter().filter(|g| !g.1.is_stale()) {
        let live = (0..g.channels()).filter(|&c| g.producer_alive(c)).count();
        let consumer = match g.consumer_alive() {
            true => "its consumer is alive, ",
            false => "",
        };
        println!("kept {name} ({consumer}{live} producer(s) alive)");
    }
    for r in channels.iter().filter(|r| r.is_stale()) {
        if r.awaits_consumer() && !unread_too {
            println!(
                "kept {} (ended, {} unread, waiting for its consumer; --unread discards them)",
                r.name,
                unread(r)
            );
        }
    }
    let stale = channels
        .iter()
        .filter(|r| r.is_stale() && (unread_too || !r.awaits_consumer()))
        .map(|r| r.name.clone())
        .chain(gates.iter().filter(|g| g.1.is_stale()).map(|g| g.0.clone()));
    for name in stale {
        let res = if unread_too {
            remove_stale_and_unread(&name)
        } else {
            remove_if_stale(&name)
        };
        match res {
            Ok(true) => {
                println!("removed {name} (no live end)");
                removed += 1;
            }
            Ok(false) => println!("kept {name} (an end came alive)"),
            // Removed by someone else meanwhile: what was wanted.
            Err(OpenError::NotFound { .. }) => println!("{name} is gone already"),
            Err(e) => {
                eprintln!("shmflow: {e}");
                errors += 1;
            }
        }
    }
    println!("{removed} stale region(s) removed");
    match errors {
        0 => Ok(()),
        n => Err(format!("{n} error(s), above")),
    }
}
