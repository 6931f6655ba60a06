"""shmflow's Python package across real processes: order, backpressure, a killed peer, views
that outlive their record, numpy without copies, Ctrl-C, threads."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import shmflow

SMALL = dict(segment_size=4096, segment_count=2)


def child(code, fd, **kw):
    """A Python child that gets the descriptor `fd` as FD (or a list of them as FDS) and
    runs `code`."""
    fds = fd if isinstance(fd, list) else [fd]
    src = ("import os, sys, time, asyncio, numpy as np, shmflow\nFD = %d\nFDS = %r\n"
           % (fds[0], fds) + textwrap.dedent(code))
    return subprocess.Popen(
        [sys.executable, "-c", src], pass_fds=fds, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd="/", **kw)


def finish(p, timeout=60):
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, f"child exited {p.returncode}: {err}"
    return out


def test_a_million_records_arrive_in_order_and_complete():
    tx, fd = shmflow.Producer.create_anonymous(segment_size=65536, segment_count=8)
    p = child("""
        rx = shmflow.Consumer.from_fd(FD)
        expect, total = 0, 0
        while True:
            batch = rx.recv_batch(100_000, rows=8)
            if len(batch) == 0:
                break
            got = np.frombuffer(batch, dtype="<u8")
            assert (got == np.arange(expect, expect + len(got), dtype="<u8")).all(), expect
            expect += len(got)
            total += int(got.sum())
        print(expect, total)
    """, fd)
    os.close(fd)
    n = 1_000_000
    data = np.arange(n, dtype="<u8")
    sent = 0
    for chunk in np.array_split(data, 10):
        sent += tx.send_many(chunk, timeout=60)
    tx.close()
    count, total = map(int, finish(p).split())
    assert sent == n and count == n
    assert total == n * (n - 1) // 2


def test_records_one_at_a_time_keep_their_bytes():
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    p = child("""
        rx = shmflow.Consumer.from_fd(FD)
        n = 0
        for rec in rx:
            assert bytes(rec) == (b"%d:" % n) * (n % 50 + 1), n
            n += 1
        print(n)
    """, fd)
    os.close(fd)
    for i in range(20_000):
        tx.send((b"%d:" % i) * (i % 50 + 1))
    # A record larger than a segment spans segments and arrives as one copy.
    big = bytes(range(256)) * 100
    tx.close()
    assert int(finish(p)) == 20_000
    tx2, fd2 = shmflow.Producer.create_anonymous(**SMALL)
    p = child("""
        rx = shmflow.Consumer.from_fd(FD)
        print(bytes(rx.recv()) == bytes(range(256)) * 100)
    """, fd2)
    os.close(fd2)
    tx2.send(big)
    tx2.close()
    assert finish(p).strip() == "True"


def test_a_slow_reader_holds_the_writer_back():
    # Two segments, one record each: the writer can be two records ahead, not three.
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    p = child("""
        rx = shmflow.Consumer.from_fd(FD)
        for line in sys.stdin:
            rec = rx.recv()
            print(rec[0], flush=True)
    """, fd, stdin=subprocess.PIPE)
    os.close(fd)
    tx.send(b"\x00" * 4000)
    tx.send(b"\x01" * 4000)
    assert tx.try_send(b"\x02" * 4000) is False  # held back: nothing dropped, nothing queued
    with pytest.raises(shmflow.Timeout):
        tx.send(b"\x02" * 4000, timeout=0.05)

    def read_one():
        p.stdin.write("next\n")
        p.stdin.flush()
        return p.stdout.readline().strip()

    assert read_one() == "0"
    # Record 0's segment goes back when the reader moves past it, to record 1.
    assert read_one() == "1"
    tx.send(b"\x02" * 4000, timeout=30)
    assert read_one() == "2"
    assert tx.metrics()["backpressured_ns"] > 0
    p.stdin.close()
    tx.close()
    assert p.wait(timeout=60) == 0


def test_a_killed_producer_is_reported_as_dead():
    rx, fd = shmflow.Consumer.create_anonymous(**SMALL)
    p = child("""
        tx = shmflow.Producer.from_fd(FD)
        for i in range(10):
            tx.send(bytes([i]) * 100)
        print("sent", flush=True)
        time.sleep(600)
    """, fd)
    os.close(fd)
    assert p.stdout.readline().strip() == "sent"
    for i in range(10):
        assert bytes(rx.recv(timeout=30)) == bytes([i]) * 100
    p.send_signal(signal.SIGKILL)
    p.wait()
    with pytest.raises(shmflow.PeerDead):
        rx.recv(timeout=30)
    with pytest.raises(shmflow.PeerDead):  # and from then on
        rx.recv(timeout=1)


def test_a_view_is_released_by_the_next_receive():
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    rx = shmflow.Consumer.from_fd(fd)
    os.close(fd)
    tx.send(b"first")
    tx.send(b"second")
    v = rx.recv()
    assert bytes(v) == b"first" and v.readonly
    w = rx.recv()
    with pytest.raises(ValueError):
        bytes(v)
    assert bytes(w) == b"second"
    rx.release()
    with pytest.raises(ValueError):
        w[0]


def test_an_array_over_a_record_keeps_its_segment_until_it_goes():
    tx, fd = shmflow.Producer.create_anonymous(segment_size=4096, segment_count=3)
    rx = shmflow.Consumer.from_fd(fd)
    os.close(fd)
    tx.send(np.full(500, 7, dtype="<u8"))  # 4000 bytes: one record per segment
    arr = np.frombuffer(rx.recv(), dtype="<u8")
    for i in range(2):
        tx.send(np.full(500, i, dtype="<u8"))
        assert np.frombuffer(rx.recv(), dtype="<u8")[0] == i
        rx.release()
    # The array's segment stayed with it; the reader has the last record's segment in hand,
    # so the writer has one segment left, not two...
    assert rx.held_segments == 1
    tx.send(b"\x01" * 4000, timeout=30)
    assert tx.try_send(b"\x03" * 4000) is False
    # ...and the array still reads what was sent.
    assert (arr == 7).all()
    del arr
    assert rx.recv()[0] == 1  # gives the array's segment back
    assert rx.held_segments == 0
    assert tx.try_send(b"\x03" * 4000) is True


def test_views_that_hold_every_segment_are_reported_not_waited_on():
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    rx = shmflow.Consumer.from_fd(fd)
    os.close(fd)
    kept = []
    for i in range(2):
        tx.send(bytes([i]) * 4000)
        kept.append(np.frombuffer(rx.recv(), dtype=np.uint8))
    rx.release()
    # The writer wants a third segment: it hands the second over (sealed) and waits.
    writer_saw = []

    def write():
        try:
            tx.send(b"\x02" * 4000, timeout=5)
        except shmflow.Timeout as e:
            writer_saw.append(e)

    t = threading.Thread(target=write)
    t.start()
    with pytest.raises(shmflow.ViewsHeld):
        rx.recv(timeout=30)
    assert rx.held_segments == 2
    t.join()
    assert writer_saw and [int(a[0]) for a in kept] == [0, 1]
    del kept  # the views went: their segments go back, and the stream goes on
    tx.send(b"\x03" * 4000, timeout=30)
    assert rx.recv(timeout=30)[0] == 3


def test_numpy_reads_the_shared_segment_without_a_copy():
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    rx = shmflow.Consumer.from_fd(fd)
    os.close(fd)
    tx.send(np.arange(100, dtype="<u4"))
    arr = np.frombuffer(rx.recv(), dtype="<u4")
    assert not arr.flags.owndata and not arr.flags.writeable
    address = arr.__array_interface__["data"][0]
    with open("/proc/self/maps") as maps:
        spans = [line.split() for line in maps]
    owner = [s for s in spans
             if int(s[0].split("-")[0], 16) <= address < int(s[0].split("-")[1], 16)]
    assert owner and "memfd:" in " ".join(owner[0][5:]), owner  # the channel's shared memory
    assert (arr == np.arange(100)).all()


def test_a_claim_is_filled_in_place_and_sent_by_commit():
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    rx = shmflow.Consumer.from_fd(fd)
    os.close(fd)
    view = tx.claim(16)
    assert not view.readonly
    np.frombuffer(view, dtype="<u8")[:] = [7, 9]  # the array is a temporary: gone here
    with pytest.raises(shmflow.Error):
        tx.send(b"no")  # no other call while a claim is open
    tx.commit()
    assert list(np.frombuffer(rx.recv(), dtype="<u8")) == [7, 9]
    view = tx.claim(8)
    keep = np.frombuffer(view, dtype=np.uint8)
    with pytest.raises(shmflow.ViewsHeld):
        tx.commit()
    del keep
    tx.commit(4)
    assert len(rx.recv()) == 4


def test_ctrl_c_interrupts_a_blocked_receive():
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    p = child("""
        rx = shmflow.Consumer.from_fd(FD)
        print("waiting", flush=True)
        try:
            rx.recv()
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """, fd)
    os.close(fd)
    assert p.stdout.readline().strip() == "waiting"
    time.sleep(0.2)  # into the wait
    p.send_signal(signal.SIGINT)
    assert finish(p, timeout=30).strip() == "interrupted"


def test_ctrl_c_interrupts_a_blocked_send():
    rx, fd = shmflow.Consumer.create_anonymous(**SMALL)
    p = child("""
        tx = shmflow.Producer.from_fd(FD)
        tx.send(b"a" * 4000)
        tx.send(b"b" * 4000)
        print("waiting", flush=True)
        try:
            tx.send(b"c" * 4000)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """, fd)
    os.close(fd)
    assert p.stdout.readline().strip() == "waiting"
    time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    assert finish(p, timeout=30).strip() == "interrupted"


def test_threads_wait_without_holding_the_interpreter():
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    rx = shmflow.Consumer.from_fd(fd)
    os.close(fd)
    n = 50_000

    def write():
        with tx:
            for i in range(n):
                tx.send(i.to_bytes(8, "little"))

    t = threading.Thread(target=write)
    t.start()
    seen = [int.from_bytes(r, "little") for r in rx]
    t.join()
    assert seen == list(range(n))


def test_an_exception_in_the_producers_block_fails_the_stream():
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    rx = shmflow.Consumer.from_fd(fd)
    os.close(fd)
    with pytest.raises(RuntimeError):
        with tx:
            tx.send(b"before")
            raise RuntimeError("stage crashed")
    assert bytes(rx.recv()) == b"before"
    with pytest.raises(shmflow.ProducerFailed):
        rx.recv(timeout=10)


def test_errors_are_typed():
    with pytest.raises(shmflow.NotFound) as e:
        shmflow.Consumer.open("/shmflow-py-no-such-channel")
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, shmflow.Error)
    with pytest.raises(shmflow.ConfigError):
        shmflow.Producer.create_anonymous(segment_size=100, segment_count=2)
    with pytest.raises(TypeError):
        shmflow.Producer.create_anonymous()[0].send(12)
    with pytest.raises(ValueError):
        shmflow.Consumer.create_anonymous()[0].set_wait("sometimes")
    tx, fd = shmflow.Producer.create_anonymous()
    rx = shmflow.Consumer.from_fd(fd)
    os.close(fd)
    rx.close()
    with pytest.raises(shmflow.Closed):  # at the latest when it would wait for a segment
        for _ in range(100):
            tx.send(b"x" * 60000, timeout=30)


def test_named_channels_across_processes():
    name = "/shmflow-py-test-%d" % os.getpid()
    with shmflow.Producer.create(name, **SMALL) as tx:
        p = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
            import shmflow, sys
            with shmflow.Consumer.open(sys.argv[1]) as rx:
                print(sum(len(r) for r in rx))
        """), name], stdout=subprocess.PIPE, text=True, cwd="/")
        for i in range(1000):
            tx.send(b"x" * (i % 100))
    out, _ = p.communicate(timeout=60)
    assert int(out) == sum(i % 100 for i in range(1000))
    assert not os.path.exists("/dev/shm" + name)


