//! The NATS carrier's options.

use crate::error::OptionsError;
use crate::remote::options::check_frame_limits;

use super::subject::check_subject;

/// How a [`NatsCarrier`](super::NatsCarrier) sends and receives. Authentication and TLS are
/// the NATS client's: build an `async_nats::Client` with them and pass it to
/// [`NatsCarrier::with_client`](super::NatsCarrier::with_client).
#[derive(Clone, Debug)]
pub struct NatsOptions {
    pub(crate) max_frame_length: usize,
    pub(crate) max_output_bytes: usize,
    pub(crate) max_routes: usize,
    pub(crate) reply_prefix: String,
    #[cfg(feature = "metrics")]
    pub(crate) metrics_label: Option<String>,
}

impl Default for NatsOptions {
    fn default() -> Self {
        Self {
            max_frame_length: 1 << 20,
            max_output_bytes: 4 << 20,
            max_routes: 4096,
            #[cfg(feature = "metrics")]
            metrics_label: None,
            reply_prefix: "_INBOX.".to_owned(),
        }
    }
}

impl NatsOptions {
    /// Starts a builder from the defaults.
    pub fn builder() -> NatsOptionsBuilder {
        NatsOptionsBuilder(Self::default())
    }

    fn validate(&self) -> Result<(), OptionsError> {
        #[cfg(feature = "metrics")]
        if let Some(label) = &self.metrics_label {
            crate::telemetry::metrics::check_label(label)?;
        }
        check_frame_limits(self.max_frame_length, self.max_output_bytes)?;
        if self.max_routes == 0 {
            return Err(OptionsError::new("max_routes", "must be positive (got 0)"));
        }
        if let Err(why) = check_subject(self.reply_prefix.trim_end_matches('.')) {
            return Err(OptionsError::new(
                "reply_prefix",
                format!("must be a subject prefix such as \"_INBOX.\": {why}"),
            ));
        }
        Ok(())
    }
}

/// Builds [`NatsOptions`].
#[derive(Debug)]
pub struct NatsOptionsBuilder(NatsOptions);

impl NatsOptionsBuilder {
    /// The value of the `carrier` label on this carrier's metrics (feature `metrics`; default
    /// `"default"`; not empty).
    #[cfg(feature = "metrics")]
    pub fn metrics_label(mut self, label: impl Into<String>) -> Self {
        self.0.metrics_label = Some(label.into());
        self
    }

    /// The largest message this carrier publishes, in bytes (default 1 MiB, 4 KiB to 16 MiB;
    /// lowered to the server's `max_payload` when that is smaller): batches are split to
    /// fit. Received messages are bounded by the server's `max_payload`, whatever this says,
    /// so carriers with different values still understand each other.
    pub fn max_frame_length(mut self, bytes: usize) -> Self {
        self.0.max_frame_length = bytes;
        self
    }

    /// The most bytes queued for publishing at once (default 4 MiB, at least twice
    /// `max_frame_length`); beyond, deliveries and ACKs are dropped and counted (the producer
    /// retransmits), so a server that is away or slow costs this much memory, never more.
    pub fn max_output_bytes(mut self, bytes: usize) -> Self {
        self.0.max_output_bytes = bytes;
        self
    }

    /// Producer incarnations remembered for routing ACKs, each with its unconfirmed messages'
    /// encoded bodies, over all the carrier's producers (default 4096; least recently used
    /// forgotten: its ACKs are then dropped and its messages retransmitted). Keep it at least
    /// the number of producers sending through the carrier at once.
    pub fn max_routes(mut self, n: usize) -> Self {
        self.0.max_routes = n;
        self
    }

    /// Deliveries are accepted only with a reply subject starting with this (default
    /// `_INBOX.`, the NATS clients' inbox prefix; set it to match
    /// `async_nats::ConnectOptions::custom_inbox_prefix` of the producers' clients). A
    /// delivery naming another reply subject is dropped and counted: otherwise whoever may
    /// publish to a consumer's subject could make the consumer publish ACKs, with its
    /// credentials, to any subject.
    pub fn reply_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.0.reply_prefix = prefix.into();
        self
    }

    /// The options, validated.
    ///
    /// # Errors
    /// [`OptionsError`] naming the first invalid field and why.
    pub fn build(self) -> Result<NatsOptions, OptionsError> {
        self.0.validate()?;
        Ok(self.0)
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
    }
}
