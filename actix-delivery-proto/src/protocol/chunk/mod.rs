//! Large messages as chunks: what a chunk says about its message, the rules a consumer checks
//! before it buffers one, how a producer splits an encoded message, and how a consumer reads
//! the reassembled message back. Pure: no I/O, no runtime.
//!
//! # The rules
//!
//! A producer with `chunk_size` encodes each message once and splits the bytes into chunks of
//! `chunk_size` bytes (the last one shorter). A message of `n` chunks takes `n` consecutive
//! seqs; each chunk is a delivery of its own, with its own window slot and retransmission, and
//! carries a [`ChunkHeader`]: its message's first seq, its number of chunks and its length in
//! bytes. The chunk of seq `s` is the message's chunk `s - first_seq`.
//!
//! - **Consumer.** A chunk is admitted only if its header is possible ([`check`]); a message longer
//!   than `max_message_bytes` is a dead letter. Chunks are buffered per producer incarnation, one
//!   message at a time ([`reassembly`]): a message reserves its room with its first chunk (bounded
//!   per message and in total), lives at most `reassembly_grace` plus its length at
//!   `min_reassembly_rate`, and gets room in the order it was first seen, or at once within its
//!   share. A buffered chunk that is not the last is ACKed at once (so a window smaller than a
//!   message's chunk count cannot deadlock); the last chunk is ACKed only when the handler
//!   succeeded on the whole message, so **its ACK confirms the message**. The handler runs once, on
//!   the reassembled body, never on a part. On success every seq of the message is recorded as
//!   handled (a range), so the dedup window's `contiguous` mark passes the chunk seqs and nothing
//!   of them stays above it.
//! - **Producer** ([`producer`]). A message is confirmed once, by its last chunk's ACK. Its
//!   `window_start` never passes its first seq before then, so a consumer that starts a fresh
//!   window (a restart, an eviction) still admits every chunk of it. When the last chunk goes
//!   unconfirmed for a `resend_timeout` while every other chunk was ACKed, the consumer may
//!   have lost them (a restart, an eviction, a failed handler): every chunk of the message is
//!   sent again, from the first, through the window (a *round*). A chunk given up after
//!   `max_attempts` gives its whole message up.

pub(crate) mod header;
pub mod producer;
pub mod reassembly;

use std::collections::VecDeque;
use std::io::{self, Read, Write};

use bytes::{Buf, Bytes};

pub use crate::protocol::chunk::header::{ChunkFault, ChunkHeader};
use crate::protocol::envelope::{DeadLetterReason, Header, MAX_SEQ};

/// Checks a chunk's header (of a delivery that passed
/// [`admit`](crate::protocol::envelope::admit)) and its length against the consumer's
/// `max_message_bytes` and `max_reassembly_bytes`.
///
/// # Errors
/// [`DeadLetterReason::InvalidChunk`] naming the first broken rule, or
/// [`DeadLetterReason::MessageTooLarge`].
pub fn check(
    header: &Header,
    chunk: &ChunkHeader,
    len: usize,
    max_message_bytes: u64,
    max_reassembly_bytes: u64,
) -> Result<(), DeadLetterReason> {
    let fault = if chunk.chunks == 0 {
        Some(ChunkFault::NoChunks)
    } else if chunk.first_seq == 0
        || chunk.first_seq.saturating_add(u64::from(chunk.chunks) - 1) > MAX_SEQ
        || chunk.index_of(header.seq).is_none()
    {
        Some(ChunkFault::OutsideMessage)
    } else if header.window_start > chunk.first_seq {
        Some(ChunkFault::WindowStartPastMessage)
    } else if len == 0 {
        Some(ChunkFault::Empty)
    } else if len as u64 > chunk.message_len || u64::from(chunk.chunks) > chunk.message_len {
        Some(ChunkFault::LongerThanMessage)
    } else {
        None
    };
    if let Some(fault) = fault {
        return Err(DeadLetterReason::InvalidChunk(fault));
    }
    if chunk.message_len > max_message_bytes {
        return Err(DeadLetterReason::MessageTooLarge {
            len: chunk.message_len,
            max: max_message_bytes,
        });
    }
    if reassembly::reservation(chunk) > max_reassembly_bytes {
        return Err(DeadLetterReason::InvalidChunk(ChunkFault::TooManyChunks));
    }
    Ok(())
}

