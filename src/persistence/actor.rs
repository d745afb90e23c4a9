//! The persistent actor: the Actix shell that carries out what its core asks for (journal
//! appends, recovery, snapshots) and delivers replies.

use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::delivery::message::{Acks, ReplyTo, SingleAck};
use crate::journal::{replay_all, Journal, JournalError, PersistenceId, Snapshot};
use crate::persistence::behavior::EventSourced;
use crate::persistence::config::PersistentConfig;
use crate::persistence::core::{
    Answer, Append, Command, Failure, PersistentCore, PersistentStats, Recovered, Recovery,
};
use crate::persistence::error::CommandError;
use crate::persistence::outbox::Outbox;
use crate::persistence::outbox_state::{OutboxState, Sent};
use crate::persistence::type_names::TypeNames;
use crate::protocol::envelope::{Ack, DeliveryInfo};
use crate::protocol::rate_limit::RateLimited;
use crate::runtime::after_drain::after_each_drain;
use crate::runtime::alarm::{self, Alarm};
use crate::runtime::error_chain::ErrorChain;
use crate::runtime::stop_signal::{StopSignal, SubscribeStopped};

/// A command for a [`PersistentActor`]: `addr.send(Execute::new(command)).await` resolves once
/// the command's events are durable (or with why not). [`PersistentHandle`](crate::persistence::PersistentHandle)
/// is the convenient way.
pub struct Execute<E: EventSourced> {
    /// The entity's command.
    pub command: E::Command,
    /// The delivery it came from: its processed mark is stored with the command's events, and
    /// a delivery processed before is answered [`Outcome::AlreadyProcessed`](crate::persistence::Outcome)
    /// without deciding.
    pub delivery: Option<DeliveryInfo>,
    /// With [`must_follow`](crate::persistence::PersistentConfig::must_follow): the seq of the
    /// delivery from the same producer that must be processed first (0 for none), when the
    /// producer's stream does not go to this entity alone; `None`: the previous seq.
    pub previous: Option<u64>,
}

impl<E: EventSourced> Execute<E> {
    /// A plain command.
    pub fn new(command: E::Command) -> Self {
        Self {
            command,
            delivery: None,
            previous: None,
        }
    }

    /// A command that came from the delivery `info`.
    pub fn delivered(info: DeliveryInfo, command: E::Command) -> Self {
        Self {
            command,
            delivery: Some(info),
            previous: None,
        }
    }

    /// A command that came from the delivery `info` of a producer whose previous delivery to
    /// this entity was seq `previous` (0: none). With must-follow, it is refused until that
    /// one is processed (or settled by the producer), so the producer's order to this entity
    /// holds even when its stream also carries deliveries to other entities (as a sharded
    /// producer's does).
    pub fn following(info: DeliveryInfo, previous: u64, command: E::Command) -> Self {
        Self {
            command,
            delivery: Some(info),
            previous: Some(previous),
        }
    }
}

impl<E: EventSourced> Message for Execute<E> {
    type Result = Answer<E>;
}

/// Stops a [`PersistentActor`] for good, after what it decided is stored.
#[derive(Clone, Copy, Debug, Message)]
#[rtype(result = "()")]
pub struct StopPersistent;

/// Sent when the last owning [`PersistentHandle`](crate::persistence::PersistentHandle) is
/// dropped: finish what was decided (and the outbox's deliveries), then stop for good.
#[derive(Clone, Copy, Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct HandlesDropped;

/// Asks a [`PersistentActor`] for its [`PersistentStats`].
#[derive(Clone, Copy, Debug, Message)]
#[rtype(result = "PersistentStats")]
pub struct GetPersistentStats;

type Responder<E> = oneshot::Sender<Answer<E>>;

