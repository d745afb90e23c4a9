//! The runner over a memory journal, under virtual time: every event once and in order, live;
//! offsets stored in batches (at least once) and what a crash between them costs; restart
//! and rebuild; retries, the poison policy, deleted entries; slices; notifications against
//! polling.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::codec::Manifest;
use actix_delivery::journal::{
    Journal, JournalError, JournalFuture, MemoryJournal, Offset, PersistenceId, Slices, Snapshot,
    StoredEvent, Tag,
};
use actix_delivery::persistence::{PersistentConfig, PersistentHandle};
use actix_delivery::projection::{
    Envelope, MemoryOffsetStore, OffsetStore, PoisonPolicy, Projection, ProjectionError,
    ProjectionHandle,
};
use actix_delivery::StartError;

use super::bank::{self, wait_until, Account, AccountEvent, Balances};

const MINUTE: Duration = Duration::from_secs(60);

fn memory() -> Arc<dyn Journal> {
    Arc::new(MemoryJournal::new())
}

/// Under virtual time, a memory journal in which `accounts` accounts ran `commands` commands.
async fn bank_in(
    accounts: usize,
    commands: u64,
) -> (Arc<dyn Journal>, Vec<PersistentHandle<Account>>) {
    tokio::time::pause();
    let journal = memory();
    let handles = bank::open(&journal, "", accounts, &PersistentConfig::default());
    bank::run(&handles, 0..commands).await;
    (journal, handles)
}

/// Starts the at-least-once projection `name` of the accounts into `balances`.
fn project(
    journal: &Arc<dyn Journal>,
    options: actix_delivery::projection::ProjectionOptionsBuilder,
    store: &MemoryOffsetStore,
    balances: &Balances,
) -> ProjectionHandle {
    Projection::of::<Account>(journal.clone(), options.build().unwrap())
        .at_least_once(store.clone(), balances.handler())
}

#[actix::test]
async fn every_tagged_event_is_handled_once_in_order_and_the_tag_is_followed_live() {
    let (journal, accounts) = bank_in(4, 40).await;
    let (store, balances) = (MemoryOffsetStore::new(), Balances::default());
    let projection = project(
        &journal,
        bank::options("balances").batch_size(7),
        &store,
        &balances,
    );
    assert_eq!(
        projection.opened().await,
        Ok(()),
        "its offset loaded and fits"
    );
    wait_until("the first 40", MINUTE, || projection.stats().events == 40).await;
    bank::run(&accounts, 40..65).await;
    wait_until("25 more, live", MINUTE, || projection.stats().events == 65).await;
    assert_eq!(balances.accounts(), bank::fold(&*journal, "", 4).await);
    bank::assert_each_once_in_order(&balances.handled());
    let stats = projection.stats();
    assert_eq!((stats.entries, stats.retries, stats.skipped), (65, 0, 0));
    assert!(stats.batches >= 10, "batches of at most 7: {stats:?}");
    projection.stop();
    projection.stopped().await.unwrap();
    assert_eq!(projection.opened().await, Ok(()), "it did open");
    let stored = store.offset("balances", Slices::ALL).unwrap();
    assert_eq!(stored, projection.stats().offset, "stored at the stop");
    assert!(stored > Offset::START);
}

#[actix::test]
async fn a_restart_goes_on_from_the_stored_offset_and_a_new_name_rebuilds_the_same_model() {
    let (journal, accounts) = bank_in(3, 30).await;
    let (store, balances) = (MemoryOffsetStore::new(), Balances::default());
    let first = project(&journal, bank::options("balances"), &store, &balances);
    wait_until("30", MINUTE, || first.stats().events == 30).await;
    first.stop();
    first.stopped().await.unwrap();
    bank::run(&accounts, 30..50).await;
    let second = project(&journal, bank::options("balances"), &store, &balances);
    wait_until("20 more", MINUTE, || second.stats().events == 20).await;
    assert_eq!(
        balances.handled().len(),
        50,
        "the restart handled only what was new"
    );
    bank::assert_each_once_in_order(&balances.handled());

    let rebuilt = Balances::default();
    let fresh = project(&journal, bank::options("balances-v2"), &store, &rebuilt);
    wait_until("all 50 again", MINUTE, || fresh.stats().events == 50).await;
    assert_eq!(
        rebuilt.accounts(),
        balances.accounts(),
        "from offset 0: the same model"
    );
    assert_eq!(rebuilt.handled(), balances.handled(), "in the same order");
    assert_eq!(rebuilt.accounts(), bank::fold(&*journal, "", 3).await);
}

