//! Where kept dead letters live: the [`DeadLetterStore`] trait, its error, and the memory
//! store. The SQLite and PostgreSQL stores keep them in their journal's database
//! (`journal::sqlite::dead_letters`, `journal::postgres::dead_letters`).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use crate::delivery::dead_letter_book::DeadLetterBook;
use crate::delivery::dead_letters::{
    DeadLetterCounts, DeadLetterFilter, DeadLetterLimits, DeadLetterPage, FieldError, Kept,
    NewDeadLetter, StoredDeadLetter,
};
use crate::error::{Happened, OptionsError};
use crate::runtime::random::random_bytes;

/// The future a [`DeadLetterStore`] operation returns.
pub type DeadLetterFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, DeadLetterError>> + Send + 'a>>;

/// A store of dead letters: bounded, one entry per source and key (see [`DeadLetterLimits`]).
/// Beyond its bounds, it drops the oldest entry a peer's input caused
/// ([`DeadLetterCause::is_peer_input`](crate::dead_letters::DeadLetterCause::is_peer_input));
/// when none is left, the body of a peer's letter just kept if only the bytes are over; then
/// the oldest entry; never the entry just kept ([`DeadLetterLimits`] says what that bounds).
/// Every write is reported done only once committed.
pub trait DeadLetterStore: Send + Sync + 'static {
    /// The store's id: stable for as long as its entries are (a durable store's is its
    /// journal's id, a memory store's is drawn when it is made). Replays are identified by it
    /// and an entry's id (see [`DeadLetters::replay`](crate::dead_letters::DeadLetters::replay)).
    fn store_id(&self) -> &str;

    /// The bounds it keeps to.
    fn limits(&self) -> &DeadLetterLimits;

    /// Keeps `letter` at `now_ms` (milliseconds since the Unix epoch): updates the entry of
    /// the same source and key, or adds one, then drops the oldest beyond the bounds.
    fn keep(&self, letter: NewDeadLetter, now_ms: u64) -> DeadLetterFuture<'_, Kept>;

    /// The page of entries `filter` matches, oldest first.
    fn list(&self, filter: DeadLetterFilter) -> DeadLetterFuture<'_, DeadLetterPage>;

    /// The entry `id`, if the store holds it.
    fn get(&self, id: u64) -> DeadLetterFuture<'_, Option<StoredDeadLetter>>;

    /// Removes the entry `id`; `false` if the store did not hold it.
    fn remove(&self, id: u64) -> DeadLetterFuture<'_, bool>;

    /// Notes a failed replay of `id` (its count, time and error); `false` if there is no such
    /// entry.
    fn replay_failed(&self, id: u64, error: String, now_ms: u64) -> DeadLetterFuture<'_, bool>;

    /// How many entries it holds, and their weight, by cause.
    fn counts(&self) -> DeadLetterFuture<'_, DeadLetterCounts>;
}

/// A dead-letter operation that failed, saying whether it happened.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeadLetterError {
    /// The store holds no entry of this id (never kept, dropped, replayed or deleted). Nothing
    /// changed.
    #[error("no dead letter {0}")]
    NotFound(u64),
    /// A request's field is invalid (an unknown cause, a malformed filter). Nothing changed.
    #[error("invalid {0}")]
    Invalid(#[from] FieldError),
    /// No replay route is registered for the entry's source
    /// ([`DeadLetters::on_replay`](crate::dead_letters::DeadLetters::on_replay)). Nothing
    /// changed.
    #[error("no replay route for source `{0}`")]
    NoRoute(String),
    /// The entry cannot be replayed as it is: its body was not kept, or does not decode as
    /// the type its route reads (the application no longer reads it). Nothing changed.
    #[error("dead letter {id} cannot be replayed: {reason}")]
    Unreplayable {
        /// The entry.
        id: u64,
        /// Why.
        reason: String,
    },
    /// A replay of this entry is already running (through this handle or a clone): this one
    /// did not start. Nothing changed.
    #[error("a replay of dead letter {0} is already running")]
    Busy(u64),
    /// The replay's route failed; the entry is kept (with the failure noted). `happened` is
    /// the route's word on the destination ([`RouteError`](crate::dead_letters::RouteError)):
    /// certainly did not apply it, or in doubt (a later replay is recognised if it did).
    #[error("the replay of dead letter {id} failed ({}): {reason}", destination(*.happened))]
    ReplayFailed {
        /// The entry.
        id: u64,
        /// The route's error, with its causes.
        reason: String,
        /// Whether the destination applied the message.
        happened: Happened,
    },
    /// The store failed. `happened` says whether the operation took effect.
    #[error("the dead-letter store failed ({}): {message}", describe(*.happened))]
    Storage {
        /// What the storage reported, with its causes.
        message: String,
        /// Whether the operation took effect.
        happened: Happened,
    },
}

