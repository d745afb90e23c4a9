//! Validated options of a work-pulling producer.

use std::num::NonZeroU32;
use std::time::Duration;

use actix::Recipient;
use serde::Serialize;

use crate::config::{Backoff, Limit, ProducerConfig};
use crate::delivery::dead_letter_handle::{DeadLetters, GiveUpKeeper};
use crate::delivery::dead_letters::SourceKind;
use crate::error::OptionsError;
use crate::work_pulling::{GivenUpJob, WorkerRegistry};

/// Everything a work-pulling producer needs, validated: the registry it takes its workers
/// from, its own settings, the settings of each worker's stream, when a job is given up and
/// where it then goes.
#[derive(Debug)]
pub struct WorkPullingOptions<T: Send + 'static> {
    pub(crate) registry: WorkerRegistry<T>,
    pub(crate) producer: ProducerConfig,
    pub(crate) worker: ProducerConfig,
    pub(crate) give_up_after: Option<NonZeroU32>,
    pub(crate) dead_letters: Option<Recipient<GivenUpJob<T>>>,
    pub(crate) kept: Option<GiveUpKeeper<T>>,
}

impl<T: Send + 'static> WorkPullingOptions<T> {
    /// Starts a builder for a producer that sends jobs to the workers of `registry`.
    pub fn builder(registry: &WorkerRegistry<T>) -> WorkPullingOptionsBuilder<T> {
        WorkPullingOptionsBuilder {
            registry: registry.clone(),
            producer: Self::default_producer(),
            worker: Self::default_worker(),
            give_up_after: None,
            dead_letters: None,
            kept: None,
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

    /// The settings of each worker's stream by default: [`ProducerConfig`]'s, but a bounded
    /// `max_attempts` of 6 with an exponential `backoff` (doubling from the 500 ms
    /// `resend_timeout`, at most 30 s, no jitter): a job that a worker does not confirm within
    /// 31.5 s of its first transmission (0.5 + 1 + 2 + 4 + 8 + 16 s; its handler failing 6
    /// times, or the job waiting that long behind the others the worker holds) fails there and
    /// goes to another worker. With handlers that take longer than about 2 s, lower
    /// `window_size` (16: the jobs a worker holds at once) or raise `max_attempts`.
    pub fn default_worker() -> ProducerConfig {
        ProducerConfig {
            max_attempts: Limit::At(6),
            backoff: Backoff::Exponential {
                multiplier: 2.0,
                max: Duration::from_secs(30),
                jitter: 0.0,
            },
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
    give_up_after: Option<u32>,
    dead_letters: Option<Recipient<GivenUpJob<T>>>,
    kept: Option<GiveUpKeeper<T>>,
}

impl<T: Send + 'static> WorkPullingOptionsBuilder<T> {
    /// The producer's settings (default [`WorkPullingOptions::default_producer`]):
    /// `producer_id` (at most 127 bytes: it prefixes the worker streams' ids), `window_size`
    /// (jobs held by the pool at once: waiting for a worker or at one), `max_pending` (jobs
    /// waiting beyond; then `tell` refuses and `send` waits). `max_attempts` must stay
    /// unbounded: the pool decides when a job is given up ([`give_up_after`](Self::give_up_after)).
    pub fn producer(mut self, config: ProducerConfig) -> Self {
        self.producer = config;
        self
    }

    /// The settings of each worker's stream (default [`WorkPullingOptions::default_worker`]):
    /// `window_size` is the most jobs one worker holds at once (its demand), `resend_timeout`
    /// and `backoff` its retransmissions, and `max_attempts` how many transmissions a job gets
    /// at one worker: a job its stream gives up failed there, and goes to another worker (or
    /// is given up, see [`give_up_after`](Self::give_up_after)), and the worker rests (see
    /// [`pool`](crate::work_pulling::pool)). With `max_attempts` unbounded a job stays with
    /// its worker until the worker confirms it or leaves. `producer_id` must be unset: each
    /// stream's id is the producer's, `/` and a stream number. The streams' metrics go under
    /// the producer's label (its fixed id, else `"default"`), never under a worker's name.
    pub fn worker(mut self, config: ProducerConfig) -> Self {
        self.worker = config;
        self
    }

    /// Gives a job up once it failed `failures` times in all, at any workers (default:
    /// never). A given-up job is settled with
    /// [`DeliveryError::HandlingFailed`](crate::DeliveryError::HandlingFailed) (a durable
    /// producer records it, so it is not sent again after a restart), handed to the
    /// [`dead_letters`](Self::dead_letters) sink, and never sent to a worker again. A job
    /// whose worker left did not fail; but a worker that stays registered while it cannot
    /// work (it fails everything) costs each job sent to it one failure: deregister such
    /// workers, and leave room in `failures` for them. Positive.
    pub fn give_up_after(mut self, failures: u32) -> Self {
        self.give_up_after = Some(failures);
        self
    }

    /// Where given-up jobs go ([`give_up_after`](Self::give_up_after)): each with its body,
    /// its stable id, how many times it failed and the last failure. The sink hears of a job
    /// when the pool gives it up; a durable producer records the give-up after that, so a
    /// crash in between sends the job again after the restart (and it may reach the sink
    /// again: its stable id tells).
    pub fn dead_letters(mut self, sink: Recipient<GivenUpJob<T>>) -> Self {
        self.dead_letters = Some(sink);
        self
    }

    /// Keeps given-up jobs ([`give_up_after`](Self::give_up_after)) in `dead_letters`,
    /// under the name `source` (kind [`WorkPulling`](crate::dead_letters::SourceKind::WorkPulling)):
    /// each job's body in MessagePack (shown as JSON by the console and the inspector), its
    /// stable id as the key and origin, its failures and the last one. Beside
    /// [`dead_letters`](Self::dead_letters), which still gets every one.
    pub fn keep_dead_letters(mut self, dead_letters: DeadLetters, source: impl Into<String>) -> Self
    where
        T: Serialize,
    {
        self.kept = Some(GiveUpKeeper::new(
            dead_letters,
            SourceKind::WorkPulling,
            source.into(),
        ));
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
                "a work-pulling producer's pool decides when a job is given up: set \
                 give_up_after instead",
            ));
        }
        if let Some(id) = self.producer.producer_id.as_deref() {
            check_producer_id(id)?;
        }
        if self.worker.producer_id.is_some() {
            return Err(OptionsError::new(
                "producer_id",
                "a worker stream's id is the producer's, `/` and the stream's number: leave it \
                 unset in the worker settings",
            ));
        }
        let give_up_after = self
            .give_up_after
            .map(|failures| {
                NonZeroU32::new(failures)
                    .ok_or_else(|| OptionsError::new("give_up_after", "must be positive (got 0)"))
            })
            .transpose()?;
        Ok(WorkPullingOptions {
            registry: self.registry,
            producer: self.producer,
            worker: self.worker,
            give_up_after,
            dead_letters: self.dead_letters,
            kept: self.kept,
        })
    }
}

/// A work-pulling producer's id prefixes its worker streams' ids (`<id>/<stream number, 16
/// hex digits>`), which must stay within a producer id's 256 bytes: at most 239 bytes.
pub(crate) fn check_producer_id(id: &str) -> Result<(), OptionsError> {
    let room = 256 - 1 - 16;
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
