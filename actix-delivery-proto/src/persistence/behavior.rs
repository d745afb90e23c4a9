//! What a user writes: an event-sourced entity as a pure decision and an event application.

use std::fmt::Display;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec::{self, CodecError, UpcastError, Written};
use crate::journal::tag::Tag;

/// An event-sourced entity: the type is its state; commands come in, a pure
/// [`decide`](Self::decide) turns a command and the current state into events (and a reply),
/// and [`apply`](Self::apply) folds each event into the state. A
/// `PersistentActor` runs it: it stores the events in a
/// journal before it replies, and recovers the state on start from the latest snapshot
/// (`Serialize`/`Deserialize` of the state) plus the events after it.
///
/// `decide` must be pure: it may run again for the same command (after a conflicting writer
/// was caught up with), and its effects count only through the events it returns. Side
/// effects go through what the actor offers after the commit (the reply), never into
/// `decide` itself.
///
/// ```
/// use actix_delivery_proto::persistence::behavior::{Decision, EventSourced};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Default, Serialize, Deserialize)]
/// struct Account {
///     balance: i64,
/// }
///
/// enum Command {
///     Deposit(i64),
///     Withdraw(i64),
/// }
///
/// #[derive(Serialize, Deserialize)]
/// enum Event {
///     Deposited(i64),
///     Withdrew(i64),
/// }
///
/// impl EventSourced for Account {
///     type Command = Command;
///     type Event = Event;
///     type Reply = i64; // the new balance
///     type Rejection = String;
///
///     fn decide(&self, command: &Command) -> Result<Decision<Self>, String> {
///         match *command {
///             Command::Deposit(n) => Ok(Decision::persist([Event::Deposited(n)], self.balance + n)),
///             Command::Withdraw(n) if n > self.balance => Err(format!("only {} left", self.balance)),
///             Command::Withdraw(n) => Ok(Decision::persist([Event::Withdrew(n)], self.balance - n)),
///         }
///     }
///
///     fn apply(&mut self, event: &Event) {
///         match *event {
///             Event::Deposited(n) => self.balance += n,
///             Event::Withdrew(n) => self.balance -= n,
///         }
///     }
/// }
/// # let account = Account::default();
/// # assert!(account.decide(&Command::Withdraw(1)).is_err());
/// # assert!(account.decide(&Command::Deposit(5)).is_ok());
/// ```
pub trait EventSourced: Default + Serialize + DeserializeOwned + 'static {
    /// What the entity is asked to do.
    type Command: Send + 'static;
    /// What it stores: each event is a fact that happened.
    type Event: Serialize + DeserializeOwned + 'static;
    /// What a command's caller gets back once the command's events are durable.
    type Reply: Send + 'static;
    /// Why a command was refused (nothing is stored).
    type Rejection: Display + Send + 'static;

    /// The pure decision: the events `command` causes in the current state, and the reply;
    /// or why it is refused.
    ///
    /// # Errors
    /// The rejection, if the command is refused (no events are stored).
    fn decide(&self, command: &Self::Command) -> Result<Decision<Self>, Self::Rejection>;

    /// Folds one event into the state. Called for each new event right after `decide`, and
    /// for each stored event during recovery: it must not fail.
    fn apply(&mut self, event: &Self::Event);

    /// The schema version of [`Event`](Self::Event) this code writes (default 1; entries
    /// written before versions were recorded are version 1). Raise it when a change of the
    /// event type cannot decode what the previous version wrote (a renamed field, a changed
    /// type, events split or removed), and read the older versions in
    /// [`upcast_events`](Self::upcast_events). A field added with `#[serde(default)]` needs
    /// no new version for entries written with the self-describing codec (the default);
    /// entries written in bincode (among them every entry of actix-delivery 0.1) need one,
    /// and an upcaster that decodes the old type and maps it.
    const EVENT_VERSION: u32 = 1;

    /// The schema version of the state this code writes in snapshots (default 1): as
    /// [`EVENT_VERSION`](Self::EVENT_VERSION), for [`upcast_state`](Self::upcast_state).
    const STATE_VERSION: u32 = 1;

    /// The names its events or its state were stored under before (default none): each
    /// entry and snapshot records the [`std::any::type_name`] of what it holds (`my_app::Event`,
    /// `my_app::Account`), and a stream of entries named otherwise is another application's:
    /// its recovery fails with
    /// [`JournalError::ForeignType`](crate::journal::error::JournalError::ForeignType), naming both
    /// names, instead of reading another application's data as this one's. When a type moves
    /// to another module or crate, or is renamed, list its former name here (say
    /// `&["orders::v1::Event", "orders::v1::Order"]`), and its stream reads on; the compiler's
    /// spelling of a name changing would be mended the same way. Entries written before names
    /// were recorded (actix-delivery 0.1) have none and are read.
    const FORMER_TYPE_NAMES: &'static [&'static str] = &[];

    /// Turns the events of one stored entry written at an older
    /// [`EVENT_VERSION`](Self::EVENT_VERSION) into today's events: an entry holds the events
    /// of one command, so decode them as `Vec<OldEvent>` with [`Written::decode`], then map,
    /// split (one old event into several) or drop (an event that no longer exists) them.
    /// Dispatch on [`Written::version`]; a chain of changes is one function that converts
    /// version 1 to 2 to 3. Called during recovery only, for entries of an older version;
    /// an entry of a newer version than this code's fails the recovery (fail-stop, naming
    /// stream, seq and versions), as does an error returned here.
    ///
    /// The default has no upcaster: an older entry fails the recovery with
    /// [`JournalError::Incompatible`](crate::journal::error::JournalError::Incompatible).
    ///
    /// # Errors
    /// Why the entry cannot be read: the recovery stops with it.
    fn upcast_events(old: Written<'_>) -> Result<Vec<Self::Event>, UpcastError> {
        Err(UpcastError::missing(&old, Self::EVENT_VERSION))
    }

    /// Turns a snapshot's state written at an older [`STATE_VERSION`](Self::STATE_VERSION)
    /// into today's state. The default has none: such a snapshot is skipped (with a warning)
    /// and the state rebuilt from all events, which works as long as the events it covers
    /// were not deleted (`delete_events_on_snapshot`). A snapshot of a newer version than
    /// this code's fails the recovery.
    ///
    /// # Errors
    /// Why the state cannot be read: the snapshot is then skipped as above.
    fn upcast_state(old: Written<'_>) -> Result<Self, UpcastError> {
        Err(UpcastError::missing(&old, Self::STATE_VERSION))
    }

    /// The tags `event` is filed under (default none), for the read side: a
    /// [`projection`](crate::projection) follows every entry of a tag across all entities.
    /// The journal entry of a command is filed under the tags of all of its events, in the
    /// same atomic append as the events; a projection of a tag then gets every event of such
    /// an entry (all events of the command), and ignores those it has no use for. Typically a
    /// constant per entity type (`vec![Tag::from_static("account")]`), or per kind of event.
    /// Entries written before their type had tags (or by an earlier version of this crate)
    /// have none.
    fn tags(event: &Self::Event) -> Vec<Tag> {
        let _ = event;
        Vec::new()
    }

    /// How big a snapshot of this state is, in events' worth (default 0). With
    /// `snapshot_every`, a snapshot is taken only once at least this many events came since the
    /// last one, so writing snapshots stays proportional to writing events even for a large
    /// state.
    fn snapshot_weight(&self) -> u64 {
        0
    }
}

