//! `stat --json`: one object per sample, through `serde_json`. Counters are integers, rates are
//! numbers with three decimals (`null` where a window was empty), names and levels strings.

use serde_json::{json, Map, Value};
use shmflow::metrics::{GateSnapshot, Snapshot, SourceLatency};

fn num(v: f64) -> Value {
    if v.is_finite() {
        json!((v * 1000.0).round() / 1000.0)
    } else {
        Value::Null
    }
}

/// One JSON object for a gate: the gate's figures and an array of its channels, each with
/// every field of a channel's object plus backlog and floating/exclusive segments.
pub(crate) fn gate(
    name: &str,
    prev: &GateSnapshot,
    now: &GateSnapshot,
    producers_alive: &[bool],
    consumer_alive: bool,
    latency: &[SourceLatency],
) -> String {
    let chans: Vec<Value> = prev
        .channels
        .iter()
        .zip(&now.channels)
        .enumerate()
        .map(|(c, (p, n))| {
            let mut f = fields(&format!("{name}#{c}"), &p.snapshot, &n.snapshot);
            f.insert("channel".into(), json!(c));
            f.insert("backlog".into(), json!(n.backlog));
            f.insert("floating_held".into(), json!(n.floating_held));
            f.insert("exclusive_in_use".into(), json!(n.exclusive_in_use));
            f.insert("inflight_records".into(), json!(n.inflight_records));
            f.insert("inflight_bytes".into(), json!(n.inflight_bytes));
            f.insert("held_records".into(), json!(n.held_records));
            f.insert("held_bytes".into(), json!(n.held_bytes));
            f.insert("held_ns".into(), json!(n.held_ns));
            f.insert("barrier_delay_ns".into(), json!(n.barrier_delay_ns));
            let alive = producers_alive.get(c).copied().unwrap_or(false);
            f.insert("producer_alive".into(), json!(alive));
            Value::Object(f)
        })
        .collect();
    json!({
        "region": name,
        "kind": "gate",
        "channels": now.channels.len(),
        "exclusive_per_channel": now.exclusive,
        "floating": now.floating,
        "floating_free": now.floating_free,
        "consumer_state": now.consumer_state.code(),
        "consumer_alive": consumer_alive,
        "idle_ns": now.idle_ns,
        "idleTimeMsPerSecond": num(now.idle_ratio_since(prev) * 1000.0),
        "inputExclusiveBuffersUsage": num(now.input_exclusive_buffers_usage()),
        "inputFloatingBuffersUsage": num(now.input_floating_buffers_usage()),
        "likelySkew": now.likely_skew(),
        "checkpoints": checkpoints(&now.checkpoints),
        "latency": crate::latency::json(latency),
        "channel_stats": chans,
    })
    .to_string()
}

/// One JSON object: every counter of `now` and the figures derived over `prev..now`.
/// One JSON object for a channel; `latency`: the markers' figures per source (an array, empty
/// while none came).
pub(crate) fn snapshot(
    name: &str,
    prev: &Snapshot,
    now: &Snapshot,
    latency: &[SourceLatency],
) -> String {
    let mut f = fields(name, prev, now);
    f.insert("latency".into(), crate::latency::json(latency));
    Value::Object(f).to_string()
}

fn fields(name: &str, prev: &Snapshot, now: &Snapshot) -> Map<String, Value> {
    let r = now.rates_since(prev);
    let v = json!({
        "region": name,
        "segment_count": now.segment_count,
        "segment_size": now.segment_size,
        "producer_state": now.producer_state.code(),
        "producer_pid": now.producer_pid,
        "consumer_state": now.consumer_state.code(),
        "consumer_pid": now.consumer_pid,
        "records_written": now.records_written,
        "bytes_written": now.bytes_written,
        "segments_committed": now.segments_committed,
        "segments_acquired": now.segments_acquired,
        "producer_wakes": now.producer_wakes,
        "backpressured_ns": now.backpressured_ns,
        "records_read": now.records_read,
        "bytes_read": now.bytes_read,
        "segments_taken": now.segments_taken,
        "segments_returned": now.segments_returned,
        "consumer_wakes": now.consumer_wakes,
        "idle_ns": now.idle_ns,
        "segments_not_free": now.segments_not_free,
        "segments_at_consumer": now.segments_at_consumer,
        "window_s": num(r.window_s),
        "records_written_per_s": num(r.records_written_per_s),
        "records_read_per_s": num(r.records_read_per_s),
        "bytes_written_per_s": num(r.bytes_written_per_s),
        "bytes_read_per_s": num(r.bytes_read_per_s),
        "backPressuredTimeMsPerSecond": num(r.back_pressured_time_ms_per_second),
        "producerBusyTimeMsPerSecond": num(r.producer_busy_time_ms_per_second),
        "idleTimeMsPerSecond": num(r.idle_time_ms_per_second),
        "busyTimeMsPerSecond": num(r.consumer_busy_time_ms_per_second),
        "outPoolUsage": num(r.out_pool_usage),
        "inPoolUsage": num(r.in_pool_usage),
        "backpressureLevel": r.level.as_str(),
        "segments_in_flight": now.segments_in_flight,
    });
    let mut m = match v {
        Value::Object(m) => m,
        _ => unreachable!("json! of an object literal is an object"),
    };
    if now.segment_cap != 0 {
        // Buffer debloating, with Flink's names where Flink has one.
        m.insert(
            "debloat".into(),
            json!({
                "target_ns": now.debloat_target_ns,
                "rate_bytes_per_s": now.debloat_rate,
                "segment_cap": now.segment_cap,
                "debloatedBufferSize": now.segment_fill,
                "inFlightLimitBytes": now.in_flight_limit_bytes(),
                "estimatedTimeToConsumeBuffersMs": now.estimated_time_to_consume_ms().map(num),
            }),
        );
    }
    if let Some(l) = &now.link {
        m.insert(
            "link".into(),
            json!({
                "role": if l.sending { "sending" } else { "receiving" },
                "credit": l.credit,
                "backlog": l.backlog,
                "in_flight_bytes": l.in_flight_bytes,
                "wire_bytes": l.wire_bytes,
            }),
        );
    }
    m
}

/// A gate's checkpoint figures, with Flink's names where Flink has one.
fn checkpoints(c: &shmflow::metrics::CheckpointStats) -> Value {
    json!({
        "released": c.released,
        "cancelled": c.cancelled,
        "last_id": c.last_id,
        "last_released": super::released_name(c.last_released),
        "checkpointAlignmentTime": c.checkpoint_alignment_time_ns,
        "checkpointStartDelayNanos": c.checkpoint_start_delay_nanos,
        "last_held_records": c.last_held_records,
        "last_held_bytes": c.last_held_bytes,
        "inflight_records": c.inflight_records,
        "inflight_bytes": c.inflight_bytes,
    })
}
