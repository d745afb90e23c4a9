//! What a dead-letter store keeps: a message given up or refused, with its body as stored
//! bytes, where it came from and why; the filter that lists entries; the store's bounds.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::codec::Manifest;
use crate::error::OptionsError;
use crate::protocol::envelope::DeliveryInfo;

/// Why a message became a dead letter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[non_exhaustive]
pub enum DeadLetterCause {
    /// Its sender gave it up after `max_attempts` (a work-pulling job no worker confirmed).
    GivenUp,
    /// Its body does not decode as the receiver's message type.
    Undecodable,
    /// Its body is in a codec or schema version the receiver cannot read.
    IncompatibleVersion,
    /// Its handler failed on it until the poison policy took it out (a projection's skipped
    /// event, a worker's poison job).
    Poison,
    /// It broke an admission rule of the protocol (a malformed delivery).
    Malformed,
}

impl DeadLetterCause {
    /// Every cause, in the order they are listed.
    pub const ALL: [DeadLetterCause; 5] = [
        Self::GivenUp,
        Self::Undecodable,
        Self::IncompatibleVersion,
        Self::Poison,
        Self::Malformed,
    ];

    /// Its name in stores, filters and URLs: `given_up`, `undecodable`,
    /// `incompatible_version`, `poison`, `malformed`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::GivenUp => "given_up",
            Self::Undecodable => "undecodable",
            Self::IncompatibleVersion => "incompatible_version",
            Self::Poison => "poison",
            Self::Malformed => "malformed",
        }
    }

    /// Whether the cause comes from a peer's input (sampled when it floods, see
    /// [`DeadLetterLimits::sample_burst`]) rather than from this process's own give-up.
    pub const fn is_peer_input(self) -> bool {
        matches!(
            self,
            Self::Undecodable | Self::IncompatibleVersion | Self::Malformed
        )
    }
}

impl fmt::Display for DeadLetterCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DeadLetterCause {
    type Err = FieldError;

    fn from_str(text: &str) -> Result<Self, FieldError> {
        Self::ALL
            .into_iter()
            .find(|cause| cause.as_str() == text)
            .ok_or_else(|| FieldError::new("cause", one_of(text, Self::ALL.map(Self::as_str))))
    }
}

/// What kind of part a dead letter came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[non_exhaustive]
pub enum SourceKind {
    /// A producer (plain or durable): messages it gave up after `max_attempts`.
    Producer,
    /// A consumer (of a producer, a TCP route, a NATS carrier).
    Consumer,
    /// A work-pulling producer's pool.
    WorkPulling,
    /// A sharded entity host.
    EntityHost,
    /// A projection runner.
    Projection,
}

impl SourceKind {
    /// Every kind, in the order they are listed.
    pub const ALL: [SourceKind; 5] = [
        Self::Producer,
        Self::Consumer,
        Self::WorkPulling,
        Self::EntityHost,
        Self::Projection,
    ];

    /// Its name in stores, filters and URLs: `producer`, `consumer`, `work_pulling`,
    /// `entity_host`, `projection`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Producer => "producer",
            Self::Consumer => "consumer",
            Self::WorkPulling => "work_pulling",
            Self::EntityHost => "entity_host",
            Self::Projection => "projection",
        }
    }
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SourceKind {
    type Err = FieldError;

    fn from_str(text: &str) -> Result<Self, FieldError> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.as_str() == text)
            .ok_or_else(|| FieldError::new("kind", one_of(text, Self::ALL.map(Self::as_str))))
    }
}

/// The longest source name, key and error text a store keeps, in bytes (longer ones are cut
/// at a character boundary).
pub const MAX_TEXT_BYTES: usize = 1024;

/// A dead letter to keep: what the part that gave it up or refused it knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewDeadLetter {
    /// The kind of part it came from.
    pub kind: SourceKind,
    /// The part's name (the name it was given when the store was attached to it).
    pub source: String,
    /// Why.
    pub cause: DeadLetterCause,
    /// The message's stable id at its source (a job's `producer/incarnation/seq`, a
    /// projection's `persistence_id/seq`): a second dead letter of the same source and key
    /// updates the first entry instead of adding one.
    pub key: String,
    /// The message's delivery id, where it had one (a job's, a refused delivery's).
    pub origin: Option<DeliveryInfo>,
    /// How the body is encoded: codec, type name, schema version.
    pub manifest: Manifest,
    /// The body as stored bytes; `None` when it was not kept (larger than
    /// [`DeadLetterLimits::max_body_bytes`], or sampled out of a flood).
    pub body: Option<Vec<u8>>,
    /// The body's length in bytes, kept or not.
    pub body_len: u64,
    /// How many times it was tried.
    pub attempts: u32,
    /// The last error, as text with its causes.
    pub error: String,
}

