//! The output of `shmflow demo checkpoints`: each mode's summary (barrier delay and checkpoint
//! duration p50/p99, bytes in flight, throughput) against the expected shape on stdout, and
//! `checkpoints.csv`, `checkpoints-samples.csv`, `checkpoints.json` and `checkpoints.svg`.

use std::fmt::Write as _;

use super::{Args, Checkpoint, Run, Sample};

fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

struct Summary {
    delay_p50: f64,
    delay_p99: f64,
    duration_p50: f64,
    duration_p99: f64,
    in_flight_mib: f64,
    read_mb_s: f64,
    cap: f64,
    counted: usize,
}

fn summarize(args: &Args, r: &Run) -> Summary {
    let steady: Vec<&Checkpoint> = r
        .checkpoints
        .iter()
        .filter(|c| c.sent_s >= args.warmup_secs)
        .collect();
    let d: Vec<f64> = steady.iter().map(|c| c.delay_ms).collect();
    let du: Vec<f64> = steady.iter().map(|c| c.duration_ms).collect();
    let s: Vec<&Sample> = r
        .samples
        .iter()
        .filter(|s| s.t_s >= args.warmup_secs && s.t_s <= args.secs)
        .collect();
    let med =
        |f: &dyn Fn(&Sample) -> f64| quantile(&s.iter().map(|x| f(x)).collect::<Vec<_>>(), 0.5);
    Summary {
        delay_p50: quantile(&d, 0.5),
        delay_p99: quantile(&d, 0.99),
        duration_p50: quantile(&du, 0.5),
        duration_p99: quantile(&du, 0.99),
        in_flight_mib: med(&|x| x.in_flight_bytes as f64 / 1048576.0),
        read_mb_s: med(&|x| x.read_mb_s),
        cap: med(&|x| x.cap as f64),
        counted: steady.len(),
    }
}

pub(super) fn report(args: &Args, runs: &[Run]) -> Result<(), String> {
    let sums: Vec<Summary> = runs.iter().map(|r| summarize(args, r)).collect();
    println!();
    println!(
        "{:<32} {:>5} {:>18} {:>22} {:>14} {:>12} {:>8}",
        "mode (past the warm-up)",
        "ckpts",
        "delay p50/p99 ms",
        "duration p50/p99 ms",
        "in flight MiB",
        "read MB/s",
        "vs first"
    );
    let base = sums[0].read_mb_s;
    for (r, s) in runs.iter().zip(&sums) {
        println!(
            "{:<32} {:>5} {:>8.1} / {:>7.1} {:>10.1} / {:>9.1} {:>14.2} {:>12.2} {:>8.2}",
            r.mode.label(args.target_ms),
            s.counted,
            s.delay_p50,
            s.delay_p99,
            s.duration_p50,
            s.duration_p99,
            s.in_flight_mib,
            s.read_mb_s,
            s.read_mb_s / base
        );
    }
    let pool = (args.segments / args.channels * args.channels) as f64 * args.segment_size as f64;
    let expected_aligned = pool / (args.rate_mb * 1e6) * 1e3;
    let (a, d, u) = (&sums[0], &sums[1], &sums[2]);
    let goals = [
        (
            format!(
                "aligned delay p50 {:.0} ms is about pool / rate = {expected_aligned:.0} ms (within 30 %)",
                a.delay_p50
            ),
            (a.delay_p50 / expected_aligned - 1.0).abs() <= 0.3,
        ),
        (
            format!(
                "debloated delay p50 {:.0} ms is close to the {} ms target (within 2×)",
                d.delay_p50, args.target_ms
            ),
            d.delay_p50 <= 2.0 * args.target_ms as f64,
        ),
        (
            format!(
                "debloated throughput {:.2}× the aligned run's (at least 0.9×)",
                d.read_mb_s / a.read_mb_s
            ),
            d.read_mb_s >= 0.9 * a.read_mb_s,
        ),
        (
            format!(
                "unaligned delay p50 {:.1} ms is below the debloated one",
                u.delay_p50
            ),
            u.delay_p50 < d.delay_p50,
        ),
    ];
    println!();
    for (text, ok) in &goals {
        println!("  [{}] {text}", if *ok { "met" } else { "NOT MET" });
    }

    // CSVs and the JSON summary.
    let mut csv = String::from("mode,id,sent_s,delay_ms,duration_ms,released\n");
    let mut samples = String::from("mode,t_s,in_flight_bytes,read_mb_s,segment_cap\n");
    for r in runs {
        for c in &r.checkpoints {
            let _ = writeln!(
                csv,
                "{},{},{:.3},{:.3},{:.3},{}",
                r.mode.key(),
                c.id,
                c.sent_s,
                c.delay_ms,
                c.duration_ms,
                if c.unaligned { "unaligned" } else { "aligned" }
            );
        }
        for s in &r.samples {
            let _ = writeln!(
                samples,
                "{},{:.2},{},{:.3},{}",
                r.mode.key(),
                s.t_s,
                s.in_flight_bytes,
                s.read_mb_s,
                s.cap
            );
        }
    }
    let write = |file: &str, text: &str| {
        let path = args.out.join(file);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
    };
    write("checkpoints.csv", &csv)?;
    write("checkpoints-samples.csv", &samples)?;
    let json = serde_json::json!({
        "channels": args.channels,
        "segments": args.segments,
        "segment_size": args.segment_size,
        "rate_mb_s": args.rate_mb,
        "target_ms": args.target_ms,
        "interval_ms": args.interval_ms,
        "secs_per_mode": args.secs,
        "warmup_secs": args.warmup_secs,
        "expected_aligned_ms": expected_aligned,
        "modes": runs.iter().zip(&sums).map(|(r, s)| serde_json::json!({
            "mode": r.mode.key(),
            "checkpoints": s.counted,
            "delay_ms_p50": s.delay_p50,
            "delay_ms_p99": s.delay_p99,
            "duration_ms_p50": s.duration_p50,
            "duration_ms_p99": s.duration_p99,
            "in_flight_mib_median": s.in_flight_mib,
            "read_mb_s_median": s.read_mb_s,
            "segment_cap_median": s.cap,
        })).collect::<Vec<_>>(),
        "goals": goals.iter().map(|(t, ok)| serde_json::json!({"goal": t, "met": ok})).collect::<Vec<_>>(),
    });
    write("checkpoints.json", &format!("{json:#}\n"))?;
    let svg = args.out.join("checkpoints.svg");
    plot(args, runs, expected_aligned, &svg).map_err(|e| format!("{}: {e}", svg.display()))?;
    println!(
        "\nwrote checkpoints.csv, checkpoints-samples.csv, checkpoints.json and checkpoints.svg in {}",
        args.out.display()
    );
    Ok(())
}

