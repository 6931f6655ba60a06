"""shmflow's Python package against Python's own IPC, side by side in one run.

    python3 -m venv .venv && .venv/bin/pip install "./python[test]"
    .venv/bin/pip install iceoryx2        # optional anchors: each skipped with a note if missing
    # tachyon-ipc (Python >= 3.11) builds from source with GCC >= 14 or Clang >= 17 and LTO; on
    # Debian 12: apt-get install clang-19 lld-19, then
    CXX=clang++-19 CC=clang-19 LDFLAGS="-fuse-ld=lld -B/usr/lib/llvm-19/bin -flto" \
        .venv/bin/pip install tachyon-ipc
    .venv/bin/python python/bench.py      # --quick for a short run, --json FILE for the figures

Cases (each run in a fresh pair of processes, the transports alternating run by run; the
figure is the median of the runs, with the lowest and highest):

- 64 B records one at a time: records/s at the reader (one Python call per record each side);
- 64 B records batched: shmflow's ``send_many``/``recv_batch(rows=64)`` from numpy arrays;
- 64 B round trip (ping-pong between two processes): p50 and p99, with blocking calls, and
  with both processes in asyncio (``send_async``/``recv_async`` against asyncio's streams
  over a Unix socket pair);
- 1 MiB numpy arrays (two segments of 1 MiB + 4 KiB): GB/s with the reader touching every
  page, against a ``memcpy`` of 1 MiB (``numpy.copyto``, then the same touch) measured in the
  same run;
- Ctrl-C: from SIGINT to ``KeyboardInterrupt`` in a reader blocked in ``recv``.

The waits are the transports' defaults (shmflow's ``block``); the CPU model is printed.
"""

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import socket
import statistics
import sys
import time

import numpy as np

# The installed package, not its sources next to this file.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
import shmflow  # noqa: E402

CTX = mp.get_context("fork")
SMALL = 64
MIB = 1 << 20


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ---- 64 B one at a time -------------------------------------------------------------------

def one_shmflow(n):
    tx, fd = shmflow.Producer.create_anonymous(segment_size=65536, segment_count=8)
    done = CTX.SimpleQueue()

    def reader():
        rx = shmflow.Consumer.from_fd(fd)
        rx.recv()
        t0 = time.perf_counter()
        k = 1
        for _ in rx:
            k += 1
        done.put((k, time.perf_counter() - t0))
        os._exit(0)

    p = CTX.Process(target=reader)
    p.start()
    os.close(fd)
    rec = b"x" * SMALL
    for _ in range(n):
        tx.send(rec)
    tx.close()
    k, secs = done.get()
    p.join()
    assert k == n, (k, n)
    return (n - 1) / secs


def one_pipe(n):
    a, b = CTX.Pipe(duplex=False)
    done = CTX.SimpleQueue()

    def reader():
        a.recv_bytes()
        t0 = time.perf_counter()
        k = 1
        while a.recv_bytes():
            k += 1
        done.put((k, time.perf_counter() - t0))
        os._exit(0)

    p = CTX.Process(target=reader)
    p.start()
    rec = b"x" * SMALL
    for _ in range(n):
        b.send_bytes(rec)
    b.send_bytes(b"")
    k, secs = done.get()
    p.join()
    assert k == n
    return (n - 1) / secs


def one_queue(n):
    q = CTX.Queue()
    done = CTX.SimpleQueue()

    def reader():
        q.get()
        t0 = time.perf_counter()
        k = 1
        while q.get() is not None:
            k += 1
        done.put((k, time.perf_counter() - t0))
        os._exit(0)

    p = CTX.Process(target=reader)
    p.start()
    rec = b"x" * SMALL
    for _ in range(n):
        q.put(rec)
    q.put(None)
    k, secs = done.get()
    p.join()
    assert k == n
    return (n - 1) / secs


def iceoryx2_or_none():
    try:
        import iceoryx2  # noqa: F401
    except ImportError:
        return None
    return sys.modules["iceoryx2"]


