#!/usr/bin/env python3
"""Fails when README.md, pipeline/README.md or a page of docs/ names a file that does not exist
(a path in `code` with a file ending or under a top folder, or a relative link), names in
`code` a test, function or model (a snake_case name of three words or more) that no source
file holds, or when DESIGN.md's layer table leaves out a module of a layer's folder."""
import os, re, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "pipeline/README.md"] + [
    os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs"))) if f.endswith(".md")
]
ENDINGS = (".rs", ".md", ".toml", ".sh", ".py", ".json", ".svg", ".png", ".txt", ".csv", ".golden")
TOP = {"src", "tests", "examples", "benches", "cli", "docs", "scripts", "fuzz", "pipeline", ".ci"}
PATH = re.compile(r"^[A-Za-z0-9_.\-/]+$")

def candidates(text):
    for m in re.finditer(r"`([^`\n]+)`", text):
        yield m.group(1).strip(), None
    for m in re.finditer(r"\]\(([^)\s#]+)(#[^)]*)?\)", text):
        yield m.group(1), "link"

# Named on purpose though not in the repository: what tools write, and other projects' files.
NOT_OURS = {
    "fuzz/corpus": "written by cargo fuzz",
    "fuzz/artifacts": "written by cargo fuzz",
    "src/loom/": "tokio's loom switch, named as the model for src/sync/",
}
# A path in the docs may be written from the crate's src/ or from its layer's folder.
BASES = [ROOT, os.path.join(ROOT, "src"), os.path.join(ROOT, "src", "endpoint")]

bad = []
for doc in DOCS:
    path = os.path.join(ROOT, doc)
    text = open(path, encoding="utf-8").read()
    # Fenced blocks hold commands and output, not references.
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for token, kind in candidates(text):
        if kind == "link":
            if re.match(r"^[a-z]+:", token):
                continue
            target = os.path.normpath(os.path.join(os.path.dirname(path), token))
        else:
            if not PATH.match(token) or token.startswith("/") or "//" in token:
                continue
            first = token.split("/")[0]
            if not (token.endswith(ENDINGS) and "/" in token) and not (first in TOP and "/" in token):
                continue
            if "*" in token or token.endswith("/"):
                target = os.path.join(ROOT, token.rstrip("/"))
            else:
                target = os.path.join(ROOT, token)
        if kind is None:
            if token in NOT_OURS:
                continue
            rel = token.rstrip("/")
            found = any(
                os.path.exists(os.path.join(b, rel)) or os.path.exists(os.path.join(b, rel + ".rs"))
                for b in BASES
            )
        else:
            found = os.path.exists(target)
        if not found:
            bad.append(f"{doc}: names {token}, which does not exist")
# Names of three words or more in `code` (tests, functions, loom models) exist in the sources.
import subprocess

words = set()
sources = subprocess.run(
    ["git", "ls-files", "*.rs", "*.sh", "*.py", "*.toml", ".ci/run"],
    cwd=ROOT, capture_output=True, text=True, check=True,
).stdout.split()
for f in sources:
    words.add(os.path.splitext(os.path.basename(f))[0])
    try:
        words.update(re.findall(r"[a-z][a-z0-9_]*", open(os.path.join(ROOT, f), encoding="utf-8").read()))
    except (OSError, UnicodeDecodeError):
        pass
NAME = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+){2,}$")
for doc in DOCS:
    text = re.sub(r"```.*?```", "", open(os.path.join(ROOT, doc), encoding="utf-8").read(), flags=re.S)
    for m in re.finditer(r"`([^`\n]+)`", text):
        for token in re.findall(r"[a-z][a-z0-9_]*", m.group(1)):
            if NAME.match(token) and token not in words:
                bad.append(f"{doc}: names `{token}`, which no source file holds")
# DESIGN.md's layer table names every module of every layer's folder.
design = open(os.path.join(ROOT, "docs", "DESIGN.md"), encoding="utf-8").read()
for line in design.splitlines():
    m = re.match(r"\| \d+ \w+ \| `src/(\w+)/`", line)
    if not m:
        continue
    folder = os.path.join(ROOT, "src", m.group(1))
    named = {n.split("/")[0].split("::")[0].removesuffix(".rs") for n in re.findall(r"`([\w/.:]+)`", line)}
    for f in sorted(os.listdir(folder)):
        module = f[:-3] if f.endswith(".rs") else f if os.path.isdir(os.path.join(folder, f)) else None
        if module and module != "mod" and module not in named:
            bad.append(f"docs/DESIGN.md: the layer table's row for src/{m.group(1)}/ leaves out `{module}`")

for b in bad:
    print(b)
print(f"{len(bad)} problem(s) in {len(DOCS)} documents")
sys.exit(1 if bad else 0)
