//! What every model here shares: how it is run.

/// Runs `f` under loom, exploring every interleaving with at most `preemptions` forced
/// preemptions (`LOOM_MAX_PREEMPTIONS`, when set, overrides it).
pub fn check(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound.get_or_insert(preemptions);
    builder.check(f);
}
