//! Under `--cfg shmflow_loom`, in place of `handoff`: the regions a model's ends are made on
//! (channels and gates on the heap, with their modelled doorbells), and the handles that give
//! an end of one to another thread of the model.

use crate::error::OpenError;
use crate::protocol::abi::GateGeometry;
use crate::region::heap::{HeapBells, HeapGate};
use crate::region::view::Shared;

/// A fresh channel region on the heap, as `object::create_memfd` makes one in a mapping, with
/// its doorbells (both ends of a model's channel hold them, as both ends of an anonymous
/// region handed over with `pass_to` do).
pub(crate) fn channel(
    geometry: crate::protocol::abi::Geometry,
) -> Result<crate::sync::Arc<Shared>, OpenError> {
    geometry.validate("heap:loom")?;
    let mut shared = Shared::new_heap(geometry);
    shared.heap_bells = Some(HeapBells::fresh(1));
    crate::protocol::park::mark_ringable(shared.consumer_park());
    crate::protocol::park::mark_ringable(shared.header().producer_park());
    Ok(crate::sync::Arc::new(shared))
}

/// A fresh gate region on the heap: its channels, as `object::gate_create_memfd` makes them,
/// with their doorbells.
pub(crate) fn gate(gg: GateGeometry) -> Result<Vec<crate::sync::Arc<Shared>>, OpenError> {
    gg.validate("heap:loom-gate")?;
    let hg = std::sync::Arc::new(HeapGate::new(gg));
    let bells = HeapBells::fresh(gg.channels);
    let chans: Vec<_> = (0..gg.channels)
        .map(|c| {
            let mut s = Shared::heap_gate_channel(hg.clone(), c);
            s.heap_bells = Some(bells.clone());
            crate::sync::Arc::new(s)
        })
        .collect();
    crate::region::view::init_gate(&hg.gate, &chans, gg, 0);
    crate::protocol::park::mark_ringable(hg.gate.park());
    for c in &chans {
        crate::protocol::park::mark_ringable(c.header().producer_park());
    }
    Ok(chans)
}

/// The other end of an anonymous region, for a thread of the model (under `--cfg
/// shmflow_loom` the regions live on the heap: a handle cannot be passed to another process,
/// so it has no descriptor and no `pass_to`).
pub struct PeerHandle {
    shared: crate::sync::Arc<Shared>,
}

impl std::fmt::Debug for PeerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerHandle")
            .field("region", &self.shared.name)
            .field("channel", &self.channel())
            .finish()
    }
}

impl PeerHandle {
    /// (No process can hold a heap region's handle: `peer` is for the mapped form's lock.)
    pub(crate) fn new(
        shared: &crate::sync::Arc<Shared>,
        _peer: crate::error::End,
    ) -> Result<PeerHandle, OpenError> {
        Ok(PeerHandle {
            shared: shared.clone(),
        })
    }

    /// The region's name, for messages.
    pub fn region_name(&self) -> &str {
        &self.shared.name
    }

    /// For a gate's handle: the channel it is for.
    pub fn channel(&self) -> Option<u32> {
        self.shared.gate.as_ref().map(|g| g.index)
    }
}

/// What a handle opened: a channel of its own, or channel `c` of a gate.
pub(crate) enum Handed {
    Channel(crate::sync::Arc<Shared>),
    GateChannel(crate::sync::Arc<Shared>),
}

/// The region of `handle`, for an end in this process.
pub(crate) fn open_handle(handle: PeerHandle) -> Result<Handed, OpenError> {
    Ok(match handle.channel() {
        None => Handed::Channel(handle.shared),
        Some(_) => Handed::GateChannel(handle.shared),
    })
}

/// The error of a consumer handed a gate channel's handle.
pub(crate) fn gate_handle_refused(var: &str, c: u32) -> OpenError {
    crate::error::ConfigError::new(
        var,
        "handle",
        "a channel's handle: a gate's channel is for its producer",
        format!("the handle of gate channel {c}"),
    )
    .into()
}
