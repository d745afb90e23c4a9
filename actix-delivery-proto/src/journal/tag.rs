//! Tags: names an entry of a stream is filed under, so that a read side can follow every
//! entry of one kind across all streams (`Journal::events_by_tag`),
//! and slices, which split the streams of a tag between several readers.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::journal::error::JournalError;

use crate::journal::id::PersistenceId;

/// The longest tag, in bytes.
pub const MAX_TAG_BYTES: usize = 128;

/// The number of slices the streams are spread over: every persistence id is in exactly one
/// slice, `0..SLICES` ([`slice_of`]).
pub const SLICES: u16 = 1024;

/// A name entries are filed under (say `"account"`, or `"order-shipped"`): non-empty, at most
/// [`MAX_TAG_BYTES`] bytes of UTF-8, without NUL characters; checked whenever one is made,
/// deserialized included. Cheap to clone.
#[derive(Clone)]
pub struct Tag(Repr);

/// A literal is kept as it is (no allocation per use); a tag made at run time is shared.
#[derive(Clone)]
enum Repr {
    Static(&'static str),
    Shared(Arc<str>),
}

impl PartialEq for Tag {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Tag {}

impl std::hash::Hash for Tag {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialOrd for Tag {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Tag {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Tag {
    /// Checks and wraps `tag`.
    ///
    /// # Errors
    /// [`JournalError::InvalidArgument`] if `tag` is empty, longer than [`MAX_TAG_BYTES`]
    /// bytes, or holds a `'\0'`.
    pub fn new(tag: impl Into<String>) -> Result<Self, JournalError> {
        let tag = tag.into();
        check(&tag)?;
        Ok(Self(Repr::Shared(Arc::from(tag))))
    }

    /// A tag the program spells out, as in `Tag::from_static("account")`.
    ///
    /// # Panics
    /// If `tag` is not a valid tag (see [`Tag::new`]): a literal is checked the first time it
    /// is used.
    pub fn from_static(tag: &'static str) -> Self {
        match check(tag) {
            Ok(()) => Self(Repr::Static(tag)),
            Err(err) => panic!("`{tag}` is not a valid tag: {err}"),
        }
    }

    /// The tag as a string slice.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Static(tag) => tag,
            Repr::Shared(tag) => tag,
        }
    }
}

fn check(tag: &str) -> Result<(), JournalError> {
    let reason = if tag.is_empty() || tag.len() > MAX_TAG_BYTES {
        format!(
            "a tag of {} bytes: a tag has 1 to {MAX_TAG_BYTES} bytes",
            tag.len()
        )
    } else if let Some(position) = tag.bytes().position(|byte| byte == 0) {
        format!("a tag with a NUL character at byte {position}, which no journal can store")
    } else {
        return Ok(());
    };
    Err(JournalError::InvalidArgument {
        persistence_id: None,
        reason,
    })
}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Tag {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Tag {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let tag = String::deserialize(deserializer)?;
        Self::new(tag).map_err(serde::de::Error::custom)
    }
}

/// The slice of stream `id`, `0..SLICES`: FNV-1a (32 bits) of its UTF-8 bytes, modulo
/// [`SLICES`]. Journals store it with each tagged entry, so it never changes.
pub fn slice_of(id: &PersistenceId) -> u16 {
    let hash = id.as_str().bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    });
    (hash % u32::from(SLICES)) as u16
}

/// A range of slices, `first..=last`: the streams one reader of a tag follows. N readers that
/// take [`Slices::split`]`(n, 0..n)` follow every stream of the tag once between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Slices {
    first: u16,
    last: u16,
}

impl Slices {
    /// Every slice: one reader follows all streams.
    pub const ALL: Self = Self {
        first: 0,
        last: SLICES - 1,
    };

    /// The slices `first..=last`.
    ///
    /// # Errors
    /// [`JournalError::InvalidArgument`] unless `first <= last < SLICES`.
    pub fn new(first: u16, last: u16) -> Result<Self, JournalError> {
        if first > last || last >= SLICES {
            return Err(JournalError::InvalidArgument {
                persistence_id: None,
                reason: format!(
                    "slices {first} to {last}: a range of slices lies within 0 to {}",
                    SLICES - 1
                ),
            });
        }
        Ok(Self { first, last })
    }

