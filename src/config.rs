//! The numeric settings of both controllers: plain structs with the documented defaults,
//! loadable with serde from an application's own configuration, validated before use.
//!
//! Durations are written in milliseconds (`resend_timeout_ms = 500`); a bound that can be
//! lifted takes a number or the word `"unbounded"` (`"never"` for the idle TTL).
//!
//! ```
//! # use actix_delivery::{ConsumerConfig, Limit};
//! # use std::time::Duration;
//! let config: ConsumerConfig = serde_json::from_str(
//!     r#"{ "max_producers": 64, "producer_idle_ttl_ms": "never" }"#,
//! ).unwrap();
//! assert_eq!(config.max_producers, Limit::At(64));
//! assert_eq!(config.producer_idle_ttl, Limit::Unbounded);
//! assert_eq!(config.max_out_of_order, Limit::At(1024)); // default
//! ```

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::OptionsError;
use crate::protocol::envelope::check_producer_id;

/// The longest duration any option accepts: keeps deadline arithmetic far from overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// A bound that can be lifted: `At(n)` or `Unbounded`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit<N> {
    /// At most this much.
    At(N),
    /// No bound (for the idle TTL: never expire).
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
        #[serde(rename = "max_ms", with = "millis")]
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
    #[serde(rename = "resend_timeout_ms", with = "millis")]
    pub resend_timeout: Duration,
    /// The producer's id; `None` draws `producer-` + 16 random hex digits. Non-empty, at most
    /// 256 bytes.
    pub producer_id: Option<String>,
    /// At most this many messages wait for the window; beyond, sends are refused (`tell`) or
    /// wait (`send`). Default 100 000; must be positive.
    pub max_pending: usize,
    /// Give a message up after this many transmissions. Default unbounded.
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
        duration("resend_timeout", self.resend_timeout)?;
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
                    "backoff.max",
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
    /// Dedup windows kept at once; the least recently used is evicted beyond. Default 1024;
    /// positive or unbounded.
    pub max_producers: Limit<usize>,
    /// A producer's window is swept after this long without a delivery from it. Default
    /// 300 s; positive or `Unbounded` (never).
    #[serde(rename = "producer_idle_ttl_ms", with = "limit_millis")]
    pub producer_idle_ttl: Limit<Duration>,
    /// Per producer, at most this many seqs are retained above the contiguous mark (handled
    /// out of order or waiting for the handler); further out-of-order deliveries are refused
    /// until the gap closes. Default 1024; positive or unbounded.
    pub max_out_of_order: Limit<usize>,
    /// Run each producer's messages strictly in seq order. Default false.
    pub ordered: bool,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            max_producers: Limit::At(1024),
            producer_idle_ttl: Limit::At(Duration::from_secs(300)),
            max_out_of_order: Limit::At(1024),
            ordered: false,
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
            duration("producer_idle_ttl", ttl)?;
        }
        if let Limit::At(n) = self.max_out_of_order {
            positive("max_out_of_order", n)?;
        }
        Ok(())
    }
}

fn positive(field: &'static str, value: usize) -> Result<(), OptionsError> {
    if value == 0 {
        return Err(OptionsError::new(field, "must be positive (got 0)"));
    }
    Ok(())
}

fn duration(field: &'static str, value: Duration) -> Result<(), OptionsError> {
    if value.is_zero() || value > MAX_DURATION {
        return Err(OptionsError::new(
            field,
            format!("must be positive and at most 365 days (got {value:?})"),
        ));
    }
    Ok(())
}

/// The two spellings a limit has in a configuration file.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Spelled<N> {
    Value(N),
    Word(String),
}

fn from_spelled<'de, D: Deserializer<'de>, N>(
    spelled: Spelled<N>,
    word: &str,
) -> Result<Limit<N>, D::Error> {
    match spelled {
        Spelled::Value(n) => Ok(Limit::At(n)),
        Spelled::Word(w) if w == word => Ok(Limit::Unbounded),
        Spelled::Word(w) => Err(serde::de::Error::custom(format!(
            "expected a number or \"{word}\", got \"{w}\""
        ))),
    }
}

impl<N: Serialize + Copy> Serialize for Limit<N> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match *self {
            Self::At(n) => n.serialize(serializer),
            Self::Unbounded => serializer.serialize_str("unbounded"),
        }
    }
}

impl<'de, N: Deserialize<'de>> Deserialize<'de> for Limit<N> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        from_spelled::<D, N>(Spelled::deserialize(deserializer)?, "unbounded")
    }
}

mod millis {
    use super::*;

    pub fn serialize<S: Serializer>(d: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        u64::try_from(d.as_millis())
            .unwrap_or(u64::MAX)
            .serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        u64::deserialize(deserializer).map(Duration::from_millis)
    }
}

mod limit_millis {
    use super::*;

    pub fn serialize<S: Serializer>(
        limit: &Limit<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match limit {
            Limit::At(d) => millis::serialize(d, serializer),
            Limit::Unbounded => serializer.serialize_str("never"),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Limit<Duration>, D::Error> {
        let limit = from_spelled::<D, u64>(Spelled::deserialize(deserializer)?, "never")?;
        Ok(match limit {
            Limit::At(ms) => Limit::At(Duration::from_millis(ms)),
            Limit::Unbounded => Limit::Unbounded,
        })
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
                "resend_timeout",
            ),
            (
                ProducerConfig {
                    resend_timeout: MAX_DURATION * 2,
                    ..base()
                },
                "resend_timeout",
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
            "backoff.max"
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
                "producer_idle_ttl",
            ),
            (
                ConsumerConfig {
                    max_out_of_order: Limit::At(0),
                    ..base()
                },
                "max_out_of_order",
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
        let c: ConsumerConfig =
            serde_json::from_str(r#"{"max_out_of_order": "unbounded", "ordered": true}"#).unwrap();
        assert_eq!(c.max_out_of_order, Limit::Unbounded);
        assert!(c.ordered);
        assert_eq!(c.max_producers, Limit::At(1024));
    }

    #[test]
    fn settings_round_trip_and_reject_typos_and_bad_words() {
        let c = ConsumerConfig {
            producer_idle_ttl: Limit::Unbounded,
            ..Default::default()
        };
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains(r#""producer_idle_ttl_ms":"never""#), "{json}");
        assert_eq!(serde_json::from_str::<ConsumerConfig>(&json).unwrap(), c);
        assert!(serde_json::from_str::<ConsumerConfig>(r#"{"max_producer": 3}"#).is_err());
        let err = serde_json::from_str::<ConsumerConfig>(r#"{"max_producers": "lots"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected a number or \"unbounded\""), "{err}");
    }
}
