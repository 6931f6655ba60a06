#!/usr/bin/env python3
"""The library's public API as text, one line per item, method, field, variant and trait
implementation, read from rustdoc's HTML (stable Rust has no rustdoc JSON).

    cargo doc --no-deps -p shmflow --all-features
    python3 scripts/public-api.py > docs/public-api.txt      # record it
    python3 scripts/public-api.py --check docs/public-api.txt # CI: fails on any difference

The check prints the lines added and removed, so that every change to the API shows in CI and
in review, and is recorded with the change that made it. Blanket implementations (`From<T> for
T`, `Any`, …) are left out: they follow from the rest.
"""

import html
import os
import re
import sys

DOC = os.path.join("target", "doc", "shmflow")
KINDS = ("struct", "enum", "trait", "fn", "constant", "type", "macro", "union", "static")


def text(fragment):
    """Visible text of an HTML fragment, whitespace collapsed."""
    fragment = re.sub(r"<a[^>]*class=\"anchor\"[^>]*>.*?</a>", "", fragment, flags=re.S)
    fragment = re.sub(r"<span class=\"where[^\"]*\">", " ", fragment)
    fragment = re.sub(r"<[^>]+>", "", fragment)
    t = re.sub(r"\s+", " ", html.unescape(fragment).replace("§", "")).strip()
    # rustdoc breaks long signatures over lines: one form for both.
    t = t.replace("( ", "(").replace(", )", ")").replace("]pub ", "] pub ")
    return t


def section(page, list_id):
    """The part of a page under the heading list `list_id`, up to the next one."""
    m = re.search(r'id="%s"' % list_id, page)
    if not m:
        return ""
    rest = page[m.end():]
    end = re.search(r'<h2 id="[a-z-]*implementations"|id="[a-z-]*-implementations-list"', rest)
    return rest[: end.start()] if end else rest


def headers(fragment, tag):
    return [text(h) for h in re.findall(r'<%s[^>]*class="code-header"[^>]*>(.*?)</%s>' % (tag, tag), fragment, flags=re.S)]


def item_lines(path, kind, page):
    lines = []
    decl = re.search(r'<pre class="rust item-decl"><code>(.*?)</code></pre>', page, flags=re.S)
    if decl:
        d = text(decl.group(1))
        # A struct's or enum's body is listed field by field and variant by variant below.
        if kind in ("struct", "enum", "union", "trait"):
            d = re.sub(r"\{.*", "{ … }", d)
        lines.append(f"{path}: {d}")
    for f in re.findall(r'<span id="structfield\.[^"]*" class="structfield[^"]*">(.*?)</span>', page, flags=re.S):
        lines.append(f"{path}: field {text(f)}")
    for v in re.findall(r'<section id="variant\.[^"]*" class="variant">(.*?)</section>', page, flags=re.S):
        lines.append(f"{path}: variant {text(v)}")
    inherent = section(page, "implementations-list")
    for h in headers(inherent, "h4"):
        lines.append(f"{path}: {h}")
    for which in ("trait-implementations-list", "synthetic-implementations-list"):
        for h in headers(section(page, which), "h3"):
            lines.append(f"{path}: {h}")
    if kind == "trait":
        for h in headers(page, "h4"):
            lines.append(f"{path}: {h}")
    return lines


def api():
    lines = []
    for dirpath, _, files in os.walk(DOC):
        rel = os.path.relpath(dirpath, DOC)
        module = "shmflow" if rel == "." else "shmflow::" + rel.replace(os.sep, "::")
        for f in sorted(files):
            parts = f.split(".")
            if len(parts) != 3 or parts[0] not in KINDS or parts[2] != "html":
                continue
            page = open(os.path.join(dirpath, f), encoding="utf-8").read()
            if 'http-equiv="refresh"' in page:
                continue  # a redirect from a private module's path
            lines += item_lines(f"{module}::{parts[1]}", parts[0], page)
    return sorted(set(lines))


def main():
    if not os.path.isdir(DOC):
        sys.exit(f"{DOC} is missing: run `cargo doc --no-deps -p shmflow --all-features` first")
    now = api()
    if any("pub(crate)" in l for l in now):
        sys.exit(
            f"{DOC} holds private items (built with --document-private-items): build it again "
            "with `cargo doc --no-deps -p shmflow --all-features` alone"
        )
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        recorded = [l.rstrip("\n") for l in open(sys.argv[2], encoding="utf-8")]
        added = sorted(set(now) - set(recorded))
        removed = sorted(set(recorded) - set(now))
        if added or removed:
            for l in removed:
                print(f"- {l}")
            for l in added:
                print(f"+ {l}")
            print(
                f"the public API changed ({len(added)} added, {len(removed)} removed): if that "
                f"is meant, record it with `python3 scripts/public-api.py > {sys.argv[2]}`"
            )
            return 1
        print(f"public API: {len(now)} lines, as recorded in {sys.argv[2]}")
        return 0
    if len(sys.argv) != 1:
        sys.exit(__doc__)
    sys.stdout.write("".join(l + "\n" for l in now))
    return 0


if __name__ == "__main__":
    sys.exit(main())
