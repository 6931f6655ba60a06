//! Making a gate: creating its region (named or anonymous), attaching its channels, and the
//! network links of channels whose producers are remote.

#[allow(unused_imports)]
use super::*;

impl Gate {
    /// Creates a named gate (`/name`, mode 0600, fails if it exists) and attaches as its
    /// consumer; each producer attaches with [`crate::Producer::open_channel`]. The name is
    /// unlinked when the gate is dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::{Gate, GateGeometry, GateMessage, Producer};
    ///
    /// let name = format!("/shmflow-doc-gate-{}", std::process::id());
    /// let mut gate = Gate::create(&name, GateGeometry::new(2))?;
    /// // Each producer (usually another process) opens its channel.
    /// let mut a = Producer::open_channel(&name, 0)?;
    /// let b = Producer::open_channel(&name, 1)?;
    /// a.send(b"from a")?;
    /// drop(a);
    /// drop(b);
    /// let mut records = 0;
    /// while let Some(m) = gate.recv()? {
    ///     match m {
    ///         GateMessage::Record { channel, record } => {
    ///             assert_eq!((channel, record.as_bytes()), (0, Some(&b"from a"[..])));
    ///             records += 1;
    ///         }
    ///         GateMessage::EndOfPartition { .. } => {}
    ///         other => panic!("{other:?}"),
    ///     }
    /// }
    /// assert_eq!(records, 1);
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`AlreadyExists`](crate::OpenError::AlreadyExists) (or
    /// [`Stale`](crate::OpenError::Stale)), [`InvalidConfig`](crate::OpenError::InvalidConfig)
    /// for a bad name or geometry, [`NoMemory`](crate::OpenError::NoMemory) if the system
    /// cannot back the region, [`Io`](crate::OpenError::Io).
    ///
    /// Not under `--cfg shmflow_loom`: a named gate is an object of the system's shared
    /// memory, which loom cannot model (a model makes its gate with `create_anonymous`).
    #[cfg(not(shmflow_loom))]
    pub fn create(name: &str, geometry: GateGeometry) -> Result<Gate, crate::error::OpenError> {
        let (chans, lock) = crate::region::object::gate_create_named(name, geometry)?;
        Gate::attach(chans, Some(lock))
    }

    /// Creates an anonymous (memfd) gate and attaches as its consumer; handle `c` gives
    /// channel `c` to a child process, which calls [`crate::Producer::from_env`].
    ///
    /// The gate's park words get doorbells, on which awaiting tasks sleep in the tokio
    /// reactor: two descriptors each, `2 × (channels + 1)` in this process, and four more per
    /// child while it is spawned. Where the process has no descriptors to spare, the gate is
    /// made without them and its awaiting tasks sleep through the bridge thread instead.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use shmflow::{Gate, GateGeometry};
    ///
    /// let (mut gate, handles) = Gate::create_anonymous(GateGeometry::new(2))?;
    /// for (c, h) in handles.iter().enumerate() {
    ///     let mut cmd = std::process::Command::new("my-producer");
    ///     h.pass_to(&mut cmd, "SHMFLOW_FD"); // the child calls Producer::from_env("SHMFLOW_FD")
    ///     cmd.arg(c.to_string()).spawn()?;
    /// }
    /// drop(handles);
    /// while let Some(m) = gate.recv()? {
    ///     println!("channel {:?}", m.channel());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`InvalidConfig`](crate::OpenError::InvalidConfig) for a bad geometry,
    /// [`NoMemory`](crate::OpenError::NoMemory), [`Io`](crate::OpenError::Io).
    pub fn create_anonymous(
        geometry: GateGeometry,
    ) -> Result<(Gate, Vec<crate::region::handoff::PeerHandle>), crate::error::OpenError> {
        #[cfg(not(shmflow_loom))]
        let (chans, lock) = {
            let (chans, lock) = crate::region::object::gate_create_memfd(geometry)?;
            (chans, Some(lock))
        };
        // Under loom: on the heap, and no liveness lock (no other process to outlive).
        #[cfg(shmflow_loom)]
        let (chans, lock) = (crate::region::handoff::gate(geometry)?, None);
        // (A closure: a mapped region's handle takes the `Shared`, a heap region's the `Arc`.)
        #[allow(clippy::redundant_closure)]
        let handles = chans
            .iter()
            .map(|s| crate::region::handoff::PeerHandle::new(s, crate::error::End::Producer))
            .collect::<Result<Vec<_>, _>>()?;
        let mut gate = Gate::attach(chans, lock)?;
        for c in &mut gate.chans {
            c.expect_handle();
        }
        Ok((gate, handles))
    }

    pub(crate) fn attach(
        chans: Vec<Arc<Shared>>,
        lock: Option<std::sync::Arc<crate::region::liveness::EndLock>>,
    ) -> Result<Gate, crate::error::OpenError> {
        let shared = chans[0].clone();
        let geometry = shared.gate.as_ref().expect("gate channels").geometry;
        let pool = pool::Pool::new(geometry.floating_range());
        let n_channels = chans.len();
        let mut consumers = Vec::with_capacity(chans.len());
        for (c, s) in chans.into_iter().enumerate() {
            let lending = pool::Lending::new(geometry.exclusive_range(c as u32));
            consumers.push(Consumer::attach_as(
                s,
                lock.clone(),
                pool::Recycler::Lent(lending),
            )?);
        }
        let g = shared.gate.as_ref().expect("gate channels").gate_header();
        // The gate's own attach state (its channels' are attached above): a fresh gate's
        // creator finds it free.
        if let Err(found) = g.consumer_end().attach(std::process::id()) {
            return Err(crate::error::OpenError::corrupt(
                &shared.name,
                "gate consumer attach state",
                "0 (free) in a gate this process just made".into(),
                found as u64,
            ));
        }
        Ok(Gate {
            state: consumers.iter().map(|_| State::Open).collect(),
            chans: consumers,
            geometry,
            pool,
            shared,
            wait: WaitStrategy::default(),
            rr: 0,
            burst: 0,
            scans: 0,
            last_check_ns: 0,
            to_retire: false,
            #[cfg(any(feature = "tokio", shmflow_loom))]
            coop: 0,
            cp: Checkpoints::new(n_channels),
            #[cfg(all(feature = "net", not(shmflow_loom)))]
            links: None,
            marker_sources: Vec::new(),
        })
    }

    /// Channel `c`'s region, for a direct network end that is to be its producer: `Err` says
    /// why it cannot be (no such channel, it ended, or it has such an end already).
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(crate) fn link_slot(&self, c: usize) -> Result<Arc<Shared>, String> {
        let n = self.chans.len();
        if c >= n {
            return Err(format!("the gate has {n} channels (0 to {})", n - 1));
        }
        if !matches!(self.state[c], State::Open) {
            return Err("the channel has ended".into());
        }
        if self.chans[c].link_fd().is_some() {
            return Err("the channel has a remote producer already".into());
        }
        Ok(self.chans[c].shared.clone())
    }

    /// Watches `fd`, the socket of channel `c`'s coming link (see `links.rs`): a failure
    /// here leaves the channel as it was.
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(crate) fn watch_link(
        &mut self,
        c: usize,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> std::io::Result<()> {
        if self.links.is_none() {
            self.links = Some(links::Links::start(self.shared.clone(), self.chans.len())?);
        }
        self.links.as_ref().expect("made above").watch(c, fd)
    }

    /// Makes channel `c`'s producer the direct network end whose receiving side is `link`
    /// (its socket watched already, [`Gate::watch_link`]): the gate's thread fills the channel
    /// from its socket (see `links.rs`).
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(crate) fn set_link(&mut self, c: usize, link: Box<dyn crate::endpoint::remote::Inbound>) {
        self.chans[c].set_link(link);
        if let Some(l) = &self.links {
            // For bytes that came before the link was there to read them.
            l.mark(c);
        }
    }

    /// Channel `c`'s link, if it has one, reads what arrived when its socket got bytes or it
    /// has credit to announce (a call that finds nothing to do loads the mark and, for a
    /// linked channel, counts its free segments: a look at its return ring and the cap).
    #[inline]
    pub(super) fn fill_link(&mut self, c: usize) {
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if let Some(l) = &self.links {
            let ch = &mut self.chans[c];
            if l.take(c) | ch.link_due() {
                ch.link_fill_now();
            }
        }
        #[cfg(not(all(feature = "net", not(shmflow_loom))))]
        let _ = c;
    }

    /// Every linked channel's link is filled at the next scan (a look after a sleep).
    pub(super) fn mark_links(&mut self) {
        #[cfg(all(feature = "net", not(shmflow_loom)))]
        if let Some(l) = &self.links {
            for (c, ch) in self.chans.iter().enumerate() {
                if ch.link_fd().is_some() {
                    l.mark(c);
                }
            }
        }
    }
}