impl DeadLetterError {
    /// Whether the operation took effect; of a failed replay, whether its destination applied
    /// the message.
    pub fn happened(&self) -> Happened {
        match self {
            Self::Storage { happened, .. } | Self::ReplayFailed { happened, .. } => *happened,
            _ => Happened::CertainlyNot,
        }
    }
}

/// What a failed replay's route said of its destination.
fn destination(happened: Happened) -> &'static str {
    match happened {
        Happened::CertainlyNot => "the destination did not apply it",
        _ => "the destination may or may not have applied it",
    }
}

fn describe(happened: Happened) -> &'static str {
    match happened {
        Happened::CertainlyNot => "it did not happen",
        Happened::InDoubt => "it may or may not have happened",
        Happened::FailedAfter => "it happened, then failed",
    }
}

/// Dead letters in this process's memory: gone when it stops. For tests, and for an
/// application without a journal that wants to see what it gave up.
#[derive(Clone)]
pub struct MemoryDeadLetters {
    id: Arc<str>,
    limits: DeadLetterLimits,
    book: Arc<Mutex<DeadLetterBook>>,
}

impl MemoryDeadLetters {
    /// An empty store within `limits`.
    ///
    /// # Errors
    /// An [`OptionsError`] naming the bound that is invalid.
    pub fn new(limits: DeadLetterLimits) -> Result<Self, OptionsError> {
        limits.validate()?;
        let id: String = random_bytes::<16>()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        Ok(Self {
            id: format!("memory-{id}").into(),
            book: Arc::new(Mutex::new(DeadLetterBook::new(limits.clone()))),
            limits,
        })
    }

    fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut DeadLetterBook) -> T,
    ) -> DeadLetterFuture<'_, T> {
        let result = f(&mut self.book.lock().unwrap_or_else(|e| e.into_inner()));
        Box::pin(std::future::ready(Ok(result)))
    }
}

impl DeadLetterStore for MemoryDeadLetters {
    fn store_id(&self) -> &str {
        &self.id
    }

    fn limits(&self) -> &DeadLetterLimits {
        &self.limits
    }

    fn keep(&self, letter: NewDeadLetter, now_ms: u64) -> DeadLetterFuture<'_, Kept> {
        self.with(|book| book.keep(letter, now_ms))
    }

    fn list(&self, filter: DeadLetterFilter) -> DeadLetterFuture<'_, DeadLetterPage> {
        self.with(|book| book.list(&filter))
    }

    fn get(&self, id: u64) -> DeadLetterFuture<'_, Option<StoredDeadLetter>> {
        self.with(|book| book.get(id).cloned())
    }

    fn remove(&self, id: u64) -> DeadLetterFuture<'_, bool> {
        self.with(|book| book.remove(id).is_some())
    }

    fn replay_failed(&self, id: u64, error: String, now_ms: u64) -> DeadLetterFuture<'_, bool> {
        self.with(|book| book.replay_failed(id, &error, now_ms))
    }

    fn counts(&self) -> DeadLetterFuture<'_, DeadLetterCounts> {
        self.with(|book| book.counts())
    }
}
