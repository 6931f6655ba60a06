//! Nothing, unless `SHMFLOW_BROKEN` names an ordering to break: then the library is built with
//! `--cfg shmflow_broken="…"`, one deliberately wrong ordering or step, so that
//! `scripts/loom-broken.sh` can show the loom models (the library's own and those of
//! `loom-tests/`, which depend on it as any program does) catching it.

fn main() {
    println!("cargo:rerun-if-env-changed=SHMFLOW_BROKEN");
    if let Some(broken) = std::env::var("SHMFLOW_BROKEN")
        .ok()
        .filter(|b| !b.is_empty())
    {
        println!("cargo:rustc-cfg=shmflow_broken=\"{broken}\"");
    }
}
