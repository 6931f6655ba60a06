//! Replayable sources.

use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::PathBuf;

use crate::error::StageError;
use crate::stage::{Context, Source};

/// Emits the lines of a file (without their newline), one record each; its position is the
/// byte offset of the next line, as Flink keeps a Kafka offset.
///
/// ```no_run
/// # use shmflow_pipeline::{FileSource, Pipeline};
/// let p = Pipeline::new("p", "target/p")
///     .source("read", 2, |i| Box::new(FileSource::lines(format!("input-{i}.txt"))));
/// # let _ = p;
/// ```
#[derive(Debug)]
pub struct FileSource {
    path: PathBuf,
    reader: Option<BufReader<File>>,
    offset: u64,
    line: Vec<u8>,
}

impl FileSource {
    /// The lines of the file at `path`.
    pub fn lines(path: impl Into<PathBuf>) -> FileSource {
        FileSource {
            path: path.into(),
            reader: None,
            offset: 0,
            line: Vec::new(),
        }
    }
}

impl Source for FileSource {
    fn restore(&mut self, position: Option<&[u8]>) -> Result<(), StageError> {
        let offset = match position {
            None => 0,
            Some(p) => u64::from_le_bytes(p.try_into().map_err(|_| {
                StageError::msg(format!("a file position is 8 bytes, not {}", p.len()))
            })?),
        };
        let mut f = File::open(&self.path)
            .map_err(|e| StageError::msg(format!("{}: {e}", self.path.display())))?;
        let len = f.metadata()?.len();
        if offset > len {
            return Err(StageError::msg(format!(
                "{}: the checkpoint's position {offset} is past its end ({len} bytes): the file \
                 changed",
                self.path.display()
            )));
        }
        f.seek(SeekFrom::Start(offset))?;
        self.reader = Some(BufReader::with_capacity(64 * 1024, f));
        self.offset = offset;
        Ok(())
    }

    fn poll(&mut self, ctx: &mut Context<'_>) -> Result<bool, StageError> {
        let reader = self
            .reader
            .as_mut()
            .ok_or_else(|| StageError::msg("FileSource polled before restore"))?;
        self.line.clear();
        let n = reader.read_until(b'\n', &mut self.line)?;
        if n == 0 {
            return Ok(false);
        }
        self.offset += n as u64;
        if self.line.last() == Some(&b'\n') {
            self.line.pop();
        }
        ctx.emit(&self.line)?;
        Ok(true)
    }

    fn position(&mut self) -> Vec<u8> {
        self.offset.to_le_bytes().to_vec()
    }
}
