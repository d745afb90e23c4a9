//! The numeric settings of both controllers: plain structs with the documented defaults,
//! loadable with serde from an application's own configuration, validated before use.
//!
//! Durations are written in milliseconds (`resend_timeout_ms = 500`); a bound that can be
//! lifted takes a number or the word `"unbounded"` (for the idle TTL and the handler timeout:
//! never expire), in files exactly as [`Limit::Unbounded`] in Rust. A value of the wrong type
//! is an error that names the key, what was found and what is expected; the names in
//! [`OptionsError`] are these keys too.
//!
//! ```
//! # use actix_delivery_proto::config::{ConsumerConfig, Limit};
//! let config: ConsumerConfig = serde_json::from_str(
//!     r#"{ "max_producers": 64, "producer_idle_ttl_ms": "unbounded" }"#,
//! ).unwrap();
//! assert_eq!(config.max_producers, Limit::At(64));
//! assert_eq!(config.producer_idle_ttl, Limit::Unbounded);
//! assert_eq!(config.max_out_of_order, Limit::At(1024)); // default
//! ```

use std::fmt;
use std::time::Duration;

use serde::de::{self, Unexpected, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::OptionsError;
use crate::protocol::chunk::reassembly::{Lifetime, MIN_PART_CHARGE};
use crate::protocol::envelope::check_producer_id;

/// The longest duration any option accepts: keeps deadline arithmetic far from overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// A bound that can be lifted: `At(n)` or `Unbounded` (`"unbounded"` in settings files).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit<N> {
    /// At most this much.
    At(N),
    /// No bound (for a timeout or TTL: never expire).
    Unbounded,
}

impl<N: Copy> Limit<N> {
    /// The bound, or `None` when unbounded.
    pub fn get(self) -> Option<N> {
        match self {
            Self::At(n) => Some(n),
            Self::Unbounded => None,
        }
    }
}

impl From<usize> for Limit<usize> {
    fn from(n: usize) -> Self {
        Self::At(n)
    }
}

impl From<u32> for Limit<u32> {
    fn from(n: u32) -> Self {
        Self::At(n)
    }
}

impl From<Duration> for Limit<Duration> {
    fn from(d: Duration) -> Self {
        Self::At(d)
    }
}

/// How the interval between retransmissions of one message grows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Backoff {
    /// Retransmit every `resend_timeout`.
    #[default]
    Fixed,
    /// The n-th wait is `resend_timeout * multiplier^(n-1)`, capped at `max`, then shortened
    /// by a random fraction of up to `jitter` (so that many producers do not retransmit in
    /// lockstep).
    Exponential {
        /// Growth factor per retransmission, at least 1.
        multiplier: f64,
        /// The longest wait, at least `resend_timeout`.
        #[serde(rename = "max_ms", with = "millis::max_ms")]
        max: Duration,
        /// Fraction in `0.0..=1.0` by which a wait may be randomly shortened.
        jitter: f64,
    },
}

/// Producer settings. `Default` gives the documented defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProducerConfig {
    /// At most this many un-ACKed messages in flight. Default 16; must be positive.
    pub window_size: usize,
    /// Retransmit an un-ACKed message after this long. Default 500 ms; must be positive.
    #[serde(rename = "resend_timeout_ms", with = "millis::resend_timeout_ms")]
    pub resend_timeout: Duration,
    /// The producer's id; `None` draws `producer-` + 16 random hex digits. Non-empty, at most
    /// 256 bytes.
    pub producer_id: Option<String>,
    /// At most this many messages wait for the window; beyond, sends are refused (`tell`) or
    /// wait (`send`). Default 100 000; must be positive.
    pub max_pending: usize,
    /// Give a message up after this many transmissions. Default unbounded.
    #[serde(deserialize_with = "field::max_attempts")]
    pub max_attempts: Limit<u32>,
    /// Interval growth between retransmissions. Default fixed.
    pub backoff: Backoff,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        Self {
            window_size: 16,
            resend_timeout: Duration::from_millis(500),
            producer_id: None,
            max_pending: 100_000,
            max_attempts: Limit::Unbounded,
            backoff: Backoff::Fixed,
        }
    }
}