/// `message` split into chunks of `chunk_size` bytes (positive), the last one shorter: views
/// of the same bytes, not copies. An empty message is one empty chunk.
pub fn split(message: &Bytes, chunk_size: usize) -> Vec<Bytes> {
    if message.is_empty() {
        return vec![Bytes::new()];
    }
    (0..message.len())
        .step_by(chunk_size.max(1))
        .map(|start| message.slice(start..(start + chunk_size).min(message.len())))
        .collect()
}

/// `message` split into exactly `chunks` chunks, none empty, none longer than `max_chunk`,
/// their lengths differing by one at most: views of the same bytes, not copies. `None` when
/// it cannot be (the message is shorter than `chunks` bytes, or longer than `chunks` ×
/// `max_chunk`).
pub fn split_into(message: &Bytes, chunks: u32, max_chunk: usize) -> Option<Vec<Bytes>> {
    let (len, count) = (message.len(), chunks as usize);
    if count == 0 || len < count || len.div_ceil(count) > max_chunk {
        return None;
    }
    let (short, longer) = (len / count, len % count);
    let mut start = 0;
    let pieces = (0..count).map(|index| {
        let end = start + short + usize::from(index < longer);
        let piece = message.slice(start..end);
        start = end;
        piece
    });
    Some(pieces.collect())
}

/// Where a message is encoded to be sent in chunks: every chunk is its own buffer of exactly
/// `chunk_size` bytes (the last one shorter), filled as the encoder writes, so a message is
/// never held in one growing buffer (which would double its memory while it grows). The first
/// chunk grows as it is written (a small message takes what it needs, not a whole chunk);
/// once one is full, the next ones are allocated whole.
#[derive(Debug)]
pub struct ChunkWriter {
    chunk_size: usize,
    chunks: Vec<Bytes>,
    current: Vec<u8>,
    len: u64,
}

