//! What surrounds a region is untrusted too: names that are not shared-memory objects, and
//! descriptors that are not shmflow regions. Each is refused at once with a typed error, and
//! nothing shmflow does not own is changed or closed.

mod common;

use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::mpsc;
use std::time::Duration;

use common::unique_name;
use shmflow::monitor::Monitor;
use shmflow::{Consumer, Gate, GateGeometry, Geometry, OpenError, Producer};

/// Runs `f` on a thread and fails the test if it has not returned within `bound`: an entry
/// point that blocks on what it opens would hang here instead of failing.
fn bounded<T: Send + 'static>(
    what: &str,
    bound: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(bound)
        .unwrap_or_else(|_| panic!("{what} did not return within {bound:?}"))
}

fn path(name: &str) -> String {
    format!("/dev/shm{name}")
}

/// Makes `name` a FIFO, a socket, a directory, a device node or a symbolic link.
fn make(kind: &str, name: &str) -> Option<Box<dyn std::any::Any + Send>> {
    let p = path(name);
    let c = std::ffi::CString::new(p.clone()).unwrap();
    match kind {
        "fifo" => {
            // SAFETY: mkfifo(3) with a valid path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            None
        }
        "socket" => Some(Box::new(UnixListener::bind(&p).unwrap())),
        "directory" => {
            std::fs::create_dir(&p).unwrap();
            None
        }
        "device" => {
            let dev = libc::makedev(1, 3);
            // SAFETY: mknod(2) of /dev/null's numbers (1, 3) at a valid path; needs root.
            let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, dev) };
            assert_eq!(r, 0, "mknod: {}", std::io::Error::last_os_error());
            None
        }
        "symlink" => {
            std::os::unix::fs::symlink("/dev/null", &p).unwrap();
            None
        }
        _ => unreachable!(),
    }
}

fn remove(kind: &str, name: &str) {
    let p = path(name);
    let _ = if kind == "directory" {
        std::fs::remove_dir(&p)
    } else {
        std::fs::remove_file(&p)
    };
}

#[test]
fn names_that_are_not_regions_are_refused_at_once_by_every_entry_point() {
    for kind in ["fifo", "socket", "directory", "symlink"] {
        refused_at_once(kind);
    }
}

#[test]
#[ignore = "needs root (mknod of a device node): CI runs it as root"]
fn a_device_node_is_refused_at_once_by_every_entry_point() {
    common::require_root("mknod of a device node");
    refused_at_once("device");
}

/// Puts a `kind` at a name and checks that every entry point refuses it at once.
fn refused_at_once(kind: &str) {
    {
        let name = unique_name(&format!("foreign-{kind}"));
        let keep = make(kind, &name);
        let bound = Duration::from_secs(10);
        let n = name.clone();
        let opens = bounded(&format!("opening {kind}"), bound, move || {
            vec![
                ("Producer::open", Producer::open(&n).err()),
                ("Consumer::open", Consumer::open(&n).err()),
                (
                    "Producer::open_channel",
                    Producer::open_channel(&n, 0).err(),
                ),
                ("Monitor::open", Monitor::open(&n).err()),
                (
                    "GateMonitor::open",
                    shmflow::monitor::GateMonitor::open(&n).err(),
                ),
            ]
        });
        for (what, e) in opens {
            match e {
                Some(OpenError::NotARegion { found, .. }) => {
                    assert!(!found.is_empty(), "{what} on a {kind}")
                }
                other => panic!("{what} on a {kind}: expected NotARegion, got {other:?}"),
            }
        }
        let n = name.clone();
        let creates = bounded(&format!("creating over {kind}"), bound, move || {
            vec![
                Producer::create(&n, Geometry::default()).err(),
                Consumer::create(&n, Geometry::default()).err(),
                Gate::create(&n, GateGeometry::new(2)).err(),
            ]
        });
        for e in creates {
            assert!(
                matches!(e, Some(OpenError::AlreadyExists { .. })),
                "create over a {kind}: {e:?}"
            );
        }
        let n = name.clone();
        let removed = bounded("remove_if_stale", bound, move || {
            shmflow::monitor::remove_if_stale(&n)
        });
        assert!(
            matches!(removed, Err(OpenError::NotARegion { .. })),
            "remove_if_stale on a {kind}: {removed:?}"
        );
        bounded("list_regions", bound, || {
            shmflow::monitor::list_regions().unwrap()
        });
        bounded("list_gates", bound, || {
            shmflow::monitor::list_gates().unwrap()
        });
        assert!(
            std::fs::symlink_metadata(path(&name)).is_ok(),
            "the {kind} is left alone"
        );
        drop(keep);
        remove(kind, &name);
    }
}

#[test]
fn dot_names_are_refused() {
    for name in ["/.", "/.."] {
        assert!(matches!(
            Producer::create(name, Geometry::default()),
            Err(OpenError::InvalidConfig(_))
        ));
        assert!(matches!(
            Consumer::open(name),
            Err(OpenError::InvalidConfig(_))
        ));
    }
}

