//! The entity host: persistent entities of one type, started on their first command, found by
//! id, passivated when idle or beyond the limit. The pure [`HostCore`] decides; this shell
//! starts and stops the [`PersistentActor`](crate::persistence::PersistentActor)s it names.

use std::fmt::Display;
use std::future::Future;
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::config::{ConsumerConfig, Limit};
use crate::delivery::consumer::start_consumer;
use crate::delivery::consumer::ConsumerHandle;
use crate::delivery::dead_letters::SourceKind;
use crate::delivery::handler::DeliveryHandler;
use crate::delivery::options::ConsumerOptions;
use crate::error::OptionsError;
use crate::journal::Journal;
use crate::persistence::{check_versions, CommandError, EventSourced, Execute, Outcome};
use crate::protocol::envelope::{DeadLetterReason, DeliveryInfo};
use crate::protocol::origin::check_origin;
use crate::runtime::alarm::{self, Alarm};
use crate::runtime::shutdown::{once_stopped, GracefulStop, StopFuture};
use crate::runtime::stop_signal::{wait_stopped, StopSignal, SubscribeStopped};
use crate::sharding::entity_id::{EntityId, ShardId};
use crate::sharding::envelope::EntityEnvelope;
use crate::sharding::host_core::{HostCore, HostStats, Refusal, Routing};
use crate::sharding::host_options::EntityHostOptions;
use crate::sharding::host_shell::{Held, HostShell, Inner, Rearm, StopHost, WaitGone};
use crate::work_pulling::Job;

/// Why a command sent to an [`EntityHostHandle`] got no reply of its own. `R` is the entity's
/// rejection type.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError<R: Display> {
    /// The entity's answer (rejected, the journal failed, …). A command that waited for a
    /// stopping instance of its entity while the entity's shard left the host is answered
    /// [`CommandError::Stopped`]: it was not run here.
    #[error(transparent)]
    Command(CommandError<R>),
    /// The entity's shard is not hosted here (the host stopped, or the shard moved to
    /// another node): nothing was run.
    #[error("shard {0} is not hosted here")]
    NotHosted(ShardId),
    /// `max_held_commands` commands wait for stopping instances already: nothing was run
    /// (retry soon).
    #[error("the entity host holds {held} commands for stopping entities, the most allowed")]
    Full {
        /// How many wait.
        held: usize,
    },
}

impl<R: Display> From<Refusal> for HostError<R> {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::NotHosted(shard) => Self::NotHosted(shard),
            Refusal::Full { held } => Self::Full { held },
        }
    }
}

/// Hosts the persistent entities of one [`EventSourced`] type over a journal: an entity's
/// instance (a [`PersistentActor`](crate::persistence::PersistentActor) of stream
/// `<type>|<id>`) starts on the entity's first command and recovers from the journal;
/// commands are routed to it by [`EntityId`]; an instance idle for `idle_timeout`, or the
/// least recently used idle one when `max_active_entities` run and another must start, is
/// passivated (stopped gracefully: its
/// journal writes finish first). A command that arrives while its entity's instance stops
/// waits and goes to the next instance, in order (bounded: `max_held_commands`); one that
/// arrives while the instance recovers waits in the instance (`max_recovery_buffer`). Cheap
/// to clone; the clones (and the handlers and consumers made from it) own the host: when the
/// last is dropped it stops its entities and ends.
///
/// ```
/// use std::sync::Arc;
/// use actix_delivery::journal::MemoryJournal;
/// use actix_delivery::persistence::{Decision, EventSourced};
/// use actix_delivery::sharding::{EntityHostHandle, EntityHostOptions, EntityId};
/// # #[derive(Default, serde::Serialize, serde::Deserialize)] struct Account { balance: u64 }
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Deposited(u64);
/// # impl EventSourced for Account {
/// #     type Command = u64; type Event = Deposited; type Reply = u64; type Rejection = String;
/// #     fn decide(&self, n: &u64) -> Result<Decision<Self>, String> {
/// #         Ok(Decision::persist([Deposited(*n)], self.balance + n)) }
/// #     fn apply(&mut self, Deposited(n): &Deposited) { self.balance += n; }
/// # }
///
/// # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let accounts = EntityHostHandle::<Account>::start(
///     Arc::new(MemoryJournal::new()),
///     EntityHostOptions::builder("account").build()?,
/// )?;
/// let alice: EntityId = "alice".parse()?;
/// assert_eq!(accounts.ask(alice.clone(), 5).await?, 5); // started, stored, answered
/// assert_eq!(accounts.ask(alice, 2).await?, 7);
/// assert_eq!(accounts.stats().activations, 1);
/// # Ok(()) }
/// ```
pub struct EntityHostHandle<E: EventSourced> {
    inner: Arc<Inner<E>>,
    owner: Arc<Owner<E>>,
}

