//! The settings of a persistent actor.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::codec::Codec;
use crate::error::OptionsError;

/// Settings of a `PersistentActor`. `Default` gives the
/// documented defaults; loadable with serde like the controllers' settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PersistentConfig {
    /// Save a snapshot (state and delivery record) after this many events since the last one;
    /// `None` (the default) never does. Recovery then reads the latest snapshot and the
    /// events after it.
    pub snapshot_every: Option<u64>,
    /// A snapshot (the state, the delivery record and the outbox) is encoded up to this many
    /// bytes; events have the codec's limit
    /// ([`MAX_ENCODED_BYTES`](crate::codec::MAX_ENCODED_BYTES), 16 MiB, per entry). A larger
    /// snapshot is not taken: it is counted
    /// (`PersistentStats::snapshot_failures`), warned
    /// about at most once a minute, and tried again after another `snapshot_every` events.
    /// The journal may refuse large payloads as well
    /// (the crate's journals at `MAX_PAYLOAD_BYTES`,
    /// 512 MiB). Default 256 MiB; positive.
    pub max_snapshot_bytes: u64,
    /// After a snapshot is saved, delete the events it covers, so the journal holds one
    /// snapshot interval of events instead of the whole history. Default false.
    pub delete_events_on_snapshot: bool,
    /// Commands that arrive during recovery wait, up to this many; more get
    /// `CommandError::Overloaded`. Default
    /// 10 000; positive.
    pub max_recovery_buffer: usize,
    /// While an append is in flight, arriving commands are decided and wait for their commit
    /// (in that append, or in the next one). At most this many wait; more are refused with
    /// `CommandError::Overloaded` (counted in
    /// `PersistentStats::overloaded`), so a stalled
    /// journal cannot make the actor hold any number of decisions. Default 10 000; positive.
    pub max_pending_commands: usize,
    /// Once the entries decided for the next append reach this many encoded bytes, arriving
    /// commands are refused with
    /// `CommandError::Overloaded` until it is
    /// written: one append holds about this much (plus at most one entry). Default 64 MiB;
    /// positive.
    pub max_pending_bytes: u64,
    /// The delivery record keeps the marks of at most this many producer ids (the least
    /// recently recorded one is dropped beyond; a retransmission from it would be processed
    /// again). Default 1024; positive.
    pub max_producers: usize,
    /// Recovery reads the journal this many events at a time. Default 1024; positive.
    pub replay_page: usize,
    /// Must follow: a command from a delivery whose predecessor from the same producer was not
    /// processed is refused
    /// (`CommandError::OutOfOrder`: no ACK, it is
    /// retransmitted), so each producer's order holds across crashes of either side. A predecessor
    /// the producer gave up (`max_attempts`) is skipped: the producer's window start moves past it.
    /// Default false.
    pub must_follow: bool,
    /// Outbox: a decision that would leave more than this many deliveries to one destination
    /// unconfirmed is refused
    /// (`CommandError::OutboxFull`). Default 10
    /// 000; positive.
    pub max_unconfirmed: usize,
    /// Outbox: warn (rate-limited) when a delivery is sent this many times without a
    /// confirmation. Default 5; positive.
    pub warn_after_attempts: u32,
    /// `PersistentHandle::stop` lets the actor
    /// store what it decided and record the confirmations its outbox received, waiting at most
    /// this long for the journal; commands whose append is unanswered then get
    /// `CommandError::InDoubt`. Settings key
    /// `stop_timeout_ms`; default 10 s; positive.
    #[serde(
        rename = "stop_timeout_ms",
        with = "crate::config::millis::stop_timeout_ms"
    )]
    pub stop_timeout: Duration,
    /// The codec new events and snapshots are written in (what was written before is read in
    /// the codec it was written in, whatever this says). Default
    /// [`Codec::MessagePack`]: self-describing, so a field added to the event or state type
    /// with `#[serde(default)]` needs no code; [`Codec::Bincode`] is faster and smaller but
    /// needs an upcaster for every change of the types (actix-delivery's guide,
    /// chapter "Changing your types", has the recipes). Settings key `codec`: `"msgpack"` or `"bincode"`.
    pub codec: Codec,
    /// The value of the `entity` label on the entity's metrics (feature `metrics`): a name the
    /// application chose, the same for all entities of a kind, never one per stream. Default: an
    /// `EntityHostHandle`'s entity type for its entities, else
    /// `"default"`; not empty.
    pub metrics_label: Option<String>,
}

