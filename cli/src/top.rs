//! `shmflow top`: a live view of every channel and gate on the machine, sorted by
//! backpressure. It only reads (as `shmflow stat` does): every refresh lists `/dev/shm` and takes
//! a snapshot of each region's counters.
//!
//! Keys: ↑/↓ (or k/j) select, Enter opens the selected gate's channels (where skew shows),
//! Esc or Backspace goes back, `/` starts a filter on names (Enter keeps it, Esc drops it),
//! `q` quits.
//!
//! Here: the view's state, how it takes in each round of snapshots and keys, and the terminal
//! loop; `draw` renders it, `tests` drive it on ratatui's test backend.

mod draw;

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use ratatui::widgets::TableState;
use shmflow::metrics::{BackpressureLevel, GateSnapshot, Snapshot};

/// Samples of records/s kept for a sparkline.
const HISTORY: usize = 24;

/// What one row shows: a channel of its own, a gate (its channels summed), or one channel of
/// the gate that is open.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RowData {
    pub(crate) name: String,
    /// "channel", "gate (N)", or "ch N".
    pub(crate) kind: String,
    /// `None` where the producer end is not there.
    pub(crate) back_pressured_ms: Option<f64>,
    pub(crate) level: Option<BackpressureLevel>,
    pub(crate) out_pool: f64,
    pub(crate) in_pool: f64,
    /// Gates: (exclusive usage, floating usage, likely skew).
    pub(crate) gate_usage: Option<(f64, f64, bool)>,
    /// Gate channels: floating segments held and the backlog.
    pub(crate) floating_held: Option<(u64, u64)>,
    pub(crate) records_per_s: f64,
    pub(crate) mb_per_s: f64,
    pub(crate) history: Vec<f64>,
    /// A network bridge's end: (sending, credit, backlog).
    pub(crate) link: Option<(bool, u64, u64)>,
    pub(crate) ends: String,
    /// Gates: the last checkpoint released (id, alignment time, how), as text.
    pub(crate) checkpoint: Option<String>,
    /// Debloating, where it is on: the cap (in-flight limit in segments) and the in-flight
    /// limit in bytes, as text.
    pub(crate) debloat: Option<String>,
    /// Latency markers read: the largest p99 of any source over the last interval (or, with
    /// none in it, since the start), as text.
    pub(crate) latency: Option<String>,
}

/// The latency column's text for a region's sources: the largest p99 over the window
/// `prev` → `now`, or since the start when no marker came in the window; `None` without
/// markers.
fn latency_text(
    prev: Option<&Vec<shmflow::metrics::SourceLatency>>,
    now: Option<&Vec<shmflow::metrics::SourceLatency>>,
) -> Option<String> {
    let now = now.filter(|n| !n.is_empty())?;
    let recent = crate::latency::window(prev.map_or(&[][..], |p| p.as_slice()), now);
    let (ls, since) = if recent.iter().any(|l| l.count > 0) {
        (recent, "")
    } else {
        (now.clone(), " all")
    };
    let worst = ls
        .iter()
        .filter(|l| l.count > 0)
        .map(|l| crate::latency::figures(l).quantiles[2])
        .max()?;
    let sources = if now.len() > 1 {
        format!(" ({} src)", now.len())
    } else {
        String::new()
    };
    Some(format!(
        "p99 {}{since}{sources}",
        crate::inspect::duration_ns(worst)
    ))
}

/// A gate's last checkpoint: `#id alignment-time how` (A aligned, U unaligned, T switched to
/// unaligned by the alignment timeout), or "none" before the first.
fn checkpoint_text(k: &shmflow::metrics::CheckpointStats) -> String {
    let how = match k.last_released {
        None => return "none".into(),
        Some(shmflow::Released::Aligned) => "A",
        Some(shmflow::Released::Unaligned { timed_out: true }) => "T",
        Some(_) => "U",
    };
    format!(
        "#{} {} {how}",
        k.last_id,
        crate::inspect::duration_ns(k.checkpoint_alignment_time_ns)
    )
}

/// Debloating's figures of a channel, if it is on: `cap N ≤ BYTES`.
fn debloat_text(s: &Snapshot) -> Option<String> {
    let limit = s.in_flight_limit_bytes()?;
    Some(format!(
        "cap {} ≤ {}",
        s.segment_cap,
        crate::inspect::bytes_text(limit)
    ))
}