/// True if `fd` is still open in this process.
fn is_open(fd: i32) -> bool {
    // SAFETY: F_GETFD only asks whether `fd` is open.
    unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
}

#[test]
fn descriptors_that_are_not_regions_are_refused_and_left_open() {
    let file = tempfile_in_dev_shm();
    let (sock, mut peer) = UnixStream::pair().unwrap();
    let (_gate, handles) = Gate::create_anonymous(GateGeometry::new(2)).unwrap();
    let gate_fd = handles[0].as_fd().as_raw_fd();
    let cases: Vec<(&str, i32, String)> = vec![
        ("stdin", 0, "0".into()),
        ("stderr", 2, "2".into()),
        (
            "a regular file",
            file.as_raw_fd(),
            file.as_raw_fd().to_string(),
        ),
        ("a socket", sock.as_raw_fd(), sock.as_raw_fd().to_string()),
        ("a gate's handle", gate_fd, format!("{gate_fd}")),
    ];
    for (what, fd, value) in &cases {
        let var = format!("SHMFLOW_TEST_FOREIGN_{}", fd);
        std::env::set_var(&var, value);
        let c = Consumer::from_env(&var);
        assert!(c.is_err(), "Consumer::from_env on {what} succeeded");
        let p = Producer::from_env(&var);
        assert!(p.is_err(), "Producer::from_env on {what} succeeded");
        if *fd >= 0 {
            assert!(is_open(*fd), "{what} was closed by a failed from_env");
        }
        std::env::remove_var(&var);
    }
    // The gate's handle is refused as a channel, by number and as a borrowed descriptor.
    assert!(matches!(
        Consumer::from_fd(handles[0].as_fd()),
        Err(OpenError::BadMagic { .. })
    ));
    // Closed and negative numbers.
    for value in ["-1", "987654"] {
        std::env::set_var("SHMFLOW_TEST_FOREIGN_BAD", value);
        assert!(matches!(
            Consumer::from_env("SHMFLOW_TEST_FOREIGN_BAD"),
            Err(OpenError::InvalidConfig(_))
        ));
    }
    // Still usable: the socket still carries bytes, the file still reads.
    use std::io::{Read, Write};
    (&sock).write_all(b"still here").unwrap();
    let mut buf = [0u8; 10];
    peer.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"still here");
    assert!(is_open(file.as_raw_fd()));
    // A region descriptor this process already owns (a handle's) is not taken by number:
    // taking it would make two owners of one descriptor.
    let (_tx2, own) = Producer::create_anonymous(Geometry::default()).unwrap();
    std::env::set_var(
        "SHMFLOW_TEST_FOREIGN_OWNED",
        own.as_fd().as_raw_fd().to_string(),
    );
    assert!(matches!(
        Consumer::from_env("SHMFLOW_TEST_FOREIGN_OWNED"),
        Err(OpenError::InvalidConfig(_))
    ));
    assert!(is_open(own.as_fd().as_raw_fd()));
    assert!(Consumer::from_fd(&own).is_ok(), "the handle still works");
    // And a borrowed descriptor that is a region is duplicated, not taken.
    let (mut tx, handle) = Producer::create_anonymous(Geometry::default()).unwrap();
    let mut rx = Consumer::from_fd(handle.as_fd()).unwrap();
    assert!(is_open(handle.as_fd().as_raw_fd()), "from_fd borrows");
    tx.send(b"through a duplicate").unwrap();
    tx.flush().unwrap();
    assert_eq!(
        rx.recv().unwrap().unwrap().as_bytes(),
        Some(&b"through a duplicate"[..])
    );
}

fn tempfile_in_dev_shm() -> std::fs::File {
    let p = path(&unique_name("foreign-file"));
    let f = std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    f.set_len(64 * 1024).unwrap();
    std::fs::remove_file(&p).unwrap();
    f
}

