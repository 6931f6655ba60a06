//! `shmflow top` on ratatui's test backend: sorting by backpressure, levels, bars and
//! sparklines, a gate opened to its channels, the filter, the selection following its row.

use super::draw::{bar, shorten_middle, sparkline};
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
    screen_of(top, 200)
}

fn screen_of(top: &mut Top, width: u16) -> String {
    let mut t = Terminal::new(TestBackend::new(width, 14)).unwrap();
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
        (c.backlog, c.floating_held) = (1, held);
        // Three segments queued: published, not yet taken.
        (c.snapshot.segments_committed, c.snapshot.segments_taken) = (5, 2);
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

#[test]
fn narrow_screens_leave_out_columns_and_never_cut_a_figure() {
    use shmflow::metrics::ChannelStats;
    use shmflow::metrics::EndState::Attached;
    // A fast channel with debloating on, and a gate that released checkpoint 41 aligned.
    let fast = |at: u64| {
        let mut s = snap(at, at * 123_456_789, at * 123_456_789, 0, Attached);
        s.bytes_read = at * 98_765_432_100;
        (s.segment_cap, s.segment_fill, s.debloat_target_ns) = (5, 32768, 100_000_000);
        s
    };
    let gate = |at: u64| {
        let mut g = GateSnapshot::default();
        g.at_ns = at * 1_000_000_000;
        (g.exclusive, g.floating) = (2, 8);
        g.consumer_state = Attached;
        let mut c = ChannelStats::default();
        c.snapshot = snap(at, 0, 0, 0, Attached);
        g.channels = vec![c];
        g.checkpoints.last_id = 41;
        g.checkpoints.last_released = Some(shmflow::Released::Aligned);
        g.checkpoints.checkpoint_alignment_time_ns = 2_500_000;
        g
    };
    let mut top = Top::default();
    let name = "/shmflow-pl-wordcount-2d2f41ce-6508x1-count-1";
    for at in [1, 2] {
        top.update(
            vec![(name.into(), fast(at), UP)],
            vec![("/g".into(), gate(at), vec![true], true)],
        );
    }
    let rate = format!(
        "{:.0}",
        top.rows
            .iter()
            .find(|r| r.name == name)
            .unwrap()
            .records_per_s
    );
    assert_eq!(rate, "123456789");
    let wide = screen_of(&mut top, 220);
    assert!(
        wide.contains("#41 2.5 ms A"),
        "the checkpoint column: {wide}"
    );
    assert!(
        wide.contains("cap 5 ≤ 160.0 KiB"),
        "the debloating column: {wide}"
    );
    assert!(
        wide.contains(name),
        "a wide screen shows the whole name: {wide}"
    );
    for width in [60, 80, 100, 132] {
        let s = screen_of(&mut top, width);
        assert!(s.contains(&rate), "{width} columns cut the rate: {s}");
        assert!(s.contains("BP ms/s") && s.contains("LEVEL"), "{width}: {s}");
        for line in s.lines() {
            assert!(line.chars().count() <= width as usize);
        }
        assert!(s.contains("/shmf"), "{width}: the name's start: {s}");
    }
    let s = screen_of(&mut top, 80);
    assert!(
        !s.contains("HISTORY"),
        "the history goes first at 80 columns: {s}"
    );
}

#[test]
fn the_latency_column_shows_the_worst_p99_of_the_last_interval() {
    use shmflow::metrics::EndState::Attached;
    use shmflow::metrics::SourceLatency;
    let source = |name: &str, buckets: Vec<(u64, u64)>, max_ns: u64| {
        let mut l = SourceLatency::default();
        l.source = name.into();
        l.count = buckets.iter().map(|b| b.1).sum();
        l.max = std::time::Duration::from_nanos(max_ns);
        l.buckets = buckets;
        l
    };
    let mut top = Top::default();
    top.latency.insert(
        "/timed".into(),
        vec![source("a", vec![(9_984, 100)], 10_000)],
    );
    top.update(
        vec![
            ("/timed".into(), snap(1, 0, 0, 0, Attached), UP),
            ("/plain".into(), snap(1, 0, 0, 0, Attached), UP),
        ],
        vec![],
    );
    // The next interval: 100 more of source a at about 2 ms; source b comes.
    top.latency.insert(
        "/timed".into(),
        vec![
            source("a", vec![(9_984, 100), (1_998_848, 100)], 2_000_000),
            source("b", vec![(49_920, 5)], 50_000),
        ],
    );
    top.update(
        vec![
            ("/timed".into(), snap(2, 10, 10, 0, Attached), UP),
            ("/plain".into(), snap(2, 10, 10, 0, Attached), UP),
        ],
        vec![],
    );
    let s = screen_of(&mut top, 220);
    assert!(s.contains("LATENCY"), "{s}");
    let timed = s.lines().find(|l| l.contains("/timed")).unwrap();
    assert!(timed.contains("p99 2.0 ms (2 src)"), "{timed}");
    let plain = s.lines().find(|l| l.contains("/plain")).unwrap();
    assert!(!plain.contains("p99"), "{plain}");
    // A third interval with no marker: the figure since the start, said so.
    top.latency.insert(
        "/timed".into(),
        vec![
            source("a", vec![(9_984, 100), (1_998_848, 100)], 2_000_000),
            source("b", vec![(49_920, 5)], 50_000),
        ],
    );
    top.update(
        vec![("/timed".into(), snap(3, 20, 20, 0, Attached), UP)],
        vec![],
    );
    let s = screen_of(&mut top, 220);
    let timed = s.lines().find(|l| l.contains("/timed")).unwrap();
    assert!(timed.contains(" all"), "{timed}");
}
