#!/usr/bin/env python3
"""Writes seed inputs for the `wire` fuzz target into corpus/wire/: well-formed exchanges,
so that mutations start past the magic and the length checks. Run from fuzz/."""

import os
import struct

MAGIC = 0x53464E54


def frame(kind, body):
    return struct.pack("<IIBBH", 8 + len(body), MAGIC, 1, kind, 0) + body


def request(ch, credit, seg, name):
    n = name.encode()
    return frame(1, struct.pack("<IIIH", ch, credit, seg, len(n)) + n)


def buffer(ch, backlog, offset, frames):
    return frame(2, struct.pack("<IIII", ch, backlog, offset, 0) + frames)


def whole(payload):
    f = struct.pack("<II", len(payload), 0x53460001) + payload
    return f + b"\0" * (-len(f) % 8)


def barrier(ckpt, emitted, timeout, payload=b""):
    """An in-band checkpoint barrier: an EVENT frame whose kind word has the barrier tag."""
    body = struct.pack("<QQQQ", 0x42525252 << 32, ckpt, emitted, timeout) + payload
    f = struct.pack("<II", len(body), 0x53460006) + body
    return f + b"\0" * (-len(f) % 8)


def announce(ch, ckpt, emitted, timeout, payload=b""):
    return frame(9, struct.pack("<IQQQ", ch, ckpt, emitted, timeout) + payload)


SEAL = struct.pack("<II", 0, 0x53460007)
FIRST = struct.pack("<II", 4096 - 8, 0x53460002) + b"\x11" * (4096 - 8)
LAST = struct.pack("<II", 100, 0x53460004) + b"\x22" * 100 + b"\0" * 4

seeds = {
    # First byte 0 (mod 4): a client reads these as the server's answer.
    "client-records": b"\0" + buffer(0, 1, 0, whole(b"hello") + whole(b"")) +
    buffer(0, 0, 24, whole(b"x" * 40) + SEAL) + frame(4, struct.pack("<II", 0, 0)),
    "client-span": b"\0" + buffer(1, 2, 0, FIRST) + buffer(1, 0, 0, LAST + SEAL) +
    frame(8, struct.pack("<II", 1, 9) + b"barrier") + frame(4, struct.pack("<II", 1, 1)),
    "client-error": b"\0" + frame(7, b"") + frame(6, struct.pack("<IIH", 0, 1, 3) + b"bad"),
    "client-barriers": b"\0" + announce(0, 5, 1000, 0, b"u") +
    buffer(0, 0, 0, whole(b"a") + barrier(4, 900, 2**64 - 1) + whole(b"b") +
           barrier(5, 1000, 0, b"u")) + announce(0, 6, 2000, 50_000_000) +
    buffer(0, 0, 120, barrier(6, 2000, 50_000_000)) + frame(4, struct.pack("<II", 0, 0)),
    # 1: a server reads these as a client's requests.
    "server-request": b"\1" + request(0, 2, 4096, "a") + frame(3, struct.pack("<II", 0, 3)) +
    frame(7, b"") + frame(5, struct.pack("<I", 0)),
    "server-unknown": b"\1" + request(3, 1, 4096, "nope") + request(4, 1, 8192, "a"),
    # 2: a direct consumer reads these as its sender's messages (one large buffer goes
    # straight into its segment).
    "direct-records": b"\2" + buffer(0, 1, 0, whole(b"hello") + whole(b"")) +
    buffer(0, 0, 24, whole(b"x" * 5000) + SEAL) + frame(8, struct.pack("<II", 0, 9) + b"p") +
    frame(4, struct.pack("<II", 0, 0)),
    "direct-span": b"\2" + buffer(0, 2, 0, FIRST) + buffer(0, 0, 0, LAST + SEAL) +
    announce(0, 5, 1000, 0) + frame(4, struct.pack("<II", 0, 1)),
    # 3: a direct producer reads these as its receiver's request and credits.
    "direct-request": b"\3" + request(0, 2, 4096, "a") + frame(3, struct.pack("<II", 0, 3)) +
    frame(7, b"") + frame(5, struct.pack("<I", 0)),
    "direct-flood": b"\3" + request(0, 1, 4096, "a") + frame(3, struct.pack("<II", 0, 2**31)),
}

os.makedirs("corpus/wire", exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join("corpus/wire", name), "wb") as f:
        f.write(data)
print(f"{len(seeds)} seeds in corpus/wire/")
