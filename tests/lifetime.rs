//! What a send promises across real processes: every record whose `send` returned `Ok` and
//! that was published reaches a consumer that opens the name later, or a call on one of the
//! two ends says it did not. And a dead end is never taken for a live one at open: an end
//! attached by a SIGKILLed process is `OpenError::Stale` naming it.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use shmflow::monitor::{list_regions, remove_if_stale, remove_stale_and_unread};
use shmflow::{
    CloseError, Consumer, End, Gate, GateGeometry, Geometry, OpenError, Producer, RecvError,
};

const RECORDS: u64 = 10;

/// Runs `test` of this binary again as a child playing `role` with `NAME` set, its stdout
/// piped (a child says "ready" when it has attached).
fn child(test: &str, role: &str, name: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env("NAME", name)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawning a child test process")
}

/// Waits for the child's "ready" line.
fn wait_ready(c: &mut Child) -> BufReader<std::process::ChildStdout> {
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("ready") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the child exited early"
        );
    }
    out
}

fn kill(mut c: Child) -> u32 {
    let pid = c.id();
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    c.wait().unwrap();
    pid
}

fn name_exists(name: &str) -> bool {
    std::path::Path::new(&format!("/dev/shm{name}")).exists()
}

/// Reads every record in order (record i is `i` as 8 bytes) until `Ok(None)`.
fn read_all(c: &mut Consumer) -> Result<u64, RecvError> {
    let mut n = 0u64;
    while let Some(r) = c.recv()? {
        assert_eq!(r.as_bytes(), Some(&n.to_le_bytes()[..]), "record {n}");
        n += 1;
    }
    Ok(n)
}

/// The producer child: creates the named channel, sends `RECORDS` records, then ends as
/// `how` says.
fn producer_child(how: &str) -> ! {
    let name = std::env::var("NAME").unwrap();
    let mut p = Producer::create(&name, Geometry::default()).unwrap();
    for i in 0..RECORDS {
        p.send(&i.to_le_bytes()).unwrap();
    }
    p.flush().unwrap();
    println!("ready");
    match how {
        // Dropped: the stream ends cleanly.
        "drop" => drop(p),
        // Gone without dropping: published records stay, the consumer learns of the death.
        "exit" => {
            std::mem::forget(p);
            std::process::exit(0)
        }
        // Waits for the reader; exit code 0 only if everything was read.
        "close" => {
            let r = p.close_timeout(Duration::from_secs(30));
            println!("close: {r:?}");
            std::process::exit(if r.is_ok() { 0 } else { 1 })
        }
        // Nobody comes: the close says so.
        "close-alone" => match p.close_timeout(Duration::from_millis(300)) {
            Err(CloseError::NotOpened {
                unread_segments, ..
            }) if unread_segments > 0 => std::process::exit(0),
            other => {
                println!("close: {other:?}");
                std::process::exit(1)
            }
        },
        other => panic!("unknown ending {other}"),
    }
    std::process::exit(0)
}

#[test]
fn a_writer_that_exits_before_its_reader_opens_loses_nothing() {
    const T: &str = "a_writer_that_exits_before_its_reader_opens_loses_nothing";
    if role().is_some() {
        producer_child("drop");
    }
    for trial in 0..5 {
        let name = unique_name(&format!("early{trial}"));
        let mut w = child(T, "producer", &name);
        assert!(w.wait().unwrap().success());
        assert!(name_exists(&name), "the name stays for the reader");
        let listed = list_regions().unwrap();
        let r = listed.iter().find(|r| r.name == name).expect("listed");
        assert!(r.awaits_consumer(), "listed as ended with records unread");
        assert_eq!(r.unread_records(), RECORDS);
        assert!(
            !remove_if_stale(&name).unwrap(),
            "clean keeps a stream nobody has read"
        );
        let mut c = Consumer::open(&name).unwrap();
        assert_eq!(read_all(&mut c).unwrap(), RECORDS);
        drop(c);
        assert!(
            !name_exists(&name),
            "the reader removes the name as it leaves"
        );
    }
}

