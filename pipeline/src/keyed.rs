//! Keyed state on an embedded database (redb), checkpointed incrementally.
//!
//! Writes go to a map of the keys changed since the last spill; when it grows past
//! [`SPILL_KEYS`] keys, or at a checkpoint barrier, it is written to the database in one
//! write transaction without a sync (`Durability::None`). At a barrier a second, durable
//! transaction then takes a *persistent savepoint*: redb's B-trees are copy-on-write, so a
//! savepoint pins the pages of that moment, and what a checkpoint writes and syncs is the
//! pages changed since the last one — Flink's incremental RocksDB checkpoints, in a B-tree.
//! The savepoint's id goes into the instance's checkpoint file; a restore rolls the
//! database back to it (`restore_savepoint`), whatever was written after. Savepoints of
//! checkpoints older than the oldest retained one are deleted at the next barrier, which
//! lets redb free their pages.
//!
//! The state lives in a file on disk with a page cache of a set size, so it may be larger
//! than memory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use redb::{Database, Durability, ReadOnlyTable, ReadableDatabase, ReadableTable, TableDefinition};

use crate::error::StateError;

const DATA: TableDefinition<&[u8], &[u8]> = TableDefinition::new("keyed");
/// Checkpoint id to the persistent savepoint taken at its barrier.
const SAVEPOINTS: TableDefinition<u64, u64> = TableDefinition::new("savepoints");

/// Changed keys kept in memory before they are written to the database.
const SPILL_KEYS: usize = 64 * 1024;

/// An instance's keyed state: a map from byte keys to byte values, on disk.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::env::temp_dir().join(format!("keyed-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// use shmflow_pipeline::KeyedState;
/// let mut state = KeyedState::open(&dir.join("state.redb"), 1 << 20)?;
/// state.put(b"apple", &3u64.to_le_bytes())?;
/// assert_eq!(state.add_u64(b"apple", 2)?, 5);
/// assert_eq!(state.get(b"pear")?, None);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// ```
pub struct KeyedState {
    db: Database,
    path: PathBuf,
    /// Keys changed since the last spill: `None` is a deletion.
    dirty: HashMap<Vec<u8>, Option<Vec<u8>>>,
    /// The database as of the last spill (`None`: no table yet).
    read: Option<ReadOnlyTable<&'static [u8], &'static [u8]>>,
    /// Savepoints of checkpoints older than this are deleted at the next barrier.
    oldest_retained: u64,
}

impl std::fmt::Debug for KeyedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedState")
            .field("path", &self.path)
            .field("dirty", &self.dirty.len())
            .finish_non_exhaustive()
    }
}

fn err<'a, E: Into<Box<dyn std::error::Error + Send + Sync>>>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(E) -> StateError + 'a {
    move |e| StateError::new(format!("{what} ({})", path.display()), e)
}