impl ProducerConfig {
    /// Checks every rule; the error names the first offending field.
    ///
    /// # Errors
    /// [`OptionsError`] naming the field and the rule it breaks.
    pub fn validate(&self) -> Result<(), OptionsError> {
        positive("window_size", self.window_size)?;
        duration("resend_timeout_ms", self.resend_timeout)?;
        if let Some(id) = &self.producer_id {
            check_producer_id(id).map_err(|e| OptionsError::new("producer_id", e.to_string()))?;
        }
        positive("max_pending", self.max_pending)?;
        if self.max_attempts == Limit::At(0) {
            return Err(OptionsError::new(
                "max_attempts",
                "must be positive or unbounded",
            ));
        }
        if let Backoff::Exponential {
            multiplier,
            max,
            jitter,
        } = self.backoff
        {
            if !(multiplier.is_finite() && multiplier >= 1.0) {
                return Err(OptionsError::new(
                    "backoff.multiplier",
                    format!("must be a finite number of at least 1 (got {multiplier})"),
                ));
            }
            if max < self.resend_timeout || max > MAX_DURATION {
                return Err(OptionsError::new(
                    "backoff.max_ms",
                    format!("must lie between resend_timeout and 365 days (got {max:?})"),
                ));
            }
            if !(0.0..=1.0).contains(&jitter) {
                return Err(OptionsError::new(
                    "backoff.jitter",
                    format!("must lie in 0.0..=1.0 (got {jitter})"),
                ));
            }
        }
        Ok(())
    }
}

/// Consumer settings. `Default` gives the documented defaults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsumerConfig {
    /// Producer ids kept in the dedup table at once; the least recently used is evicted beyond
    /// (with its windows: each id keeps at most
    /// [`MAX_INCARNATIONS_PER_ID`](crate::protocol::dedup::MAX_INCARNATIONS_PER_ID)
    /// incarnation windows). Default 1024; positive or unbounded.
    #[serde(deserialize_with = "field::max_producers")]
    pub max_producers: Limit<usize>,
    /// A producer's windows are swept after this long without a delivery from it. Default
    /// 300 s; positive or `Unbounded` (never). Keep it well above the longest gap between a
    /// producer's retransmissions: `resend_timeout`, or with exponential backoff up to
    /// `backoff.max`.
    #[serde(
        rename = "producer_idle_ttl_ms",
        with = "limit_millis::producer_idle_ttl_ms"
    )]
    pub producer_idle_ttl: Limit<Duration>,
    /// Per producer, at most this many seqs are retained above the contiguous mark (handled
    /// out of order or waiting for the handler); further out-of-order deliveries are refused
    /// until the gap closes (the gap-closing seq is always admitted, so this cannot deadlock).
    /// Default 1024; positive or unbounded.
    #[serde(deserialize_with = "field::max_out_of_order")]
    pub max_out_of_order: Limit<usize>,
    /// Run each producer's messages strictly in seq order. Default false.
    pub ordered: bool,
    /// A handler run that has not finished after this long is abandoned: its future is
    /// dropped, it counts as a failure (no ACK; the message runs again when retransmitted), and
    /// the next message runs. Handlers run one at a time, so without a bound one stuck run (a
    /// lost reply, a deadlock) would stall every producer of the consumer for good. Default
    /// 30 s, far above any sane per-message work; positive or `Unbounded` (never abandon).
    #[serde(
        rename = "handler_timeout_ms",
        with = "limit_millis::handler_timeout_ms"
    )]
    pub handler_timeout: Limit<Duration>,
    /// The longest chunked message accepted, in bytes (as its producer encoded it); longer
    /// ones are dead letters. Default 64 MiB; positive. See
    /// [`chunk`](crate::protocol::chunk).
    pub max_message_bytes: u64,
    /// The most bytes of chunked messages held at once, over all producers: reserved by
    /// messages being reassembled (each its whole length, at least [`MIN_PART_CHARGE`] a
    /// chunk) and held by reassembled messages waiting for the handler. Beyond, chunks are
    /// refused (their producers retransmit them; see `reassembly_grace` for who gets room
    /// first). Default 256 MiB; at least `max_message_bytes` and [`MIN_PART_CHARGE`].
    pub max_reassembly_bytes: u64,
    /// What every partial message gets of its lifetime, whatever its length: a message being
    /// reassembled is dropped `reassembly_grace + its length / min_reassembly_rate` after its
    /// first chunk was buffered, whatever arrives later (so neither a producer that stopped
    /// nor one that trickles chunks holds room for longer). A message refused for room keeps
    /// its place in line while its producer retransmits it at least once per grace. Settings
    /// key `reassembly_grace_ms`; default 5 s; positive, at most 365 days. See
    /// [`reassembly`](crate::protocol::chunk::reassembly).
    #[serde(rename = "reassembly_grace_ms", with = "millis::reassembly_grace_ms")]
    pub reassembly_grace: Duration,
    /// The slowest rate, in bytes per second, at which a chunked message is expected to
    /// arrive (see `reassembly_grace`): a message of 64 MiB gets 64 s more than the grace at
    /// the default 1 MiB/s. Positive; the lifetime of a message of `max_message_bytes` must
    /// be at most 365 days.
    pub min_reassembly_rate: u64,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            max_producers: Limit::At(1024),
            producer_idle_ttl: Limit::At(Duration::from_secs(300)),
            max_out_of_order: Limit::At(1024),
            ordered: false,
            handler_timeout: Limit::At(Duration::from_secs(30)),
            max_message_bytes: 64 << 20,
            max_reassembly_bytes: 256 << 20,
            reassembly_grace: Duration::from_secs(5),
            min_reassembly_rate: 1 << 20,
        }
    }
}

