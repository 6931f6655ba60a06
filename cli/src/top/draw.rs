//! How `shmflow top` draws: the header, the table of rows (levels in colour, usages as bars,
//! rates with sparklines) and the keys, on ratatui.

use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table};
use ratatui::Frame;
use shmflow::metrics::BackpressureLevel;

use super::{RowData, Top};

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
        let visible = self.visible();
        let (widths, header, rows) = table(&visible, gate_view, f.area().width);
        let table = Table::new(rows, widths)
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

/// One column: its heading, and each row's cell as text and style.
struct Column {
    heading: &'static str,
    cells: Vec<(String, Style)>,
    /// Lower goes first when the screen is too narrow for every column.
    keep: u8,
}

impl Column {
    /// As wide as its widest cell or heading: a figure is never cut.
    fn width(&self) -> u16 {
        self.cells
            .iter()
            .map(|(t, _)| t.chars().count())
            .chain([self.heading.chars().count()])
            .max()
            .unwrap_or(0) as u16
    }
}

/// The least the name column gets before other columns are left out.
const NAME_MIN: u16 = 16;

/// The table for `rows` at `width` columns: every column as wide as its widest figure;
/// columns are left out, least needed first, until the rest fit with at least [`NAME_MIN`]
/// for the names, which take what is left (shortened in the middle).
fn table(
    rows: &[&RowData],
    gate_view: bool,
    width: u16,
) -> (Vec<Constraint>, Row<'static>, Vec<Row<'static>>) {
    let dash = || "—".to_string();
    let plain = Style::new();
    let col = |heading, keep, cell: &dyn Fn(&RowData) -> (String, Style)| Column {
        heading,
        cells: rows.iter().map(|r| cell(r)).collect(),
        keep,
    };
    let columns = vec![
        col("KIND", 4, &|r| (r.kind.clone(), plain)),
        col("LEVEL", 9, &|r| {
            (
                r.level.map_or("—", |l| l.as_str()).to_string(),
                level_style(r.level),
            )
        }),
        col("BP ms/s", 8, &|r| {
            (
                r.back_pressured_ms.map_or_else(dash, |b| format!("{b:.0}")),
                plain,
            )
        }),
        col("OUT POOL", 3, &|r| (bar(r.out_pool, 10), plain)),
        col("IN POOL", 3, &|r| (bar(r.in_pool, 10), plain)),
        col(
            if gate_view {
                "FLOAT/BACKLOG"
            } else {
                "EXCL/FLOAT"
            },
            3,
            &|r| {
                let text = match (r.gate_usage, r.floating_held) {
                    (Some((e, f, skew)), _) => {
                        format!("{e:.2}/{f:.2}{}", if skew { " SKEW" } else { "" })
                    }
                    (_, Some((held, backlog))) => format!("{held} / {backlog}"),
                    _ => dash(),
                };
                let style = if r.gate_usage.is_some_and(|g| g.2) {
                    Style::new().fg(Color::Magenta)
                } else {
                    plain
                };
                (text, style)
            },
        ),
        col("REC/S", 7, &|r| (format!("{:.0}", r.records_per_s), plain)),
        col("MB/S", 6, &|r| (format!("{:.1}", r.mb_per_s), plain)),
        col("REC/S HISTORY", 0, &|r| {
            (sparkline(&r.history), Style::new().fg(Color::Cyan))
        }),
        col("CHECKPOINT", 6, &|r| {
            (r.checkpoint.clone().unwrap_or_else(dash), plain)
        }),
        col("DEBLOAT", 5, &|r| {
            (r.debloat.clone().unwrap_or_else(dash), plain)
        }),
        col("LATENCY", 5, &|r| {
            (r.latency.clone().unwrap_or_else(dash), plain)
        }),
        col("LINK", 1, &|r| {
            let text = r.link.map_or_else(dash, |(sending, credit, backlog)| {
                format!(
                    "{} c{credit} b{backlog}",
                    if sending { "out" } else { "in" }
                )
            });
            (text, plain)
        }),
        col("ENDS", 7, &|r| (r.ends.clone(), plain)),
    ];
    // Leave out the least needed columns until the rest fit (one space between columns).
    let mut shown: Vec<bool> = vec![true; columns.len()];
    let need = |shown: &[bool]| -> u16 {
        columns
            .iter()
            .zip(shown)
            .filter(|(_, &s)| s)
            .map(|(c, _)| c.width() + 1)
            .sum::<u16>()
            + NAME_MIN
    };
    let mut order: Vec<usize> = (0..columns.len()).collect();
    order.sort_by_key(|&i| columns[i].keep);
    for i in order {
        if need(&shown) <= width {
            break;
        }
        shown[i] = false;
    }
    let name_width = width.saturating_sub(need(&shown) - NAME_MIN).max(NAME_MIN);
    let bold = Style::new().add_modifier(Modifier::BOLD);
    let mut widths = vec![Constraint::Length(name_width)];
    let mut heading = vec![Cell::from("NAME").style(bold)];
    for (c, _) in columns.iter().zip(&shown).filter(|(_, &s)| s) {
        widths.push(Constraint::Length(c.width()));
        heading.push(Cell::from(c.heading).style(bold));
    }
    let body = rows
        .iter()
        .enumerate()
        .map(|(k, r)| {
            let mut cells = vec![Cell::from(shorten_middle(&r.name, name_width as usize))];
            for (c, _) in columns.iter().zip(&shown).filter(|(_, &s)| s) {
                let (text, style) = c.cells[k].clone();
                cells.push(Cell::from(text).style(style));
            }
            Row::new(cells)
        })
        .collect();
    (widths, Row::new(heading), body)
}