def test_events_and_barriers_arrive_in_their_place():
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    p = child("""
        rx = shmflow.Consumer.from_fd(FD)
        seen = []
        while True:
            m = rx.recv_message(timeout=30)
            if m is None:
                break
            if isinstance(m, shmflow.Event):
                seen.append(("event", m.kind, m.payload, m.priority))
            elif isinstance(m, shmflow.Barrier):
                seen.append(("barrier", m.id, m.alignment, m.payload))
            else:
                seen.append(("record", bytes(m)))
        print(repr(seen))
    """, fd)
    os.close(fd)
    tx.send(b"one")
    tx.send_event(7, b"config")
    tx.send(b"two")
    tx.send_barrier(1, payload=b"cp")
    tx.send(b"three")
    tx.close()
    import ast
    seen = ast.literal_eval(finish(p).strip())
    assert seen == [
        ("record", b"one"),
        ("event", 7, b"config", False),
        ("record", b"two"),
        ("barrier", 1, "aligned", b"cp"),
        ("record", b"three"),
    ]
    # A plain receive skips them.
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    rx = shmflow.Consumer.from_fd(fd)
    os.close(fd)
    tx.send_event(1)
    tx.send(b"r")
    tx.send_barrier(2, alignment="unaligned")
    tx.close()
    assert [bytes(r) for r in rx] == [b"r"]
    with pytest.raises(ValueError):
        shmflow.Producer.create_anonymous()[0].send_barrier(3, alignment="sideways")


