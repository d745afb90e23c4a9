//! The application's side of a work-pulling producer.

use std::ops::Deref;

use actix::prelude::*;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::delivery::options::ProducerOptions;
use crate::delivery::producer::start_producer;
use crate::delivery::producer::ProducerHandle;
use crate::durable::producer::start_durable_producer;
use crate::durable::DurableOptions;
use crate::error::OptionsError;
use crate::runtime::shutdown::{GracefulStop, StopFuture};
use crate::work_pulling::controller::{GetPoolStats, WorkPullingController};
use crate::work_pulling::options::check_producer_id;
use crate::work_pulling::pool::PoolStats;
use crate::work_pulling::WorkPullingOptions;

/// The label of a pool's metrics when its producer has no fixed id.
const DEFAULT_LABEL: &str = "default";

/// A work-pulling producer: `tell`, `send`, `store`, `idle`, `stop` and the confirmations are
/// those of the [`ProducerHandle`] it dereferences to, and a confirmation `Ok` means a worker
/// confirmed the job. Cheap to clone; when the last clone is dropped, the producer finishes
/// what it holds and stops, and its pool with it.
pub struct WorkPullingHandle<T: Clone + Send + 'static> {
    producer: ProducerHandle<T>,
    pool: Addr<WorkPullingController<T>>,
}

impl<T: Clone + Send + 'static> WorkPullingHandle<T> {
    pub(crate) fn start(options: WorkPullingOptions<T>) -> Self {
        let (ctx, front) = Self::front(&options);
        let producer = start_producer(front);
        let label = options.producer.producer_id.clone();
        Self::run(ctx, producer, options, label)
    }

    pub(crate) fn start_durable(
        options: WorkPullingOptions<T>,
        durable: DurableOptions<T>,
    ) -> Result<Self, OptionsError>
    where
        T: Serialize + DeserializeOwned,
    {
        check_producer_id(durable.producer_id.as_str())?;
        let (ctx, front) = Self::front(&options);
        let label = Some(durable.producer_id.to_string());
        let producer = start_durable_producer(front, durable)?;
        Ok(Self::run(ctx, producer, options, label))
    }

    /// The pool's context (not started yet: its producer needs its address first) and the
    /// options of the producer that feeds it.
    fn front(
        options: &WorkPullingOptions<T>,
    ) -> (Context<WorkPullingController<T>>, ProducerOptions<T>) {
        let ctx = Context::new();
        let consumer = WorkPullingController::consumer_ref(&ctx.address());
        let front = ProducerOptions::from_config(consumer, options.producer.clone())
            .expect("the producer settings were validated when the options were built");
        (ctx, front)
    }

    /// Starts the pool; its worker streams' metrics go under `label` (the producer's fixed
    /// id, else `"default"`), never under a worker's name.
    fn run(
        ctx: Context<WorkPullingController<T>>,
        producer: ProducerHandle<T>,
        options: WorkPullingOptions<T>,
        label: Option<String>,
    ) -> Self {
        let label = label.unwrap_or_else(|| DEFAULT_LABEL.to_owned());
        let pool = ctx.run(WorkPullingController::new(&producer, options, label));
        Self { producer, pool }
    }

    /// The producer that feeds the pool (what this handle dereferences to).
    pub fn producer(&self) -> &ProducerHandle<T> {
        &self.producer
    }

    /// The pool's counters: workers, queued jobs, and per worker what it holds, confirmed
    /// and had re-routed. (The producer's own are [`ProducerHandle::stats`].)
    ///
    /// # Errors
    /// [`MailboxError`] if the pool has stopped (its producer stopped).
    pub async fn pool_stats(&self) -> Result<PoolStats, MailboxError> {
        self.pool.send(GetPoolStats).await
    }
}

impl<T: Clone + Send + 'static> Deref for WorkPullingHandle<T> {
    type Target = ProducerHandle<T>;

    fn deref(&self) -> &ProducerHandle<T> {
        &self.producer
    }
}

impl<T: Clone + Send + 'static> Clone for WorkPullingHandle<T> {
    fn clone(&self) -> Self {
        Self {
            producer: self.producer.clone(),
            pool: self.pool.clone(),
        }
    }
}

impl<T: Clone + Send + 'static> std::fmt::Debug for WorkPullingHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkPullingHandle")
            .field("producer_id", self.producer.producer_id())
            .finish_non_exhaustive()
    }
}

impl<T: Clone + Send + 'static> GracefulStop for WorkPullingHandle<T> {
    /// Its producer's: the pool stops with it.
    fn stop_gracefully(&self) -> StopFuture {
        self.producer.stop_gracefully()
    }
}
