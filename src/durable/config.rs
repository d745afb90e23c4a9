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
    #[serde(rename = "stop_timeout_ms", with = "stop_timeout_ms")]
    pub stop_timeout: Duration,
    /// The codec new messages are stored in (stored messages are read in the codec they were
    /// stored in, whatever this says). Default [`Codec::MessagePack`], in which a field added
    /// with `#[serde(default)]` needs no code; see [Changing your types](crate::guide::schema_evolution).
    /// Settings key `codec`: `"msgpack"` or `"bincode"`.
    pub codec: Codec,
    /// With a lease, a producer does not take over a stream another producer is alive on
    /// (default `None`: the newest opener owns the stream, see
    /// [`DurableOptions::new`](super::DurableOptions::new)). Before it opens a stream that
    /// was opened before, a producer watches it for this long: if another producer wrote to
    /// it meanwhile, that one is alive, and this one stops for good with
    /// [`Failure::InUse`](crate::Failure::InUse) (its `opened()` says so). While it owns the
    /// stream, a producer writes to it at least every third of this (an empty record when it
    /// has nothing else to write), so that a live owner is seen. A producer that crashed
    /// writes nothing: its stream is taken over by the next start after one lease, its own
    /// restart included. Every producer of the stream should set the same lease (one without
    /// it does not write when idle, and is taken over). The price: every start on an existing
    /// stream waits one lease before it opens. Settings key `lease_ms`; positive, at most 365
    /// days; absent for none.
    #[serde(
        rename = "lease_ms",
        default,
        skip_serializing_if = "Option::is_none",
        with = "lease_ms"
    )]
    pub lease: Option<Duration>,
}

crate::config::millis_key!(stop_timeout_ms, "stop_timeout_ms");
crate::config::optional_millis_key!(lease_ms, "lease_ms");

impl Default for DurableConfig {
    fn default() -> Self {
        Self {
            snapshot_every: 1_000,
            stop_timeout: Duration::from_secs(10),
            codec: Codec::MessagePack,
            lease: None,
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
        duration("stop_timeout_ms", self.stop_timeout)?;
        match self.lease {
            Some(lease) => duration("lease_ms", lease),
            None => Ok(()),
        }
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
        let zero = DurableConfig {
            lease: Some(Duration::ZERO),
            ..DurableConfig::default()
        };
        assert_eq!(zero.validate().unwrap_err().field, "lease_ms");
    }

    #[test]
    fn settings_round_trip_and_a_wrong_duration_names_its_key() {
        for lease in [None, Some(Duration::from_secs(15))] {
            let config = DurableConfig {
                codec: Codec::Bincode,
                lease,
                ..DurableConfig::default()
            };
            let json = serde_json::to_string(&config).unwrap();
            assert_eq!(
                serde_json::from_str::<DurableConfig>(&json).unwrap(),
                config
            );
        }
        let loaded: DurableConfig = serde_json::from_str(r#"{"lease_ms": 15000}"#).unwrap();
        assert_eq!(loaded.lease, Some(Duration::from_secs(15)));
        let error = serde_json::from_str::<DurableConfig>(r#"{"lease_ms": "long"}"#)
            .unwrap_err()
            .to_string();
        assert!(error.contains("`lease_ms`"), "{error}");
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
