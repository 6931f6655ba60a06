//! The checkpoint directory: what is in it, and how each file is written and checked.
//!
//! ```text
//! PIPELINE              the pipeline's identity (name, stages, edges): a directory whose
//!                       identity differs belongs to another pipeline and is refused
//! lock                  held (flock) by the running supervisor, with its pid
//! chk-ID/STAGE-I        instance STAGE[I]'s state at checkpoint ID (its acknowledgement)
//! chk-ID/_metadata      written once every instance acknowledged: ID is complete
//! completed             the newest complete checkpoint's id, as text
//! keyed/STAGE-I.redb    instance STAGE[I]'s keyed state
//! metrics               the supervisor's figures, one `name value` a line
//! finished              the pipeline ran to the end of its input
//! ```
//!
//! Every file but `lock` and `metrics` is written atomically: a temporary file in the same
//! directory, synced, renamed over the name, and the directory synced; a name present always
//! holds a whole file. State files and metadata start with a header that carries a CRC-32 of
//! the rest, so a torn or corrupt file is detected, never loaded.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{io, RunError};

const MAGIC: &[u8; 8] = b"SHMFLOWC";
const VERSION: u32 = 1;
const HEADER: usize = 8 + 4 + 4 + 8 + 8 + 4 + 4;

/// Writes `bytes` as `dir/name` atomically (temporary file, sync, rename, directory sync).
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Why a completed checkpoint cannot be used.
#[derive(Debug)]
pub(crate) enum Unusable {
    /// A file is missing, torn, or fails its checks.
    Corrupt(String),
    /// A file could not be read (permissions, descriptors, the device).
    Io(RunError),
}

impl From<String> for Unusable {
    fn from(s: String) -> Self {
        Unusable::Corrupt(s)
    }
}

/// One instance's state at a checkpoint.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct InstanceState {
    /// The operator's snapshot, or the source's position.
    pub(crate) operator: Vec<u8>,
    /// The keyed state's savepoint.
    pub(crate) keyed: Option<u64>,
    /// The operator's `finish` ran before this checkpoint.
    pub(crate) finished: bool,
    /// Records an unaligned barrier overtook: processed again after a restore.
    pub(crate) in_flight: Vec<Vec<u8>>,
    /// A sink's pre-committed transactions not yet committed, with their checkpoints.
    pub(crate) transactions: Vec<(u64, Vec<u8>)>,
}

struct Enc(Vec<u8>);

impl Enc {
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
    }
}

/// Reads what [`Enc`] wrote, refusing anything out of bounds.
struct Dec<'a> {
    buf: &'a [u8],
    what: &'a str,
}

impl<'a> Dec<'a> {
    fn take(&mut self, n: u64) -> Result<&'a [u8], String> {
        let n = usize::try_from(n).ok().filter(|&n| n <= self.buf.len());
        let Some(n) = n else {
            return Err(format!("{}: cut short", self.what));
        };
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn u64(&mut self) -> Result<u64, String> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().map_err(|_| "8 bytes")?))
    }
    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.u64()?;
        self.take(n)
    }
    /// A count of items of at least `min` bytes each: never more than could fit.
    fn count(&mut self, min: usize) -> Result<usize, String> {
        let n = self.u64()?;
        match usize::try_from(n) {
            Ok(n) if n.saturating_mul(min) <= self.buf.len() => Ok(n),
            _ => Err(format!(
                "{}: a count of {n} does not fit the file",
                self.what
            )),
        }
    }
}

