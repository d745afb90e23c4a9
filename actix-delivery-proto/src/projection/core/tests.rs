//! The rules of the projection core, each as a small test.

use super::*;
use crate::journal::tag::Tag;
use crate::projection::envelope::Envelope;
use crate::projection::options::ProjectionOptions;

const MS: Duration = Duration::from_millis(1);

fn options() -> crate::projection::options::ProjectionOptionsBuilder {
    ProjectionOptions::builder("p", Tag::from_static("t"))
        .batch_size(4)
        .fetch_size(10)
        .poll_interval(100 * MS)
        .max_poll_interval(1000 * MS)
        .max_retries(2)
        .retry_backoff(10 * MS, 1000 * MS)
        .commit_every(5)
        .commit_interval(500 * MS)
}

fn core(
    offset_in_transaction: bool,
    options: crate::projection::options::ProjectionOptionsBuilder,
) -> Core<u32> {
    Core::new(options.build().unwrap(), offset_in_transaction, 7)
}

/// Entry `n` (offset 0:n, stream `s<n>`, seq n) with `events` events numbered n*10 + i.
fn item(n: u64, events: u32) -> Item<u32> {
    let id = PersistenceId::new(format!("s{n}")).unwrap();
    let offset = Offset::from_parts(0, n);
    Item {
        offset,
        persistence_id: id.clone(),
        seq: n,
        written_at: SystemTime::UNIX_EPOCH,
        events: Ok((0..events)
            .map(|i| Envelope {
                offset,
                persistence_id: id.clone(),
                seq: n,
                written_at: SystemTime::UNIX_EPOCH,
                event: n as u32 * 10 + i,
            })
            .collect()),
    }
}

fn unreadable(n: u64) -> Item<u32> {
    Item {
        events: Err("deleted".into()),
        ..item(n, 0)
    }
}

/// A core that loaded `offset` and read `items` (a short page).
fn running(offset_in_transaction: bool, items: Vec<Item<u32>>, now: Instant) -> Core<u32> {
    let mut core = core(offset_in_transaction, options());
    assert!(matches!(core.next_step(now), Step::Load));
    core.handle_loaded(Offset::START);
    assert!(matches!(core.next_step(now), Step::Fetch { .. }));
    core.handle_fetched(items, false, now);
    core
}

fn handle(core: &mut Core<u32>, now: Instant) -> Batch<u32> {
    match core.next_step(now) {
        Step::Handle(batch) => batch,
        other => panic!("expected a batch, got {other:?}"),
    }
}

fn events(batch: &Batch<u32>) -> Vec<u32> {
    batch.events().iter().map(|e| e.event).collect()
}

#[test]
fn it_loads_the_offset_then_reads_after_it_and_again_at_once_after_a_full_page() {
    let now = Instant::now();
    let mut core = core(true, options());
    assert!(matches!(core.next_step(now), Step::Load));
    core.handle_loaded(Offset::from_parts(0, 41));
    assert_eq!(core.stats().offset, Offset::from_parts(0, 41));
    match core.next_step(now) {
        Step::Fetch { after, max } => assert_eq!((after, max), (Offset::from_parts(0, 41), 10)),
        other => panic!("{other:?}"),
    }
    core.handle_fetched((42..52).map(|n| item(n, 1)).collect(), true, now);
    for to in [45, 49, 51] {
        let batch = handle(&mut core, now);
        core.handle_processed(now, SystemTime::now());
        assert_eq!(
            batch.to,
            Offset::from_parts(0, to),
            "whole batches of 4 events"
        );
    }
    match core.next_step(now) {
        Step::Fetch { after, .. } => {
            assert_eq!(after, Offset::from_parts(0, 51), "a full page: at once")
        }
        other => panic!("{other:?}"),
    }
    core.handle_fetched(vec![item(52, 1)], false, now);
    handle(&mut core, now);
    core.handle_processed(now, SystemTime::now());
    assert!(
        matches!(core.next_step(now), Step::Wait(at) if at == now + 100 * MS),
        "a short page: the tail, read again after the poll interval"
    );
}

#[test]
fn reads_that_find_nothing_back_off_up_to_the_longest_wait_and_a_notification_cuts_it() {
    let mut now = Instant::now();
    let mut core = running(true, Vec::new(), now);
    let mut waits = Vec::new();
    for _ in 0..8 {
        match core.next_step(now) {
            Step::Wait(at) => {
                waits.push(at - now);
                now = at;
            }
            Step::Fetch { .. } => core.handle_fetched(Vec::new(), false, now),
            other => panic!("{other:?}"),
        }
    }
    assert!(waits[0] <= 100 * MS, "{waits:?}");
    assert!(waits.iter().all(|w| *w <= 1000 * MS), "{waits:?}");
    assert!(
        waits.iter().skip(4).all(|w| *w >= 500 * MS),
        "doubled: {waits:?}"
    );
    assert!(matches!(core.next_step(now), Step::Wait(_)));
    core.handle_notified();
    assert!(
        matches!(core.next_step(now), Step::Fetch { .. }),
        "notified: at once"
    );
}

