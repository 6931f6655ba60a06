//! Two-phase-commit sinks.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::StageError;
use crate::stage::Sink;
use crate::store::sync_dir;

/// Writes each record as a line into files of a directory, exactly once across crashes.
///
/// Instance `i`'s open transaction is `.pending-I`; at checkpoint `C`'s barrier it is synced
/// and renamed `.precommit-I-C` (pre-commit); when `C` completes it is renamed
/// `part-I-C` (commit), which is what readers see. On recovery the pre-commits of the
/// restored checkpoint are committed and every other pending or pre-committed file of the
/// instance is removed (abort). [`FileSink::read_committed`] reads the committed output.
///
/// A pipeline that restores a checkpoint older than one already committed (the newer one
/// was found corrupt) removes the parts committed after it, which it then writes again.
#[derive(Debug)]
pub struct FileSink {
    dir: PathBuf,
    instance: usize,
    open: Option<BufWriter<File>>,
}

impl FileSink {
    /// Instance `instance`'s files in `dir` (created if missing).
    pub fn new(dir: impl Into<PathBuf>, instance: usize) -> FileSink {
        FileSink {
            dir: dir.into(),
            instance,
            open: None,
        }
    }

    fn pending(&self) -> PathBuf {
        self.dir.join(format!(".pending-{}", self.instance))
    }

    fn precommit(&self, c: u64) -> PathBuf {
        self.dir.join(format!(".precommit-{}-{c}", self.instance))
    }

    fn part(&self, c: u64) -> PathBuf {
        self.dir.join(format!("part-{}-{c:020}", self.instance))
    }

    fn err(path: &Path) -> impl FnOnce(std::io::Error) -> StageError + '_ {
        move |e| StageError::msg(format!("{}: {e}", path.display()))
    }

    fn begin(&mut self) -> Result<&mut BufWriter<File>, StageError> {
        if self.open.is_none() {
            let p = self.pending();
            let f = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)
                .map_err(Self::err(&p))?;
            self.open = Some(BufWriter::with_capacity(256 * 1024, f));
        }
        Ok(self.open.as_mut().expect("opened above"))
    }

    /// The committed output of every instance in `dir`: the parts in checkpoint order, then
    /// instance order.
    pub fn read_committed(dir: impl AsRef<Path>) -> std::io::Result<Vec<u8>> {
        let mut parts: Vec<(u64, usize, PathBuf)> = fs::read_dir(dir.as_ref())?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let (i, c) = name.strip_prefix("part-")?.split_once('-')?;
                Some((c.parse().ok()?, i.parse().ok()?, e.path()))
            })
            .collect();
        parts.sort();
        let mut out = Vec::new();
        for (_, _, p) in parts {
            out.extend_from_slice(&fs::read(p)?);
        }
        Ok(out)
    }

    /// The parts, pre-commits and open transaction of this instance, as (kind, checkpoint,
    /// path).
    fn files(&self) -> Result<Vec<SinkFile>, StageError> {
        let i = self.instance.to_string();
        let mut out = Vec::new();
        for e in fs::read_dir(&self.dir)
            .map_err(Self::err(&self.dir))?
            .flatten()
        {
            let Ok(name) = e.file_name().into_string() else {
                continue;
            };
            let parse = |rest: &str| -> Option<u64> {
                let (inst, c) = rest.split_once('-')?;
                (inst == i).then(|| c.parse().ok())?
            };
            if let Some(c) = name.strip_prefix("part-").and_then(parse) {
                out.push(("part", Some(c), e.path()));
            } else if let Some(c) = name.strip_prefix(".precommit-").and_then(parse) {
                out.push(("precommit", Some(c), e.path()));
            } else if name == format!(".pending-{i}") {
                out.push(("pending", None, e.path()));
            }
        }
        Ok(out)
    }
}

