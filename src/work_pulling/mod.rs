//! Work pulling: one reliable producer feeding a changing pool of workers; nothing is lost
//! when a worker leaves or dies, and with persistent workers nothing is done twice.
//!
//! ```text
//!  your code            producer (plain or durable)     pool                      workers
//!  tell / send / store ─▶ numbers jobs, window, ──job──▶ least in flight ──stream──▶ Job<T>
//!                         queue, confirmations           re-routes jobs  ◀──ACK───  handler
//!  confirm(Ok) ◀──────── ACK ◀─────────────────────────── on the worker's confirmation
//! ```
//!
//! [`ReliableDelivery::work_pulling_producer`](crate::ReliableDelivery::work_pulling_producer)
//! starts a producer (exactly a [`ProducerHandle`](crate::ProducerHandle): `tell`, `send`,
//! `store`, confirmations) whose consumer is a pool. Workers are consumers of [`Job<T>`]
//! registered in a [`WorkerRegistry`]; the pool opens one reliable stream per worker (an
//! ordinary producer, so retransmission, dedup and flow control are the point-to-point
//! ones, over any transport).
//!
//! # Rules
//!
//! - **Demand.** A job goes to a worker whose stream has free window (`window_size` of the
//!   worker settings), the one holding the fewest jobs, ties at random; a slow worker holds
//!   its window longer and so gets fewer jobs. With no demand anywhere, jobs wait in the
//!   pool (up to the producer's `window_size`), then in the producer (`max_pending`): `tell`
//!   refuses and `send` waits.
//! - **Confirmation.** A job is confirmed to its sender once, when the first worker's stream
//!   confirmed it (the worker's handler succeeded). A job is never given up: it is routed
//!   again until a worker confirms it or the producer stops.
//! - **Workers leave.** When a worker is deregistered or its consumer stops, the worker
//!   leaves: its stream stops and its unconfirmed jobs are routed to the others, **in their
//!   original order, at the front** of the waiting jobs. When its stream gives a job up (a
//!   bounded `max_attempts` in the worker settings), the same happens to its jobs, and it
//!   stays in the pool with a fresh stream while it is registered (for remote workers, the
//!   [`WorkerDiscovery`] decides when one is gone). A job can so be handled by two workers
//!   (the first may have handled it and lost the ACK): at least once.
//! - **Stable job ids.** Every job carries [`Job::info`]: the producer's id, incarnation and
//!   the job's seq, the same at every worker it is routed to and, with a durable producer,
//!   across the producer's restarts. A persistent worker records it as the processed mark
//!   ([`PersistentHandle::job_handler`](crate::persistence::PersistentHandle::job_handler)), so
//!   a job that one entity processed is answered "already processed" when it reaches that
//!   entity again, through any worker: with workers that apply their jobs to the same entity
//!   (on a journal they share), a worker's death never doubles an effect. The dedup is the
//!   entity's: a job that goes to different entities on different attempts is processed by
//!   each, so route a job to its entity by its content.
//! - **Order.** None across workers; each worker sees its jobs in the order they were routed
//!   to it (with an `ordered` consumer, strictly).
//! - **Durable.** [`ReliableDelivery::durable_work_pulling_producer`] stores each job before
//!   it is routed; after a crash, the restarted producer sends its unconfirmed jobs again,
//!   under their ids, and the pool routes them to the workers present.
//!
//! [`ReliableDelivery::durable_work_pulling_producer`]: crate::ReliableDelivery::durable_work_pulling_producer
//!
//! ```
//! use actix_delivery::work_pulling::{Job, WorkPullingOptions, WorkerRegistry};
//! use actix_delivery::{ConsumerOptions, DeliveryHandler, ReliableDelivery};
//!
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = WorkerRegistry::<u64>::new();
//! for name in ["a", "b"] {
//!     let worker = ReliableDelivery::consumer(
//!         ConsumerOptions::builder(DeliveryHandler::from_fn(move |job: Job<u64>| async move {
//!             println!("worker {name}: job {} = {}", job.info.seq, job.body);
//!             Ok::<(), std::io::Error>(())
//!         }))
//!         .build()?,
//!     );
//!     registry.register_consumer(name, &worker)?;
//! }
//! let jobs = ReliableDelivery::work_pulling_producer(WorkPullingOptions::builder(&registry).build()?);
//! for n in 0..10 {
//!     jobs.send(n).await?; // confirmed once a worker handled it
//! }
//! assert_eq!(jobs.pool_stats().await?.confirmed, 10);
//! # Ok(()) }
//! ```

mod controller;
mod discovery;
mod handle;
mod job;
mod options;
pub mod pool;
mod registry;

pub use self::discovery::{
    Announcement, Announcer, DiscoveryStats, WorkerDiscovery, WorkerDiscoveryHandle,
    MAX_ANNOUNCED_WORKERS,
};
pub use self::handle::WorkPullingHandle;
pub use self::job::Job;
pub use self::options::{WorkPullingOptions, WorkPullingOptionsBuilder};
pub use self::pool::{PoolStats, WorkerStats};
pub use self::registry::{RegisterError, WorkerRegistry, MAX_WORKER_NAME};
