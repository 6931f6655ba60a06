//! loom models of programs built on shmflow, written against its public API only, the way a
//! user model-checks their own program (see `docs/LOOM.md`). The models are this crate's
//! tests, built only under `--cfg shmflow_loom`:
//!
//! ```text
//! RUSTFLAGS="--cfg shmflow_loom" cargo test -p shmflow-loom-tests --release --target-dir target/loom
//! ```
//!
//! Without the cfg the crate is empty and its tests are skipped: shmflow's ends then wait on
//! real futexes, which loom's scheduler cannot see.
