//! The frame format on the wire, after Flink's `NettyMessage`: every message is one frame,
//! little endian:
//!
//! ```text
//! length  u32   bytes that follow this field (8 + body)
//! magic   u32   0x5346_4E54 ("TNFS" in memory order): refuses a peer that is not shmflow
//! version u8    1
//! kind    u8    what follows (table below)
//! zero    u16   must be 0
//! body    …
//! ```
//!
//! | kind | message | direction | body |
//! |---|---|---|---|
//! | 1 | `Request` | receiver → sender | channel u32, credit u32, segment_size u32, name_len u16, name |
//! | 2 | `Buffer` | sender → receiver | channel u32, backlog u32, offset u32, zero u32, frames |
//! | 3 | `AddCredit` | receiver → sender | channel u32, credit u32 |
//! | 4 | `Close` | sender → receiver | channel u32, how u32 (0 clean, 1 failed, 2 producer dead) |
//! | 5 | `Cancel` | receiver → sender | channel u32 |
//! | 6 | `Error` | both | channel u32 (`CONNECTION` for all), code u32, len u16, message |
//! | 7 | `Heartbeat` | both | empty |
//! | 8 | `Priority` | sender → receiver | channel u32, kind u32, payload (≤ 248 bytes) |
//! | 9 | `Announce` | sender → receiver | channel u32, a barrier's announcement: id u64, sent u64, timeout u64, payload (24 to 248 bytes in all) |
//!
//! A `Buffer` carries published frames of one segment, byte for byte as they lie in the
//! sender's segment, to be written at `offset` of a segment of the receiver's: `offset` 0
//! starts a segment and spends one credit. Every length, id and count is checked before use;
//! the decoder never buffers more than the largest frame this side can accept.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::net::error::{LinkError, ProtocolError, RemoteCode};
use crate::protocol::abi::PRIO_PAYLOAD;
use crate::protocol::frame::{self, HEADER};

pub(crate) const MAGIC: u32 = 0x5346_4E54;
/// Bytes of every frame before its body: length, magic, version, kind, zero.
pub(crate) const PREFIX: usize = 12;
const VERSION: u8 = 1;
/// The `channel` of an `Error` about the whole connection.
pub(crate) const CONNECTION: u32 = u32::MAX;
/// Longest channel name.
pub(crate) const MAX_NAME: usize = 255;
/// Longest error message (longer ones are cut).
const MAX_MESSAGE: usize = 1024;
/// Body bytes of a `Buffer` before its frames.
pub(crate) const BUFFER_HEAD: usize = 16;
/// The largest body of any message but `Buffer`.
const MAX_CONTROL: usize = 16 + MAX_MESSAGE;

const K_REQUEST: u8 = 1;
pub(crate) const K_BUFFER: u8 = 2;
const K_ADD_CREDIT: u8 = 3;
const K_CLOSE: u8 = 4;
const K_CANCEL: u8 = 5;
const K_ERROR: u8 = 6;
const K_HEARTBEAT: u8 = 7;
const K_PRIORITY: u8 = 8;
const K_ANNOUNCE: u8 = 9;

/// How a sender's stream ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Closed {
    /// The producer closed the stream.
    Clean,
    /// The producer ended it as failed.
    Failed,
    /// The producer died (or was itself a bridge that lost its peer).
    ProducerDead,
}

/// Error codes of an `Error` message.
pub(crate) mod code {
    /// No channel of that name is exported (or it was requested already).
    pub(crate) const UNKNOWN_CHANNEL: u32 = 1;
    /// The two ends' segment sizes differ.
    pub(crate) const GEOMETRY: u32 = 2;
    /// The peer broke the protocol.
    pub(crate) const PROTOCOL: u32 = 3;
    /// The local end failed (a shared-memory error).
    pub(crate) const LOCAL: u32 = 4;
}

impl RemoteCode {
    /// The code as the wire carries it.
    fn from_wire(c: u32) -> RemoteCode {
        match c {
            code::UNKNOWN_CHANNEL => RemoteCode::UnknownChannel,
            code::GEOMETRY => RemoteCode::SegmentSize,
            code::PROTOCOL => RemoteCode::Protocol,
            code::LOCAL => RemoteCode::LocalFailure,
            other => RemoteCode::Other(other),
        }
    }
}