/// Runs an [`EventSourced`] entity as an Actix actor over a [`Journal`] stream.
///
/// On start it recovers the state from the stream (latest snapshot, then later entries);
/// commands that arrive meanwhile wait (up to `max_recovery_buffer`). A command is decided at
/// once and its events applied, but its reply is held until they are committed; all commands
/// decided while one append is in flight are stored by the next append, so one actor commits
/// many commands per journal write (up to `max_pending_commands` wait for their commit; more
/// are refused [`CommandError::Overloaded`]).
///
/// **Fail-stop.** If an append fails, no command whose events were not committed is answered
/// `Ok`: every waiting command gets [`CommandError::Journal`] and the actor stops; under a
/// `Supervisor` it restarts and recovers, so its state is the durable truth again (a failed
/// recovery is retried after a growing delay, up to 10 s). A recovery that finds corrupt data
/// stops the actor for good (entries gone because another writer saved a newer snapshot
/// meanwhile are not corrupt: the recovery starts again from that snapshot).
///
/// **A second writer** of the same stream (an overlapping failover, a second node) makes an
/// append fail with a conflict: the actor then catches up from the journal and decides the same
/// commands again, so a delivery the other one processed is answered as already processed.
pub struct PersistentActor<E: EventSourced> {
    core: PersistentCore<E, Responder<E>>,
    journal: Arc<dyn Journal>,
    /// The names its entries and snapshots are written under, and those it reads.
    names: TypeNames,
    config: PersistentConfig,
    /// The core may have an append to start (checked after the mailbox drain).
    dirty: bool,
    /// Consecutive failed recoveries (for the retry delay).
    failed_recoveries: u32,
    /// Stopping for good once what was decided is stored.
    stop: StopSignal,
    /// Every owning handle was dropped: stop for good once idle and the outbox is settled.
    handles_dropped: bool,
    /// The outbox's lanes, one per destination.
    outbox: Outbox,
    /// Where the outbox's destinations send their ACKs (this actor).
    reply_to: Option<ReplyTo>,
    /// The lanes' retransmission timer.
    alarm: Alarm,
    /// Reading the journal's highest seq (deliveries stalled).
    checking_journal: bool,
    /// Failed snapshots, warned about at most once a minute.
    snapshot_warnings: RateLimited,
    #[cfg(feature = "metrics")]
    /// `None` for the crate's own logs (a durable producer's), which are no entities.
    meter: Option<crate::persistence::metrics::PersistentMeter>,
}

impl<E: EventSourced> PersistentActor<E> {
    /// An actor for stream `id` of `journal`; start it like any actor (or through
    /// [`PersistentHandle::start`](crate::persistence::PersistentHandle::start)).
    ///
    /// # Panics
    /// If `config` breaks a rule of [`PersistentConfig::validate`] (the handle's constructors
    /// check it and return the error instead).
    pub fn new(journal: Arc<dyn Journal>, id: PersistenceId, config: PersistentConfig) -> Self {
        Self::with_outbox(journal, id, config, Outbox::new())
    }

    /// An actor whose decisions may deliver to the destinations of `outbox`.
    ///
    /// # Panics
    /// As [`new`](Self::new), and if a lane's producer id (`<id>/<name>`) is too long.
    pub fn with_outbox(
        journal: Arc<dyn Journal>,
        id: PersistenceId,
        config: PersistentConfig,
        outbox: Outbox,
    ) -> Self {
        if let Err(error) = config.validate().and_then(|()| outbox.check(&id)) {
            panic!("{error}");
        }
        #[cfg(feature = "metrics")]
        let meter = Some(crate::persistence::metrics::PersistentMeter::new(
            config
                .metrics_label
                .as_deref()
                .unwrap_or(crate::telemetry::metrics::DEFAULT_LABEL),
        ));
        let names = TypeNames::of::<E>();
        Self {
            core: Self::core(id, &config, &outbox, &names),
            journal,
            names,
            config,
            dirty: false,
            failed_recoveries: 0,
            stop: StopSignal::default(),
            checking_journal: false,
            handles_dropped: false,
            outbox,
            reply_to: None,
            alarm: Alarm::default(),
            snapshot_warnings: RateLimited::default(),
            #[cfg(feature = "metrics")]
            meter,
        }
    }

    /// The same actor without metrics: for the crate's own logs (a durable producer's), whose
    /// owner exports what they hold.
    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    pub(crate) fn unmetered(self) -> Self {
        #[cfg(feature = "metrics")]
        return Self {
            meter: None,
            ..self
        };
        #[cfg(not(feature = "metrics"))]
        self
    }

