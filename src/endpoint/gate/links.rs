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
//! remote channels between its local ones without a wake-up at all. (While the gate's
//! thread is away, a channel's keeper reads its socket before each heartbeat; what it
//! writes into the segments rings the gate's word as any commit does.)
//!
//! The hand-off (a mark, then a ring of the word) is `park::mark_then_notify`, whose SYNC
//! POINT says why a gate that is going to sleep never misses a mark; a loom model drives it
//! with a waiting gate (`a_gate_waiting_for_a_marked_socket_always_wakes`). The gate also
//! fills every link at each look after a sleep, at least every `CHECK_INTERVAL`.

use crate::protocol::park;
use crate::region::os::Host;
use crate::region::view::Shared;
use crate::sync::{Arc, AtomicU32};
use crate::sys::sock::Edges;

/// The linked channels' marks and their watcher.
pub(super) struct Links {
    /// Per channel: its socket got bytes since the gate last filled its link. Set by the
    /// watcher, taken by the gate's scan (see the SYNC POINT above).
    marks: std::sync::Arc<[AtomicU32]>,
    edges: std::sync::Arc<Edges>,
    watcher: Option<std::thread::JoinHandle<()>>,
}

impl Links {
    /// Starts the watcher of a gate whose park word is `shared`'s, for `channels` channels.
    pub(super) fn start(shared: Arc<Shared>, channels: usize) -> std::io::Result<Links> {
        let marks: std::sync::Arc<[AtomicU32]> = (0..channels).map(|_| AtomicU32::new(0)).collect();
        let edges = std::sync::Arc::new(Edges::new()?);
        let (m, e) = (marks.clone(), edges.clone());
        let watcher = std::thread::Builder::new()
            .name("shmflow-gate-watch".into())
            .spawn(move || {
                let mut got = Vec::new();
                // Until the gate stops it (or the system refuses the wait: the gate's looks
                // after each nap still fill every link).
                while let Ok(true) = e.wait(&mut got) {
                    if !got.is_empty() {
                        park::mark_then_notify::<Host>(
                            &m,
                            &got,
                            shared.consumer_park(),
                            shared.consumer_bell(),
                        );
                    }
                }
            })?;
        Ok(Links {
            marks,
            edges,
            watcher: Some(watcher),
        })
    }

    /// Watches `fd`, the socket of channel `c`'s link: each time bytes arrive on it the
    /// channel is marked and the gate rung. (The watch ends when the socket is closed.)
    pub(super) fn watch(&self, c: usize, fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
        self.edges.add(fd, c as u64)
    }

    /// Marks channel `c`, so that the next scan fills its link (the gate's own thread).
    pub(super) fn mark(&self, c: usize) {
        // Relaxed: read by this thread's next scan.
        self.marks[c].store(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Takes channel `c`'s mark.
    pub(super) fn take(&self, c: usize) -> bool {
        park::take_mark(&self.marks[c])
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
