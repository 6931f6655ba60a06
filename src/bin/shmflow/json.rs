//! Hand-written JSON for `stat --json`: flat objects of numbers and strings, no dependency.

use shmflow::{GateSnapshot, Snapshot};

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.3}")
    } else {
        "null".into()
    }
}

fn object(mut f: Vec<(&str, String)>) -> String {
    let body: Vec<String> = f
        .drain(..)
        .map(|(k, v)| format!("{}:{v}", esc(k)))
        .collect();
    format!("{{{}}}", body.join(","))
}

/// One JSON object for a gate: the gate's figures and an array of its channels, each with
/// every field of a channel's object plus backlog and floating/exclusive segments.
pub(crate) fn gate(
    name: &str,
    prev: &GateSnapshot,
    now: &GateSnapshot,
    producers_alive: &[bool],
    consumer_alive: bool,
) -> String {
    let chans: Vec<String> = prev
        .channels
        .iter()
        .zip(&now.channels)
        .enumerate()
        .map(|(c, (p, n))| {
            let mut f = fields(&format!("{name}#{c}"), &p.snapshot, &n.snapshot);
            f.push(("channel", c.to_string()));
            f.push(("backlog", n.backlog.to_string()));
            f.push(("floating_held", n.floating_held.to_string()));
            f.push(("exclusive_in_use", n.exclusive_in_use.to_string()));
            let alive = producers_alive.get(c).copied().unwrap_or(false);
            f.push(("producer_alive", alive.to_string()));
            object(f)
        })
        .collect();
    object(vec![
        ("region", esc(name)),
        ("kind", esc("gate")),
        ("channels", now.channels.len().to_string()),
        ("exclusive_per_channel", now.exclusive.to_string()),
        ("floating", now.floating.to_string()),
        ("floating_free", now.floating_free.to_string()),
        ("consumer_state", now.consumer_state.code().to_string()),
        ("consumer_alive", consumer_alive.to_string()),
        ("idle_ns", now.idle_ns.to_string()),
        (
            "idleTimeMsPerSecond",
            num(now.idle_ratio_since(prev) * 1000.0),
        ),
        (
            "inputExclusiveBuffersUsage",
            num(now.input_exclusive_buffers_usage()),
        ),
        (
            "inputFloatingBuffersUsage",
            num(now.input_floating_buffers_usage()),
        ),
        ("likelySkew", now.likely_skew().to_string()),
        ("channel_stats", format!("[{}]", chans.join(","))),
    ])
}

/// One JSON object: every counter of `now` and the figures derived over `prev..now`.
pub(crate) fn snapshot(name: &str, prev: &Snapshot, now: &Snapshot) -> String {
    object(fields(name, prev, now))
}

fn fields<'a>(name: &str, prev: &Snapshot, now: &Snapshot) -> Vec<(&'a str, String)> {
    let r = now.rates_since(prev);
    vec![
        ("region", esc(name)),
        ("segment_count", now.segment_count.to_string()),
        ("segment_size", now.segment_size.to_string()),
        ("producer_state", now.producer_state.code().to_string()),
        ("producer_pid", now.producer_pid.to_string()),
        ("consumer_state", now.consumer_state.code().to_string()),
        ("consumer_pid", now.consumer_pid.to_string()),
        ("records_written", now.records_written.to_string()),
        ("bytes_written", now.bytes_written.to_string()),
        ("segments_committed", now.segments_committed.to_string()),
        ("segments_acquired", now.segments_acquired.to_string()),
        ("producer_wakes", now.producer_wakes.to_string()),
        ("backpressured_ns", now.backpressured_ns.to_string()),
        ("records_read", now.records_read.to_string()),
        ("bytes_read", now.bytes_read.to_string()),
        ("segments_taken", now.segments_taken.to_string()),
        ("segments_returned", now.segments_returned.to_string()),
        ("consumer_wakes", now.consumer_wakes.to_string()),
        ("idle_ns", now.idle_ns.to_string()),
        ("segments_not_free", now.segments_not_free.to_string()),
        ("segments_at_consumer", now.segments_at_consumer.to_string()),
        ("window_s", num(r.window_s)),
        ("records_written_per_s", num(r.records_written_per_s)),
        ("records_read_per_s", num(r.records_read_per_s)),
        ("bytes_written_per_s", num(r.bytes_written_per_s)),
        ("bytes_read_per_s", num(r.bytes_read_per_s)),
        (
            "backPressuredTimeMsPerSecond",
            num(r.back_pressured_time_ms_per_second),
        ),
        (
            "producerBusyTimeMsPerSecond",
            num(r.producer_busy_time_ms_per_second),
        ),
        ("idleTimeMsPerSecond", num(r.idle_time_ms_per_second)),
        (
            "busyTimeMsPerSecond",
            num(r.consumer_busy_time_ms_per_second),
        ),
        ("outPoolUsage", num(r.out_pool_usage)),
        ("inPoolUsage", num(r.in_pool_usage)),
        ("backpressureLevel", esc(r.level.as_str())),
    ]
}
