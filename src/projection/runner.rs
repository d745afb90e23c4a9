//! The shell: a task on the current arbiter that carries out what the core asks (load the
//! offset, read the journal, run the handler, store an offset, wait) and reports back.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use futures_util::future::LocalBoxFuture;
use futures_util::FutureExt;
use tokio::sync::watch;

use crate::codec::Manifest;
use crate::delivery::dead_letter_handle::DeadLetters;
use crate::delivery::dead_letters::{DeadLetterCause, NewDeadLetter, SourceKind};
use crate::delivery::handler::panic_message;
use crate::journal::{Journal, JournalError, JournalId, Offset, Slices, TagNotifications};
use crate::persistence::EventSourced;
use crate::projection::core::{Batch, Core, ProjectionStats, Skipped, Step};
use crate::projection::envelope::{EntityEvents, EventDecoder, Item, RawEvents};
use crate::projection::{
    HandlerError, HandlerFuture, ProjectionError, ProjectionHandle, ProjectionOptions,
};

/// Where a projection's offset is kept: its name and slices.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub name: String,
    pub slices: Slices,
}

impl Key {
    /// The key of projection `name` over `slices`.
    pub fn new(name: &str, slices: Slices) -> Self {
        Self {
            name: name.to_owned(),
            slices,
        }
    }
}

/// Why a batch was not handled, or an offset not loaded or stored.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    /// The handler failed (or panicked): counts against the entries (retries, poison).
    #[error("{0}")]
    Handler(String),
    /// The store failed (the transaction, the offset, the connection): the stored offset is
    /// uncertain, and no fault of the entries.
    #[error("{0}")]
    Store(String),
    /// Exactly once: the stored offset was no longer the one the batch built on (another
    /// instance stored its own); the batch was rolled back. Only the exactly-once read
    /// models (features `sqlite`, `postgres`) report it.
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    #[error("{0}")]
    Conflict(String),
    /// The stored offsets do not fit this projection: it stops.
    #[error("{0}")]
    Refused(String),
}

// Exactly once: the read models of features `sqlite` and `postgres`.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl Failure {
    /// Exactly once: the stored offset was no longer `stored`.
    pub fn moved(stored: Offset) -> Self {
        Self::Conflict(format!("the stored offset is no longer {stored}"))
    }

    /// Exactly once: the read model holds offsets of `key`'s name under the slices `others`,
    /// which overlap `key`'s (a change of slicing).
    pub fn resliced(key: &Key, others: &[(u16, u16)]) -> Self {
        let others: Vec<String> = others
            .iter()
            .map(|(first, last)| format!("{first}-{last}"))
            .collect();
        Self::Refused(format!(
            "the read model holds offsets of `{}` for slices {}, which overlap this instance's \
             slices {}-{}: the slices of an exactly-once projection cannot change (the events \
             behind those offsets would be handled again); rebuild it under a new name, or \
             delete its rows from projection_offset together with what it wrote",
            key.name,
            others.join(", "),
            key.slices.first(),
            key.slices.last()
        ))
    }
}

/// The journal a read model records for a projection (`recorded`, as stored): refused if it
/// is no journal id at all (the table was written by hand).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn recorded_journal(recorded: String) -> Result<JournalId, Failure> {
    JournalId::new(recorded.as_str()).map_err(|err| {
        Failure::Refused(format!(
            "the read model records {recorded:?} as the journal it follows: {err}"
        ))
    })
}

/// A handler's panic, as the failure it counts as.
pub(crate) fn panicked(panic: Box<dyn Any + Send>) -> Failure {
    Failure::Handler(format!("the handler panicked: {}", panic_message(&*panic)))
}

/// Calls an async handler (`call` returns its future): what it returned, or its panic (in the
/// call or in the future) as a [`Failure`].
pub(crate) async fn guarded<'a>(
    call: impl FnOnce() -> HandlerFuture<'a>,
) -> Result<Result<(), HandlerError>, Failure> {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(future) => AssertUnwindSafe(future)
            .catch_unwind()
            .await
            .map_err(panicked),
        Err(panic) => Err(panicked(panic)),
    }
}

