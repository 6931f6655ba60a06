//! `shmflow export`: every channel and gate on the machine as Prometheus metrics, served at
//! `/metrics` in the OpenMetrics text format (`prometheus-client`). It only reads, like `stat`.
//!
//! Names are Flink's where Flink has one (`backPressuredTimeMsPerSecond`, `idleTimeMsPerSecond`,
//! `busyTimeMsPerSecond`, `outPoolUsage`, `inPoolUsage`, `numRecordsOut`, `numRecordsIn`,
//! `numBytesOut`, `numBytesIn`, `inputExclusiveBuffersUsage`, `inputFloatingBuffersUsage`),
//! prefixed `shmflow_` (counters end in `_total`). Labels: `region` (the name), `channel` (a
//! gate's channel index, empty for a channel of its own) and, on `endAttached`, `end`
//! (`producer` or `consumer`).
//! Rates (the `…PerSecond` gauges) come from the exporter's own sampling at a fixed interval
//! (`--sample-ms`, default 1000; the first window, before it serves, is 200 ms): each covers
//! the last interval, whoever scrapes and however often, so two Prometheus servers see the
//! same figures. A region seen for the first time has none until its second sample, and they
//! are left out for an end that is not attached and alive. Counters, usages and states are
//! read at the scrape; counters are totals (`_total`), for Prometheus's own `rate()`.
//!
//! Latency markers: `latency{region, source, quantile}`, a summary in milliseconds (p50, p95,
//! p99, p999 of the markers read over the last sampling interval, from each source; left out
//! for an interval with none), and `latencyMarkers_total{region, source}`.
//!
//! With `--pipeline DIR` (repeatable) it also serves each pipeline supervisor's figures, with
//! Flink's names (`numRestarts`, `numberOfCompletedCheckpoints`, `numberOfFailedCheckpoints`,
//! `lastCheckpointDuration`, `lastCheckpointSize`, `lastCheckpointRestoreTimestamp`,
//! `checkpointAlignmentTime`, `lastRecoveryTime`, `pipelineSupervisorUp`), labelled `pipeline`
//! and `dir`.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use shmflow::metrics::{EndState, GateSnapshot, Rates, Snapshot, SourceLatency};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Labels {
    region: String,
    channel: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndLabels {
    region: String,
    channel: String,
    end: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    region: String,
    source: String,
    quantile: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    region: String,
    source: String,
}

type F64Gauge = Family<Labels, Gauge<f64, AtomicU64>>;

/// The metric families of one scrape.
#[derive(Default)]
struct Families {
    back_pressured: F64Gauge,
    idle: F64Gauge,
    busy: F64Gauge,
    producer_busy: F64Gauge,
    out_pool: F64Gauge,
    in_pool: F64Gauge,
    level: F64Gauge,
    attached: Family<EndLabels, Gauge<f64, AtomicU64>>,
    records_out: Family<Labels, Counter>,
    records_in: Family<Labels, Counter>,
    bytes_out: Family<Labels, Counter>,
    bytes_in: Family<Labels, Counter>,
    link_credit: F64Gauge,
    link_backlog: F64Gauge,
    gate_exclusive: F64Gauge,
    gate_floating: F64Gauge,
    floating_held: F64Gauge,
    floating_asked: F64Gauge,
    backlog: F64Gauge,
    debloated_size: F64Gauge,
    segment_cap: F64Gauge,
    time_to_consume: F64Gauge,
    latency: Family<LatencyLabels, Gauge<f64, AtomicU64>>,
    markers: Family<SourceLabels, Counter>,
}