impl KeyedState {
    /// Opens (or creates) the state at `path` with a page cache of `cache` bytes.
    pub fn open(path: &Path, cache: usize) -> Result<KeyedState, StateError> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(err("creating the directory", path))?;
        }
        let db = Database::builder()
            .set_cache_size(cache)
            .create(path)
            .map_err(err("opening the database", path))?;
        let mut state = KeyedState {
            db,
            path: path.to_owned(),
            dirty: HashMap::new(),
            read: None,
            oldest_retained: 0,
        };
        state.refresh()?;
        Ok(state)
    }

    /// Removes the state at `path` (a start without a checkpoint, or from one taken before
    /// the state was first used).
    pub(crate) fn discard(path: &Path) -> Result<(), StateError> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(StateError::new(format!("removing {}", path.display()), e))
            }
            _ => Ok(()),
        }
    }

    fn refresh(&mut self) -> Result<(), StateError> {
        let txn = self.db.begin_read().map_err(err("reading", &self.path))?;
        self.read = match txn.open_table(DATA) {
            Ok(t) => Some(t),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(err("reading", &self.path)(e)),
        };
        Ok(())
    }

    /// The value of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        if let Some(v) = self.dirty.get(key) {
            return Ok(v.clone());
        }
        match &self.read {
            None => Ok(None),
            Some(t) => Ok(t
                .get(key)
                .map_err(err("reading", &self.path))?
                .map(|v| v.value().to_vec())),
        }
    }

    /// Sets `key` to `value`.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        match self.dirty.get_mut(key) {
            Some(v) => *v = Some(value.to_vec()),
            None => {
                self.dirty.insert(key.to_vec(), Some(value.to_vec()));
            }
        }
        self.spill_if_large()
    }

    /// Removes `key`.
    pub fn delete(&mut self, key: &[u8]) -> Result<(), StateError> {
        self.dirty.insert(key.to_vec(), None);
        self.spill_if_large()
    }

    /// Adds `n` to the little-endian `u64` at `key` (0 if absent) and returns the sum.
    pub fn add_u64(&mut self, key: &[u8], n: u64) -> Result<u64, StateError> {
        let old = match self.get(key)? {
            None => 0,
            Some(v) => u64::from_le_bytes(v.as_slice().try_into().map_err(|_| StateError {
                what: format!("the value of a key is {} bytes, not a u64", v.len()),
                source: None,
            })?),
        };
        let sum = old.wrapping_add(n);
        self.put(key, &sum.to_le_bytes())?;
        Ok(sum)
    }

    /// Every key and value, in key order (what was changed since the last spill is written
    /// first).
    pub fn for_each(
        &mut self,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        self.spill(Durability::None)?;
        if let Some(t) = &self.read {
            for entry in t.iter().map_err(err("reading", &self.path))? {
                let (k, v) = entry.map_err(err("reading", &self.path))?;
                f(k.value(), v.value())?;
            }
        }
        Ok(())
    }

    fn spill_if_large(&mut self) -> Result<(), StateError> {
        if self.dirty.len() >= SPILL_KEYS {
            self.spill(Durability::None)?;
        }
        Ok(())
    }

    /// Writes the changed keys in one write transaction.
    fn spill(&mut self, durability: Durability) -> Result<(), StateError> {
        if self.dirty.is_empty() {
            return Ok(());
        }
        let mut txn = self.db.begin_write().map_err(err("writing", &self.path))?;
        txn.set_durability(durability)
            .map_err(err("writing", &self.path))?;
        {
            let mut t = txn.open_table(DATA).map_err(err("writing", &self.path))?;
            for (k, v) in self.dirty.drain() {
                match v {
                    Some(v) => t.insert(k.as_slice(), v.as_slice()).map(drop),
                    None => t.remove(k.as_slice()).map(drop),
                }
                .map_err(err("writing", &self.path))?;
            }
        }
        txn.commit().map_err(err("committing", &self.path))?;
        self.refresh()
    }

    /// At checkpoint `id`'s barrier: writes what changed, takes a durable savepoint and
    /// returns its id; deletes the savepoints of checkpoints older than the oldest retained.
    pub fn checkpoint(&mut self, id: u64) -> Result<u64, StateError> {
        self.spill(Durability::None)?;
        let txn = self
            .db
            .begin_write()
            .map_err(err("checkpointing", &self.path))?;
        // A savepoint must be the transaction's first act (no table opened before it).
        let savepoint = txn
            .persistent_savepoint()
            .map_err(err("taking a savepoint", &self.path))?;
        {
            let mut t = txn
                .open_table(SAVEPOINTS)
                .map_err(err("checkpointing", &self.path))?;
            let old: Vec<(u64, u64)> = t
                .range(..self.oldest_retained)
                .map_err(err("checkpointing", &self.path))?
                .map(|e| e.map(|(c, s)| (c.value(), s.value())))
                .collect::<Result<_, _>>()
                .map_err(err("checkpointing", &self.path))?;
            for (c, s) in old {
                txn.delete_persistent_savepoint(s)
                    .map_err(err("deleting an old savepoint", &self.path))?;
                t.remove(c).map_err(err("checkpointing", &self.path))?;
            }
            t.insert(id, savepoint)
                .map_err(err("checkpointing", &self.path))?;
        }
        txn.commit()
            .map_err(err("committing a checkpoint", &self.path))?;
        self.refresh()?;
        Ok(savepoint)
    }

    /// The coordinator keeps the checkpoints from `id` on.
    pub fn set_oldest_retained(&mut self, id: u64) {
        self.oldest_retained = self.oldest_retained.max(id);
    }

    /// Rolls the state back to checkpoint `id`'s savepoint, and deletes the savepoints taken
    /// after it.
    pub fn restore(&mut self, id: u64, savepoint: u64) -> Result<(), StateError> {
        self.dirty.clear();
        self.read = None;
        let mut txn = self
            .db
            .begin_write()
            .map_err(err("restoring", &self.path))?;
        let sp = txn.get_persistent_savepoint(savepoint).map_err(|e| {
            StateError::new(
                format!(
                    "checkpoint {id}'s savepoint {savepoint} is not in {} (the state file does not \
                     belong to this checkpoint directory, or was changed)",
                    self.path.display()
                ),
                e,
            )
        })?;
        txn.restore_savepoint(&sp)
            .map_err(err("restoring a savepoint", &self.path))?;
        drop(sp);
        let later: Vec<u64> = txn
            .list_persistent_savepoints()
            .map_err(err("restoring", &self.path))?
            .filter(|&s| s > savepoint)
            .collect();
        for s in later {
            txn.delete_persistent_savepoint(s)
                .map_err(err("restoring", &self.path))?;
        }
        {
            // The table as of the savepoint holds the earlier checkpoints; add this one.
            let mut t = txn
                .open_table(SAVEPOINTS)
                .map_err(err("restoring", &self.path))?;
            let later: Vec<u64> = t
                .range(id..)
                .map_err(err("restoring", &self.path))?
                .map(|e| e.map(|(c, _)| c.value()))
                .collect::<Result<_, _>>()
                .map_err(err("restoring", &self.path))?;
            for c in later {
                t.remove(c).map_err(err("restoring", &self.path))?;
            }
            t.insert(id, savepoint)
                .map_err(err("restoring", &self.path))?;
        }
        txn.commit()
            .map_err(err("committing a restore", &self.path))?;
        self.refresh()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("shmflow-keyed-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d.join("state.redb")
    }

    #[test]
    fn a_restore_rolls_back_to_the_checkpoint_whatever_was_written_after() {
        let path = temp("restore");
        let mut s = KeyedState::open(&path, 1 << 20).unwrap();
        s.add_u64(b"a", 1).unwrap();
        let sp1 = s.checkpoint(1).unwrap();
        s.add_u64(b"a", 10).unwrap();
        s.put(b"b", b"x").unwrap();
        let _sp2 = s.checkpoint(2).unwrap();
        s.add_u64(b"a", 100).unwrap();
        s.spill(Durability::None).unwrap();
        drop(s);
        // A new process: back to checkpoint 1.
        let mut s = KeyedState::open(&path, 1 << 20).unwrap();
        s.restore(1, sp1).unwrap();
        assert_eq!(s.get(b"a").unwrap(), Some(1u64.to_le_bytes().to_vec()));
        assert_eq!(s.get(b"b").unwrap(), None);
        // And on from there: checkpoint 2 again, with other contents.
        s.add_u64(b"a", 5).unwrap();
        let sp2 = s.checkpoint(2).unwrap();
        s.add_u64(b"a", 5).unwrap();
        s.restore(2, sp2).unwrap();
        assert_eq!(s.add_u64(b"a", 0).unwrap(), 6);
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn old_savepoints_are_deleted_once_not_retained() {
        let path = temp("prune");
        let mut s = KeyedState::open(&path, 1 << 20).unwrap();
        let mut ids = Vec::new();
        for c in 1..=5u64 {
            s.put(&c.to_le_bytes(), b"v").unwrap();
            ids.push(s.checkpoint(c).unwrap());
            s.set_oldest_retained(c.saturating_sub(1));
        }
        let txn = s.db.begin_write().unwrap();
        let left: Vec<u64> = txn.list_persistent_savepoints().unwrap().collect();
        assert!(left.len() <= 3, "{left:?}");
        assert!(left.contains(&ids[4]));
        drop(txn);
        let mut n = 0;
        s.for_each(|_, _| {
            n += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(n, 5);
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }
}