impl LinkError {
    /// The peer's `Error` message, its code named.
    pub(crate) fn remote(code: u32, message: String) -> LinkError {
        LinkError::Remote {
            code: RemoteCode::from_wire(code),
            message,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Msg {
    Request {
        channel: u32,
        credit: u32,
        segment_size: u32,
        name: String,
    },
    Buffer {
        channel: u32,
        backlog: u32,
        offset: u32,
        frames: Bytes,
    },
    AddCredit {
        channel: u32,
        credit: u32,
    },
    Close {
        channel: u32,
        how: Closed,
    },
    Cancel {
        channel: u32,
    },
    Error {
        channel: u32,
        code: u32,
        message: String,
    },
    Heartbeat,
    Priority {
        channel: u32,
        kind: u32,
        payload: Bytes,
    },
    /// A checkpoint barrier's announcement from the sender's priority lane (its body, as
    /// `protocol::barrier` lays it out).
    Announce {
        channel: u32,
        payload: Bytes,
    },
}

fn put_prefix(dst: &mut BytesMut, kind: u8, body: usize) {
    dst.put_u32_le((8 + body) as u32);
    dst.put_u32_le(MAGIC);
    dst.put_u8(VERSION);
    dst.put_u8(kind);
    dst.put_u16_le(0);
}

/// Appends the frame head of a `Buffer` of `len` frame bytes (the frames follow it).
pub(crate) fn put_buffer_head(
    dst: &mut BytesMut,
    channel: u32,
    backlog: u32,
    offset: u32,
    len: usize,
) {
    put_prefix(dst, K_BUFFER, BUFFER_HEAD + len);
    dst.put_u32_le(channel);
    dst.put_u32_le(backlog);
    dst.put_u32_le(offset);
    dst.put_u32_le(0);
}

impl Msg {
    /// The channel it is about (`CONNECTION` for a heartbeat).
    pub(crate) fn channel(&self) -> u32 {
        match self {
            Msg::Request { channel, .. }
            | Msg::Buffer { channel, .. }
            | Msg::AddCredit { channel, .. }
            | Msg::Close { channel, .. }
            | Msg::Cancel { channel }
            | Msg::Error { channel, .. }
            | Msg::Priority { channel, .. }
            | Msg::Announce { channel, .. } => *channel,
            Msg::Heartbeat => CONNECTION,
        }
    }

    /// Its kind, as the protocol names it.
    fn kind_name(&self) -> &'static str {
        match self {
            Msg::Request { .. } => "Request",
            Msg::Buffer { .. } => "Buffer",
            Msg::AddCredit { .. } => "AddCredit",
            Msg::Close { .. } => "Close",
            Msg::Cancel { .. } => "Cancel",
            Msg::Error { .. } => "Error",
            Msg::Heartbeat => "Heartbeat",
            Msg::Priority { .. } => "Priority",
            Msg::Announce { .. } => "Announce",
        }
    }

    /// What receiving this message is when a peer of that role (`"sender"`, `"receiver"`)
    /// never sends it.
    pub(crate) fn wrong_direction(&self, role: &str) -> ProtocolError {
        ProtocolError::Channel {
            channel: self.channel(),
            detail: format!("{} is not something a {role} sends", self.kind_name()),
        }
    }

    /// Appends this message as one frame.
    pub(crate) fn encode(&self, dst: &mut BytesMut) {
        match self {
            Msg::Request {
                channel,
                credit,
                segment_size,
                name,
            } => {
                let name = &name.as_bytes()[..name.len().min(MAX_NAME)];
                put_prefix(dst, K_REQUEST, 14 + name.len());
                dst.put_u32_le(*channel);
                dst.put_u32_le(*credit);
                dst.put_u32_le(*segment_size);
                dst.put_u16_le(name.len() as u16);
                dst.put_slice(name);
            }
            Msg::Buffer {
                channel,
                backlog,
                offset,
                frames,
            } => {
                put_buffer_head(dst, *channel, *backlog, *offset, frames.len());
                dst.put_slice(frames);
            }
            Msg::AddCredit { channel, credit } => {
                put_prefix(dst, K_ADD_CREDIT, 8);
                dst.put_u32_le(*channel);
                dst.put_u32_le(*credit);
            }
            Msg::Close { channel, how } => {
                put_prefix(dst, K_CLOSE, 8);
                dst.put_u32_le(*channel);
                dst.put_u32_le(match how {
                    Closed::Clean => 0,
                    Closed::Failed => 1,
                    Closed::ProducerDead => 2,
                });
            }
            Msg::Cancel { channel } => {
                put_prefix(dst, K_CANCEL, 4);
                dst.put_u32_le(*channel);
            }
            Msg::Error {
                channel,
                code,
                message,
            } => {
                let mut cut = message.len().min(MAX_MESSAGE);
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                put_prefix(dst, K_ERROR, 10 + cut);
                dst.put_u32_le(*channel);
                dst.put_u32_le(*code);
                dst.put_u16_le(cut as u16);
                dst.put_slice(&message.as_bytes()[..cut]);
            }
            Msg::Heartbeat => put_prefix(dst, K_HEARTBEAT, 0),
            Msg::Priority {
                channel,
                kind,
                payload,
            } => {
                put_prefix(dst, K_PRIORITY, 8 + payload.len());
                dst.put_u32_le(*channel);
                dst.put_u32_le(*kind);
                dst.put_slice(payload);
            }
            Msg::Announce { channel, payload } => {
                put_prefix(dst, K_ANNOUNCE, 4 + payload.len());
                dst.put_u32_le(*channel);
                dst.put_slice(payload);
            }
        }
    }
}

/// Decodes frames, refusing any longer than `max_frames` bytes of segment data (the largest
/// segment this side accepts) or than a control message can be.
#[derive(Debug)]
pub(crate) struct Codec {
    max_body: usize,
}

impl Codec {
    /// A decoder for a side that accepts `Buffer`s of up to `max_frames` bytes (0: a side that
    /// receives no `Buffer`).
    pub(crate) fn new(max_frames: usize) -> Codec {
        Codec {
            max_body: (BUFFER_HEAD + max_frames).max(MAX_CONTROL),
        }
    }
}

fn need(body: &Bytes, n: usize, what: &'static str) -> Result<(), ProtocolError> {
    if body.len() < n {
        return Err(ProtocolError::Malformed {
            what,
            detail: format!("body of {} bytes, at least {n} needed", body.len()),
        });
    }
    Ok(())
}

fn exact(body: &Bytes, n: usize, what: &'static str) -> Result<(), ProtocolError> {
    if body.len() != n {
        return Err(ProtocolError::Malformed {
            what,
            detail: format!("body of {} bytes, {n} expected", body.len()),
        });
    }
    Ok(())
}

fn utf8(b: Bytes, what: &'static str) -> Result<String, ProtocolError> {
    String::from_utf8(b.to_vec()).map_err(|_| ProtocolError::Malformed {
        what,
        detail: "not UTF-8".into(),
    })
}

impl tokio_util::codec::Decoder for Codec {
    type Item = Msg;
    type Error = LinkError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Msg>, LinkError> {
        self.decode_frame(src).map_err(LinkError::Protocol)
    }
}

/// A message found in a read buffer by [`Codec::peek`]: a `Buffer`'s frames borrowed from
/// it (to be copied once, into a segment), anything else decoded.
#[derive(Debug)]
pub(crate) enum Peeked<'a> {
    Buffer {
        channel: u32,
        backlog: u32,
        offset: u32,
        frames: &'a [u8],
    },
    Other(Msg),
}

/// The head of a `Buffer`'s body: channel, backlog, offset (the reserved word checked).
pub(crate) fn buffer_head(b: &[u8]) -> Result<(u32, u32, u32), ProtocolError> {
    if b.len() < BUFFER_HEAD + HEADER {
        return Err(ProtocolError::Malformed {
            what: "Buffer",
            detail: format!(
                "body of {} bytes, at least {} needed",
                b.len(),
                BUFFER_HEAD + HEADER
            ),
        });
    }
    let word = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    if word(12) != 0 {
        return Err(ProtocolError::Malformed {
            what: "Buffer",
            detail: "reserved word set".into(),
        });
    }
    Ok((word(0), word(4), word(8)))
}

impl Codec {
    /// The head of the frame at the start of `src`, checked (length, magic, version,
    /// reserved bits) as soon as its 12 bytes are there: the frame's total length and kind.
    pub(crate) fn head(&self, src: &[u8]) -> Result<Option<(usize, u8)>, ProtocolError> {
        if src.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes(src[..4].try_into().expect("4 bytes")) as usize;
        if len < 8 || len - 8 > self.max_body {
            return Err(ProtocolError::FrameLength {
                found: len as u64,
                max: (8 + self.max_body) as u64,
            });
        }
        if src.len() < PREFIX {
            return Ok(None);
        }
        let magic = u32::from_le_bytes(src[4..8].try_into().expect("4 bytes"));
        if magic != MAGIC {
            return Err(ProtocolError::Magic { found: magic });
        }
        if src[8] != VERSION {
            return Err(ProtocolError::Version {
                found: src[8],
                supported: VERSION,
            });
        }
        if src[10] != 0 || src[11] != 0 {
            return Err(ProtocolError::Malformed {
                what: "frame head",
                detail: "reserved bits set".into(),
            });
        }
        Ok(Some((4 + len, src[9])))
    }