    /// The actor announces its life on `stop` (what its handles subscribed to).
    pub(crate) fn with_stop_signal(mut self, stop: StopSignal) -> Self {
        self.stop = stop;
        self
    }

    /// The actor writes and reads its stream under `names` instead of `E`'s own type names
    /// (a durable producer's log: its message type's).
    pub(crate) fn with_type_names(mut self, names: TypeNames) -> Self {
        self.core = self.core.with_type_names(&names);
        self.names = names;
        self
    }

    fn core(
        id: PersistenceId,
        config: &PersistentConfig,
        outbox: &Outbox,
        names: &TypeNames,
    ) -> PersistentCore<E, Responder<E>> {
        PersistentCore::new(id, config.clone(), Instant::now())
            .with_type_names(names)
            .with_outbox(outbox.names(), crate::runtime::random::random_incarnation())
    }

    /// Restarts every lane from the recovered outbox: they send again what is unconfirmed.
    fn resume_lanes(&mut self, outbox: &OutboxState) {
        let id = self.core.persistence_id().clone();
        let Some(incarnation) = outbox.incarnation else {
            return; // nothing was ever delivered
        };
        for lane in &mut self.outbox.lanes {
            let state = outbox.lanes.get(lane.name()).cloned().unwrap_or_default();
            if let Err(error) = lane.resume(&id, incarnation, &state) {
                log::error!(
                    "stream `{id}`: outbox `{}` cannot resume: {error}",
                    lane.name()
                );
            }
        }
    }

    /// Sends committed deliveries through their lanes.
    fn send(&mut self, sent: Vec<Sent>) {
        let id = self.core.persistence_id().clone();
        let Some(incarnation) = self.core.outbox().incarnation else {
            return;
        };
        for delivery in sent {
            let lane = self
                .outbox
                .lanes
                .iter_mut()
                .find(|l| l.name() == delivery.destination);
            if let Some(lane) = lane
                && let Err(error) = lane.send(&id, incarnation, delivery.seq, &delivery.message)
            {
                log::error!("stream `{id}`: a delivery does not decode: {error}");
            }
        }
    }

    /// Transmits what the lanes have due, records their confirmations, and re-arms the timer.
    fn flush_lanes(&mut self, ctx: &mut Context<Self>) {
        let Some(reply_to) = &self.reply_to else {
            return;
        };
        let now = alarm::now();
        let mut settled = Vec::new();
        let mut stalled = 0;
        for lane in &mut self.outbox.lanes {
            stalled += lane.flush(now, reply_to, self.config.warn_after_attempts, &mut settled);
            for seq in settled.drain(..) {
                self.core.handle_confirmed(lane.name(), seq);
                self.dirty = true;
            }
            if let Some(state) = self.core.outbox().lanes.get(lane.name()) {
                lane.set_durably_confirmed_below(state.durably_confirmed_below());
            }
        }
        if stalled > 0 {
            self.check_journal(ctx);
        }
        let deadline = self
            .outbox
            .lanes
            .iter()
            .filter_map(|l| l.next_deadline())
            .min();
        self.alarm.arm(deadline, ctx, |act, ctx| {
            act.alarm.fired();
            let now = alarm::now();
            for lane in &mut act.outbox.lanes {
                lane.handle_timeout(now);
            }
            act.flush_lanes(ctx);
        });
    }

    /// Deliveries stall: perhaps another instance of the entity confirmed them (its
    /// destination then refuses these resends as stale, without an ACK). If the journal holds
    /// entries this actor has not seen, it catches up, as after a conflict.
    fn check_journal(&mut self, ctx: &mut Context<Self>) {
        if std::mem::replace(&mut self.checking_journal, true) {
            return;
        }
        let journal = self.journal.clone();
        let id = self.core.persistence_id().clone();
        let highest = async move { journal.highest_seq(&id).await };
        ctx.spawn(highest.into_actor(self).map(|highest, act, ctx| {
            act.checking_journal = false;
            match highest {
                Ok(highest) if act.core.catch_up_if_behind(highest) => {
                    log::info!(
                        "stream `{}`: outbox deliveries stall and another writer appended: \
                         catching up",
                        act.core.persistence_id()
                    );
                    act.stop_lanes();
                    act.start_recovery(ctx);
                }
                Ok(_) => {}
                Err(error) => log::warn!("{error} (checking for another writer)"),
            }
        }));
    }