def one_iceoryx2(n):
    import ctypes

    iox2 = iceoryx2_or_none()
    if hasattr(iox2, "set_log_level"):
        iox2.set_log_level(iox2.LogLevel.Error)
    Payload = ctypes.c_ubyte * SMALL
    name = "shmflow/bench/%d/%d" % (os.getpid(), time.monotonic_ns())
    ready = CTX.SimpleQueue()
    done = CTX.SimpleQueue()

    def service(node):
        return (node.service_builder(iox2.ServiceName.new(name))
                .publish_subscribe(Payload)
                .enable_safe_overflow(False)
                .subscriber_max_buffer_size(256)
                .history_size(0)
                .open_or_create())

    def reader():
        node = iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc)
        sub = service(node).subscriber_builder().buffer_size(256).create()
        ready.put(1)
        k, t0 = 0, None
        give_up = time.monotonic() + 120
        spins = 0
        while True:
            s = sub.receive()
            if s is None:
                # Its subscriber only polls: spin, but not forever.
                spins += 1
                if spins % 4096 == 0 and time.monotonic() > give_up:
                    break
                continue
            if t0 is None:
                t0 = time.perf_counter()
            k += 1
            last = s.payload().contents[0] == 1
            del s
            if last:
                break
        done.put((k, time.perf_counter() - t0))
        os._exit(0)

    p = CTX.Process(target=reader)
    p.start()
    ready.get()
    node = iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc)
    pub = (service(node).publisher_builder()
           .backpressure_strategy(iox2.BackpressureStrategy.RetryUntilDelivered).create())
    # The subscriber made before the publisher is known to it once connections are updated
    # (records sent before are not delivered to it).
    pub.update_connections()
    rec = Payload()
    for _ in range(n - 1):
        pub.loan_uninit().write_payload(rec).send()
    rec[0] = 1  # the last
    pub.loan_uninit().write_payload(rec).send()
    k, secs = done.get()
    p.join()
    if k != n:
        print(f"  iceoryx2: the reader got {k} of {n} records (the rest were not delivered)")
    return (k - 1) / secs


def tachyon_or_none():
    try:
        import tachyon  # noqa: F401
    except ImportError:
        return None
    return sys.modules["tachyon"]


def tachyon_path(tag):
    return "/tmp/shmflow-bench-%s-%d-%d.sock" % (tag, os.getpid(), time.monotonic_ns())


def tachyon_connect(path):
    """Connects to a bus whose other side listens (or is about to)."""
    tachyon = tachyon_or_none()
    give_up = time.monotonic() + 30
    while True:
        try:
            return tachyon.Bus.connect(path)
        except Exception:
            if time.monotonic() > give_up:
                raise
            time.sleep(0.001)


def tachyon_send(bus, rec, type_id=0):
    """Its ``send`` raises when the ring is full (no backpressure): retried until it goes."""
    tachyon = tachyon_or_none()
    give_up = None
    while True:
        try:
            return bus.send(rec, type_id=type_id)
        except tachyon.TachyonError:
            if give_up is None:
                give_up = time.monotonic() + 30
            elif time.monotonic() > give_up:
                raise
            time.sleep(0)


def one_tachyon(n):
    tachyon = tachyon_or_none()
    path = tachyon_path("one")
    done = CTX.SimpleQueue()

    def reader():
        with tachyon.Bus.listen(path, 1 << 19) as bus:  # 512 KiB, as shmflow's 8 x 64 KiB
            it = iter(bus)
            next(it)
            t0 = time.perf_counter()
            k = 1
            for m in it:
                k += 1
                if m.type_id == 1:
                    break
            done.put((k, time.perf_counter() - t0))
        os._exit(0)

    p = CTX.Process(target=reader)
    p.start()
    rec = b"x" * SMALL
    with tachyon_connect(path) as bus:
        for _ in range(n - 1):
            tachyon_send(bus, rec)
        tachyon_send(bus, rec, type_id=1)  # the last
        k, secs = done.get()
    p.join()
    assert k == n, (k, n)
    return (n - 1) / secs


# ---- 64 B batched -------------------------------------------------------------------------

