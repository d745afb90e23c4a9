//! Entity ids and shards: which shard an entity belongs to is a pure function of its id and
//! the shard count, the same in every process and every release.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest entity id, in bytes: it is part of journal stream names (`<type>|<id>`) and of
/// the sharded producer's stream ids (`<producer>/<id>`), which hold 256 bytes each.
pub const MAX_ENTITY_ID: usize = 128;

/// The id of one entity of a sharded type: non-empty, at most [`MAX_ENTITY_ID`] bytes of
/// UTF-8, without NUL characters; checked whenever one is made, deserialized included. Cheap
/// to clone (a shared string). It may hold `|`: an entity's journal stream is
/// `<type>|<id>`, which splits at its first `|` (entity types hold none), as
/// `Envelope::entity_id` does.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntityId(Arc<str>);

/// Why a string is no [`EntityId`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EntityIdError {
    /// Empty, or longer than [`MAX_ENTITY_ID`] bytes.
    #[error("an entity id has 1 to {MAX_ENTITY_ID} bytes (got {0})")]
    Length(usize),
    /// A NUL character (journals cannot store one in a stream name).
    #[error("an entity id holds no NUL character (one at byte {0})")]
    Nul(usize),
}

impl EntityId {
    /// Checks and wraps `id`.
    ///
    /// # Errors
    /// [`EntityIdError`] if `id` is empty, longer than [`MAX_ENTITY_ID`] bytes or holds a NUL.
    pub fn new(id: impl AsRef<str>) -> Result<Self, EntityIdError> {
        let id = id.as_ref();
        if id.is_empty() || id.len() > MAX_ENTITY_ID {
            return Err(EntityIdError::Length(id.len()));
        }
        if let Some(position) = id.bytes().position(|byte| byte == 0) {
            return Err(EntityIdError::Nul(position));
        }
        Ok(Self(Arc::from(id)))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The shard this entity belongs to among `shards` (see [`ShardId::of`]).
    pub fn shard(&self, shards: u32) -> ShardId {
        ShardId::of(self, shards)
    }
}

impl std::str::FromStr for EntityId {
    type Err = EntityIdError;

    fn from_str(id: &str) -> Result<Self, Self::Err> {
        Self::new(id)
    }
}

impl TryFrom<&str> for EntityId {
    type Error = EntityIdError;

    fn try_from(id: &str) -> Result<Self, Self::Error> {
        Self::new(id)
    }
}

impl TryFrom<String> for EntityId {
    type Error = EntityIdError;

    fn try_from(id: String) -> Result<Self, Self::Error> {
        Self::new(id)
    }
}

// Hash, Eq and Ord are those of the string, so maps keyed by id can be queried with a `&str`.
impl Borrow<str> for EntityId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for EntityId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for EntityId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for EntityId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for EntityId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let id = String::deserialize(deserializer)?;
        Self::new(id).map_err(serde::de::Error::custom)
    }
}

/// One shard: a fixed slice of a sharded type's entities, owned by one node at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ShardId(pub u32);

impl ShardId {
    /// The shard of `entity` among `shards` shards: the 64-bit FNV-1a hash of the id's UTF-8
    /// bytes, modulo `shards`. Fixed forever (every process, every release must agree), so
    /// the shard count of a deployed type can only change with all its nodes stopped.
    ///
    /// # Panics
    /// If `shards` is 0 (options validation refuses it).
    pub fn of(entity: &EntityId, shards: u32) -> Self {
        assert!(shards > 0, "a sharded type has at least one shard");
        let shard = fnv1a(entity.as_str().as_bytes()) % u64::from(shards);
        Self(u32::try_from(shard).expect("below a u32 shard count"))
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// 64-bit FNV-1a: a stable hash (never change it: shards of stored entities depend on it).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_in_bytes_and_when_deserialized() {
        assert_eq!(EntityId::new(""), Err(EntityIdError::Length(0)));
        assert!(EntityId::new("a".repeat(MAX_ENTITY_ID)).is_ok());
        assert_eq!(
            EntityId::new("€".repeat(43)),
            Err(EntityIdError::Length(129)),
            "43 three-byte characters"
        );
        assert_eq!(EntityId::new("a\0b"), Err(EntityIdError::Nul(1)));
        let encoded = crate::codec::encode(&"").unwrap();
        assert!(crate::codec::decode::<EntityId>(&encoded).is_err());
        let id: EntityId = "account-7".parse().unwrap();
        let encoded = crate::codec::encode(&id).unwrap();
        assert_eq!(crate::codec::decode::<EntityId>(&encoded).unwrap(), id);
        assert_eq!(format!("{id} {id:?}"), "account-7 \"account-7\"");
        // `|` is allowed: stream names split at their first `|`, and types hold none.
        assert_eq!(EntityId::new("a|b").unwrap().as_str(), "a|b");
    }

    #[test]
    fn the_shard_of_an_id_is_fixed_and_spreads_ids_evenly() {
        let id = |n: u32| EntityId::new(format!("entity-{n}")).unwrap();
        // Pinned values: a changed hash would move every stored entity to another shard.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(id(1).shard(64), ShardId((fnv1a(b"entity-1") % 64) as u32));
        assert_eq!(id(1).shard(1), ShardId(0));
        let mut counts = [0u32; 16];
        for n in 0..16_000 {
            counts[id(n).shard(16).0 as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }
}