    fn handle_acks<'a>(&mut self, acks: impl IntoIterator<Item = &'a Ack>) {
        for ack in acks {
            let lane = self
                .outbox
                .lanes
                .iter_mut()
                .find(|lane| lane.producer_id().is_some_and(|id| *id == ack.producer_id));
            if lane.is_some_and(|lane| lane.handle_ack(ack)) {
                self.dirty = true;
            }
        }
    }

    /// Records why the actor stops, for the handles' `stopped()` and `opened()`.
    fn record_failure(&mut self, error: &JournalError) {
        let reason = ErrorChain(error).to_string();
        self.stop.fail(crate::error::Failure::Error(reason));
    }

    fn stop_lanes(&mut self) {
        for lane in &mut self.outbox.lanes {
            lane.stop();
        }
    }

    fn answer(answers: Vec<(Responder<E>, Answer<E>)>) {
        for (responder, answer) in answers {
            let _ = responder.send(answer); // the caller may have stopped waiting
        }
    }

    /// Recovers the state from the journal (after a delay if recoveries failed before).
    fn start_recovery(&mut self, ctx: &mut Context<Self>) {
        let delay = match self.failed_recoveries {
            0 => Duration::ZERO,
            n => (Duration::from_millis(100) * 2u32.saturating_pow(n - 1))
                .min(Duration::from_secs(10)),
        };
        let journal = self.journal.clone();
        let id = self.core.persistence_id().clone();
        let config = self.config.clone();
        let names = self.names.clone();
        let recovery = async move {
            if !delay.is_zero() {
                actix::clock::sleep(delay).await;
            }
            let recovered = recover::<E>(&*journal, &id, &config, &names);
            #[cfg(feature = "tracing")]
            let recovered = tracing::Instrument::instrument(
                recovered,
                crate::telemetry::spans::recovery("persistent_entity", id.as_str()),
            );
            recovered.await
        };
        ctx.spawn(recovery.into_actor(self).map(|result, act, ctx| {
            match result {
                Ok(recovered) => {
                    act.failed_recoveries = 0;
                    act.stop.opened();
                    // From what is committed, before the waiting commands are decided: their
                    // deliveries go out only once they are committed too.
                    act.resume_lanes(recovered.outbox());
                    Self::answer(act.core.finish_recovery(recovered));
                    act.flush(ctx);
                }
                Err(error) => {
                    log::error!("{error}; the persistent actor stops");
                    act.failed_recoveries = act.failed_recoveries.saturating_add(1);
                    Self::answer(act.core.fail_recovery(&error));
                    act.record_failure(&error);
                    if matches!(
                        error,
                        JournalError::Corrupt { .. }
                            | JournalError::Incompatible { .. }
                            | JournalError::ForeignType { .. }
                            | JournalError::Schema { .. }
                    ) {
                        act.stop.make_final(); // retrying cannot help
                    }
                    ctx.stop();
                }
            }
        }));
    }

    /// Starts the next append if one is due, and stops once a requested stop can happen.
    fn flush(&mut self, ctx: &mut Context<Self>) {
        self.flush_lanes(ctx);
        if let Some(append) = self.core.poll_append() {
            self.start_append(append, ctx);
        }
        #[cfg(feature = "metrics")]
        if let Some(meter) = &mut self.meter {
            meter.publish(&self.core.stats());
        }
        if self.core.is_idle() && (self.stop.is_final() || self.is_abandoned()) {
            self.stop.make_final();
            ctx.stop();
        }
    }

    /// No owning handle is left, the state is recovered, and every delivery the outbox
    /// recorded is durably confirmed (or given up): nothing is left for the actor to do.
    fn is_abandoned(&self) -> bool {
        self.handles_dropped
            && self.core.is_ready()
            && self
                .core
                .outbox()
                .lanes
                .values()
                .all(|lane| lane.unconfirmed.is_empty() && lane.recording.is_empty())
    }

    fn start_append(
        &mut self,
        Append {
            first_seq,
            payloads,
            manifest,
            tags,
            snapshot_error,
        }: Append,
        ctx: &mut Context<Self>,
    ) {
        if let Some(error) = snapshot_error {
            self.warn_snapshot_failed("not taken", &error);
        }
        let journal = self.journal.clone();
        let id = self.core.persistence_id().clone();
        let append = async move {
            journal
                .append_tagged(&id, first_seq, payloads, manifest, tags)
                .await
        };
        ctx.spawn(
            append
                .into_actor(self)
                .map(|result, act, ctx| match result {
                    Ok(()) => {
                        let committed = act.core.handle_committed();
                        Self::answer(committed.answers);
                        act.send(committed.sent);
                        if let Some(snapshot) = committed.snapshot {
                            act.save_snapshot(snapshot, ctx);
                        }
                        act.flush(ctx);
                    }
                    Err(error) => match act.core.handle_append_failed(error.clone()) {
                        Failure::CatchUp => {
                            log::warn!("{error}; catching up and deciding again");
                            act.stop_lanes();
                            act.start_recovery(ctx);
                        }
                        Failure::Stopped(answers) => {
                            log::error!("{error}; the persistent actor stops");
                            Self::answer(answers);
                            act.record_failure(&error);
                            ctx.stop();
                        }
                    },
                }),
        );
    }

    /// Saves a snapshot, then deletes the events it covers if configured. A failure is only
    /// logged: the events are still there.
    fn save_snapshot(&self, snapshot: Snapshot, ctx: &mut Context<Self>) {
        let journal = self.journal.clone();
        let id = self.core.persistence_id().clone();
        let delete = self.config.delete_events_on_snapshot;
        ctx.spawn(
            async move {
                let seq = snapshot.seq;
                journal.save_snapshot(&id, snapshot).await?;
                if delete {
                    journal.delete_to(&id, seq).await?;
                }
                Ok::<(), JournalError>(())
            }
            .into_actor(self)
            .map(|result, act, _| {
                if let Err(error) = result {
                    act.core.handle_snapshot_failed();
                    act.warn_snapshot_failed("not saved", &error);
                }
            }),
        );
    }

    /// Warns of a failed snapshot, at most once a minute (with the count in between).
    fn warn_snapshot_failed(&mut self, what: &str, error: &dyn std::fmt::Display) {
        if let Some(failures) = self.snapshot_warnings.record(alarm::now(), 1) {
            log::warn!(
                "stream `{}`: snapshot {what}: {error} ({failures} failed snapshot(s) since the \
                 last warning); the next one is tried after another {} events",
                self.core.persistence_id(),
                self.config.snapshot_every.unwrap_or(0)
            );
        }
    }
}

