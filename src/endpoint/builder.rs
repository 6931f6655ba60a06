//! Building an end with its settings: `Producer::builder()` and `Consumer::builder()`, in the
//! manner of `std::fs::OpenOptions`. Every way of making or joining a channel — create, open,
//! open-or-create, anonymous with a hand-off to a child, an inherited descriptor — takes the
//! same settings, so that an end is ready to use when it is returned.

#[cfg(not(shmflow_loom))]
use std::os::fd::AsFd;
#[cfg(not(shmflow_loom))]
use std::time::{Duration, Instant};

use crate::endpoint::consumer::{Consumer, DEFAULT_MAX_RECORD_LEN};
use crate::endpoint::producer::{FlushPolicy, Producer};
use crate::error::OpenError;
use crate::protocol::abi::Geometry;
use crate::protocol::park::WaitStrategy;
use crate::region::handoff::PeerHandle;

#[cfg(not(shmflow_loom))]
/// How long `open_or_create` keeps trying when another process creates or removes the name
/// between its open and its create.
const OPEN_OR_CREATE_FOR: Duration = Duration::from_secs(2);

/// Opens `name`, or creates it if it does not exist, whichever side gets there first: a
/// creator that loses the race to another creator opens what the winner made. A region left by
/// dead processes is never removed here (that is `shmflow clean`'s decision): opening it
/// reports an end attached by a dead process as [`OpenError::Stale`] (naming it), an end that
/// detached as `EndDetached`, or the other end attaches and its first call reports
/// `PeerDead`.
#[cfg(not(shmflow_loom))]
fn open_or_create<T>(
    open: impl Fn() -> Result<T, OpenError>,
    create: impl Fn() -> Result<T, OpenError>,
) -> Result<T, OpenError> {
    let start = Instant::now();
    // Spins a few rounds, then yields: the other side is usually a moment from done.
    let backoff = crossbeam_utils::Backoff::new();
    loop {
        match open() {
            Err(OpenError::NotFound { .. }) => {}
            // A creator still reserving a large region: its magic is not written yet.
            Err(
                OpenError::BadMagic { found: 0, .. } | OpenError::SizeMismatch { found: 0, .. },
            ) if start.elapsed() < OPEN_OR_CREATE_FOR => {
                backoff.snooze();
                continue;
            }
            other => return other,
        }
        match create() {
            Err(OpenError::AlreadyExists { .. }) if start.elapsed() < OPEN_OR_CREATE_FOR => {
                // Created by someone else since our open: open theirs.
                backoff.snooze();
            }
            other => return other,
        }
    }
}

impl Producer {
    /// Settings and the ways to make a producer: create, open, open-or-create, anonymous,
    /// inherited, a gate's channel (see [`ProducerBuilder`]). The forms below are shorthands
    /// for the builder with default settings.
    pub fn builder() -> ProducerBuilder {
        ProducerBuilder::default()
    }

    /// Creates a named region (`/name`, mode 0600, fails if it exists) and attaches as its
    /// producer. The name stays for a consumer that has not opened it yet if the producer
    /// ends with records published (see [`ProducerBuilder::create`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # let name = format!("/shmflow-doc-create-{}", std::process::id());
    /// let mut tx = shmflow::Producer::create(&name, shmflow::Geometry::default())?;
    /// let mut rx = shmflow::Consumer::open(&name)?;
    /// tx.send(b"x")?;
    /// tx.flush()?;
    /// assert_eq!(rx.recv()?.unwrap().len(), Some(1));
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// See [`ProducerBuilder::create`].
    ///
    /// Not under `--cfg shmflow_loom`: a named region is an object of the system's shared memory,
    /// which loom cannot model (a model makes its ends with [`pair`](crate::pair) or
    /// `create_anonymous`).
    #[cfg(not(shmflow_loom))]
    pub fn create(name: &str, geometry: Geometry) -> Result<Producer, OpenError> {
        Producer::builder().geometry(geometry).create(name)
    }

    /// Opens a named region created by the consumer and attaches as its producer.
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::{Consumer, Geometry, Producer};
    ///
    /// let name = format!("/shmflow-doc-popen-{}", std::process::id());
    /// let mut rx = Consumer::create(&name, Geometry::default())?; // the consumer made it
    /// let mut tx = Producer::open(&name)?;
    /// tx.send(b"to the creator")?;
    /// tx.flush()?;
    /// assert!(rx.recv()?.is_some());
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// See [`ProducerBuilder::open`].
    ///
    /// Not under `--cfg shmflow_loom`: a named region is an object of the system's shared memory,
    /// which loom cannot model (a model makes its ends with [`pair`](crate::pair) or
    /// `create_anonymous`).
    #[cfg(not(shmflow_loom))]
    pub fn open(name: &str) -> Result<Producer, OpenError> {
        Producer::builder().open(name)
    }