impl Default for PersistentConfig {
    fn default() -> Self {
        Self {
            snapshot_every: None,
            max_snapshot_bytes: 256 << 20,
            delete_events_on_snapshot: false,
            max_recovery_buffer: 10_000,
            max_pending_commands: 10_000,
            max_pending_bytes: 64 << 20,
            max_producers: 1024,
            replay_page: 1024,
            must_follow: false,
            max_unconfirmed: 10_000,
            warn_after_attempts: 5,
            stop_timeout: Duration::from_secs(10),
            codec: Codec::MessagePack,
            metrics_label: None,
        }
    }
}

impl PersistentConfig {
    /// Checks every rule; the error names the first offending field.
    ///
    /// # Errors
    /// [`OptionsError`] naming the field and the rule it breaks.
    pub fn validate(&self) -> Result<(), OptionsError> {
        if self.metrics_label.as_deref() == Some("") {
            return Err(OptionsError::new(
                "metrics_label",
                "must not be empty (got \"\")",
            ));
        }
        if self.snapshot_every == Some(0) {
            return Err(OptionsError::new(
                "snapshot_every",
                "must be positive or absent (got 0)",
            ));
        }
        for (field, value) in [
            ("max_recovery_buffer", self.max_recovery_buffer),
            ("max_pending_commands", self.max_pending_commands),
            ("max_producers", self.max_producers),
            ("replay_page", self.replay_page),
            ("max_unconfirmed", self.max_unconfirmed),
            ("warn_after_attempts", self.warn_after_attempts as usize),
        ] {
            if value == 0 {
                return Err(OptionsError::new(field, "must be positive (got 0)"));
            }
        }
        if self.stop_timeout.is_zero() {
            return Err(OptionsError::new(
                "stop_timeout_ms",
                "must be positive (got 0)",
            ));
        }
        for (field, value) in [
            ("max_snapshot_bytes", self.max_snapshot_bytes),
            ("max_pending_bytes", self.max_pending_bytes),
        ] {
            if value == 0 {
                return Err(OptionsError::new(field, "must be positive (got 0)"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_zeros_name_their_field() {
        assert_eq!(PersistentConfig::default().validate(), Ok(()));
        let field = |config: PersistentConfig| config.validate().unwrap_err().field;
        let base = PersistentConfig::default;
        assert_eq!(
            field(PersistentConfig {
                snapshot_every: Some(0),
                ..base()
            }),
            "snapshot_every"
        );
        assert_eq!(
            field(PersistentConfig {
                replay_page: 0,
                ..base()
            }),
            "replay_page"
        );
        assert_eq!(
            field(PersistentConfig {
                max_pending_commands: 0,
                ..base()
            }),
            "max_pending_commands"
        );
        assert_eq!(
            field(PersistentConfig {
                max_pending_bytes: 0,
                ..base()
            }),
            "max_pending_bytes"
        );
        assert_eq!(
            field(PersistentConfig {
                max_snapshot_bytes: 0,
                ..base()
            }),
            "max_snapshot_bytes"
        );
        let loaded: PersistentConfig =
            serde_json::from_str(r#"{"snapshot_every": 100, "delete_events_on_snapshot": true}"#)
                .unwrap();
        assert_eq!(loaded.snapshot_every, Some(100));
        assert_eq!(loaded.max_producers, 1024);
        let loaded: PersistentConfig = serde_json::from_str(r#"{"stop_timeout_ms": 250}"#).unwrap();
        assert_eq!(loaded.stop_timeout, Duration::from_millis(250));
        let zero = PersistentConfig {
            stop_timeout: Duration::ZERO,
            ..base()
        };
        assert_eq!(field(zero), "stop_timeout_ms");
    }
}
