//! The application's side of a persistent actor, and the effectively-once consumer built on it.

use std::future::Future;
use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::{oneshot, watch};

use crate::delivery::handler::DeliveryHandler;
use crate::error::{Failure, OptionsError, StartError};
use crate::journal::{Journal, PersistenceId};
use crate::persistence::actor::{
    Ask, Execute, GetPersistentStats, HandlesDropped, PersistentActor, StopPersistent,
};
use crate::persistence::behavior::EventSourced;
use crate::persistence::config::PersistentConfig;
use crate::persistence::core::{Outcome, PersistentStats};
use crate::persistence::error::CommandError;
use crate::persistence::options::PersistentOptions;
use crate::persistence::type_names::TypeNames;
use crate::protocol::envelope::DeliveryInfo;
use crate::runtime::shutdown::{once_stopped_or, GracefulStop, StopFuture};
use crate::runtime::stop_signal::{wait_for_stop, wait_opened, Life, StopSignal, SubscribeStopped};

/// The application's side of a [`PersistentActor`]: ask it commands, stop it. Cheap to clone.
///
/// **The handles own the actor.** The handle [`start`](Self::start) returns, and every clone of it,
/// keep the actor running; so do the clones inside [`delivery_handler`](Self::delivery_handler)s
/// (an entity lives as long as a consumer feeding it) and an [`ask`](Self::ask) whose answer is
/// still awaited. When the last one is dropped, the actor finishes what it decided (commits,
/// replies) and, with an outbox, delivers until every recorded delivery is confirmed (or given up,
/// `max_attempts`); then it stops for good and releases its journal (under a `Supervisor`, once no
/// address to it is left either). [`stop`](Self::stop) stops it earlier. The actor's
/// [`addr`](Self::addr) does not keep it running, and a handle made with [`new`](Self::new) does
/// not own the actor it is given.
///
/// ```
/// use std::sync::Arc;
/// use actix_delivery::journal::{MemoryJournal, PersistenceId};
/// use actix_delivery::persistence::{Decision, EventSourced, PersistentHandle, PersistentOptions};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Default, Serialize, Deserialize)]
/// struct Counter(u64);
///
/// #[derive(Serialize, Deserialize)]
/// struct Added(u64);
///
/// impl EventSourced for Counter {
///     type Command = u64; // add this much
///     type Event = Added;
///     type Reply = u64; // the new total
///     type Rejection = String;
///
///     fn decide(&self, add: &u64) -> Result<Decision<Self>, String> {
///         let total = self.0.checked_add(*add).ok_or("overflow")?;
///         Ok(Decision::persist([Added(*add)], total))
///     }
///
///     fn apply(&mut self, Added(add): &Added) {
///         self.0 += add;
///     }
/// }
///
/// # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let journal = Arc::new(MemoryJournal::new());
/// let id = PersistenceId::new("counter-1")?;
/// let counter = PersistentHandle::<Counter>::start(PersistentOptions::new(journal.clone(), id.clone()))?;
/// assert_eq!(counter.ask(5).await?, 5); // resolves once `Added(5)` is committed
/// counter.stop();
/// counter.stopped().await?;
///
/// // A new start recovers the state from the journal.
/// let counter = PersistentHandle::<Counter>::start(PersistentOptions::new(journal, id))?;
/// assert_eq!(counter.ask(2).await?, 7);
/// # Ok(()) }
/// ```
pub struct PersistentHandle<E: EventSourced> {
    shared: Arc<Shared<E>>,
}

/// What the clones of one handle share; dropping the last one lets an owned actor stop.
struct Shared<E: EventSourced> {
    addr: Addr<PersistentActor<E>>,
    owns: bool,
    /// The actor's life, subscribed to before it started (`None` for a handle made from a
    /// bare address).
    life: Option<watch::Receiver<Life>>,
}

impl<E: EventSourced> Drop for Shared<E> {
    fn drop(&mut self) {
        if self.owns {
            self.addr.do_send(HandlesDropped);
        }
    }
}

impl<E: EventSourced> Clone for PersistentHandle<E> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<E: EventSourced> PersistentHandle<E> {
    /// Starts the entity `options` name where they place it; it recovers its state first.
    ///
    /// # Errors
    /// [`OptionsError`] if the settings are invalid, a lane's producer id (`<id>/<name>`) of
    /// the outbox is longer than 256 bytes, or `E`'s event or snapshot version is 0.
    pub fn start(options: PersistentOptions) -> Result<Self, OptionsError> {
        let PersistentOptions {
            journal,
            id,
            config,
            outbox,
            placement,
        } = options;
        config.validate()?;
        check_versions::<E>()?;
        if let Some(outbox) = &outbox {
            outbox.check(&id)?;
        }
        let (signal, life) = signal();
        let addr = placement.start(move || {
            match outbox {
                Some(outbox) => PersistentActor::with_outbox(journal, id, config, outbox),
                None => PersistentActor::new(journal, id, config),
            }
            .with_stop_signal(signal)
        });
        Ok(Self::owning(addr, life))
    }