/// Frames `payload` with the header: magic, version, kind, checkpoint id, length, CRC-32.
fn frame(kind: u32, id: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload of a framed file, checked: magic, version, kind, id, length and CRC.
fn unframe<'a>(buf: &'a [u8], kind: u32, id: u64, what: &str) -> Result<&'a [u8], String> {
    if buf.len() < HEADER || &buf[..8] != MAGIC {
        return Err(format!("{what}: not a checkpoint file"));
    }
    let u32_at = |o: usize| u32::from_le_bytes(buf[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(buf[o..o + 8].try_into().expect("8 bytes"));
    if u32_at(8) != VERSION {
        return Err(format!(
            "{what}: format version {} (this is {VERSION})",
            u32_at(8)
        ));
    }
    if u32_at(12) != kind {
        return Err(format!("{what}: a file of another kind"));
    }
    if u64_at(16) != id {
        return Err(format!("{what}: belongs to checkpoint {}", u64_at(16)));
    }
    let payload = &buf[HEADER..];
    if u64_at(24) != payload.len() as u64 {
        return Err(format!(
            "{what}: {} bytes where the header says {} (torn)",
            payload.len(),
            u64_at(24)
        ));
    }
    if crc32fast::hash(payload) != u32_at(32) {
        return Err(format!("{what}: checksum mismatch (corrupt)"));
    }
    Ok(payload)
}

const KIND_STATE: u32 = 1;
const KIND_METADATA: u32 = 2;

impl InstanceState {
    pub(crate) fn encode(&self, id: u64) -> Vec<u8> {
        let mut e = Enc(Vec::new());
        e.bytes(&self.operator);
        e.u64(self.keyed.map_or(0, |_| 1));
        e.u64(self.keyed.unwrap_or(0));
        e.u64(self.finished as u64);
        e.u64(self.in_flight.len() as u64);
        for r in &self.in_flight {
            e.bytes(r);
        }
        e.u64(self.transactions.len() as u64);
        for (c, t) in &self.transactions {
            e.u64(*c);
            e.bytes(t);
        }
        frame(KIND_STATE, id, &e.0)
    }

    pub(crate) fn decode(buf: &[u8], id: u64, what: &str) -> Result<InstanceState, String> {
        let mut d = Dec {
            buf: unframe(buf, KIND_STATE, id, what)?,
            what,
        };
        let operator = d.bytes()?.to_vec();
        let has_keyed = d.u64()?;
        let keyed = d.u64()?;
        let finished = d.u64()?;
        if has_keyed > 1 || finished > 1 {
            return Err(format!("{what}: a flag is neither 0 nor 1"));
        }
        let n = d.count(8)?;
        let in_flight = (0..n)
            .map(|_| d.bytes().map(<[u8]>::to_vec))
            .collect::<Result<_, _>>()?;
        let n = d.count(16)?;
        let transactions = (0..n)
            .map(|_| Ok((d.u64()?, d.bytes()?.to_vec())))
            .collect::<Result<_, String>>()?;
        if !d.buf.is_empty() {
            return Err(format!("{what}: bytes after the end"));
        }
        Ok(InstanceState {
            operator,
            keyed: (has_keyed == 1).then_some(keyed),
            finished: finished == 1,
            in_flight,
            transactions,
        })
    }
}

/// The checkpoint directory of one pipeline.
#[derive(Debug, Clone)]
pub(crate) struct Store {
    pub(crate) dir: PathBuf,
}

impl Store {
    pub(crate) fn chk(&self, id: u64) -> PathBuf {
        self.dir.join(format!("chk-{id}"))
    }

    pub(crate) fn keyed(&self, instance: &str) -> PathBuf {
        self.dir.join("keyed").join(format!("{instance}.redb"))
    }

    /// Instance `instance` acknowledges checkpoint `id` with `state`; returns the bytes
    /// written.
    pub(crate) fn ack(
        &self,
        id: u64,
        instance: &str,
        state: &InstanceState,
    ) -> std::io::Result<u64> {
        let d = self.chk(id);
        let bytes = state.encode(id);
        // The supervisor removes the directory of a checkpoint it aborted, maybe while this
        // writes: then the directory is made again (the supervisor removes it again when the
        // late acknowledgement reaches it).
        let mut tries = 0;
        loop {
            let made = match fs::create_dir(&d) {
                Ok(()) => sync_dir(&self.dir),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                Err(e) => Err(e),
            };
            match made.and_then(|()| write_atomic(&d, instance, &bytes)) {
                Ok(()) => return Ok(bytes.len() as u64),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 5 => tries += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Instance `instance`'s state at checkpoint `id`, checked.
    pub(crate) fn load(&self, id: u64, instance: &str) -> Result<InstanceState, String> {
        let path = self.chk(id).join(instance);
        let buf = fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        InstanceState::decode(&buf, id, &path.display().to_string())
    }

    /// Marks checkpoint `id` complete: its metadata (every instance file's size and CRC),
    /// then the `completed` pointer, each written atomically.
    pub(crate) fn complete(&self, id: u64, instances: &[String]) -> Result<u64, RunError> {
        let d = self.chk(id);
        let mut e = Enc(Vec::new());
        let mut total = 0;
        e.u64(instances.len() as u64);
        for name in instances {
            let path = d.join(name);
            let buf = fs::read(&path).map_err(io(format!("reading {}", path.display())))?;
            total += buf.len() as u64;
            e.bytes(name.as_bytes());
            e.u64(buf.len() as u64);
            e.u64(crc32fast::hash(&buf) as u64);
        }
        write_atomic(&d, "_metadata", &frame(KIND_METADATA, id, &e.0))
            .map_err(io(format!("writing {}", d.join("_metadata").display())))?;
        write_atomic(&self.dir, "completed", format!("{id}\n").as_bytes()).map_err(io(format!(
            "writing {}",
            self.dir.join("completed").display()
        )))?;
        Ok(total)
    }

    /// Checks complete checkpoint `id`: its metadata, and every instance file against it.
    /// A file that is missing, torn or fails its checks is [`Unusable::Corrupt`]; any other
    /// failure to read is [`Unusable::Io`] (the checkpoint may be fine).
    pub(crate) fn verify(&self, id: u64, instances: &[String]) -> Result<(), Unusable> {
        let read = |p: &Path| {
            fs::read(p).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => {
                    Unusable::Corrupt(format!("{}: missing", p.display()))
                }
                _ => Unusable::Io(io(format!("reading {}", p.display()))(e)),
            })
        };
        let d = self.chk(id);
        let path = d.join("_metadata");
        let buf = read(&path)?;
        let what = path.display().to_string();
        let mut m = Dec {
            buf: unframe(&buf, KIND_METADATA, id, &what)?,
            what: &what,
        };
        let n = m.count(24)?;
        if n != instances.len() {
            return Err(Unusable::Corrupt(format!(
                "{what}: {n} instances, the pipeline has {}",
                instances.len()
            )));
        }
        for _ in 0..n {
            let name = String::from_utf8_lossy(m.bytes()?).into_owned();
            let (len, crc) = (m.u64()?, m.u64()?);
            if !instances.contains(&name) {
                return Err(Unusable::Corrupt(format!(
                    "{what}: names an unknown instance {name:?}"
                )));
            }
            let p = d.join(&name);
            let file = read(&p)?;
            if file.len() as u64 != len || crc32fast::hash(&file) as u64 != crc {
                return Err(Unusable::Corrupt(format!(
                    "{}: differs from the checkpoint's metadata (corrupt)",
                    p.display()
                )));
            }
            InstanceState::decode(&file, id, &p.display().to_string())?;
        }
        Ok(())
    }

    /// The checkpoint directories, by id (complete or not).
    pub(crate) fn list(&self) -> Result<Vec<u64>, RunError> {
        let mut ids: Vec<u64> = fs::read_dir(&self.dir)
            .map_err(io(format!("listing {}", self.dir.display())))?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_prefix("chk-")?.parse().ok())
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// The complete checkpoints (those with metadata), newest first.
    pub(crate) fn completed(&self) -> Result<Vec<u64>, RunError> {
        let mut ids: Vec<u64> = self
            .list()?
            .into_iter()
            .filter(|&id| self.chk(id).join("_metadata").exists())
            .collect();
        ids.reverse();
        Ok(ids)
    }

    /// Removes checkpoint `id`'s directory, which instances may still be writing (an aborted
    /// checkpoint's late acknowledgements): tries a few times, and leaves what it cannot
    /// remove to a later sweep (a directory without metadata is never read).
    /// Moves checkpoint `id` aside as `corrupt-chk-ID` (never read again, kept for a look).
    pub(crate) fn set_aside(&self, id: u64) -> Result<PathBuf, RunError> {
        let to = self.dir.join(format!("corrupt-chk-{id}"));
        let _ = fs::remove_dir_all(&to);
        fs::rename(self.chk(id), &to)
            .and_then(|()| sync_dir(&self.dir))
            .map_err(io(format!("moving {} aside", self.chk(id).display())))?;
        Ok(to)
    }

    pub(crate) fn remove_aborted(&self, id: u64) {
        for _ in 0..5 {
            if self.remove(id).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    pub(crate) fn remove(&self, id: u64) -> Result<(), RunError> {
        let d = self.chk(id);
        match fs::remove_dir_all(&d) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(io(format!("removing {}", d.display()))(e))
            }
            _ => Ok(()),
        }
    }

    /// Takes the directory for this supervisor: creates it, locks it, and checks (or writes)
    /// the pipeline's identity.
    pub(crate) fn open(dir: &Path, identity: &str, fresh: bool) -> Result<(Store, File), RunError> {
        fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let lock_path = dir.join("lock");
        let mut lock = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(io(format!("opening {}", lock_path.display())))?;
        // SAFETY: flock on a descriptor this function owns (`lock` lives until the return).
        let r = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r != 0 {
            let mut text = String::new();
            let _ = lock.read_to_string(&mut text);
            return Err(RunError::Locked {
                dir: dir.to_owned(),
                pid: text.trim().parse().ok(),
            });
        }
        lock.set_len(0)
            .and_then(|()| lock.write_all(format!("{}\n", std::process::id()).as_bytes()))
            .map_err(io(format!("writing {}", lock_path.display())))?;
        let id_path = dir.join("PIPELINE");
        let store = Store {
            dir: dir.to_owned(),
        };
        if fresh {
            // Afresh: whatever the directory held goes, another pipeline's included.
            store.wipe()?;
            write_atomic(dir, "PIPELINE", format!("{identity}\n").as_bytes())
                .map_err(io(format!("writing {}", id_path.display())))?;
            return Ok((store, lock));
        }
        match fs::read_to_string(&id_path) {
            Ok(found) if found.trim_end() == identity => {}
            Ok(found) => {
                return Err(RunError::ForeignDirectory {
                    dir: dir.to_owned(),
                    found: found.trim_end().to_owned(),
                    expected: identity.to_owned(),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let stray = fs::read_dir(dir)
                    .map_err(io(format!("listing {}", dir.display())))?
                    .flatten()
                    .any(|e| {
                        e.file_name()
                            .to_str()
                            .is_some_and(|n| n.starts_with("chk-"))
                    });
                if stray {
                    return Err(RunError::ForeignDirectory {
                        dir: dir.to_owned(),
                        found: "checkpoints without an identity file".to_owned(),
                        expected: identity.to_owned(),
                    });
                }
                write_atomic(dir, "PIPELINE", format!("{identity}\n").as_bytes())
                    .map_err(io(format!("writing {}", id_path.display())))?;
            }
            Err(e) => return Err(io(format!("reading {}", id_path.display()))(e)),
        }
        Ok((store, lock))
    }

    /// Removes every checkpoint, the keyed state, the finished mark and the figures.
    pub(crate) fn wipe(&self) -> Result<(), RunError> {
        for id in self.list()? {
            self.remove(id)?;
        }
        for e in fs::read_dir(&self.dir)
            .map_err(io(format!("listing {}", self.dir.display())))?
            .flatten()
        {
            if e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with("corrupt-chk-"))
            {
                fs::remove_dir_all(e.path())
                    .map_err(io(format!("removing {}", e.path().display())))?;
            }
        }
        for name in ["completed", "finished", "metrics"] {
            let p = self.dir.join(name);
            match fs::remove_file(&p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io(format!("removing {}", p.display()))(e))
                }
                _ => {}
            }
        }
        let k = self.dir.join("keyed");
        match fs::remove_dir_all(&k) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(io(format!("removing {}", k.display()))(e))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> InstanceState {
        InstanceState {
            operator: b"op".to_vec(),
            keyed: Some(7),
            finished: true,
            in_flight: vec![b"a".to_vec(), Vec::new()],
            transactions: vec![(3, b"t3".to_vec())],
        }
    }

    #[test]
    fn a_state_reads_back_as_written() {
        let s = sample();
        assert_eq!(InstanceState::decode(&s.encode(9), 9, "f").unwrap(), s);
        let empty = InstanceState::default();
        assert_eq!(
            InstanceState::decode(&empty.encode(1), 1, "f").unwrap(),
            empty
        );
    }

    #[test]
    fn every_torn_or_flipped_file_is_refused() {
        let buf = sample().encode(9);
        for cut in 0..buf.len() {
            assert!(
                InstanceState::decode(&buf[..cut], 9, "f").is_err(),
                "cut at {cut}"
            );
        }
        for i in 0..buf.len() {
            let mut b = buf.clone();
            b[i] ^= 0x10;
            // Bytes 36..40 are reserved: a flip there changes nothing that is read.
            if (36..40).contains(&i) {
                continue;
            }
            assert!(InstanceState::decode(&b, 9, "f").is_err(), "flip at {i}");
        }
        assert!(InstanceState::decode(&buf, 8, "f")
            .unwrap_err()
            .contains("checkpoint 9"));
    }

    #[test]
    fn a_huge_count_is_refused_without_allocating() {
        let mut e = Enc(Vec::new());
        e.bytes(b"");
        e.u64(0);
        e.u64(0);
        e.u64(0);
        e.u64(u64::MAX); // in-flight records
        let buf = frame(KIND_STATE, 1, &e.0);
        assert!(InstanceState::decode(&buf, 1, "f")
            .unwrap_err()
            .contains("does not fit"));
    }
}