/// The view's state: what was seen last, the selection, the filter, the open gate.
#[derive(Default)]
pub(crate) struct Top {
    prev: HashMap<String, Snapshot>,
    prev_gates: HashMap<String, GateSnapshot>,
    history: HashMap<String, VecDeque<f64>>,
    pub(crate) rows: Vec<RowData>,
    /// Every gate's channel rows, by gate name.
    gate_rows: HashMap<String, Vec<RowData>>,
    pub(crate) open_gate: Option<String>,
    pub(crate) filter: String,
    pub(crate) editing_filter: bool,
    pub(crate) table: TableState,
    /// A line or two per pipeline directory watched.
    pub(crate) pipelines: Vec<String>,
    /// Latency markers' figures by region name: this round's, and the last round's.
    pub(crate) latency: HashMap<String, Vec<shmflow::metrics::SourceLatency>>,
    latency_prev: HashMap<String, Vec<shmflow::metrics::SourceLatency>>,
}

fn ends(s: &Snapshot, alive: Alive) -> String {
    format!(
        "{} / {}",
        short(s.producer_state, alive.0),
        short(s.consumer_state, alive.1)
    )
}

fn short(e: shmflow::metrics::EndState, alive: bool) -> &'static str {
    match e {
        shmflow::metrics::EndState::Free => "-",
        shmflow::metrics::EndState::Attached if alive => "up",
        shmflow::metrics::EndState::Attached => "dead",
        shmflow::metrics::EndState::Detached => "left",
        shmflow::metrics::EndState::Failed => "failed",
        shmflow::metrics::EndState::Lost => "lost",
        shmflow::metrics::EndState::Invalid(_) => "?",
    }
}

impl Top {
    /// Takes in one round of snapshots: channels by name, gates by name.
    pub(crate) fn update(
        &mut self,
        channels: Vec<(String, Snapshot, Alive)>,
        gates: Vec<(String, GateSnapshot, Vec<bool>, bool)>,
    ) {
        // The selection follows its row as the rows are sorted again.
        let selected = self
            .table
            .selected()
            .and_then(|i| self.visible().get(i).map(|r| r.name.clone()));
        let mut rows = Vec::new();
        // What is gone from /dev/shm is forgotten.
        self.prev.retain(|n, _| channels.iter().any(|c| &c.0 == n));
        self.prev_gates
            .retain(|n, _| gates.iter().any(|g| &g.0 == n));
        self.history.retain(|k, _| {
            channels.iter().any(|c| &c.0 == k)
                || gates.iter().any(|g| k.starts_with(&format!("{}:", g.0)))
        });
        for (name, now, alive) in channels {
            let prev = self.prev.get(&name).copied().unwrap_or(now);
            let row = self.channel_row(&name, "channel".into(), &prev, &now, alive);
            self.prev.insert(name, now);
            rows.push(row);
        }
        self.gate_rows.clear();
        for (name, now, alive, consumer_alive) in gates {
            let prev = self
                .prev_gates
                .get(&name)
                .cloned()
                .unwrap_or_else(|| now.clone());
            let mut chans = Vec::new();
            for (c, (p, n)) in prev.channels.iter().zip(&now.channels).enumerate() {
                let up = (alive.get(c).copied().unwrap_or(false), true);
                let mut row = self.channel_row(
                    &format!("{name}:{c}"),
                    format!("ch {c}"),
                    &p.snapshot,
                    &n.snapshot,
                    up,
                );
                row.floating_held = Some((
                    n.floating_held,
                    n.snapshot
                        .segments_committed
                        .saturating_sub(n.snapshot.segments_taken),
                ));
                chans.push(row);
            }
            let bp = chans
                .iter()
                .filter_map(|r| r.back_pressured_ms)
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
            let records: f64 = chans.iter().map(|r| r.records_per_s).sum();
            let key = format!("{name}:gate");
            let history = if now.at_ns > prev.at_ns {
                self.push_history(&key, records)
            } else {
                Vec::new()
            };
            rows.push(RowData {
                name: name.clone(),
                kind: format!("gate ({})", now.channels.len()),
                back_pressured_ms: bp,
                level: bp.map(|b| BackpressureLevel::from_ratio(b / 1000.0)),
                out_pool: avg(chans.iter().map(|r| r.out_pool)),
                in_pool: avg(chans.iter().map(|r| r.in_pool)),
                gate_usage: Some((
                    now.input_exclusive_buffers_usage(),
                    now.input_floating_buffers_usage(),
                    now.likely_skew(),
                )),
                floating_held: None,
                records_per_s: records,
                mb_per_s: chans.iter().map(|r| r.mb_per_s).sum(),
                history,
                link: None,
                ends: format!(
                    "{}/{} up / {}",
                    now.channels
                        .iter()
                        .zip(&alive)
                        .filter(|(c, &a)| a
                            && c.snapshot.producer_state == shmflow::metrics::EndState::Attached)
                        .count(),
                    now.channels.len(),
                    short(now.consumer_state, consumer_alive)
                ),
                checkpoint: Some(checkpoint_text(&now.checkpoints)),
                latency: latency_text(self.latency_prev.get(&name), self.latency.get(&name)),
                debloat: now
                    .channels
                    .iter()
                    .find_map(|c| debloat_text(&c.snapshot))
                    .map(|_| {
                        let caps: u64 = now.channels.iter().map(|c| c.snapshot.segment_cap).sum();
                        format!("cap {caps} in all")
                    }),
            });
            sort(&mut chans);
            self.gate_rows.insert(name.clone(), chans);
            self.prev_gates.insert(name, now);
        }
        sort(&mut rows);
        self.rows = rows;
        self.latency_prev = std::mem::take(&mut self.latency);
        let at = selected.and_then(|n| self.visible().iter().position(|r| r.name == n));
        match at {
            Some(i) => self.table.select(Some(i)),
            None if !self.visible().is_empty() => self.table.select(Some(0)),
            None => self.table.select(None),
        }
    }

