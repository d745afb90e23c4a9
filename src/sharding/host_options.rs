//! The settings of an entity host: the plain serde struct and the validated options.

use std::time::Duration;

use actix::ArbiterHandle;
use serde::{Deserialize, Serialize};

use crate::config::{limit_millis, positive, Limit, Overrides, MAX_DURATION};
use crate::delivery::dead_letter_handle::DeadLetters;
use crate::error::OptionsError;
use crate::persistence::PersistentConfig;
use crate::sharding::entity_id::MAX_ENTITY_ID;
use crate::sharding::host_core::HostLimits;

/// The longest entity type name, in bytes: a journal stream is named `<type>|<entity id>`,
/// within 256 bytes.
pub const MAX_ENTITY_TYPE: usize = 256 - 1 - MAX_ENTITY_ID;

/// The most shards a sharded type may have.
pub const MAX_SHARDS: u32 = 65_536;

/// Numeric settings of an [`EntityHostHandle`](crate::sharding::EntityHostHandle), loadable with
/// serde like the other settings structs (durations in milliseconds, `"unbounded"` for no limit).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EntityHostConfig {
    /// Passivate an entity after this long without a command (its instance stops gracefully;
    /// the next command starts it again, recovering from the journal). Default 120 s;
    /// positive or `Unbounded` (never).
    #[serde(rename = "idle_timeout_ms", with = "limit_millis::idle_timeout_ms")]
    pub idle_timeout: Limit<Duration>,
    /// At most this many entities run at once: a command for one more passivates the least
    /// recently used one without a command in flight, or, when every running one has a
    /// command in flight, waits until one has answered its commands (counted in
    /// [`HostStats::waited_for_room`](crate::sharding::HostStats::waited_for_room), and held
    /// against `max_held_commands`). Passivated instances finish their journal writes beside
    /// the running ones. Default 10 000; positive.
    pub max_active_entities: usize,
    /// Commands for entities whose instance is stopping wait for its successor, and commands
    /// for entities that wait for room to start, at most this many over all entities; more
    /// are refused
    /// ([`HostError::Full`](crate::sharding::HostError::Full): a delivery is then not
    /// acknowledged and comes again). Default 10 000; positive.
    pub max_held_commands: usize,
    /// How many shards the type's entities are spread over (see
    /// [`ShardId::of`](crate::sharding::ShardId::of)). Every host, producer and coordinator of
    /// the type must use the same number, and it cannot change while any of them runs.
    /// Default 64; 1 to 65 536.
    pub shards: u32,
}

impl Default for EntityHostConfig {
    fn default() -> Self {
        Self {
            idle_timeout: Limit::At(Duration::from_secs(120)),
            max_active_entities: 10_000,
            max_held_commands: 10_000,
            shards: 64,
        }
    }
}

impl EntityHostConfig {
    /// Checks every rule; the error names the first offending field.
    ///
    /// # Errors
    /// [`OptionsError`] naming the field and the rule it breaks.
    pub fn validate(&self) -> Result<(), OptionsError> {
        if let Limit::At(timeout) = self.idle_timeout
            && (timeout.is_zero() || timeout > MAX_DURATION)
        {
            return Err(OptionsError::new(
                "idle_timeout_ms",
                format!("must be positive and at most 365 days, or unbounded (got {timeout:?})"),
            ));
        }
        positive("max_active_entities", self.max_active_entities)?;
        positive("max_held_commands", self.max_held_commands)?;
        check_shards(self.shards)
    }

    pub(crate) fn limits(&self) -> HostLimits {
        HostLimits {
            idle_timeout: self.idle_timeout.get(),
            max_active: self.max_active_entities,
            max_held: self.max_held_commands,
            shards: self.shards,
        }
    }
}

/// A shard count is 1 to [`MAX_SHARDS`].
pub(crate) fn check_shards(shards: u32) -> Result<(), OptionsError> {
    if shards == 0 || shards > MAX_SHARDS {
        return Err(OptionsError::new(
            "shards",
            format!("must lie in 1..={MAX_SHARDS} (got {shards})"),
        ));
    }
    Ok(())
}

/// Everything an [`EntityHostHandle`](crate::sharding::EntityHostHandle) needs, validated.
#[derive(Clone, Debug)]
pub struct EntityHostOptions {
    pub(crate) entity_type: String,
    pub(crate) config: EntityHostConfig,
    pub(crate) persistent: PersistentConfig,
    pub(crate) arbiter: Option<ArbiterHandle>,
    pub(crate) dead_letters: Option<(DeadLetters, String)>,
}

impl EntityHostOptions {
    /// Starts a builder for the entities of type `entity_type`: the journal stream of entity
    /// `id` is `<entity_type>|<id>`.
    pub fn builder(entity_type: impl Into<String>) -> EntityHostOptionsBuilder {
        EntityHostOptionsBuilder {
            entity_type: entity_type.into(),
            loaded: EntityHostConfig::default(),
            explicit: Overrides::default(),
            persistent: PersistentConfig::default(),
            arbiter: None,
            dead_letters: None,
        }
    }

    /// The entity type.
    pub fn entity_type(&self) -> &str {
        &self.entity_type
    }

    /// The validated settings.
    pub fn config(&self) -> &EntityHostConfig {
        &self.config
    }

    /// The settings of each entity.
    pub fn persistent(&self) -> &PersistentConfig {
        &self.persistent
    }
}

/// Builds [`EntityHostOptions`]; see [`EntityHostConfig`] for each setting's default and
/// rule.
#[derive(Debug)]
pub struct EntityHostOptionsBuilder {
    entity_type: String,
    loaded: EntityHostConfig,
    explicit: Overrides<EntityHostConfig>,
    persistent: PersistentConfig,
    arbiter: Option<ArbiterHandle>,
    dead_letters: Option<(DeadLetters, String)>,
}