def batch_shmflow(n):
    tx, fd = shmflow.Producer.create_anonymous(segment_size=1 << 20, segment_count=8)
    done = CTX.SimpleQueue()

    def reader():
        rx = shmflow.Consumer.from_fd(fd)
        k = len(rx.recv_batch(1 << 16, rows=SMALL))
        t0 = time.perf_counter()
        while True:
            b = rx.recv_batch(1 << 16, rows=SMALL)
            if len(b) == 0:
                break
            k += len(b)
        done.put((k, time.perf_counter() - t0))
        os._exit(0)

    p = CTX.Process(target=reader)
    p.start()
    os.close(fd)
    block = np.zeros((1 << 14, SMALL), dtype=np.uint8)
    sent = 0
    while sent < n:
        sent += tx.send_many(block[: min(len(block), n - sent)])
    tx.close()
    k, secs = done.get()
    p.join()
    assert k == n, (k, n)
    return n / secs


# ---- 64 B round trip ----------------------------------------------------------------------

def rtt_shmflow(n):
    ping, fd1 = shmflow.Producer.create_anonymous(segment_size=65536, segment_count=4)
    pong, fd2 = shmflow.Consumer.create_anonymous(segment_size=65536, segment_count=4)

    def echo():
        rx = shmflow.Consumer.from_fd(fd1)
        tx = shmflow.Producer.from_fd(fd2)
        for r in rx:
            tx.send(r)
        os._exit(0)

    p = CTX.Process(target=echo)
    p.start()
    os.close(fd1)
    os.close(fd2)
    rec = b"x" * SMALL
    lat = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        ping.send(rec)
        pong.recv()
        lat.append(time.perf_counter_ns() - t0)
    ping.close()
    p.join()
    return lat


def rtt_shmflow_asyncio(n):
    ping, fd1 = shmflow.Producer.create_anonymous(segment_size=65536, segment_count=4)
    pong, fd2 = shmflow.Consumer.create_anonymous(segment_size=65536, segment_count=4)

    def echo():
        async def run():
            rx = shmflow.Consumer.from_fd(fd1)
            tx = shmflow.Producer.from_fd(fd2)
            async for r in rx:
                await tx.send_async(r)
        asyncio.run(run())
        os._exit(0)

    p = CTX.Process(target=echo)
    p.start()
    os.close(fd1)
    os.close(fd2)
    rec = b"x" * SMALL

    async def run():
        lat = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            await ping.send_async(rec)
            await pong.recv_async()
            lat.append(time.perf_counter_ns() - t0)
        return lat

    lat = asyncio.run(run())
    ping.close()
    p.join()
    return lat


def rtt_unix_asyncio(n):
    a, b = socket.socketpair()

    def echo():
        a.close()

        async def run():
            r, w = await asyncio.open_unix_connection(sock=b)
            while True:
                try:
                    m = await r.readexactly(SMALL)
                except asyncio.IncompleteReadError:
                    break
                w.write(m)
                await w.drain()
        asyncio.run(run())
        os._exit(0)

    p = CTX.Process(target=echo)
    p.start()
    b.close()
    rec = b"x" * SMALL

    async def run():
        r, w = await asyncio.open_unix_connection(sock=a)
        lat = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            w.write(rec)
            await w.drain()
            await r.readexactly(SMALL)
            lat.append(time.perf_counter_ns() - t0)
        w.close()
        return lat

    lat = asyncio.run(run())
    p.join()
    return lat


def rtt_tachyon(n):
    tachyon = tachyon_or_none()
    ping_path, pong_path = tachyon_path("ping"), tachyon_path("pong")

    def echo():
        with tachyon.Bus.listen(ping_path, 1 << 16) as rx, tachyon_connect(pong_path) as tx:
            for m in rx:
                if m.type_id == 1:
                    break
                tachyon_send(tx, m.data)
        os._exit(0)

    p = CTX.Process(target=echo)
    p.start()
    rec = b"x" * SMALL
    lat = []
    with tachyon_connect(ping_path) as ping, tachyon.Bus.listen(pong_path, 1 << 16) as pong:
        replies = iter(pong)
        for _ in range(n):
            t0 = time.perf_counter_ns()
            tachyon_send(ping, rec)
            next(replies)
            lat.append(time.perf_counter_ns() - t0)
        tachyon_send(ping, b"", type_id=1)
        p.join()
    return lat


def rtt_pipe(n):
    a, b = CTX.Pipe()

    def echo():
        while True:
            m = b.recv_bytes()
            if not m:
                break
            b.send_bytes(m)
        os._exit(0)

    p = CTX.Process(target=echo)
    p.start()
    rec = b"x" * SMALL
    lat = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        a.send_bytes(rec)
        a.recv_bytes()
        lat.append(time.perf_counter_ns() - t0)
    a.send_bytes(b"")
    p.join()
    return lat


