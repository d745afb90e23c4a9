//! # Work pulling: one producer, a pool of workers that come and go
//!
//! A work-pulling producer spreads jobs over the workers registered in a
//! [`WorkerRegistry`](crate::work_pulling::WorkerRegistry), one reliable stream per worker, and
//! re-routes the jobs of a worker that leaves. Its handle derefs to a
//! [`ProducerHandle`](crate::ProducerHandle) (`tell`, `send`, `store`, confirmations): `Ok` means
//! a worker's handler succeeded. The
//! [`work_pulling`](crate::work_pulling) module states the rules (demand, rests, re-routing,
//! order); this chapter shows how the pieces fit.
//!
//! ```
//! use actix::prelude::*;
//! use actix_delivery::work_pulling::{GivenUpJob, Job, WorkPullingOptions, WorkerRegistry};
//! use actix_delivery::{ConsumerOptions, DeliveryHandler, ReliableDelivery};
//!
//! /// Where jobs that failed too often are kept for a separate workflow.
//! struct PoisonStore;
//! impl Actor for PoisonStore {
//!     type Context = Context<Self>;
//! }
//! impl Handler<GivenUpJob<u64>> for PoisonStore {
//!     type Result = ();
//!     fn handle(&mut self, job: GivenUpJob<u64>, _: &mut Context<Self>) {
//!         let (body, attempts) = (job.job.body, job.attempts);
//!         println!("gave up job {body} after {attempts} failures: {}", job.last_error);
//!     }
//! }
//!
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = WorkerRegistry::<u64>::new();
//! let worker = ReliableDelivery::consumer(
//!     ConsumerOptions::builder(DeliveryHandler::from_fn(|job: Job<u64>| async move {
//!         println!("job {}: {}", job.info.seq, job.body); // job.info is the job's stable id
//!         Ok::<(), std::io::Error>(())
//!     }))
//!     .build()?,
//! );
//! registry.register_consumer("worker-1", &worker)?; // deregistered when it stops
//! let jobs = ReliableDelivery::work_pulling_producer(
//!     WorkPullingOptions::builder(&registry)
//!         .give_up_after(5) // by default a job is routed again until a worker confirms it
//!         .dead_letters(PoisonStore.start().recipient())
//!         .build()?,
//! );
//! jobs.send(42).await?; // confirmed once a worker handled it
//! # Ok(()) }
//! ```
//!
//! - **Effectively once.** [`Job::info`](crate::work_pulling::Job::info) is the same at every
//!   worker and, for `durable_work_pulling_producer`, across restarts. A persistent worker built
//!   with `PersistentHandle::job_handler` stores it as the processed mark, so a job that a dying
//!   worker committed and then comes again is answered "already processed": with workers on a
//!   shared journal, a worker's death never doubles an effect. For jobs into sharded entities,
//!   `EntityHostHandle::job_handler` does the same with each job's entity.
//! - **Workers in other processes** announce themselves: an
//!   [`AnnouncerHandle`](crate::work_pulling::AnnouncerHandle) tells an `Announcement` (name,
//!   node address, consumer name or NATS subject) every interval to a consumer whose handler is a
//!   [`WorkerDiscovery`](crate::work_pulling::WorkerDiscovery); the discovery registers the worker
//!   and deregisters it after `timeout` of silence (a SIGKILLed worker), and its jobs move on.
//! - [`pool_stats()`](crate::work_pulling::WorkPullingHandle::pool_stats) reports workers,
//!   queued, re-routed, failed and given-up jobs, rests, and per worker what it holds, confirmed
//!   and failed.
//!
//! `examples/work_pulling.rs` in the repository starts and stops workers mid-job while 20 000
//! jobs flow and checks, from the journal, that each was applied once
//! (`cargo run --example work_pulling`).
