//! [`DeadLetters`]: the handle parts are given to keep what they give up or refuse, and that
//! the console and the application list, replay and delete entries through.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::codec::{Codec, Manifest, MAX_ENCODED_BYTES};
use crate::delivery::dead_letter_sampler::FloodSampler;
use crate::delivery::dead_letter_store::{DeadLetterError, DeadLetterStore};
use crate::delivery::dead_letters::{
    delivery_key, DeadLetterCause, DeadLetterCounts, DeadLetterFilter, DeadLetterPage, Kept,
    NewDeadLetter, SourceKind, StoredDeadLetter,
};
use crate::error::Happened;
use crate::protocol::envelope::{DeliveryInfo, IncarnationId, ProducerId};

/// What a replay route reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replayed {
    /// The message was applied by this replay.
    Applied,
    /// The destination recognised the replay's id as applied before (an earlier replay that
    /// ended before its entry was removed): nothing was applied again.
    AlreadyApplied,
}

/// A dead letter handed to a replay route: the entry, and the stable delivery id the replay
/// goes under.
#[derive(Clone, Debug)]
pub struct Replay<T> {
    /// The entry's body, decoded (of a route registered with
    /// [`on_replay`](DeadLetters::on_replay): the body's stored bytes).
    pub body: T,
    /// The replay's delivery id ([`DeadLetters::replay_info`]): producer
    /// `dead-letters/<source>/<hash>`, an incarnation derived from the store's id, seq the
    /// entry's id, window start the oldest id the store still holds (every id below is gone
    /// for good: the destination may forget them). Every replay of the entry carries the same
    /// id, so an effectively-once destination
    /// ([`PersistentHandle::ask_delivered`](crate::persistence::PersistentHandle::ask_delivered))
    /// applies it once, however often it is replayed.
    pub info: DeliveryInfo,
    /// The entry (its body left empty: it is in `body`).
    pub entry: StoredDeadLetter,
}

/// Why a replay route failed, and whether the destination may have applied the message.
///
/// A `String` or `&str` converts to an error [in doubt](RouteError::in_doubt) (`?` and
/// `.into()` make one); a route that knows its destination refused the message before
/// applying it (a rejection, a validation error) says so with
/// [`certainly_not`](RouteError::certainly_not), and the replay's error says so in turn.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct RouteError {
    reason: String,
    happened: Happened,
}

impl RouteError {
    /// The error, with its causes.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Whether the destination applied the message: [`Happened::CertainlyNot`] or
    /// [`Happened::InDoubt`].
    pub fn happened(&self) -> Happened {
        self.happened
    }

    /// The route failed and the destination may or may not have applied the message (a lost
    /// answer, a timeout, a storage error).
    pub fn in_doubt(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            happened: Happened::InDoubt,
        }
    }

    /// The destination certainly did not apply the message (it refused it before applying).
    pub fn certainly_not(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            happened: Happened::CertainlyNot,
        }
    }
}

impl From<String> for RouteError {
    fn from(reason: String) -> Self {
        Self::in_doubt(reason)
    }
}

impl From<&str> for RouteError {
    fn from(reason: &str) -> Self {
        Self::in_doubt(reason)
    }
}

/// The future a replay route returns: what became of the replay, or why it failed.
pub type ReplayFuture = Pin<Box<dyn Future<Output = Result<Replayed, RouteError>> + 'static>>;

type Route = Arc<dyn Fn(Replay<Vec<u8>>) -> Result<ReplayFuture, String> + Send + Sync>;

/// What a [`DeadLetters`] handle did since it was made (shared by its clones).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetterStats {
    /// Letters kept (added or updated).
    pub kept: u64,
    /// Entries dropped to stay within the bounds.
    pub evicted: u64,
    /// Letters of a flood counted but not kept (see
    /// [`DeadLetterLimits::sample_burst`](crate::dead_letters::DeadLetterLimits::sample_burst)).
    pub sampled_out: u64,
    /// Letters the store failed to keep (each logged).
    pub keep_failures: u64,
    /// Entries replayed and removed (applied or recognised as applied before).
    pub replayed: u64,
    /// Of those, replays the destination recognised as applied before.
    pub already_applied: u64,
    /// Replays whose route failed (the entries are kept).
    pub replay_failures: u64,
}

