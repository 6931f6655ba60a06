//! The output of `shmflow demo backpressure`: the samples as rows per 100 ms, the summary
//! per phase on stdout, `backpressure.csv`, and `backpressure.svg` (three panels on one time
//! axis, the phases shaded).

use std::fmt::Write as _;

use shmflow::metrics::Snapshot;

use super::{median, Phase, Plan};

/// One sample of the experiment: rates over the last 100 ms and the state at its end.
struct Row {
    /// Seconds since the first phase started.
    t: f64,
    phase: usize,
    produced: f64,
    consumed: f64,
    back_pressured_ms: f64,
    out_pool: f64,
    in_pool: f64,
    level: shmflow::metrics::BackpressureLevel,
}

pub(super) fn report(
    plan: &Plan,
    samples: &[(Snapshot, Snapshot)],
    out: &std::path::Path,
    (segments, segment_size, record_size, remote): (u32, u32, usize, bool),
) -> Result<Verdict, String> {
    let t0 = plan.start_ns;
    let end = plan.phase_start(plan.phases.len());
    let rows: Vec<Row> = samples
        .windows(2)
        .filter(|w| w[1].0.at_ns > t0 && w[1].0.at_ns <= end)
        .map(|w| {
            let (near, far) = (w[1].0.rates_since(&w[0].0), w[1].1.rates_since(&w[0].1));
            Row {
                t: (w[1].0.at_ns - t0) as f64 / 1e9,
                phase: plan.phase_at(w[1].0.at_ns).unwrap_or(plan.phases.len() - 1),
                produced: near.records_written_per_s,
                consumed: far.records_read_per_s,
                back_pressured_ms: near.back_pressured_time_ms_per_second,
                out_pool: near.out_pool_usage,
                in_pool: far.in_pool_usage,
                level: near.level,
            }
        })
        .collect();
    // 100 %: the median of the consumer's rate in the calibration phase, past its first tenth.
    let settle = plan.phase_ns as f64 / 1e9 / 10.0;
    let full = median(
        rows.iter()
            .filter(|r| r.phase == 0 && r.t > settle)
            .map(|r| r.consumed)
            .collect(),
    )
    .max(1.0);
    let target = |r: &Row| 100.0 * plan.phases[r.phase].producer.unwrap_or(1.0);
    let mut csv = String::from(
        "t_s,phase,producer_records_per_s,consumer_records_per_s,producer_pct,consumer_pct,\
         producer_target_pct,backPressuredTimeMsPerSecond,outPoolUsage,inPoolUsage,level\n",
    );
    for r in &rows {
        let _ = writeln!(
            csv,
            "{:.2},{},{:.0},{:.0},{:.1},{:.1},{:.0},{:.1},{:.3},{:.3},{}",
            r.t,
            r.phase,
            r.produced,
            r.consumed,
            100.0 * r.produced / full,
            100.0 * r.consumed / full,
            target(r),
            r.back_pressured_ms,
            r.out_pool,
            r.in_pool,
            r.level.as_str()
        );
    }
    let csv_path = out.join("backpressure.csv");
    std::fs::write(&csv_path, csv).map_err(|e| format!("{}: {e}", csv_path.display()))?;

    println!(
        "100 % = {:.2} M records/s (median of the calibration phase)",
        full / 1e6
    );
    println!(
        "{:<36} {:>9} {:>9} {:>9} {:>12} {:>6}",
        "phase (medians past its first tenth)", "target %", "sent %", "read %", "bp ms/s", "level"
    );
    // The calibration's spread: a host busy with other work makes the rates jump, and then
    // no phase can be judged against them.
    let calibration: Vec<f64> = rows
        .iter()
        .filter(|r| r.phase == 0 && r.t > settle)
        .map(|r| r.consumed)
        .collect();
    let (p10, p90) = (quantile(&calibration, 0.1), quantile(&calibration, 0.9));
    let disturbed = calibration.len() < 3 || p90 > 1.5 * p10.max(1.0);
    let mut missed = Vec::new();
    for (i, phase) in plan.phases.iter().enumerate() {
        let in_phase: Vec<&Row> = rows
            .iter()
            .filter(|r| r.phase == i && r.t > i as f64 * plan.phase_ns as f64 / 1e9 + settle)
            .collect();
        if in_phase.is_empty() {
            continue;
        }
        let m = |f: &dyn Fn(&Row) -> f64| median(in_phase.iter().map(|r| f(r)).collect());
        let bp = m(&|r| r.back_pressured_ms);
        let read_pct = 100.0 * m(&|r| r.consumed) / full;
        let level = shmflow::metrics::BackpressureLevel::from_ratio(bp / 1000.0);
        println!(
            "{:<36} {:>9.0} {:>9.0} {:>9.0} {:>12.0} {:>6}",
            phase.label,
            100.0 * phase.producer.unwrap_or(1.0),
            100.0 * m(&|r| r.produced) / full,
            read_pct,
            bp,
            level.as_str()
        );
        if i > 0 {
            missed.extend(judge(phase, read_pct, level));
        }
    }
    if disturbed {
        return Ok(Verdict::HostTooBusy(format!(
            "host too busy: the calibration's rate ranged {:.2}-{:.2} M records/s (10th-90th \
             percentile), more than 1.5x, so the phases cannot be judged; {} and the plot are \
             written; run again on a quieter host",
            p10 / 1e6,
            p90 / 1e6,
            csv_path.display()
        )));
    }
    let svg_path = out.join("backpressure.svg");
    let title = format!(
        "Backpressure {}: {segments} x {} KiB segments, {record_size} B records, 100 % = {:.2} M records/s",
        if remote {
            "across TCP (two bridges on loopback)"
        } else {
            "between two processes"
        },
        segment_size / 1024,
        full / 1e6
    );
    plot(plan, &rows, full, &title, &svg_path)
        .map_err(|e| format!("{}: {e}", svg_path.display()))?;
    println!("wrote {} and {}", csv_path.display(), svg_path.display());
    if missed.is_empty() {
        println!("every phase followed its targets");
        Ok(Verdict::Followed)
    } else {
        Ok(Verdict::Missed(format!(
            "phases that did not follow their targets (other work on this host can cause it; run again on a quieter one):\n  {}",
            missed.join("\n  ")
        )))
    }
}

