//! `shmflow list`: every shmflow region in /dev/shm with its geometry and ends, then any other
//! object there and why it is not one this user can open.

use shmflow::metrics::EndState;
use shmflow::monitor::{list_gates, list_other_objects, list_regions};
use shmflow::OpenError;

use super::{end, unread};

/// Prints a line per channel and per gate (two for a gate), then the other objects.
pub(crate) fn list() -> Result<(), String> {
    let regions = list_regions().map_err(|e| e.to_string())?;
    println!(
        "{:<32} {:>10} {:>9} {:<18} {:<18}",
        "NAME", "SEG_SIZE", "SEGMENTS", "PRODUCER", "CONSUMER"
    );
    for r in &regions {
        let s = &r.snapshot;
        println!(
            "{:<32} {:>10} {:>9} {:<18} {:<18}{}",
            r.name,
            r.geometry.segment_size,
            r.geometry.segment_count,
            end(s.producer_state, s.producer_pid, r.producer_alive),
            end(s.consumer_state, s.consumer_pid, r.consumer_alive),
            match (r.awaits_consumer(), s.producer_state) {
                (true, EndState::Attached) => format!(" producer died, {} unread", unread(r)),
                (true, _) => format!(" ended, {} unread", unread(r)),
                _ => String::new(),
            }
        );
    }
    let gates = list_gates().map_err(|e| e.to_string())?;
    for (name, g) in &gates {
        let gg = g.geometry();
        let s = g.snapshot();
        let alive = (0..g.channels()).filter(|&c| g.producer_alive(c)).count();
        println!(
            "{:<32} {:>10} {:>9} {:<18} {:<18}",
            name,
            gg.segment_size,
            gg.total_segments(),
            format!("{alive}/{} alive", gg.channels),
            end(s.consumer_state, 0, g.consumer_alive()).replace("pid 0", "attached"),
        );
        println!(
            "{:<32} gate: {} channels × {} exclusive + {} floating",
            "", gg.channels, gg.exclusive, gg.floating
        );
    }
    if regions.is_empty() && gates.is_empty() {
        println!("(no shmflow regions)");
    }
    let others = list_other_objects().map_err(|e| e.to_string())?;
    if !others.is_empty() {
        println!("\nother objects in /dev/shm:");
        for (name, why) in &others {
            println!("{:<32} {}", name, describe(why));
        }
    }
    Ok(())
}

/// A short word on an object that is not a region this user can open.
fn describe(e: &OpenError) -> String {
    match e {
        OpenError::SizeMismatch { found: 0, .. } | OpenError::BadMagic { found: 0, .. } => {
            "empty: being created, or left by a creator that died while setting it up".into()
        }
        OpenError::BadMagic {
            found_kind: None, ..
        } => "not a shmflow region".into(),
        OpenError::VersionMismatch { found, .. } => format!("shmflow layout version {found}"),
        OpenError::NotOwner { found, .. } => format!("another user's (uid {found})"),
        OpenError::BadMode { mode, .. } => format!("mode {mode:o}: not trusted"),
        OpenError::NotARegion { found, .. } => (*found).to_owned(),
        other => other.to_string(),
    }
}