impl ConsumerConfig {
    /// Checks every rule; the error names the first offending field.
    ///
    /// # Errors
    /// [`OptionsError`] naming the field and the rule it breaks.
    pub fn validate(&self) -> Result<(), OptionsError> {
        if let Limit::At(n) = self.max_producers {
            positive("max_producers", n)?;
        }
        if let Limit::At(ttl) = self.producer_idle_ttl {
            duration("producer_idle_ttl_ms", ttl)?;
        }
        if let Limit::At(n) = self.max_out_of_order {
            positive("max_out_of_order", n)?;
        }
        if let Limit::At(timeout) = self.handler_timeout {
            duration("handler_timeout_ms", timeout)?;
        }
        if self.max_message_bytes == 0 {
            return Err(OptionsError::new(
                "max_message_bytes",
                "must be positive (got 0)",
            ));
        }
        let least = self.max_message_bytes.max(MIN_PART_CHARGE);
        if self.max_reassembly_bytes < least {
            return Err(OptionsError::new(
                "max_reassembly_bytes",
                format!(
                    "must be at least max_message_bytes and {MIN_PART_CHARGE} ({least}), or a \
                     message of that size could never be reassembled (got {})",
                    self.max_reassembly_bytes
                ),
            ));
        }
        duration("reassembly_grace_ms", self.reassembly_grace)?;
        if self.min_reassembly_rate == 0 {
            return Err(OptionsError::new(
                "min_reassembly_rate",
                "must be positive (got 0)",
            ));
        }
        let longest = self.reassembly_lifetime().of(self.max_message_bytes);
        if longest > MAX_DURATION {
            return Err(OptionsError::new(
                "min_reassembly_rate",
                format!(
                    "a message of max_message_bytes would be given {longest:?} to arrive at \
                     this rate: at most 365 days"
                ),
            ));
        }
        Ok(())
    }

    /// How long a partial message may take to arrive.
    pub(crate) fn reassembly_lifetime(&self) -> Lifetime {
        Lifetime {
            grace: self.reassembly_grace,
            min_rate: self.min_reassembly_rate,
        }
    }
}

/// Checks an application's `metrics_label` (feature `metrics`): a label value must not be
/// empty.
pub fn check_label(label: &str) -> Result<(), OptionsError> {
    if label.is_empty() {
        return Err(OptionsError::new(
            "metrics_label",
            "must not be empty (got \"\")",
        ));
    }
    Ok(())
}

/// `value` is positive, or an error naming `field`.
pub fn positive(field: &'static str, value: usize) -> Result<(), OptionsError> {
    if value == 0 {
        return Err(OptionsError::new(field, "must be positive (got 0)"));
    }
    Ok(())
}

/// `value` is positive and at most [`MAX_DURATION`], or an error naming `field`.
pub fn duration(field: &'static str, value: Duration) -> Result<(), OptionsError> {
    if value.is_zero() || value > MAX_DURATION {
        return Err(OptionsError::new(
            field,
            format!("must be positive and at most 365 days (got {value:?})"),
        ));
    }
    Ok(())
}

/// The word for [`Limit::Unbounded`] in settings files.
const UNBOUNDED: &str = "unbounded";

/// Reads a limit: a whole number up to `max`, or the word `"unbounded"`. `field` names the
/// settings key in errors.
struct LimitVisitor {
    field: &'static str,
    max: u64,
    unit: &'static str,
}

