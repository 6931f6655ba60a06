//! A named region whose creator died is stale: creating it again says so and how to clean it;
//! `remove_if_stale` / `shmflow clean` remove it, and never a region with a live end.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use common::*;
use shmflow::monitor::{list_regions, remove_if_stale, Monitor};
use shmflow::{Consumer, End, Geometry, OpenError as Error, Producer};

#[test]
fn a_crashed_creator_leaves_a_stale_region_that_can_be_cleaned() {
    if role().as_deref() == Some("creator") {
        let _p = Producer::create(&std::env::var("NAME").unwrap(), Geometry::default()).unwrap();
        println!("ready");
        std::thread::sleep(std::time::Duration::from_secs(60));
        std::process::exit(3);
    }
    let name = unique_name("stale");
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "a_crashed_creator_leaves_a_stale_region_that_can_be_cleaned",
        "--nocapture",
    ])
    .env(ROLE, "creator")
    .env("NAME", &name)
    .stdout(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    while !line.contains("ready") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "creator exited early"
        );
    }
    // Alive: a second creator is refused as AlreadyExists, and cleaning keeps it.
    assert!(matches!(
        Producer::create(&name, Geometry::default()),
        Err(Error::AlreadyExists { .. })
    ));
    assert!(
        !remove_if_stale(&name).unwrap(),
        "a region with a live end is never removed"
    );
    let m = Monitor::open(&name).unwrap();
    assert!(m.end_alive(End::Producer) && !m.end_alive(End::Consumer));
    drop(m);
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let e = Producer::create(&name, Geometry::default()).err().unwrap();
    assert!(matches!(e, Error::Stale { .. }), "{e}");
    assert!(
        e.to_string().contains("shmflow clean"),
        "the error says how to clean it: {e}"
    );
    let listed = list_regions()
        .unwrap()
        .into_iter()
        .find(|r| r.name == name)
        .expect("listed");
    assert!(
        listed.is_stale() && listed.snapshot.producer_state == shmflow::metrics::EndState::Attached,
        "attached but dead"
    );
    assert!(remove_if_stale(&name).unwrap());
    let _p = Producer::create(&name, Geometry::default()).unwrap();
}

#[test]
fn a_dead_consumer_is_seen_as_dead_not_as_attached() {
    let name = unique_name("deadend");
    let p = Producer::create(&name, Geometry::default()).unwrap();
    let m = Monitor::open(&name).unwrap();
    {
        let _c = Consumer::open(&name).unwrap();
        assert!(m.end_alive(End::Consumer));
    }
    // Dropped cleanly: detached, lock released.
    assert!(!m.end_alive(End::Consumer));
    assert_eq!(
        m.snapshot().consumer_state,
        shmflow::metrics::EndState::Detached
    );
    drop(p);
}

#[test]
fn a_clean_detach_is_seen_even_while_a_forked_child_shares_the_lock() {
    let name = unique_name("forkend");
    let p = Producer::create(&name, Geometry::default()).unwrap();
    let m = Monitor::open(&name).unwrap();
    let c = Consumer::open(&name).unwrap();
    // A child forked while the consumer is attached holds a copy of its lock's descriptor
    // (the way a child spawned by another thread does until it execs).
    // SAFETY: the child only calls async-signal-safe functions and then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: async-signal-safe calls only.
        unsafe {
            libc::sleep(30);
            libc::_exit(0);
        }
    }
    assert!(m.end_alive(End::Consumer));
    drop(c);
    let released = !m.end_alive(End::Consumer);
    // SAFETY: kill(2) and waitpid(2) on our own child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    assert!(
        released,
        "a clean drop releases the lock the child still shares"
    );
    drop(p);
}
