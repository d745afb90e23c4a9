//! At least once: the handler writes wherever it likes (a search index, a cache, another
//! service); the offset is stored in an [`OffsetStore`] after the handler succeeded, every
//! `commit_every` events or `commit_interval`. After a crash the events after the stored
//! offset are handled again: the handler must be idempotent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::future::LocalBoxFuture;

use crate::journal::{JournalId, Offset, Slices};
use crate::projection::core::Batch;
use crate::projection::envelope::{Envelope, EventDecoder};
use crate::projection::runner::{guarded, Failure, Key, Sink};
use crate::projection::{HandlerError, Projection, ProjectionHandle};
use crate::runtime::error_chain::ErrorChain;

/// What a handler of events returns: a future that borrows its events.
pub type HandlerFuture<'a> = LocalBoxFuture<'a, Result<(), HandlerError>>;

/// Where an at-least-once projection keeps its offset, per projection name and slices:
/// [`MemoryOffsetStore`], `SqliteReadModel` (feature `sqlite`, on by default), or
/// `PostgresReadModel` (feature `postgres`), or an application's own.
pub trait OffsetStore: 'static {
    /// The stored offset of `projection` over `slices`; [`Offset::START`] if none.
    ///
    /// # Errors
    /// Why it cannot be read: the projection waits and tries again.
    fn load<'a>(
        &'a mut self,
        projection: &'a str,
        slices: Slices,
    ) -> LocalBoxFuture<'a, Result<Offset, HandlerError>>;

    /// Stores `offset` as `projection`'s over `slices`; durable once it resolves `Ok`.
    ///
    /// # Errors
    /// Why it cannot be stored: the projection loads the offset again and goes on from there.
    fn save<'a>(
        &'a mut self,
        projection: &'a str,
        slices: Slices,
        offset: Offset,
    ) -> LocalBoxFuture<'a, Result<(), HandlerError>>;

    /// Records `journal` as the journal `projection` follows, unless the store records one
    /// already, and returns the one it records: the projection starts only if that is its
    /// journal's ([`Journal::journal_id`](crate::journal::Journal::journal_id)), so that
    /// offsets of one journal are never read after in another. Called at each start, before
    /// [`load`](Self::load), by a projection whose journal has an id.
    ///
    /// The default records nothing and returns `journal`: a store of its own checks nothing
    /// unless it implements this.
    ///
    /// # Errors
    /// Why it cannot be read or recorded: the projection waits and tries again.
    fn follow<'a>(
        &'a mut self,
        projection: &'a str,
        journal: &'a JournalId,
    ) -> LocalBoxFuture<'a, Result<JournalId, HandlerError>> {
        let _ = projection;
        Box::pin(async move { Ok(journal.clone()) })
    }
}

/// Offsets in memory (clones share them): for tests, and for projections that rebuild from
/// the start at every start.
#[derive(Clone, Debug, Default)]
pub struct MemoryOffsetStore {
    offsets: Arc<Mutex<HashMap<(String, Slices), Offset>>>,
    /// The journal each projection follows.
    journals: Arc<Mutex<HashMap<String, JournalId>>>,
}

impl MemoryOffsetStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The stored offset of `projection` over `slices`, if any.
    pub fn offset(&self, projection: &str, slices: Slices) -> Option<Offset> {
        self.offsets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(projection.to_owned(), slices))
            .copied()
    }
}

impl OffsetStore for MemoryOffsetStore {
    fn load<'a>(
        &'a mut self,
        projection: &'a str,
        slices: Slices,
    ) -> LocalBoxFuture<'a, Result<Offset, HandlerError>> {
        let offset = self.offset(projection, slices).unwrap_or(Offset::START);
        Box::pin(async move { Ok(offset) })
    }

    fn save<'a>(
        &'a mut self,
        projection: &'a str,
        slices: Slices,
        offset: Offset,
    ) -> LocalBoxFuture<'a, Result<(), HandlerError>> {
        self.offsets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((projection.to_owned(), slices), offset);
        Box::pin(async { Ok(()) })
    }

    fn follow<'a>(
        &'a mut self,
        projection: &'a str,
        journal: &'a JournalId,
    ) -> LocalBoxFuture<'a, Result<JournalId, HandlerError>> {
        let followed = self
            .journals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(projection.to_owned())
            .or_insert_with(|| journal.clone())
            .clone();
        Box::pin(async move { Ok(followed) })
    }
}

/// The handler and offset store of an at-least-once projection.
struct AtLeastOnce<S, F> {
    store: S,
    handler: F,
}

impl<Ev, S, F> Sink<Ev> for AtLeastOnce<S, F>
where
    Ev: 'static,
    S: OffsetStore,
    F: for<'a> FnMut(&'a [Envelope<Ev>]) -> HandlerFuture<'a> + 'static,
{
    fn offset_in_transaction(&self) -> bool {
        false
    }

    fn follow<'a>(
        &'a mut self,
        key: &'a Key,
        journal: &'a JournalId,
    ) -> LocalBoxFuture<'a, Result<JournalId, Failure>> {
        Box::pin(async move {
            self.store
                .follow(&key.name, journal)
                .await
                .map_err(|err| Failure::Store(ErrorChain(&*err).to_string()))
        })
    }

    fn load<'a>(&'a mut self, key: &'a Key) -> LocalBoxFuture<'a, Result<Offset, Failure>> {
        Box::pin(async move {
            self.store
                .load(&key.name, key.slices)
                .await
                .map_err(|err| Failure::Store(ErrorChain(&*err).to_string()))
        })
    }

    fn process<'a>(
        &'a mut self,
        _: &'a Key,
        _: Offset,
        batch: Batch<Ev>,
    ) -> LocalBoxFuture<'a, Result<(), Failure>> {
        Box::pin(async move {
            let handler = &mut self.handler;
            guarded(|| handler(batch.events()))
                .await?
                .map_err(|err| Failure::Handler(ErrorChain(&*err).to_string()))
        })
    }

    fn save<'a>(
        &'a mut self,
        key: &'a Key,
        _: Offset,
        offset: Offset,
    ) -> LocalBoxFuture<'a, Result<(), Failure>> {
        Box::pin(async move {
            self.store
                .save(&key.name, key.slices, offset)
                .await
                .map_err(|err| Failure::Store(ErrorChain(&*err).to_string()))
        })
    }
}

impl<D: EventDecoder> Projection<D> {
    /// Starts the projection at least once, on the current arbiter: `handler` gets each
    /// batch of events (write it as `|events| Box::pin(async move { … })`) and `store` keeps
    /// the offset, stored after the handler succeeded: every `commit_every` events, at the
    /// latest `commit_interval` after the first one not yet stored, and when stopped. After a
    /// crash the events after the stored offset are handled again, so the handler must be
    /// idempotent (or its sink tolerate repeats).
    ///
    /// # Panics
    /// Outside an Actix system.
    pub fn at_least_once<S, F>(self, store: S, handler: F) -> ProjectionHandle
    where
        S: OffsetStore,
        F: for<'a> FnMut(&'a [Envelope<D::Event>]) -> HandlerFuture<'a> + 'static,
    {
        self.start(AtLeastOnce { store, handler })
    }
}