#[derive(Default)]
struct Counters {
    kept: AtomicU64,
    evicted: AtomicU64,
    sampled_out: AtomicU64,
    keep_failures: AtomicU64,
    replayed: AtomicU64,
    already_applied: AtomicU64,
    replay_failures: AtomicU64,
}

/// Kept dead letters: a [`DeadLetterStore`] with the sampling of floods, the counts of what
/// was kept, and the replay routes. Cheap to clone; give a clone to each part that gives
/// messages up or refuses them, and to the console.
#[derive(Clone)]
pub struct DeadLetters {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn DeadLetterStore>,
    sampler: Mutex<FloodSampler>,
    counters: Counters,
    routes: RwLock<HashMap<String, Route>>,
    /// Keeps [`record`](DeadLetters::record) spawned that have not finished.
    recording: AtomicU64,
    /// The entries being replayed.
    replaying: Mutex<HashSet<u64>>,
}

/// The most keeps [`DeadLetters::record`] has running at once: beyond (a store that is slow or
/// down while parts keep giving up), a letter is counted as a keep failure, not queued, so
/// memory stays bounded.
pub const MAX_RECORDING: u64 = 1024;

impl fmt::Debug for DeadLetters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetters")
            .field("store", &self.inner.store.store_id())
            .field("stats", &self.stats())
            .finish()
    }
}

impl DeadLetters {
    /// Kept in `store`.
    pub fn new(store: impl DeadLetterStore) -> Self {
        let sampler = FloodSampler::new(store.limits());
        Self {
            inner: Arc::new(Inner {
                store: Arc::new(store),
                sampler: Mutex::new(sampler),
                counters: Counters::default(),
                routes: RwLock::new(HashMap::new()),
                recording: AtomicU64::new(0),
                replaying: Mutex::new(HashSet::new()),
            }),
        }
    }

    /// The store.
    pub fn store(&self) -> &dyn DeadLetterStore {
        &*self.inner.store
    }

    /// Keeps `letter` in the background: a part that gives a message up does not wait for
    /// the store. A letter of a flood beyond the sampling bound is counted, not kept; so is one
    /// that finds [`MAX_RECORDING`] keeps still running (its body is cut to the store's
    /// `max_body_bytes` before it waits); a failure to keep one is logged and counted. Needs a
    /// Tokio runtime (any Actix arbiter).
    pub fn record(&self, letter: NewDeadLetter) {
        if self.admit(&letter.source, letter.cause) {
            self.spawn_keep(letter);
        }
    }

    /// [`record`](Self::record), making the letter only once the sampler admitted it: the
    /// letters of a flood beyond the bound cost no copy of their bodies.
    pub(crate) fn record_with(
        &self,
        source: &str,
        cause: DeadLetterCause,
        letter: impl FnOnce() -> NewDeadLetter,
    ) {
        if self.admit(source, cause) {
            self.spawn_keep(letter());
        }
    }

    /// Whether the sampler lets a letter of `source` and `cause` be kept now; counts it if not.
    fn admit(&self, source: &str, cause: DeadLetterCause) -> bool {
        let admitted = self
            .inner
            .sampler
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .admit(source, cause, now_ms());
        if !admitted {
            self.inner
                .counters
                .sampled_out
                .fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    fn spawn_keep(&self, letter: NewDeadLetter) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return self.not_kept(&letter.source, "no runtime");
        };
        let recording = &self.inner.recording;
        if recording.fetch_add(1, Ordering::AcqRel) >= MAX_RECORDING {
            recording.fetch_sub(1, Ordering::AcqRel);
            let why = "too many keeps still running (the store is slow or down)";
            return self.not_kept(&letter.source, why);
        }
        let letter = letter.bounded(self.inner.store.limits().max_body_bytes);
        let this = self.clone();
        runtime.spawn(async move {
            if let Err(error) = this.keep(letter).await {
                log::error!("a dead letter was not kept: {error}");
            }
            this.inner.recording.fetch_sub(1, Ordering::AcqRel);
        });
    }