    /// The frame at the start of `src`, its head checked: `Ok((total bytes, kind))` once all
    /// of it is there, `Err(n)` while only `n` bytes of it could be (the whole frame once its
    /// length is known).
    fn frame_at(&self, src: &[u8]) -> Result<Result<(usize, u8), usize>, ProtocolError> {
        Ok(match self.head(src)? {
            Some((total, kind)) if src.len() >= total => Ok((total, kind)),
            Some((total, _)) => Err(total),
            None if src.len() < 4 => Err(4),
            None => Err(4 + u32::from_le_bytes(src[..4].try_into().expect("4 bytes")) as usize),
        })
    }

    /// The length of the message at the start of `src` once all of it is there (its head
    /// checked).
    pub(crate) fn peek_len(&self, src: &[u8]) -> Result<Option<usize>, ProtocolError> {
        Ok(self.frame_at(src)?.ok().map(|(total, _)| total))
    }

    /// The message at the start of `src`, checked as [`Codec`] checks it, without taking it
    /// out: its length and the message (`None` until all of it is there). A `Buffer`'s
    /// frames stay in `src`.
    pub(crate) fn peek<'a>(
        &self,
        src: &'a [u8],
    ) -> Result<Option<(usize, Peeked<'a>)>, ProtocolError> {
        let (total, kind) = match self.frame_at(src)? {
            Ok(f) => f,
            Err(_) => return Ok(None),
        };
        let body = &src[PREFIX..total];
        if kind == K_BUFFER {
            let (channel, backlog, offset) = buffer_head(body)?;
            return Ok(Some((
                total,
                Peeked::Buffer {
                    channel,
                    backlog,
                    offset,
                    frames: &body[BUFFER_HEAD..],
                },
            )));
        }
        let msg = self.body(kind, Bytes::copy_from_slice(body))?;
        Ok(Some((total, Peeked::Other(msg))))
    }