    /// Creates an anonymous (memfd) region and attaches as its producer; the returned handle
    /// gives the consumer end to a child process (see [`PeerHandle`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use shmflow::{Geometry, Producer};
    ///
    /// let (mut tx, handle) = Producer::create_anonymous(Geometry::default())?;
    /// let mut cmd = std::process::Command::new("my-consumer");
    /// handle.pass_to(&mut cmd, "SHMFLOW_FD"); // the child calls Consumer::from_env("SHMFLOW_FD")
    /// let _child = cmd.spawn()?;
    /// drop(handle);
    /// tx.send(b"to the child")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// See [`ProducerBuilder::create_anonymous`].
    pub fn create_anonymous(geometry: Geometry) -> Result<(Producer, PeerHandle), OpenError> {
        Producer::builder().geometry(geometry).create_anonymous()
    }

    /// Attaches as producer, in this process, to the region of `handle`: the consumer end of
    /// a channel made with [`Consumer::create_anonymous`], or a channel of a gate made with
    /// [`Gate::create_anonymous`](crate::Gate::create_anonymous). The end keeps the region's
    /// doorbells, so that async waiters on both sides sleep in their runtime's reactor. This
    /// is how a thread of the creator's process takes the other end (and how a loom model
    /// does: see `docs/LOOM.md`).
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::{Gate, GateMessage, Producer};
    ///
    /// let (mut gate, handles) = Gate::builder().channels(2).segment_size(4096).create_anonymous()?;
    /// let writers: Vec<_> = handles
    ///     .into_iter()
    ///     .map(|h| {
    ///         std::thread::spawn(move || -> Result<(), shmflow::Error> {
    ///             let c = h.channel().unwrap();
    ///             let mut tx = Producer::from_handle(h)?;
    ///             tx.send(&c.to_le_bytes())?;
    ///             Ok(()) // dropping the producer ends its channel
    ///         })
    ///     })
    ///     .collect();
    /// let mut records = 0;
    /// while let Some(m) = gate.recv()? {
    ///     if let GateMessage::Record { channel, record } = m {
    ///         assert_eq!(record.as_bytes(), Some(&channel.to_le_bytes()[..]));
    ///         records += 1;
    ///     }
    /// }
    /// assert_eq!(records, 2);
    /// for w in writers {
    ///     w.join().unwrap()?;
    /// }
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// See [`ProducerBuilder::from_handle`].
    pub fn from_handle(handle: PeerHandle) -> Result<Producer, OpenError> {
        Producer::builder().from_handle(handle)
    }

    /// Attaches as producer to the region behind `fd` (handed over by its creator, see
    /// [`PeerHandle`]). `fd` is only borrowed: the producer keeps a duplicate of its own, made
    /// once `fd` is known to be a shmflow channel; on an error `fd` is untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::{Consumer, Geometry, Producer};
    ///
    /// let (mut rx, handle) = Consumer::create_anonymous(Geometry::default())?;
    /// let mut tx = Producer::from_fd(&handle)?; // borrows: `handle` stays usable
    /// tx.send(b"x")?;
    /// tx.flush()?;
    /// assert!(rx.recv()?.is_some());
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// See [`ProducerBuilder::from_fd`].
    ///
    /// Not under `--cfg shmflow_loom`: a descriptor is the system's, and a model's regions live on
    /// the heap (a model hands an end to a thread with [`PeerHandle`] and `from_handle`).
    #[cfg(not(shmflow_loom))]
    pub fn from_fd(fd: impl AsFd) -> Result<Producer, OpenError> {
        Producer::builder().from_fd(fd)
    }

    /// Attaches as producer to the region whose descriptor number is in environment variable
    /// `var` (set by [`PeerHandle::pass_to`]). For a gate's handle (see
    /// [`Gate::create_anonymous`](crate::Gate::create_anonymous)) this opens the handle's
    /// channel.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// // In a child spawned with `handle.pass_to(&mut cmd, "SHMFLOW_FD")`:
    /// let mut tx = shmflow::Producer::from_env("SHMFLOW_FD")?;
    /// tx.send(b"from the child")?;
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// See [`ProducerBuilder::from_env`].
    ///
    /// Not under `--cfg shmflow_loom`: a descriptor is the system's, and a model's regions live on
    /// the heap (a model hands an end to a thread with [`PeerHandle`] and `from_handle`).
    #[cfg(not(shmflow_loom))]
    pub fn from_env(var: &str) -> Result<Producer, OpenError> {
        Producer::builder().from_env(var)
    }

