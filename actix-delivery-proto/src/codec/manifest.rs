//! What a stored value records of how it was written.

use std::fmt;
use std::sync::Arc;

use crate::codec::Codec;

/// The codec id of [`Manifest::raw`] payloads.
const RAW: u8 = 0;

/// How a stored value was written: its codec, the name of its type, and that type's schema
/// version. Journals keep it next to every event and snapshot (SQLite and PostgreSQL in
/// columns of their own), so a reader knows how to decode an entry before it tries.
///
/// The name is the writer's description of the type (the crate records
/// [`std::any::type_name`]): it is shown in errors and to upcasters, and it says whose data
/// an entry is. A persistent entity or durable producer reads only entries of its own type's
/// name (or of none, written before names were recorded): a stream of another name is another
/// application's, refused with `JournalError::ForeignType`
/// rather than decoded as this one's. A type moved or renamed declares its former name
/// (`EventSourced::FORMER_TYPE_NAMES`,
/// `DurableOptions::accept_type_name`). The
/// version is what an upcaster dispatches on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Manifest {
    codec: u8,
    name: Arc<str>,
    version: u32,
}

impl Manifest {
    /// Written in `codec`, as version `version` of the type `name`.
    pub fn new(codec: Codec, name: impl Into<Arc<str>>, version: u32) -> Self {
        Self::from_stored(codec.id(), name, version)
    }

    /// As a journal reads it back: `codec_id` may be one this version of the crate does not
    /// know (written by a newer one); decoding then fails with an error naming it.
    pub fn from_stored(codec_id: u8, name: impl Into<Arc<str>>, version: u32) -> Self {
        Self {
            codec: codec_id,
            name: name.into(),
            version,
        }
    }

    /// The manifest of entries written before manifests were recorded (journal schema 1):
    /// bincode, no name, version 1.
    pub fn legacy() -> Self {
        Self::from_stored(Codec::Bincode.id(), "", 1)
    }

    /// Bytes that are their own meaning, written without a codec (id 0, no name, version 0):
    /// what `Journal::append` records.
    pub fn raw() -> Self {
        Self::from_stored(RAW, "", 0)
    }

    /// Its codec, if this version of the crate knows it.
    pub fn codec(&self) -> Option<Codec> {
        Codec::from_id(self.codec)
    }

    /// Its codec's id ([`Codec::id`]), as stored.
    pub fn codec_id(&self) -> u8 {
        self.codec
    }

    /// The name of the type written (empty for [`legacy`](Self::legacy) entries).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The schema version of the type written.
    pub fn version(&self) -> u32 {
        self.version
    }
}

impl fmt::Display for Manifest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if self.name.is_empty() {
            "an unnamed type"
        } else {
            &self.name
        };
        match self.codec() {
            Some(codec) => write!(f, "{name} version {} in {codec}", self.version),
            None if self.codec == RAW => f.write_str("raw bytes"),
            None => write!(
                f,
                "{name} version {} in the unknown codec {}",
                self.version, self.codec
            ),
        }
    }
}
