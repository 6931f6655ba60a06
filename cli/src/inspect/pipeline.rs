//! A `shmflow-pipeline` checkpoint directory as `stat`, `top` and `export` show it: the
//! supervisor's figures (Flink's names) from `DIR/metrics`, and whether a supervisor holds the
//! directory now (its `flock` on `DIR/lock`, read from `/proc/locks`, so that looking never
//! takes the lock a starting supervisor wants).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use shmflow_pipeline::Metrics;

/// One pipeline directory, read once.
#[derive(Debug, Clone)]
pub(crate) struct View {
    pub(crate) dir: PathBuf,
    /// The pipeline's name, from its identity file.
    pub(crate) name: String,
    pub(crate) metrics: Metrics,
    /// The pid of the supervisor that holds the directory's lock, if one does.
    pub(crate) supervisor: Option<u32>,
}

impl View {
    pub(crate) fn read(dir: &Path) -> Result<View, String> {
        let identity = std::fs::read_to_string(dir.join("PIPELINE")).map_err(|e| {
            format!(
                "{}: not a pipeline's checkpoint directory (no PIPELINE file: {e})",
                dir.display()
            )
        })?;
        let name = identity
            .strip_prefix("pipeline ")
            .and_then(|r| r.split(' ').next())
            .unwrap_or("?")
            .to_owned();
        Ok(View {
            dir: dir.to_owned(),
            name,
            metrics: Metrics::load(dir),
            supervisor: lock_holder(&dir.join("lock")),
        })
    }

    /// The state, corrected by what can be seen: a supervisor that died while running.
    pub(crate) fn state(&self) -> String {
        let s = if self.metrics.state.is_empty() {
            "not started"
        } else {
            self.metrics.state.as_str()
        };
        match (s, self.supervisor) {
            ("running" | "restarting", None) => format!("{s} (supervisor gone)"),
            _ => s.to_owned(),
        }
    }

    /// One or two lines, for `top`: the figures, then the last failure if there was one.
    pub(crate) fn lines(&self) -> Vec<String> {
        let m = &self.metrics;
        let l = format!(
            "pipeline {}: {}, numRestarts {}, checkpoints {} completed / {} failed, last #{} \
             {:.1} ms {} B, alignment {:.1} ms",
            self.name,
            self.state(),
            m.num_restarts,
            m.completed_checkpoints,
            m.failed_checkpoints,
            m.last_checkpoint_id,
            m.last_checkpoint_duration_ms,
            m.last_checkpoint_size,
            m.checkpoint_alignment_time_ms,
        );
        let mut out = vec![l];
        if !m.last_failure_cause.is_empty() {
            out.push(format!("  last failure: {}", m.last_failure_cause));
        }
        out
    }

    fn print(&self) {
        println!("pipeline {} ({})", self.name, self.dir.display());
        println!(
            "  state {}   supervisor {}",
            self.state(),
            self.supervisor
                .map_or_else(|| "none".to_owned(), |p| format!("pid {p}"))
        );
        for (k, v) in self.metrics.figures() {
            if matches!(k, "state" | "supervisorPid") {
                continue;
            }
            let unit = match k {
                "lastCheckpointDuration" | "checkpointAlignmentTime" | "lastRecoveryTime" => " ms",
                "lastCheckpointSize" => " B",
                _ => "",
            };
            println!("  {k:<32} {v}{unit}");
        }
    }

    fn json(&self) -> String {
        let mut o = serde_json::Map::new();
        o.insert("pipeline".into(), self.name.clone().into());
        o.insert("dir".into(), self.dir.display().to_string().into());
        o.insert("state".into(), self.state().into());
        o.insert(
            "supervisorPid".into(),
            self.supervisor.map_or(serde_json::Value::Null, Into::into),
        );
        for (k, v) in self.metrics.figures() {
            if matches!(k, "state" | "supervisorPid") {
                continue;
            }
            let text = matches!(k, "lastFailureCause" | "restartStrategy");
            let value = match (v.parse::<u64>(), v.parse::<f64>()) {
                (Ok(n), _) if !text => n.into(),
                (_, Ok(x)) if !text => {
                    serde_json::Number::from_f64(x).map_or(serde_json::Value::Null, Into::into)
                }
                _ => v.into(),
            };
            o.insert(k.into(), value);
        }
        serde_json::Value::Object(o).to_string()
    }

    fn over(&self) -> bool {
        self.supervisor.is_none()
            && matches!(self.metrics.state.as_str(), "finished" | "failed" | "")
    }
}

/// The pid holding an flock on `path`, from `/proc/locks` (`N: FLOCK ADVISORY WRITE PID
/// MAJ:MIN:INODE START END`), matched by inode.
fn lock_holder(path: &Path) -> Option<u32> {
    let ino = std::fs::metadata(path).ok()?.ino();
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (kind, pid, id) = (f.get(1)?, f.get(4)?, f.get(5)?);
        let inode: u64 = id.rsplit(':').next()?.parse().ok()?;
        (*kind == "FLOCK" && inode == ino).then(|| pid.parse().ok())?
    })
}

/// `shmflow stat --pipeline DIR`: the figures every interval until the supervisor is gone
/// and the pipeline finished or failed (then once more, final), or `count` samples.
pub(crate) fn stat(dir: &Path, json: bool, interval: Duration, count: u64) -> Result<(), String> {
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    for i in 0..count {
        if i > 0 {
            std::thread::sleep(interval);
        }
        let v = View::read(dir)?;
        if json {
            println!("{}", v.json());
        } else {
            if tty && count > 1 {
                print!("\x1b[2J\x1b[H");
            }
            v.print();
        }
        if v.over() {
            if !json && count > 1 {
                println!("no supervisor holds the directory: the figures above are final");
            }
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_reads_with_its_figures_and_a_dead_supervisor_shows() {
        let dir = std::env::temp_dir().join(format!("shmflow-cli-pipeline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("PIPELINE"),
            "pipeline wc stages a:source:1 edges \n",
        )
        .unwrap();
        std::fs::write(dir.join("lock"), "1\n").unwrap();
        std::fs::write(
            dir.join("metrics"),
            "state running\nnumRestarts 2\nlastFailureCause instance a-0 was killed\n\
             numberOfCompletedCheckpoints 7\nlastCheckpointDuration 1.5\n",
        )
        .unwrap();
        let v = View::read(&dir).unwrap();
        assert_eq!(v.name, "wc");
        assert_eq!(v.supervisor, None);
        assert_eq!(v.state(), "running (supervisor gone)");
        let lines = v.lines();
        assert!(
            lines[0].contains("numRestarts 2") && lines[0].contains("7 completed"),
            "{lines:?}"
        );
        assert!(lines[1].contains("last failure: instance a-0"), "{lines:?}");
        let j: serde_json::Value = serde_json::from_str(&v.json()).unwrap();
        assert_eq!(j["numRestarts"], 2);
        assert_eq!(j["lastCheckpointDuration"], 1.5);
        assert_eq!(j["lastFailureCause"], "instance a-0 was killed");
        assert!(View::read(&dir.join("nope"))
            .unwrap_err()
            .contains("not a pipeline"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
