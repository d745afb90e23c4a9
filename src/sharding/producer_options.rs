//! Validated options of a sharded producer.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{millis_key, positive, Limit, Overrides, ProducerConfig};
use crate::delivery::message::ConsumerRef;
use crate::error::OptionsError;
use crate::sharding::entity_id::ShardId;
use crate::sharding::envelope::EntityEnvelope;
use crate::sharding::host_options::check_shards;

millis_key!(cleanup_unused_after_ms, "cleanup_unused_after_ms");

/// The longest id of a sharded producer, in bytes: it prefixes its entity streams' ids
/// (`<producer>/<lane number, 16 hex digits>`), which hold 256 bytes.
pub const MAX_SHARDED_PRODUCER_ID: usize = 256 - 1 - 16;

/// Numeric settings of a sharded producer, loadable with serde like the other settings
/// structs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShardedProducerConfig {
    /// Messages told to one entity and not yet confirmed, at most: beyond, `tell` refuses
    /// (the body back) and `send`/`store` wait, for that entity only, so that an entity
    /// without demand (slow, or its shard moving) holds at most this many of the producer's
    /// `window_size`. Default 1 000; positive.
    pub max_pending_per_entity: usize,
    /// An entity's stream with nothing in flight for this long is closed (it is opened again
    /// by the entity's next message). Default 120 s; positive.
    #[serde(rename = "cleanup_unused_after_ms", with = "cleanup_unused_after_ms")]
    pub cleanup_unused_after: Duration,
    /// Entity streams open at once, at most: a message for an entity without one when this many are
    /// open closes the least recently used stream with nothing in flight, or, when every stream has
    /// a message in flight, waits for one (counted in
    /// [`LaneStats::waited`](crate::sharding::LaneStats::waited)); meanwhile the producer's window
    /// fills, and then `tell` refuses and `send`/`store` wait. An open stream with nothing in
    /// flight costs about 1 KiB (943 bytes measured by `sharding_bench`). Default 10 000 (more than
    /// the default producer window, so that a message never waits with the defaults); positive.
    pub max_open_lanes: usize,
    /// The sharded type's shard count (see
    /// [`EntityHostConfig::shards`](crate::sharding::EntityHostConfig)). Default 64.
    pub shards: u32,
}

impl Default for ShardedProducerConfig {
    fn default() -> Self {
        Self {
            max_pending_per_entity: 1_000,
            cleanup_unused_after: Duration::from_secs(120),
            max_open_lanes: 10_000,
            shards: 64,
        }
    }
}

impl ShardedProducerConfig {
    /// Checks every rule; the error names the first offending field.
    ///
    /// # Errors
    /// [`OptionsError`] naming the field and the rule it breaks.
    pub fn validate(&self) -> Result<(), OptionsError> {
        positive("max_pending_per_entity", self.max_pending_per_entity)?;
        crate::config::duration("cleanup_unused_after_ms", self.cleanup_unused_after)?;
        positive("max_open_lanes", self.max_open_lanes)?;
        check_shards(self.shards)
    }
}

/// Where each shard's entities are reached.
pub(crate) type Destination<T> =
    Arc<dyn Fn(ShardId) -> ConsumerRef<EntityEnvelope<T>> + Send + Sync>;

/// Everything a sharded producer needs, validated.
pub struct ShardedProducerOptions<T: Send + 'static> {
    pub(crate) destination: Destination<T>,
    pub(crate) config: ShardedProducerConfig,
    pub(crate) producer: ProducerConfig,
    pub(crate) entity_stream: ProducerConfig,
}