impl Families {
    fn register(self, r: &mut Registry) {
        r.register(
            "backPressuredTimeMsPerSecond",
            "Milliseconds per second the producer was blocked waiting for a free segment",
            self.back_pressured,
        );
        r.register(
            "idleTimeMsPerSecond",
            "Milliseconds per second the consumer waited for data",
            self.idle,
        );
        r.register(
            "busyTimeMsPerSecond",
            "Milliseconds per second the consumer was neither idle nor waiting",
            self.busy,
        );
        r.register(
            "producerBusyTimeMsPerSecond",
            "Milliseconds per second the producer was not backpressured",
            self.producer_busy,
        );
        r.register(
            "outPoolUsage",
            "Segments not free, from the producer's side, over the pool (0 to 1)",
            self.out_pool,
        );
        r.register(
            "inPoolUsage",
            "Segments queued for or held by the consumer, over the pool (0 to 1)",
            self.in_pool,
        );
        r.register(
            "backpressureLevel",
            "Flink's level from the backpressured time: 0 OK (< 0.1), 1 LOW (<= 0.5), 2 HIGH",
            self.level,
        );
        r.register(
            "endAttached",
            "1 while the end is attached and its process alive, else 0",
            self.attached,
        );
        r.register(
            "numRecordsOut",
            "Records the producer wrote",
            self.records_out,
        );
        r.register("numRecordsIn", "Records the consumer read", self.records_in);
        r.register(
            "numBytesOut",
            "Payload bytes the producer wrote",
            self.bytes_out,
        );
        r.register(
            "numBytesIn",
            "Payload bytes the consumer read",
            self.bytes_in,
        );
        r.register(
            "linkCredit",
            "A network bridge's credit in segments (unspent by the sender, or announced by the receiver)",
            self.link_credit,
        );
        r.register(
            "linkBacklog",
            "A network bridge's backlog in segments",
            self.link_backlog,
        );
        r.register(
            "inputExclusiveBuffersUsage",
            "A gate's exclusive segments in use over all of them",
            self.gate_exclusive,
        );
        r.register(
            "inputFloatingBuffersUsage",
            "A gate's floating segments lent to channels over all of them",
            self.gate_floating,
        );
        r.register(
            "floatingBuffersHeld",
            "Floating segments a gate's channel holds",
            self.floating_held,
        );
        r.register(
            "backlog",
            "Segments the producer has published and the consumer not yet taken: the queue now",
            self.backlog,
        );
        r.register(
            "floatingBuffersAskedNotGranted",
            "Floating segments a gate channel's producer asked for and the gate has not lent (an ask stands until granted)",
            self.floating_asked,
        );
        r.register(
            "debloatedBufferSize",
            "Buffer debloating: bytes of a segment records start in (the segment size when whole)",
            self.debloated_size,
        );
        r.register(
            "inFlightSegmentsLimit",
            "Buffer debloating: segments the producer may have in flight before a record waits",
            self.segment_cap,
        );
        r.register(
            "estimatedTimeToConsumeBuffersMs",
            "Buffer debloating: what is written and not read, over the consumer's measured rate",
            self.time_to_consume,
        );
        r.register(
            "latency",
            "Milliseconds from a source's latency marker to its reading here: quantiles of the markers of the last sampling interval",
            self.latency,
        );
        r.register(
            "latencyMarkers",
            "Latency markers read, from each source",
            self.markers,
        );
    }

    /// A region's latency markers: `now` (since the start) for the counts, `window` (the last
    /// sampling interval) for the quantiles.
    fn latency(&self, region: &str, now: &[SourceLatency], window: &[SourceLatency]) {
        for l in now {
            self.markers
                .get_or_create(&SourceLabels {
                    region: region.to_owned(),
                    source: l.source.clone(),
                })
                .inc_by(l.count);
        }
        for w in window.iter().filter(|w| w.count > 0) {
            let f = crate::latency::figures(w);
            for ((_, q), v) in crate::latency::QUANTILES.iter().zip(f.quantiles) {
                self.latency
                    .get_or_create(&LatencyLabels {
                        region: region.to_owned(),
                        source: w.source.clone(),
                        quantile: q.to_string(),
                    })
                    .set(v as f64 / 1e6);
            }
        }
    }