/// Dropping the last handle stops the host.
struct Owner<E: EventSourced>(Addr<HostShell<E>>);

impl<E: EventSourced> Drop for Owner<E> {
    fn drop(&mut self) {
        self.0.do_send(StopHost);
    }
}

impl<E: EventSourced> Clone for EntityHostHandle<E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            owner: self.owner.clone(),
        }
    }
}

impl<E: EventSourced> EntityHostHandle<E> {
    /// Starts a host of every shard of the type on the current arbiter.
    ///
    /// # Errors
    /// [`OptionsError`] if the entity type's versions are invalid (they start at 1).
    pub fn start(
        journal: Arc<dyn Journal>,
        options: EntityHostOptions,
    ) -> Result<Self, OptionsError> {
        Self::start_hosting(journal, options, true)
    }

    /// Starts a host of no shard yet (a coordinator gives it the shards it owns).
    pub(crate) fn start_hosting(
        journal: Arc<dyn Journal>,
        options: EntityHostOptions,
        all_shards: bool,
    ) -> Result<Self, OptionsError> {
        check_versions::<E>()?;
        let core = HostCore::new(options.config.limits());
        let core = if all_shards {
            core
        } else {
            core.with_no_shards()
        };
        let ctx = Context::<HostShell<E>>::new();
        let inner = Arc::new(Inner {
            core: Mutex::new(core),
            journal,
            arbiter: options.arbiter.clone().unwrap_or_else(Arbiter::current),
            options,
            shell: ctx.address().downgrade(),
        });
        let shell = HostShell {
            #[cfg(feature = "metrics")]
            meter: crate::sharding::metrics::EntityHostMeter::new(&inner.options.entity_type),
            inner: inner.clone(),
            alarm: Alarm::default(),
            gone: Vec::new(),
            stop: StopSignal::default(),
        };
        let addr = ctx.run(shell);
        Ok(Self {
            inner,
            owner: Arc::new(Owner(addr)),
        })
    }