#[test]
fn batches_hold_whole_entries_up_to_the_batch_size_at_least_one() {
    let now = Instant::now();
    // Batch size 4: [1 (2 events), 2 (2)], [3 (3)], [4 (6: alone, larger than a batch)], [5 (1)].
    let items = vec![item(1, 2), item(2, 2), item(3, 3), item(4, 6), item(5, 1)];
    let mut core = running(true, items, now);
    let mut batches = Vec::new();
    while let Step::Handle(batch) = core.next_step(now) {
        batches.push(events(&batch));
        core.handle_processed(now, SystemTime::now());
    }
    assert_eq!(
        batches,
        [
            vec![10, 11, 20, 21],
            vec![30, 31, 32],
            vec![40, 41, 42, 43, 44, 45],
            vec![50]
        ]
    );
    let stats = core.stats();
    assert_eq!((stats.events, stats.entries, stats.batches), (14, 5, 4));
    assert_eq!(
        stats.offset,
        Offset::from_parts(0, 5),
        "stored with each batch"
    );
}

#[test]
fn at_least_once_stores_the_offset_after_enough_events_after_a_while_and_at_stop() {
    let now = Instant::now();
    // Batches of 4 then 3: after 4 events nothing is due; after 7 (>= 5), the offset.
    let mut core = running(false, (1..=7).map(|n| item(n, 1)).collect(), now);
    handle(&mut core, now);
    core.handle_processed(now, SystemTime::now());
    assert_eq!(
        core.stats().offset,
        Offset::START,
        "not stored with the batch"
    );
    handle(&mut core, now);
    core.handle_processed(now, SystemTime::now());
    assert!(matches!(core.next_step(now), Step::Save(o) if o == Offset::from_parts(0, 7)));
    core.handle_saved(Offset::from_parts(0, 7));
    assert_eq!(core.stats().offset, Offset::from_parts(0, 7));
    assert!(
        core.offset_to_save_at_stop().is_none(),
        "nothing left to store"
    );

    // One event: stored after the commit interval, which the wait does not overshoot.
    core.handle_fetched(vec![item(8, 1)], false, now);
    handle(&mut core, now);
    core.handle_processed(now, SystemTime::now());
    assert_eq!(
        core.offset_to_save_at_stop(),
        Some(Offset::from_parts(0, 8))
    );
    match core.next_step(now + 100 * MS) {
        Step::Fetch { .. } => core.handle_fetched(Vec::new(), false, now + 100 * MS),
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(core.next_step(now + 100 * MS), Step::Wait(at) if at <= now + 500 * MS),
        "woken for the commit"
    );
    assert!(
        matches!(core.next_step(now + 500 * MS), Step::Save(o) if o == Offset::from_parts(0, 8))
    );
}