    /// Opens channel `channel` of the named gate (made by [`Gate::create`](crate::Gate::create))
    /// and attaches as its producer.
    ///
    /// # Examples
    ///
    /// See [`Gate::create`](crate::Gate::create) for a gate and its producers.
    ///
    /// # Errors
    /// See [`ProducerBuilder::open_channel`].
    ///
    /// Not under `--cfg shmflow_loom`: a named region is an object of the system's shared memory,
    /// which loom cannot model (a model makes its ends with [`pair`](crate::pair) or
    /// `create_anonymous`).
    #[cfg(not(shmflow_loom))]
    pub fn open_channel(name: &str, channel: u32) -> Result<Producer, OpenError> {
        Producer::builder().open_channel(name, channel)
    }
}

impl Consumer {
    /// Settings and the ways to make a consumer: create, open, open-or-create, anonymous,
    /// inherited (see [`ConsumerBuilder`]). The forms below are shorthands for the builder
    /// with default settings.
    pub fn builder() -> ConsumerBuilder {
        ConsumerBuilder::default()
    }

    /// Creates a named region (`/name`, mode 0600, fails if it exists) and attaches as its
    /// consumer. The name is removed when this consumer is dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::{Consumer, Geometry, Producer};
    ///
    /// let name = format!("/shmflow-doc-ccreate-{}", std::process::id());
    /// let mut rx = Consumer::create(&name, Geometry::default())?;
    /// let tx = Producer::open(&name)?;
    /// drop(tx); // ends the stream
    /// assert!(rx.recv()?.is_none());
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// See [`ConsumerBuilder::create`].
    ///
    /// Not under `--cfg shmflow_loom`: a named region is an object of the system's shared memory,
    /// which loom cannot model (a model makes its ends with [`pair`](crate::pair) or
    /// `create_anonymous`).
    #[cfg(not(shmflow_loom))]
    pub fn create(name: &str, geometry: Geometry) -> Result<Consumer, OpenError> {
        Consumer::builder().geometry(geometry).create(name)
    }

    /// Opens a named region created by the producer and attaches as its consumer.
    ///
    /// # Examples
    ///
    /// ```
    /// # let name = format!("/shmflow-doc-open-{}", std::process::id());
    /// let mut rx = shmflow::Consumer::create(&name, shmflow::Geometry::default())?;
    /// let mut tx = shmflow::Producer::open(&name)?;
    /// drop(tx); // ends the stream
    /// assert!(rx.recv()?.is_none());
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// See [`ConsumerBuilder::open`].
    ///
    /// Not under `--cfg shmflow_loom`: a named region is an object of the system's shared memory,
    /// which loom cannot model (a model makes its ends with [`pair`](crate::pair) or
    /// `create_anonymous`).
    #[cfg(not(shmflow_loom))]
    pub fn open(name: &str) -> Result<Consumer, OpenError> {
        Consumer::builder().open(name)
    }

    /// Creates an anonymous (memfd) region and attaches as its consumer; the returned handle
    /// gives the producer end to a child process.
    ///
    /// # Errors
    /// See [`ConsumerBuilder::create_anonymous`].
    pub fn create_anonymous(geometry: Geometry) -> Result<(Consumer, PeerHandle), OpenError> {
        Consumer::builder().geometry(geometry).create_anonymous()
    }

    /// Attaches as consumer, in this process, to the region of `handle` (from
    /// [`Producer::create_anonymous`]), with the region's doorbells: how a thread of the
    /// creator's process takes the other end ([`pair`](crate::pair) is this, in one call).
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::{Consumer, Geometry, Producer};
    ///
    /// let (mut tx, handle) = Producer::create_anonymous(Geometry::default())?;
    /// let reader = std::thread::spawn(move || -> Result<usize, shmflow::Error> {
    ///     let mut rx = Consumer::from_handle(handle)?;
    ///     let mut n = 0;
    ///     while rx.recv()?.is_some() {
    ///         n += 1;
    ///     }
    ///     Ok(n)
    /// });
    /// tx.send(b"one")?;
    /// tx.send(b"two")?;
    /// drop(tx); // ends the stream
    /// assert_eq!(reader.join().unwrap()?, 2);
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// See [`ConsumerBuilder::from_handle`].
    pub fn from_handle(handle: PeerHandle) -> Result<Consumer, OpenError> {
        Consumer::builder().from_handle(handle)
    }