#[actix::test]
async fn at_least_once_stores_offsets_in_batches_and_a_crash_between_them_repeats_events() {
    let (journal, _accounts) = bank_in(2, 25).await;
    let (store, balances) = (MemoryOffsetStore::new(), Balances::default());
    let options = bank::options("balances")
        .batch_size(5)
        .commit_every(10)
        .commit_interval(Duration::from_secs(3600));
    // On an arbiter of its own, so that stopping the arbiter ends it without its stop: a crash.
    let arbiter = actix::Arbiter::new();
    let (sender, started) = tokio::sync::oneshot::channel();
    let (journal_, store_, balances_) = (journal.clone(), store.clone(), balances.clone());
    arbiter.spawn(async move {
        let handle = project(&journal_, options, &store_, &balances_);
        let _ = sender.send(handle);
    });
    let crashed = started.await.unwrap();
    wait_until("25", MINUTE, || crashed.stats().events == 25).await;
    let stored = store.offset("balances", Slices::ALL).unwrap();
    assert_eq!(crashed.stats().offsets_saved, 2, "after 10 and 20 events");
    arbiter.stop();
    assert_eq!(crashed.stopped().await, Err(ProjectionError::Gone));
    // The next life starts from the offset stored after 20 events: 5 come again.
    let restarted = project(&journal, bank::options("balances"), &store, &balances);
    wait_until("the last 5 again", MINUTE, || restarted.stats().events == 5).await;
    let handled = balances.handled();
    assert_eq!(handled.len(), 30);
    assert_eq!(
        handled[20..25],
        handled[25..30],
        "events after the stored offset, again"
    );
    restarted.stop();
    restarted.stopped().await.unwrap();
    assert!(
        stored < store.offset("balances", Slices::ALL).unwrap(),
        "and stored at the stop"
    );
}

/// A handler that fails on every event of account 1's seq 3, and counts its calls.
fn failing_on_account_1_seq_3(
    balances: &Balances,
    calls: &Arc<AtomicU32>,
) -> impl for<'a> FnMut(&'a [Envelope<AccountEvent>]) -> actix_delivery::projection::HandlerFuture<'a>
       + use<> {
    let (balances, calls) = (balances.clone(), calls.clone());
    move |events| {
        calls.fetch_add(1, Ordering::Relaxed);
        let poison = events
            .iter()
            .any(|e| e.persistence_id.as_str() == "account-1" && e.seq == 3);
        if !poison {
            balances.apply(events);
        }
        Box::pin(async move {
            if poison {
                return Err("account-1's third event breaks the read model".into());
            }
            Ok(())
        })
    }
}

