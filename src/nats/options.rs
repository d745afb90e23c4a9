//! The NATS carrier's options.

use serde::{Deserialize, Serialize};

use crate::config::{positive, Overrides};
use crate::error::OptionsError;
use crate::tcp::frame::PROTOCOL_VERSION;
use crate::tcp::handshake::{check_frame_limits, check_wire_version};

use super::subject::check_subject;

/// The settings of a [`NatsCarrierHandle`](super::NatsCarrierHandle): plain data, loadable with
/// serde from the application's configuration (unknown keys refused), validated when
/// [`NatsOptionsBuilder::build`] builds the options. `Default` gives the documented defaults; each
/// field's meaning is that of the builder method of the same name.
///
/// ```
/// # use actix_delivery::nats::{NatsConfig, NatsOptions};
/// let config: NatsConfig = serde_json::from_str(r#"{ "max_routes": 512 }"#).unwrap();
/// let options = NatsOptions::builder().config(config).build().unwrap();
/// assert_eq!(options.config().max_routes, 512);
/// assert_eq!(options.config().reply_prefix, "_INBOX."); // default
/// ```
///
/// Authentication and TLS are the NATS client's, not data of these settings: build an
/// `async_nats::Client` with them and pass it to
/// [`NatsCarrierHandle::with_client`](super::NatsCarrierHandle::with_client).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    /// The largest message published, in bytes: default 1 MiB, 4 KiB to 16 MiB.
    pub max_frame_length: usize,
    /// The most bytes queued for publishing: default 4 MiB, at least twice
    /// `max_frame_length`, at most 1 GiB.
    pub max_output_bytes: usize,
    /// Producer incarnations remembered for routing ACKs: default 4096; positive.
    pub max_routes: usize,
    /// Deliveries are accepted only with a reply subject starting with this: default
    /// `"_INBOX."`.
    pub reply_prefix: String,
    /// The protocol version this carrier writes its deliveries at: default 4, 3 to 4. See
    /// [`NatsOptionsBuilder::wire_version`].
    pub wire_version: u16,
}

impl Default for NatsConfig {
    fn default() -> Self {
        Self {
            max_frame_length: 1 << 20,
            max_output_bytes: 4 << 20,
            max_routes: 4096,
            reply_prefix: "_INBOX.".to_owned(),
            wire_version: PROTOCOL_VERSION,
        }
    }
}

impl NatsConfig {
    /// Checks every rule; the error names the first offending settings key.
    ///
    /// # Errors
    /// [`OptionsError`] naming the key and the rule it breaks.
    pub fn validate(&self) -> Result<(), OptionsError> {
        check_frame_limits(self.max_frame_length, self.max_output_bytes)?;
        check_wire_version(self.wire_version)?;
        positive("max_routes", self.max_routes)?;
        if let Err(why) = check_subject(self.reply_prefix.trim_end_matches('.')) {
            return Err(OptionsError::new(
                "reply_prefix",
                format!("must be a subject prefix such as \"_INBOX.\": {why}"),
            ));
        }
        Ok(())
    }
}

/// How a [`NatsCarrierHandle`](super::NatsCarrierHandle) sends and receives, validated: built with
/// [`NatsOptions::builder`] (`default()` gives the defaults).
#[derive(Clone, Debug, Default)]
pub struct NatsOptions {
    pub(crate) config: NatsConfig,
    #[cfg(feature = "metrics")]
    pub(crate) metrics_label: Option<String>,
}

impl NatsOptions {
    /// Starts a builder from the defaults.
    pub fn builder() -> NatsOptionsBuilder {
        NatsOptionsBuilder {
            loaded: NatsConfig::default(),
            explicit: Overrides::default(),
            #[cfg(feature = "metrics")]
            metrics_label: None,
        }
    }

    /// The validated settings.
    pub fn config(&self) -> &NatsConfig {
        &self.config
    }
}

/// Builds [`NatsOptions`]: a value set here wins over one [loaded](Self::config), which wins
/// over the default, whatever order the calls come in.
#[derive(Debug)]
pub struct NatsOptionsBuilder {
    loaded: NatsConfig,
    explicit: Overrides<NatsConfig>,
    #[cfg(feature = "metrics")]
    metrics_label: Option<String>,
}

impl NatsOptionsBuilder {
    /// Loaded settings (e.g. the `[nats]` section of the application's config file); values
    /// set on the builder still win.
    pub fn config(mut self, config: NatsConfig) -> Self {
        self.loaded = config;
        self
    }

    /// The value of the `carrier` label on this carrier's metrics (feature `metrics`; default
    /// `"default"`; not empty).
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_label(mut self, label: impl Into<String>) -> Self {
        self.metrics_label = Some(label.into());
        self
    }