#[test]
fn a_failing_batch_is_retried_then_its_entries_alone_and_the_one_at_fault_stops_the_projection() {
    let mut now = Instant::now();
    let mut core = running(true, vec![item(1, 1), item(2, 1), item(3, 1)], now);
    assert_eq!(events(&handle(&mut core, now)), [10, 20, 30]);
    let mut waits = Vec::new();
    for _ in 0..2 {
        core.handle_handler_failed("boom", now);
        match core.next_step(now) {
            Step::Wait(at) => {
                waits.push(at - now);
                now = at;
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            events(&handle(&mut core, now)),
            [10, 20, 30],
            "the same batch again"
        );
    }
    assert!(waits[1] >= waits[0], "doubling: {waits:?}");
    // Retries used up: the entries one by one.
    core.handle_handler_failed("boom", now);
    assert_eq!(events(&handle(&mut core, now)), [10]);
    core.handle_processed(now, SystemTime::now());
    assert_eq!(core.stats().offset, Offset::from_parts(0, 1));
    assert_eq!(events(&handle(&mut core, now)), [20]);
    for _ in 0..3 {
        core.handle_handler_failed("entry 2 is bad", now);
        now += 2000 * MS;
        if let Step::Failed(_) = core.next_step(now) {
            break;
        }
        assert_eq!(events(&handle(&mut core, now)), [20]);
    }
    match core.next_step(now) {
        Step::Failed(ProjectionError::Poison {
            projection,
            offset,
            persistence_id,
            seq,
            reason,
        }) => {
            assert_eq!(
                (projection.as_str(), offset, persistence_id.as_str(), seq),
                ("p", Offset::from_parts(0, 2), "s2", 2)
            );
            assert!(
                reason.contains("failed 3 times: entry 2 is bad"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    let stats = core.stats();
    assert_eq!(
        stats.offset,
        Offset::from_parts(0, 1),
        "stopped before the entry at fault"
    );
    assert_eq!((stats.retries, stats.skipped), (5, 0));
}

#[test]
fn with_skip_the_entry_at_fault_is_counted_its_offset_stored_and_the_rest_handled() {
    let now = Instant::now();
    let mut core = core(true, options().max_retries(0).poison(PoisonPolicy::Skip));
    let _ = core.next_step(now);
    core.handle_loaded(Offset::START);
    let _ = core.next_step(now);
    core.handle_fetched(vec![item(1, 1), item(2, 1)], false, now);
    handle(&mut core, now);
    core.handle_handler_failed("boom", now);
    assert_eq!(events(&handle(&mut core, now)), [10], "alone");
    core.handle_handler_failed("entry 1 is bad", now);
    assert!(
        matches!(core.next_step(now), Step::Save(o) if o == Offset::from_parts(0, 1)),
        "the skipped entry's offset, in a transaction of its own"
    );
    core.handle_saved(Offset::from_parts(0, 1));
    assert_eq!(
        events(&handle(&mut core, now)),
        [20],
        "alone: still part of the failed batch"
    );
    core.handle_processed(now, SystemTime::now());
    let stats = core.stats();
    assert_eq!(
        (
            stats.skipped,
            stats.entries,
            stats.events,
            stats.offsets_saved
        ),
        (1, 2, 1, 1)
    );
    assert_eq!(stats.offset, Offset::from_parts(0, 2));
}

#[test]
fn an_unreadable_entry_is_never_retried_and_goes_to_the_policy_at_once() {
    let now = Instant::now();
    let mut stop = running(true, vec![item(1, 1), unreadable(2), item(3, 1)], now);
    assert_eq!(
        events(&handle(&mut stop, now)),
        [10],
        "up to the unreadable entry"
    );
    stop.handle_processed(now, SystemTime::now());
    assert!(matches!(
        stop.next_step(now),
        Step::Failed(ProjectionError::Poison { seq: 2, .. })
    ));
    assert!(matches!(stop.next_step(now), Step::Failed(_)), "for good");

    let mut skip = core(false, options().poison(PoisonPolicy::Skip));
    let _ = skip.next_step(now);
    skip.handle_loaded(Offset::START);
    let _ = skip.next_step(now);
    skip.handle_fetched(vec![unreadable(1), item(2, 1)], false, now);
    assert_eq!(events(&handle(&mut skip, now)), [20]);
    skip.handle_processed(now, SystemTime::now());
    assert_eq!(skip.stats().skipped, 1);
    assert_eq!(skip.stats().retries, 0);
    assert_eq!(
        skip.offset_to_save_at_stop(),
        Some(Offset::from_parts(0, 2))
    );
}

#[test]
fn a_store_failure_drops_what_was_read_and_loads_the_offset_again_after_a_wait() {
    let now = Instant::now();
    let mut core = running(true, vec![item(1, 1), item(2, 1)], now);
    handle(&mut core, now);
    core.handle_store_failed(now);
    let Step::Wait(at) = core.next_step(now) else {
        panic!("a wait first");
    };
    assert!(at > now);
    assert!(matches!(core.next_step(at), Step::Load));
    // The commit went through after all: the store says so, and reading goes on after it.
    core.handle_loaded(Offset::from_parts(0, 2));
    assert!(
        matches!(core.next_step(at), Step::Fetch { after, .. } if after == Offset::from_parts(0, 2))
    );
    assert_eq!(core.stats().store_failures, 1);
}

#[test]
fn a_failed_read_is_tried_again_after_a_wait() {
    let now = Instant::now();
    let mut core = running(true, Vec::new(), now);
    core.handle_notified();
    assert!(matches!(core.next_step(now), Step::Fetch { .. }));
    core.handle_fetch_failed(now);
    assert!(matches!(core.next_step(now), Step::Wait(at) if at > now));
    assert!(matches!(
        core.next_step(now + 2000 * MS),
        Step::Fetch { .. }
    ));
    assert_eq!(core.stats().read_failures, 1);
}

#[test]
fn a_batch_built_on_an_offset_another_instance_moved_is_counted_and_the_offset_loaded_again() {
    let now = Instant::now();
    let mut core = running(true, vec![item(1, 1), item(2, 1)], now);
    assert_eq!(
        core.stored(),
        Offset::START,
        "the batch builds on the loaded offset"
    );
    handle(&mut core, now);
    core.handle_conflict(now);
    let Step::Wait(at) = core.next_step(now) else {
        panic!("a wait first");
    };
    assert!(matches!(core.next_step(at), Step::Load));
    core.handle_loaded(Offset::from_parts(0, 2));
    assert_eq!(core.stored(), Offset::from_parts(0, 2));
    assert_eq!(
        (core.stats().conflicts, core.stats().store_failures),
        (1, 0)
    );
}

#[test]
fn a_refused_projection_stops_with_the_reason_and_does_nothing_more() {
    let now = Instant::now();
    let mut core = core(true, options());
    assert!(matches!(core.next_step(now), Step::Load));
    let error = ProjectionError::Refused {
        projection: "p".into(),
        reason: "slices".into(),
    };
    core.handle_refused(error.clone());
    for _ in 0..2 {
        assert!(matches!(core.next_step(now), Step::Failed(e) if e == error));
    }
}
