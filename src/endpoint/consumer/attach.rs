//! Making a consumer: creating, opening or being handed its region, attaching to it as its
//! consumer end, and the link of a direct network end.

#[allow(unused_imports)]
use super::*;

impl Consumer {
    #[cfg(not(shmflow_loom))]
    pub(crate) fn create_with(name: &str, geometry: Geometry) -> Result<Consumer, OpenError> {
        let (shared, lock) = crate::region::object::create_named(name, geometry, End::Consumer)?;
        Consumer::attach_with(shared, Some(lock))
    }

    #[cfg(not(shmflow_loom))]
    pub(crate) fn open_with(name: &str) -> Result<Consumer, OpenError> {
        Consumer::attach(crate::region::object::open_named(name, true)?)
    }

    #[cfg(not(shmflow_loom))]
    pub(crate) fn create_anonymous_with(
        geometry: Geometry,
    ) -> Result<(Consumer, PeerHandle), OpenError> {
        let (shared, lock) = crate::region::object::create_memfd(geometry, End::Consumer)?;
        let handle = PeerHandle::new(&shared, End::Producer)?;
        let mut end = Consumer::attach_with(shared, Some(lock))?;
        end.expect_handle();
        Ok((end, handle))
    }

    #[cfg(not(shmflow_loom))]
    pub(crate) fn from_fd_with(fd: BorrowedFd<'_>) -> Result<Consumer, OpenError> {
        let (own, name) = crate::region::handoff::dup_region(fd, RegionKind::Channel)?;
        Consumer::attach(crate::region::object::open_fd(name, own, true, None)?)
    }

    /// Under loom: a fresh heap region and its producer's handle.
    #[cfg(shmflow_loom)]
    pub(crate) fn create_anonymous_with(
        geometry: crate::protocol::abi::Geometry,
    ) -> Result<(Consumer, PeerHandle), OpenError> {
        let shared = crate::region::handoff::channel(geometry)?;
        let handle = PeerHandle::new(&shared, End::Producer)?;
        Ok((Consumer::attach(shared)?, handle))
    }

    /// The consumer of the region of `handle`, in this process, with its doorbells.
    pub(crate) fn from_handle_with(handle: PeerHandle) -> Result<Consumer, OpenError> {
        use crate::region::handoff::{open_handle, Handed};
        let region = handle.region_name().to_owned();
        match open_handle(handle)? {
            Handed::Channel(shared) => Consumer::attach(shared),
            Handed::GateChannel(s) => Err(crate::region::handoff::gate_handle_refused(
                &region,
                s.gate.as_ref().map_or(0, |g| g.index),
            )),
        }
    }

    #[cfg(not(shmflow_loom))]
    pub(crate) fn from_env_with(var: &str) -> Result<Consumer, OpenError> {
        use crate::region::handoff::{open_from_env, Handed};
        match open_from_env(var, false)? {
            Handed::Channel(shared) => Consumer::attach(shared),
            // (Refused before anything was taken; kept for the match.)
            Handed::GateChannel(s) => Err(crate::region::handoff::gate_handle_refused(
                var,
                s.gate.as_ref().map_or(0, |g| g.index),
            )),
        }
    }

    pub(crate) fn attach(shared: Arc<Shared>) -> Result<Consumer, OpenError> {
        Consumer::attach_with(shared, None)
    }

    /// Attaches, with the liveness lock already taken (creators) or taking it now.
    pub(crate) fn attach_with(
        shared: Arc<Shared>,
        lock: Option<std::sync::Arc<EndLock>>,
    ) -> Result<Consumer, OpenError> {
        Consumer::attach_as(shared, lock, Recycler::Own)
    }

    /// Attaches with the recycler the channel's owner supplies (a gate supplies its own).
    pub(crate) fn attach_as(
        shared: Arc<Shared>,
        lock: Option<std::sync::Arc<EndLock>>,
        recycler: Recycler,
    ) -> Result<Consumer, OpenError> {
        let liveness = crate::region::view::attach_end(&shared, End::Consumer, lock)?;
        let n = shared.initial_free;
        let (data, ret) = match Cursors::at_attach(shared.header()).consumer_rings(n) {
            Ok(rings) => rings,
            Err(found) => {
                crate::region::view::give_up_attach(&shared, End::Consumer);
                return Err(OpenError::corrupt(
                    &shared.name,
                    "consumer cursors at attach",
                    format!("data head 0 and return tail {n}"),
                    found,
                ));
            }
        };
        let shared_seg_size = shared.segment_size();
        Ok(Consumer {
            data,
            ret,
            shared,
            cur: None,
            in_span: false,
            skipping: false,
            ended: false,
            wait: WaitStrategy::default(),
            max_record_len: DEFAULT_MAX_RECORD_LEN,
            counters: Counters::default(),
            metrics: true,
            liveness,
            recycler,
            prio_head: 0,
            prio_buf: [0; crate::protocol::abi::PRIO_PAYLOAD],
            detach_as: crate::protocol::ends::Leave::Clean,
            debloat: None,
            span: Span::default(),
            holds: Default::default(),
            seg_size: shared_seg_size,
            fast_max: u32::try_from(DEFAULT_MAX_RECORD_LEN).unwrap_or(u32::MAX),
            wait_mark: None,
            #[cfg(any(feature = "tokio", shmflow_loom))]
            coop: 0,
            marker_sources: Vec::new(),
            #[cfg(any(feature = "tokio", shmflow_loom))]
            caught_up: false,
            #[cfg(all(feature = "net", not(shmflow_loom)))]
            link: None,
            #[cfg(all(feature = "net", not(shmflow_loom)))]
            owed: Default::default(),
        })
    }

    /// Makes this consumer a direct network end: `link` fills its (private) region from the
    /// socket where a local consumer would park.
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(crate) fn set_link(&mut self, link: Box<dyn crate::endpoint::remote::Inbound>) {
        self.link = Some(crate::endpoint::remote::Link(link));
    }

    /// A gate's channel whose producer is a direct network end: reads what arrived (and
    /// announces credit) without waiting. False if the channel has no link.
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(crate) fn link_fill_now(&mut self) -> bool {
        match &mut self.link {
            Some(l) => {
                l.fill(Some(std::time::Instant::now()));
                true
            }
            None => false,
        }
    }

    /// The link has work that needs no new bytes from the socket (see [`Inbound::due`]).
    ///
    /// [`Inbound::due`]: crate::endpoint::remote::Inbound::due
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(crate) fn link_due(&mut self) -> bool {
        self.link.as_mut().is_some_and(|l| l.due())
    }

    /// The link's socket (for a readiness watch).
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(crate) fn link_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.link.as_ref().map(|l| l.as_fd())
    }

    /// Drops the link (the channel ended: its socket is closed, and the producer it wrote
    /// with is gone). True if there was one.
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(crate) fn drop_link(&mut self) -> bool {
        self.link.take().is_some()
    }
}
