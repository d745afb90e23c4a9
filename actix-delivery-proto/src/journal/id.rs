//! The name of a journal stream.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::protocol::envelope::MAX_ID_BYTES;

/// The name of one stream of events in a `Journal`: non-empty,
/// at most [`MAX_ID_BYTES`] (256) bytes of UTF-8 and without NUL characters (which
/// PostgreSQL cannot store: one rule for every journal, so a stream can move between them),
/// checked whenever one is made, deserialized included.
///
/// Cheap to clone (a shared string). Typically an entity's type and key, e.g. `"order-4711"`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PersistenceId(Arc<str>);

impl PersistenceId {
    /// Checks and wraps `id`.
    ///
    /// # Errors
    /// [`PersistenceIdError::Length`] if `id` is empty or longer than [`MAX_ID_BYTES`] bytes
    /// (bytes, not characters: a multibyte character counts for each of its bytes);
    /// [`PersistenceIdError::Nul`] if it holds a `'\0'`.
    pub fn new(id: impl Into<String>) -> Result<Self, PersistenceIdError> {
        let id = id.into();
        check(&id)?;
        Ok(Self(Arc::from(id)))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Why a string is not a [`PersistenceId`]. A journal operation given one fails with
/// `JournalError::InvalidPersistenceId`, which holds it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PersistenceIdError {
    /// Empty, or longer than the limit.
    #[error("invalid persistence id: {len} bytes, must be 1 to {max}")]
    Length {
        /// Its length in bytes.
        len: usize,
        /// The limit, [`MAX_ID_BYTES`].
        max: usize,
    },
    /// A NUL character (`'\0'`), which not every journal can store (PostgreSQL's `TEXT`
    /// cannot hold it), so no persistence id may have one.
    #[error(
        "invalid persistence id: a NUL character at byte {position}, which no journal can store"
    )]
    Nul {
        /// The byte offset of the first NUL.
        position: usize,
    },
}

fn check(id: &str) -> Result<(), PersistenceIdError> {
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Err(PersistenceIdError::Length {
            len: id.len(),
            max: MAX_ID_BYTES,
        });
    }
    if let Some(position) = id.bytes().position(|byte| byte == 0) {
        return Err(PersistenceIdError::Nul { position });
    }
    Ok(())
}

impl TryFrom<&str> for PersistenceId {
    type Error = PersistenceIdError;

    fn try_from(id: &str) -> Result<Self, Self::Error> {
        check(id)?;
        Ok(Self(Arc::from(id)))
    }
}

impl TryFrom<String> for PersistenceId {
    type Error = PersistenceIdError;

    fn try_from(id: String) -> Result<Self, Self::Error> {
        Self::new(id)
    }
}

// Hash, Eq and Ord are those of the string, so maps keyed by id can be queried with a `&str`.
impl Borrow<str> for PersistenceId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for PersistenceId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for PersistenceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for PersistenceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for PersistenceId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for PersistenceId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let id = String::deserialize(deserializer)?;
        Self::new(id).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_counted_in_bytes() {
        assert_eq!(
            PersistenceId::new("").unwrap_err(),
            PersistenceIdError::Length { len: 0, max: 256 }
        );
        assert_eq!(
            PersistenceId::new("a".repeat(256)).unwrap().as_str().len(),
            256
        );
        assert_eq!(
            PersistenceId::try_from("a".repeat(257)).unwrap_err(),
            PersistenceIdError::Length { len: 257, max: 256 }
        );
        // 86 three-byte characters are 258 bytes, though only 86 characters.
        let wide = "€".repeat(86);
        assert_eq!(
            PersistenceId::try_from(wide.as_str()).unwrap_err(),
            PersistenceIdError::Length { len: 258, max: 256 }
        );
        assert!(PersistenceId::try_from("€".repeat(85).as_str()).is_ok());
    }

    #[test]
    fn nul_characters_are_refused_every_other_character_is_kept() {
        assert_eq!(
            PersistenceId::new("a\0b").unwrap_err(),
            PersistenceIdError::Nul { position: 1 }
        );
        assert_eq!(
            PersistenceId::try_from("\0").unwrap_err(),
            PersistenceIdError::Nul { position: 0 }
        );
        let nul = crate::codec::encode("order\0").unwrap();
        assert!(crate::codec::decode::<PersistenceId>(&nul).is_err());
        let controls: String = (1u8..0x20).map(char::from).chain(['\u{7f}', '€']).collect();
        assert_eq!(
            PersistenceId::new(controls.clone()).unwrap().as_str(),
            controls
        );
    }

    #[test]
    fn deserializing_validates() {
        let id = PersistenceId::new("order-1").unwrap();
        let bytes = crate::codec::encode(&id).unwrap();
        assert_eq!(crate::codec::decode::<PersistenceId>(&bytes).unwrap(), id);
        let empty = crate::codec::encode("").unwrap();
        let err = crate::codec::decode::<PersistenceId>(&empty).unwrap_err();
        assert!(
            matches!(&err, crate::codec::CodecError::Malformed { reason } if reason.contains("invalid persistence id")),
            "{err:?}"
        );
        let long = crate::codec::encode(&"x".repeat(257)).unwrap();
        assert!(crate::codec::decode::<PersistenceId>(&long).is_err());
    }

    #[test]
    fn displays_and_compares_as_the_string() {
        let id = PersistenceId::try_from("a-1").unwrap();
        assert_eq!(id.to_string(), "a-1");
        assert_eq!(format!("{id:?}"), "\"a-1\"");
        assert_eq!(id, PersistenceId::new(String::from("a-1")).unwrap());
        let set = std::collections::HashSet::from([id]);
        assert!(set.contains("a-1"));
    }
}