    fn channel(
        &self,
        region: &str,
        channel: &str,
        rates: Option<&Rates>,
        now: &Snapshot,
        alive: (bool, bool),
    ) {
        let l = Labels {
            region: region.to_owned(),
            channel: channel.to_owned(),
        };
        let set = |f: &F64Gauge, v: f64| {
            f.get_or_create(&l).set(v);
        };
        set(&self.out_pool, now.out_pool_usage());
        set(
            &self.backlog,
            now.segments_committed.saturating_sub(now.segments_taken) as f64,
        );
        set(&self.in_pool, now.in_pool_usage());
        // Time figures need a window (none the first time a region is seen) and an end that
        // is there: attached and alive (a producer killed while blocked keeps an endless wait
        // in the region).
        if let Some(r) = rates {
            if alive.0 && now.producer_state == EndState::Attached {
                set(&self.back_pressured, r.back_pressured_time_ms_per_second);
                set(&self.producer_busy, r.producer_busy_time_ms_per_second);
                set(&self.level, r.level as u8 as f64);
            }
            if alive.1 && now.consumer_state == EndState::Attached {
                set(&self.idle, r.idle_time_ms_per_second);
                set(&self.busy, r.consumer_busy_time_ms_per_second);
            }
        }
        if now.segment_cap != 0 {
            set(&self.debloated_size, now.segment_fill as f64);
            set(&self.segment_cap, now.segment_cap as f64);
            if let Some(ms) = now.estimated_time_to_consume_ms() {
                set(&self.time_to_consume, ms);
            }
        }
        if let Some(link) = now.link {
            set(&self.link_credit, link.credit as f64);
            set(&self.link_backlog, link.backlog as f64);
        }
        self.records_out
            .get_or_create(&l)
            .inc_by(now.records_written);
        self.records_in.get_or_create(&l).inc_by(now.records_read);
        self.bytes_out.get_or_create(&l).inc_by(now.bytes_written);
        self.bytes_in.get_or_create(&l).inc_by(now.bytes_read);
        for (end, state, alive) in [
            ("producer", now.producer_state, alive.0),
            ("consumer", now.consumer_state, alive.1),
        ] {
            let el = EndLabels {
                region: region.to_owned(),
                channel: channel.to_owned(),
                end: end.to_owned(),
            };
            let up = state == EndState::Attached && alive;
            self.attached
                .get_or_create(&el)
                .set(if up { 1.0 } else { 0.0 });
        }
    }

