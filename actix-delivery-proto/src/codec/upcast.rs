//! Reading values written by earlier versions of a type: the upcast hook's input and error.

use std::cell::Cell;
use std::fmt::Display;
use std::panic::{catch_unwind, AssertUnwindSafe};

use serde::de::DeserializeOwned;

use crate::codec::{self, Codec, CodecError, Manifest};

/// A stored value as an earlier version of the code wrote it, handed to an upcaster: its
/// [`Manifest`] (the version to convert from) and [`decode`](Self::decode), which decodes it
/// as the type it was written as, in the codec it was written in.
///
/// ```
/// use actix_delivery_proto::codec::{UpcastError, Written};
/// # use serde::Deserialize;
/// # #[derive(Deserialize)] struct OrderV1 { total: u64 }
/// # struct Order { total_cents: u64 }
/// fn upcast(old: Written<'_>) -> Result<Order, UpcastError> {
///     match old.version() {
///         1 => {
///             let v1: OrderV1 = old.decode()?;
///             Ok(Order { total_cents: v1.total * 100 })
///         }
///         other => Err(UpcastError::new(format!("no upcaster from version {other}"))),
///     }
/// }
/// # let _: fn(Written<'_>) -> Result<Order, UpcastError> = upcast;
/// # let _ = |order: Order| order.total_cents;
/// ```
#[derive(Debug)]
pub struct Written<'a> {
    manifest: &'a Manifest,
    bytes: &'a [u8],
    limit: u64,
    /// For a value at the front of a bincode layout in which more follows (entries written
    /// before manifests): where the bytes after it go once it is decoded.
    rest: Option<&'a Cell<Option<&'a [u8]>>>,
}

impl<'a> Written<'a> {
    /// The value in `bytes`, written as `manifest` says, decoded reading at most `limit` bytes.
    pub(crate) fn new(manifest: &'a Manifest, bytes: &'a [u8], limit: u64) -> Self {
        Self {
            manifest,
            bytes,
            limit,
            rest: None,
        }
    }

    /// The bincode value at the front of `bytes`; decoding it puts the bytes after it into
    /// `rest`.
    pub(crate) fn prefix(
        manifest: &'a Manifest,
        bytes: &'a [u8],
        limit: u64,
        rest: &'a Cell<Option<&'a [u8]>>,
    ) -> Self {
        Self {
            manifest,
            bytes,
            limit,
            rest: Some(rest),
        }
    }

    /// How it was written.
    pub fn manifest(&self) -> &Manifest {
        self.manifest
    }

    /// The schema version it was written at.
    pub fn version(&self) -> u32 {
        self.manifest.version()
    }

    /// Decodes it as a `T`: the type it was written as (or one that reads that encoding).
    ///
    /// # Errors
    /// An [`UpcastError`] naming the manifest and `T` if the bytes do not decode as a `T`, or
    /// their codec is unknown to this version of the crate.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, UpcastError> {
        let failed = |error: CodecError| {
            UpcastError::new(format!(
                "{} does not decode as `{}`: {error}",
                self.manifest,
                std::any::type_name::<T>()
            ))
        };
        let codec = self.manifest.codec().ok_or_else(|| {
            UpcastError::new(format!(
                "{} cannot be read by this version of the crate",
                self.manifest
            ))
        })?;
        match self.rest {
            None => codec.decode(self.bytes, self.limit).map_err(failed),
            Some(rest) => {
                debug_assert_eq!(codec, Codec::Bincode, "prefix layouts are bincode");
                let (value, after) =
                    codec::decode_prefix(self.bytes, self.limit).map_err(failed)?;
                rest.set(Some(after));
                Ok(value)
            }
        }
    }

    /// Decodes it as it is written at `current`, today's version of the type: directly if it
    /// was written at that version, through `upcast` if at an older one. A value written at
    /// a newer version (the code was rolled back) is refused, never guessed at.
    pub(crate) fn read<T: DeserializeOwned>(
        self,
        current: u32,
        upcast: impl FnOnce(Written<'_>) -> Result<T, UpcastError>,
    ) -> Result<T, Unreadable> {
        let version = self.version();
        if self.manifest.codec().is_none() {
            return Err(Unreadable::Incompatible(format!(
                "written as {}, which this version of the crate cannot read",
                self.manifest
            )));
        }
        // A `Deserialize` implementation or an upcaster that panics must not take the reader
        // down with it: it is a value that cannot be read, like any other.
        let panicked = |_| Unreadable::Incompatible("decoding or upcasting it panicked".into());
        if version == current {
            catch_unwind(AssertUnwindSafe(|| self.decode()))
                .map_err(panicked)?
                .map_err(|err| Unreadable::Corrupt(format!("{err} {TYPE_CHANGED}")))
        } else if version < current {
            catch_unwind(AssertUnwindSafe(|| upcast(self)))
                .map_err(panicked)?
                .map_err(|err| Unreadable::Incompatible(err.to_string()))
        } else {
            Err(Unreadable::Incompatible(format!(
                "written as {}, newer than this code's version {current} (was the code rolled \
                 back?)",
                self.manifest
            )))
        }
    }
}

/// What a value at today's version that does not decode may mean.
pub const TYPE_CHANGED: &str = "(corrupt, or the type changed without a new version: \
                                       raise the version and read the old one in an upcaster)";

/// Why a stored value could not be read as today's type.
#[derive(Debug, PartialEq, Eq)]
pub enum Unreadable {
    /// Its bytes do not decode as what they claim to be.
    Corrupt(String),
    /// It is at a version this code cannot read: newer, or older and the upcaster refused it.
    Incompatible(String),
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Corrupt(reason) | Self::Incompatible(reason) => f.write_str(reason),
        }
    }
}

/// An upcaster: turns a value written at an older version of `T` into a `T`.
pub type Upcast<T> = fn(Written<'_>) -> Result<T, UpcastError>;

/// Why a stored value could not be turned into today's type. Upcasters return it (through
/// `?` on [`Written::decode`], or [`UpcastError::new`] for a reason of their own); the crate
/// reports it with the stream and seq of the value, as a fail-stop error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct UpcastError {
    reason: String,
}

impl UpcastError {
    /// An upcaster's refusal, for `reason`.
    pub fn new(reason: impl Display) -> Self {
        Self {
            reason: reason.to_string(),
        }
    }

    /// The refusal of a value at an older version for which there is no upcaster.
    pub(crate) fn missing(written: &Written<'_>, current: u32) -> Self {
        Self::new(format!(
            "written as {}, and there is no upcaster to this code's version {current}",
            written.manifest()
        ))
    }

    /// What went wrong.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}
