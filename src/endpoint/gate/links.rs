//! Gate channels whose producer is a direct network end in this process (feature `net`):
//! the gate's own thread reads their sockets into the channels' segments, as a direct
//! consumer does, and a watcher thread wakes the gate when one of them gets bytes.
//!
//! A gate waits for many channels on one park word, which local producers ring. A socket
//! cannot ring it, and the gate cannot wait on the word and on sockets in one call, so a
//! small thread waits on the sockets (edge-triggered `epoll`): when bytes arrive on a
//! channel's socket it marks the channel and rings the gate's word as a producer would. It
//! moves no data: the gate's thread reads the socket itself, straight into the channel's
//! free segment, when its scan finds the mark (or the link due, see
//! [`Inbound::due`](crate::endpoint::remote::Inbound::due)), so a busy gate reads its
//! remote channels between its local ones without a wake-up at all.
//!
//! SYNC POINT (mark → gate): the watcher stores a channel's mark (Relaxed), then notifies the
//! park word (an AcqRel RMW). A gate about to sleep announces itself on the word (an AcqRel
//! RMW), then scans, which reads the marks (Relaxed). The two RMWs are ordered in the word's
//! modification order: if the watcher's comes first, the gate's announce reads from its
//! release sequence, so the mark happens-before the gate's scan, which sees it; if the
//! gate's comes first, the watcher's notify sees the announcement and wakes the gate, whose
//! scan after the wake sees the mark. Either way a socket's bytes are not left unread while
//! the gate sleeps. (The gate also fills every link at each look after a sleep, at least
//! every `CHECK_INTERVAL`, so even a missed edge costs at most that.)

use std::sync::atomic::{AtomicBool, Ordering};

use crate::endpoint::consumer::Consumer;
use crate::protocol::park;
use crate::region::os::Host;
use crate::region::view::Shared;
use crate::sync::Arc;
use crate::sys::sock::Edges;

/// The linked channels' marks and their watcher.
pub(super) struct Links {
    /// Per channel: its socket got bytes since the gate last filled its link. Set by the
    /// watcher, taken by the gate's scan (see the SYNC POINT above).
    marks: std::sync::Arc<[AtomicBool]>,
    edges: std::sync::Arc<Edges>,
    watcher: Option<std::thread::JoinHandle<()>>,
}

impl Links {
    /// Starts the watcher of a gate whose park word is `shared`'s, for `channels` channels.
    pub(super) fn start(shared: Arc<Shared>, channels: usize) -> std::io::Result<Links> {
        let marks: std::sync::Arc<[AtomicBool]> =
            (0..channels).map(|_| AtomicBool::new(false)).collect();
        let edges = std::sync::Arc::new(Edges::new()?);
        let (m, e) = (marks.clone(), edges.clone());
        let watcher = std::thread::Builder::new()
            .name("shmflow-gate-watch".into())
            .spawn(move || {
                let mut got = Vec::new();
                // Until the gate stops it (or the system refuses the wait: the gate's looks
                // after each nap still fill every link).
                while let Ok(true) = e.wait(&mut got) {
                    for &c in &got {
                        if let Some(mark) = m.get(c as usize) {
                            // Relaxed: published by the notify's RMW (SYNC POINT above).
                            mark.store(true, Ordering::Relaxed);
                        }
                    }
                    if !got.is_empty() {
                        park::notify::<Host>(shared.consumer_park(), shared.consumer_bell());
                    }
                }
            })?;
        Ok(Links {
            marks,
            edges,
            watcher: Some(watcher),
        })
    }

    /// Watches channel `c`'s link (its consumer `ch` holds it); marked at once, for bytes
    /// that arrived before the watch.
    pub(super) fn watch(&self, c: usize, ch: &Consumer) -> std::io::Result<()> {
        if let Some(fd) = ch.link_fd() {
            self.edges.add(fd, c as u64)?;
        }
        self.mark(c);
        Ok(())
    }

    /// Marks channel `c`, so that the next scan fills its link.
    pub(super) fn mark(&self, c: usize) {
        // Relaxed: the gate's own thread, or the watcher under the SYNC POINT above.
        self.marks[c].store(true, Ordering::Relaxed);
    }

    /// Takes channel `c`'s mark.
    pub(super) fn take(&self, c: usize) -> bool {
        // Relaxed: see the SYNC POINT above (a mark is only a hint to read the socket, whose
        // own bytes the kernel orders).
        self.marks[c].load(Ordering::Relaxed) && self.marks[c].swap(false, Ordering::Relaxed)
    }
}

impl Drop for Links {
    fn drop(&mut self) {
        self.edges.stop();
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
    }
}