/// The writer child of the pool-size test: `N` records of `LEN` bytes, each with `try_send`
/// (a full pool is an error, never a wait), into a pool sized by `Geometry::for_records`
/// (or one segment less with `SMALLER`), then it exits.
fn sized_writer_child() -> ! {
    let name = std::env::var("NAME").unwrap();
    let n: u64 = std::env::var("N").unwrap().parse().unwrap();
    let len: usize = std::env::var("LEN").unwrap().parse().unwrap();
    let mut g = Geometry::for_records(n, len).unwrap();
    if std::env::var_os("SMALLER").is_some() {
        g.segment_count -= 1;
    }
    let mut p = Producer::create(&name, g).unwrap();
    let mut record = vec![0u8; len];
    for i in 0..n {
        record[..8].copy_from_slice(&i.to_le_bytes());
        if let Err(e) = p.try_send(&record) {
            println!("record {i}: {e}");
            std::process::exit(3);
        }
    }
    drop(p);
    std::process::exit(0)
}

#[test]
fn a_pool_sized_for_the_output_lets_the_writer_end_before_its_reader_opens() {
    const T: &str = "a_pool_sized_for_the_output_lets_the_writer_end_before_its_reader_opens";
    if role().is_some() {
        sized_writer_child();
    }
    // Whole records several to a segment, one to a segment, and records that span segments.
    for (n, len, tight) in [
        (5_000u64, 100usize, true),
        (40, 20_000, true),
        (6, 100_000, false),
    ] {
        let run = |smaller: bool| {
            let name = unique_name(&format!("sized{n}x{len}{smaller}"));
            let mut c = Command::new(std::env::current_exe().unwrap());
            c.args(["--exact", T, "--nocapture", "--test-threads=1"])
                .env(ROLE, "writer")
                .env("NAME", &name)
                .env("N", n.to_string())
                .env("LEN", len.to_string());
            if smaller {
                c.env("SMALLER", "1");
            }
            let code = c.status().unwrap().code();
            (name, code)
        };
        let (name, code) = run(false);
        assert_eq!(code, Some(0), "{n} × {len} B: the writer filled the pool");
        let mut rx = Consumer::open(&name).unwrap();
        let mut k = 0u64;
        while let Some(r) = rx.recv().unwrap() {
            let b = r.to_vec().unwrap();
            assert_eq!((b.len(), &b[..8]), (len, &k.to_le_bytes()[..]));
            k += 1;
        }
        assert_eq!(k, n, "{n} × {len} B");
        if tight {
            // The figure is exact for records that do not span: a segment less is too small.
            let (name, code) = run(true);
            assert_eq!(code, Some(3), "{n} × {len} B in one segment less");
            remove_stale_and_unread(&name).unwrap();
        }
    }
}

#[test]
fn a_writer_that_dies_before_its_reader_opens_leaves_its_records_then_peer_dead() {
    const T: &str = "a_writer_that_dies_before_its_reader_opens_leaves_its_records_then_peer_dead";
    if role().is_some() {
        producer_child("exit");
    }
    let name = unique_name("early-exit");
    let mut w = child(T, "producer", &name);
    assert!(w.wait().unwrap().success());
    let mut c = Consumer::open(&name).unwrap();
    let mut n = 0u64;
    let end = loop {
        match c.recv() {
            Ok(Some(r)) => {
                assert_eq!(r.as_bytes(), Some(&n.to_le_bytes()[..]));
                n += 1;
            }
            other => break other.map(|r| r.is_some()),
        }
    };
    assert_eq!(n, RECORDS, "every published record arrives");
    assert!(
        matches!(end, Err(RecvError::PeerDead(ref e)) if e.end() == End::Producer),
        "then the death is told: {end:?}"
    );
    drop(c);
    assert!(
        !name_exists(&name),
        "the reader removes the name as it leaves"
    );
}

