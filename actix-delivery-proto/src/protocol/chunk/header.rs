//! The chunk header every chunk of a large message carries, and what can be wrong with a chunk.
//! Apart from the rest of chunking so that the envelope (which carries a header) and the
//! chunking rules (which read the envelope) do not import each other.

use serde::{Deserialize, Serialize};

/// Where a chunk sits in its message: carried by every chunk of a large message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChunkHeader {
    /// The seq of the message's first chunk; the chunk of seq `s` is chunk `s - first_seq`.
    pub first_seq: u64,
    /// How many chunks (and seqs) the message takes.
    pub chunks: u32,
    /// The length of the whole encoded message, in bytes.
    pub message_len: u64,
}

impl ChunkHeader {
    /// The seq of the message's last chunk: the one whose ACK confirms the message.
    pub fn last_seq(&self) -> u64 {
        self.first_seq + u64::from(self.chunks) - 1
    }

    /// Which chunk of the message `seq` is (from 0), if it is one of the message's.
    pub fn index_of(&self, seq: u64) -> Option<u32> {
        let index = u32::try_from(seq.checked_sub(self.first_seq)?).ok()?;
        (index < self.chunks).then_some(index)
    }

    /// Whether `seq` is the message's last chunk.
    pub fn is_last(&self, seq: u64) -> bool {
        seq == self.last_seq()
    }
}

/// What is impossible about a chunk (a dead letter: no buffering, no ACK).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkFault {
    /// The header announces a message of no chunks.
    #[error("its message has no chunks")]
    NoChunks,
    /// Its seq is not one of its message's (`first_seq..first_seq + chunks`), or the
    /// message's seqs leave `1..=2^53-1`.
    #[error("its seq is not one of its message's seqs")]
    OutsideMessage,
    /// Its `window_start` is past its message's first seq (an honest producer never settles
    /// part of a message it still sends).
    #[error("its window_start is past its message's first seq")]
    WindowStartPastMessage,
    /// The chunk has no bytes.
    #[error("the chunk is empty")]
    Empty,
    /// The chunk, or the number of chunks, exceeds the message's length.
    #[error("the chunk is longer than its message")]
    LongerThanMessage,
    /// It contradicts the chunks of its message received before (their number, the message's
    /// length, or the bytes they add up to): the partial message is dropped too.
    #[error("it contradicts the chunks of its message received before")]
    Conflicting,
    /// Its message has so many chunks that its [`reservation`](super::reassembly::reservation)
    /// (at least 128 bytes a chunk) exceeds `max_reassembly_bytes`: it could never be held.
    #[error("its message has more chunks than max_reassembly_bytes can hold")]
    TooManyChunks,
}