def rtt_queue(n):
    q1, q2 = CTX.Queue(), CTX.Queue()

    def echo():
        while True:
            m = q1.get()
            if m is None:
                break
            q2.put(m)
        os._exit(0)

    p = CTX.Process(target=echo)
    p.start()
    rec = b"x" * SMALL
    lat = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        q1.put(rec)
        q2.get()
        lat.append(time.perf_counter_ns() - t0)
    q1.put(None)
    p.join()
    return lat


# ---- 1 MiB arrays -------------------------------------------------------------------------

def touch(view):
    # One byte of every page, read where it is.
    return int(np.frombuffer(view, dtype=np.uint8)[::4096].sum())


def big_shmflow(n):
    # Segments sized for one array each (its 8-byte frame header fits in the extra page),
    # two of them: one filled while the other is read.
    tx, fd = shmflow.Producer.create_anonymous(segment_size=MIB + 4096, segment_count=2)
    done = CTX.SimpleQueue()

    def reader():
        rx = shmflow.Consumer.from_fd(fd)
        touch(rx.recv())
        t0 = time.perf_counter()
        k = 1
        for r in rx:
            touch(r)
            k += 1
        done.put((k, time.perf_counter() - t0))
        os._exit(0)

    p = CTX.Process(target=reader)
    p.start()
    os.close(fd)
    arr = np.ones(MIB, dtype=np.uint8)
    for _ in range(n):
        tx.send(arr)
    tx.close()
    k, secs = done.get()
    p.join()
    assert k == n
    return (n - 1) * MIB / secs / 1e9


def big_pipe(n):
    a, b = CTX.Pipe(duplex=False)
    done = CTX.SimpleQueue()

    def reader():
        touch(a.recv_bytes())
        t0 = time.perf_counter()
        k = 1
        while True:
            m = a.recv_bytes()
            if not m:
                break
            touch(m)
            k += 1
        done.put((k, time.perf_counter() - t0))
        os._exit(0)

    p = CTX.Process(target=reader)
    p.start()
    arr = np.ones(MIB, dtype=np.uint8)
    for _ in range(n):
        b.send_bytes(arr)
    b.send_bytes(b"")
    k, secs = done.get()
    p.join()
    return (n - 1) * MIB / secs / 1e9


def big_memcpy(n):
    src = np.ones(MIB, dtype=np.uint8)
    dst = np.empty(MIB, dtype=np.uint8)
    t0 = time.perf_counter()
    for _ in range(n):
        np.copyto(dst, src)
        touch(dst)
    return n * MIB / (time.perf_counter() - t0) / 1e9


# ---- Ctrl-C --------------------------------------------------------------------------------

def ctrl_c_ms():
    """From SIGINT to KeyboardInterrupt in a reader blocked in recv (CLOCK_MONOTONIC, one
    clock for both processes)."""
    import signal

    tx, fd = shmflow.Producer.create_anonymous(segment_size=4096, segment_count=2)
    done = CTX.SimpleQueue()

    def reader():
        rx = shmflow.Consumer.from_fd(fd)
        done.put("waiting")
        try:
            rx.recv()
        except KeyboardInterrupt:
            done.put(time.monotonic())
        os._exit(0)

    p = CTX.Process(target=reader)
    p.start()
    os.close(fd)
    assert done.get() == "waiting"
    time.sleep(0.3)
    t0 = time.monotonic()
    os.kill(p.pid, signal.SIGINT)
    t1 = done.get()
    p.join()
    del tx
    return (t1 - t0) * 1000


# ---- driver -------------------------------------------------------------------------------

def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": values}