    fn decode_frame(&mut self, src: &mut BytesMut) -> Result<Option<Msg>, ProtocolError> {
        let total = match self.frame_at(src)? {
            Ok((total, _)) => total,
            Err(need) => {
                // Bounded: the length was checked.
                src.reserve(need.saturating_sub(src.len()));
                return Ok(None);
            }
        };
        let kind = src[9];
        let mut f = src.split_to(total).freeze();
        f.advance(PREFIX);
        self.body(kind, f).map(Some)
    }

    /// The message of `kind` whose body is `b`.
    fn body(&self, kind: u8, mut b: Bytes) -> Result<Msg, ProtocolError> {
        let msg = match kind {
            K_REQUEST => {
                need(&b, 14, "Request")?;
                let channel = b.get_u32_le();
                let credit = b.get_u32_le();
                let segment_size = b.get_u32_le();
                let n = b.get_u16_le() as usize;
                if n > MAX_NAME {
                    return Err(ProtocolError::Malformed {
                        what: "Request",
                        detail: format!("name of {n} bytes, at most {MAX_NAME}"),
                    });
                }
                exact(&b, n, "Request name")?;
                Msg::Request {
                    channel,
                    credit,
                    segment_size,
                    name: utf8(b, "Request name")?,
                }
            }
            K_BUFFER => {
                let (channel, backlog, offset) = buffer_head(&b)?;
                b.advance(BUFFER_HEAD);
                Msg::Buffer {
                    channel,
                    backlog,
                    offset,
                    frames: b,
                }
            }
            K_ADD_CREDIT => {
                exact(&b, 8, "AddCredit")?;
                Msg::AddCredit {
                    channel: b.get_u32_le(),
                    credit: b.get_u32_le(),
                }
            }
            K_CLOSE => {
                exact(&b, 8, "Close")?;
                let channel = b.get_u32_le();
                let how = match b.get_u32_le() {
                    0 => Closed::Clean,
                    1 => Closed::Failed,
                    2 => Closed::ProducerDead,
                    other => {
                        return Err(ProtocolError::Malformed {
                            what: "Close",
                            detail: format!("end {other}, expected 0, 1 or 2"),
                        })
                    }
                };
                Msg::Close { channel, how }
            }
            K_CANCEL => {
                exact(&b, 4, "Cancel")?;
                Msg::Cancel {
                    channel: b.get_u32_le(),
                }
            }
            K_ERROR => {
                need(&b, 10, "Error")?;
                let channel = b.get_u32_le();
                let code = b.get_u32_le();
                let n = b.get_u16_le() as usize;
                if n > MAX_MESSAGE {
                    return Err(ProtocolError::Malformed {
                        what: "Error",
                        detail: format!("message of {n} bytes, at most {MAX_MESSAGE}"),
                    });
                }
                exact(&b, n, "Error message")?;
                Msg::Error {
                    channel,
                    code,
                    message: String::from_utf8_lossy(&b).into_owned(),
                }
            }
            K_HEARTBEAT => {
                exact(&b, 0, "Heartbeat")?;
                Msg::Heartbeat
            }
            K_PRIORITY => {
                need(&b, 8, "Priority")?;
                let channel = b.get_u32_le();
                let kind = b.get_u32_le();
                if b.len() > PRIO_PAYLOAD {
                    return Err(ProtocolError::Malformed {
                        what: "Priority",
                        detail: format!("payload of {} bytes, at most {PRIO_PAYLOAD}", b.len()),
                    });
                }
                Msg::Priority {
                    channel,
                    kind,
                    payload: b,
                }
            }
            K_ANNOUNCE => {
                need(&b, 4, "Announce")?;
                let channel = b.get_u32_le();
                if b.len() < crate::protocol::barrier::HEAD || b.len() > PRIO_PAYLOAD {
                    return Err(ProtocolError::Malformed {
                        what: "Announce",
                        detail: format!(
                            "a barrier of {} bytes, from {} to {PRIO_PAYLOAD}",
                            b.len(),
                            crate::protocol::barrier::HEAD
                        ),
                    });
                }
                Msg::Announce {
                    channel,
                    payload: b,
                }
            }
            other => return Err(ProtocolError::Kind { found: other }),
        };
        Ok(msg)
    }
}