impl<'de> Visitor<'de> for LimitVisitor {
    type Value = Limit<u64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "for `{}` a whole number{} from 0 to {} or \"{UNBOUNDED}\"",
            self.field, self.unit, self.max
        )
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        if v > self.max {
            return Err(E::invalid_value(Unexpected::Unsigned(v), &self));
        }
        Ok(Limit::At(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => Err(E::invalid_value(Unexpected::Signed(v), &self)),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Err(E::invalid_type(Unexpected::Float(v), &self))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        if v == UNBOUNDED {
            return Ok(Limit::Unbounded);
        }
        Err(E::invalid_value(Unexpected::Str(v), &self))
    }
}

fn read_limit<'de, D: Deserializer<'de>>(
    deserializer: D,
    field: &'static str,
    max: u64,
    unit: &'static str,
) -> Result<Limit<u64>, D::Error> {
    deserializer.deserialize_any(LimitVisitor { field, max, unit })
}

/// Deserializers of the count limits, one per settings key so that errors name it.
mod field {
    use super::*;

    fn count<'de, D: Deserializer<'de>, N: TryFrom<u64>>(
        deserializer: D,
        field: &'static str,
        max: u64,
    ) -> Result<Limit<N>, D::Error> {
        Ok(match read_limit(deserializer, field, max, "")? {
            // `read_limit` checked `n <= max`, the largest `N`.
            Limit::At(n) => Limit::At(N::try_from(n).map_err(|_| de::Error::custom(field))?),
            Limit::Unbounded => Limit::Unbounded,
        })
    }

    pub fn max_attempts<'de, D: Deserializer<'de>>(d: D) -> Result<Limit<u32>, D::Error> {
        count(d, "max_attempts", u32::MAX.into())
    }

    pub fn max_producers<'de, D: Deserializer<'de>>(d: D) -> Result<Limit<usize>, D::Error> {
        count(d, "max_producers", usize::MAX as u64)
    }

    pub fn max_out_of_order<'de, D: Deserializer<'de>>(d: D) -> Result<Limit<usize>, D::Error> {
        count(d, "max_out_of_order", usize::MAX as u64)
    }
}

impl<N: Serialize + Copy> Serialize for Limit<N> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match *self {
            Self::At(n) => n.serialize(serializer),
            Self::Unbounded => serializer.serialize_str(UNBOUNDED),
        }
    }
}

