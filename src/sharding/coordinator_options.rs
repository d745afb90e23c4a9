//! The settings of a shard coordinator.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{millis_key, positive, Overrides};
use crate::error::OptionsError;

millis_key!(lease_ttl_ms, "lease_ttl_ms");
millis_key!(renew_interval_ms, "renew_interval_ms");

/// The longest node name, in bytes (a member id is `<name>#<16 hex digits>`).
pub const MAX_NODE_NAME: usize = 128;

/// Numeric settings of a [`ShardCoordinatorHandle`](crate::sharding::ShardCoordinatorHandle),
/// loadable with serde like the other settings structs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CoordinatorConfig {
    /// How long a lease (and a member's heartbeat) lasts in the store without a renewal. A
    /// node that dies holds its shards this long (then another node takes them and recovers
    /// their entities); a node that cannot reach the store stops acting on its shards after
    /// nine tenths of it. Default 10 s; positive, at least 3 × `renew_interval`.
    #[serde(rename = "lease_ttl_ms", with = "lease_ttl_ms")]
    pub lease_ttl: Duration,
    /// How often the node renews its leases and heartbeat, and looks at the table to take
    /// free shards and hand off others. Default 2 s; positive.
    #[serde(rename = "renew_interval_ms", with = "renew_interval_ms")]
    pub renew_interval: Duration,
    /// At most this many of the node's shards are handed off at once (a rebalance moves a
    /// bounded number of shards at a time; leaving the cluster hands off all of them).
    /// Default 4; positive.
    pub max_handoffs: usize,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(10),
            renew_interval: Duration::from_secs(2),
            max_handoffs: 4,
        }
    }
}

impl CoordinatorConfig {
    /// Checks every rule; the error names the first offending field.
    ///
    /// # Errors
    /// [`OptionsError`] naming the field and the rule it breaks.
    pub fn validate(&self) -> Result<(), OptionsError> {
        if self.renew_interval.is_zero() {
            return Err(OptionsError::new(
                "renew_interval_ms",
                "must be positive (got 0)",
            ));
        }
        if self.lease_ttl < self.renew_interval * 3 || self.lease_ttl > crate::config::MAX_DURATION
        {
            return Err(OptionsError::new(
                "lease_ttl_ms",
                format!(
                    "must be at least 3 × renew_interval ({:?}) and at most 365 days (got {:?}): \
                     a lease must survive a late renewal",
                    self.renew_interval * 3,
                    self.lease_ttl
                ),
            ));
        }
        positive("max_handoffs", self.max_handoffs)
    }
}

/// Everything a [`ShardCoordinatorHandle`](crate::sharding::ShardCoordinatorHandle) needs,
/// validated.
#[derive(Clone, Debug)]
pub struct CoordinatorOptions {
    pub(crate) node_name: String,
    pub(crate) address: Option<String>,
    pub(crate) config: CoordinatorConfig,
}

impl CoordinatorOptions {
    /// Starts a builder for the node `node_name` (its member id in the store is the name, `#`
    /// and 16 random hex digits: a restarted node is a new member).
    pub fn builder(node_name: impl Into<String>) -> CoordinatorOptionsBuilder {
        CoordinatorOptionsBuilder {
            node_name: node_name.into(),
            address: None,
            loaded: CoordinatorConfig::default(),
            explicit: Overrides::default(),
        }
    }

    /// The validated settings.
    pub fn config(&self) -> &CoordinatorConfig {
        &self.config
    }
}

/// Builds [`CoordinatorOptions`]; see [`CoordinatorConfig`] for each setting's default and
/// rule.
#[derive(Debug)]
pub struct CoordinatorOptionsBuilder {
    node_name: String,
    address: Option<String>,
    loaded: CoordinatorConfig,
    explicit: Overrides<CoordinatorConfig>,
}

impl CoordinatorOptionsBuilder {
    /// Loaded settings; values set on the builder still win.
    pub fn config(mut self, config: CoordinatorConfig) -> Self {
        self.loaded = config;
        self
    }

    /// Where other nodes reach this one (published with its heartbeat and leases, for
    /// transports that look a shard's owner up; not needed over NATS).
    pub fn address(mut self, address: impl Into<String>) -> Self {
        self.address = Some(address.into());
        self
    }

    /// How long a lease lasts without a renewal (default 10 s).
    pub fn lease_ttl(self, ttl: Duration) -> Self {
        self.set(move |c| c.lease_ttl = ttl)
    }

    /// How often leases are renewed and the table looked at (default 2 s).
    pub fn renew_interval(self, interval: Duration) -> Self {
        self.set(move |c| c.renew_interval = interval)
    }

    /// At most this many handoffs at once (default 4).
    pub fn max_handoffs(self, max: usize) -> Self {
        self.set(move |c| c.max_handoffs = max)
    }

    /// Validates the options.
    ///
    /// # Errors
    /// [`OptionsError`] naming the first invalid setting.
    pub fn build(self) -> Result<CoordinatorOptions, OptionsError> {
        if self.node_name.is_empty()
            || self.node_name.len() > MAX_NODE_NAME
            || self.node_name.contains(['#', '\0'])
        {
            return Err(OptionsError::new(
                "node_name",
                format!(
                    "must have 1 to {MAX_NODE_NAME} bytes, without `#` or NUL (got {:?})",
                    self.node_name
                ),
            ));
        }
        let config = self.explicit.apply(self.loaded);
        config.validate()?;
        Ok(CoordinatorOptions {
            node_name: self.node_name,
            address: self.address,
            config,
        })
    }

    fn set(mut self, setter: impl FnOnce(&mut CoordinatorConfig) + Send + 'static) -> Self {
        self.explicit.set(setter);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_settings_name_their_field() {
        let field = |b: CoordinatorOptionsBuilder| b.build().unwrap_err().field;
        let b = || CoordinatorOptions::builder("node-a");
        assert_eq!(field(CoordinatorOptions::builder("")), "node_name");
        assert_eq!(field(CoordinatorOptions::builder("a#b")), "node_name");
        assert_eq!(
            field(b().renew_interval(Duration::ZERO)),
            "renew_interval_ms"
        );
        assert_eq!(
            field(b().lease_ttl(Duration::from_secs(5))),
            "lease_ttl_ms",
            "under 3 × 2 s"
        );
        assert_eq!(field(b().max_handoffs(0)), "max_handoffs");
        let loaded: CoordinatorConfig =
            serde_json::from_str(r#"{"lease_ttl_ms": 3000, "renew_interval_ms": 1000}"#).unwrap();
        let options = b().config(loaded).max_handoffs(2).build().unwrap();
        assert_eq!(options.config().lease_ttl, Duration::from_secs(3));
        assert_eq!(options.config().max_handoffs, 2);
    }
}