/// What [`check_frames`] found in a run of frames that passed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Frames {
    /// They finish the segment (a SEAL, or its last byte).
    pub(crate) ends: bool,
    /// The records and payload they carry, counted as they were checked.
    pub(crate) tally: frame::Tally,
}

/// Checks that `frames`, to be written at `offset` of a segment of `seg_size` bytes, are
/// whole shmflow frames that may stand there (`in_span`: a spanning record is open before
/// them; updated), and counts what they carry.
pub(crate) fn check_frames(
    offset: usize,
    frames: &[u8],
    seg_size: usize,
    in_span: &mut bool,
) -> Result<Frames, ProtocolError> {
    let Some((first, rest)) = frames.split_first_chunk::<HEADER>() else {
        return Err(misfit(offset, frames.len(), seg_size));
    };
    check_frames_split(offset, u64::from_le_bytes(*first), rest, seg_size, in_span)
}

/// [`check_frames`] for frames whose first header word is `first` and whose other bytes are
/// `rest` (read straight into a segment, the first header word kept out until the commit).
/// One pass: every frame is checked and counted where it is read.
pub(crate) fn check_frames_split(
    offset: usize,
    first: u64,
    rest: &[u8],
    seg_size: usize,
    in_span: &mut bool,
) -> Result<Frames, ProtocolError> {
    let len = HEADER + rest.len();
    let end = offset.saturating_add(len);
    if offset % 8 != 0 || end > seg_size {
        return Err(misfit(offset, len, seg_size));
    }
    let mut at = offset;
    let mut word = first;
    let mut span = *in_span;
    let mut tally = frame::Tally::default();
    let mut ends = false;
    // Here `at + HEADER <= end` and `word` is the header at `at`.
    loop {
        // The common frame first: a whole record outside a spanning one that ends within
        // the buffer (so within the segment: `end <= seg_size`), as `frame::check` accepts it.
        let (len, kind) = frame::decode(word);
        let next = frame::next_frame(at, len as usize);
        if kind == frame::WHOLE && !span && next <= end {
            tally.records += 1;
            tally.payload += len as u64;
            let step = next - at;
            at = next;
            // A run of records of one length: the same header word at the place the last
            // frame's step gives is the same frame, accepted as the one before was, and the
            // place of each does not wait for the header before (no chain of dependent
            // loads). Anything else goes through the checks below.
            while at + step <= end {
                let i = at - offset - HEADER;
                match rest.get(i..i + HEADER) {
                    Some(w) if u64::from_le_bytes(w.try_into().expect("8 bytes")) == word => {
                        tally.records += 1;
                        tally.payload += len as u64;
                        at += step;
                    }
                    _ => break,
                }
            }
        } else {
            let (f, next) = check_frame(at, word, end, seg_size, span)?;
            span = frame::span_after(f.kind, span);
            tally.add(f.kind, f.len);
            ends |= f.kind == frame::SEAL;
            at = next;
        }
        if at == end {
            break;
        }
        // The next header, from `rest` (which starts a header after `offset`).
        let i = at - offset - HEADER;
        match rest.get(i..i + HEADER) {
            Some(w) => word = u64::from_le_bytes(w.try_into().expect("8 bytes")),
            None => {
                return Err(ProtocolError::Malformed {
                    what: "Buffer",
                    detail: format!("a partial frame header at offset {at}"),
                })
            }
        }
    }
    *in_span = span;
    Ok(Frames {
        ends: ends || end + HEADER > seg_size,
        tally,
    })
}