    fn push_history(&mut self, key: &str, v: f64) -> Vec<f64> {
        let h = self.history.entry(key.to_owned()).or_default();
        h.push_back(v);
        while h.len() > HISTORY {
            h.pop_front();
        }
        h.iter().copied().collect()
    }

    fn channel_row(
        &mut self,
        key: &str,
        kind: String,
        prev: &Snapshot,
        now: &Snapshot,
        alive: Alive,
    ) -> RowData {
        let r = now.rates_since(prev);
        // A producer that died keeps its state (and an endless wait) in the region: only a
        // live one is there.
        let producer_here = alive.0 && now.producer_state == shmflow::metrics::EndState::Attached;
        // A region seen for the first time has no rate yet.
        let history = if now.at_ns > prev.at_ns {
            self.push_history(key, r.records_read_per_s)
        } else {
            self.history
                .get(key)
                .map_or_else(Vec::new, |h| h.iter().copied().collect())
        };
        RowData {
            name: key.to_owned(),
            kind,
            back_pressured_ms: producer_here.then_some(r.back_pressured_time_ms_per_second),
            level: producer_here.then_some(r.level),
            out_pool: r.out_pool_usage,
            in_pool: r.in_pool_usage,
            gate_usage: None,
            floating_held: None,
            records_per_s: r.records_read_per_s,
            mb_per_s: r.bytes_read_per_s / 1e6,
            history,
            link: now.link.map(|l| (l.sending, l.credit, l.backlog)),
            ends: ends(now, alive),
            checkpoint: None,
            debloat: debloat_text(now),
            latency: latency_text(self.latency_prev.get(key), self.latency.get(key)),
        }
    }

    /// The rows on screen: the open gate's channels or every region, filtered.
    pub(crate) fn visible(&self) -> Vec<&RowData> {
        let rows: &[RowData] = match &self.open_gate {
            Some(g) => self.gate_rows.get(g).map_or(&[], Vec::as_slice),
            None => &self.rows,
        };
        rows.iter()
            .filter(|r| self.filter.is_empty() || r.name.contains(&self.filter))
            .collect()
    }

