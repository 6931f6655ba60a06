//! The supervisor's figures, with Flink's names, in `DIR/metrics` (one `name value` a line,
//! replaced whole at every change), where `shmflow stat`, `top` and `export` read them.

use std::fmt::Write as _;
use std::path::Path;

/// The figures of a pipeline's checkpoint directory.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Metrics {
    /// `running`, `restarting`, `finished` or `failed`.
    pub state: String,
    /// The supervisor's pid.
    pub supervisor_pid: u32,
    /// The restart strategy's name.
    pub restart_strategy: String,
    /// `numRestarts`: restarts since the directory was first used.
    pub num_restarts: u64,
    /// The last failure's cause.
    pub last_failure_cause: String,
    /// `numberOfCompletedCheckpoints`.
    pub completed_checkpoints: u64,
    /// `numberOfFailedCheckpoints`.
    pub failed_checkpoints: u64,
    /// The newest completed checkpoint's id.
    pub last_checkpoint_id: u64,
    /// `lastCheckpointDuration`, from trigger to completion, in ms.
    pub last_checkpoint_duration_ms: f64,
    /// `lastCheckpointSize`: bytes of the state files.
    pub last_checkpoint_size: u64,
    /// `lastCheckpointRestoreTimestamp`: when the last restore started, ms since the epoch.
    pub last_restore_timestamp_ms: u64,
    /// `checkpointAlignmentTime` of the last checkpoint (the longest of its gates), in ms.
    pub checkpoint_alignment_time_ms: f64,
    /// From the last failure to the first record processed after the restore, in ms.
    pub last_recovery_time_ms: f64,
    /// When the first record was processed after the last restore, ms since the epoch.
    pub last_recovered_timestamp_ms: u64,
}

impl Metrics {
    /// Each figure as (Flink's name, value).
    pub fn figures(&self) -> Vec<(&'static str, String)> {
        vec![
            ("state", self.state.clone()),
            ("supervisorPid", self.supervisor_pid.to_string()),
            ("restartStrategy", self.restart_strategy.clone()),
            ("numRestarts", self.num_restarts.to_string()),
            ("lastFailureCause", self.last_failure_cause.clone()),
            (
                "numberOfCompletedCheckpoints",
                self.completed_checkpoints.to_string(),
            ),
            (
                "numberOfFailedCheckpoints",
                self.failed_checkpoints.to_string(),
            ),
            (
                "lastCompletedCheckpointId",
                self.last_checkpoint_id.to_string(),
            ),
            (
                "lastCheckpointDuration",
                format!("{:.3}", self.last_checkpoint_duration_ms),
            ),
            ("lastCheckpointSize", self.last_checkpoint_size.to_string()),
            (
                "lastCheckpointRestoreTimestamp",
                self.last_restore_timestamp_ms.to_string(),
            ),
            (
                "checkpointAlignmentTime",
                format!("{:.3}", self.checkpoint_alignment_time_ms),
            ),
            (
                "lastRecoveryTime",
                format!("{:.3}", self.last_recovery_time_ms),
            ),
            (
                "lastRecoveredTimestamp",
                self.last_recovered_timestamp_ms.to_string(),
            ),
        ]
    }

    /// Reads `dir/metrics`; missing or unreadable figures are zero.
    pub fn load(dir: &Path) -> Metrics {
        let text = std::fs::read_to_string(dir.join("metrics")).unwrap_or_default();
        Metrics::parse(&text)
    }

    /// Parses the text of a metrics file.
    pub fn parse(text: &str) -> Metrics {
        let mut m = Metrics::default();
        for line in text.lines() {
            let Some((k, v)) = line.split_once(' ') else {
                continue;
            };
            let n = || v.parse::<u64>().unwrap_or(0);
            let f = || v.parse::<f64>().unwrap_or(0.0);
            match k {
                "state" => m.state = v.to_owned(),
                "supervisorPid" => m.supervisor_pid = v.parse().unwrap_or(0),
                "restartStrategy" => m.restart_strategy = v.to_owned(),
                "numRestarts" => m.num_restarts = n(),
                "lastFailureCause" => m.last_failure_cause = v.to_owned(),
                "numberOfCompletedCheckpoints" => m.completed_checkpoints = n(),
                "numberOfFailedCheckpoints" => m.failed_checkpoints = n(),
                "lastCompletedCheckpointId" => m.last_checkpoint_id = n(),
                "lastCheckpointDuration" => m.last_checkpoint_duration_ms = f(),
                "lastCheckpointSize" => m.last_checkpoint_size = n(),
                "lastCheckpointRestoreTimestamp" => m.last_restore_timestamp_ms = n(),
                "checkpointAlignmentTime" => m.checkpoint_alignment_time_ms = f(),
                "lastRecoveryTime" => m.last_recovery_time_ms = f(),
                "lastRecoveredTimestamp" => m.last_recovered_timestamp_ms = n(),
                _ => {}
            }
        }
        m
    }

    /// Replaces `dir/metrics` (a temporary file renamed over it; not synced: figures, not
    /// state).
    pub(crate) fn save(&self, dir: &Path) {
        let mut text = String::new();
        for (k, v) in self.figures() {
            let v: String = v.chars().map(|c| if c == '\n' { ' ' } else { c }).collect();
            let _ = writeln!(text, "{k} {v}");
        }
        let tmp = dir.join(".metrics.tmp");
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, dir.join("metrics"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_back_as_written() {
        let m = Metrics {
            state: "running".into(),
            num_restarts: 2,
            last_failure_cause: "instance a-0 was killed by signal 9 (SIGKILL)".into(),
            completed_checkpoints: 7,
            last_checkpoint_duration_ms: 1.5,
            last_recovered_timestamp_ms: 1_796_400_322_414,
            ..Metrics::default()
        };
        let dir = std::env::temp_dir().join(format!("shmflow-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        m.save(&dir);
        assert_eq!(Metrics::load(&dir), m);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