impl NewDeadLetter {
    /// The letter with its texts cut to [`MAX_TEXT_BYTES`] and its body dropped when longer
    /// than `max_body_bytes`: what a store keeps of it.
    pub fn bounded(mut self, max_body_bytes: u64) -> Self {
        cut_text(&mut self.source);
        cut_text(&mut self.key);
        cut_text(&mut self.error);
        if let Some(body) = &self.body {
            self.body_len = self.body_len.max(body.len() as u64);
            if body.len() as u64 > max_body_bytes {
                self.body = None;
            }
        }
        self
    }

    /// What the entry weighs against [`DeadLetterLimits::max_bytes`]: its body and texts.
    pub fn weight(&self) -> u64 {
        let body = self.body.as_ref().map_or(0, Vec::len);
        (body + self.source.len() + self.key.len() + self.error.len() + self.manifest.name().len())
            as u64
    }
}

/// The key of a dead letter that had a delivery id: `producer/incarnation/seq`.
pub fn delivery_key(info: &DeliveryInfo) -> String {
    format!("{}/{}/{}", info.producer_id, info.incarnation, info.seq)
}

/// An entry of a dead-letter store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredDeadLetter {
    /// The entry's id in its store: assigned in the order entries are first kept, never
    /// reused.
    pub id: u64,
    /// The letter as last kept.
    pub letter: NewDeadLetter,
    /// When it was first kept, in milliseconds since the Unix epoch.
    pub first_at_ms: u64,
    /// When it was last kept or a replay of it last failed.
    pub last_at_ms: u64,
    /// How many times a replay of it failed.
    pub replay_failures: u32,
}

impl StoredDeadLetter {
    /// A copy of the entry without its body (`body_len` kept); the body is not copied.
    pub fn without_body(&self) -> Self {
        let letter = &self.letter;
        Self {
            id: self.id,
            letter: NewDeadLetter {
                kind: letter.kind,
                source: letter.source.clone(),
                cause: letter.cause,
                key: letter.key.clone(),
                origin: letter.origin.clone(),
                manifest: letter.manifest.clone(),
                body: None,
                body_len: letter.body_len,
                attempts: letter.attempts,
                error: letter.error.clone(),
            },
            first_at_ms: self.first_at_ms,
            last_at_ms: self.last_at_ms,
            replay_failures: self.replay_failures,
        }
    }
}

/// How a store kept a letter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kept {
    /// The entry's id.
    pub id: u64,
    /// Whether it updated an entry of the same source and key.
    pub updated: bool,
    /// How many other entries were dropped to stay within the bounds ([`DeadLetterLimits`]).
    pub evicted: u64,
}

/// Which entries to list: every field that is set must match; oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeadLetterFilter {
    /// Only this cause.
    pub cause: Option<DeadLetterCause>,
    /// Only this kind of source.
    pub kind: Option<SourceKind>,
    /// Only this source name.
    pub source: Option<String>,
    /// Only entries last kept at or after this time (ms since the Unix epoch).
    pub since_ms: Option<u64>,
    /// Only entries last kept before this time.
    pub until_ms: Option<u64>,
    /// Only entries with a larger id (the `next` of the page before).
    pub after_id: Option<u64>,
    /// At most this many entries (1 to [`MAX_PAGE`]; [`DEFAULT_PAGE`] when unset).
    pub limit: Option<u32>,
    /// List the entries without their bodies (`letter.body` is `None`, `body_len` is kept):
    /// the store does not read them. Set by code (a listing that shows no body), never read
    /// from query pairs by [`parse`](Self::parse).
    pub without_bodies: bool,
}

/// The most entries one page lists.
pub const MAX_PAGE: u32 = 1000;
/// The entries a page lists when the filter names no limit.
pub const DEFAULT_PAGE: u32 = 100;