/// Where batches go: the handler and the offset store of one way of committing.
pub(crate) trait Sink<Ev>: 'static {
    /// Whether the offset is stored in the batch's own transaction (exactly once).
    fn offset_in_transaction(&self) -> bool;

    /// Records `journal` as the journal `key`'s projection follows, unless the read model
    /// records one already: the one it records ([`Failure::Store`] if it cannot tell).
    fn follow<'a>(
        &'a mut self,
        key: &'a Key,
        journal: &'a JournalId,
    ) -> LocalBoxFuture<'a, Result<JournalId, Failure>>;

    /// The stored offset ([`Offset::START`] if none): or [`Failure::Store`], or
    /// [`Failure::Refused`] if the stored offsets do not fit `key`.
    fn load<'a>(&'a mut self, key: &'a Key) -> LocalBoxFuture<'a, Result<Offset, Failure>>;

    /// Runs the handler on `batch`; exactly once: and stores `batch.to` in its transaction
    /// if `stored` is still the stored offset ([`Failure::Conflict`] if not).
    fn process<'a>(
        &'a mut self,
        key: &'a Key,
        stored: Offset,
        batch: Batch<Ev>,
    ) -> LocalBoxFuture<'a, Result<(), Failure>>;

    /// Stores `offset` on its own; exactly once: if `stored` is still the stored offset.
    fn save<'a>(
        &'a mut self,
        key: &'a Key,
        stored: Offset,
        offset: Offset,
    ) -> LocalBoxFuture<'a, Result<(), Failure>>;
}

/// A projection of the entries of one tag, before it is started with a handler and a store:
/// [`at_least_once`](Projection::at_least_once) (offsets in any [`OffsetStore`](crate::projection::OffsetStore)),
/// `exactly_once_sqlite` (feature `sqlite`, on by default) or `exactly_once_postgres`
/// (feature `postgres`). See the [module documentation](crate::projection).
pub struct Projection<D: EventDecoder> {
    pub(crate) journal: Arc<dyn Journal>,
    pub(crate) options: ProjectionOptions,
    pub(crate) decoder: D,
    pub(crate) dead_letters: Option<(DeadLetters, String)>,
}

impl Projection<RawEvents> {
    /// The projection of entity `E`'s events tagged as `options` says:
    /// `Projection::of::<Account>(journal, options)`.
    pub fn of<E: EventSourced>(
        journal: Arc<dyn Journal>,
        options: ProjectionOptions,
    ) -> Projection<EntityEvents<E>> {
        Projection {
            journal,
            options,
            decoder: EntityEvents::default(),
            dead_letters: None,
        }
    }

    /// The projection of the tagged entries as stored (payload and manifest).
    pub fn raw(journal: Arc<dyn Journal>, options: ProjectionOptions) -> Self {
        Self {
            journal,
            options,
            decoder: RawEvents,
            dead_letters: None,
        }
    }
}

impl<D: EventDecoder> Projection<D> {
    /// Keeps the entries the poison policy skips
    /// ([`PoisonPolicy::Skip`](crate::projection::PoisonPolicy::Skip)) in `dead_letters`,
    /// under the name `source` (kind [`Projection`](crate::dead_letters::SourceKind::Projection)):
    /// each event's payload and manifest as stored, its `persistence_id/seq` as the key, the
    /// handler's last error; an entry that could not be read is kept as
    /// [`Undecodable`](crate::dead_letters::DeadLetterCause::Undecodable). The letter is kept
    /// before the skip's offset is stored, so a crash between the two skips (and keeps) the
    /// entry again, updating the same letter; while the store fails, the projection waits and
    /// retries (0.1 s doubling to 5 s, each failure logged), and a stop then stores no offset
    /// past the entry.
    pub fn keep_dead_letters(
        mut self,
        dead_letters: DeadLetters,
        source: impl Into<String>,
    ) -> Self {
        self.dead_letters = Some((dead_letters, source.into()));
        self
    }

    /// Runs the projection with `sink` on the current arbiter.
    pub(crate) fn start<S: Sink<D::Event>>(self, sink: S) -> ProjectionHandle {
        let (stop, stopping) = watch::channel(false);
        let (loaded, opened) = watch::channel(false);
        let (done, finished) = watch::channel(None);
        let stats = Arc::new(Mutex::new(ProjectionStats::default()));
        let handle = ProjectionHandle::new(stats.clone(), stop, opened, finished);
        actix::spawn(async move {
            let result = run(self, sink, stats, stopping, loaded).await;
            done.send_replace(Some(result));
        });
        handle
    }
}

/// The label of a projection's metrics: its name, and its slices unless it has all.
#[cfg(feature = "metrics")]
fn label(key: &Key) -> String {
    if key.slices == Slices::ALL {
        key.name.clone()
    } else {
        format!("{}/{}", key.name, key.slices)
    }
}