impl EntityHostOptionsBuilder {
    /// Loaded settings; values set on the builder still win.
    pub fn config(mut self, config: EntityHostConfig) -> Self {
        self.loaded = config;
        self
    }

    /// Passivate an entity after this long without a command (default 120 s).
    pub fn idle_timeout(self, timeout: impl Into<Limit<Duration>>) -> Self {
        let timeout = timeout.into();
        self.set(move |c| c.idle_timeout = timeout)
    }

    /// At most this many entities run at once (default 10 000).
    pub fn max_active_entities(self, max: usize) -> Self {
        self.set(move |c| c.max_active_entities = max)
    }

    /// At most this many commands wait for stopping instances or for room (default 10 000).
    pub fn max_held_commands(self, max: usize) -> Self {
        self.set(move |c| c.max_held_commands = max)
    }

    /// The type's shard count (default 64).
    pub fn shards(self, shards: u32) -> Self {
        self.set(move |c| c.shards = shards)
    }

    /// The settings of each entity (default [`PersistentConfig::default`]). With
    /// `must_follow`, each producer's order to each entity holds across crashes (the sharded
    /// producer names each message's predecessor to the same entity). Without a
    /// `metrics_label` of their own, the entities' metrics are labelled with the entity type.
    pub fn persistent(mut self, config: PersistentConfig) -> Self {
        self.persistent = config;
        self
    }

    /// Runs the entities on `arbiter` (default: the arbiter the host is started on).
    pub fn arbiter(mut self, arbiter: ArbiterHandle) -> Self {
        self.arbiter = Some(arbiter);
        self
    }

    /// Keeps what the host's [`consumer`](crate::sharding::EntityHostHandle::consumer)
    /// refuses in `dead_letters`, under the name `source` (kind
    /// [`EntityHost`](crate::dead_letters::SourceKind::EntityHost)): undecodable bodies with
    /// their bytes as received, and malformed or misrouted deliveries (another shard count,
    /// a foreign origin) with their ids.
    pub fn keep_dead_letters(
        mut self,
        dead_letters: DeadLetters,
        source: impl Into<String>,
    ) -> Self {
        self.dead_letters = Some((dead_letters, source.into()));
        self
    }

    /// Validates the options.
    ///
    /// # Errors
    /// [`OptionsError`] naming the first invalid setting.
    pub fn build(self) -> Result<EntityHostOptions, OptionsError> {
        check_entity_type(&self.entity_type)?;
        let config = self.explicit.apply(self.loaded);
        config.validate()?;
        let mut persistent = self.persistent;
        persistent.validate()?;
        // The entities' metrics go under the type's name, unless the settings chose another.
        persistent
            .metrics_label
            .get_or_insert_with(|| self.entity_type.clone());
        Ok(EntityHostOptions {
            entity_type: self.entity_type,
            config,
            persistent,
            arbiter: self.arbiter,
            dead_letters: self.dead_letters,
        })
    }

    fn set(mut self, setter: impl FnOnce(&mut EntityHostConfig) + Send + 'static) -> Self {
        self.explicit.set(setter);
        self
    }
}

/// An entity type names journal streams (`<type>|<id>`): 1 to [`MAX_ENTITY_TYPE`] bytes,
/// neither `|` nor NUL in it.
fn check_entity_type(entity_type: &str) -> Result<(), OptionsError> {
    if entity_type.is_empty() || entity_type.len() > MAX_ENTITY_TYPE {
        return Err(OptionsError::new(
            "entity_type",
            format!(
                "must have 1 to {MAX_ENTITY_TYPE} bytes (got {})",
                entity_type.len()
            ),
        ));
    }
    if entity_type.contains(['|', '\0']) {
        return Err(OptionsError::new(
            "entity_type",
            "must not contain `|` (it separates type and id in stream names) or NUL",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_settings_name_their_field_and_builder_values_win_over_loaded_ones() {
        let field = |b: EntityHostOptionsBuilder| b.build().unwrap_err().field;
        let b = || EntityHostOptions::builder("account");
        assert_eq!(field(EntityHostOptions::builder("")), "entity_type");
        assert_eq!(field(EntityHostOptions::builder("a|b")), "entity_type");
        assert_eq!(
            field(EntityHostOptions::builder("x".repeat(MAX_ENTITY_TYPE + 1))),
            "entity_type"
        );
        assert_eq!(field(b().max_active_entities(0)), "max_active_entities");
        assert_eq!(field(b().max_held_commands(0)), "max_held_commands");
        assert_eq!(field(b().shards(0)), "shards");
        assert_eq!(field(b().shards(MAX_SHARDS + 1)), "shards");
        assert_eq!(field(b().idle_timeout(Duration::ZERO)), "idle_timeout_ms");
        let bad = PersistentConfig {
            max_producers: 0,
            ..PersistentConfig::default()
        };
        assert_eq!(field(b().persistent(bad)), "max_producers");

        let loaded: EntityHostConfig =
            serde_json::from_str(r#"{"idle_timeout_ms": "unbounded", "shards": 8}"#).unwrap();
        assert_eq!(loaded.idle_timeout, Limit::Unbounded);
        let options = b().shards(16).config(loaded).build().unwrap();
        assert_eq!(options.config().shards, 16, "the builder wins");
        assert_eq!(options.config().idle_timeout, Limit::Unbounded);
        assert_eq!(options.config().max_active_entities, 10_000);
        let wrong = serde_json::from_str::<EntityHostConfig>(r#"{"idle_timeout_ms": "x"}"#);
        assert!(wrong.unwrap_err().to_string().contains("idle_timeout_ms"));
    }
}