def test_a_batch_keeps_the_records_before_a_failure():
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    rx = shmflow.Consumer.from_fd(fd)
    os.close(fd)
    for i in range(5):
        tx.send(bytes([i]) * 10)
    tx.fail()
    batch = rx.recv_batch(100, timeout=10)
    assert [bytes(v)[0] for v in batch] == [0, 1, 2, 3, 4]
    with pytest.raises(shmflow.ProducerFailed):
        rx.recv_batch(100, timeout=10)
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    rx = shmflow.Consumer.from_fd(fd)
    os.close(fd)
    tx.send_many(np.arange(3, dtype="<u8"))
    tx.send(b"odd")
    tx.fail()
    rows = rx.recv_batch(100, timeout=10, rows=8)
    assert list(np.frombuffer(rows, dtype="<u8")) == [0, 1, 2]
    with pytest.raises(ValueError):  # the record of another length comes next, by recv
        rx.recv_batch(100, timeout=10, rows=8)
    assert bytes(rx.recv(timeout=10)) == b"odd"
    with pytest.raises(shmflow.ProducerFailed):
        rx.recv(timeout=10)


def test_misuses_of_a_claim_or_a_batch_keep_the_state():
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    rx = shmflow.Consumer.from_fd(fd)
    os.close(fd)
    view = tx.claim(8)
    view[:] = b"abcdefgh"
    with pytest.raises(ValueError):
        tx.commit(9)
    tx.commit(8)  # the claim was still open
    assert bytes(rx.recv(timeout=10)) == b"abcdefgh"
    with pytest.raises(TypeError):
        tx.send_many(b"abc")
    # A batch that runs out of time says how many records went.
    with pytest.raises(shmflow.Timeout) as e:
        tx.send_many([b"x" * 4000] * 5, timeout=0.2)
    assert 1 <= e.value.sent < 5