    /// Attaches as consumer to the region behind `fd` (borrowed, as for
    /// [`Producer::from_fd`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use shmflow::{Consumer, Geometry, Producer};
    ///
    /// let (mut tx, handle) = Producer::create_anonymous(Geometry::default())?;
    /// let mut rx = Consumer::from_fd(&handle)?;
    /// tx.send(b"x")?;
    /// tx.flush()?;
    /// assert!(rx.recv()?.is_some());
    /// # Ok::<(), shmflow::Error>(())
    /// ```
    ///
    /// # Errors
    /// See [`ConsumerBuilder::from_fd`].
    ///
    /// Not under `--cfg shmflow_loom`: a descriptor is the system's, and a model's regions live on
    /// the heap (a model hands an end to a thread with [`PeerHandle`] and `from_handle`).
    #[cfg(not(shmflow_loom))]
    pub fn from_fd(fd: impl AsFd) -> Result<Consumer, OpenError> {
        Consumer::builder().from_fd(fd)
    }

    /// Attaches as consumer to the region whose descriptor number is in environment variable
    /// `var` (set by [`PeerHandle::pass_to`]).
    ///
    /// # Errors
    /// See [`ConsumerBuilder::from_env`].
    ///
    /// Not under `--cfg shmflow_loom`: a descriptor is the system's, and a model's regions live on
    /// the heap (a model hands an end to a thread with [`PeerHandle`] and `from_handle`).
    #[cfg(not(shmflow_loom))]
    pub fn from_env(var: &str) -> Result<Consumer, OpenError> {
        Consumer::builder().from_env(var)
    }
}

/// Settings for a [`Producer`], and the ways to make one. From [`Producer::builder`].
///
/// # Examples
///
/// ```
/// use shmflow::{Consumer, FlushPolicy, Geometry, Producer};
///
/// let name = format!("/shmflow-doc-builder-{}", std::process::id());
/// let mut tx = Producer::builder()
///     .geometry(Geometry { segment_size: 4096, segment_count: 8 })
///     .flush_policy(FlushPolicy::EveryRecord)
///     .open_or_create(&name)?;
/// let mut rx = Consumer::builder().max_record_len(1 << 20).open_or_create(&name)?;
/// tx.send(b"built")?;
/// assert_eq!(rx.recv()?.unwrap().as_bytes(), Some(&b"built"[..]));
/// # Ok::<(), shmflow::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
#[must_use = "a builder does nothing until an end is made with it"]
pub struct ProducerBuilder {
    geometry: Geometry,
    flush: FlushPolicy,
    wait: WaitStrategy,
    metrics: bool,
}

impl Default for ProducerBuilder {
    fn default() -> Self {
        ProducerBuilder {
            geometry: Geometry::default(),
            flush: FlushPolicy::default(),
            wait: WaitStrategy::default(),
            metrics: true,
        }
    }
}

impl ProducerBuilder {
    /// The geometry of a region this builder creates (ignored when it opens one: the region
    /// says its own). Default: 64 segments of 32 KiB.
    pub fn geometry(mut self, geometry: Geometry) -> Self {
        self.geometry = geometry;
        self
    }

    /// When committed records become visible (see [`FlushPolicy`]).
    pub fn flush_policy(mut self, policy: FlushPolicy) -> Self {
        self.flush = policy;
        self
    }

    /// How blocking calls wait (see [`WaitStrategy`]).
    pub fn wait_strategy(mut self, wait: WaitStrategy) -> Self {
        self.wait = wait;
        self
    }

    /// Per-record counters on or off (see [`Producer::set_metrics`]).
    pub fn metrics(mut self, on: bool) -> Self {
        self.metrics = on;
        self
    }

    fn apply(&self, mut p: Producer) -> Producer {
        p.set_flush_policy(self.flush);
        p.set_wait_strategy(self.wait);
        p.set_metrics(self.metrics);
        p
    }

    /// Creates the named region (`/name`, mode 0600; fails if it exists) and attaches as its
    /// producer. When the producer ends, the name is removed unless no consumer has opened
    /// it yet and something was published: then it stays until a consumer has opened it and
    /// detached, so that every record sent is read (see [`Producer::close_timeout`] to wait
    /// for that).
    ///
    /// # Errors
    /// [`OpenError::AlreadyExists`] (or [`OpenError::Stale`] if nobody alive uses it, or
    /// [`OpenError::AwaitsConsumer`] if it holds an ended stream nobody has read yet),
    /// [`OpenError::InvalidConfig`] for a bad name or geometry, [`OpenError::Io`].
    ///
    /// Not under `--cfg shmflow_loom`: a named region is an object of the system's shared memory,
    /// which loom cannot model (a model makes its ends with [`pair`](crate::pair) or
    /// `create_anonymous`).
    #[cfg(not(shmflow_loom))]
    pub fn create(&self, name: &str) -> Result<Producer, OpenError> {
        Producer::create_with(name, self.geometry).map(|p| self.apply(p))
    }

