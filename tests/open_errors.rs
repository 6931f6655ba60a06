//! Opening a region that is not what it should be gives a typed error naming the region and
//! what was found. Named regions live in /dev/shm on Linux, which lets the tests corrupt them.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, PermissionsExt};

use common::{require_root, unique_name};
use shmflow::{Consumer, End, Geometry, OpenError as Error, Producer};

fn dev_shm(name: &str) -> String {
    format!("/dev/shm{name}")
}

fn patch(name: &str, offset: u64, bytes: &[u8]) {
    let f = OpenOptions::new().write(true).open(dev_shm(name)).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

#[test]
fn existing_name_and_missing_name() {
    let name = unique_name("exists");
    let _p = Producer::create(&name, Geometry::default()).unwrap();
    let e = Consumer::create(&name, Geometry::default()).err().unwrap();
    assert!(
        matches!(&e, Error::AlreadyExists { region } if region == &name),
        "{e}"
    );
    assert!(e.to_string().contains(&name));
    let missing = unique_name("missing");
    assert!(
        matches!(Consumer::open(&missing), Err(Error::NotFound { region }) if region == missing)
    );
    assert!(matches!(
        Producer::create("no-slash", Geometry::default()),
        Err(Error::InvalidConfig(c)) if c.field() == "region name"
    ));
}

#[test]
fn not_a_shmflow_region() {
    let name = unique_name("garbage");
    let f = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(dev_shm(&name))
        .unwrap();
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .unwrap();
    f.write_all_at(&[0xAB; 64 * 1024], 0).unwrap();
    let e = Consumer::open(&name).err().unwrap();
    assert!(
        matches!(
            e,
            Error::BadMagic {
                found: 0xABAB_ABAB_ABAB_ABAB,
                ..
            }
        ),
        "{e}"
    );
    std::fs::remove_file(dev_shm(&name)).unwrap();
}

#[test]
fn other_layout_version() {
    let name = unique_name("version");
    let _p = Producer::create(&name, Geometry::default()).unwrap();
    patch(&name, 8, &99u32.to_le_bytes());
    let e = Consumer::open(&name).err().unwrap();
    assert!(
        matches!(
            e,
            Error::VersionMismatch {
                expected: shmflow::LAYOUT_VERSION,
                found: 99,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn size_that_does_not_match_the_geometry() {
    let name = unique_name("size");
    let g = Geometry {
        segment_size: 4096,
        segment_count: 4,
    };
    let _p = Producer::create(&name, g).unwrap();
    let f = OpenOptions::new().write(true).open(dev_shm(&name)).unwrap();
    f.set_len(g.region_size() as u64 + 4096).unwrap(); // grown: the live mapping stays valid
    let e = Consumer::open(&name).err().unwrap();
    assert!(
        matches!(e, Error::SizeMismatch { expected, found, .. } if expected == g.region_size() as u64 && found == expected + 4096),
        "{e}"
    );
}

#[test]
fn geometry_out_of_range_in_the_header() {
    let name = unique_name("geometry");
    let _p = Producer::create(&name, Geometry::default()).unwrap();
    patch(&name, 16, &100u32.to_le_bytes()); // segment_size
    let e = Consumer::open(&name).err().unwrap();
    assert!(
        matches!(
            e,
            Error::Corrupt(ref c) if c.field() == "segment_size" && c.found() == 100
        ),
        "{e}"
    );
}

#[test]
fn each_end_attaches_once() {
    let name = unique_name("attach");
    let _p = Producer::create(&name, Geometry::default()).unwrap();
    let e = Producer::open(&name).err().unwrap();
    assert!(
        matches!(e, Error::AlreadyAttached { end: End::Producer, pid, .. } if pid == std::process::id()),
        "{e}"
    );
    let c = Consumer::open(&name).unwrap();
    assert!(matches!(
        Consumer::open(&name),
        Err(Error::AlreadyAttached {
            end: End::Consumer,
            ..
        })
    ));
    drop(c);
    // The only reader left: the name went with it.
    assert!(matches!(Consumer::open(&name), Err(Error::NotFound { .. })));
    // A producer that ended cannot attach again (its stream waits for its consumer).
    let name = unique_name("attach2");
    let mut p = Producer::create(&name, Geometry::default()).unwrap();
    p.send(b"for the consumer").unwrap();
    drop(p);
    assert!(matches!(
        Producer::open(&name),
        Err(Error::EndDetached {
            end: End::Producer,
            ..
        })
    ));
    let mut c = Consumer::open(&name).unwrap();
    assert!(c.recv().unwrap().is_some() && c.recv().unwrap().is_none());
}

#[test]
fn broader_permissions_are_refused() {
    let name = unique_name("perms");
    let _p = Producer::create(&name, Geometry::default()).unwrap();
    let mode = std::fs::metadata(dev_shm(&name))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "created 0600");
    std::fs::set_permissions(dev_shm(&name), std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = Consumer::open(&name).err().unwrap();
    assert!(matches!(e, Error::BadMode { mode: 0o644, .. }), "{e}");
}

#[test]
fn a_producer_that_ends_after_its_reader_came_removes_the_name() {
    let name = unique_name("unlink");
    let mut p = Producer::create(&name, Geometry::default()).unwrap();
    let mut c = Consumer::open(&name).unwrap();
    p.send(b"last").unwrap();
    drop(p);
    assert!(
        matches!(Consumer::open(&name), Err(Error::NotFound { .. })),
        "name removed with the producer's end: its reader has the region"
    );
    // The reader's mapping outlives the name.
    assert_eq!(c.recv().unwrap().unwrap().as_bytes(), Some(&b"last"[..]));
    assert!(c.recv().unwrap().is_none());
}

#[test]
fn a_consumer_creator_removes_the_name_when_it_leaves() {
    let name = unique_name("unlinkc");
    let c = Consumer::create(&name, Geometry::default()).unwrap();
    let mut p = Producer::open(&name).unwrap();
    drop(c);
    assert!(matches!(Consumer::open(&name), Err(Error::NotFound { .. })));
    let sent = p.send(b"x").and_then(|()| p.flush());
    assert!(
        matches!(sent, Err(shmflow::SendError::Closed(_))),
        "{sent:?}"
    );
}

#[test]
fn invalid_geometry_is_refused_before_anything_is_created() {
    for (s, n, field) in [
        (1000, 4, "segment_size"),
        (4100, 4, "segment_size"),
        (4096, 1, "segment_count"),
        (2 << 30, 2, "segment_size"),
    ] {
        let e = Producer::create_anonymous(Geometry {
            segment_size: s,
            segment_count: n,
        })
        .err()
        .unwrap();
        assert!(
            matches!(e, Error::InvalidConfig(ref c) if c.field() == field),
            "{s}×{n}: {e}"
        );
    }
}

#[test]
#[ignore = "needs root (chown of a region to another user): CI runs it as root"]
fn a_region_of_another_user_is_refused() {
    require_root("chown of a region to another user");
    let name = unique_name("owner");
    let _p = Producer::create(&name, Geometry::default()).unwrap();
    let path = std::ffi::CString::new(dev_shm(&name)).unwrap();
    // SAFETY: chown(2) on a file we created, as root.
    let r = unsafe { libc::chown(path.as_ptr(), 65534, 65534) };
    assert_eq!(r, 0, "chown: {}", std::io::Error::last_os_error());
    let e = Consumer::open(&name).err().unwrap();
    assert!(matches!(e, Error::NotOwner { found: 65534, .. }), "{e}");
}

#[test]
fn an_anonymous_region_cannot_be_resized_by_a_peer() {
    use std::os::fd::AsRawFd;
    let (_p, handle) = Producer::create_anonymous(Geometry::default()).unwrap();
    let fd = handle.into_fd();
    for len in [0i64, 4096, 1 << 30] {
        // SAFETY: ftruncate on a descriptor we own; it must be refused by the seals.
        let r = unsafe { libc::ftruncate(fd.as_raw_fd(), len) };
        assert_eq!(r, -1, "ftruncate({len}) succeeded on a sealed region");
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EPERM)
        );
    }
}