def test_failing_with_views_of_a_claim_alive_fails_once_they_go():
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    rx = shmflow.Consumer.from_fd(fd)
    os.close(fd)
    tx.send(b"before")
    with pytest.raises(RuntimeError):
        with tx:
            keep = np.frombuffer(tx.claim(8), dtype=np.uint8)
            raise RuntimeError("stage crashed")  # not masked by the live view
    assert bytes(rx.recv(timeout=10)) == b"before"
    del tx
    del keep
    with pytest.raises(shmflow.ProducerFailed):
        rx.recv(timeout=10)


def test_a_gate_reads_every_channel_and_reports_a_dead_one():
    name = "/shmflow-py-gate-%d" % os.getpid()
    with shmflow.Gate.create(name, channels=3, segment_size=4096) as gate:
        writers = [subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
            import shmflow, sys, time
            c = int(sys.argv[2])
            tx = shmflow.Producer.open_channel(sys.argv[1], c)
            for i in range(5000):
                tx.send(b"%d:%d" % (c, i))
            if c == 2:
                print("sent", flush=True)
                time.sleep(600)  # killed here
            tx.close()
        """), name, str(c)], stdout=subprocess.PIPE, text=True, cwd="/") for c in range(3)]
        got = {0: [], 1: [], 2: []}
        while sum(len(v) for v in got.values()) < 15000:
            channel, record = gate.recv(timeout=30)
            c, i = bytes(record).split(b":")
            assert int(c) == channel
            got[channel].append(int(i))
        assert all(got[c] == list(range(5000)) for c in range(3))  # each channel in order
        assert writers[2].stdout.readline().strip() == "sent"
        writers[2].kill()
        writers[2].wait()
        with pytest.raises(shmflow.PeerDead) as e:
            gate.recv(timeout=30)
        assert e.value.channel == 2
        assert gate.recv(timeout=30) is None  # the other two ended cleanly
        for w in writers[:2]:
            assert w.wait(timeout=60) == 0
    assert not os.path.exists("/dev/shm" + name)  # nothing left behind



def os_threads():
    return len(os.listdir("/proc/self/task"))


async def ticking(body):
    """Awaits `body` while a task ticks every millisecond; returns its result and the ticks
    (a loop blocked by a wait would not tick)."""
    ticks = 0

    async def tick():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    t = asyncio.create_task(tick())
    try:
        return await body, ticks
    finally:
        t.cancel()


def test_asyncio_receives_from_another_process_while_the_loop_runs():
    rx, fd = shmflow.Consumer.create_anonymous(**SMALL)
    p = child("""
        tx = shmflow.Producer.from_fd(FD)
        for burst in range(20):
            for i in range(1000):
                n = burst * 1000 + i
                tx.send(n.to_bytes(8, "little") * (n % 20 + 1))
            time.sleep(0.01)
        tx.send(b"x" * 10_000)  # spans segments
        tx.close()
    """, fd)
    os.close(fd)

    async def read():
        n = 0
        async for rec in rx:
            if n == 20_000:
                assert bytes(rec) == b"x" * 10_000
            else:
                assert bytes(rec) == n.to_bytes(8, "little") * (n % 20 + 1), n
            n += 1
        return n

    n, ticks = asyncio.run(ticking(read()))
    finish(p)
    assert n == 20_001
    # The loop ran while the receive waited for the child's bursts (20 pauses of 10 ms).
    assert ticks >= 20


def test_asyncio_send_waits_for_a_slow_reader_without_blocking_the_loop():
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    p = child("""
        rx = shmflow.Consumer.from_fd(FD)
        n = 0
        for rec in rx:
            assert bytes(rec) == n.to_bytes(4, "little") * 250, n
            n += 1
            if n % 100 == 0:
                time.sleep(0.01)
        print(n)
    """, fd)
    os.close(fd)

    async def write():
        for n in range(3000):
            await tx.send_async(n.to_bytes(4, "little") * 250)
        return tx.metrics()

    m, ticks = asyncio.run(ticking(write()))
    tx.close()
    assert int(finish(p)) == 3000
    assert m["backpressured_ns"] > 0
    assert ticks >= 20  # 30 pauses of the reader


def test_asyncio_waits_share_one_thread():
    pairs = [shmflow.Consumer.create_anonymous(**SMALL) for _ in range(40)]
    fds = [fd for _, fd in pairs]
    p = child("""
        txs = [shmflow.Producer.from_fd(fd) for fd in FDS]
        print("open", flush=True)
        sys.stdin.readline()
        for i, tx in enumerate(txs):
            tx.send(b"%d" % i)
            tx.close()
    """, fds, stdin=subprocess.PIPE)
    for fd in fds:
        os.close(fd)
    assert p.stdout.readline().strip() == "open"

    async def main():
        before = os_threads()
        tasks = [asyncio.create_task(rx.recv_async(timeout=60)) for rx, _ in pairs]
        await asyncio.sleep(0.3)  # every task is waiting now
        assert not any(t.done() for t in tasks)
        during = os_threads()
        p.stdin.write("go\n")
        p.stdin.flush()
        got = [bytes(await t) for t in tasks]
        return before, during, got

    before, during, got = asyncio.run(main())
    finish(p)
    assert got == [b"%d" % i for i in range(40)]
    # 40 waits: at most shmflow's one waker thread more than before.
    assert during - before <= 1, (before, during)


def test_asyncio_cancelled_waits_lose_nothing():
    rx, fd = shmflow.Consumer.create_anonymous(**SMALL)
    p = child("""
        tx = shmflow.Producer.from_fd(FD)
        sys.stdin.readline()
        for i in range(3):
            tx.send(bytes([i]) * 3000)
        tx.close()
    """, fd, stdin=subprocess.PIPE)
    os.close(fd)

    async def main():
        with pytest.raises(shmflow.Timeout):
            await rx.recv_async(timeout=0.2)
        t = asyncio.create_task(rx.recv_async())
        await asyncio.sleep(0.1)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        p.stdin.write("go\n")
        p.stdin.flush()
        return [bytes(r) async for r in rx]

    got = asyncio.run(main())
    finish(p)
    assert got == [bytes([i]) * 3000 for i in range(3)]

    # A send cancelled while it waits for a segment sends nothing.
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    rx = shmflow.Consumer.from_fd(fd)
    os.close(fd)

    async def send():
        await tx.send_async(b"a" * 3000)
        await tx.send_async(b"b" * 3000)
        with pytest.raises(shmflow.Timeout):
            await tx.send_async(b"c" * 3000, timeout=0.2)
        # The end is usable again at once.
        tx.close()

    asyncio.run(send())
    assert [bytes(r) for r in rx] == [b"a" * 3000, b"b" * 3000]


def test_asyncio_a_killed_producer_is_reported_as_dead():
    rx, fd = shmflow.Consumer.create_anonymous(**SMALL)
    p = child("""
        tx = shmflow.Producer.from_fd(FD)
        tx.send(b"last words")
        print("sent", flush=True)
        time.sleep(600)
    """, fd)
    os.close(fd)
    assert p.stdout.readline().strip() == "sent"

    async def main():
        assert bytes(await rx.recv_async(timeout=30)) == b"last words"
        waiting = asyncio.create_task(rx.recv_async(timeout=30))
        await asyncio.sleep(0.2)
        p.send_signal(signal.SIGKILL)
        with pytest.raises(shmflow.PeerDead):
            await waiting

    asyncio.run(main())
    p.wait()


def test_asyncio_a_view_dropped_while_a_receive_waits_frees_its_segment():
    tx, fd = shmflow.Producer.create_anonymous(segment_size=4096, segment_count=3)
    rx = shmflow.Consumer.from_fd(fd)
    os.close(fd)

    async def main():
        tx.send(b"\x00" * 3000)  # one record per segment
        tx.send(b"\x01" * 3000)
        arr = np.frombuffer(await rx.recv_async(), dtype="u1")  # keeps the first segment
        assert (await rx.recv_async())[0] == 1
        reader = asyncio.create_task(rx.recv_async(timeout=30))
        await asyncio.sleep(0.1)
        assert tx.metrics()["segments_returned"] == 0
        with pytest.raises(RuntimeError):  # the consumer is busy with the async receive
            rx.recv(timeout=0)
        del arr
        await asyncio.sleep(0.1)
        # The array's segment went back to the writer while the receive still waits.
        assert not reader.done()
        assert tx.metrics()["segments_returned"] == 1
        tx.send(b"\x02" * 3000)
        assert (await reader)[0] == 2

    asyncio.run(main())


def test_asyncio_ctrl_c_stops_the_loop():
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    p = child("""
        rx = shmflow.Consumer.from_fd(FD)
        async def main():
            print("waiting", flush=True)
            await rx.recv_async()
        try:
            asyncio.run(main())
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """, fd)
    os.close(fd)
    assert p.stdout.readline().strip() == "waiting"
    time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    assert finish(p, timeout=30).strip() == "interrupted"


def test_a_partition_routes_records_to_readers_in_another_process():
    pairs = [shmflow.Producer.create_anonymous(**SMALL) for _ in range(3)]
    fds = [fd for _, fd in pairs]
    p = child("""
        import zlib
        rxs = [shmflow.Consumer.from_fd(fd) for fd in FDS]
        for i, rx in enumerate(rxs):
            recs, events, barriers = [], [], []
            while (m := rx.recv_message(timeout=60)) is not None:
                if isinstance(m, shmflow.Event):
                    events.append(m.kind)
                elif isinstance(m, shmflow.Barrier):
                    barriers.append(m.id)
                elif len(m) == 10_000:
                    assert bytes(m) == b"y" * 10_000
                    recs.append("big")
                else:
                    recs.append(bytes(m).decode())
            print(i, ",".join(recs), events, barriers)
    """, fds)
    for fd in fds:
        os.close(fd)
    txs = [tx for tx, _ in pairs]
    import zlib
    with shmflow.Partition(txs, partitioner=lambda r: zlib.crc32(bytes(r))) as part:
        assert part.channels == 3
        with pytest.raises(shmflow.Closed):  # the producers belong to the partition now
            txs[0].send(b"x")
        words = ["apple", "pear", "fig", "plum", "kiwi", "lime", "apple", "fig"]
        for w in words:
            part.send(w.encode(), timeout=30)
        part.send_event(7)
        part.send_to(1, b"direct")
        part.send_keyed(5, b"five")  # 5 % 3 == 2
        part.send_keyed(-1, b"minus one")  # -1 % 3 == 2, as Python computes it
        part.send_to(0, b"y" * 10_000)  # longer than a segment: sent whole
        part.send_barrier(1)
        with pytest.raises(IndexError):
            part.send_to(3, b"nowhere")
    out = finish(p).splitlines()
    got = {int(line.split(" ", 1)[0]): line.split(" ", 1)[1] for line in out}
    import zlib as z
    for i in range(3):
        expect = [w for w in words if z.crc32(w.encode()) % 3 == i]
        if i == 0:
            expect.append("big")
        if i == 1:
            expect.append("direct")
        if i == 2:
            expect += ["five", "minus one"]
        assert got[i] == "%s [7] [1]" % ",".join(expect), (i, got[i])

    # A partition that cannot take every producer takes none.
    free, fd1 = shmflow.Producer.create_anonymous(**SMALL)
    busy, fd2 = shmflow.Producer.create_anonymous(**SMALL)
    rx1 = shmflow.Consumer.from_fd(fd1)
    os.close(fd1)
    # (fd2 stays open: busy's consumer may still come, so only its open claim refuses it.)
    busy.claim(8)
    with pytest.raises(shmflow.Error):
        shmflow.Partition([free, busy])
    os.close(fd2)
    free.send(b"still mine")
    assert bytes(rx1.recv(timeout=5)) == b"still mine"

    # Round-robin and broadcast, read in this process.
    for mode in ("round_robin", "broadcast"):
        ends = [shmflow.Producer.create_anonymous(**SMALL) for _ in range(2)]
        rxs = [shmflow.Consumer.from_fd(fd) for _, fd in ends]
        for _, fd in ends:
            os.close(fd)
        part = shmflow.Partition([tx for tx, _ in ends], partitioner=mode)
        for i in range(4):
            part.send(b"%d" % i)
        part.close()
        seen = [[bytes(r) for r in rx] for rx in rxs]
        if mode == "round_robin":
            assert seen == [[b"0", b"2"], [b"1", b"3"]]
        else:
            assert seen == [[b"0", b"1", b"2", b"3"]] * 2


# Forking a process with threads is the case under test (shmflow's waker thread runs).
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_asyncio_in_a_child_forked_after_the_parent_waited():
    import multiprocessing
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    rx = shmflow.Consumer.from_fd(fd)
    os.close(fd)

    async def wait_once():
        t = asyncio.create_task(rx.recv_async(timeout=30))
        await asyncio.sleep(0.1)  # the receive waits through shmflow's waker thread
        tx.send(b"parent")
        return bytes(await t)

    assert asyncio.run(wait_once()) == b"parent"
    # A child forked now inherits the waker thread's bookkeeping but not the thread.
    child_tx, child_fd = shmflow.Producer.create_anonymous(**SMALL)
    got_end, done = multiprocessing.get_context("fork").Pipe(duplex=False)

    def in_child():
        crx = shmflow.Consumer.from_fd(child_fd)

        async def main():
            t = asyncio.create_task(crx.recv_async(timeout=20))
            await asyncio.sleep(0.1)
            child_tx.send(b"child")
            return bytes(await t)

        try:
            done.send(asyncio.run(main()))
        except BaseException as e:  # reported to the parent, which fails the test
            done.send(repr(e))
        os._exit(0)

    p = multiprocessing.get_context("fork").Process(target=in_child)
    p.start()
    assert got_end.poll(60), "the child's receive did not finish"
    got = got_end.recv()
    p.join(timeout=30)
    os.close(child_fd)
    assert got == b"child", got


def test_asyncio_a_record_larger_than_the_channel_between_two_tasks_of_one_loop():
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    rx = shmflow.Consumer.from_fd(fd)
    os.close(fd)
    big = bytes(range(256)) * 80  # 20 KiB through 8 KiB of segments, part by part

    async def main():
        writer = asyncio.create_task(tx.send_async(big, timeout=30))
        await asyncio.sleep(0)  # the writer's first parts are in
        got = bytes(await rx.recv_async(timeout=30))
        await writer
        return got

    assert asyncio.run(main()) == big


def test_asyncio_calls_are_refused_off_the_loop_thread():
    tx, fd = shmflow.Producer.create_anonymous(**SMALL)
    rx = shmflow.Consumer.from_fd(fd)
    os.close(fd)
    with pytest.raises(RuntimeError, match="event loop"):
        rx.recv_async()
    with pytest.raises(RuntimeError, match="event loop"):
        tx.send_async(b"x")
    # Nothing was taken or held: the ends work as before.
    tx.send(b"x")
    assert bytes(rx.recv(timeout=5)) == b"x"
