//! `shmflow top`: a live view of every channel and gate on the machine, sorted by
//! backpressure. It only reads (as `shmflow stat` does): every refresh lists `/dev/shm` and takes
//! a snapshot of each region's counters.
//!
//! Keys: ↑/↓ (or k/j) select, Enter opens the selected gate's channels (where skew shows),
//! Esc or Backspace goes back, `/` starts a filter on names (Enter keeps it, Esc drops it),
//! `q` quits.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table, TableState};
use ratatui::Frame;
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
                row.floating_held = Some((n.floating_held, n.backlog));
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
            });
            sort(&mut chans);
            self.gate_rows.insert(name.clone(), chans);
            self.prev_gates.insert(name, now);
        }
        sort(&mut rows);
        self.rows = rows;
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

    /// Draws the view.
    pub(crate) fn draw(&mut self, f: &mut Frame<'_>) {
        let [head, body, foot] = Layout::vertical([
            Constraint::Length(2 + self.pipelines.len() as u16),
            Constraint::Min(3),
            Constraint::Length(1),
        ])
        .areas(f.area());
        let title = match &self.open_gate {
            Some(g) => format!("shmflow top — gate {g}: its channels, by backpressure"),
            None => "shmflow top — channels and gates, by backpressure".to_string(),
        };
        let total = self.visible().len();
        f.render_widget(
            Paragraph::new(
                vec![
                    Line::from(Span::styled(
                        title,
                        Style::new().add_modifier(Modifier::BOLD),
                    )),
                    Line::from(format!(
                        "{total} shown{}   level: OK < 100 ≤ LOW ≤ 500 < HIGH backpressured ms/s",
                        if self.filter.is_empty() {
                            String::new()
                        } else {
                            format!(", filter \"{}\"", self.filter)
                        }
                    )),
                ]
                .into_iter()
                .chain(self.pipelines.iter().map(|l| Line::from(l.clone())))
                .collect::<Vec<_>>(),
            ),
            head,
        );
        let gate_view = self.open_gate.is_some();
        let header = Row::new(
            [
                "NAME",
                "KIND",
                "LEVEL",
                "BP ms/s",
                "OUT POOL",
                "IN POOL",
                if gate_view {
                    "FLOAT/BACKLOG"
                } else {
                    "EXCL/FLOAT"
                },
                "REC/S",
                "MB/S",
                "REC/S HISTORY",
                "LINK",
                "ENDS",
            ]
            .map(|h| Cell::from(h).style(Style::new().add_modifier(Modifier::BOLD))),
        );
        // The name column takes what the others leave (11 spaces between 12 columns), and a
        // name longer than that is shortened in the middle: prefixes are often shared.
        let fixed: u16 = 9 + 5 + 7 + 15 + 15 + 15 + 10 + 8 + HISTORY as u16 + 16 + 12 + 11;
        let name_width = (f.area().width.saturating_sub(fixed) as usize).max(18);
        let rows: Vec<Row> = self
            .visible()
            .into_iter()
            .map(|r| row(r, name_width))
            .collect();
        let table = Table::new(
            rows,
            [
                Constraint::Min(18),
                Constraint::Length(9),
                Constraint::Length(5),
                Constraint::Length(7),
                Constraint::Length(15),
                Constraint::Length(15),
                Constraint::Length(15),
                Constraint::Length(10),
                Constraint::Length(8),
                Constraint::Length(HISTORY as u16),
                Constraint::Length(16),
                Constraint::Length(12),
            ],
        )
        .header(header)
        .block(Block::new().borders(Borders::TOP))
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED));
        f.render_stateful_widget(table, body, &mut self.table);
        let help = if self.editing_filter {
            format!("filter: {}▏  Enter keep · Esc drop", self.filter)
        } else if gate_view {
            "↑↓ select · Esc back to every region · / filter · q quit".to_string()
        } else {
            "↑↓ select · Enter open a gate's channels · / filter · q quit".to_string()
        };
        f.render_widget(
            Paragraph::new(help).style(Style::new().fg(Color::DarkGray)),
            foot,
        );
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

