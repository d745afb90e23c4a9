//! The settings of a durable producer that are data: loadable with serde, validated before use.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::codec::Codec;
use crate::config::duration;
use crate::error::OptionsError;

/// The data settings of a durable producer ([`DurableOptions::config`](super::DurableOptions::config)).
/// `Default` gives the documented defaults; loadable with serde like
/// [`ProducerConfig`](crate::ProducerConfig) (durations in `_ms`, unknown keys refused):
///
/// ```
/// # use actix_delivery::durable::DurableConfig;
/// # use std::time::Duration;
/// let config: DurableConfig =
///     serde_json::from_str(r#"{ "snapshot_every": 500, "stop_timeout_ms": 2000 }"#).unwrap();
/// assert_eq!(config.stop_timeout, Duration::from_secs(2));
/// assert_eq!(config, DurableConfig { snapshot_every: 500, stop_timeout: Duration::from_secs(2), ..Default::default() });
/// ```
///
/// What is code, not data, is set on [`DurableOptions`](super::DurableOptions) only: the
/// journal, the stream and producer id (its constructor), the confirmations sink, the message
/// version and its upcaster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DurableConfig {
    /// Compact after this many messages stored and settlement records written, and no sooner
    /// than after as many as there are unsettled messages: a snapshot of the unsettled messages
    /// replaces what was written before it. The stream so holds about the unsettled messages
    /// plus one interval, and compaction costs O(1) per message. Default 1 000; positive.
    pub snapshot_every: u64,
    /// How long [`ProducerHandle::stop`](crate::ProducerHandle::stop) waits for the journal to
    /// answer the writes in flight: whatever it has not answered by then is settled
    /// [`DeliveryError::InDoubt`](crate::DeliveryError::InDoubt), and the next start of the
    /// stream settles it by what the journal holds. Settings key `stop_timeout_ms`; default
    /// 10 s; positive, at most 365 days.
    #[serde(
        rename = "stop_timeout_ms",
        with = "crate::config::millis::stop_timeout_ms"
    )]
    pub stop_timeout: Duration,
    /// The codec new messages are stored in (stored messages are read in the codec they were
    /// stored in, whatever this says). Default [`Codec::MessagePack`], in which a field added
    /// with `#[serde(default)]` needs no code; see the README's "Changing your types".
    /// Settings key `codec`: `"msgpack"` or `"bincode"`.
    pub codec: Codec,
}

impl Default for DurableConfig {
    fn default() -> Self {
        Self {
            snapshot_every: 1_000,
            stop_timeout: Duration::from_secs(10),
            codec: Codec::MessagePack,
        }
    }
}

impl DurableConfig {
    /// Checks every rule; the error names the first offending settings key.
    ///
    /// # Errors
    /// [`OptionsError`] naming the key and the rule it breaks.
    pub fn validate(&self) -> Result<(), OptionsError> {
        if self.snapshot_every == 0 {
            return Err(OptionsError::new(
                "snapshot_every",
                "must be positive (got 0)",
            ));
        }
        duration("stop_timeout_ms", self.stop_timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_zeros_name_their_key() {
        assert_eq!(DurableConfig::default().validate(), Ok(()));
        let zero = DurableConfig {
            snapshot_every: 0,
            ..DurableConfig::default()
        };
        assert_eq!(zero.validate().unwrap_err().field, "snapshot_every");
        let zero = DurableConfig {
            stop_timeout: Duration::ZERO,
            ..DurableConfig::default()
        };
        assert_eq!(zero.validate().unwrap_err().field, "stop_timeout_ms");
    }

    #[test]
    fn settings_round_trip_and_a_wrong_duration_names_its_key() {
        let config = DurableConfig {
            codec: Codec::Bincode,
            ..DurableConfig::default()
        };
        let json = serde_json::to_string(&config).unwrap();
        assert_eq!(
            serde_json::from_str::<DurableConfig>(&json).unwrap(),
            config
        );
        let error = serde_json::from_str::<DurableConfig>(r#"{"stop_timeout_ms": "soon"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("expected for `stop_timeout_ms` a whole number of milliseconds"),
            "{error}"
        );
        assert!(serde_json::from_str::<DurableConfig>(r#"{"snapshot_evry": 3}"#).is_err());
    }
}