/// Three panels on one time axis, one shaded phase per mode: each checkpoint's barrier delay
/// (log scale, with the expected aligned delay and the target), the bytes in flight, and the
/// throughput read.
fn plot(
    args: &Args,
    runs: &[Run],
    expected_aligned: f64,
    path: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1200, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "Checkpoint barriers under backpressure: {} x {} KiB segments read at {} MB/s, a barrier every {} ms",
        args.segments,
        args.segment_size / 1024,
        args.rate_mb,
        args.interval_ms
    );
    let root = root.titled(&title, ("sans-serif", 20))?;
    let (top, rest) = root.split_vertically(430);
    let (mid, bottom) = rest.split_vertically(220);
    let phase = args.secs;
    let t_max = phase * runs.len() as f64;
    let colors = [mode_color(0), mode_color(1), mode_color(2)];
    let x_of = |i: usize, t: f64| i as f64 * phase + t.clamp(0.0, phase);

    // Barrier delay, log scale from 0.01 ms to past the slowest.
    let worst = runs
        .iter()
        .flat_map(|r| r.checkpoints.iter().map(|c| c.delay_ms))
        .fold(expected_aligned, f64::max);
    let y_max = worst * 2.0;
    let mut c = ChartBuilder::on(&top)
        .margin_left(12)
        .margin_right(24)
        .margin_top(8)
        .x_label_area_size(10)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..t_max, (0.01f64..y_max).log_scale())?;
    c.draw_series((0..runs.len()).map(|i| {
        Rectangle::new(
            [(i as f64 * phase, 0.01), ((i + 1) as f64 * phase, y_max)],
            phase_shade(i).filled(),
        )
    }))?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("barrier delay, ms (log scale)")
        .y_label_formatter(&|v| {
            if *v >= 1.0 {
                format!("{v:.0}")
            } else if *v >= 0.1 {
                format!("{v:.1}")
            } else {
                format!("{v:.2}")
            }
        })
        .light_line_style(TRANSPARENT)
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()?;
    let center = plotters::style::text_anchor::Pos::new(
        plotters::style::text_anchor::HPos::Center,
        plotters::style::text_anchor::VPos::Top,
    );
    for (i, r) in runs.iter().enumerate() {
        c.draw_series([Text::new(
            format!("phase {}: {}", i + 1, r.mode.label(args.target_ms)),
            ((i as f64 + 0.5) * phase, y_max * 0.8),
            ("sans-serif", 16)
                .into_font()
                .style(FontStyle::Bold)
                .color(&colors[i])
                .pos(center),
        )])?;
        // The warm-up, not counted, is hatched off by a lighter marker.
        c.draw_series(r.checkpoints.iter().map(|k| {
            let style = if k.sent_s >= args.warmup_secs {
                colors[i].filled()
            } else {
                colors[i].mix(0.3).filled()
            };
            Circle::new((x_of(i, k.sent_s), k.delay_ms.max(0.011)), 4, style)
        }))?
        .label(format!(
            "{}: barrier delay (pale: warm-up)",
            r.mode.label(args.target_ms)
        ))
        .legend(move |(x, y)| Circle::new((x + 10, y), 4, colors[i].filled()));
        // A checkpoint that lasts longer than its barrier's delay (unaligned: until its
        // in-flight data is read) also shows its duration, as a ring.
        let longer: Vec<&Checkpoint> = r
            .checkpoints
            .iter()
            .filter(|k| k.duration_ms > 2.0 * k.delay_ms.max(0.01))
            .collect();
        if !longer.is_empty() {
            c.draw_series(longer.iter().map(|k| {
                Circle::new(
                    (x_of(i, k.sent_s), k.duration_ms),
                    6,
                    colors[i].stroke_width(2),
                )
            }))?
            .label(format!(
                "{}: checkpoint duration (in-flight data read)",
                r.mode.label(args.target_ms)
            ))
            .legend(move |(x, y)| Circle::new((x + 10, y), 6, colors[i].stroke_width(2)));
        }
    }
    let dashed = |y: f64| {
        DashedLineSeries::new([(0.0, y), (t_max, y)], 8, 6, BLACK.mix(0.6).stroke_width(1))
    };
    c.draw_series(dashed(expected_aligned))?
        .label(format!("pool / rate = {expected_aligned:.0} ms"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.6)));
    c.draw_series(DashedLineSeries::new(
        [(0.0, args.target_ms as f64), (t_max, args.target_ms as f64)],
        3,
        4,
        RGBColor(20, 110, 60).stroke_width(2),
    ))?
    .label(format!("debloating target {} ms", args.target_ms))
    .legend(|(x, y)| {
        PathElement::new(
            vec![(x, y), (x + 20, y)],
            RGBColor(20, 110, 60).stroke_width(2),
        )
    });
    c.configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.92))
        .border_style(RGBColor(180, 180, 180))
        .label_font(("sans-serif", 14))
        .draw()?;

    // Bytes in flight, and throughput read.
    let mib = |s: &Sample| s.in_flight_bytes as f64 / 1048576.0;
    let mib_max = runs
        .iter()
        .flat_map(|r| r.samples.iter().map(mib))
        .fold(1.0, f64::max);
    samples_panel(
        &mid,
        runs,
        phase,
        mib_max * 1.15,
        "in flight, MiB",
        &mib,
        false,
    )?;
    let mb = |s: &Sample| s.read_mb_s;
    let mb_max = runs
        .iter()
        .flat_map(|r| r.samples.iter().map(mb))
        .fold(args.rate_mb, f64::max);
    samples_panel(&bottom, runs, phase, mb_max * 1.2, "read, MB/s", &mb, true)?;
    root.present()?;
    Ok(())
}