#[test]
fn a_writer_that_closes_and_waits_returns_once_everything_was_read() {
    const T: &str = "a_writer_that_closes_and_waits_returns_once_everything_was_read";
    if role().is_some() {
        producer_child("close");
    }
    let name = unique_name("close-wait");
    let mut w = child(T, "producer", &name);
    let _out = wait_ready(&mut w);
    // The writer is waiting in close: let it wait a little before the reader comes.
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        w.try_wait().unwrap().is_none(),
        "close returned before anything was read"
    );
    let mut c = Consumer::open(&name).unwrap();
    assert_eq!(read_all(&mut c).unwrap(), RECORDS);
    assert!(
        w.wait().unwrap().success(),
        "close reports that everything was read"
    );
}

#[test]
fn a_writer_whose_reader_never_comes_is_told_and_the_name_is_left_for_clean() {
    const T: &str = "a_writer_whose_reader_never_comes_is_told_and_the_name_is_left_for_clean";
    if role().is_some() {
        producer_child("close-alone");
    }
    let name = unique_name("never");
    let mut w = child(T, "producer", &name);
    assert!(
        w.wait().unwrap().success(),
        "close_timeout said NotOpened with segments unread"
    );
    assert!(name_exists(&name));
    let e = Producer::create(&name, Geometry::default()).err().unwrap();
    assert!(
        matches!(
            e,
            OpenError::AwaitsConsumer {
                unread_records: RECORDS,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("shmflow clean --unread"), "{e}");
    assert!(!remove_if_stale(&name).unwrap());
    assert!(remove_stale_and_unread(&name).unwrap());
    assert!(!name_exists(&name));
}

#[test]
fn close_reports_a_reader_that_dies_or_leaves_with_records_unread() {
    const T: &str = "close_reports_a_reader_that_dies_or_leaves_with_records_unread";
    if let Some(r) = role() {
        let name = std::env::var("NAME").unwrap();
        let mut c = Consumer::open(&name).unwrap();
        let first = c.recv().unwrap().unwrap().to_vec().unwrap();
        assert_eq!(first[..8], 0u64.to_le_bytes());
        println!("ready");
        if r == "leave" {
            drop(c);
            std::process::exit(0);
        }
        std::thread::sleep(Duration::from_secs(60));
        std::process::exit(3);
    }
    // Records for several segments (about 6 of the 8): a reader that stops after the first
    // record leaves the rest.
    let g = Geometry {
        segment_size: 4096,
        segment_count: 8,
    };
    for how in ["die", "leave"] {
        let name = unique_name(&format!("close-{how}"));
        let mut p = Producer::create(&name, g).unwrap();
        for i in 0..200u64 {
            let mut rec = i.to_le_bytes().to_vec();
            rec.resize(100, 0);
            p.send(&rec).unwrap();
        }
        let mut r = child(T, how, &name);
        let _out = wait_ready(&mut r);
        if how == "die" {
            kill(r);
        } else {
            assert!(r.wait().unwrap().success());
        }
        let e = p.close_timeout(Duration::from_secs(30)).unwrap_err();
        match how {
            "die" => assert!(
                matches!(e, CloseError::PeerDead(ref d) if d.end() == End::Consumer),
                "{e}"
            ),
            _ => assert!(
                matches!(e, CloseError::Closed { unread_segments, .. } if unread_segments > 1),
                "{e}"
            ),
        }
        assert!(
            !name_exists(&name),
            "the producer removes the name once a reader came"
        );
    }
}

#[test]
fn close_waits_for_a_reader_in_this_process_and_for_one_that_read_every_record() {
    let (mut p, mut c) = shmflow::pair(Geometry::default()).unwrap();
    for i in 0..RECORDS {
        p.send(&i.to_le_bytes()).unwrap();
    }
    // A reader that counts the records it expects and leaves without seeing end of stream.
    let reader = std::thread::spawn(move || {
        for i in 0..RECORDS {
            assert_eq!(
                c.recv().unwrap().unwrap().as_bytes(),
                Some(&i.to_le_bytes()[..])
            );
        }
        drop(c);
    });
    p.close_timeout(Duration::from_secs(30)).unwrap();
    reader.join().unwrap();
    // A reader that is attached but too slow: Timeout, and it goes on reading.
    let (mut p, mut c) = shmflow::pair(Geometry::default()).unwrap();
    p.send(b"unread").unwrap();
    let e = p.close_timeout(Duration::from_millis(50)).unwrap_err();
    assert!(
        matches!(
            e,
            CloseError::Timeout {
                unread_segments: 1,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(c.recv().unwrap().unwrap().as_bytes(), Some(&b"unread"[..]));
    assert!(c.recv().unwrap().is_none());
}

/// A child that attaches as `role` to the named channel or gate and sleeps until killed.
fn attached_child() -> ! {
    let name = std::env::var("NAME").unwrap();
    let keep: Box<dyn std::any::Any> = match role().unwrap().as_str() {
        "consumer" => Box::new(Consumer::open(&name).unwrap()),
        "producer" => Box::new(Producer::open(&name).unwrap()),
        "channel1" => Box::new(Producer::open_channel(&name, 1).unwrap()),
        other => panic!("unknown role {other}"),
    };
    println!("ready");
    std::thread::sleep(Duration::from_secs(60));
    drop(keep);
    std::process::exit(3)
}

/// Runs `test` again as a child that attaches as `role` to `name`, then SIGKILLs it once it
/// has attached: its pid.
fn attach_and_kill(test: &str, role: &str, name: &str) -> u32 {
    let mut c = child(test, role, name);
    let _out = wait_ready(&mut c);
    kill(c)
}

fn assert_stale(e: OpenError, end: End, pid: u32, channel: Option<u32>) {
    match &e {
        OpenError::Stale { dead: Some(d), .. } => {
            assert_eq!((d.end, d.pid, d.channel), (end, pid, channel), "{e}");
        }
        _ => panic!("expected Stale naming the dead {end}, got {e:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("pid {pid}")) && msg.contains("shmflow clean"),
        "the message names the pid and the command: {msg}"
    );
}

#[test]
fn an_end_left_by_a_killed_consumer_is_stale_at_open_not_attached() {
    const T: &str = "an_end_left_by_a_killed_consumer_is_stale_at_open_not_attached";
    if role().is_some() {
        attached_child();
    }
    let name = unique_name("dead-consumer");
    let _p = Producer::create(&name, Geometry::default()).unwrap();
    let pid = attach_and_kill(T, "consumer", &name);
    assert_stale(Consumer::open(&name).unwrap_err(), End::Consumer, pid, None);
    let again = Consumer::builder().open_or_create(&name).unwrap_err();
    assert_stale(again, End::Consumer, pid, None);
}

#[test]
fn an_end_left_by_a_killed_producer_is_stale_at_open_not_attached() {
    const T: &str = "an_end_left_by_a_killed_producer_is_stale_at_open_not_attached";
    if role().is_some() {
        attached_child();
    }
    let name = unique_name("dead-producer");
    let _c = Consumer::create(&name, Geometry::default()).unwrap();
    let pid = attach_and_kill(T, "producer", &name);
    assert_stale(Producer::open(&name).unwrap_err(), End::Producer, pid, None);
    let again = Producer::builder().open_or_create(&name).unwrap_err();
    assert_stale(again, End::Producer, pid, None);
}

#[test]
fn a_gate_channel_left_by_a_killed_producer_is_stale_at_open_not_attached() {
    const T: &str = "a_gate_channel_left_by_a_killed_producer_is_stale_at_open_not_attached";
    if role().is_some() {
        attached_child();
    }
    let name = unique_name("dead-channel");
    let _g = Gate::create(&name, GateGeometry::new(3)).unwrap();
    let pid = attach_and_kill(T, "channel1", &name);
    assert_stale(
        Producer::open_channel(&name, 1).unwrap_err(),
        End::Producer,
        pid,
        Some(1),
    );
    // The other channels are untouched.
    let _ok = Producer::open_channel(&name, 2).unwrap();
}