    /// Handles a key; false to quit.
    pub(crate) fn key(&mut self, code: crossterm::event::KeyCode) -> bool {
        use crossterm::event::KeyCode as K;
        if self.editing_filter {
            match code {
                K::Enter => self.editing_filter = false,
                K::Esc => {
                    self.editing_filter = false;
                    self.filter.clear();
                }
                K::Backspace => {
                    self.filter.pop();
                }
                K::Char(c) => self.filter.push(c),
                _ => {}
            }
            self.table.select(Some(0));
            return true;
        }
        let n = self.visible().len();
        match code {
            K::Char('q') => return false,
            K::Char('/') => self.editing_filter = true,
            K::Down | K::Char('j') if n > 0 => {
                let i = self.table.selected().map_or(0, |i| (i + 1).min(n - 1));
                self.table.select(Some(i));
            }
            K::Up | K::Char('k') => {
                let i = self.table.selected().map_or(0, |i| i.saturating_sub(1));
                self.table.select(Some(i));
            }
            K::Enter => {
                let selected = self
                    .table
                    .selected()
                    .and_then(|i| self.visible().get(i).copied());
                if let Some(r) = selected {
                    if r.gate_usage.is_some() {
                        self.open_gate = Some(r.name.clone());
                        self.filter.clear();
                        self.table.select(Some(0));
                    }
                }
            }
            K::Esc | K::Backspace | K::Left => {
                if self.open_gate.take().is_some() {
                    self.table.select(Some(0));
                } else if code == K::Esc && !self.filter.is_empty() {
                    self.filter.clear();
                }
            }
            _ => {}
        }
        true
    }
}

fn avg(v: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

/// Most backpressured first (rows without a producer last), then by name.
fn sort(rows: &mut [RowData]) {
    rows.sort_by(|a, b| {
        let key = |r: &RowData| r.back_pressured_ms.unwrap_or(-1.0);
        key(b).total_cmp(&key(a)).then_with(|| a.name.cmp(&b.name))
    });
}

/// Every channel's and every gate's snapshot, by name.
type Round = (
    Vec<(String, Snapshot, Alive)>,
    // A gate: its snapshot, each channel's producer alive, its consumer alive.
    Vec<(String, GateSnapshot, Vec<bool>, bool)>,
    // Latency markers' figures, by region name (channels and gates).
    HashMap<String, Vec<shmflow::metrics::SourceLatency>>,
);

/// Whether a live process holds each end's liveness lock: (producer, consumer).
pub(crate) type Alive = (bool, bool);

/// One round of snapshots of every region and gate on the machine.
fn take() -> Result<Round, String> {
    let mut latency = HashMap::new();
    let channels = shmflow::monitor::list_regions()
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|r| {
            latency.insert(r.name.clone(), r.latency);
            (r.name, r.snapshot, (r.producer_alive, r.consumer_alive))
        })
        .collect();
    let gates = shmflow::monitor::list_gates()
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|(n, g)| {
            let alive = (0..g.channels()).map(|c| g.producer_alive(c)).collect();
            latency.insert(n.clone(), g.latency());
            (n, g.snapshot(), alive, g.consumer_alive())
        })
        .collect();
    Ok((channels, gates, latency))
}

/// Runs the view in the terminal until `q`.
pub(crate) fn main(interval: Duration, pipelines: Vec<std::path::PathBuf>) -> Result<(), String> {
    use crossterm::event::{self, Event, KeyEventKind};
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        return Err(
            "top draws on a terminal and reads keys from it, and this is not one: \
                    `shmflow stat NAME` or `shmflow list` print, `shmflow export` serves the \
                    figures to Prometheus"
                .into(),
        );
    }
    let mut top = Top::default();
    let (c, g, l) = take()?;
    top.latency = l;
    top.update(c, g);
    let pipeline_lines = || -> Result<Vec<String>, String> {
        pipelines
            .iter()
            .map(|d| crate::inspect::pipeline::View::read(d).map(|v| v.lines()))
            .collect::<Result<Vec<_>, _>>()
            .map(|v| v.concat())
    };
    top.pipelines = pipeline_lines()?;
    let mut terminal = ratatui::init();
    let res = (|| -> Result<(), String> {
        let mut last = std::time::Instant::now();
        loop {
            terminal.draw(|f| top.draw(f)).map_err(|e| e.to_string())?;
            let wait = interval.saturating_sub(last.elapsed());
            if event::poll(wait).map_err(|e| e.to_string())? {
                if let Event::Key(k) = event::read().map_err(|e| e.to_string())? {
                    if k.kind == KeyEventKind::Press && !top.key(k.code) {
                        return Ok(());
                    }
                }
            }
            if last.elapsed() >= interval {
                let (c, g, l) = take()?;
                top.latency = l;
                top.update(c, g);
                top.pipelines = pipeline_lines()?;
                last = std::time::Instant::now();
            }
        }
    })();
    ratatui::restore();
    res
}

#[cfg(test)]
mod tests;