/// The colour of mode `i`'s points and lines.
fn mode_color(i: usize) -> plotters::style::RGBColor {
    use plotters::style::RGBColor;
    [
        RGBColor(200, 60, 40),
        RGBColor(20, 110, 60),
        RGBColor(30, 70, 170),
    ][i % 3]
}

/// The shade of mode `i`'s phase.
fn phase_shade(i: usize) -> plotters::style::RGBColor {
    use plotters::style::RGBColor;
    if i.is_multiple_of(2) {
        RGBColor(236, 240, 247)
    } else {
        RGBColor(250, 250, 250)
    }
}

/// A panel of one figure of the 100 ms samples, one line per mode, each mode a shaded phase of
/// `phase` seconds; `bottom` carries the time axis.
fn samples_panel(
    area: &plotters::drawing::DrawingArea<
        plotters::backend::SVGBackend<'_>,
        plotters::coord::Shift,
    >,
    runs: &[Run],
    phase: f64,
    y_max: f64,
    y_desc: &str,
    value: &dyn Fn(&Sample) -> f64,
    bottom: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let t_max = phase * runs.len() as f64;
    let mut c = ChartBuilder::on(area)
        .margin_left(12)
        .margin_right(24)
        .margin_bottom(if bottom { 8 } else { 0 })
        .x_label_area_size(if bottom { 40 } else { 10 })
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..t_max, 0f64..y_max)?;
    c.draw_series((0..runs.len()).map(|i| {
        Rectangle::new(
            [(i as f64 * phase, 0.0), ((i + 1) as f64 * phase, y_max)],
            phase_shade(i).filled(),
        )
    }))?;
    let formatter = |v: &f64| {
        // A boundary ends one mode and starts the next; the last ends the last.
        let t = if *v >= t_max - 1e-9 { phase } else { v % phase };
        format!("{:.0}", t.round())
    };
    let mut mesh = c.configure_mesh();
    mesh.disable_x_mesh()
        .y_desc(y_desc)
        .light_line_style(TRANSPARENT)
        .bold_line_style(RGBColor(215, 215, 215));
    if bottom {
        mesh.x_desc("seconds (each mode from its own start)")
            .x_labels(t_max as usize + 1)
            .x_label_formatter(&formatter);
    } else {
        mesh.x_labels(0);
    }
    mesh.draw()?;
    for (i, r) in runs.iter().enumerate() {
        c.draw_series(LineSeries::new(
            r.samples
                .iter()
                .filter(|s| s.t_s >= 0.0 && s.t_s <= phase)
                .map(|s| (i as f64 * phase + s.t_s, value(s))),
            mode_color(i).stroke_width(2),
        ))?;
    }
    Ok(())
}