    fn not_kept(&self, source: &str, why: &str) {
        self.inner
            .counters
            .keep_failures
            .fetch_add(1, Ordering::Relaxed);
        log::error!("a dead letter of `{source}` was not kept: {why}");
    }

    /// Keeps `letter` now (not sampled), resolving once the store committed it.
    ///
    /// # Errors
    /// The store's [`DeadLetterError::Storage`].
    pub async fn keep(&self, letter: NewDeadLetter) -> Result<Kept, DeadLetterError> {
        let counters = &self.inner.counters;
        match self.inner.store.keep(letter, now_ms()).await {
            Ok(kept) => {
                counters.kept.fetch_add(1, Ordering::Relaxed);
                counters.evicted.fetch_add(kept.evicted, Ordering::Relaxed);
                Ok(kept)
            }
            Err(error) => {
                counters.keep_failures.fetch_add(1, Ordering::Relaxed);
                Err(error)
            }
        }
    }

    /// The page of entries `filter` matches, oldest first.
    ///
    /// # Errors
    /// The store's [`DeadLetterError::Storage`].
    pub async fn list(&self, filter: DeadLetterFilter) -> Result<DeadLetterPage, DeadLetterError> {
        self.inner.store.list(filter).await
    }

    /// The entry `id`.
    ///
    /// # Errors
    /// [`DeadLetterError::NotFound`], or the store's error.
    pub async fn get(&self, id: u64) -> Result<StoredDeadLetter, DeadLetterError> {
        self.inner
            .store
            .get(id)
            .await?
            .ok_or(DeadLetterError::NotFound(id))
    }

    /// Deletes the entry `id` without replaying it.
    ///
    /// # Errors
    /// [`DeadLetterError::NotFound`], or the store's error.
    pub async fn delete(&self, id: u64) -> Result<(), DeadLetterError> {
        match self.inner.store.remove(id).await? {
            true => Ok(()),
            false => Err(DeadLetterError::NotFound(id)),
        }
    }

    /// How many entries the store holds, by cause.
    ///
    /// # Errors
    /// The store's [`DeadLetterError::Storage`].
    pub async fn counts(&self) -> Result<DeadLetterCounts, DeadLetterError> {
        self.inner.store.counts().await
    }

    /// What this handle (and its clones) did.
    pub fn stats(&self) -> DeadLetterStats {
        let c = &self.inner.counters;
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        DeadLetterStats {
            kept: read(&c.kept),
            evicted: read(&c.evicted),
            sampled_out: read(&c.sampled_out),
            keep_failures: read(&c.keep_failures),
            replayed: read(&c.replayed),
            already_applied: read(&c.already_applied),
            replay_failures: read(&c.replay_failures),
        }
    }

