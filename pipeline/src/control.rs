//! The control connection between the supervisor and each instance: a Unix socket pair, one
//! text line a message. Records never cross it; barriers travel in band through the gates.
//!
//! ```text
//! supervisor -> instance   T ID MODE FINAL    trigger checkpoint ID (sources): MODE a, u or tMS
//!                          C ID OLDEST        checkpoint ID is complete; OLDEST is the oldest kept
//!                          A ID               checkpoint ID is aborted: drop what is pending for it
//! instance -> supervisor   K ID BYTES ALIGNNS acknowledged ID durably: its file's size, alignment
//!                          F                  a source reached the end of its input
//!                          P                  the first record processed since the start
//!                          E OWN TEXT         the instance fails with this error (then exits);
//!                                             OWN 1: its own, 0: a consequence of a peer's
//! ```
//!
//! A line is at most [`MAX_LINE`] bytes; anything else is the peer's protocol error.

use std::io::{BufRead, BufReader, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use shmflow::Alignment;

pub(crate) const MAX_LINE: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToInstance {
    Trigger {
        id: u64,
        alignment: Alignment,
        last: bool,
    },
    Complete {
        id: u64,
        oldest: u64,
    },
    Abort {
        id: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FromInstance {
    Ack {
        id: u64,
        bytes: u64,
        alignment_ns: u64,
    },
    Finished,
    Processed,
    Error {
        own: bool,
        text: String,
    },
}

impl ToInstance {
    pub(crate) fn line(&self) -> String {
        match *self {
            ToInstance::Trigger {
                id,
                alignment,
                last,
            } => {
                let mode = match alignment {
                    Alignment::Unaligned => "u".to_owned(),
                    Alignment::AlignedWithTimeout(t) => format!("t{}", t.as_millis()),
                    _ => "a".to_owned(),
                };
                format!("T {id} {mode} {}\n", last as u8)
            }
            ToInstance::Complete { id, oldest } => format!("C {id} {oldest}\n"),
            ToInstance::Abort { id } => format!("A {id}\n"),
        }
    }

    pub(crate) fn parse(line: &str) -> Result<ToInstance, String> {
        let f: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| -> Result<u64, String> {
            f.get(i)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("control line {line:?}: field {i} is not a number"))
        };
        let msg = match (f[0], f.len()) {
            ("T", 4) => {
                let alignment = match f[2] {
                    "a" => Alignment::Aligned,
                    "u" => Alignment::Unaligned,
                    t => match t.strip_prefix('t').and_then(|ms| ms.parse().ok()) {
                        Some(ms) => Alignment::AlignedWithTimeout(Duration::from_millis(ms)),
                        None => return Err(format!("control line {line:?}: unknown alignment")),
                    },
                };
                let last = match f[3] {
                    "0" => false,
                    "1" => true,
                    _ => return Err(format!("control line {line:?}: FINAL is not 0 or 1")),
                };
                ToInstance::Trigger {
                    id: num(1)?,
                    alignment,
                    last,
                }
            }
            ("C", 3) => ToInstance::Complete {
                id: num(1)?,
                oldest: num(2)?,
            },
            ("A", 2) => ToInstance::Abort { id: num(1)? },
            _ => return Err(format!("control line {line:?}: not a message")),
        };
        Ok(msg)
    }
}

impl FromInstance {
    pub(crate) fn line(&self) -> String {
        match self {
            FromInstance::Ack {
                id,
                bytes,
                alignment_ns,
            } => format!("K {id} {bytes} {alignment_ns}\n"),
            FromInstance::Finished => "F\n".to_owned(),
            FromInstance::Processed => "P\n".to_owned(),
            FromInstance::Error { own, text } => {
                let mut t: String = text
                    .chars()
                    .map(|c| if c == '\n' { ' ' } else { c })
                    .collect();
                // A line stays under the limit (cut on a character boundary).
                while t.len() > MAX_LINE - 4 {
                    t.pop();
                }
                format!("E {} {t}\n", *own as u8)
            }
        }
    }

    pub(crate) fn parse(line: &str) -> Result<FromInstance, String> {
        if let Some(rest) = line.strip_prefix("E ") {
            let (own, text) = rest.split_once(' ').unwrap_or((rest, ""));
            let own = match own {
                "1" => true,
                "0" => false,
                _ => return Err(format!("control line {line:?}: OWN is not 0 or 1")),
            };
            return Ok(FromInstance::Error {
                own,
                text: text.to_owned(),
            });
        }
        let f: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| -> Result<u64, String> {
            f.get(i)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("control line {line:?}: field {i} is not a number"))
        };
        match (f[0], f.len()) {
            ("K", 4) => Ok(FromInstance::Ack {
                id: num(1)?,
                bytes: num(2)?,
                alignment_ns: num(3)?,
            }),
            ("F", 1) => Ok(FromInstance::Finished),
            ("P", 1) => Ok(FromInstance::Processed),
            _ => Err(format!("control line {line:?}: not a message")),
        }
    }
}

/// Reads lines of at most [`MAX_LINE`] bytes; `Ok(None)` at the end.
pub(crate) struct Lines {
    reader: BufReader<UnixStream>,
    buf: Vec<u8>,
}

impl Lines {
    pub(crate) fn new(stream: UnixStream) -> Lines {
        Lines {
            reader: BufReader::new(stream),
            buf: Vec::new(),
        }
    }

    /// The next line; `Err(LineError::Io)` when the connection failed (a peer that exits
    /// with unread data makes the other side's read fail with ECONNRESET), `Err(Protocol)`
    /// for what no peer of ours writes.
    pub(crate) fn next(&mut self) -> Result<Option<String>, LineError> {
        self.buf.clear();
        let n = Read::by_ref(&mut self.reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut self.buf)
            .map_err(LineError::Io)?;
        if n == 0 {
            return Ok(None);
        }
        if self.buf.last() != Some(&b'\n') {
            return Err(LineError::Protocol(match self.buf.len() > MAX_LINE {
                true => format!("control connection: a line over {MAX_LINE} bytes"),
                false => "control connection: cut in the middle of a line".to_owned(),
            }));
        }
        self.buf.pop();
        String::from_utf8(std::mem::take(&mut self.buf))
            .map(Some)
            .map_err(|_| LineError::Protocol("control connection: a line is not UTF-8".to_owned()))
    }
}

/// Why a control line could not be read.
#[derive(Debug)]
pub(crate) enum LineError {
    /// The connection failed.
    Io(std::io::Error),
    /// The peer wrote what the protocol does not allow.
    Protocol(String),
}

impl std::fmt::Display for LineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LineError::Io(e) => write!(f, "control connection: {e}"),
            LineError::Protocol(e) => f.write_str(e),
        }
    }
}