/// The projection's life: steps until stopped or failed; then stores what at least once has
/// handled and not stored yet.
async fn run<D: EventDecoder, S: Sink<D::Event>>(
    projection: Projection<D>,
    mut sink: S,
    stats: Arc<Mutex<ProjectionStats>>,
    mut stopping: watch::Receiver<bool>,
    loaded: watch::Sender<bool>,
) -> Result<(), ProjectionError> {
    let Projection {
        journal,
        options,
        decoder,
        dead_letters,
    } = projection;
    let key = Key::new(&options.name, options.query.slices);
    let query = options.query.clone();
    let mut notifications = options
        .notifications
        .then(|| journal.tag_notifications())
        .flatten();
    let seed = crate::runtime::random::random_u64();
    let mut core = Core::new(options, sink.offset_in_transaction(), seed);
    #[cfg(feature = "metrics")]
    let mut meter = crate::projection::metrics::ProjectionMeter::new(&label(&key));
    #[cfg_attr(not(feature = "metrics"), allow(unused_mut))] // the meter needs it
    let mut publish = |core: &Core<D::Event>| {
        *stats.lock().unwrap_or_else(PoisonError::into_inner) = core.stats();
        #[cfg(feature = "metrics")]
        meter.publish(&core.stats());
    };
    let now = || tokio::time::Instant::now().into_std();
    let mut ended = Ok(());
    // Whether every skipped entry was kept: the offset is never stored past one that was not.
    let mut all_kept = true;
    while !*stopping.borrow() {
        let step = core.next_step(now());
        // Before the step, which may store the offset past a skipped entry.
        all_kept = keep_skipped(&mut core, dead_letters.as_ref(), &*journal, &mut stopping).await;
        if !all_kept {
            break; // stopped while the store was failing
        }
        match step {
            Step::Load => match load(&mut sink, &*journal, &key).await {
                Ok(offset) => {
                    core.handle_loaded(offset);
                    loaded.send_replace(true); // its stored offset fits: it runs
                }
                Err(failure) => store_failed(&mut core, &key.name, "loading its offset", failure),
            },
            Step::Fetch { after, max } => match journal.events_by_tag(&query, after, max).await {
                Ok(tagged) => {
                    let full = tagged.len() >= max;
                    let items: Vec<Item<D::Event>> = tagged
                        .into_iter()
                        .map(|tagged| Item::decode(&decoder, tagged))
                        .collect();
                    core.handle_fetched(items, full, now());
                }
                Err(err @ JournalError::Storage { .. }) => {
                    log::warn!(
                        "projection `{}`: reading the journal failed: {err}",
                        key.name
                    );
                    core.handle_fetch_failed(now());
                }
                Err(error) => {
                    let projection = key.name.clone();
                    core.handle_refused(ProjectionError::Journal { projection, error });
                }
            },
            Step::Handle(batch) => match sink.process(&key, core.stored(), batch).await {
                Ok(()) => core.handle_processed(now(), SystemTime::now()),
                Err(Failure::Handler(why)) => {
                    log::warn!("projection `{}`: the handler failed: {why}", key.name);
                    core.handle_handler_failed(&why, now());
                }
                Err(failure) => store_failed(&mut core, &key.name, "handling a batch", failure),
            },
            Step::Save(offset) => match sink.save(&key, core.stored(), offset).await {
                Ok(()) => core.handle_saved(offset),
                Err(failure) => store_failed(&mut core, &key.name, "storing its offset", failure),
            },
            Step::Wait(until) => {
                tokio::select! {
                    () = tokio::time::sleep_until(until.into()) => {}
                    () = notified(&mut notifications) => core.handle_notified(),
                    () = stop_requested(&mut stopping) => {}
                }
            }
            Step::Failed(error) => {
                ended = Err(error);
                break;
            }
        }
        publish(&core);
    }
    if all_kept {
        all_kept = keep_skipped(&mut core, dead_letters.as_ref(), &*journal, &mut stopping).await;
    }
    if let Some(offset) = core.offset_to_save_at_stop().filter(|_| all_kept) {
        match sink.save(&key, core.stored(), offset).await {
            Ok(()) => core.handle_saved(offset),
            Err(why) => log::warn!(
                "projection `{}`: storing its offset at the end failed (handled events \
                 after the stored offset will be handled again): {why}",
                key.name
            ),
        }
    }
    publish(&core);
    ended
}

/// Keeps the entries the core skipped since the last call in `dead_letters` (if it has one),
/// each with its event as stored. A keep that fails is retried (0.1 s, doubling to 5 s) until
/// it succeeds: the skip's offset is stored only after its letter. `false` if a stop was
/// requested while one still failed (then no offset may be stored past it).
async fn keep_skipped<Ev>(
    core: &mut Core<Ev>,
    dead_letters: Option<&(DeadLetters, String)>,
    journal: &dyn Journal,
    stopping: &mut watch::Receiver<bool>,
) -> bool {
    let skipped = core.take_skipped();
    let Some((dead_letters, source)) = dead_letters else {
        return true;
    };
    for entry in skipped {
        let letter = skipped_letter(source, &entry, journal).await;
        let mut wait = std::time::Duration::from_millis(100);
        while let Err(error) = dead_letters.keep(letter.clone()).await {
            log::error!(
                "projection `{source}`: keeping the skipped entry {}/{} as a dead letter \
                 failed (retried in {wait:?}; its offset is not stored until it is kept): \
                 {error}",
                entry.persistence_id,
                entry.seq
            );
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stop_requested(stopping) => return false,
            }
            wait = (wait * 2).min(std::time::Duration::from_secs(5));
        }
    }
    true
}

