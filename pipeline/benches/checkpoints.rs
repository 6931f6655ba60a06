//! Checkpoint cost against state size.
fn main() {}