impl ChunkWriter {
    /// Chunks of `chunk_size` bytes (positive).
    pub fn new(chunk_size: usize) -> Self {
        Self {
            chunk_size: chunk_size.max(1),
            chunks: Vec::new(),
            current: Vec::new(),
            len: 0,
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunks written (at least one).
    pub fn finish(mut self) -> Vec<Bytes> {
        if !self.current.is_empty() || self.chunks.is_empty() {
            self.chunks
                .push(Bytes::from(std::mem::take(&mut self.current)));
        }
        self.chunks
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(self.chunk_size - self.current.len());
        let len = self.current.len();
        if self.current.capacity() - len < n {
            let grown = (len + n).max(2 * self.current.capacity());
            let want = match self.chunks.is_empty() {
                true => grown.min(self.chunk_size),
                false => self.chunk_size,
            };
            self.current.reserve_exact(want - len);
        }
        self.current.extend_from_slice(&buf[..n]);
        self.len += n as u64;
        if self.current.len() == self.chunk_size {
            self.chunks
                .push(Bytes::from(std::mem::take(&mut self.current)));
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A reassembled message: its chunks in order, read as one stream of bytes. Each chunk is
/// released as soon as it has been read, so decoding the message does not hold its bytes
/// twice.
#[derive(Debug, Default)]
pub struct Assembled {
    parts: VecDeque<Bytes>,
    len: u64,
}

impl Assembled {
    /// The message made of `parts`, in order.
    pub fn new(parts: impl IntoIterator<Item = Bytes>) -> Self {
        let parts: VecDeque<Bytes> = parts.into_iter().filter(|p| !p.is_empty()).collect();
        let len = parts.iter().map(|p| p.len() as u64).sum();
        Self { parts, len }
    }

    /// Bytes not read yet.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether everything was read.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The next `length` bytes as a view, read, if they are all in the current chunk.
    pub fn front(&mut self, length: usize) -> Option<Bytes> {
        let front = self.parts.front_mut()?;
        if length > front.len() {
            return None;
        }
        let bytes = front.split_to(length);
        self.consumed(length);
        Some(bytes)
    }

    /// Reads the next `length` bytes (at most what is left) onto the end of `out`.
    pub fn read_into(&mut self, length: usize, out: &mut Vec<u8>) {
        let mut left = length;
        while left > 0 {
            let Some(front) = self.parts.front_mut() else {
                return;
            };
            let n = left.min(front.len());
            out.extend_from_slice(&front[..n]);
            front.advance(n);
            self.consumed(n);
            left -= n;
        }
    }

    /// Accounts for `n` bytes read from the current chunk, releasing it once it is all read
    /// (decoding holds no chunk it has read).
    fn consumed(&mut self, n: usize) {
        if self.parts.front().is_some_and(Bytes::is_empty) {
            self.parts.pop_front();
        }
        self.len -= n as u64;
    }

    /// The bytes not read yet, in one buffer (a copy, unless they are in one chunk).
    pub fn into_bytes(mut self) -> Bytes {
        match self.parts.len() {
            0 => Bytes::new(),
            1 => self.parts.pop_front().unwrap_or_default(),
            _ => {
                let mut all = Vec::with_capacity(usize::try_from(self.len).unwrap_or(0));
                for part in self.parts.drain(..) {
                    all.extend_from_slice(&part);
                }
                Bytes::from(all)
            }
        }
    }
}

impl Read for Assembled {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(front) = self.parts.front_mut() else {
            return Ok(0);
        };
        let n = buf.len().min(front.len());
        buf[..n].copy_from_slice(&front[..n]);
        front.advance(n);
        self.consumed(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::chunk::ChunkFault::*;
    use crate::protocol::envelope::{Incarnation, ProducerId};

    fn header(seq: u64, window_start: u64) -> Header {
        Header {
            producer_id: ProducerId::from("p"),
            incarnation: Incarnation::from_u128(1),
            seq,
            window_start,
            trace_context: None,
            chunk: None,
        }
    }

    fn chunk(first_seq: u64, chunks: u32, message_len: u64) -> ChunkHeader {
        ChunkHeader {
            first_seq,
            chunks,
            message_len,
        }
    }

    fn fault(seq: u64, window_start: u64, c: ChunkHeader, len: usize) -> Option<ChunkFault> {
        match check(&header(seq, window_start), &c, len, 1000, 4096) {
            Ok(()) => None,
            Err(DeadLetterReason::InvalidChunk(fault)) => Some(fault),
            Err(other) => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_chunk_is_one_of_its_messages_seqs_no_longer_than_the_message() {
        assert_eq!(fault(5, 5, chunk(5, 3, 30), 10), None);
        assert_eq!(fault(7, 1, chunk(5, 3, 30), 10), None, "the last chunk");
        assert_eq!(fault(8, 5, chunk(5, 3, 30), 10), Some(OutsideMessage));
        assert_eq!(fault(4, 1, chunk(5, 3, 30), 10), Some(OutsideMessage));
        assert_eq!(fault(1, 1, chunk(0, 3, 30), 10), Some(OutsideMessage));
        assert_eq!(fault(5, 5, chunk(5, 0, 30), 10), Some(NoChunks));
        assert_eq!(
            fault(6, 6, chunk(5, 3, 30), 10),
            Some(WindowStartPastMessage)
        );
        assert_eq!(fault(5, 5, chunk(5, 3, 30), 0), Some(Empty));
        assert_eq!(fault(5, 5, chunk(5, 3, 30), 31), Some(LongerThanMessage));
        assert_eq!(fault(5, 5, chunk(5, 3, 2), 1), Some(LongerThanMessage));
        let beyond = chunk(MAX_SEQ - 1, 3, 30);
        assert_eq!(fault(MAX_SEQ - 1, 1, beyond, 10), Some(OutsideMessage));
        assert_eq!(fault(MAX_SEQ, 1, chunk(MAX_SEQ - 2, 3, 30), 10), None);
        assert_eq!(
            fault(1, 1, chunk(1, 32, 1000), 10),
            None,
            "32 × 128 bytes fit"
        );
        assert_eq!(fault(1, 1, chunk(1, 33, 1000), 10), Some(TooManyChunks));
    }

    #[test]
    fn a_message_over_max_message_bytes_is_refused_by_its_announced_length() {
        assert_eq!(
            check(&header(1, 1), &chunk(1, 2, 1001), 10, 1000, 1000),
            Err(DeadLetterReason::MessageTooLarge {
                len: 1001,
                max: 1000
            })
        );
        assert_eq!(
            check(&header(1, 1), &chunk(1, 2, 1000), 10, 1000, 1000),
            Ok(())
        );
    }

    #[test]
    fn splitting_makes_views_of_chunk_size_bytes_the_last_one_shorter() {
        let message = Bytes::from((0..10u8).collect::<Vec<_>>());
        let chunks = split(&message, 4);
        assert_eq!(chunks, [&[0, 1, 2, 3][..], &[4, 5, 6, 7], &[8, 9]]);
        assert_eq!(
            chunks[1].as_ptr(),
            message[4..].as_ptr(),
            "a view, not a copy"
        );
        assert_eq!(split(&message, 5).len(), 2);
        assert_eq!(split(&Bytes::new(), 4), [Bytes::new()], "one empty chunk");
        let header = chunk(10, 3, 10);
        assert_eq!(header.last_seq(), 12);
        assert_eq!(header.index_of(11), Some(1));
        assert_eq!(header.index_of(13), None);
        assert_eq!(header.index_of(9), None);
    }

    #[test]
    fn splitting_into_a_given_number_of_chunks_spreads_the_bytes_evenly_or_says_it_cannot() {
        let message = Bytes::from((0..10u8).collect::<Vec<_>>());
        let chunks = split_into(&message, 3, 4).unwrap();
        assert_eq!(chunks, [&[0, 1, 2, 3][..], &[4, 5, 6], &[7, 8, 9]]);
        assert_eq!(chunks[1].as_ptr(), message[4..].as_ptr(), "views");
        assert_eq!(split_into(&message, 10, 1).unwrap().len(), 10);
        assert_eq!(split_into(&message, 2, 4), None, "longer than 2 × 4");
        assert_eq!(split_into(&message, 11, 4), None, "an empty chunk");
        assert_eq!(split_into(&message, 0, 4), None);
    }

    #[test]
    fn a_chunk_writer_fills_buffers_of_exactly_chunk_size_bytes() {
        let mut writer = ChunkWriter::new(4);
        writer.write_all(b"ab").unwrap();
        writer.write_all(b"cdefghij").unwrap();
        assert_eq!(writer.len(), 10);
        let chunks = writer.finish();
        assert_eq!(chunks, [&b"abcd"[..], b"efgh", b"ij"]);
        let mut exact = ChunkWriter::new(4);
        exact.write_all(b"abcd").unwrap();
        assert_eq!(
            exact.finish(),
            [&b"abcd"[..]],
            "no empty chunk after a full one"
        );
        assert_eq!(ChunkWriter::new(4).finish(), [Bytes::new()]);
    }

    #[test]
    fn a_chunk_writer_reserves_no_whole_chunk_for_a_small_message() {
        let mut small = ChunkWriter::new(16 << 20);
        small.write_all(&[7; 100]).unwrap();
        assert!(
            small.current.capacity() < 1024,
            "{} bytes reserved for 100",
            small.current.capacity()
        );
        assert_eq!(small.finish(), [vec![7; 100]]);
        let mut large = ChunkWriter::new(4096);
        for _ in 0..10 {
            large.write_all(&[1; 1000]).unwrap();
            assert!(large.current.capacity() <= 4096, "never beyond a chunk");
        }
        let chunks = large.finish();
        let lens: Vec<usize> = chunks.iter().map(Bytes::len).collect();
        assert_eq!(lens, [4096, 4096, 1808]);
    }

    #[test]
    fn an_assembled_message_reads_its_chunks_in_order_and_releases_each_once_read() {
        let parts = [Bytes::from_static(b"abc"), Bytes::from_static(b"de")];
        let mut assembled = Assembled::new(parts.clone());
        assert_eq!(assembled.len(), 5);
        let mut first = [0; 4];
        assert_eq!(assembled.read(&mut first).unwrap(), 3, "one chunk per read");
        assert_eq!(assembled.parts.len(), 1, "the first chunk is released");
        let mut rest = Vec::new();
        assembled.read_to_end(&mut rest).unwrap();
        assert_eq!((&first[..3], &rest[..]), (&b"abc"[..], &b"de"[..]));
        assert!(assembled.is_empty());
        assert_eq!(&Assembled::new(parts).into_bytes()[..], b"abcde");
    }

    #[test]
    fn an_assembled_message_lends_bytes_within_a_chunk_and_gathers_them_across_chunks() {
        let parts = [Bytes::from_static(b"abc"), Bytes::from_static(b"defg")];
        let mut assembled = Assembled::new(parts);
        assert_eq!(assembled.front(2).as_deref(), Some(&b"ab"[..]));
        assert_eq!(assembled.front(2), None, "not all in the current chunk");
        let mut out = b"x".to_vec();
        assembled.read_into(3, &mut out);
        assert_eq!((&out[..], assembled.len()), (&b"xcde"[..], 2));
        assert_eq!(assembled.parts.len(), 1, "the first chunk is released");
        assembled.read_into(5, &mut out);
        assert_eq!(&out[..], b"xcdefg", "at most what is left");
        assert!(assembled.is_empty() && assembled.parts.is_empty());
    }
}