impl DeadLetterFilter {
    /// Reads a filter from `name=value` pairs (an HTTP query, command-line options): `cause`,
    /// `kind`, `source`, `since_ms`, `until_ms`, `after_id`, `limit`.
    ///
    /// # Errors
    /// A [`FieldError`] naming the first field that is unknown, repeated or malformed.
    pub fn parse<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, FieldError> {
        let mut filter = Self::default();
        for (name, value) in pairs {
            let repeated = match name {
                "cause" => filter.cause.replace(value.parse()?).is_some(),
                "kind" => filter.kind.replace(value.parse()?).is_some(),
                "source" => filter.source.replace(value.to_owned()).is_some(),
                "since_ms" => filter
                    .since_ms
                    .replace(number("since_ms", value)?)
                    .is_some(),
                "until_ms" => filter
                    .until_ms
                    .replace(number("until_ms", value)?)
                    .is_some(),
                "after_id" => filter
                    .after_id
                    .replace(number("after_id", value)?)
                    .is_some(),
                "limit" => {
                    let limit = number("limit", value)?;
                    if !(1..=u64::from(MAX_PAGE)).contains(&limit) {
                        return Err(FieldError::new(
                            "limit",
                            format!("{limit} is outside 1..={MAX_PAGE}"),
                        ));
                    }
                    filter.limit.replace(limit as u32).is_some()
                }
                _ => {
                    return Err(FieldError::new(
                        "filter",
                        format!(
                            "unknown field `{name}`; expected cause, kind, source, since_ms, \
                             until_ms, after_id or limit"
                        ),
                    ));
                }
            };
            if repeated {
                return Err(FieldError::new(field_name(name), "given twice"));
            }
        }
        Ok(filter)
    }

    /// The page size: `limit`, or [`DEFAULT_PAGE`], at most [`MAX_PAGE`].
    pub fn page_size(&self) -> usize {
        self.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE) as usize
    }

    /// Whether `entry` matches every field that is set (the page's `after_id` included).
    pub fn matches(&self, entry: &StoredDeadLetter) -> bool {
        let letter = &entry.letter;
        self.cause.is_none_or(|cause| cause == letter.cause)
            && self.kind.is_none_or(|kind| kind == letter.kind)
            && self
                .source
                .as_ref()
                .is_none_or(|source| *source == letter.source)
            && self.since_ms.is_none_or(|since| entry.last_at_ms >= since)
            && self.until_ms.is_none_or(|until| entry.last_at_ms < until)
            && self.after_id.is_none_or(|after| entry.id > after)
    }
}

/// One page of entries, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeadLetterPage {
    /// The entries.
    pub entries: Vec<StoredDeadLetter>,
    /// The `after_id` of the next page, if there may be one.
    pub next: Option<u64>,
}

impl DeadLetterPage {
    /// The page of `matching` (oldest first, at most one more than the page size) for
    /// `filter`: sets `next` when there is more.
    pub fn of(mut matching: Vec<StoredDeadLetter>, filter: &DeadLetterFilter) -> Self {
        let size = filter.page_size();
        let more = matching.len() > size;
        matching.truncate(size);
        let next = if more {
            matching.last().map(|entry| entry.id)
        } else {
            None
        };
        Self {
            entries: matching,
            next,
        }
    }
}

/// How many entries a store holds, by cause.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeadLetterCounts {
    /// Every entry.
    pub entries: u64,
    /// Their weight ([`NewDeadLetter::weight`]).
    pub bytes: u64,
    /// Entries by cause (causes with none are left out).
    pub by_cause: Vec<(DeadLetterCause, u64)>,
}

/// The bounds of a dead-letter store and of what it keeps of floods.
///
/// Beyond `max_entries` or `max_bytes`, a store drops the oldest entry a peer's input caused
/// ([`DeadLetterCause::is_peer_input`]); when none is left, the body of a peer's letter just
/// kept if only the bytes are over; then the oldest entry; never the entry just kept (counted
/// in [`Kept::evicted`]). A peer's flood so replaces its own entries, and takes of the
/// give-ups and poison of this process's parts at most the room of one entry without its
/// body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetterLimits {
    /// The most entries kept. Default 10 000.
    pub max_entries: u64,
    /// The most bytes kept ([`NewDeadLetter::weight`] summed). Default 64 MiB.
    pub max_bytes: u64,
    /// A body longer than this is not kept (its length and manifest are). Default 1 MiB.
    pub max_body_bytes: u64,
    /// Of dead letters caused by a peer's input (undecodable, incompatible, malformed), a
    /// source keeps at most this many at once per cause, then one per
    /// [`sample_interval_ms`](Self::sample_interval_ms); the rest are counted, not kept.
    /// Default 20.
    pub sample_burst: u32,
    /// See [`sample_burst`](Self::sample_burst). Default 1 000 (one a second).
    pub sample_interval_ms: u64,
}

impl Default for DeadLetterLimits {
    fn default() -> Self {
        Self {
            max_entries: 10_000,
            max_bytes: 64 << 20,
            max_body_bytes: 1 << 20,
            sample_burst: 20,
            sample_interval_ms: 1_000,
        }
    }
}