/// How the run went against its targets.
pub(super) enum Verdict {
    /// Every phase followed its targets.
    Followed,
    /// Some did not: which, and why.
    Missed(String),
    /// The calibration was disturbed: nothing could be judged.
    HostTooBusy(String),
}

/// What a phase should show: the consumer reads at the slower side's target (within 20
/// points of the calibrated rate; with both sides flat out, at least 80 %), backpressure
/// where the consumer is the slower side (LOW or HIGH), none where the producer is (OK). Both
/// at the same target: no level is expected.
pub(super) fn judge(
    phase: &Phase,
    read_pct: f64,
    level: shmflow::metrics::BackpressureLevel,
) -> Option<String> {
    use shmflow::metrics::BackpressureLevel as L;
    let (p, c) = (phase.producer.unwrap_or(1.0), phase.consumer.unwrap_or(1.0));
    let want = 100.0 * p.min(c);
    if phase.producer.is_none() && phase.consumer.is_none() {
        // Both flat out: no rate to follow, but the throughput is back (the calibration's
        // rate, or more once both sides are warm).
        if read_pct < 80.0 {
            return Some(format!(
                "{}: read {read_pct:.0} % with both sides flat out (at least 80 % expected)",
                phase.label
            ));
        }
    } else if (read_pct - want).abs() > 20.0 {
        return Some(format!(
            "{}: read {read_pct:.0} % where {want:.0} % was the target",
            phase.label
        ));
    }
    match (c < p, p < c, level) {
        (true, _, L::Ok) => Some(format!(
            "{}: level OK where the slower consumer should backpressure the producer",
            phase.label
        )),
        (_, true, L::Low | L::High) => Some(format!(
            "{}: level {} where the slower producer should never wait",
            phase.label,
            level.as_str()
        )),
        _ => None,
    }
}

/// The `q` quantile of `v` (0 if empty).
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * q).round().max(0.0) as usize)
        .copied()
        .unwrap_or(0.0)
}