/// How many times a recovery starts again from a newer snapshot when the entries after the
/// one it read went missing meanwhile (see [`recover`]).
const SNAPSHOT_RACE_RETRIES: u32 = 4;

/// Rebuilds the durable state of stream `id`: its latest snapshot (if one decodes), then every
/// later entry.
///
/// Another writer of the stream (the old instance of an overlapping failover, or this actor's
/// own snapshot saved before a catch-up) may save a newer snapshot and delete the entries it
/// covers while the recovery reads: the entries after the snapshot read are then gone. So when
/// the entries do not follow the snapshot, the snapshot is read again; if a newer one was
/// saved meanwhile, the recovery starts again from it (at most [`SNAPSHOT_RACE_RETRIES`]
/// times). Only a stream that is still inconsistent with its current snapshot is corrupt.
///
/// # Errors
/// The journal's errors; [`JournalError::Corrupt`] naming stream and seq for an entry that does
/// not decode or is missing.
pub(crate) async fn recover<E: EventSourced>(
    journal: &dyn Journal,
    id: &PersistenceId,
    config: &PersistentConfig,
    names: &TypeNames,
) -> Result<Recovered<E>, JournalError> {
    let mut snapshot = journal.load_snapshot(id).await?;
    let mut retries = 0;
    loop {
        let used = snapshot.as_ref().map(|s| s.seq);
        let error = match recover_from::<E>(journal, id, config, names, snapshot).await {
            Err(error @ JournalError::Corrupt { .. }) if retries < SNAPSHOT_RACE_RETRIES => error,
            result => return result,
        };
        let newer = journal.load_snapshot(id).await?;
        if newer.as_ref().map(|s| s.seq) <= used {
            return Err(error); // the same snapshot: the stream itself is inconsistent
        }
        log::info!(
            "stream `{id}`: recovery found {error}, but a newer snapshot (seq {}) was saved \
             meanwhile: recovering again from it",
            newer.as_ref().map_or(0, |s| s.seq)
        );
        retries += 1;
        snapshot = newer;
    }
}