def pct(lat, q):
    s = sorted(lat)
    return s[min(len(s) - 1, int(q * len(s)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer records and runs")
    ap.add_argument("--runs", type=int, default=None, help="runs per transport (default 5)")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    runs = args.runs or (2 if args.quick else 5)
    scale = 0.1 if args.quick else 1.0
    n_one = int(300_000 * scale)
    n_batch = int(20_000_000 * scale)
    n_rtt = int(20_000 * scale)
    n_big = int(2_000 * scale)
    iox = iceoryx2_or_none()

    print(f"CPU: {cpu_model()}; {os.cpu_count()} CPUs; Python {platform.python_version()}; "
          f"{runs} runs per transport, alternating")
    if iox is None:
        print("iceoryx2 is not installed (pip install iceoryx2): its column is left out")
    if tachyon_or_none() is None:
        print("tachyon-ipc is not installed (see this file's docstring): its column is left out")
    out = {"cpu": cpu_model(), "python": platform.python_version(), "runs": runs}

    one = {"shmflow": one_shmflow, "Pipe": one_pipe, "Queue": one_queue}
    if iox is not None:
        one["iceoryx2"] = one_iceoryx2
    if tachyon_or_none() is not None:
        one["tachyon"] = one_tachyon
    res = {k: [] for k in one}
    for _ in range(runs):
        for k, f in one.items():
            try:
                res[k].append(f(n_one))
            except Exception as e:  # an anchor that fails is reported, not fatal
                print(f"  {k}: failed: {e!r}")
    one_s = {k: summary(v) for k, v in res.items() if v}
    out["one_at_a_time_rps"] = one_s

    bat = [batch_shmflow(n_batch) for _ in range(runs)]
    out["batched_rps"] = summary(bat)

    rtt = {"shmflow": rtt_shmflow, "Pipe": rtt_pipe, "Queue": rtt_queue,
           "shmflow asyncio": rtt_shmflow_asyncio, "asyncio Unix socket": rtt_unix_asyncio}
    if tachyon_or_none() is not None:
        rtt["tachyon"] = rtt_tachyon
    rr = {k: [] for k in rtt}
    for _ in range(runs):
        for k, f in rtt.items():
            lat = f(n_rtt)
            rr[k].append((pct(lat, 0.5) / 1000, pct(lat, 0.99) / 1000))
    out["rtt_us"] = {k: {"p50": summary([a for a, _ in v]), "p99": summary([b for _, b in v])}
                     for k, v in rr.items()}

    big = {"shmflow": big_shmflow, "Pipe": big_pipe, "memcpy": big_memcpy}
    rb = {k: [] for k in big}
    for _ in range(runs):
        for k, f in big.items():
            rb[k].append(f(n_big))
    out["mib_arrays_gbps"] = {k: summary(v) for k, v in rb.items()}
    out["ctrl_c_ms"] = summary([ctrl_c_ms() for _ in range(max(runs, 5))])

    def fmt(s, unit=""):
        return f"{s['median']:.3g}{unit} ({s['min']:.3g}-{s['max']:.3g})"

    print("\n64 B records, one Python call each side (records/s, median (min-max))")
    for k, s in one_s.items():
        print(f"  {k:10s} {fmt(s)}")
    # Per run: shmflow over the fastest anchor of the same run.
    per_run = [
        res["shmflow"][i] / max(v[i] for k, v in res.items() if k != "shmflow" and len(v) > i)
        for i in range(len(res.get("shmflow", [])))
        if any(k != "shmflow" and len(v) > i for k, v in res.items())
    ]
    if per_run:
        out["one_vs_fastest_anchor"] = summary(per_run)
        print(f"  shmflow / fastest anchor, per run: {fmt(out['one_vs_fastest_anchor'], 'x')}"
              "  (goal >= 2)")
    print("\n64 B records batched (send_many / recv_batch(rows=64), records/s)")
    print(f"  shmflow    {fmt(out['batched_rps'])}  (goal >= 2e7)")
    print("\n64 B round trip (us)")
    for k, v in out["rtt_us"].items():
        print(f"  {k:20s} p50 {fmt(v['p50'])}  p99 {fmt(v['p99'])}")
    print("\n1 MiB numpy arrays, reader touching every page (GB/s)")
    for k, s in out["mib_arrays_gbps"].items():
        print(f"  {k:10s} {fmt(s)}")
    out["mib_vs_memcpy"] = summary([a / b for a, b in zip(rb["shmflow"], rb["memcpy"])])
    print(f"  shmflow / memcpy, per run: {fmt(out['mib_vs_memcpy'], 'x')}  (goal >= 0.8)")
    print("\nCtrl-C: SIGINT to KeyboardInterrupt in a blocked recv (ms)")
    print(f"  shmflow    {fmt(out['ctrl_c_ms'])}  (goal <= 100)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