/// The dead letter of a skipped entry: its event as stored, read again from the journal (a
/// failed read is said in the letter's error).
async fn skipped_letter(source: &str, entry: &Skipped, journal: &dyn Journal) -> NewDeadLetter {
    let stored = journal
        .replay(&entry.persistence_id, entry.seq, entry.seq, 1)
        .await
        .map(|mut events| events.pop());
    let cause = if entry.attempts == 0 {
        DeadLetterCause::Undecodable
    } else {
        DeadLetterCause::Poison
    };
    let mut error = format!("offset {}: {}", entry.offset, entry.reason);
    let (manifest, body) = match stored {
        Ok(Some(event)) => (event.manifest, Some(event.payload)),
        Ok(None) => {
            error.push_str(" (the event is no longer in the journal)");
            (Manifest::raw(), None)
        }
        Err(read) => {
            error.push_str(&format!(" (reading the event failed: {read})"));
            (Manifest::raw(), None)
        }
    };
    NewDeadLetter {
        kind: SourceKind::Projection,
        source: source.to_owned(),
        cause,
        key: format!("{}/{}", entry.persistence_id, entry.seq),
        origin: None,
        manifest,
        body_len: body.as_ref().map_or(0, |body| body.len() as u64),
        body,
        attempts: entry.attempts,
        error,
    }
}

/// The stored offset, unless it is beyond everything `journal` has committed (see
/// [`Journal::offset_ceiling`]; a journal without a ceiling is not checked) or the read model
/// follows another journal (see [`Journal::journal_id`]; a journal without an id is not
/// checked). A read model that records no journal yet records this one, once the offset
/// passed: a refused start records nothing.
async fn load<Ev, S: Sink<Ev>>(
    sink: &mut S,
    journal: &dyn Journal,
    key: &Key,
) -> Result<Offset, Failure> {
    const REBUILD: &str = "rebuild the read model, under a new name or after deleting the \
                           name's rows from projection_offset and projection_journal together \
                           with what it wrote";
    let offset = sink.load(key).await?;
    if offset != Offset::START {
        match journal.offset_ceiling().await {
            Ok(ceiling) if offset > ceiling => {
                return Err(Failure::Refused(format!(
                    "its stored offset {offset} is beyond everything the journal has committed \
                     (up to {ceiling}): the offset belongs to another journal, or the journal \
                     was reset or restored from a logical dump, and every new entry would be \
                     skipped; {REBUILD}"
                )))
            }
            Ok(_) | Err(JournalError::Unsupported(_)) => {}
            Err(err) => {
                return Err(Failure::Store(format!(
                    "checking the stored offset {offset} against the journal: {err}"
                )))
            }
        }
    }
    if let Some(id) = journal.journal_id() {
        let followed = sink.follow(key, &id).await?;
        if followed != id {
            return Err(Failure::Refused(format!(
                "the read model follows journal {followed}, not this one ({id}): its offset \
                 and rows come from that journal (or from this journal's storage before it \
                 was replaced), and going on would skip this journal's entries below the \
                 offset; start the projection on the journal it follows, or {REBUILD}"
            )));
        }
    }
    Ok(offset)
}

/// Tells `core` that `doing` failed for a reason other than the handler: the store failed
/// (load the offset again), another instance moved the offset (the same, counted as a
/// conflict), or the stored offsets do not fit (stop).
fn store_failed<Ev>(core: &mut Core<Ev>, projection: &str, doing: &str, failure: Failure) {
    let now = tokio::time::Instant::now().into_std();
    match failure {
        Failure::Store(why) | Failure::Handler(why) => {
            log::warn!("projection `{projection}`: {doing} failed: {why}");
            core.handle_store_failed(now);
        }
        Failure::Conflict(why) => {
            log::warn!(
                "projection `{projection}`: {doing} rolled back, another instance of it moved \
                 its offset (two instances of one projection and slices handle nothing twice, \
                 but waste their work): {why}"
            );
            core.handle_conflict(now);
        }
        Failure::Refused(reason) => {
            log::error!("projection `{projection}` cannot start: {reason}");
            core.handle_refused(ProjectionError::Refused {
                projection: projection.to_owned(),
                reason,
            });
        }
    }
}

/// Resolves when a stop is asked for; never once every handle is gone (the projection then
/// runs on).
async fn stop_requested(stopping: &mut watch::Receiver<bool>) {
    if stopping.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The next notification, or never without them.
async fn notified(notifications: &mut Option<TagNotifications>) {
    match notifications {
        Some(notifications) => notifications.changed().await,
        None => std::future::pending().await,
    }
}