    /// A log of the crate's own (a durable producer's): its stream written and read under
    /// `names` (its owner's types) instead of `E`'s, and no entity of the application's in
    /// the metrics (its owner exports what it holds).
    pub(crate) fn start_log(
        journal: Arc<dyn Journal>,
        id: PersistenceId,
        config: PersistentConfig,
        names: TypeNames,
    ) -> Result<Self, OptionsError> {
        config.validate()?;
        check_versions::<E>()?;
        let (signal, life) = signal();
        let addr = PersistentActor::new(journal, id, config)
            .with_type_names(names)
            .unmetered()
            .with_stop_signal(signal)
            .start();
        Ok(Self::owning(addr, life))
    }

    /// A handle for an actor started elsewhere. It does not own the actor: dropping it
    /// leaves the actor running (stop it with [`stop`](Self::stop)).
    pub fn new(addr: Addr<PersistentActor<E>>) -> Self {
        Self {
            shared: Arc::new(Shared {
                addr,
                owns: false,
                life: None,
            }),
        }
    }

    fn owning(addr: Addr<PersistentActor<E>>, life: watch::Receiver<Life>) -> Self {
        Self {
            shared: Arc::new(Shared {
                addr,
                owns: true,
                life: Some(life),
            }),
        }
    }

    /// The actor's life: subscribed to at the start, or asked of the actor (`None` if it is
    /// gone: why it stopped is unknown then).
    fn life(&self) -> impl Future<Output = Option<watch::Receiver<Life>>> + 'static + use<E> {
        let known = self.shared.life.clone();
        let asked = known
            .is_none()
            .then(|| self.shared.addr.send(SubscribeStopped));
        async move {
            match asked {
                Some(asked) => asked.await.ok(), // none once the actor is gone
                None => known,
            }
        }
    }

    /// Sends a command; resolves with the reply once its events are durable. The command
    /// is queued when this is called; until the answer arrives, the future keeps the actor
    /// running like a handle.
    ///
    /// # Errors
    /// The [`CommandError`]: rejected, the journal failed, the actor stopped, …
    pub fn ask(
        &self,
        command: E::Command,
    ) -> impl Future<Output = Result<E::Reply, CommandError<E::Rejection>>> + 'static + use<E> {
        let answer = self.queue(Execute::new(command));
        async move {
            match answer.await? {
                Outcome::Done(reply) => Ok(reply),
                Outcome::AlreadyProcessed => {
                    unreachable!("only a command with a delivery can have been processed before")
                }
            }
        }
    }

    /// Sends a command that came from the delivery `info`. Resolves once its events and the
    /// delivery's processed mark are durable ([`Outcome::Done`]), or at once with
    /// [`Outcome::AlreadyProcessed`] (after what was decided before it is durable) if the
    /// delivery was processed before. Keeps the actor running like [`ask`](Self::ask).
    ///
    /// # Errors
    /// The [`CommandError`]; [`CommandError::Stale`] for a delivery its producer had settled.
    pub fn ask_delivered(
        &self,
        info: DeliveryInfo,
        command: E::Command,
    ) -> impl Future<Output = Result<Outcome<E::Reply>, CommandError<E::Rejection>>> + 'static + use<E>
    {
        self.queue(Execute::delivered(info, command))
    }

    /// Queues `execute` in the actor's mailbox now, whatever its capacity (so commands asked
    /// together share appends however late they are awaited); the future keeps the actor
    /// running until the answer arrives.
    pub(crate) fn queue(
        &self,
        execute: Execute<E>,
    ) -> impl Future<Output = Result<Outcome<E::Reply>, CommandError<E::Rejection>>> + 'static + use<E>
    {
        let (responder, answer) = oneshot::channel();
        self.shared.addr.do_send(Ask { execute, responder });
        let owner = self.shared.clone();
        async move {
            let answer = answer.await;
            drop(owner);
            answer.unwrap_or(Err(CommandError::Stopped))
        }
    }

    /// The handler of an **effectively-once consumer**: each new message becomes a command
    /// (`to_command`) carrying its delivery; the message is ACKed once the entity's reply says
    /// the command's events and the mark are durable, or that the delivery was processed
    /// before. A rejection or an error: no ACK, and the producer retransmits. The handler is
    /// [pipelined](DeliveryHandler::pipelined): commands reach the entity in delivery order
    /// without waiting for each other's commit, so they share journal writes.
    ///
    /// ```no_run
    /// # use actix_delivery::persistence::{EventSourced, PersistentHandle};
    /// # use actix_delivery::{ConsumerOptions, ReliableDelivery};
    /// # fn _demo<E: EventSourced>(entity: PersistentHandle<E>, to_command: fn(u64) -> E::Command) {
    /// let consumer = ReliableDelivery::consumer(
    ///     ConsumerOptions::builder(entity.delivery_handler(to_command)).build().unwrap(),
    /// );
    /// # drop(consumer);
    /// # }
    /// ```
    pub fn delivery_handler<T: 'static>(
        &self,
        mut to_command: impl FnMut(T) -> E::Command + 'static,
    ) -> DeliveryHandler<T> {
        let entity = self.clone();
        // Pipelined: the command is in the entity's mailbox (in delivery order) when the call
        // returns; the next message need not wait for this one's commit.
        DeliveryHandler::pipelined(move |info: DeliveryInfo, body: T| {
            let answer = entity.ask_delivered(info, to_command(body));
            async move { answer.await.map(drop) }
        })
    }

    /// Stops the actor for good once what it decided is stored and the confirmations its
    /// outbox received are recorded, waiting at most
    /// [`PersistentConfig::stop_timeout`] for the journal (a command whose append is unanswered
    /// then gets [`CommandError::InDoubt`]); commands sent afterwards get
    /// [`CommandError::Stopped`].
    pub fn stop(&self) {
        self.shared.addr.do_send(StopPersistent);
    }

    /// Resolves once the entity has recovered its state (at once if it did before), or has
    /// stopped for good before it could. Await it before serving: a stream the entity cannot
    /// read says why here, not only in the log.
    ///
    /// Under a `Supervisor`, a journal that cannot be reached is not a reason: the actor
    /// recovers again after a growing delay (up to 10 s), logging each failure, and this waits
    /// on (bound it with `tokio::time::timeout`); without one, the actor stops.
    ///
    /// # Errors
    /// [`StartError::Failed`] with why the recovery failed for good: the stream is corrupt,
    /// of a newer schema, or holds another type's entries (another application's stream, or a
    /// type renamed without its former name in
    /// [`EventSourced::FORMER_TYPE_NAMES`](crate::persistence::EventSourced::FORMER_TYPE_NAMES));
    /// without a `Supervisor`, the journal failed. [`StartError::Stopped`] if it was stopped
    /// before it recovered.
    pub fn opened(&self) -> impl Future<Output = Result<(), StartError>> + 'static + use<E> {
        // Does not keep the actor running.
        let life = self.life();
        async move {
            match life.await {
                Some(life) => wait_opened(life).await,
                None => Err(StartError::Failed(gone())),
            }
        }
    }

    /// Resolves once the actor has stopped for good.
    ///
    /// # Errors
    /// The [`Failure`] that stopped it, when it was not asked to stop (nor passivated, nor
    /// left by its handles): a recovery that failed for good (see [`opened`](Self::opened)),
    /// or, without a `Supervisor`, a journal failure.
    pub fn stopped(&self) -> impl Future<Output = Result<(), Failure>> + 'static + use<E> {
        // Does not keep the actor running: it may be waiting for exactly that.
        let life = self.life();
        async move {
            match life.await {
                Some(life) => wait_for_stop(life).await,
                None => Err(gone()),
            }
        }
    }

    /// The actor's counters.
    ///
    /// # Errors
    /// [`MailboxError`] if the actor has stopped.
    pub async fn stats(&self) -> Result<PersistentStats, MailboxError> {
        self.shared.addr.send(GetPersistentStats).await
    }

    /// The actor's address (it does not keep the actor running, see the type's docs).
    pub fn addr(&self) -> &Addr<PersistentActor<E>> {
        &self.shared.addr
    }
}

impl<E: EventSourced> std::fmt::Debug for PersistentHandle<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PersistentHandle").finish_non_exhaustive()
    }
}

/// A stop signal for an actor about to start, and its handles' subscription to it.
fn signal() -> (StopSignal, watch::Receiver<Life>) {
    let signal = StopSignal::default();
    let life = signal.subscribe();
    (signal, life)
}

/// What a handle made from a bare address knows of an actor that is gone.
fn gone() -> Failure {
    Failure::Error("the actor had stopped before this handle asked it how it ended".into())
}

/// Schema versions start at 1 (0 would make every stored entry "newer").
pub(crate) fn check_versions<E: EventSourced>() -> Result<(), OptionsError> {
    for (field, version) in [
        ("EVENT_VERSION", E::EVENT_VERSION),
        ("STATE_VERSION", E::STATE_VERSION),
    ] {
        if version == 0 {
            return Err(OptionsError::new(field, "versions start at 1 (got 0)"));
        }
    }
    Ok(())
}

impl<E: EventSourced> GracefulStop for PersistentHandle<E> {
    /// [`stop`](Self::stop), then [`stopped`](Self::stopped).
    fn stop_gracefully(&self) -> StopFuture {
        self.stop();
        once_stopped_or(self.stopped())
    }
}