    /// Registers how to replay the entries of `source`: `route` is given each entry's body as
    /// stored bytes and the replay's stable id, and resolves once the destination applied it
    /// (or recognised it). It runs on the arbiter that calls
    /// [`replay`](Self::replay). A later route of the same source replaces this one.
    pub fn on_replay_bytes<F, Fut>(&self, source: impl Into<String>, route: F)
    where
        F: Fn(Replay<Vec<u8>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Replayed, RouteError>> + 'static,
    {
        let route: Route = Arc::new(move |replay| Ok(Box::pin(route(replay)) as ReplayFuture));
        self.routes().insert(source.into(), route);
    }

    /// Registers how to replay the entries of `source` as `T`: each body is decoded in the
    /// codec its manifest names (the codecs of the crate: MessagePack, bincode). An entry
    /// that does not decode as `T` is not replayed ([`DeadLetterError::Unreplayable`],
    /// nothing changed). See [`on_replay_bytes`](Self::on_replay_bytes).
    pub fn on_replay<T, F, Fut>(&self, source: impl Into<String>, route: F)
    where
        T: DeserializeOwned + 'static,
        F: Fn(Replay<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Replayed, RouteError>> + 'static,
    {
        let route: Route = Arc::new(move |replay: Replay<Vec<u8>>| {
            let body = decode::<T>(&replay.entry, &replay.body)?;
            let replay = Replay {
                body,
                info: replay.info,
                entry: replay.entry,
            };
            Ok(Box::pin(route(replay)) as ReplayFuture)
        });
        self.routes().insert(source.into(), route);
    }

    /// Replays the entry `id` through its source's route, and removes it once the route
    /// resolved: effectively once, as long as the destination is effectively once on the
    /// replay's id ([`Replay::info`]). A replay that fails keeps the entry, notes the
    /// failure, and may be repeated; a replay repeated after one that applied the message
    /// but ended before the entry was removed (a crash) is recognised by the destination.
    ///
    /// # Errors
    /// [`DeadLetterError::NotFound`], [`NoRoute`](DeadLetterError::NoRoute),
    /// [`Unreplayable`](DeadLetterError::Unreplayable) (nothing changed),
    /// [`Busy`](DeadLetterError::Busy) (nothing changed),
    /// [`ReplayFailed`](DeadLetterError::ReplayFailed) (as the route says: certainly not
    /// applied, or in doubt), or the store's error.
    pub async fn replay(&self, id: u64) -> Result<Replayed, DeadLetterError> {
        if !self.replaying().insert(id) {
            return Err(DeadLetterError::Busy(id));
        }
        // Let go of the entry however the replay ends, dropped unfinished too.
        let _running = Running { handle: self, id };
        self.replay_once(id).await
    }

    async fn replay_once(&self, id: u64) -> Result<Replayed, DeadLetterError> {
        let mut entry = self.get(id).await?;
        let source = entry.letter.source.clone();
        let route = self
            .inner
            .routes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&source)
            .cloned()
            .ok_or_else(|| DeadLetterError::NoRoute(source.clone()))?;
        let body = entry
            .letter
            .body
            .take()
            .ok_or_else(|| DeadLetterError::Unreplayable {
                id,
                reason: format!(
                    "its body ({} bytes) was not kept: larger than max_body_bytes, or than the \
                     room a peer's letter had",
                    entry.letter.body_len
                ),
            })?;
        // Every id below the oldest entry still held is gone for good (ids are never reused):
        // the destination may forget them.
        let oldest = self.inner.store.list(oldest_only()).await?;
        let oldest = oldest.entries.first().map_or(id, |entry| entry.id.min(id));
        let mut info = self.replay_info(&source, id);
        info.window_start = oldest;
        let replay = Replay { body, info, entry };
        let future =
            route(replay).map_err(|reason| DeadLetterError::Unreplayable { id, reason })?;
        let counters = &self.inner.counters;
        match future.await {
            Ok(replayed) => {
                if let Err(error) = self.inner.store.remove(id).await {
                    return Err(DeadLetterError::Storage {
                        message: format!(
                            "dead letter {id} was replayed, but removing it failed (a later \
                             replay is recognised by an effectively-once destination): {error}"
                        ),
                        happened: Happened::FailedAfter,
                    });
                }
                counters.replayed.fetch_add(1, Ordering::Relaxed);
                if replayed == Replayed::AlreadyApplied {
                    counters.already_applied.fetch_add(1, Ordering::Relaxed);
                }
                Ok(replayed)
            }
            Err(RouteError {
                mut reason,
                happened,
            }) => {
                counters.replay_failures.fetch_add(1, Ordering::Relaxed);
                // As the route says, whatever the note's fate: the note is not the replay.
                if let Err(error) = self
                    .inner
                    .store
                    .replay_failed(id, reason.clone(), now_ms())
                    .await
                {
                    reason = format!("{reason} (and noting the failure failed: {error})");
                }
                Err(DeadLetterError::ReplayFailed {
                    id,
                    reason,
                    happened,
                })
            }
        }
    }

    fn replaying(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        self.inner
            .replaying
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The stable delivery id of replays of entry `id` of `source` (see [`Replay::info`]): the
    /// producer `dead-letters/<source>/<hash>` (the source cut to 180 bytes; the hash, of the
    /// store's id and the whole source, tells stores and sources apart), an incarnation derived
    /// from the store's id, seq `id`. Its `window_start` here is 1; a replay sets it to the
    /// oldest id the store still holds.
    pub fn replay_info(&self, source: &str, id: u64) -> DeliveryInfo {
        let store = Sha256::new()
            .chain_update(b"actix-delivery dead letters\0")
            .chain_update(self.inner.store.store_id().as_bytes())
            .finalize();
        let mut incarnation = [0; 16];
        incarnation.copy_from_slice(&store[..16]);
        let stream = Sha256::new()
            .chain_update(store)
            .chain_update(source.as_bytes())
            .finalize();
        let hash: String = stream[..6].iter().map(|b| format!("{b:02x}")).collect();
        let mut cut = source.len().min(180);
        while !source.is_char_boundary(cut) {
            cut -= 1;
        }
        DeliveryInfo {
            producer_id: ProducerId::from(format!("dead-letters/{}/{hash}", &source[..cut])),
            incarnation: IncarnationId::from_u128(u128::from_le_bytes(incarnation)),
            seq: id,
            window_start: 1,
            trace_context: None,
            first_seq: None,
        }
    }

    fn routes(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Route>> {
        self.inner.routes.write().unwrap_or_else(|e| e.into_inner())
    }
}

fn decode<T: DeserializeOwned>(entry: &StoredDeadLetter, body: &[u8]) -> Result<T, String> {
    let manifest = &entry.letter.manifest;
    let codec = Codec::from_id(manifest.codec_id())
        .ok_or_else(|| format!("codec {} is unknown to this version", manifest.codec_id()))?;
    codec.decode(body, body.len() as u64).map_err(|error| {
        format!(
            "the body (type `{}` version {}) does not decode as `{}`: {error}",
            manifest.name(),
            manifest.version(),
            std::any::type_name::<T>()
        )
    })
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// Where a part keeps the messages it gives up (a producer's after `max_attempts`, a pool's
/// jobs): the store, the part's kind and name, and how its message type is written
/// (MessagePack; `new` asks `T: Serialize`, so the part itself need not).
#[derive(Debug)]
pub(crate) struct GiveUpKeeper<T> {
    dead_letters: DeadLetters,
    kind: SourceKind,
    source: String,
    encode: fn(&T) -> Result<Vec<u8>, String>,
}

impl<T> GiveUpKeeper<T> {
    pub(crate) fn new(dead_letters: DeadLetters, kind: SourceKind, source: String) -> Self
    where
        T: Serialize,
    {
        Self {
            dead_letters,
            kind,
            source,
            encode: |body| {
                Codec::MessagePack
                    .encode(body, MAX_ENCODED_BYTES)
                    .map_err(|error| error.to_string())
            },
        }
    }

    /// Records `body`, given up after `attempts` with `error`, under its delivery id `origin`
    /// (also its key): in MessagePack, or without its body if it does not encode (the error
    /// then says why).
    pub(crate) fn record(&self, origin: DeliveryInfo, body: &T, attempts: u32, mut error: String) {
        let body = (self.encode)(body)
            .inspect_err(|unencodable| {
                error = format!("{error}; the body was not kept: {unencodable}");
            })
            .ok();
        self.dead_letters.record(NewDeadLetter {
            kind: self.kind,
            source: self.source.clone(),
            cause: DeadLetterCause::GivenUp,
            key: delivery_key(&origin),
            origin: Some(origin),
            manifest: Manifest::new(Codec::MessagePack, std::any::type_name::<T>(), 1),
            body_len: body.as_ref().map_or(0, |body| body.len() as u64),
            body,
            attempts,
            error,
        });
    }
}

/// The filter of the oldest entry (its id), without its body.
fn oldest_only() -> DeadLetterFilter {
    DeadLetterFilter {
        limit: Some(1),
        without_bodies: true,
        ..DeadLetterFilter::default()
    }
}

/// A replay of the entry `id` running: the entry is let go when it is dropped.
struct Running<'a> {
    handle: &'a DeadLetters,
    id: u64,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.handle.replaying().remove(&self.id);
    }
}
