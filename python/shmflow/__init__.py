"""shmflow: records between processes through shared memory, with backpressure.

A channel is a pool of fixed-size segments in shared memory. The ``Producer`` copies each
record into a free segment (or lets you fill it in place with ``claim``); the ``Consumer``
reads records where they are, as read-only ``memoryview``s, and hands each segment back when
it moves on. A producer whose consumer is behind waits for a segment: nothing is dropped and
nothing is buffered without bound.

>>> import shmflow
>>> tx, fd = shmflow.Producer.create_anonymous()
>>> rx = shmflow.Consumer.from_fd(fd)
>>> tx.send(b"hello")
>>> bytes(rx.recv())
b'hello'
"""

from ._errors import (
    AlreadyExists,
    Closed,
    ConfigError,
    Corrupt,
    EndOfStream,
    Error,
    IoError,
    NotFound,
    OpenError,
    PeerDead,
    ProducerFailed,
    RecordAborted,
    RecordTooLarge,
    StaleClaim,
    Timeout,
    ViewsHeld,
    WouldBlock,
)
from ._shmflow import (
    LAYOUT_VERSION,
    MAX_BARRIER_PAYLOAD,
    MAX_EVENT_PAYLOAD,
    Consumer,
    Gate,
    Partition,
    Producer,
)
from ._types import Barrier, Event

__all__ = [
    "AlreadyExists",
    "Barrier",
    "Closed",
    "ConfigError",
    "Consumer",
    "Corrupt",
    "EndOfStream",
    "Event",
    "Gate",
    "IoError",
    "Error",
    "LAYOUT_VERSION",
    "MAX_BARRIER_PAYLOAD",
    "MAX_EVENT_PAYLOAD",
    "NotFound",
    "OpenError",
    "Partition",
    "PeerDead",
    "Producer",
    "ProducerFailed",
    "RecordAborted",
    "RecordTooLarge",
    "StaleClaim",
    "Timeout",
    "ViewsHeld",
    "WouldBlock",
]