    /// Part `index` of `parts` equal parts of all slices (the last ones one slice shorter if
    /// [`SLICES`] does not divide evenly).
    ///
    /// # Errors
    /// [`JournalError::InvalidArgument`] unless `0 < parts <= SLICES` and `index < parts`.
    pub fn split(parts: u16, index: u16) -> Result<Self, JournalError> {
        if parts == 0 || parts > SLICES || index >= parts {
            return Err(JournalError::InvalidArgument {
                persistence_id: None,
                reason: format!(
                    "part {index} of {parts}: the slices split into 1 to {SLICES} parts, \
                     numbered from 0"
                ),
            });
        }
        let (size, extra) = (SLICES / parts, SLICES % parts);
        let first = index * size + index.min(extra);
        let len = size + u16::from(index < extra);
        Self::new(first, first + len - 1)
    }

    /// The first slice.
    pub fn first(&self) -> u16 {
        self.first
    }

    /// The last slice.
    pub fn last(&self) -> u16 {
        self.last
    }

    /// Whether stream `id` is in these slices.
    pub fn contains(&self, id: &PersistenceId) -> bool {
        (self.first..=self.last).contains(&slice_of(id))
    }
}

impl fmt::Display for Slices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_checked_like_persistence_ids() {
        assert!(Tag::new("").is_err());
        assert!(Tag::new("a".repeat(MAX_TAG_BYTES)).is_ok());
        assert!(Tag::new("a".repeat(MAX_TAG_BYTES + 1)).is_err());
        let err = Tag::new("a\0b").unwrap_err();
        assert!(err.to_string().contains("NUL character at byte 1"), "{err}");
        assert_eq!(Tag::from_static("account").as_str(), "account");
        let bytes = crate::codec::encode("").unwrap();
        assert!(crate::codec::decode::<Tag>(&bytes).is_err());
        let tag = Tag::from_static("order");
        let bytes = crate::codec::encode(&tag).unwrap();
        assert_eq!(crate::codec::decode::<Tag>(&bytes).unwrap(), tag);
    }

    #[test]
    #[should_panic(expected = "is not a valid tag")]
    fn a_static_tag_that_is_not_one_panics() {
        let _ = Tag::from_static("");
    }

    #[test]
    fn the_slice_of_an_id_is_fixed_forever() {
        // Stored with every tagged entry: these values must never change.
        let slice = |id: &str| slice_of(&PersistenceId::new(id).unwrap());
        assert_eq!(slice("a"), 0xe40c_292c_u32 as u16 % SLICES);
        assert_eq!(slice("account-1"), 0x3aa6_8c96_u32 as u16 % SLICES); // 150
        let spread: std::collections::HashSet<u16> =
            (0..4096).map(|n| slice(&format!("account-{n}"))).collect();
        assert!(
            spread.len() > 900,
            "ids spread over the slices: {}",
            spread.len()
        );
    }

    #[test]
    fn split_slices_cover_every_slice_once() {
        for parts in [1, 2, 3, 7, 1000, SLICES] {
            let mut next = 0;
            for index in 0..parts {
                let slices = Slices::split(parts, index).unwrap();
                assert_eq!(slices.first(), next, "{parts} parts, part {index}");
                next = slices.last() + 1;
            }
            assert_eq!(next, SLICES, "{parts} parts");
        }
        assert_eq!(Slices::split(1, 0).unwrap(), Slices::ALL);
        assert!(Slices::split(0, 0).is_err());
        assert!(Slices::split(2, 2).is_err());
        assert!(Slices::split(SLICES + 1, 0).is_err());
        assert!(Slices::new(5, 4).is_err());
        assert!(Slices::new(0, SLICES).is_err());
        let id = PersistenceId::new("a").unwrap();
        let mine = slice_of(&id);
        assert!(Slices::new(mine, mine).unwrap().contains(&id));
        assert_eq!(Slices::new(3, 9).unwrap().to_string(), "3-9");
    }
}
