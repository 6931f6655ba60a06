#!/usr/bin/env python3
"""Checks the library's layering: no module refers to a module of a higher layer, and the
modules' references have no cycle.

Layers, lowest first (a module may refer to its own layer and those below):
  0 error      src/error.rs             the error types every layer returns
  1 sys        src/sys/                 every Linux call, as safe functions
  2 sync       src/sync/                std or loom atomics, the futex word
  3 protocol   src/protocol/            the shared-memory ABI, framing, rings, park/wake,
                                        priority lane, floating pool: no OS dependency (it
                                        may not refer to sys, only to sync)
  4 region     src/region/              creating, opening, mapping and viewing regions,
                                        liveness locks, descriptor hand-off
  5 endpoint   src/endpoint/            producer, consumer, gate, partition, monitor, metrics
  6 net        src/net/                 remote channels over TCP (tokio): wire format, bridges
  7 root       src/lib.rs, src/*_api.rs the public surface and the loom hooks

A reference is any `crate::a::b` path (in `use` lines or inline) and any `super::` path. Paths
through the crate root's re-exports (`crate::Error`) are refused outside layer 6: name the
defining module, so that the layer of every reference can be seen. Run from the repository
root; exits 1 and lists every violation.
"""

import os
import re
import sys

SRC = "src"
LAYERS = [
    ("error", 0),
    ("sys", 1),
    ("sync", 2),
    ("protocol", 3),
    ("region", 4),
    ("endpoint", 5),
    ("net", 6),
]
ROOT_LAYER = 7


def module_of(path):
    rel = os.path.relpath(path, SRC)[:-3]  # strip .rs
    parts = rel.split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    if parts == ["lib"]:
        return ()
    return tuple(parts)


def layer_of(module):
    if not module:
        return ROOT_LAYER
    for name, layer in LAYERS:
        if module[0] == name:
            return layer
    if module[0].endswith("_api"):
        return ROOT_LAYER
    return None


def strip_comments(text):
    # Line comments (doc comments included) and string literals do not refer to modules.
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def expand_use_groups(text):
    """`use crate::a::{b::C, d};` -> `crate::a::b::C crate::a::d` (one level of nesting is
    enough for this code base; deeper groups are expanded recursively)."""
    out = []
    pattern = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{")
    pos = 0
    while True:
        m = pattern.search(text, pos)
        if not m:
            out.append(text[pos:])
            break
        out.append(text[pos : m.start()])
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        inner = text[m.end() : i - 1]
        prefix = m.group(1) + m.group(2)
        items = []
        depth, start = 0, 0
        for j, ch in enumerate(inner + ","):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                item = inner[start:j].strip()
                if item and item != "self":
                    items.append(expand_use_groups(prefix + "::" + item))
                start = j + 1
        out.append(" ".join(items) + " ")
        pos = i
    return "".join(out)


def main():
    modules = {}
    for dirpath, _, files in os.walk(SRC):
        if os.path.relpath(dirpath, SRC).split(os.sep)[0] == "bin":
            continue
        for f in files:
            if f.endswith(".rs"):
                p = os.path.join(dirpath, f)
                modules[module_of(p)] = p
    known = set(modules)
    errors = []
    edges = {m: set() for m in modules}
    ref = re.compile(r"\b(crate|super(?:::super)*)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
    for mod, path in sorted(modules.items()):
        my_layer = layer_of(mod)
        if my_layer is None:
            errors.append(f"{path}: module {'::'.join(mod)} belongs to no layer")
            continue
        text = expand_use_groups(strip_comments(open(path).read()))
        for m in ref.finditer(text):
            head, rest = m.group(1), m.group(2).split("::")[1:]
            if head == "crate":
                base = ()
            else:
                # `super` in module `a::b` is `a`, whether `b` is `b.rs` or `b/mod.rs`.
                ups = head.count("super")
                base = mod[: max(len(mod) - ups, 0)]
            target = base
            for part in rest:
                if target + (part,) in known:
                    target = target + (part,)
                else:
                    break
            line = text[: m.start()].count("\n") + 1
            if target == ():
                if my_layer != ROOT_LAYER and rest and rest[0] != "sync":
                    errors.append(
                        f"{path}:{line}: `{m.group(0)}` goes through the crate root's "
                        "re-exports; name the defining module"
                    )
                continue
            if target == mod or (len(target) < len(mod) and mod[: len(target)] == target):
                continue  # itself, or one of its own parents (its own layer)
            to_layer = layer_of(target)
            if mod and target and mod[0] == "protocol" and target[0] == "sys":
                errors.append(
                    f"{path}:{line}: the protocol layer has no OS dependency (loom checks it): "
                    f"`{m.group(0)}` refers to sys; go through `crate::sync`"
                )
            if to_layer is not None and to_layer > my_layer:
                errors.append(
                    f"{path}:{line}: layer {my_layer} ({'::'.join(mod)}) refers to layer "
                    f"{to_layer} ({'::'.join(target)})"
                )
            edges[mod].add(target)
    # Cycles between modules (Tarjan's strongly connected components).
    index, low, on, stack, sccs = {}, {}, set(), [], []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(comp)

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            strong(v)
    for comp in sccs:
        names = sorted("::".join(c) or "crate" for c in comp)
        errors.append("cycle between modules: " + " <-> ".join(names))
    if errors:
        print("\n".join(errors))
        print(f"layering: {len(errors)} violation(s)")
        return 1
    counts = {}
    for mod in modules:
        counts[layer_of(mod)] = counts.get(layer_of(mod), 0) + 1
    print(
        "layering: ok ("
        + ", ".join(f"layer {k}: {v} modules" for k, v in sorted(counts.items()))
        + ", no reference upwards, no cycle)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