/// A whole number of milliseconds, naming its settings key in errors.
struct MillisVisitor(&'static str);

impl Visitor<'_> for MillisVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "for `{}` a whole number of milliseconds", self.0)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
        Ok(Duration::from_millis(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
        u64::try_from(v)
            .map(Duration::from_millis)
            .map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
    }
}

/// Serializes and reads durations as whole numbers of milliseconds; [`millis_key!`] makes
/// the module of one settings key (`#[serde(with = …)]`) from these.
pub mod millis {
    use super::*;

    /// Writes `d` as a whole number of milliseconds (saturating at `u64::MAX`).
    pub fn serialize<S: Serializer>(d: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        u64::try_from(d.as_millis())
            .unwrap_or(u64::MAX)
            .serialize(serializer)
    }

    /// Reads a whole number of milliseconds; errors name `field`.
    pub fn read<'de, D: Deserializer<'de>>(
        d: D,
        field: &'static str,
    ) -> Result<Duration, D::Error> {
        d.deserialize_u64(MillisVisitor(field))
    }

    crate::config::millis_key!(resend_timeout_ms, "resend_timeout_ms");
    crate::config::millis_key!(stop_timeout_ms, "stop_timeout_ms");
    crate::config::millis_key!(max_ms, "backoff.max_ms");
    crate::config::millis_key!(reassembly_grace_ms, "reassembly_grace_ms");
    crate::config::optional_millis_key!(lease_ms, "lease_ms");
}

/// `mod $name` for `#[serde(with = "…::$name")]` on a `Duration`: a whole number of
/// milliseconds, whose errors name the settings key `$key`. Every duration of every settings
/// struct of the crate is read through this (one rule, one place).
#[doc(hidden)]
#[macro_export]
macro_rules! millis_key {
    ($name:ident, $key:literal) => {
        #[allow(dead_code)] // a struct may only be read or only be written
        pub(crate) mod $name {
            pub(crate) use $crate::config::millis::serialize;

            pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>>(
                d: D,
            ) -> Result<std::time::Duration, D::Error> {
                $crate::config::millis::read(d, $key)
            }
        }
    };
}
#[doc(hidden)]
pub use millis_key;

/// `mod $name` for `#[serde(with = "…::$name")]` on an `Option<Duration>` that is off (`None`)
/// when its key is absent (with `#[serde(default, skip_serializing_if = "Option::is_none")]`):
/// a whole number of milliseconds, whose errors name the settings key `$key`.
#[doc(hidden)]
#[macro_export]
macro_rules! optional_millis_key {
    ($name:ident, $key:literal) => {
        #[allow(dead_code)]
        pub(crate) mod $name {
            pub(crate) fn serialize<S: serde::Serializer>(
                duration: &Option<std::time::Duration>,
                serializer: S,
            ) -> Result<S::Ok, S::Error> {
                match duration {
                    Some(duration) => $crate::config::millis::serialize(duration, serializer),
                    None => serializer.serialize_none(),
                }
            }

            pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>>(
                d: D,
            ) -> Result<Option<std::time::Duration>, D::Error> {
                $crate::config::millis::read(d, $key).map(Some)
            }
        }
    };
}
#[doc(hidden)]
pub use optional_millis_key;

/// `mod $name` for `#[serde(with = "…::$name")]` on an `Option<u64>` bound whose `None` is no
/// bound: a whole number, or the word `"unbounded"` (for `None`, as [`Limit::Unbounded`]),
/// with errors naming the settings key `$key`. Only the SQLite journal's options have such a
/// bound.
#[doc(hidden)]
#[macro_export]
macro_rules! optional_limit_key {
    ($name:ident, $key:literal) => {
        #[allow(dead_code)]
        pub(crate) mod $name {
            pub(crate) fn serialize<S: serde::Serializer>(
                bound: &Option<u64>,
                serializer: S,
            ) -> Result<S::Ok, S::Error> {
                $crate::config::optional_limit::serialize(bound, serializer)
            }

            pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>>(
                d: D,
            ) -> Result<Option<u64>, D::Error> {
                $crate::config::optional_limit::read(d, $key)
            }
        }
    };
}
#[doc(hidden)]
pub use optional_limit_key;

/// What [`optional_limit_key!`] expands to.
pub mod optional_limit {
    use super::*;

    /// Writes a bound as [`Limit`] does (`None` as `"unbounded"`).
    pub fn serialize<S: Serializer>(bound: &Option<u64>, serializer: S) -> Result<S::Ok, S::Error> {
        Limit::from_option(*bound).serialize(serializer)
    }

    /// Reads a bound as [`Limit`] does; errors name `field`.
    pub fn read<'de, D: Deserializer<'de>>(
        d: D,
        field: &'static str,
    ) -> Result<Option<u64>, D::Error> {
        Ok(read_limit(d, field, u64::MAX, "")?.get())
    }
}

// Only the SQLite journal's options keep bounds as `Option`s.
impl<N> Limit<N> {
    fn from_option(bound: Option<N>) -> Self {
        bound.map_or(Self::Unbounded, Self::At)
    }
}

/// Values set on a builder, applied over the loaded settings when it builds: so a builder
/// value wins over a loaded one, which wins over the default, whatever order the calls come
/// in. Every builder of the crate that takes loaded settings keeps its values in one.
pub struct Overrides<C>(Vec<Setter<C>>);

/// One builder value: how it changes the settings.
type Setter<C> = Box<dyn FnOnce(&mut C) + Send>;

impl<C> Default for Overrides<C> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<C> Overrides<C> {
    /// Records a builder value.
    pub fn set(&mut self, setter: impl FnOnce(&mut C) + Send + 'static) {
        self.0.push(Box::new(setter));
    }

    /// `loaded`, with the builder values over it.
    pub fn apply(self, mut loaded: C) -> C {
        for set in self.0 {
            set(&mut loaded);
        }
        loaded
    }
}

impl<C> fmt::Debug for Overrides<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} builder value(s)", self.0.len())
    }
}

/// Deserializers of the duration limits, one per settings key so that errors name it.
pub mod limit_millis {
    use super::*;

    /// Writes a limit of milliseconds (`"unbounded"` for none).
    pub fn serialize<S: Serializer>(
        limit: &Limit<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match limit {
            Limit::At(d) => super::millis::serialize(d, serializer),
            Limit::Unbounded => serializer.serialize_str(UNBOUNDED),
        }
    }

    fn read<'de, D: Deserializer<'de>>(
        deserializer: D,
        field: &'static str,
    ) -> Result<Limit<Duration>, D::Error> {
        Ok(
            match read_limit(deserializer, field, u64::MAX, " of milliseconds")? {
                Limit::At(ms) => Limit::At(Duration::from_millis(ms)),
                Limit::Unbounded => Limit::Unbounded,
            },
        )
    }

