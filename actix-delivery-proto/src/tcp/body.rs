//! Encoded bodies kept for retransmission: small ones inline (no allocation), larger ones
//! shared, stored in seq order so that the common operations (append the next seq, find a
//! retransmitted one, forget an ACKed one, forget everything below the window start) cost no
//! search and no allocation. Pure.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;

/// Bodies up to this many bytes are stored inline.
const INLINE: usize = 30;

/// The encoding of one message's body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// Short: in place.
    Inline {
        /// How many of `bytes` it uses.
        len: u8,
        /// The body, padded.
        bytes: [u8; INLINE],
    },
    /// Long: shared between the store and the frames being built.
    Shared(Arc<[u8]>),
    /// A chunk of a large message: shared with its producer, never kept in `Bodies`.
    Chunk(Bytes),
}

impl Body {
    /// The body of `encoded`: in place if short, else shared.
    pub fn new(encoded: &[u8]) -> Self {
        if encoded.len() <= INLINE {
            let mut bytes = [0; INLINE];
            bytes[..encoded.len()].copy_from_slice(encoded);
            Body::Inline {
                len: encoded.len() as u8,
                bytes,
            }
        } else {
            Body::Shared(encoded.into())
        }
    }

    /// The encoded bytes.
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Body::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Body::Shared(bytes) => bytes,
            Body::Chunk(bytes) => bytes,
        }
    }
}

/// Encoded bodies by seq, ascending; `None` marks one forgotten (ACKed) inside the range.
#[derive(Debug, Default)]
pub(crate) struct Bodies {
    entries: VecDeque<(u64, Option<Body>)>,
    live: usize,
}

impl Bodies {
    /// The body of `seq`, or `encode`'s (into `scratch`), which is then kept. Forgets every
    /// body below `window_start` first. At most `max` entries are kept (the lowest seqs go
    /// first). Returns whether `encode` was called.
    ///
    /// # Errors
    /// `encode`'s error (nothing is kept).
    pub(crate) fn get_or_encode<E>(
        &mut self,
        seq: u64,
        window_start: u64,
        max: usize,
        scratch: &mut Vec<u8>,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(Body, bool), E> {
        self.forget_below(window_start);
        let found = self.position(seq);
        if let Ok(index) = found
            && let Some(body) = &self.entries[index].1
        {
            return Ok((body.clone(), false));
        }
        scratch.clear();
        encode(scratch)?;
        let body = Body::new(scratch);
        match found {
            Ok(index) => self.entries[index].1 = Some(body.clone()),
            Err(index) => {
                self.entries.insert(index, (seq, Some(body.clone())));
                while self.entries.len() > max {
                    if let Some((_, Some(_))) = self.entries.pop_front() {
                        self.live -= 1;
                    }
                }
            }
        }
        self.live += 1;
        self.forget_below(window_start); // drops leading holes the cap may have exposed
        Ok((body, true))
    }

    /// Forgets the body of `seq` (it was ACKed).
    pub(crate) fn remove(&mut self, seq: u64) {
        if let Ok(index) = self.position(seq) {
            if self.entries[index].1.take().is_some() {
                self.live -= 1;
            }
            self.forget_below(0);
        }
    }

    /// Bodies kept.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Drops entries below `window_start` and leading holes.
    fn forget_below(&mut self, window_start: u64) {
        while let Some((seq, body)) = self.entries.front() {
            if *seq >= window_start && body.is_some() {
                break;
            }
            if body.is_some() {
                self.live -= 1;
            }
            self.entries.pop_front();
        }
    }

    /// Where `seq` is (`Ok`) or would go (`Err`). Seqs are nearly always contiguous, so the
    /// first guess is `seq - first`; appending is the last.
    fn position(&self, seq: u64) -> Result<usize, usize> {
        let Some(&(first, _)) = self.entries.front() else {
            return Err(0);
        };
        let last = self.entries.back().map_or(first, |(s, _)| *s);
        if seq > last {
            return Err(self.entries.len());
        }
        if let Some(guess) = seq.checked_sub(first).and_then(|d| usize::try_from(d).ok())
            && self.entries.get(guess).is_some_and(|(s, _)| *s == seq)
        {
            return Ok(guess);
        }
        self.entries.binary_search_by_key(&seq, |(s, _)| *s)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;

    fn encode(seq: u64) -> impl FnOnce(&mut Vec<u8>) -> Result<(), Infallible> {
        move |out| {
            out.extend_from_slice(&seq.to_le_bytes());
            Ok(())
        }
    }

    fn get(bodies: &mut Bodies, seq: u64, window_start: u64) -> (Body, bool) {
        bodies
            .get_or_encode(seq, window_start, 100, &mut Vec::new(), encode(seq))
            .unwrap()
    }

    #[test]
    fn small_bodies_are_inline_and_large_ones_shared() {
        assert!(matches!(Body::new(&[1; 30]), Body::Inline { len: 30, .. }));
        assert!(matches!(Body::new(&[1; 31]), Body::Shared(_)));
        assert_eq!(Body::new(b"abc").as_slice(), b"abc");
        assert_eq!(Body::new(&[7; 100]).as_slice(), [7; 100]);
    }

    #[test]
    fn each_seq_is_encoded_once_until_acked_or_below_the_window() {
        let mut bodies = Bodies::default();
        for seq in 1..=5 {
            assert!(get(&mut bodies, seq, 1).1, "first transmission encodes");
        }
        let (body, encoded) = get(&mut bodies, 3, 1);
        assert!(!encoded, "a retransmission reuses the bytes");
        assert_eq!(body.as_slice(), 3u64.to_le_bytes());
        bodies.remove(4);
        assert_eq!(bodies.len(), 4);
        assert!(
            get(&mut bodies, 4, 1).1,
            "an ACKed seq sent again is encoded again"
        );
        get(&mut bodies, 6, 3); // window start 3: 1 and 2 settled
        assert_eq!(bodies.len(), 4);
        bodies.remove(3);
        assert_eq!(
            bodies.entries.front().map(|e| e.0),
            Some(4),
            "leading holes dropped"
        );
    }

    #[test]
    fn out_of_order_seqs_are_kept_in_order() {
        let mut bodies = Bodies::default();
        for seq in [10, 12, 11, 5, 20] {
            get(&mut bodies, seq, 1);
        }
        let seqs: Vec<u64> = bodies.entries.iter().map(|e| e.0).collect();
        assert_eq!(seqs, [5, 10, 11, 12, 20]);
        for seq in [5, 10, 11, 12, 20] {
            assert!(!get(&mut bodies, seq, 1).1);
        }
    }

    #[test]
    fn the_store_is_bounded() {
        let mut bodies = Bodies::default();
        for seq in 1..=50 {
            bodies
                .get_or_encode(seq, 1, 10, &mut Vec::new(), encode(seq))
                .unwrap();
        }
        assert_eq!(bodies.len(), 10);
        assert_eq!(bodies.entries.front().map(|e| e.0), Some(41));
    }

    #[test]
    fn a_failed_encoding_keeps_nothing() {
        let mut bodies = Bodies::default();
        let failed = bodies.get_or_encode(1, 1, 10, &mut Vec::new(), |_| Err("no"));
        assert_eq!(failed, Err("no"));
        assert_eq!(bodies.len(), 0);
    }
}