/// One attempt of [`recover`]: from `snapshot`, every later entry up to the highest seq.
async fn recover_from<E: EventSourced>(
    journal: &dyn Journal,
    id: &PersistenceId,
    config: &PersistentConfig,
    names: &TypeNames,
    snapshot: Option<Snapshot>,
) -> Result<Recovered<E>, JournalError> {
    let mut recovery = Recovery::<E>::new(id.clone(), config, names.clone(), Instant::now());
    let from_seq = recovery.restore_snapshot(snapshot, config)?;
    let highest_seq = journal.highest_seq(id).await?;
    let mut replayed = 0u64;
    if from_seq <= highest_seq {
        replay_all(
            journal,
            id,
            from_seq,
            highest_seq,
            config.replay_page,
            |stored| {
                replayed += 1;
                recovery.apply(stored)
            },
        )
        .await?;
    }
    #[cfg(feature = "tracing")]
    tracing::Span::current().record("events", replayed);
    let _ = replayed;
    recovery.finish(highest_seq)
}

/// The durable state of stream `id` of `journal`, as a [`PersistentActor`] of `E` would
/// recover it (for tools, tests and read models).
///
/// # Errors
/// As for recovery: the journal's errors, [`JournalError::Corrupt`] naming stream and seq,
/// [`JournalError::ForeignType`] for a stream of another type.
pub async fn recover_state<E: EventSourced>(
    journal: &dyn Journal,
    id: &PersistenceId,
) -> Result<E, JournalError> {
    let config = PersistentConfig::default();
    let names = TypeNames::of::<E>();
    Ok(recover::<E>(journal, id, &config, &names).await?.state)
}

// The actor is never structurally pinned.
impl<E: EventSourced> Unpin for PersistentActor<E> {}

impl<E: EventSourced> Actor for PersistentActor<E> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if self.stop.is_final() {
            return; // inert: stopped for good under a Supervisor
        }
        let addr = ctx.address();
        self.reply_to = Some(ReplyTo::batching(
            addr.clone().recipient(),
            addr.recipient(),
        ));
        after_each_drain(ctx, |act, ctx, _| {
            if std::mem::take(&mut act.dirty) {
                act.flush(ctx);
            }
            Poll::Pending
        });
        self.start_recovery(ctx);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        Self::answer(self.core.stop());
        #[cfg(feature = "metrics")]
        if let Some(meter) = &mut self.meter {
            meter.publish(&self.core.stats());
        }
        self.stop_lanes();
        // Drop the self-reference so the actor can be freed.
        self.reply_to = None;
        self.stop.announce_if_final();
    }
}

impl<E: EventSourced> Supervised for PersistentActor<E> {
    fn restarting(&mut self, _: &mut Context<Self>) {
        self.stop.restarting();
        Self::answer(self.core.stop());
        self.stop_lanes();
        let id = self.core.persistence_id().clone();
        #[cfg(feature = "metrics")]
        if let Some(meter) = &mut self.meter {
            meter.publish(&self.core.stats());
        }
        self.core = Self::core(id, &self.config, &self.outbox, &self.names);
        #[cfg(feature = "metrics")]
        if let Some(meter) = &mut self.meter {
            meter.restarted();
        }
        self.dirty = false;
        self.alarm = Alarm::default();
    }
}