/// Checks any frame (the header `word` at `at`, in a buffer that ends at `end`; `in_span`: a
/// spanning record is open): the frame, and the offset past it (past a SEAL only if it ends
/// the buffer).
#[inline(never)]
fn check_frame(
    at: usize,
    word: u64,
    end: usize,
    seg_size: usize,
    in_span: bool,
) -> Result<(frame::Checked, usize), ProtocolError> {
    let f = frame::check(at, word, seg_size, in_span).map_err(|v| ProtocolError::Frame {
        field: v.field,
        expected: v.expected,
        found: v.found,
    })?;
    let next = if f.kind == frame::SEAL {
        at + HEADER
    } else {
        frame::next_frame(at, f.len)
    };
    if next > end {
        return Err(ProtocolError::Malformed {
            what: "Buffer",
            detail: format!("the frame at offset {at} runs past the end of the buffer"),
        });
    }
    if f.kind == frame::SEAL && next != end {
        return Err(ProtocolError::Malformed {
            what: "Buffer",
            detail: "bytes after a SEAL frame".into(),
        });
    }
    Ok((f, next))
}

/// `len` bytes at `offset` that cannot be frames of a segment of `seg_size` bytes.
fn misfit(offset: usize, len: usize, seg_size: usize) -> ProtocolError {
    ProtocolError::Malformed {
        what: "Buffer",
        detail: format!("{len} bytes at offset {offset} do not fit a segment of {seg_size} bytes"),
    }
}

#[cfg(test)]
mod tests;