    /// The largest message this carrier publishes, in bytes (default 1 MiB, 4 KiB to 16 MiB;
    /// lowered to the server's `max_payload` when that is smaller): batches are split to
    /// fit. Received messages are bounded by the server's `max_payload`, whatever this says,
    /// so carriers with different values still understand each other.
    pub fn max_frame_length(mut self, bytes: usize) -> Self {
        self.explicit.set(move |c| c.max_frame_length = bytes);
        self
    }

    /// The most bytes queued for publishing at once (default 4 MiB, at least twice
    /// `max_frame_length`); beyond, deliveries and ACKs are dropped and counted (the producer
    /// retransmits), so a server that is away or slow costs this much memory, never more.
    pub fn max_output_bytes(mut self, bytes: usize) -> Self {
        self.explicit.set(move |c| c.max_output_bytes = bytes);
        self
    }

    /// Producer incarnations remembered for routing ACKs, each with its unconfirmed messages'
    /// encoded bodies, over all the carrier's producers (default 4096; least recently used
    /// forgotten: its ACKs are then dropped and its messages retransmitted). Keep it at least
    /// the number of producers sending through the carrier at once.
    pub fn max_routes(mut self, n: usize) -> Self {
        self.explicit.set(move |c| c.max_routes = n);
        self
    }

    /// Deliveries are accepted only with a reply subject starting with this (default
    /// `_INBOX.`, the NATS clients' inbox prefix; set it to match
    /// `async_nats::ConnectOptions::custom_inbox_prefix` of the producers' clients). A
    /// delivery naming another reply subject is dropped and counted: otherwise whoever may
    /// publish to a consumer's subject could make the consumer publish ACKs, with its
    /// credentials, to any subject.
    pub fn reply_prefix(mut self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        self.explicit.set(move |c| c.reply_prefix = prefix);
        self
    }

    /// The protocol version this carrier writes its deliveries at (default 4, the newest this
    /// release speaks; 3 to 4). It reads every version it speaks, whatever this says, and
    /// writes each ACK at the version of the deliveries it answers.
    ///
    /// For a rolling upgrade from a release that reads an older version only: set this to that
    /// version on every carrier of this release until every carrier runs this release, then
    /// raise it.
    ///
    /// Version 3 has no chunks: a chunk of a large message
    /// ([`chunk_size`](crate::ProducerOptionsBuilder::chunk_size)) is never published by a
    /// carrier at version 3. It is held back and warned about, and stays unconfirmed: its
    /// producer retransmits it, and it is held again, each time counted in
    /// [`NatsStats::chunks_held_for_version`](super::NatsStats::chunks_held_for_version)
    /// (counted per held transmission, not per chunk). The producer's window stays occupied,
    /// so a producer that chunks stalls on a carrier at version 3 until it sends through a
    /// carrier made with version 4 (this setting is read when the carrier is made) or its
    /// [`max_attempts`](crate::ProducerOptionsBuilder::max_attempts) gives the message up.
    pub fn wire_version(mut self, version: u16) -> Self {
        self.explicit.set(move |c| c.wire_version = version);
        self
    }

    /// The options, validated.
    ///
    /// # Errors
    /// [`OptionsError`] naming the first invalid field and why.
    pub fn build(self) -> Result<NatsOptions, OptionsError> {
        let config = self.explicit.apply(self.loaded);
        config.validate()?;
        #[cfg(feature = "metrics")]
        if let Some(label) = &self.metrics_label {
            crate::config::check_label(label)?;
        }
        Ok(NatsOptions {
            config,
            #[cfg(feature = "metrics")]
            metrics_label: self.metrics_label,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert!(NatsOptions::builder().build().is_ok());
    }

    #[test]
    fn every_invalid_field_is_named() {
        let cases = [
            (
                NatsOptions::builder().max_frame_length(100),
                "max_frame_length",
            ),
            (
                NatsOptions::builder().max_frame_length(64 << 20),
                "max_frame_length",
            ),
            (
                NatsOptions::builder().max_output_bytes(1 << 20),
                "max_output_bytes",
            ),
            (
                NatsOptions::builder().max_output_bytes(2 << 30),
                "max_output_bytes",
            ),
            (NatsOptions::builder().max_routes(0), "max_routes"),
            (NatsOptions::builder().wire_version(2), "wire_version"),
            (NatsOptions::builder().wire_version(5), "wire_version"),
            (NatsOptions::builder().reply_prefix(""), "reply_prefix"),
            (NatsOptions::builder().reply_prefix("a b."), "reply_prefix"),
            (
                NatsOptions::builder().reply_prefix("_INBOX.*."),
                "reply_prefix",
            ),
        ];
        for (builder, field) in cases {
            let err = builder.build().unwrap_err();
            assert_eq!(err.field, field, "{err}");
        }
        for version in 3..=4 {
            let options = NatsOptions::builder()
                .wire_version(version)
                .build()
                .unwrap();
            assert_eq!(options.config().wire_version, version);
        }
    }
}
