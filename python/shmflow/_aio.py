"""The coroutines behind ``recv_async`` and ``send_async``.

An operation that has to wait is a native ``Pending`` object: a future of the library that
sleeps through shmflow's waker thread (one per process for up to 127 waits at once) and, when
woken, makes an eventfd readable. ``drive`` polls it on the event loop and, between polls,
waits for that descriptor with ``loop.add_reader``: no thread per wait, and the loop runs
other tasks meanwhile.
"""

import asyncio

from ._errors import Timeout

_DONE, _AGAIN = 0, 1


async def ready(value):
    """A result that was there at once, as an awaitable."""
    return value


async def until_end(next_record):
    """``__anext__``: the record, or ``StopAsyncIteration`` at the end of the stream."""
    record = await next_record
    if record is None:
        raise StopAsyncIteration
    return record


def _wake(waiting):
    fut = waiting[0]
    if fut is not None and not fut.done():
        fut.set_result(None)


async def _run(op):
    loop = asyncio.get_running_loop()
    waiting = [None]
    watched = False
    try:
        while True:
            state, value = op.poll()
            if state == _DONE:
                return value
            if state == _AGAIN:
                # The operation yields in its busy phase: other tasks run, then it looks again.
                await asyncio.sleep(0)
                continue
            if not watched:
                loop.add_reader(op.fd, _wake, waiting)
                watched = True
            waiting[0] = loop.create_future()
            await waiting[0]
    finally:
        if watched:
            loop.remove_reader(op.fd)
        # A no-op once done; after a cancellation, withdraws the wait (nothing is lost).
        op.cancel()


async def drive(op, timeout, name):
    """Runs ``op`` to its end, raising ``shmflow.Timeout`` after ``timeout`` seconds."""
    try:
        if timeout is None:
            return await _run(op)
        try:
            return await asyncio.wait_for(_run(op), timeout)
        except asyncio.TimeoutError:
            raise Timeout("%s: the wait ran out of time" % name) from None
    finally:
        # (``wait_for`` may cancel ``_run`` before it starts.)
        op.cancel()