impl DeadLetterLimits {
    /// Checks every bound.
    ///
    /// # Errors
    /// An [`OptionsError`] naming the first bound that is 0, or a `max_body_bytes` above
    /// `max_bytes`.
    pub fn validate(&self) -> Result<(), OptionsError> {
        let zero = [
            ("max_entries", self.max_entries == 0),
            ("max_bytes", self.max_bytes == 0),
            ("max_body_bytes", self.max_body_bytes == 0),
            ("sample_burst", self.sample_burst == 0),
            ("sample_interval_ms", self.sample_interval_ms == 0),
        ];
        if let Some((field, _)) = zero.into_iter().find(|(_, zero)| *zero) {
            return Err(OptionsError::new(field, "must be at least 1"));
        }
        if self.max_body_bytes > self.max_bytes {
            return Err(OptionsError::new(
                "max_body_bytes",
                format!(
                    "{} is above max_bytes ({})",
                    self.max_body_bytes, self.max_bytes
                ),
            ));
        }
        Ok(())
    }
}

/// Bad input to a dead-letter operation: the field and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldError {
    /// The field (a filter's, a request's).
    pub field: &'static str,
    /// What is wrong.
    pub reason: String,
}

impl FieldError {
    /// The error of `field`.
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }
}

fn number(field: &'static str, value: &str) -> Result<u64, FieldError> {
    value
        .parse()
        .map_err(|_| FieldError::new(field, format!("`{value}` is not a whole number")))
}

fn one_of<const N: usize>(text: &str, names: [&str; N]) -> String {
    format!("`{text}` is not one of {}", names.join(", "))
}

fn field_name(name: &str) -> &'static str {
    [
        "cause", "kind", "source", "since_ms", "until_ms", "after_id", "limit",
    ]
    .into_iter()
    .find(|known| *known == name)
    .unwrap_or("filter")
}

/// Cuts `text` to [`MAX_TEXT_BYTES`] at a character boundary.
pub fn cut_text(text: &mut String) {
    if text.len() > MAX_TEXT_BYTES {
        let mut end = MAX_TEXT_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_parse_names_the_bad_field() {
        let filter = DeadLetterFilter::parse([("cause", "poison"), ("limit", "5")]).unwrap();
        assert_eq!(filter.cause, Some(DeadLetterCause::Poison));
        assert_eq!(filter.page_size(), 5);
        let field = |pairs: &[(&str, &str)]| {
            DeadLetterFilter::parse(pairs.iter().copied())
                .unwrap_err()
                .field
        };
        assert_eq!(field(&[("cause", "lost")]), "cause");
        assert_eq!(field(&[("kind", "x")]), "kind");
        assert_eq!(field(&[("limit", "0")]), "limit");
        assert_eq!(field(&[("limit", "1001")]), "limit");
        assert_eq!(field(&[("since_ms", "-1")]), "since_ms");
        assert_eq!(field(&[("after_id", "1"), ("after_id", "2")]), "after_id");
        assert_eq!(field(&[("colour", "red")]), "filter");
    }

    #[test]
    fn names_round_trip() {
        for cause in DeadLetterCause::ALL {
            assert_eq!(cause.as_str().parse::<DeadLetterCause>(), Ok(cause));
        }
        for kind in SourceKind::ALL {
            assert_eq!(kind.as_str().parse::<SourceKind>(), Ok(kind));
        }
    }

    #[test]
    fn limits_refuse_zero_and_a_body_above_the_total() {
        assert!(DeadLetterLimits::default().validate().is_ok());
        let field = |limits: DeadLetterLimits| limits.validate().unwrap_err().field;
        assert_eq!(
            field(DeadLetterLimits {
                max_entries: 0,
                ..Default::default()
            }),
            "max_entries"
        );
        assert_eq!(
            field(DeadLetterLimits {
                max_body_bytes: 10,
                max_bytes: 5,
                ..Default::default()
            }),
            "max_body_bytes"
        );
    }

    #[test]
    fn bounded_cuts_texts_at_a_character_boundary_and_drops_a_long_body() {
        let letter = NewDeadLetter {
            kind: SourceKind::Consumer,
            source: "é".repeat(MAX_TEXT_BYTES),
            cause: DeadLetterCause::Undecodable,
            key: String::new(),
            origin: None,
            manifest: Manifest::raw(),
            body: Some(vec![0; 11]),
            body_len: 0,
            attempts: 1,
            error: String::new(),
        }
        .bounded(10);
        assert_eq!(letter.source.len(), MAX_TEXT_BYTES);
        assert_eq!(letter.body, None);
        assert_eq!(letter.body_len, 11);
    }
}