    /// Opens a named region made by the consumer and attaches as its producer.
    ///
    /// # Errors
    /// [`OpenError::NotFound`], [`OpenError::AlreadyAttached`] (a live process holds the
    /// end), [`OpenError::Stale`] (a dead one does), [`OpenError::EndDetached`], and the checks
    /// of an open (owner, mode, magic, version, size: see [`OpenError`]).
    ///
    /// Not under `--cfg shmflow_loom`: a named region is an object of the system's shared memory,
    /// which loom cannot model (a model makes its ends with [`pair`](crate::pair) or
    /// `create_anonymous`).
    #[cfg(not(shmflow_loom))]
    pub fn open(&self, name: &str) -> Result<Producer, OpenError> {
        Producer::open_with(name).map(|p| self.apply(p))
    }

    /// Opens the named region if it exists, else creates it: the two ends can start in any
    /// order. The name goes when either end detaches, except that a producer that ends after
    /// publishing, before any consumer came, leaves it for that consumer.
    ///
    /// # Errors
    /// As [`ProducerBuilder::open`] and [`ProducerBuilder::create`].
    ///
    /// Not under `--cfg shmflow_loom`: a named region is an object of the system's shared memory,
    /// which loom cannot model (a model makes its ends with [`pair`](crate::pair) or
    /// `create_anonymous`).
    #[cfg(not(shmflow_loom))]
    pub fn open_or_create(&self, name: &str) -> Result<Producer, OpenError> {
        open_or_create(|| self.open(name), || self.create(name))
    }

    /// Creates an anonymous (sealed memfd) region and attaches as its producer; the handle
    /// gives the consumer end to a child process (see [`PeerHandle`]).
    ///
    /// # Errors
    /// [`OpenError::InvalidConfig`] for a bad geometry, [`OpenError::Io`].
    pub fn create_anonymous(&self) -> Result<(Producer, PeerHandle), OpenError> {
        Producer::create_anonymous_with(self.geometry).map(|(p, h)| (self.apply(p), h))
    }

    /// Attaches as producer, in this process, to the region of `handle` (a channel's, or a
    /// gate channel's), with its doorbells (see [`Producer::from_handle`]).
    ///
    /// # Errors
    /// [`OpenError::AlreadyAttached`] if the region has a producer already, and as for
    /// [`ProducerBuilder::open`].
    pub fn from_handle(&self, handle: PeerHandle) -> Result<Producer, OpenError> {
        Producer::from_handle_with(handle).map(|p| self.apply(p))
    }

    /// Attaches as producer to the region behind `fd`, which is only borrowed: a duplicate is
    /// made once it is known to be a shmflow channel. A bare descriptor carries none of the
    /// region's doorbells: async waiters of both ends then sleep through the bridge thread
    /// (hand the region with [`PeerHandle::pass_to`] to keep them).
    ///
    /// # Errors
    /// [`OpenError::NotARegion`] for a descriptor that is not a regular file or memfd,
    /// [`OpenError::BadMagic`] for one that is not a shmflow channel,
    /// [`OpenError::InvalidConfig`] for a region whose other end attached with its doorbells
    /// (one of its tasks may sleep on a doorbell this end could not ring), and as for
    /// [`ProducerBuilder::open`]. `fd` stays open and unchanged.
    ///
    /// Not under `--cfg shmflow_loom`: a descriptor is the system's, and a model's regions live on
    /// the heap (a model hands an end to a thread with [`PeerHandle`] and `from_handle`).
    #[cfg(not(shmflow_loom))]
    pub fn from_fd(&self, fd: impl AsFd) -> Result<Producer, OpenError> {
        Producer::from_fd_with(fd.as_fd()).map(|p| self.apply(p))
    }

