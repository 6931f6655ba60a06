//! loom models of shmflow; see tests/ and README.md. Empty unless built with `--cfg loom`.