/// `value` in 0..=1 as a bar of `width` cells and the figure.
pub(crate) fn bar(value: f64, width: usize) -> String {
    let v = value.clamp(0.0, 1.0);
    let full = (v * width as f64).round() as usize;
    format!("{}{} {:.2}", "█".repeat(full), "░".repeat(width - full), v)
}

/// A sparkline of `values`, scaled to their maximum.
pub(crate) fn sparkline(values: &[f64]) -> String {
    const TICKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = values.iter().copied().fold(0.0, f64::max);
    values
        .iter()
        .map(|&v| {
            if max <= 0.0 {
                TICKS[0]
            } else {
                TICKS[((v / max) * 7.0).round().clamp(0.0, 7.0) as usize]
            }
        })
        .collect()
}

fn level_style(l: Option<BackpressureLevel>) -> Style {
    match l {
        Some(BackpressureLevel::Ok) => Style::new().fg(Color::Green),
        Some(BackpressureLevel::Low) => Style::new().fg(Color::Yellow),
        Some(BackpressureLevel::High) => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        None => Style::new().fg(Color::DarkGray),
    }
}

/// `name` in at most `width` characters: its start and its end around an ellipsis.
pub(crate) fn shorten_middle(name: &str, width: usize) -> String {
    let chars: Vec<char> = name.chars().collect();
    if chars.len() <= width || width < 3 {
        return name.to_owned();
    }
    let tail = (width - 1) / 2;
    let head = width - 1 - tail;
    let mut out: String = chars[..head].iter().collect();
    out.push('…');
    out.extend(&chars[chars.len() - tail..]);
    out
}

fn row(r: &RowData, name_width: usize) -> Row<'static> {
    let dash = || "—".to_string();
    let usage = match (r.gate_usage, r.floating_held) {
        (Some((e, f, skew)), _) => format!("{e:.2}/{f:.2}{}", if skew { " SKEW" } else { "" }),
        (_, Some((held, backlog))) => format!("{held} / {backlog}"),
        _ => dash(),
    };
    Row::new(vec![
        Cell::from(shorten_middle(&r.name, name_width)),
        Cell::from(r.kind.clone()),
        Cell::from(r.level.map_or("—", |l| l.as_str())).style(level_style(r.level)),
        Cell::from(r.back_pressured_ms.map_or_else(dash, |b| format!("{b:.0}"))),
        Cell::from(bar(r.out_pool, 10)),
        Cell::from(bar(r.in_pool, 10)),
        Cell::from(usage).style(if r.gate_usage.is_some_and(|g| g.2) {
            Style::new().fg(Color::Magenta)
        } else {
            Style::new()
        }),
        Cell::from(format!("{:.0}", r.records_per_s)),
        Cell::from(format!("{:.1}", r.mb_per_s)),
        Cell::from(sparkline(&r.history)).style(Style::new().fg(Color::Cyan)),
        Cell::from(r.link.map_or_else(dash, |(sending, credit, backlog)| {
            format!(
                "{} c{credit} b{backlog}",
                if sending { "out" } else { "in" }
            )
        })),
        Cell::from(r.ends.clone()),
    ])
}

/// Every channel's and every gate's snapshot, by name.
type Round = (
    Vec<(String, Snapshot, Alive)>,
    // A gate: its snapshot, each channel's producer alive, its consumer alive.
    Vec<(String, GateSnapshot, Vec<bool>, bool)>,
);

/// Whether a live process holds each end's liveness lock: (producer, consumer).
pub(crate) type Alive = (bool, bool);