    /// Attaches as producer to the region whose descriptor number is in environment variable
    /// `var` (set by [`PeerHandle::pass_to`]); for a gate's handle, to its channel.
    ///
    /// The descriptor is taken (and made close-on-exec) only once it is known to be a shmflow
    /// region of the right kind and to have been handed over across an exec (close-on-exec
    /// clear, as [`PeerHandle::pass_to`] leaves it): given stdin, a socket, a file, a gate's
    /// handle where a channel is expected, or a descriptor this process already owns, the call
    /// fails and the descriptor stays open and usable. For a descriptor this process holds,
    /// use [`ProducerBuilder::from_fd`], which borrows.
    ///
    /// # Errors
    /// [`OpenError::InvalidConfig`] if `var` does not name an open descriptor,
    /// [`OpenError::NotARegion`] or [`OpenError::BadMagic`] if it is not a shmflow region of
    /// the right kind, and as for [`ProducerBuilder::open`].
    ///
    /// Not under `--cfg shmflow_loom`: a descriptor is the system's, and a model's regions live on
    /// the heap (a model hands an end to a thread with [`PeerHandle`] and `from_handle`).
    #[cfg(not(shmflow_loom))]
    pub fn from_env(&self, var: &str) -> Result<Producer, OpenError> {
        Producer::from_env_with(var).map(|p| self.apply(p))
    }

    /// Opens channel `channel` of the named gate and attaches as its producer.
    ///
    /// # Errors
    /// [`OpenError::InvalidConfig`] for a channel past the gate's count, and as for
    /// [`ProducerBuilder::open`].
    ///
    /// Not under `--cfg shmflow_loom`: a named region is an object of the system's shared memory,
    /// which loom cannot model (a model makes its ends with [`pair`](crate::pair) or
    /// `create_anonymous`).
    #[cfg(not(shmflow_loom))]
    pub fn open_channel(&self, gate: &str, channel: u32) -> Result<Producer, OpenError> {
        Producer::open_channel_with(gate, channel).map(|p| self.apply(p))
    }
}

/// Settings for a [`Consumer`], and the ways to make one. From [`Consumer::builder`].
///
/// # Examples
///
/// ```
/// use shmflow::{Consumer, Geometry, WaitStrategy};
/// use std::time::Duration;
///
/// let (mut rx, handle) = Consumer::builder()
///     .geometry(Geometry { segment_size: 4096, segment_count: 4 })
///     .wait_strategy(WaitStrategy::BusyPoll(Duration::from_micros(50)))
///     .create_anonymous()?;
/// // `handle.pass_to(&mut command, "SHMFLOW_FD")` gives the producer end to a child.
/// # drop(handle);
/// # Ok::<(), shmflow::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
#[must_use = "a builder does nothing until an end is made with it"]
pub struct ConsumerBuilder {
    geometry: Geometry,
    wait: WaitStrategy,
    max_record_len: u64,
    metrics: bool,
    debloat: Option<std::time::Duration>,
}

impl Default for ConsumerBuilder {
    fn default() -> Self {
        ConsumerBuilder {
            geometry: Geometry::default(),
            wait: WaitStrategy::default(),
            max_record_len: DEFAULT_MAX_RECORD_LEN,
            metrics: true,
            debloat: None,
        }
    }
}

impl ConsumerBuilder {
    /// The geometry of a region this builder creates (ignored when it opens one).
    pub fn geometry(mut self, geometry: Geometry) -> Self {
        self.geometry = geometry;
        self
    }

    /// How blocking calls wait (see [`WaitStrategy`]).
    pub fn wait_strategy(mut self, wait: WaitStrategy) -> Self {
        self.wait = wait;
        self
    }

    /// The longest record accepted (see [`Consumer::set_max_record_len`]).
    pub fn max_record_len(mut self, max: u64) -> Self {
        self.max_record_len = max;
        self
    }

    /// Per-record counters on or off (see [`Consumer::set_metrics`]).
    pub fn metrics(mut self, on: bool) -> Self {
        self.metrics = on;
        self
    }

    /// Buffer debloating with this target time (see [`Consumer::set_debloat_target`]); off by
    /// default.
    pub fn debloat_target(mut self, target: std::time::Duration) -> Self {
        self.debloat = Some(target);
        self
    }

    fn apply(&self, mut c: Consumer) -> Consumer {
        c.set_wait_strategy(self.wait);
        c.set_max_record_len(self.max_record_len);
        c.set_metrics(self.metrics);
        if self.debloat.is_some() {
            c.set_debloat_target(self.debloat);
        }
        c
    }

    /// Creates the named region (`/name`, mode 0600; fails if it exists) and attaches as its
    /// consumer. The name is removed when the consumer is dropped.
    ///
    /// # Errors
    /// As [`ProducerBuilder::create`].
    ///
    /// Not under `--cfg shmflow_loom`: a named region is an object of the system's shared memory,
    /// which loom cannot model (a model makes its ends with [`pair`](crate::pair) or
    /// `create_anonymous`).
    #[cfg(not(shmflow_loom))]
    pub fn create(&self, name: &str) -> Result<Consumer, OpenError> {
        Consumer::create_with(name, self.geometry).map(|c| self.apply(c))
    }

