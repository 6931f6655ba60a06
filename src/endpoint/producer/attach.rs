//! Making a producer: creating, opening or being handed its region (or a gate's channel), and
//! attaching to it as its producer end.

#[allow(unused_imports)]
use super::*;

impl Producer {
    #[cfg(not(shmflow_loom))]
    pub(crate) fn create_with(name: &str, geometry: Geometry) -> Result<Producer, OpenError> {
        let (shared, lock) = crate::region::object::create_named(name, geometry, End::Producer)?;
        Producer::attach_with(shared, Some(lock), Supply::Own)
    }

    #[cfg(not(shmflow_loom))]
    pub(crate) fn open_with(name: &str) -> Result<Producer, OpenError> {
        Producer::attach(crate::region::object::open_named(name, true)?)
    }

    #[cfg(not(shmflow_loom))]
    pub(crate) fn create_anonymous_with(
        geometry: Geometry,
    ) -> Result<(Producer, PeerHandle), OpenError> {
        let (shared, lock) = crate::region::object::create_memfd(geometry, End::Producer)?;
        let handle = PeerHandle::new(&shared, End::Consumer)?;
        let mut end = Producer::attach_with(shared, Some(lock), Supply::Own)?;
        end.expect_handle();
        Ok((end, handle))
    }

    /// This end's creator made its consumer's handle (`create_anonymous`): a consumer that
    /// never attached is gone once every descriptor of the handle is closed.
    #[cfg(not(shmflow_loom))]
    fn expect_handle(&mut self) {
        if let Some(l) = &mut self.liveness {
            l.expect_handle();
        }
    }

    /// Under loom: a fresh heap region and its consumer's handle.
    #[cfg(shmflow_loom)]
    pub(crate) fn create_anonymous_with(
        geometry: Geometry,
    ) -> Result<(Producer, PeerHandle), OpenError> {
        let shared = crate::region::handoff::channel(geometry)?;
        let handle = PeerHandle::new(&shared, End::Consumer)?;
        Ok((Producer::attach(shared)?, handle))
    }

    /// The producer of the region of `handle` (a channel's, or a gate channel's), in this
    /// process, with its doorbells.
    pub(crate) fn from_handle_with(handle: PeerHandle) -> Result<Producer, OpenError> {
        use crate::region::handoff::{open_handle, Handed};
        match open_handle(handle)? {
            Handed::Channel(shared) => Producer::attach(shared),
            Handed::GateChannel(shared) => Producer::attach_gate_channel(shared),
        }
    }

    #[cfg(not(shmflow_loom))]
    pub(crate) fn from_fd_with(fd: BorrowedFd<'_>) -> Result<Producer, OpenError> {
        let (own, name) = crate::region::handoff::dup_region(fd, RegionKind::Channel)?;
        Producer::attach(crate::region::object::open_fd(name, own, true, None)?)
    }

    #[cfg(not(shmflow_loom))]
    pub(crate) fn from_env_with(var: &str) -> Result<Producer, OpenError> {
        use crate::region::handoff::{open_from_env, Handed};
        match open_from_env(var, true)? {
            Handed::Channel(shared) => Producer::attach(shared),
            Handed::GateChannel(shared) => Producer::attach_gate_channel(shared),
        }
    }

    #[cfg(not(shmflow_loom))]
    pub(crate) fn open_channel_with(name: &str, channel: u32) -> Result<Producer, OpenError> {
        let chans = crate::region::object::gate_open_named(name, true)?;
        Producer::attach_gate_channel(crate::region::object::pick_channel(chans, channel, name)?)
    }

    pub(crate) fn attach(shared: Arc<Shared>) -> Result<Producer, OpenError> {
        Producer::attach_with(shared, None, Supply::Own)
    }

    /// Attaches to channel `c` of a gate: its supply includes the gate's floating segments.
    pub(crate) fn attach_gate_channel(shared: Arc<Shared>) -> Result<Producer, OpenError> {
        Producer::attach_with(shared, None, Supply::lent())
    }

    /// Attaches, with the liveness lock already taken (creators) or taking it now.
    pub(crate) fn attach_with(
        shared: Arc<Shared>,
        lock: Option<std::sync::Arc<EndLock>>,
        supply: Supply,
    ) -> Result<Producer, OpenError> {
        let liveness = crate::region::view::attach_end(&shared, End::Producer, lock)?;
        // The producer's own cursors are private truth: taken from the header once, at
        // attach (those of a fresh region only: a producer cannot take over a half-used stream).
        let cursors = Cursors::at_attach(shared.header());
        let (data, ret) = match cursors.producer_rings(shared.n() as u64) {
            Ok(rings) => rings,
            Err(found) => {
                crate::region::view::give_up_attach(&shared, End::Producer);
                return Err(OpenError::corrupt(
                    &shared.name,
                    "producer cursors at attach",
                    "those of a fresh region".into(),
                    found,
                ));
            }
        };
        let shared_seg_size = shared.segment_size();
        Ok(Producer {
            end_id: crate::endpoint::next_end_id(),
            data,
            ret,
            shared,
            cur: None,
            policy: FlushPolicy::default(),
            wait: WaitStrategy::default(),
            pending_abort: false,
            counters: Counters::default(),
            metrics: true,
            liveness,
            #[cfg(not(shmflow_loom))]
            flusher: None,
            closed: false,
            gone: false,
            supply,
            prio_tail: 0,
            scratch: Vec::new(),
            light: <crate::region::os::Host as crate::sync::Os>::light_notify_available(),
            seg_size: shared_seg_size,
            seg_end: shared_seg_size,
            per_record: PerRecord::of(FlushPolicy::default()),
            #[cfg(any(feature = "tokio", shmflow_loom))]
            coop: 0,
            #[cfg(all(feature = "net", not(shmflow_loom)))]
            link: None,
            #[cfg(all(feature = "net", not(shmflow_loom)))]
            owed: Default::default(),
            #[cfg(not(shmflow_loom))]
            marker_at: u64::MAX,
            #[cfg(not(shmflow_loom))]
            markers: None,
        })
    }

    /// Makes this producer a direct network end: `link` forwards what it publishes and
    /// stands in for the consumer's wake-ups (the region is private to this process).
    #[cfg(all(feature = "net", not(shmflow_loom)))]
    pub(crate) fn set_link(&mut self, link: Box<dyn crate::endpoint::remote::Outbound>) {
        // Every publication goes through `notify_consumer`, which forwards: the per-record
        // path's light notification (a load of the consumer's park word) would skip it.
        self.light = false;
        self.link = Some(crate::endpoint::remote::Link(link));
    }
}