impl<E: EventSourced> PersistentActor<E> {
    /// Decides a command now, or queues it; `responder` gets the answer.
    fn execute(&mut self, execute: Execute<E>, responder: Responder<E>) {
        let command = Command {
            command: execute.command,
            delivery: execute.delivery,
            previous: execute.previous,
        };
        let now = if self.stop.is_final() {
            Some((responder, Err(CommandError::Stopped)))
        } else {
            self.core.handle_command(command, responder)
        };
        if let Some((responder, answer)) = now {
            let _ = responder.send(answer);
        }
        self.dirty = true;
    }
}

impl<E: EventSourced> Handler<Execute<E>> for PersistentActor<E> {
    type Result = ResponseFuture<Answer<E>>;

    fn handle(&mut self, execute: Execute<E>, _: &mut Context<Self>) -> Self::Result {
        let (responder, answer) = oneshot::channel();
        self.execute(execute, responder);
        Box::pin(async move { answer.await.unwrap_or(Err(CommandError::Stopped)) })
    }
}

/// A command queued by a [`PersistentHandle`](crate::persistence::PersistentHandle) when it
/// is asked (past the mailbox's capacity: `do_send`), answered through its own channel.
pub(crate) struct Ask<E: EventSourced> {
    pub(crate) execute: Execute<E>,
    pub(crate) responder: Responder<E>,
}

impl<E: EventSourced> Message for Ask<E> {
    type Result = ();
}

impl<E: EventSourced> Handler<Ask<E>> for PersistentActor<E> {
    type Result = ();

    fn handle(&mut self, ask: Ask<E>, _: &mut Context<Self>) {
        self.execute(ask.execute, ask.responder);
    }
}

impl<E: EventSourced> Handler<SingleAck> for PersistentActor<E> {
    type Result = ();

    fn handle(&mut self, SingleAck(ack): SingleAck, _: &mut Context<Self>) {
        self.handle_acks([&ack]);
    }
}

impl<E: EventSourced> Handler<Acks> for PersistentActor<E> {
    type Result = ();

    fn handle(&mut self, Acks(acks): Acks, _: &mut Context<Self>) {
        self.handle_acks(&acks);
    }
}

impl<E: EventSourced> Handler<StopPersistent> for PersistentActor<E> {
    type Result = ();

    fn handle(&mut self, _: StopPersistent, ctx: &mut Context<Self>) {
        if !self.stop.make_final() {
            return;
        }
        if !self.core.is_ready() {
            // Recovering: nothing is decided yet, so nothing is left to store; the commands
            // waiting for the recovery are answered `Stopped`.
            ctx.stop();
            return;
        }
        // The flush after this drain records the outbox's confirmations of this drain too,
        // and the actor stops once all of it is stored, or at the stop timeout.
        self.dirty = true;
        ctx.run_later(self.config.stop_timeout, |act, ctx| {
            if !act.core.is_idle() {
                log::warn!(
                    "stream `{}`: the journal did not answer within the stop timeout ({:?}); \
                     the commands it did not answer are in doubt",
                    act.core.persistence_id(),
                    act.config.stop_timeout
                );
            }
            ctx.stop();
        });
    }
}

impl<E: EventSourced> Handler<HandlesDropped> for PersistentActor<E> {
    type Result = ();

    fn handle(&mut self, _: HandlesDropped, _: &mut Context<Self>) {
        self.handles_dropped = true;
        self.dirty = true; // the flush after this drain stops the actor if it is idle
    }
}

impl<E: EventSourced> Handler<GetPersistentStats> for PersistentActor<E> {
    type Result = MessageResult<GetPersistentStats>;

    fn handle(&mut self, _: GetPersistentStats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.core.stats())
    }
}

impl<E: EventSourced> Handler<SubscribeStopped> for PersistentActor<E> {
    type Result = MessageResult<SubscribeStopped>;

    fn handle(&mut self, _: SubscribeStopped, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stop.subscribe())
    }
}