    /// Opens a named region made by the producer and attaches as its consumer: also one whose
    /// producer has already ended, whose records it then reads before end of stream. The
    /// name is removed when the consumer is dropped.
    ///
    /// # Errors
    /// As [`ProducerBuilder::open`].
    ///
    /// Not under `--cfg shmflow_loom`: a named region is an object of the system's shared memory,
    /// which loom cannot model (a model makes its ends with [`pair`](crate::pair) or
    /// `create_anonymous`).
    #[cfg(not(shmflow_loom))]
    pub fn open(&self, name: &str) -> Result<Consumer, OpenError> {
        Consumer::open_with(name).map(|c| self.apply(c))
    }

    /// Opens the named region if it exists, else creates it.
    ///
    /// # Errors
    /// As [`ConsumerBuilder::open`] and [`ConsumerBuilder::create`].
    ///
    /// Not under `--cfg shmflow_loom`: a named region is an object of the system's shared memory,
    /// which loom cannot model (a model makes its ends with [`pair`](crate::pair) or
    /// `create_anonymous`).
    #[cfg(not(shmflow_loom))]
    pub fn open_or_create(&self, name: &str) -> Result<Consumer, OpenError> {
        open_or_create(|| self.open(name), || self.create(name))
    }

    /// Creates an anonymous (sealed memfd) region and attaches as its consumer; the handle
    /// gives the producer end to a child process.
    ///
    /// # Errors
    /// As [`ProducerBuilder::create_anonymous`].
    pub fn create_anonymous(&self) -> Result<(Consumer, PeerHandle), OpenError> {
        Consumer::create_anonymous_with(self.geometry).map(|(c, h)| (self.apply(c), h))
    }

    /// Attaches as consumer, in this process, to the region of `handle`, with its doorbells
    /// (see [`Consumer::from_handle`]).
    ///
    /// # Errors
    /// [`OpenError::InvalidConfig`] for a gate channel's handle (it is for the channel's
    /// producer), [`OpenError::AlreadyAttached`] if the region has a consumer already, and as
    /// for [`ConsumerBuilder::open`].
    pub fn from_handle(&self, handle: PeerHandle) -> Result<Consumer, OpenError> {
        Consumer::from_handle_with(handle).map(|c| self.apply(c))
    }

    /// Attaches as consumer to the region behind `fd` (borrowed, as for
    /// [`ProducerBuilder::from_fd`]).
    ///
    /// # Errors
    /// As [`ProducerBuilder::from_fd`].
    ///
    /// Not under `--cfg shmflow_loom`: a descriptor is the system's, and a model's regions live on
    /// the heap (a model hands an end to a thread with [`PeerHandle`] and `from_handle`).
    #[cfg(not(shmflow_loom))]
    pub fn from_fd(&self, fd: impl AsFd) -> Result<Consumer, OpenError> {
        Consumer::from_fd_with(fd.as_fd()).map(|c| self.apply(c))
    }

    /// Attaches as consumer to the region whose descriptor number is in environment variable
    /// `var` (set by [`PeerHandle::pass_to`]).
    ///
    /// # Errors
    /// As [`ProducerBuilder::from_env`]; a gate channel's handle is refused (it is for the
    /// channel's producer).
    ///
    /// Not under `--cfg shmflow_loom`: a descriptor is the system's, and a model's regions live on
    /// the heap (a model hands an end to a thread with [`PeerHandle`] and `from_handle`).
    #[cfg(not(shmflow_loom))]
    pub fn from_env(&self, var: &str) -> Result<Consumer, OpenError> {
        Consumer::from_env_with(var).map(|c| self.apply(c))
    }
}

impl crate::endpoint::gate::Gate {
    /// Settings and the ways to make a gate (see [`GateBuilder`]); [`Gate::create`] and
    /// [`Gate::create_anonymous`] are shorthands for the builder with default settings.
    ///
    /// [`Gate::create`]: crate::Gate::create
    /// [`Gate::create_anonymous`]: crate::Gate::create_anonymous
    pub fn builder() -> GateBuilder {
        GateBuilder::default()
    }
}