/// Three panels on one time axis, phases shaded and labelled: throughput (% of the calibrated
/// rate, the producer's target dashed), backpressured ms/s over Flink's OK/LOW/HIGH bands, and
/// the pools' usage.
fn plot(
    plan: &Plan,
    rows: &[Row],
    full: f64,
    title: &str,
    path: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1200, 920)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 22))?;
    let (strip, rest) = root.split_vertically(64);
    let (top, rest) = rest.split_vertically(400);
    let (mid, bottom) = rest.split_vertically(240);
    let t_max = plan.phases.len() as f64 * plan.phase_ns as f64 / 1e9;
    let phase_s = plan.phase_ns as f64 / 1e9;
    let producer_color = RGBColor(235, 120, 95);
    let consumer_color = RGBColor(20, 60, 160);
    let whole = |v: &f64| format!("{v:.0}");

    // The phases' labels, in a strip of their own above the panels (same x scale).
    let mut c = ChartBuilder::on(&strip)
        .margin_left(12)
        .margin_right(24)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..t_max, 0f64..3f64)?;
    shade_phases(&mut c, plan, 3.0)?;
    let center = plotters::style::text_anchor::Pos::new(
        plotters::style::text_anchor::HPos::Center,
        plotters::style::text_anchor::VPos::Center,
    );
    for (i, phase) in plan.phases.iter().enumerate() {
        let x = (i as f64 + 0.5) * phase_s;
        let (first, second) = match phase.label.split_once(": ") {
            Some((a, b)) => (format!("{a}:"), b.to_owned()),
            None => match phase.label.split_once(", ") {
                Some((a, b)) => (format!("{a},"), b.to_owned()),
                None => (phase.label.clone(), String::new()),
            },
        };
        let font = ("sans-serif", 14).into_font().color(&BLACK).pos(center);
        c.draw_series([
            Text::new(
                format!("phase {i}"),
                (x, 2.5),
                ("sans-serif", 14)
                    .into_font()
                    .style(FontStyle::Bold)
                    .color(&BLACK)
                    .pos(center),
            ),
            Text::new(first, (x, 1.5), font.clone()),
            Text::new(second, (x, 0.6), font),
        ])?;
    }

    // Throughput (the scale grows past 140 % for a noisy run rather than clipping it).
    let pct = |v: f64| 100.0 * v / full;
    let y_max = rows
        .iter()
        .map(|r| pct(r.produced).max(pct(r.consumed)) * 1.05)
        .fold(100.0, f64::max)
        // Room above the data for the legend.
        * 1.3;
    let mut c = ChartBuilder::on(&top)
        .margin_left(12)
        .margin_right(24)
        .x_label_area_size(10)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..t_max, 0f64..y_max)?;
    shade_phases(&mut c, plan, y_max)?;
    c.configure_mesh()
        .disable_x_mesh()
        .y_desc("throughput, % of calibrated rate")
        .x_labels(0)
        .y_labels(8)
        .y_label_formatter(&whole)
        .light_line_style(TRANSPARENT)
        .bold_line_style(RGBColor(210, 210, 210))
        .draw()?;
    c.draw_series(DashedLineSeries::new(
        step_points(plan, |p| 100.0 * p.producer.unwrap_or(1.0)),
        10,
        6,
        BLACK.stroke_width(2),
    ))?
    .label("producer target")
    .legend(|(x, y)| {
        plotters::element::DashedPathElement::new(
            vec![(x, y), (x + 24, y)],
            6,
            3,
            BLACK.stroke_width(2),
        )
    });
    line(
        &mut c,
        rows.iter().map(|r| (r.t, pct(r.produced))),
        producer_color,
        7,
        "producer: records sent",
    )?;
    line(
        &mut c,
        rows.iter().map(|r| (r.t, pct(r.consumed))),
        consumer_color,
        2,
        "consumer: records read",
    )?;
    legend(&mut c, SeriesLabelPosition::UpperLeft)?;

    // Backpressured time, over Flink's bands.
    let mut c = ChartBuilder::on(&mid)
        .margin_left(12)
        .margin_right(24)
        .x_label_area_size(10)
        .y_label_area_size(64)
        // Up to 1000 ms/s, and room above for the legend.
        .build_cartesian_2d(0f64..t_max, 0f64..1250f64)?;
    let bands = [
        (0.0, 100.0, RGBColor(214, 240, 214), "OK"),
        (100.0, 500.0, RGBColor(250, 236, 200), "LOW"),
        (500.0, 1000.0, RGBColor(248, 214, 210), "HIGH"),
    ];
    c.draw_series(
        bands
            .iter()
            .map(|&(lo, hi, color, _)| Rectangle::new([(0.0, lo), (t_max, hi)], color.filled())),
    )?;
    c.draw_series((1..plan.phases.len()).map(|i| {
        PathElement::new(
            vec![(i as f64 * phase_s, 0.0), (i as f64 * phase_s, 1000.0)],
            RGBColor(150, 150, 150).stroke_width(1),
        )
    }))?;
    c.configure_mesh()
        .disable_x_mesh()
        .disable_y_mesh()
        .y_desc("backpressured ms/s")
        .x_labels(0)
        .y_labels(6)
        .y_label_formatter(&whole)
        .draw()?;
    c.draw_series(bands.iter().map(|&(lo, hi, _, name)| {
        Text::new(
            name,
            (t_max * 0.995, (lo + hi) / 2.0),
            ("sans-serif", 14)
                .into_font()
                .color(&RGBColor(90, 90, 90))
                .pos(plotters::style::text_anchor::Pos::new(
                    plotters::style::text_anchor::HPos::Right,
                    plotters::style::text_anchor::VPos::Center,
                )),
        )
    }))?;
    line(
        &mut c,
        rows.iter().map(|r| (r.t, r.back_pressured_ms.min(1000.0))),
        RGBColor(150, 20, 20),
        2,
        "producer: backPressuredTimeMsPerSecond",
    )?;
    legend(&mut c, SeriesLabelPosition::UpperLeft)?;

    // The pools.
    let mut c = ChartBuilder::on(&bottom)
        .margin_left(12)
        .margin_right(24)
        .margin_bottom(8)
        .x_label_area_size(40)
        .y_label_area_size(64)
        // Up to 1, and room above for the legend.
        .build_cartesian_2d(0f64..t_max, 0f64..1.75f64)?;
    shade_phases(&mut c, plan, 1.75)?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_desc("time (s)")
        .y_desc("pool usage")
        .y_labels(6)
        .x_label_formatter(&whole)
        .light_line_style(TRANSPARENT)
        .bold_line_style(RGBColor(210, 210, 210))
        .draw()?;
    line(
        &mut c,
        rows.iter().map(|r| (r.t, r.out_pool)),
        producer_color,
        7,
        "outPoolUsage (producer: segments not free)",
    )?;
    line(
        &mut c,
        rows.iter().map(|r| (r.t, r.in_pool)),
        consumer_color,
        2,
        "inPoolUsage (consumer: segments queued or held)",
    )?;
    legend(&mut c, SeriesLabelPosition::UpperLeft)?;
    root.present()?;
    Ok(())
}