impl<T: Send + 'static> ShardedProducerOptions<T> {
    /// Starts a builder for a producer whose messages all go to `consumer` (an
    /// [`EntityHostHandle`](crate::sharding::EntityHostHandle)'s consumer in this process, or a
    /// reference to one on another node).
    pub fn builder(
        consumer: impl Into<ConsumerRef<EntityEnvelope<T>>>,
    ) -> ShardedProducerOptionsBuilder<T> {
        let consumer = consumer.into();
        Self::per_shard(move |_| consumer.clone())
    }

    /// Starts a builder for a producer that reaches the entities of shard `s` through
    /// `destination(s)` (asked once per shard, when the first entity of the shard gets a
    /// stream): for example a NATS subject per shard, subscribed by the shard's owner.
    pub fn per_shard(
        destination: impl Fn(ShardId) -> ConsumerRef<EntityEnvelope<T>> + Send + Sync + 'static,
    ) -> ShardedProducerOptionsBuilder<T> {
        ShardedProducerOptionsBuilder {
            destination: Arc::new(destination),
            loaded: ShardedProducerConfig::default(),
            explicit: Overrides::default(),
            producer: Self::default_producer(),
            entity_stream: ProducerConfig::default(),
        }
    }

    /// The producer's settings by default: [`ProducerConfig`]'s, but 4 096 messages held for
    /// entities at once (`window_size`), and a 30 s `resend_timeout` (the hop from the
    /// producer to its router is in process and loses nothing; a durable producer's recovered
    /// messages are sent at once).
    pub fn default_producer() -> ProducerConfig {
        ProducerConfig {
            window_size: 4096,
            resend_timeout: Duration::from_secs(30),
            ..ProducerConfig::default()
        }
    }

    /// The validated settings.
    pub fn config(&self) -> &ShardedProducerConfig {
        &self.config
    }

    /// The producer's settings.
    pub fn producer_config(&self) -> &ProducerConfig {
        &self.producer
    }

    /// The settings of each entity's stream.
    pub fn entity_stream_config(&self) -> &ProducerConfig {
        &self.entity_stream
    }
}

impl<T: Send + 'static> std::fmt::Debug for ShardedProducerOptions<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedProducerOptions")
            .field("config", &self.config)
            .field("producer", &self.producer)
            .field("entity_stream", &self.entity_stream)
            .finish_non_exhaustive()
    }
}

/// Builds [`ShardedProducerOptions`]; see [`ShardedProducerConfig`] for its own settings.
pub struct ShardedProducerOptionsBuilder<T: Send + 'static> {
    destination: Destination<T>,
    loaded: ShardedProducerConfig,
    explicit: Overrides<ShardedProducerConfig>,
    producer: ProducerConfig,
    entity_stream: ProducerConfig,
}

impl<T: Send + 'static> ShardedProducerOptionsBuilder<T> {
    /// Loaded settings; values set on the builder still win.
    pub fn config(mut self, config: ShardedProducerConfig) -> Self {
        self.loaded = config;
        self
    }

    /// At most this many unconfirmed messages per entity (default 1 000).
    pub fn max_pending_per_entity(self, max: usize) -> Self {
        self.set(move |c| c.max_pending_per_entity = max)
    }

    /// Close an entity's stream after this long with nothing in flight (default 120 s).
    pub fn cleanup_unused_after(self, after: Duration) -> Self {
        self.set(move |c| c.cleanup_unused_after = after)
    }

    /// At most this many entity streams open at once (default 10 000).
    pub fn max_open_lanes(self, max: usize) -> Self {
        self.set(move |c| c.max_open_lanes = max)
    }

    /// The type's shard count (default 64).
    pub fn shards(self, shards: u32) -> Self {
        self.set(move |c| c.shards = shards)
    }

    /// The producer's settings (default [`ShardedProducerOptions::default_producer`]):
    /// `producer_id` (at most 239 bytes: it prefixes the entity streams' ids), `window_size`
    /// (messages held for entities at once, over all entities), `max_pending` (messages
    /// waiting beyond; then `tell` refuses and `send` waits). `max_attempts` must stay
    /// unbounded: a message is retransmitted until its entity confirms it.
    pub fn producer(mut self, config: ProducerConfig) -> Self {
        self.producer = config;
        self
    }

    /// The settings of each entity's stream (default [`ProducerConfig`]'s): `window_size` is
    /// the most messages in flight to one entity, `resend_timeout` and `backoff` its
    /// retransmissions. `producer_id` must be unset (a stream's id is the producer's, `/` and
    /// the lane's number), `max_attempts` unbounded, and `max_pending` is the producer's
    /// `window_size` (no entity holds more).
    pub fn entity_stream(mut self, config: ProducerConfig) -> Self {
        self.entity_stream = config;
        self
    }

    /// Validates the options.
    ///
    /// # Errors
    /// [`OptionsError`] naming the first invalid setting.
    pub fn build(self) -> Result<ShardedProducerOptions<T>, OptionsError> {
        let config = self.explicit.apply(self.loaded);
        config.validate()?;
        self.producer.validate()?;
        let mut entity_stream = self.entity_stream;
        entity_stream.validate()?;
        let unbounded = "a sharded producer retransmits a message until its entity confirms it";
        if self.producer.max_attempts != Limit::Unbounded {
            return Err(OptionsError::new(
                "max_attempts",
                format!("{unbounded}: the producer's max_attempts stays unbounded"),
            ));
        }
        if entity_stream.max_attempts != Limit::Unbounded {
            return Err(OptionsError::new(
                "max_attempts",
                format!("{unbounded}: the entity streams' max_attempts stays unbounded"),
            ));
        }
        if let Some(id) = self.producer.producer_id.as_deref() {
            check_sharded_producer_id(id)?;
        }
        if entity_stream.producer_id.is_some() {
            return Err(OptionsError::new(
                "producer_id",
                "an entity stream's id is the producer's, `/` and its lane's number: leave it \
                 unset in the entity stream settings",
            ));
        }
        entity_stream.max_pending = self.producer.window_size;
        Ok(ShardedProducerOptions {
            destination: self.destination,
            config,
            producer: self.producer,
            entity_stream,
        })
    }

    fn set(mut self, setter: impl FnOnce(&mut ShardedProducerConfig) + Send + 'static) -> Self {
        self.explicit.set(setter);
        self
    }
}