/// The settings of a gate, and the ways to make one, in the manner of [`ConsumerBuilder`].
///
/// # Examples
///
/// ```
/// use shmflow::{Gate, GateMessage, Producer, WaitStrategy};
///
/// let name = format!("/shmflow-doc-gate-builder-{}", std::process::id());
/// let mut gate = Gate::builder()
///     .channels(2)
///     .exclusive(2)
///     .floating(4)
///     .segment_size(4096)
///     .wait_strategy(WaitStrategy::Park)
///     .max_record_len(1 << 20)
///     .create(&name)?;
/// let mut p = Producer::open_channel(&name, 1)?;
/// p.send(b"from channel 1")?;
/// drop(p);
/// match gate.recv()? {
///     Some(GateMessage::Record { channel, record }) => {
///         assert_eq!((channel, record.as_bytes()), (1, Some(&b"from channel 1"[..])))
///     }
///     other => panic!("{other:?}"),
/// }
/// # Ok::<(), shmflow::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
#[must_use = "a builder does nothing until a gate is made with it"]
pub struct GateBuilder {
    geometry: crate::protocol::abi::GateGeometry,
    wait: WaitStrategy,
    max_record_len: u64,
    debloat: Option<std::time::Duration>,
}

impl Default for GateBuilder {
    /// One channel, Flink's defaults for the rest (see [`GateGeometry::new`](crate::GateGeometry::new)).
    fn default() -> Self {
        GateBuilder {
            geometry: crate::protocol::abi::GateGeometry::new(1),
            wait: WaitStrategy::default(),
            max_record_len: DEFAULT_MAX_RECORD_LEN,
            debloat: None,
        }
    }
}

impl GateBuilder {
    /// The whole shape at once.
    pub fn geometry(mut self, geometry: crate::protocol::abi::GateGeometry) -> Self {
        self.geometry = geometry;
        self
    }

    /// Channels, one producer each (1 ..= 1024).
    pub fn channels(mut self, channels: u32) -> Self {
        self.geometry.channels = channels;
        self
    }

    /// Segments each channel owns (Flink's `buffers-per-channel`, default 2).
    pub fn exclusive(mut self, exclusive: u32) -> Self {
        self.geometry.exclusive = exclusive;
        self
    }

    /// Segments the gate lends to channels with a backlog (Flink's
    /// `floating-buffers-per-gate`, default 8).
    pub fn floating(mut self, floating: u32) -> Self {
        self.geometry.floating = floating;
        self
    }

    /// Bytes per segment (as for a channel).
    pub fn segment_size(mut self, segment_size: u32) -> Self {
        self.geometry.segment_size = segment_size;
        self
    }

    /// How blocking calls wait (see [`WaitStrategy`]).
    pub fn wait_strategy(mut self, wait: WaitStrategy) -> Self {
        self.wait = wait;
        self
    }

    /// The longest record accepted on any channel (see [`Consumer::set_max_record_len`]).
    pub fn max_record_len(mut self, max: u64) -> Self {
        self.max_record_len = max;
        self
    }

    /// Buffer debloating on every channel, with this target time (see
    /// [`Gate::set_debloat_target`](crate::Gate::set_debloat_target)); off by default.
    pub fn debloat_target(mut self, target: std::time::Duration) -> Self {
        self.debloat = Some(target);
        self
    }

    fn apply(&self, mut g: crate::endpoint::gate::Gate) -> crate::endpoint::gate::Gate {
        g.set_wait_strategy(self.wait);
        g.set_max_record_len(self.max_record_len);
        if self.debloat.is_some() {
            g.set_debloat_target(self.debloat);
        }
        g
    }

    /// Creates the named gate (`/name`, mode 0600; fails if it exists) and attaches as its
    /// consumer; producer `c` joins with [`Producer::open_channel`].
    ///
    /// # Errors
    /// As [`Gate::create`](crate::Gate::create).
    ///
    /// Not under `--cfg shmflow_loom`: a named region is an object of the system's shared memory,
    /// which loom cannot model (a model makes its ends with [`pair`](crate::pair) or
    /// `create_anonymous`).
    #[cfg(not(shmflow_loom))]
    pub fn create(&self, name: &str) -> Result<crate::endpoint::gate::Gate, OpenError> {
        crate::endpoint::gate::Gate::create(name, self.geometry).map(|g| self.apply(g))
    }

    /// Creates an anonymous gate: handle `c` gives channel `c` to a child process.
    ///
    /// # Errors
    /// As [`Gate::create_anonymous`](crate::Gate::create_anonymous).
    pub fn create_anonymous(
        &self,
    ) -> Result<(crate::endpoint::gate::Gate, Vec<PeerHandle>), OpenError> {
        let (g, handles) = crate::endpoint::gate::Gate::create_anonymous(self.geometry)?;
        Ok((self.apply(g), handles))
    }
}
