//! Which journal a journal is: the id it was given when it was created.

use std::fmt;
use std::sync::Arc;

use crate::journal::error::JournalError;

/// The identity of one journal's storage (a SQLite file, a PostgreSQL schema, a
/// `MemoryJournal`): random, given once when the storage is
/// created (or first opened by a version that knows ids), and kept with it, so that a copy,
/// a backup or a physical restore has the same one and any other journal another. A read
/// model records the id of the journal its projection follows and refuses to go on with
/// another (see `Journal::journal_id`).
///
/// Opaque: 1 to [`MAX_BYTES`](Self::MAX_BYTES) printable ASCII characters (no spaces),
/// compared as written. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct JournalId(Arc<str>);

impl JournalId {
    /// The longest id, in bytes.
    pub const MAX_BYTES: usize = 64;

    /// Checks and wraps `id` (as a journal read it back from its storage).
    ///
    /// # Errors
    /// [`JournalError::InvalidArgument`] if `id` is empty, longer than
    /// [`MAX_BYTES`](Self::MAX_BYTES), or holds anything but printable ASCII characters.
    pub fn new(id: impl Into<String>) -> Result<Self, JournalError> {
        let id = id.into();
        if id.is_empty() || id.len() > Self::MAX_BYTES {
            return Err(invalid(format!(
                "a journal id of {} bytes, not 1 to {}",
                id.len(),
                Self::MAX_BYTES
            )));
        }
        if let Some(position) = id.bytes().position(|byte| !byte.is_ascii_graphic()) {
            return Err(invalid(format!(
                "a journal id with a character other than printable ASCII at byte {position}"
            )));
        }
        Ok(Self(Arc::from(id)))
    }

    /// An id of 32 hex digits from two 64-bit draws (the shells draw them from the OS).
    pub fn from_draws(high: u64, low: u64) -> Self {
        Self(Arc::from(format!("{high:016x}{low:016x}")))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn invalid(reason: String) -> JournalError {
    JournalError::InvalidArgument {
        persistence_id: None,
        reason,
    }
}

impl fmt::Debug for JournalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for JournalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_one_to_64_printable_ascii_characters_and_random_ones_differ() {
        assert!(JournalId::new("").is_err());
        assert!(JournalId::new("a".repeat(65)).is_err());
        assert!(JournalId::new("a b").is_err());
        assert!(JournalId::new("é").is_err());
        let uuid = "6f1c1a0e-2b1d-4c7e-9b1a-0d9e5c2f4a11";
        assert_eq!(JournalId::new(uuid).unwrap().as_str(), uuid);
        assert_eq!(JournalId::new("a".repeat(64)).unwrap().as_str().len(), 64);
        let (one, two) = (JournalId::from_draws(1, 2), JournalId::from_draws(2, 1));
        assert_ne!(one, two);
        assert_eq!(one.as_str().len(), 32);
        assert_eq!(JournalId::new(one.as_str()).unwrap(), one);
    }
}
