//! Work pulling: one reliable producer feeding a changing pool of workers; nothing is lost
//! when a worker leaves or dies, and with persistent workers nothing is done twice.
//!
//! ```text
//!  your code            producer (plain or durable)     pool                      workers
//!  tell / send / store ─▶ numbers jobs, window, ──job──▶ least in flight ──stream──▶ Job<T>
//!                         queue, confirmations           re-routes jobs  ◀──ACK───  handler
//!  confirm(Ok) ◀──────── ACK ◀─────────────────────────── on the worker's confirmation
//!  confirm(Err) ◀─────── given up ◀─────────────────────── after give_up_after failures
//! ```
//!
//! [`ReliableDelivery::work_pulling_producer`](crate::ReliableDelivery::work_pulling_producer)
//! starts a producer (exactly a [`ProducerHandle`](crate::ProducerHandle): `tell`, `send`,
//! `store`, confirmations) whose consumer is a pool. Workers are consumers of [`Job<T>`]
//! registered in a [`WorkerRegistry`]; the pool opens one reliable stream per worker (the
//! point-to-point protocol's producer core, driven inside the pool's actor: retransmission,
//! dedup and flow control are the point-to-point ones, over any transport, and a job crosses no
//! mailbox between the pool and its worker).
//!
//! # Rules
//!
//! - **Demand.** A job goes to a worker whose stream has free window (`window_size` of the worker
//!   settings; less for a failing worker, see below), the one holding the fewest jobs, ties at
//!   random; a slow worker holds its window longer and so gets fewer jobs. With no demand anywhere,
//!   jobs wait in the pool (up to the producer's `window_size`), then in the producer
//!   (`max_pending`): `tell` refuses and `send` waits.
//! - **Confirmation.** A job is confirmed to its sender once, when the first worker's stream
//!   confirmed it (the worker's handler succeeded).
//! - **Failures move a job on.** A job fails at a worker when the worker's stream gives it up
//!   (`max_attempts` of the worker settings: by default 6 transmissions in 31.5 s, see
//!   [`WorkPullingOptions::default_worker`]): its handler kept failing, or it was not confirmed in
//!   time. It then goes to another worker, **at the front** of the waiting jobs, and the worker
//!   **rests**: no new job for 1 s, doubling with each failure before its next confirmation up to
//!   60 s, then one job at a time until it confirms one ([`pool`] has the rules; [`PoolStats`]
//!   counts `failed`, `rests`, and per worker `failing`). Healthy workers get the jobs meanwhile. A
//!   failing worker stays in the pool with its stream while it is registered (for remote workers,
//!   the [`WorkerDiscovery`] decides when one is gone).
//! - **Giving up.** By default a job is never given up: it is routed again until a worker confirms
//!   it or the producer stops. With [`give_up_after(n)`](WorkPullingOptionsBuilder::give_up_after),
//!   a job that failed `n` times in all is settled
//!   [`DeliveryError::HandlingFailed`](crate::DeliveryError::HandlingFailed) with its sender,
//!   handed to the [`dead_letters`](WorkPullingOptionsBuilder::dead_letters) sink as a
//!   [`GivenUpJob`] (body, stable id, attempts, last failure) and never sent to a worker again.
//! - **Workers leave.** When a worker is deregistered or its consumer stops, the worker leaves: its
//!   stream sends nothing more and its unconfirmed jobs are routed to the others, **in their
//!   original order, at the front** of the waiting jobs (they did not fail: nothing counts against
//!   them). For one `resend_timeout` the stream still takes the ACKs on their way: a job the
//!   worker finished after it left is confirmed by that ACK, wherever it was routed since. A job
//!   can so be handled by two workers (the first may have handled it and lost the ACK, or still
//!   run it when its stream gave it up): at least once.
//! - **Stable job ids.** Every job carries [`Job::info`]: the producer's id, the public id of the
//!   worker streams' token (derived from the producer's incarnation) and the job's seq, the same at
//!   every worker it is routed to and, with a durable producer, across the producer's restarts. A
//!   persistent worker records it as the processed mark, so a job that one entity processed is
//!   answered "already processed" when it reaches that entity again, through any worker: a worker's
//!   death never doubles an effect. Two handlers do this:
//!   [`PersistentHandle::job_handler`](crate::persistence::PersistentHandle::job_handler), for
//!   workers that apply jobs to one entity (on a journal they share), and
//!   [`EntityHostHandle::job_handler`](crate::sharding::EntityHostHandle::job_handler), for jobs
//!   into sharded entities: each job names its entity (an account, a customer), which the host
//!   starts on demand (`examples/work_pulling.rs`). The dedup is the entity's: a job that goes to
//!   different entities on different attempts is processed by each, so route a job to its entity by
//!   its content. Both refuse a job whose id is not the sending stream's own (a dead letter):
//!   knowing a producer's public ids grants nothing.
//! - **Order.** None across workers; each worker sees its jobs in the order they were routed to it
//!   (with an `ordered` consumer, strictly).
//! - **Durable.** [`ReliableDelivery::durable_work_pulling_producer`] stores each job before it is
//!   routed; after a crash, the restarted producer sends its unconfirmed jobs again, under their
//!   ids, and the pool routes them to the workers present (their failures start from 0). A given-up
//!   job is recorded settled, as a confirmed one is, before its sender hears of it: a restart does
//!   not send it again.
//!
//! [`ReliableDelivery::durable_work_pulling_producer`]:
//! crate::ReliableDelivery::durable_work_pulling_producer
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
mod given_up;
mod handle;
mod job;
mod options;
use actix_delivery_proto::work_pulling::pool;
mod registry;

pub use self::discovery::{
    Announcement, AnnouncerHandle, DiscoveryStats, WorkerDiscovery, WorkerDiscoveryHandle,
    MAX_ANNOUNCED_WORKERS,
};
pub use self::given_up::GivenUpJob;
pub use self::handle::WorkPullingHandle;
pub use self::job::Job;
pub use self::options::{WorkPullingOptions, WorkPullingOptionsBuilder};
pub use self::pool::{PoolStats, WorkerStats};
pub use self::registry::{RegisterError, WorkerRegistry, MAX_WORKER_NAME};
