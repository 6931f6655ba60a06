"""The exceptions shmflow raises: one class per kind of failure, all under ``shmflow.Error``."""


class Error(Exception):
    """Any shmflow failure."""


class OpenError(Error, OSError):
    """Creating or opening a channel failed (see the message for why)."""


class NotFound(OpenError, FileNotFoundError):
    """No channel of that name exists."""


class AlreadyExists(OpenError, FileExistsError):
    """A channel of that name exists already."""


class ConfigError(Error, ValueError):
    """A setting is out of range (segment size or count, ...)."""


class Timeout(Error, TimeoutError):
    """A call with ``timeout=`` ran out of time."""


class WouldBlock(Error):
    """A call could not be done without waiting."""


class Closed(Error):
    """The other end detached, or this end was closed."""


class EndOfStream(Error):
    """``try_recv`` at the end of the stream (``recv`` returns ``None`` there)."""


class PeerDead(Error):
    """The process at the other end died."""


class ProducerFailed(Error):
    """The producer ended the stream as failed (``Producer.fail()``, or an exception in its
    ``with`` block)."""


class Corrupt(Error):
    """The shared memory holds values a correct peer does not write."""


class RecordTooLarge(Error, ValueError):
    """A record or event is over a limit."""


class RecordAborted(Error):
    """A record spanning segments was abandoned half-way by its producer."""


class ViewsHeld(Error, BufferError):
    """Views of records (or of a claim) that are still alive stop the call: release them
    (``del``, ``memoryview.release()``) or copy them (``bytes(view)``)."""


class IoError(Error, OSError):
    """A system call failed (the message names it and the channel)."""


class StaleClaim(Error):
    """``commit()`` found the claim stale: the producer moved on since the claim."""


# Shown as ``shmflow.Timeout`` (not ``shmflow._errors.Timeout``) in tracebacks.
for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, Error):
        _cls.__module__ = "shmflow"
del _cls