    fn gate(
        &self,
        region: &str,
        rates: &HashMap<String, Rates>,
        now: &GateSnapshot,
        alive: &[bool],
        consumer_alive: bool,
    ) {
        let l = Labels {
            region: region.to_owned(),
            channel: String::new(),
        };
        self.gate_exclusive
            .get_or_create(&l)
            .set(now.input_exclusive_buffers_usage());
        self.gate_floating
            .get_or_create(&l)
            .set(now.input_floating_buffers_usage());
        for (c, n) in now.channels.iter().enumerate() {
            let channel = c.to_string();
            let alive = (alive.get(c).copied().unwrap_or(false), consumer_alive);
            let r = rates.get(&format!("{region}:{channel}"));
            self.channel(region, &channel, r, &n.snapshot, alive);
            let l = Labels {
                region: region.to_owned(),
                channel,
            };
            self.floating_held
                .get_or_create(&l)
                .set(n.floating_held as f64);
            self.floating_asked.get_or_create(&l).set(n.backlog as f64);
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PipelineLabels {
    pipeline: String,
    dir: String,
}

/// A pipeline supervisor's figures, with Flink's names.
#[derive(Default)]
struct PipelineFamilies {
    up: Family<PipelineLabels, Gauge<f64, AtomicU64>>,
    restarts: Family<PipelineLabels, Counter>,
    completed: Family<PipelineLabels, Counter>,
    failed: Family<PipelineLabels, Counter>,
    last_id: Family<PipelineLabels, Gauge<f64, AtomicU64>>,
    duration: Family<PipelineLabels, Gauge<f64, AtomicU64>>,
    size: Family<PipelineLabels, Gauge<f64, AtomicU64>>,
    restore_ts: Family<PipelineLabels, Gauge<f64, AtomicU64>>,
    alignment: Family<PipelineLabels, Gauge<f64, AtomicU64>>,
    recovery: Family<PipelineLabels, Gauge<f64, AtomicU64>>,
}

impl PipelineFamilies {
    fn add(&self, v: &crate::inspect::pipeline::View) {
        let l = PipelineLabels {
            pipeline: v.name.clone(),
            dir: v.dir.display().to_string(),
        };
        let m = &v.metrics;
        let set = |f: &Family<PipelineLabels, Gauge<f64, AtomicU64>>, x: f64| {
            f.get_or_create(&l).set(x);
        };
        set(&self.up, v.supervisor.is_some() as u8 as f64);
        self.restarts.get_or_create(&l).inc_by(m.num_restarts);
        self.completed
            .get_or_create(&l)
            .inc_by(m.completed_checkpoints);
        self.failed.get_or_create(&l).inc_by(m.failed_checkpoints);
        set(&self.last_id, m.last_checkpoint_id as f64);
        set(&self.duration, m.last_checkpoint_duration_ms);
        set(&self.size, m.last_checkpoint_size as f64);
        set(&self.restore_ts, m.last_restore_timestamp_ms as f64);
        set(&self.alignment, m.checkpoint_alignment_time_ms);
        set(&self.recovery, m.last_recovery_time_ms);
    }

    fn register(self, r: &mut Registry) {
        r.register(
            "pipelineSupervisorUp",
            "1 while a supervisor holds the pipeline's checkpoint directory",
            self.up,
        );
        r.register(
            "numRestarts",
            "Restarts of the pipeline (full failovers)",
            self.restarts,
        );
        r.register(
            "numberOfCompletedCheckpoints",
            "Checkpoints every instance acknowledged",
            self.completed,
        );
        r.register(
            "numberOfFailedCheckpoints",
            "Checkpoints aborted after their timeout",
            self.failed,
        );
        r.register(
            "lastCompletedCheckpointId",
            "The newest completed checkpoint's id",
            self.last_id,
        );
        r.register(
            "lastCheckpointDuration",
            "Milliseconds from the last completed checkpoint's trigger to its completion",
            self.duration,
        );
        r.register(
            "lastCheckpointSize",
            "Bytes of the last completed checkpoint's state files",
            self.size,
        );
        r.register(
            "lastCheckpointRestoreTimestamp",
            "When the last restore from a checkpoint started, ms since the epoch",
            self.restore_ts,
        );
        r.register(
            "checkpointAlignmentTime",
            "Milliseconds the last checkpoint's slowest gate aligned its barriers",
            self.alignment,
        );
        r.register(
            "lastRecoveryTime",
            "Milliseconds from the last failure to the first record processed after the restore",
            self.recovery,
        );
    }
}

/// The sampler's state: the last sample of every channel (gate channels as `GATE:C`), and the
/// rates over the last interval.
#[derive(Default)]
struct Sampled {
    last: HashMap<String, Snapshot>,
    rates: HashMap<String, Rates>,
    /// Latency markers by region: at the last sample, and over the last interval.
    latency: HashMap<String, Vec<SourceLatency>>,
    latency_window: HashMap<String, Vec<SourceLatency>>,
}

/// The rates of the last sampling interval, and the pipeline directories to read.
#[derive(Default)]
pub(crate) struct Exporter {
    sampled: Mutex<Sampled>,
    pub(crate) pipelines: Vec<std::path::PathBuf>,
}

impl Exporter {
    /// Takes a sample of every channel and gate channel: the rates since the one before.
    pub(crate) fn sample(&self) -> Result<(), String> {
        let mut now = HashMap::new();
        let mut latency = HashMap::new();
        for r in shmflow::monitor::list_regions().map_err(|e| e.to_string())? {
            latency.insert(r.name.clone(), r.latency);
            now.insert(r.name, r.snapshot);
        }
        for (name, g) in shmflow::monitor::list_gates().map_err(|e| e.to_string())? {
            latency.insert(name.clone(), g.latency());
            for (c, ch) in g.snapshot().channels.into_iter().enumerate() {
                now.insert(format!("{name}:{c}"), ch.snapshot);
            }
        }
        let mut s = self.sampled.lock().map_err(|_| "a sample panicked")?;
        let rates = now
            .iter()
            .filter_map(|(k, n)| {
                let p = s.last.get(k).filter(|p| n.at_ns > p.at_ns)?;
                Some((k.clone(), n.rates_since(p)))
            })
            .collect();
        let latency_window = latency
            .iter()
            .map(|(k, n)| {
                let prev = s.latency.get(k).map_or(&[][..], |p| p.as_slice());
                (k.clone(), crate::latency::window(prev, n))
            })
            .collect();
        *s = Sampled {
            last: now,
            rates,
            latency,
            latency_window,
        };
        Ok(())
    }

    /// Every region and gate on the machine, encoded.
    pub(crate) fn scrape(&self) -> Result<String, String> {
        let f = Families::default();
        let sampled = self.sampled.lock().map_err(|_| "a sample panicked")?;
        let no_window = Vec::new();
        for r in shmflow::monitor::list_regions().map_err(|e| e.to_string())? {
            f.channel(
                &r.name,
                "",
                sampled.rates.get(&r.name),
                &r.snapshot,
                (r.producer_alive, r.consumer_alive),
            );
            let window = sampled.latency_window.get(&r.name).unwrap_or(&no_window);
            f.latency(&r.name, &r.latency, window);
        }
        for (name, g) in shmflow::monitor::list_gates().map_err(|e| e.to_string())? {
            let now = g.snapshot();
            let alive: Vec<bool> = (0..g.channels()).map(|c| g.producer_alive(c)).collect();
            f.gate(&name, &sampled.rates, &now, &alive, g.consumer_alive());
            let window = sampled.latency_window.get(&name).unwrap_or(&no_window);
            f.latency(&name, &g.latency(), window);
        }
        drop(sampled);
        let mut registry = Registry::with_prefix("shmflow");
        f.register(&mut registry);
        if !self.pipelines.is_empty() {
            let p = PipelineFamilies::default();
            for dir in &self.pipelines {
                p.add(&crate::inspect::pipeline::View::read(dir)?);
            }
            p.register(&mut registry);
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .map_err(|e| e.to_string())?;
        // The markers' quantiles are a summary (as Flink's reporter exports its latency
        // histograms); prometheus-client has no summary type, so the family is encoded as
        // gauges and typed here.
        Ok(out.replace(
            "# TYPE shmflow_latency gauge\n",
            "# TYPE shmflow_latency summary\n",
        ))
    }
}

/// What a scraper asked for: OpenMetrics (Prometheus asks for it first in `Accept`), or the
/// classic text format (version 0.0.4) otherwise, as curl and `promtool check metrics` read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    OpenMetrics,
    Text,
}

impl Format {
    pub(crate) fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text,
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => {
                "Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8"
            }
            Format::Text => "Content-Type: text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// An OpenMetrics exposition in the classic text format: a counter's HELP and TYPE name its
/// samples' `_total` name, and the text has no `# EOF` (nor `# UNIT`).
pub(crate) fn classic_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((p, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(name) {
                    out.push_str(&format!("{p}{name}_total {tail}"));
                } else {
                    out.push_str(line);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Serves `/metrics` on `listen` until killed.
pub(crate) fn main(
    listen: std::net::SocketAddr,
    pipelines: Vec<std::path::PathBuf>,
    sample: std::time::Duration,
) -> Result<(), String> {
    for dir in &pipelines {
        crate::inspect::pipeline::View::read(dir)?;
    }
    let server =
        tiny_http::Server::http(listen).map_err(|e| format!("listening on {listen}: {e}"))?;
    let addr = server
        .server_addr()
        .to_ip()
        .map_or_else(|| listen.to_string(), |a| a.to_string());
    println!("serving http://{addr}/metrics");
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let exporter = std::sync::Arc::new(Exporter {
        pipelines,
        ..Exporter::default()
    });
    // A first window before serving, so that the first scrape has rates; then one sample
    // every interval, whoever scrapes.
    exporter.sample()?;
    std::thread::sleep(sample.min(std::time::Duration::from_millis(200)));
    exporter.sample()?;
    let sampler = exporter.clone();
    std::thread::Builder::new()
        .name("shmflow-export-sampler".into())
        .spawn(move || loop {
            std::thread::sleep(sample);
            if let Err(e) = sampler.sample() {
                eprintln!("shmflow export: sampling: {e}");
            }
        })
        .map_err(|e| format!("starting the sampler thread: {e}"))?;
    for request in server.incoming_requests() {
        let format = Format::from_accept(
            request
                .headers()
                .iter()
                .find(|h| h.field.equiv("Accept"))
                .map(|h| h.value.as_str()),
        );
        let response = match request.url() {
            "/metrics" => match exporter.scrape() {
                Ok(body) => {
                    let body = match format {
                        Format::OpenMetrics => body,
                        Format::Text => classic_text(&body),
                    };
                    tiny_http::Response::from_string(body).with_header(
                        format
                            .content_type()
                            .parse::<tiny_http::Header>()
                            .expect("a valid header"),
                    )
                }
                Err(e) => tiny_http::Response::from_string(format!("scrape failed: {e}\n"))
                    .with_status_code(500),
            },
            _ => tiny_http::Response::from_string("shmflow export: see /metrics\n")
                .with_status_code(404),
        };
        // A client that went away is not the exporter's failure.
        let _ = request.respond(response);
    }
    Ok(())
}