    /// The `producer_idle_ttl_ms` key.
    pub mod producer_idle_ttl_ms {
        pub use super::serialize;
        use super::*;

        /// Reads it; errors name `producer_idle_ttl_ms`.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Limit<Duration>, D::Error> {
            read(d, "producer_idle_ttl_ms")
        }
    }

    /// The `handler_timeout_ms` key.
    pub mod handler_timeout_ms {
        pub use super::serialize;
        use super::*;

        /// Reads it; errors name `handler_timeout_ms`.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Limit<Duration>, D::Error> {
            read(d, "handler_timeout_ms")
        }
    }

    /// The `idle_timeout_ms` key.
    pub mod idle_timeout_ms {
        pub use super::serialize;
        use super::*;

        /// Reads it; errors name `idle_timeout_ms`.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Limit<Duration>, D::Error> {
            read(d, "idle_timeout_ms")
        }
    }
}

impl<N: fmt::Display> fmt::Display for Limit<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::At(n) => n.fmt(f),
            Self::Unbounded => f.write_str("unbounded"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn producer_error(config: ProducerConfig) -> &'static str {
        config.validate().unwrap_err().field
    }

    #[test]
    fn defaults_are_the_documented_ones_and_valid() {
        let p = ProducerConfig::default();
        assert_eq!(p.window_size, 16);
        assert_eq!(p.resend_timeout, Duration::from_millis(500));
        assert_eq!(p.max_pending, 100_000);
        assert_eq!(p.max_attempts, Limit::Unbounded);
        assert_eq!(p.backoff, Backoff::Fixed);
        assert_eq!(p.validate(), Ok(()));
        let c = ConsumerConfig::default();
        assert_eq!(c.max_producers, Limit::At(1024));
        assert_eq!(c.producer_idle_ttl, Limit::At(Duration::from_secs(300)));
        assert_eq!(c.max_out_of_order, Limit::At(1024));
        assert!(!c.ordered);
        assert_eq!(c.reassembly_grace, Duration::from_secs(5));
        assert_eq!(c.min_reassembly_rate, 1 << 20);
        assert_eq!(
            c.reassembly_lifetime().of(c.max_message_bytes),
            Duration::from_secs(69),
            "a message of max_message_bytes"
        );
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn invalid_producer_settings_name_the_field() {
        let base = ProducerConfig::default;
        let cases = [
            (
                ProducerConfig {
                    window_size: 0,
                    ..base()
                },
                "window_size",
            ),
            (
                ProducerConfig {
                    resend_timeout: Duration::ZERO,
                    ..base()
                },
                "resend_timeout_ms",
            ),
            (
                ProducerConfig {
                    resend_timeout: MAX_DURATION * 2,
                    ..base()
                },
                "resend_timeout_ms",
            ),
            (
                ProducerConfig {
                    producer_id: Some(String::new()),
                    ..base()
                },
                "producer_id",
            ),
            (
                ProducerConfig {
                    producer_id: Some("x".repeat(257)),
                    ..base()
                },
                "producer_id",
            ),
            (
                ProducerConfig {
                    max_pending: 0,
                    ..base()
                },
                "max_pending",
            ),
            (
                ProducerConfig {
                    max_attempts: Limit::At(0),
                    ..base()
                },
                "max_attempts",
            ),
        ];
        for (config, field) in cases {
            assert_eq!(producer_error(config), field);
        }
        let ok = ProducerConfig {
            producer_id: Some("x".repeat(256)),
            ..base()
        };
        assert_eq!(ok.validate(), Ok(()));
        let err = ProducerConfig {
            window_size: 0,
            ..base()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid option `window_size`: must be positive (got 0)"
        );
    }

    #[test]
    fn invalid_backoff_names_the_field() {
        let exp = |multiplier, max, jitter| ProducerConfig {
            backoff: Backoff::Exponential {
                multiplier,
                max,
                jitter,
            },
            ..ProducerConfig::default()
        };
        let second = Duration::from_secs(1);
        assert_eq!(exp(2.0, second, 0.5).validate(), Ok(()));
        assert_eq!(producer_error(exp(0.5, second, 0.0)), "backoff.multiplier");
        assert_eq!(
            producer_error(exp(f64::NAN, second, 0.0)),
            "backoff.multiplier"
        );
        assert_eq!(
            producer_error(exp(2.0, Duration::from_millis(100), 0.0)),
            "backoff.max_ms"
        );
        assert_eq!(producer_error(exp(2.0, second, 1.5)), "backoff.jitter");
    }

    #[test]
    fn invalid_consumer_settings_name_the_field() {
        let base = ConsumerConfig::default;
        let cases = [
            (
                ConsumerConfig {
                    max_producers: Limit::At(0),
                    ..base()
                },
                "max_producers",
            ),
            (
                ConsumerConfig {
                    producer_idle_ttl: Limit::At(Duration::ZERO),
                    ..base()
                },
                "producer_idle_ttl_ms",
            ),
            (
                ConsumerConfig {
                    handler_timeout: Limit::At(Duration::ZERO),
                    ..base()
                },
                "handler_timeout_ms",
            ),
            (
                ConsumerConfig {
                    max_out_of_order: Limit::At(0),
                    ..base()
                },
                "max_out_of_order",
            ),
            (
                ConsumerConfig {
                    max_message_bytes: 0,
                    ..base()
                },
                "max_message_bytes",
            ),
            (
                ConsumerConfig {
                    max_message_bytes: 1000,
                    max_reassembly_bytes: 999,
                    ..base()
                },
                "max_reassembly_bytes",
            ),
            (
                ConsumerConfig {
                    max_message_bytes: 1,
                    max_reassembly_bytes: MIN_PART_CHARGE - 1,
                    ..base()
                },
                "max_reassembly_bytes",
            ),
            (
                ConsumerConfig {
                    reassembly_grace: Duration::ZERO,
                    ..base()
                },
                "reassembly_grace_ms",
            ),
            (
                ConsumerConfig {
                    min_reassembly_rate: 0,
                    ..base()
                },
                "min_reassembly_rate",
            ),
            (
                ConsumerConfig {
                    max_message_bytes: u64::MAX,
                    max_reassembly_bytes: u64::MAX,
                    min_reassembly_rate: 1,
                    ..base()
                },
                "min_reassembly_rate",
            ),
        ];
        for (config, field) in cases {
            assert_eq!(config.validate().unwrap_err().field, field);
        }
        let unbounded = ConsumerConfig {
            max_producers: Limit::Unbounded,
            producer_idle_ttl: Limit::Unbounded,
            max_out_of_order: Limit::Unbounded,
            ordered: true,
            handler_timeout: Limit::Unbounded,
            max_message_bytes: 1,
            max_reassembly_bytes: MIN_PART_CHARGE,
            reassembly_grace: MAX_DURATION - Duration::from_secs(1),
            min_reassembly_rate: 1,
        };
        assert_eq!(unbounded.validate(), Ok(()));
    }

    #[test]
    fn settings_load_from_serde_with_defaults_for_missing_fields() {
        let p: ProducerConfig = serde_json::from_str(
            r#"{"window_size": 64, "resend_timeout_ms": 250, "max_attempts": 5,
                "backoff": {"exponential": {"multiplier": 2.0, "max_ms": 4000, "jitter": 0.1}}}"#,
        )
        .unwrap();
        assert_eq!(p.window_size, 64);
        assert_eq!(p.resend_timeout, Duration::from_millis(250));
        assert_eq!(p.max_attempts, Limit::At(5));
        assert_eq!(p.max_pending, 100_000);
        assert!(
            matches!(p.backoff, Backoff::Exponential { max, .. } if max == Duration::from_secs(4))
        );
        let c: ConsumerConfig = serde_json::from_str(
            r#"{"max_out_of_order": "unbounded", "ordered": true, "reassembly_grace_ms": 2000,
                "min_reassembly_rate": 4096}"#,
        )
        .unwrap();
        assert_eq!(c.max_out_of_order, Limit::Unbounded);
        assert!(c.ordered);
        assert_eq!(c.reassembly_grace, Duration::from_secs(2));
        assert_eq!(c.min_reassembly_rate, 4096);
        assert_eq!(c.max_producers, Limit::At(1024));
    }

    #[test]
    fn settings_round_trip_and_reject_typos_and_bad_words() {
        let c = ConsumerConfig {
            producer_idle_ttl: Limit::Unbounded,
            ..Default::default()
        };
        let json = serde_json::to_string(&c).unwrap();
        assert!(
            json.contains(r#""producer_idle_ttl_ms":"unbounded""#),
            "{json}"
        );
        assert!(json.contains(r#""handler_timeout_ms":30000"#), "{json}");
        assert_eq!(serde_json::from_str::<ConsumerConfig>(&json).unwrap(), c);
        let p = ProducerConfig::default();
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<ProducerConfig>(&json).unwrap(), p);
        assert!(serde_json::from_str::<ConsumerConfig>(r#"{"max_producer": 3}"#).is_err());
    }

    /// The error of a settings file with `json` in it.
    fn error_of<C: serde::de::DeserializeOwned + fmt::Debug>(json: &str) -> String {
        serde_json::from_str::<C>(json).unwrap_err().to_string()
    }

    #[test]
    fn a_value_of_the_wrong_type_names_the_key_what_was_found_and_what_is_expected() {
        let cases = [
            (
                error_of::<ConsumerConfig>(r#"{"max_producers": -1}"#),
                "invalid value: integer `-1`, expected for `max_producers` a whole number",
            ),
            (
                error_of::<ConsumerConfig>(r#"{"max_out_of_order": 2.5}"#),
                "invalid type: floating point `2.5`, expected for `max_out_of_order` a whole",
            ),
            (
                error_of::<ConsumerConfig>(r#"{"max_producers": true}"#),
                "invalid type: boolean `true`, expected for `max_producers` a whole number",
            ),
            (
                error_of::<ConsumerConfig>(r#"{"max_producers": "lots"}"#),
                "invalid value: string \"lots\", expected for `max_producers` a whole number",
            ),
            (
                error_of::<ConsumerConfig>(r#"{"producer_idle_ttl_ms": "never"}"#),
                "expected for `producer_idle_ttl_ms` a whole number of milliseconds from 0 to \
                 18446744073709551615 or \"unbounded\"",
            ),
            (
                error_of::<ConsumerConfig>(r#"{"handler_timeout_ms": -5}"#),
                "expected for `handler_timeout_ms` a whole number of milliseconds",
            ),
            (
                error_of::<ProducerConfig>(r#"{"max_attempts": 4294967296}"#),
                "invalid value: integer `4294967296`, expected for `max_attempts` a whole \
                 number from 0 to 4294967295 or \"unbounded\"",
            ),
            (
                error_of::<ProducerConfig>(r#"{"resend_timeout_ms": 0.5}"#),
                "invalid type: floating point `0.5`, expected for `resend_timeout_ms` a whole \
                 number of milliseconds",
            ),
            (
                error_of::<ProducerConfig>(
                    r#"{"backoff": {"exponential": {"multiplier": 2.0, "max_ms": "x", "jitter": 0}}}"#,
                ),
                "expected for `backoff.max_ms` a whole number of milliseconds",
            ),
        ];
        for (error, expected) in cases {
            assert!(
                error.contains(expected),
                "{error}\n  does not contain\n{expected}"
            );
        }
        let max = serde_json::from_str::<ProducerConfig>(r#"{"max_attempts": 4294967295}"#);
        assert_eq!(max.unwrap().max_attempts, Limit::At(u32::MAX));
    }

    #[test]
    fn validation_errors_and_settings_keys_agree() {
        let keys: serde_json::Value = serde_json::to_value(ConsumerConfig::default()).unwrap();
        let producer_keys = serde_json::to_value(ProducerConfig::default()).unwrap();
        let invalid = [
            ConsumerConfig {
                max_producers: Limit::At(0),
                ..Default::default()
            }
            .validate(),
            ConsumerConfig {
                producer_idle_ttl: Limit::At(Duration::ZERO),
                ..Default::default()
            }
            .validate(),
            ConsumerConfig {
                max_out_of_order: Limit::At(0),
                ..Default::default()
            }
            .validate(),
            ConsumerConfig {
                handler_timeout: Limit::At(Duration::ZERO),
                ..Default::default()
            }
            .validate(),
            ConsumerConfig {
                reassembly_grace: Duration::ZERO,
                ..Default::default()
            }
            .validate(),
            ConsumerConfig {
                min_reassembly_rate: 0,
                ..Default::default()
            }
            .validate(),
            ProducerConfig {
                window_size: 0,
                ..Default::default()
            }
            .validate(),
            ProducerConfig {
                resend_timeout: Duration::ZERO,
                ..Default::default()
            }
            .validate(),
            ProducerConfig {
                max_pending: 0,
                ..Default::default()
            }
            .validate(),
            ProducerConfig {
                max_attempts: Limit::At(0),
                ..Default::default()
            }
            .validate(),
        ];
        for result in invalid {
            let field = result.unwrap_err().field;
            assert!(
                keys.get(field).is_some() || producer_keys.get(field).is_some(),
                "`{field}` is not a settings key"
            );
        }
    }
}