/// A file of one instance: its kind, its checkpoint, its path.
type SinkFile = (&'static str, Option<u64>, PathBuf);

fn checkpoint_of(transaction: &[u8]) -> Result<u64, StageError> {
    Ok(u64::from_le_bytes(transaction.try_into().map_err(
        |_| {
            StageError::msg(format!(
                "a file sink transaction is 8 bytes, not {}",
                transaction.len()
            ))
        },
    )?))
}

impl Sink for FileSink {
    fn write(&mut self, record: &[u8]) -> Result<(), StageError> {
        let w = self.begin()?;
        w.write_all(record)?;
        w.write_all(b"\n")?;
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, StageError> {
        let w = self.begin()?;
        w.flush()?;
        w.get_ref().sync_all()?;
        self.open = None;
        let (from, to) = (self.pending(), self.precommit(checkpoint));
        fs::rename(&from, &to).map_err(Self::err(&from))?;
        sync_dir(&self.dir).map_err(Self::err(&self.dir))?;
        Ok(checkpoint.to_le_bytes().to_vec())
    }

    fn commit(&mut self, transaction: &[u8]) -> Result<(), StageError> {
        let c = checkpoint_of(transaction)?;
        let pre = self.precommit(c);
        match fs::metadata(&pre) {
            // Committed before (a crash between the commit and the note of it).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Self::err(&pre)(e)),
            Ok(m) if m.len() == 0 => fs::remove_file(&pre).map_err(Self::err(&pre))?,
            Ok(_) => fs::rename(&pre, self.part(c)).map_err(Self::err(&pre))?,
        }
        sync_dir(&self.dir).map_err(Self::err(&self.dir))
    }

    fn recover(&mut self, committable: &[Vec<u8>]) -> Result<(), StageError> {
        fs::create_dir_all(&self.dir).map_err(Self::err(&self.dir))?;
        self.open = None;
        let mut keep = Vec::new();
        for t in committable {
            let c = checkpoint_of(t)?;
            self.commit(t)?;
            keep.push(c);
        }
        let newest = keep.iter().max().copied();
        for (kind, c, path) in self.files()? {
            let abort = match (kind, c) {
                ("pending", _) => true,
                ("precommit", Some(c)) => !keep.contains(&c),
                // Committed after the checkpoint restored: written again from here.
                ("part", Some(c)) => newest.is_none_or(|n| c > n) && !keep.contains(&c),
                _ => false,
            };
            if abort {
                fs::remove_file(&path).map_err(Self::err(&path))?;
            }
        }
        sync_dir(&self.dir).map_err(Self::err(&self.dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_committed_transactions_are_read_and_recovery_aborts_the_rest() {
        let dir = std::env::temp_dir().join(format!("shmflow-filesink-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mut s = FileSink::new(&dir, 0);
        s.recover(&[]).unwrap();
        s.write(b"a").unwrap();
        let t1 = s.pre_commit(1).unwrap();
        s.write(b"b").unwrap();
        let t2 = s.pre_commit(2).unwrap();
        s.write(b"c").unwrap();
        s.commit(&t1).unwrap();
        s.commit(&t1).unwrap(); // idempotent
        assert_eq!(FileSink::read_committed(&dir).unwrap(), b"a\n");
        // A crash, then a restore of checkpoint 2: its transactions are committed, the open
        // one aborted.
        let mut s = FileSink::new(&dir, 0);
        s.recover(&[t1.clone(), t2.clone()]).unwrap();
        assert_eq!(FileSink::read_committed(&dir).unwrap(), b"a\nb\n");
        assert!(!dir.join(".pending-0").exists());
        // A restore of checkpoint 1 only: part 2 goes (it is written again).
        let mut s = FileSink::new(&dir, 0);
        s.recover(&[t1]).unwrap();
        assert_eq!(FileSink::read_committed(&dir).unwrap(), b"a\n");
        fs::remove_dir_all(&dir).unwrap();
    }
}