/// The chart of one panel: time on x, a linear y.
type Panel<'a, 'b> = plotters::chart::ChartContext<
    'a,
    plotters::backend::SVGBackend<'b>,
    plotters::coord::cartesian::Cartesian2d<
        plotters::coord::types::RangedCoordf64,
        plotters::coord::types::RangedCoordf64,
    >,
>;

/// Every other phase shaded, from 0 to `top` on the panel's y axis.
fn shade_phases(
    c: &mut Panel<'_, '_>,
    plan: &Plan,
    top: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let phase_s = plan.phase_ns as f64 / 1e9;
    c.draw_series((0..plan.phases.len()).map(|i| {
        let fill = if i.is_multiple_of(2) {
            RGBColor(232, 237, 245).filled()
        } else {
            WHITE.filled()
        };
        Rectangle::new(
            [(i as f64 * phase_s, 0.0), ((i + 1) as f64 * phase_s, top)],
            fill,
        )
    }))?;
    Ok(())
}

/// A labelled line of `width` pixels in `color`.
fn line(
    c: &mut Panel<'_, '_>,
    points: impl IntoIterator<Item = (f64, f64)>,
    color: plotters::style::RGBColor,
    width: u32,
    label: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    c.draw_series(LineSeries::new(points, color.stroke_width(width)))?
        .label(label)
        .legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(width))
        });
    Ok(())
}

/// The panel's legend, in the picture's one style.
fn legend<'a, 'b: 'a>(
    c: &mut Panel<'a, 'b>,
    position: plotters::chart::SeriesLabelPosition,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    c.configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.92))
        .border_style(RGBColor(180, 180, 180))
        .label_font(("sans-serif", 14))
        .draw()?;
    Ok(())
}

/// A step line through each phase's value of `f`.
fn step_points(plan: &Plan, f: impl Fn(&Phase) -> f64) -> Vec<(f64, f64)> {
    let phase_s = plan.phase_ns as f64 / 1e9;
    plan.phases
        .iter()
        .enumerate()
        .flat_map(|(i, p)| {
            let v = f(p);
            [(i as f64 * phase_s, v), ((i + 1) as f64 * phase_s, v)]
        })
        .collect()
}