#[actix::test]
async fn a_failing_entry_is_retried_then_isolated_and_stops_the_projection_naming_it() {
    let (journal, _accounts) = bank_in(2, 12).await;
    let (store, balances, calls) = (
        MemoryOffsetStore::new(),
        Balances::default(),
        Arc::default(),
    );
    let options = bank::options("balances").batch_size(100).max_retries(2);
    let projection = Projection::of::<Account>(journal.clone(), options.build().unwrap())
        .at_least_once(store.clone(), failing_on_account_1_seq_3(&balances, &calls));
    let error = projection.stopped().await.unwrap_err();
    match &error {
        ProjectionError::Poison {
            projection: name,
            persistence_id,
            seq,
            reason,
            ..
        } => {
            assert_eq!(
                (name.as_str(), persistence_id.as_str(), *seq),
                ("balances", "account-1", 3)
            );
            assert!(
                reason.contains("failed 3 times") && reason.contains("breaks"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    // The whole batch 3 times, then alone: entries before it (0:1 .. 0:5) once each, then
    // the poison entry 3 times.
    let stats = projection.stats();
    assert_eq!(calls.load(Ordering::Relaxed), 3 + 5 + 3);
    assert_eq!((stats.retries, stats.events, stats.skipped), (5, 5, 0));
    assert_eq!(
        balances.handled().len(),
        5,
        "everything before the poison entry, once"
    );
    assert_eq!(
        store.offset("balances", Slices::ALL),
        Some(stats.offset),
        "stored before it"
    );
}

/// With `Skip`, the failing entry is counted and every other handled; the skipped entry is
/// kept as a dead letter with its event as stored.
#[actix::test]
async fn with_skip_a_failing_entry_is_counted_kept_as_a_dead_letter_and_everything_else_handled() {
    use actix_delivery::dead_letters::{
        DeadLetterCause, DeadLetterFilter, DeadLetterLimits, DeadLetters, MemoryDeadLetters,
        SourceKind,
    };
    let (journal, _accounts) = bank_in(2, 12).await;
    let (store, balances, calls) = (
        MemoryOffsetStore::new(),
        Balances::default(),
        Arc::default(),
    );
    let dead_letters =
        DeadLetters::new(MemoryDeadLetters::new(DeadLetterLimits::default()).unwrap());
    let options = bank::options("balances")
        .max_retries(1)
        .poison(PoisonPolicy::Skip);
    let projection = Projection::of::<Account>(journal.clone(), options.build().unwrap())
        .keep_dead_letters(dead_letters.clone(), "balances")
        .at_least_once(store, failing_on_account_1_seq_3(&balances, &calls));
    wait_until("past the poison entry", MINUTE, || {
        projection.stats().entries == 12
    })
    .await;
    let stats = projection.stats();
    assert_eq!((stats.events, stats.skipped), (11, 1));
    let handled = balances.handled();
    assert!(!handled
        .iter()
        .any(|(id, seq, _)| id == "account-1" && *seq == 3));
    bank::assert_each_once_in_order(&handled);
    let kept = dead_letters
        .list(DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(kept.entries.len(), 1);
    let letter = &kept.entries[0].letter;
    assert_eq!(
        (
            letter.kind,
            letter.source.as_str(),
            letter.cause,
            letter.key.as_str()
        ),
        (
            SourceKind::Projection,
            "balances",
            DeadLetterCause::Poison,
            "account-1/3"
        )
    );
    assert_eq!(letter.attempts, 2, "the first run and one retry");
    let id = PersistenceId::new("account-1").unwrap();
    let event = journal.replay(&id, 3, 3, 1).await.unwrap().remove(0);
    assert_eq!(
        letter.body.as_ref(),
        Some(&event.payload),
        "the event as stored"
    );
    assert_eq!(letter.manifest, event.manifest);
}

/// A skipped entry whose dead letter cannot be kept yet waits for the store: the keep is
/// retried until it succeeds, and the projection goes on after it.
#[actix::test]
async fn a_skipped_entry_whose_letter_fails_to_be_kept_is_kept_once_the_store_answers() {
    use crate::common::dead_letters::FaultyDeadLetters;
    use actix_delivery::dead_letters::{DeadLetterFilter, DeadLetters};
    let (journal, _accounts) = bank_in(2, 12).await;
    let (offsets, balances, calls) = (
        MemoryOffsetStore::new(),
        Balances::default(),
        Arc::default(),
    );
    let store = FaultyDeadLetters::new();
    store.fail_keeps(3);
    let dead_letters = DeadLetters::new(store.clone());
    let options = bank::options("balances")
        .max_retries(1)
        .poison(PoisonPolicy::Skip);
    let projection = Projection::of::<Account>(journal.clone(), options.build().unwrap())
        .keep_dead_letters(dead_letters.clone(), "balances")
        .at_least_once(offsets, failing_on_account_1_seq_3(&balances, &calls));
    wait_until("past the poison entry", MINUTE, || {
        projection.stats().entries == 12
    })
    .await;
    assert_eq!(store.injected(), 3, "three keeps failed");
    let kept = dead_letters
        .list(DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(kept.entries.len(), 1, "kept at the fourth try");
    assert_eq!(kept.entries[0].letter.key, "account-1/3");
}

/// A handler's error whose cause is in its `source()`.
#[derive(Debug)]
struct CannotApply(std::io::Error);

impl std::fmt::Display for CannotApply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("cannot apply the event")
    }
}

impl std::error::Error for CannotApply {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// A handler's error is written with its causes (its `source()` chain), in the log line of
/// each failure and in the error that stops the projection; before, both said only "cannot
/// apply the event".
#[actix::test]
async fn a_handlers_error_is_logged_and_reported_with_its_causes() {
    crate::common::logs::keep();
    let (journal, _accounts) = bank_in(1, 3).await;
    let options = bank::options("causes").max_retries(1).build().unwrap();
    let projection = Projection::of::<Account>(journal.clone(), options).at_least_once(
        MemoryOffsetStore::new(),
        |_| {
            Box::pin(async {
                let quota = std::io::Error::other("the read model's disk quota is exceeded");
                Err(CannotApply(quota).into())
            })
        },
    );
    let error = projection.stopped().await.unwrap_err().to_string();
    let cause = "cannot apply the event: the read model's disk quota is exceeded";
    assert!(
        error.contains(&format!("its handler failed 2 times: {cause}")),
        "{error}"
    );
    let logged =
        crate::common::logs::lines_containing(&["projection `causes`: the handler failed", cause]);
    assert_eq!(
        logged.len(),
        4,
        "the batch twice, then its first entry alone twice: {logged:?}"
    );
}

#[actix::test]
async fn a_panicking_handler_is_a_failure_like_any_other() {
    let (journal, _accounts) = bank_in(1, 3).await;
    let (balances, calls) = (Balances::default(), Arc::new(AtomicU32::new(0)));
    let projection =
        Projection::of::<Account>(journal.clone(), bank::options("p").build().unwrap())
            .at_least_once(MemoryOffsetStore::new(), {
                let (balances, calls) = (balances.clone(), calls.clone());
                move |events| {
                    if calls.fetch_add(1, Ordering::Relaxed) < 2 {
                        panic!("a bug in the handler");
                    }
                    balances.apply(events);
                    Box::pin(async { Ok(()) })
                }
            });
    wait_until("handled after two panics", MINUTE, || {
        projection.stats().events == 3
    })
    .await;
    assert_eq!(projection.stats().retries, 2);
    assert_eq!(balances.accounts(), bank::fold(&*journal, "", 1).await);
}

#[actix::test]
async fn entries_deleted_before_the_projection_read_them_stop_it_or_are_skipped_never_silently() {
    tokio::time::pause();
    let journal = memory();
    let config = PersistentConfig {
        snapshot_every: Some(4),
        delete_events_on_snapshot: true,
        ..PersistentConfig::default()
    };
    let accounts = bank::open(&journal, "", 1, &config);
    bank::run(&accounts, 0..10).await;
    tokio::time::sleep(Duration::from_millis(100)).await; // the snapshot's deletion
    let deleted = journal
        .replay(&bank::account_id("", 0), 1, u64::MAX, 100)
        .await
        .unwrap()
        .first()
        .map_or(0, |first| first.seq - 1);
    assert!(
        deleted >= 4,
        "the entity deleted what its snapshot covers: {deleted}"
    );

    let stopping = project(
        &journal,
        bank::options("strict"),
        &MemoryOffsetStore::new(),
        &Balances::default(),
    );
    match stopping.stopped().await {
        Err(ProjectionError::Poison { seq: 1, reason, .. }) => {
            assert!(reason.contains("deleted"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    let balances = Balances::default();
    let skipping = project(
        &journal,
        bank::options("lenient").poison(PoisonPolicy::Skip),
        &MemoryOffsetStore::new(),
        &balances,
    );
    wait_until("all entries", MINUTE, || skipping.stats().entries == 10).await;
    assert_eq!(skipping.stats().skipped, deleted);
    assert_eq!(balances.handled().len() as u64, 10 - deleted);
}

#[actix::test]
async fn instances_of_split_slices_handle_every_event_once_between_them() {
    let (journal, _accounts) = bank_in(12, 60).await;
    let balances = Balances::default();
    let instances: Vec<ProjectionHandle> = (0..3)
        .map(|part| {
            let options = bank::options("balances").slices(Slices::split(3, part).unwrap());
            project(&journal, options, &MemoryOffsetStore::new(), &balances)
        })
        .collect();
    wait_until("60 between them", MINUTE, || {
        instances.iter().map(|p| p.stats().events).sum::<u64>() == 60
    })
    .await;
    assert!(
        instances.iter().all(|p| p.stats().events > 0),
        "each has some accounts"
    );
    bank::assert_each_once_in_order(&balances.handled());
    assert_eq!(balances.accounts(), bank::fold(&*journal, "", 12).await);
}

#[actix::test]
async fn a_notification_wakes_an_idle_projection_polling_waits_for_its_next_poll() {
    tokio::time::pause();
    for notifications in [true, false] {
        let journal = memory();
        let accounts = bank::open(&journal, "", 1, &PersistentConfig::default());
        let options = bank::options("balances")
            .notifications(notifications)
            .poll_interval(Duration::from_secs(10))
            .max_poll_interval(Duration::from_secs(10));
        let balances = Balances::default();
        let projection = project(&journal, options, &MemoryOffsetStore::new(), &balances);
        let mut waits = Vec::new();
        for k in 0..5 {
            tokio::time::sleep(Duration::from_millis(12_345)).await; // idle between events
            let start = tokio::time::Instant::now();
            bank::run(&accounts, k..k + 1).await;
            wait_until("the event", MINUTE, || projection.stats().events == k + 1).await;
            waits.push(start.elapsed());
        }
        if notifications {
            assert!(
                waits.iter().all(|w| *w < Duration::from_millis(50)),
                "woken: {waits:?}"
            );
        } else {
            // The next poll comes within the longest interval, hardly ever at once.
            assert!(
                waits.iter().all(|w| *w <= Duration::from_secs(10)),
                "{waits:?}"
            );
            assert!(
                waits.iter().any(|w| *w > Duration::from_millis(100)),
                "{waits:?}"
            );
        }
    }
}

#[actix::test]
async fn a_raw_projection_gets_entries_as_stored() {
    tokio::time::pause();
    let journal = memory();
    let tag = Tag::from_static("raw");
    let id = bank::account_id("raw-", 0);
    journal
        .append_tagged(
            &id,
            1,
            vec![b"a".to_vec(), b"b".to_vec()],
            Manifest::raw(),
            vec![vec![tag.clone()]; 2],
        )
        .await
        .unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let options = actix_delivery::projection::ProjectionOptions::builder("raw", tag)
        .build()
        .unwrap();
    let projection = Projection::raw(journal, options).at_least_once(MemoryOffsetStore::new(), {
        let seen = seen.clone();
        move |events| {
            seen.lock()
                .unwrap()
                .extend(events.iter().map(|e| e.event.payload.clone()));
            Box::pin(async { Ok(()) })
        }
    });
    wait_until("two entries", MINUTE, || projection.stats().events == 2).await;
    assert_eq!(*seen.lock().unwrap(), [b"a".to_vec(), b"b".to_vec()]);
}

#[actix::test]
async fn a_stored_offset_beyond_the_journal_is_refused_not_waited_on_forever() {
    let (journal, _accounts) = bank_in(2, 10).await;
    // As if the offsets came from another journal, or this one was reset.
    let mut store = MemoryOffsetStore::new();
    store
        .save("balances", Slices::ALL, Offset::from_parts(0, 1_000))
        .await
        .unwrap();
    let balances = Balances::default();
    let projection = project(&journal, bank::options("balances"), &store, &balances);
    let opened = tokio::time::timeout(MINUTE, projection.opened())
        .await
        .expect("refused at once");
    let Err(StartError::Failed(error)) = opened else {
        panic!("opened: {opened:?}");
    };
    assert!(matches!(error, ProjectionError::Refused { .. }), "{error}");
    assert!(error.to_string().contains("beyond everything"), "{error}");
    assert_eq!(projection.stopped().await, Err(error));
    assert!(balances.handled().is_empty());
}

/// An offset store that followed one journal, given another whose entries go on past its
/// offset (so no ceiling tells): refused at once, nothing handled.
#[actix::test]
async fn an_offset_store_that_followed_one_journal_refuses_another() {
    let (followed, _accounts) = bank_in(2, 4).await;
    let (store, balances) = (MemoryOffsetStore::new(), Balances::default());
    let first = project(&followed, bank::options("balances"), &store, &balances);
    wait_until("4", MINUTE, || first.stats().events == 4).await;
    first.stop();
    first.stopped().await.unwrap();

    let other = memory();
    let accounts = bank::open(&other, "", 2, &PersistentConfig::default());
    bank::run(&accounts, 0..10).await;
    let projection = project(&other, bank::options("balances"), &store, &balances);
    let error = tokio::time::timeout(MINUTE, projection.stopped())
        .await
        .expect("refused at once")
        .unwrap_err();
    assert!(matches!(error, ProjectionError::Refused { .. }), "{error}");
    let (followed, other) = (followed.journal_id().unwrap(), other.journal_id().unwrap());
    assert!(
        error.to_string().contains(&format!(
            "follows journal {followed}, not this one ({other})"
        )),
        "{error}"
    );
    assert_eq!(projection.stats().events, 0);
    assert_eq!(balances.handled().len(), 4, "only the first journal's");
}

/// A journal outside the crate that stores no tags: each call fails, reading by tag is
/// unsupported (the trait's default).
struct Untagged;

impl Journal for Untagged {
    fn append_as(
        &self,
        _: &PersistenceId,
        _: u64,
        _: Vec<Vec<u8>>,
        _: Manifest,
    ) -> JournalFuture<'_, ()> {
        Box::pin(async { Err(JournalError::Closed) })
    }
    fn replay(
        &self,
        _: &PersistenceId,
        _: u64,
        _: u64,
        _: usize,
    ) -> JournalFuture<'_, Vec<StoredEvent>> {
        Box::pin(async { Err(JournalError::Closed) })
    }
    fn highest_seq(&self, _: &PersistenceId) -> JournalFuture<'_, u64> {
        Box::pin(async { Err(JournalError::Closed) })
    }
    fn delete_to(&self, _: &PersistenceId, _: u64) -> JournalFuture<'_, ()> {
        Box::pin(async { Err(JournalError::Closed) })
    }
    fn save_snapshot(&self, _: &PersistenceId, _: Snapshot) -> JournalFuture<'_, ()> {
        Box::pin(async { Err(JournalError::Closed) })
    }
    fn load_snapshot(&self, _: &PersistenceId) -> JournalFuture<'_, Option<Snapshot>> {
        Box::pin(async { Err(JournalError::Closed) })
    }
}

#[actix::test]
async fn a_journal_read_no_retry_can_mend_stops_the_projection_with_the_journals_error() {
    tokio::time::pause();
    let journal: Arc<dyn Journal> = Arc::new(Untagged);
    let balances = Balances::default();
    let store = MemoryOffsetStore::new();
    let projection = project(&journal, bank::options("balances"), &store, &balances);
    let error = tokio::time::timeout(MINUTE, projection.stopped())
        .await
        .expect("stopped at once")
        .unwrap_err();
    assert!(
        matches!(
            error,
            ProjectionError::Journal {
                error: JournalError::Unsupported(_),
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(projection.stats().read_failures, 0, "not retried");
}
