//! How `shmflow top` draws: the header, the table of rows (levels in colour, usages as bars,
//! rates with sparklines) and the keys, on ratatui.

use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table};
use ratatui::Frame;
use shmflow::metrics::BackpressureLevel;

use super::{RowData, Top, HISTORY};

impl Top {
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