/// Writes one message; an error means the peer is gone. `MSG_NOSIGNAL`: a peer that has
/// gone is `EPIPE`, never a SIGPIPE (a program may have restored its default action).
pub(crate) fn send(stream: &mut UnixStream, line: &str) -> std::io::Result<()> {
    let mut buf = line.as_bytes();
    while !buf.is_empty() {
        // SAFETY: send(2) reads `buf.len()` bytes from a live slice, on a descriptor the
        // stream owns for the duration of the call.
        let n = unsafe {
            libc::send(
                stream.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn every_message_reads_back_as_written() {
        for m in [
            ToInstance::Trigger {
                id: 3,
                alignment: Alignment::AlignedWithTimeout(Duration::from_millis(50)),
                last: true,
            },
            ToInstance::Trigger {
                id: 4,
                alignment: Alignment::Unaligned,
                last: false,
            },
            ToInstance::Complete { id: 9, oldest: 7 },
            ToInstance::Abort { id: 2 },
        ] {
            assert_eq!(ToInstance::parse(m.line().trim_end()).unwrap(), m);
        }
        for m in [
            FromInstance::Ack {
                id: 1,
                bytes: 2,
                alignment_ns: 3,
            },
            FromInstance::Finished,
            FromInstance::Processed,
            FromInstance::Error {
                own: true,
                text: "a\nb".to_owned(),
            },
        ] {
            let back = FromInstance::parse(m.line().trim_end()).unwrap();
            match (&m, &back) {
                (FromInstance::Error { .. }, FromInstance::Error { text, own }) => {
                    assert_eq!((text.as_str(), *own), ("a b", true))
                }
                _ => assert_eq!(back, m),
            }
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for line in [
            "", "T", "T x a 0", "T 1 q 0", "T 1 a 2", "C 1", "K 1 2", "Z", "F 1", "A -1",
        ] {
            assert!(ToInstance::parse(line).is_err() || FromInstance::parse(line).is_err());
            let _ = FromInstance::parse(line);
        }
    }

    #[test]
    fn an_overlong_line_is_refused() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut lines = Lines::new(b);
        a.write_all(&vec![b'x'; MAX_LINE + 10]).unwrap();
        a.write_all(b"\n").unwrap();
        assert!(lines.next().unwrap_err().to_string().contains("over"));
        drop(a);
    }
}