/// The outcome of [`EventSourced::decide`]: the events to store, the deliveries to make, and
/// the reply to give once they are stored.
pub struct Decision<E: EventSourced> {
    pub(crate) events: Vec<E::Event>,
    pub(crate) reply: E::Reply,
    /// To a destination (by name): the encoded message.
    pub(crate) deliveries: Vec<(String, Result<Vec<u8>, CodecError>)>,
}

impl<E: EventSourced> Decision<E> {
    /// Store `events`, then reply `reply`.
    pub fn persist(events: impl IntoIterator<Item = E::Event>, reply: E::Reply) -> Self {
        Self {
            events: events.into_iter().collect(),
            reply,
            deliveries: Vec::new(),
        }
    }

    /// Store nothing, reply `reply` (still only after what was decided before is durable).
    pub fn reply(reply: E::Reply) -> Self {
        Self {
            events: Vec::new(),
            reply,
            deliveries: Vec::new(),
        }
    }

    /// Also delivers `message` to the destination named `to` (an outbox destination the actor
    /// was started with, see `Outbox`): reliably, at least once,
    /// and only if this decision is stored. The record of the delivery is stored in the same
    /// journal entry as the events, so a delivery exists if and only if its events exist; it is
    /// sent after the commit, and sent again after a recovery until its destination confirms
    /// it.
    pub fn deliver(mut self, to: &str, message: &impl Serialize) -> Self {
        self.deliveries
            .push((to.to_owned(), codec::encode(message)));
        self
    }
}

impl<E: EventSourced> std::fmt::Debug for Decision<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decision")
            .field("events", &self.events.len())
            .field("deliveries", &self.deliveries.len())
            .finish_non_exhaustive()
    }
}