#[test]
fn objects_being_created_are_listed_as_such_at_once() {
    // An empty object (a creator between shm_open and ftruncate) and a FIFO.
    let empty = unique_name("foreign-empty");
    let f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(path(&empty))
        .unwrap();
    std::fs::set_permissions(
        path(&empty),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let fifo = unique_name("foreign-listed-fifo");
    make("fifo", &fifo);
    let others = bounded("list_other_objects", Duration::from_secs(10), || {
        shmflow::monitor::list_other_objects().unwrap()
    });
    let find = |n: &str| others.iter().find(|(name, _)| name == n).map(|(_, e)| e);
    assert!(
        matches!(find(&empty), Some(OpenError::SizeMismatch { found: 0, .. })),
        "{:?}",
        find(&empty)
    );
    assert!(matches!(find(&fifo), Some(OpenError::NotARegion { .. })));
    // Listing regions does not wait for the empty one's creator either.
    let regions = bounded("list_regions", Duration::from_secs(10), || {
        shmflow::monitor::list_regions().unwrap()
    });
    assert!(regions.iter().all(|r| r.name != empty));
    drop(f);
    remove("file", &empty);
    remove("fifo", &fifo);
}

#[test]
fn a_descriptor_its_creator_could_still_shrink_is_refused() {
    use std::os::fd::FromRawFd;
    // A real region's bytes, copied into a memfd that is not sealed: its magic and header are
    // right, but its creator could truncate it under this end (SIGBUS).
    let image = common::region_image();
    // SAFETY: memfd_create with a valid name; the descriptor is checked and then owned.
    let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: a fresh descriptor nobody else owns.
    let mut f = unsafe { std::fs::File::from_raw_fd(raw) };
    use std::io::Write;
    f.write_all(&image).unwrap();
    assert!(matches!(
        Consumer::from_fd(&f),
        Err(OpenError::NotARegion { .. })
    ));
    assert!(is_open(f.as_raw_fd()), "left open");
}

/// Doorbells named in a handle's variable must be four distinct Unix datagram sockets handed
/// over with the region; anything else (a file, a stream socket, an eventfd, the region itself,
/// one number twice, too few, a malformed list) is refused and nothing is taken. A gate's
/// channel attached without its doorbells is refused: the gate may sleep on them.
#[test]
fn doorbells_that_are_not_datagram_sockets_are_refused_and_left_open() {
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixDatagram;
    let file = tempfile_in_dev_shm();
    let (sock, _peer) = UnixStream::pair().unwrap();
    let (d0, d1) = UnixDatagram::pair().unwrap();
    let (d2, d3) = UnixDatagram::pair().unwrap();
    let (_tx, handle) = Producer::create_anonymous(Geometry::default()).unwrap();
    let region: OwnedFd = handle.into_fd();
    let event: OwnedFd = nix_eventfd();
    let (r, f, s, e) = (
        region.as_raw_fd(),
        file.as_raw_fd(),
        sock.as_raw_fd(),
        event.as_raw_fd(),
    );
    let [b0, b1, b2, b3] = [&d0, &d1, &d2, &d3].map(|d| d.as_raw_fd());
    let all = [r, f, s, e, b0, b1, b2, b3];
    for fd in all {
        set_cloexec(fd, false);
    }
    for value in [
        format!("{r}/{f},{b1},{b2},{b3}"),
        format!("{r}/{b0},{s},{b2},{b3}"),
        format!("{r}/{b0},{b1},{e},{b3}"),
        format!("{r}/{b0},{b0},{b2},{b3}"),
        format!("{r}/{r},{b1},{b2},{b3}"),
        format!("{r}/{b0},{b1},{b2}"),
        format!("{r}/{b0},{b1},{b2},x"),
    ] {
        std::env::set_var("SHMFLOW_TEST_FOREIGN_BELLS", &value);
        let got = Consumer::from_env("SHMFLOW_TEST_FOREIGN_BELLS");
        assert!(
            matches!(got, Err(OpenError::InvalidConfig(_))),
            "{value}: {:?}",
            got.map(|_| ())
        );
        for fd in all {
            assert!(is_open(fd), "{value}: descriptor {fd} was closed");
        }
    }
    std::env::remove_var("SHMFLOW_TEST_FOREIGN_BELLS");
    // Back to close-on-exec: nothing of this test leaks into other tests' children.
    for fd in all {
        set_cloexec(fd, true);
    }
    // A gate's channel without its doorbells, and a channel number beyond any gate.
    let (_gate, handles) = Gate::create_anonymous(GateGeometry::new(2)).unwrap();
    // Handed over for good, as to a child: the refused attachment closes it.
    let gate = std::os::fd::IntoRawFd::into_raw_fd(handles.into_iter().next().unwrap().into_fd());
    set_cloexec(gate, false);
    std::env::set_var("SHMFLOW_TEST_FOREIGN_GATE", format!("{gate}:4000000000"));
    assert!(matches!(
        Producer::from_env("SHMFLOW_TEST_FOREIGN_GATE"),
        Err(OpenError::InvalidConfig(_))
    ));
    assert!(is_open(gate), "a refused number takes nothing");
    std::env::set_var("SHMFLOW_TEST_FOREIGN_GATE", format!("{gate}:0"));
    let got = Producer::from_env("SHMFLOW_TEST_FOREIGN_GATE");
    std::env::remove_var("SHMFLOW_TEST_FOREIGN_GATE");
    match got {
        Err(OpenError::InvalidConfig(e)) => {
            assert!(e.to_string().contains("doorbells"), "{e}")
        }
        other => panic!("a gate channel without doorbells: {:?}", other.map(|_| ())),
    }
}

/// Sets or clears close-on-exec on `fd` (cleared, as `PeerHandle::pass_to` leaves it in the
/// child).
fn set_cloexec(fd: i32, on: bool) {
    let flags = if on { libc::FD_CLOEXEC } else { 0 };
    // SAFETY: F_SETFD on a descriptor this test owns changes only its close-on-exec flag.
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, flags) }, 0);
}

/// A fresh eventfd.
fn nix_eventfd() -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: eventfd returns a new descriptor that nothing else owns (checked not negative).
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: as above.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
}