/// A sharded producer's id prefixes its entity streams' ids: at most
/// [`MAX_SHARDED_PRODUCER_ID`] bytes.
pub(crate) fn check_sharded_producer_id(id: &str) -> Result<(), OptionsError> {
    if id.len() > MAX_SHARDED_PRODUCER_ID {
        return Err(OptionsError::new(
            "producer_id",
            format!(
                "a sharded producer's id prefixes its entity streams' ids: at most \
                 {MAX_SHARDED_PRODUCER_ID} bytes (got {})",
                id.len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builder() -> ShardedProducerOptionsBuilder<u64> {
        ShardedProducerOptions::per_shard(|_| ConsumerRef::from_fn(|_| {}))
    }

    #[test]
    fn invalid_settings_name_their_field_and_the_entity_streams_fit_the_window() {
        let field = |b: ShardedProducerOptionsBuilder<u64>| b.build().unwrap_err().field;
        assert_eq!(
            field(builder().max_pending_per_entity(0)),
            "max_pending_per_entity"
        );
        assert_eq!(
            field(builder().cleanup_unused_after(Duration::ZERO)),
            "cleanup_unused_after_ms"
        );
        assert_eq!(field(builder().shards(0)), "shards");
        assert_eq!(field(builder().max_open_lanes(0)), "max_open_lanes");
        let bounded = ProducerConfig {
            max_attempts: Limit::At(3),
            ..ProducerConfig::default()
        };
        assert_eq!(field(builder().producer(bounded.clone())), "max_attempts");
        assert_eq!(field(builder().entity_stream(bounded)), "max_attempts");
        let long = ProducerConfig {
            producer_id: Some("p".repeat(MAX_SHARDED_PRODUCER_ID + 1)),
            ..ShardedProducerOptions::<u64>::default_producer()
        };
        assert_eq!(field(builder().producer(long)), "producer_id");
        let named = ProducerConfig {
            producer_id: Some("mine".into()),
            ..ProducerConfig::default()
        };
        assert_eq!(field(builder().entity_stream(named)), "producer_id");

        let options = builder().build().unwrap();
        assert_eq!(options.entity_stream_config().max_pending, 4096);
        let loaded: ShardedProducerConfig =
            serde_json::from_str(r#"{"cleanup_unused_after_ms": 5000, "shards": 8}"#).unwrap();
        let options = builder().shards(4).config(loaded).build().unwrap();
        assert_eq!(options.config().shards, 4, "the builder wins");
        assert_eq!(
            options.config().cleanup_unused_after,
            Duration::from_secs(5)
        );
    }
}
