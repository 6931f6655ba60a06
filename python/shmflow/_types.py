"""What ``Consumer.recv_message`` hands out besides records."""

from typing import NamedTuple, Union


class Event(NamedTuple):
    """An event sent with ``Producer.send_event``."""

    kind: int
    """The number the application gave it."""
    payload: bytes
    priority: bool
    """True if it overtook the records queued before it."""


class Barrier(NamedTuple):
    """A checkpoint barrier sent with ``Producer.send_barrier``."""

    id: int
    emitted_ns: int
    """When it was sent (CLOCK_MONOTONIC, ns)."""
    alignment: Union[str, float]
    """``"aligned"``, ``"unaligned"``, or the seconds after which it turns unaligned."""
    payload: bytes
    priority: bool
    """True for its announcement through the priority lane (unaligned, or with a timeout)."""


Event.__module__ = "shmflow"
Barrier.__module__ = "shmflow"
