//! Validated options of a work-pulling producer.

use std::time::Duration;

use crate::config::{Limit, ProducerConfig};
use crate::error::OptionsError;
use crate::work_pulling::registry::MAX_WORKER_NAME;
use crate::work_pulling::WorkerRegistry;

/// Everything a work-pulling producer needs, validated: the registry it takes its workers
/// from, its own settings and the settings of each worker's stream.
#[derive(Debug)]
pub struct WorkPullingOptions<T: Send + 'static> {
    pub(crate) registry: WorkerRegistry<T>,
    pub(crate) producer: ProducerConfig,
    pub(crate) worker: ProducerConfig,
}

impl<T: Send + 'static> WorkPullingOptions<T> {
    /// Starts a builder for a producer that sends jobs to the workers of `registry`.
    pub fn builder(registry: &WorkerRegistry<T>) -> WorkPullingOptionsBuilder<T> {
        WorkPullingOptionsBuilder {
            registry: registry.clone(),
            producer: Self::default_producer(),
            worker: ProducerConfig::default(),
        }
    }

    /// The producer's settings by default: [`ProducerConfig`]'s, but 1024 jobs held by the
    /// pool at once (`window_size`), and a 30 s `resend_timeout` (the hop from the producer to
    /// its pool is in-process and loses nothing; a durable producer's recovered jobs are sent
    /// at once).
    pub fn default_producer() -> ProducerConfig {
        ProducerConfig {
            window_size: 1024,
            resend_timeout: Duration::from_secs(30),
            ..ProducerConfig::default()
        }
    }

    /// The producer's settings.
    pub fn producer_config(&self) -> &ProducerConfig {
        &self.producer
    }

    /// The settings of each worker's stream.
    pub fn worker_config(&self) -> &ProducerConfig {
        &self.worker
    }
}

/// Builds [`WorkPullingOptions`].
#[derive(Debug)]
pub struct WorkPullingOptionsBuilder<T: Send + 'static> {
    registry: WorkerRegistry<T>,
    producer: ProducerConfig,
    worker: ProducerConfig,
}

impl<T: Send + 'static> WorkPullingOptionsBuilder<T> {
    /// The producer's settings (default [`WorkPullingOptions::default_producer`]):
    /// `producer_id` (at most 127 bytes: it prefixes the worker streams' ids), `window_size`
    /// (jobs held by the pool at once: waiting for a worker or at one), `max_pending` (jobs
    /// waiting beyond; then `tell` refuses and `send` waits). `max_attempts` must stay
    /// unbounded: a job is re-routed until a worker confirms it.
    pub fn producer(mut self, config: ProducerConfig) -> Self {
        self.producer = config;
        self
    }

    /// The settings of each worker's stream (default [`ProducerConfig`]'s): `window_size` is
    /// the most jobs one worker holds at once (its demand), `resend_timeout` and `backoff` its
    /// retransmissions; with a bounded `max_attempts`, a worker whose stream gives a job up
    /// has its jobs re-routed and gets a fresh stream. `producer_id` must be unset: each stream's
    /// id is the producer's, `/` and the worker's name.
    pub fn worker(mut self, config: ProducerConfig) -> Self {
        self.worker = config;
        self
    }

    /// Validates the options.
    ///
    /// # Errors
    /// [`OptionsError`] naming the first invalid setting.
    pub fn build(self) -> Result<WorkPullingOptions<T>, OptionsError> {
        self.producer.validate()?;
        self.worker.validate()?;
        if self.producer.max_attempts != Limit::Unbounded {
            return Err(OptionsError::new(
                "max_attempts",
                "a work-pulling producer re-routes a job until a worker confirms it, so its \
                 max_attempts stays unbounded: bound the worker streams' instead",
            ));
        }
        if let Some(id) = self.producer.producer_id.as_deref() {
            check_producer_id(id)?;
        }
        if self.worker.producer_id.is_some() {
            return Err(OptionsError::new(
                "producer_id",
                "a worker stream's id is the producer's, `/` and the worker's name: leave it \
                 unset in the worker settings",
            ));
        }
        Ok(WorkPullingOptions {
            registry: self.registry,
            producer: self.producer,
            worker: self.worker,
        })
    }
}

/// A work-pulling producer's id prefixes its worker streams' ids (`<id>/<worker>`), which
/// must stay within a producer id's 256 bytes: at most 127 bytes.
pub(crate) fn check_producer_id(id: &str) -> Result<(), OptionsError> {
    let room = 256 - 1 - MAX_WORKER_NAME;
    if id.len() > room {
        return Err(OptionsError::new(
            "producer_id",
            format!(
                "a work-pulling producer's id prefixes its worker streams' ids: at most {room} \
                 bytes (got {})",
                id.len()
            ),
        ));
    }
    Ok(())
}