/// One round of snapshots of every region and gate on the machine.
fn take() -> Result<Round, String> {
    let channels = shmflow::monitor::list_regions()
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|r| (r.name, r.snapshot, (r.producer_alive, r.consumer_alive)))
        .collect();
    let gates = shmflow::monitor::list_gates()
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|(n, g)| {
            let alive = (0..g.channels()).map(|c| g.producer_alive(c)).collect();
            (n, g.snapshot(), alive, g.consumer_alive())
        })
        .collect();
    Ok((channels, gates))
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
    let (c, g) = take()?;
    top.update(c, g);
    let pipeline_lines = || -> Result<Vec<String>, String> {
        pipelines
            .iter()
            .map(|d| crate::pipeline::View::read(d).map(|v| v.lines()))
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
                let (c, g) = take()?;
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
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    const UP: Alive = (true, true);

    fn snap(
        at_s: u64,
        written: u64,
        read: u64,
        bp_ms: u64,
        producer: shmflow::metrics::EndState,
    ) -> Snapshot {
        let mut s = Snapshot::default();
        s.at_ns = at_s * 1_000_000_000;
        s.segment_count = 16;
        s.segment_size = 32768;
        s.records_written = written;
        s.records_read = read;
        s.bytes_read = read * 64;
        s.backpressured_ns = bp_ms * 1_000_000;
        s.segments_not_free = 12;
        s.segments_at_consumer = 8;
        s.producer_state = producer;
        s.consumer_state = shmflow::metrics::EndState::Attached;
        s
    }

    fn screen(top: &mut Top) -> String {
        let mut t = Terminal::new(TestBackend::new(200, 14)).unwrap();
        t.draw(|f| top.draw(f)).unwrap();
        let buf = t.backend().buffer().clone();
        (0..buf.area.height)
            .map(|y| {
                (0..buf.area.width)
                    .map(|x| buf[(x, y)].symbol().to_string())
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn rows_are_sorted_by_backpressure_with_levels_bars_and_sparklines() {
        use shmflow::metrics::EndState::{Attached, Detached};
        let mut top = Top::default();
        top.update(
            vec![
                ("/calm".into(), snap(1, 0, 0, 0, Attached), UP),
                ("/busy".into(), snap(1, 0, 0, 0, Attached), UP),
                ("/gone".into(), snap(1, 0, 0, 0, Detached), UP),
            ],
            vec![],
        );
        top.update(
            vec![
                ("/calm".into(), snap(2, 1000, 1000, 20, Attached), UP),
                ("/busy".into(), snap(2, 5000, 5000, 800, Attached), UP),
                ("/gone".into(), snap(2, 0, 0, 0, Detached), UP),
            ],
            vec![],
        );
        let names: Vec<&str> = top.visible().iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["/busy", "/calm", "/gone"]);
        // The selection follows its row when the order changes.
        let mut moved = Top::default();
        for (t, calm_bp) in [(1, 0), (2, 10), (3, 990)] {
            moved.update(
                vec![
                    (
                        "/calm".into(),
                        snap(t, t * 100, t * 100, calm_bp, Attached),
                        UP,
                    ),
                    (
                        "/busy".into(),
                        snap(t, t * 100, t * 100, t * 100, Attached),
                        UP,
                    ),
                ],
                vec![],
            );
            if t == 2 {
                assert_eq!(moved.visible()[1].name, "/calm");
                moved.key(crossterm::event::KeyCode::Down);
            }
        }
        assert_eq!(moved.visible()[0].name, "/calm");
        assert_eq!(moved.table.selected(), Some(0), "still on /calm");
        let s = screen(&mut top);
        let busy = s.lines().find(|l| l.contains("/busy")).unwrap();
        assert!(busy.contains("HIGH") && busy.contains("800"), "{busy}");
        assert!(busy.contains("████████░░ 0.75"), "out pool bar: {busy}");
        assert!(busy.contains("5000"), "{busy}");
        let mut linked = Top::default();
        let mut bridged = snap(1, 0, 0, 0, Attached);
        let mut link = shmflow::metrics::LinkSnapshot::default();
        (link.sending, link.credit, link.backlog) = (true, 3, 1);
        bridged.link = Some(link);
        linked.update(vec![("/bridged".into(), bridged, UP)], vec![]);
        let ls = screen(&mut linked);
        assert!(
            ls.contains("out c3 b1"),
            "a sending bridge's credit and backlog: {ls}"
        );
        // A producer killed while blocked: still ATTACHED, its wait never ends, but dead.
        let mut dead = Top::default();
        for at in [1, 2] {
            let mut killed = snap(at, 10, 10, 0, Attached);
            killed.backpressured_ns = at * 1_000_000_000;
            dead.update(vec![("/killed".into(), killed, (false, true))], vec![]);
        }
        let ds = screen(&mut dead);
        let killed = ds.lines().find(|l| l.contains("/killed")).unwrap();
        assert!(
            !killed.contains("HIGH") && killed.contains("dead / up"),
            "{killed}"
        );
        let gone = s.lines().find(|l| l.contains("/gone")).unwrap();
        assert!(
            gone.contains('—'),
            "no level for an end that is not there: {gone}"
        );
        assert!(busy.contains("█ "), "a sparkline of records/s: {busy}");
    }

    #[test]
    fn a_gate_opens_to_its_channels_and_the_filter_narrows_the_rows() {
        use crossterm::event::KeyCode as K;
        use shmflow::metrics::ChannelStats;
        let ch = |at, w, bp, held| {
            let mut c = ChannelStats::default();
            c.snapshot = snap(at, w, w, bp, shmflow::metrics::EndState::Attached);
            (c.backlog, c.floating_held) = (3, held);
            c
        };
        let gate = |at, hot_bp| {
            let mut g = GateSnapshot::default();
            g.at_ns = at * 1_000_000_000;
            (g.exclusive, g.floating) = (2, 8);
            g.consumer_state = shmflow::metrics::EndState::Attached;
            g.channels = vec![ch(at, at * 10, 0, 0), ch(at, at * 100, hot_bp, 8)];
            g
        };
        let mut top = Top::default();
        top.update(
            vec![(
                "/other".into(),
                snap(1, 0, 0, 0, shmflow::metrics::EndState::Attached),
                UP,
            )],
            vec![("/g".into(), gate(1, 0), vec![true, true], true)],
        );
        top.update(
            vec![(
                "/other".into(),
                snap(2, 0, 0, 0, shmflow::metrics::EndState::Attached),
                UP,
            )],
            vec![("/g".into(), gate(2, 900), vec![true, true], true)],
        );
        assert_eq!(
            top.visible()[0].name,
            "/g",
            "the gate's worst channel ranks it"
        );
        let s = screen(&mut top);
        assert!(s.contains("SKEW"), "floating high, exclusive low: {s}");
        assert!(top.key(K::Enter));
        let names: Vec<String> = top.visible().iter().map(|r| r.name.clone()).collect();
        assert_eq!(names, ["/g:1", "/g:0"]);
        let s = screen(&mut top);
        assert!(s.contains("gate /g: its channels"), "{s}");
        assert!(s.contains("8 / 3"), "floating held and backlog: {s}");
        assert!(top.key(K::Esc));
        assert!(top.open_gate.is_none());
        for k in [K::Char('/'), K::Char('o'), K::Char('t'), K::Enter] {
            assert!(top.key(k));
        }
        let names: Vec<&str> = top.visible().iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["/other"]);
        assert!(!top.key(K::Char('q')));
    }

    #[test]
    fn a_gate_whose_consumer_died_shows_it_dead() {
        let mut g = GateSnapshot::default();
        g.consumer_state = shmflow::metrics::EndState::Attached;
        let mut top = Top::default();
        top.update(vec![], vec![("/g".into(), g.clone(), vec![], false)]);
        assert!(top.rows[0].ends.ends_with("/ dead"), "{}", top.rows[0].ends);
        top.update(vec![], vec![("/g".into(), g, vec![], true)]);
        assert!(top.rows[0].ends.ends_with("/ up"), "{}", top.rows[0].ends);
    }

    #[test]
    fn long_names_are_shortened_in_the_middle() {
        assert_eq!(shorten_middle("/short", 18), "/short");
        let s = shorten_middle("/shmflow-pl-wordcount-2d2f41ce-6508x1-count-1", 18);
        assert_eq!(s.chars().count(), 18);
        assert!(s.starts_with("/shmflow-") && s.ends_with("count-1"), "{s}");
    }

    #[test]
    fn bars_and_sparklines() {
        assert_eq!(bar(0.5, 4), "██░░ 0.50");
        assert_eq!(bar(2.0, 2), "██ 1.00");
        assert_eq!(sparkline(&[0.0, 1.0, 2.0]), "▁▅█");
        assert_eq!(sparkline(&[0.0, 0.0]), "▁▁");
    }
}