    /// Sends `command` to entity `entity`; resolves with the reply once its events are durable.
    ///
    /// # Errors
    /// [`HostError`]: the entity's [`CommandError`], the shard is not hosted here, or too many
    /// commands wait for stopping entities.
    pub fn ask(
        &self,
        entity: EntityId,
        command: E::Command,
    ) -> impl Future<Output = Result<E::Reply, HostError<E::Rejection>>> + 'static + use<E> {
        let answer = self.execute(entity, Execute::new(command));
        async move {
            match answer.await? {
                Outcome::Done(reply) => Ok(reply),
                Outcome::AlreadyProcessed => {
                    unreachable!("only a command with a delivery can have been processed before")
                }
            }
        }
    }

    /// Sends `execute` (a command, perhaps with the delivery it came from) to entity
    /// `entity`: routed now (the entity's commands reach it in the order they were routed),
    /// answered as
    /// [`PersistentHandle::ask_delivered`](crate::persistence::PersistentHandle::ask_delivered)
    /// answers.
    ///
    /// # Errors
    /// As [`ask`](Self::ask).
    pub fn execute(
        &self,
        entity: EntityId,
        execute: Execute<E>,
    ) -> impl Future<Output = Result<Outcome<E::Reply>, HostError<E::Rejection>>> + 'static + use<E>
    {
        let (responder, answer) = oneshot::channel();
        let held = Held { execute, responder };
        let now = alarm::now();
        let mut core = self.inner.core();
        let mut started = false;
        let routed = match core.route(&entity, held, now, |e, g| self.inner.start(e, g)) {
            Routing::Run {
                instance,
                waiting,
                started: s,
            } => {
                // Under the lock: before any stop a passivation sends it.
                waiting.run_on(instance);
                started = s;
                Ok(Answered {
                    inner: self.inner.clone(),
                    entity,
                })
            }
            Routing::Held => Ok(Answered {
                inner: self.inner.clone(),
                entity,
            }),
            Routing::Refused(_, refusal) => Err(HostError::from(refusal)),
        };
        let due: Vec<_> = std::iter::from_fn(|| core.poll_passivation(now)).collect();
        drop(core);
        Inner::stop(due);
        if started {
            self.owner.0.do_send(Rearm);
        }
        async move {
            let answered = routed?;
            let answer = match answer.await {
                Ok(answer) => answer.map_err(HostError::Command),
                Err(_) => Err(HostError::Command(CommandError::Stopped)),
            };
            if let Ok(Outcome::AlreadyProcessed) = answer {
                answered.inner.core().note_already_processed();
            }
            answer
        }
    }

    /// The handler of an **effectively-once consumer** for the entities of this host: each
    /// message is an [`EntityEnvelope`] (what a sharded producer sends); its body becomes a
    /// command (`to_command`) for the entity it names, carrying the message's stable id at
    /// its producer as the delivery (the processed mark) and its predecessor to the same
    /// entity (for `must_follow`). The message is ACKed once the entity's reply says the
    /// command is durable, or that it was processed before; a message its producer declared
    /// settled that the entity did not process is stale (counted by the entity) and ACKed
    /// too. The handler is pipelined: messages reach their entities in delivery order without
    /// waiting for each other's commit.
    ///
    /// An envelope is a dead letter of the consumer (counted there and in [`HostStats`], sent
    /// to its dead-letter sink, never run nor ACKed) when its origin is out of range
    /// ([`HostStats::refused_malformed`]), or is not the sending stream's own
    /// ([`HostStats::refused_foreign`]: the delivery's token must have the origin's public
    /// incarnation id, see [`check_origin`](crate::protocol::origin::check_origin)): only the
    /// producer's own streams can name its origins, so no sender can move another producer's
    /// window at an entity, whatever it knows of that producer; or when its producer routes by
    /// another shard count than this host's ([`HostStats::refused_shard_count`]; the consumer's
    /// warning names both counts).
    pub fn delivery_handler<M: 'static>(
        &self,
        mut to_command: impl FnMut(M) -> E::Command + 'static,
    ) -> DeliveryHandler<EntityEnvelope<M>> {
        let host = self.clone();
        let handler = DeliveryHandler::pipelined(move |_, envelope: EntityEnvelope<M>| {
            let EntityEnvelope {
                entity_id,
                origin,
                previous,
                body,
                ..
            } = envelope;
            let execute = Execute::following(origin, previous, to_command(body));
            let answer = host.execute(entity_id, execute);
            async move {
                match answer.await {
                    Ok(_) | Err(HostError::Command(CommandError::Stale)) => Ok(()),
                    Err(error) => Err(error),
                }
            }
        });
        let inner = self.inner.clone();
        handler.admitting(move |carrier, envelope: &EntityEnvelope<M>| {
            if let Err(reason) = envelope.check() {
                inner.core().note_malformed();
                return Err(reason);
            }
            check_origin(carrier, &envelope.origin).inspect_err(|_| inner.core().note_foreign())?;
            let mut core = inner.core();
            let hosted = core.shards();
            match envelope.shards {
                sent if sent == 0 || sent == hosted => Ok(()),
                sent => {
                    core.note_shard_count_mismatch();
                    Err(DeadLetterReason::ShardCountMismatch { sent, hosted })
                }
            }
        })
    }

    /// The handler of an effectively-once **worker** of a work-pulling producer whose jobs go
    /// to this host's entities: `route` names each job's entity and turns its body into a
    /// command; the job's stable id ([`Job::info`](crate::work_pulling::Job)) is the
    /// command's delivery, so the entity records it as processed with its events. A job
    /// re-routed from a worker that died after the entity's commit (before its ACK left) is
    /// answered "already processed" by whichever worker on this host (or another host on the
    /// same journal) gets it: its events are stored once. Like
    /// [`PersistentHandle::job_handler`](crate::persistence::PersistentHandle::job_handler):
    /// a job below a processed job's `window_start` that its entity did not process was
    /// confirmed by a worker elsewhere and is ACKed without running; a job whose id is not
    /// the sending worker stream's own is a dead letter ([`HostStats::refused_foreign`]).
    /// Leave `must_follow` off: an entity sees only some of the jobs.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use actix_delivery::journal::MemoryJournal;
    /// # use actix_delivery::persistence::{Decision, EventSourced};
    /// # use actix_delivery::sharding::{EntityHostHandle, EntityHostOptions};
    /// # use actix_delivery::work_pulling::{WorkPullingOptions, WorkerRegistry};
    /// # use actix_delivery::{ConsumerOptions, ReliableDelivery};
    /// # #[derive(Default, serde::Serialize, serde::Deserialize)] struct Account { balance: u64 }
    /// # #[derive(serde::Serialize, serde::Deserialize)] struct Deposited(u64);
    /// # impl EventSourced for Account {
    /// #     type Command = u64; type Event = Deposited; type Reply = u64; type Rejection = String;
    /// #     fn decide(&self, n: &u64) -> Result<Decision<Self>, String> {
    /// #         Ok(Decision::persist([Deposited(*n)], self.balance + n)) }
    /// #     fn apply(&mut self, Deposited(n): &Deposited) { self.balance += n; }
    /// # }
    /// # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let accounts = EntityHostHandle::<Account>::start(
    ///     Arc::new(MemoryJournal::new()),
    ///     EntityHostOptions::builder("account").build()?,
    /// )?;
    /// let registry = WorkerRegistry::new();
    /// // A deposit job is (account, amount): each worker applies it to the account's entity.
    /// let worker = ReliableDelivery::consumer(
    ///     ConsumerOptions::builder(accounts.job_handler(|(account, amount): (String, u64)| {
    ///         (account.parse().expect("a valid id"), amount)
    ///     }))
    ///     .build()?,
    /// );
    /// registry.register_consumer("worker-1", &worker)?;
    /// let jobs = ReliableDelivery::work_pulling_producer(WorkPullingOptions::builder(&registry).build()?);
    /// jobs.send(("alice".to_string(), 5)).await?; // confirmed once alice stored it
    /// assert_eq!(accounts.ask("alice".parse()?, 0).await?, 5);
    /// # Ok(()) }
    /// ```
    pub fn job_handler<M: 'static>(
        &self,
        mut route: impl FnMut(M) -> (EntityId, E::Command) + 'static,
    ) -> DeliveryHandler<Job<M>> {
        let host = self.clone();
        let handler = DeliveryHandler::pipelined(move |_, job: Job<M>| {
            // A job is one message of its producer: its mark covers its seq alone.
            let info = DeliveryInfo {
                first_seq: None,
                ..job.info
            };
            let (entity, command) = route(job.body);
            let answer = host.execute(entity, Execute::delivered(info, command));
            async move {
                match answer.await {
                    Ok(_) | Err(HostError::Command(CommandError::Stale)) => Ok(()),
                    Err(error) => Err(error),
                }
            }
        });
        let inner = self.inner.clone();
        handler.admitting(move |carrier, job: &Job<M>| {
            check_origin(carrier, &job.info).inspect_err(|_| inner.core().note_foreign())
        })
    }

    /// A consumer whose handler is [`delivery_handler`](Self::delivery_handler), with the
    /// settings [`consumer_config`](Self::consumer_config) suggests: the host's one consumer,
    /// for a sharded producer to send to (in process, or exposed on a transport).
    pub fn consumer<M: Send + 'static>(
        &self,
        to_command: impl FnMut(M) -> E::Command + 'static,
    ) -> ConsumerHandle<EntityEnvelope<M>> {
        let mut options = ConsumerOptions::from_config(
            self.delivery_handler(to_command),
            Self::consumer_config(),
        )
        .expect("valid settings");
        if let Some((dead_letters, source)) = &self.inner.options.dead_letters {
            options.keep_dead_letters_as(
                dead_letters.clone(),
                SourceKind::EntityHost,
                source.clone(),
            );
        }
        start_consumer(options)
    }

    /// The settings of a host's consumer: the defaults, but 100 000 producer ids in its
    /// duplicate filter (a sharded producer opens one stream per entity, so a host's consumer
    /// sees one producer id per sending process and entity). A stream it forgets costs a
    /// duplicate handler run that the entity answers from its record.
    pub fn consumer_config() -> ConsumerConfig {
        ConsumerConfig {
            max_producers: Limit::At(100_000),
            ..ConsumerConfig::default()
        }
    }

    /// Hosts `shard` from now on.
    pub(crate) fn host_shard(&self, shard: ShardId) {
        self.inner.core().host(shard);
    }

    /// Stops hosting `shard`: its commands are refused from now on, its entities stop
    /// (gracefully); resolves once all of them have stopped.
    pub(crate) fn release_shard(
        &self,
        shard: ShardId,
    ) -> impl Future<Output = ()> + 'static + use<E> {
        let due = self.inner.core().unhost(shard);
        Inner::stop(due);
        self.inner.admit_waiting(); // refuses the shard's commands that waited for room
        let gone = self.owner.0.send(WaitGone(shard));
        async move {
            if let Ok(gone) = gone.await {
                let _ = gone.await;
            }
        }
    }

    /// The counters and gauges.
    pub fn stats(&self) -> HostStats {
        self.inner.core().stats()
    }

    /// The entity type.
    pub fn entity_type(&self) -> &str {
        &self.inner.options.entity_type
    }

    /// The type's shard count.
    pub fn shards(&self) -> u32 {
        self.inner.options.config.shards
    }

    /// Stops the host for good: every entity stops (gracefully: what it decided is stored
    /// first), and commands are refused from now on ([`HostError::NotHosted`]).
    pub fn stop(&self) {
        self.owner.0.do_send(StopHost);
    }

    /// Resolves once the host has stopped and each of its entities with it. A host opens nothing
    /// when it starts, so it has no `opened()` and stops only when asked to: each entity recovers
    /// on its first command, and one that cannot (a corrupt stream, another application's: see
    /// [`PersistentHandle::opened`](crate::persistence::PersistentHandle::opened)) answers that
    /// command [`CommandError::Recovery`] with why.
    pub fn stopped(&self) -> impl Future<Output = ()> + 'static + use<E> {
        wait_stopped(self.owner.0.send(SubscribeStopped))
    }
}

impl<E: EventSourced> std::fmt::Debug for EntityHostHandle<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntityHostHandle")
            .field("entity_type", &self.inner.options.entity_type)
            .finish_non_exhaustive()
    }
}

/// Reports a command answered (or given up by its caller) when dropped.
struct Answered<E: EventSourced> {
    inner: Arc<Inner<E>>,
    entity: EntityId,
}

impl<E: EventSourced> Drop for Answered<E> {
    fn drop(&mut self) {
        let mut core = self.inner.core();
        core.handle_answered(&self.entity);
        let awaiting = core.is_awaiting_room();
        drop(core);
        // Its entity may be idle now: room for an entity that waits.
        if awaiting
            && self.inner.admit_waiting()
            && let Some(shell) = self.inner.shell.upgrade()
        {
            shell.do_send(Rearm);
        }
    }
}

impl<E: EventSourced> GracefulStop for EntityHostHandle<E> {
    /// [`stop`](Self::stop), then [`stopped`](Self::stopped).
    fn stop_gracefully(&self) -> StopFuture {
        self.stop();
        once_stopped(self.stopped())
    }
}
