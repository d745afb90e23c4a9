//! Kept dead letters: given-up jobs kept with their bodies and ids, replayed into an
//! effectively-once entity once however often the replay is repeated, and the errors that
//! change nothing.

use std::sync::Arc;
use std::time::Duration;

use actix_delivery::codec::Codec;
use actix_delivery::dead_letters::{
    delivery_key, DeadLetterCause, DeadLetterError, DeadLetterFilter, DeadLetterLimits,
    DeadLetters, MemoryDeadLetters, NewDeadLetter, Replay, Replayed, RouteError, SourceKind,
};
use actix_delivery::journal::MemoryJournal;
use actix_delivery::persistence::{Outcome, PersistentHandle, PersistentOptions};
use actix_delivery::work_pulling::{Job, WorkPullingOptions, WorkerRegistry};
use actix_delivery::{
    ConsumerOptions, DeliveryError, DeliveryHandler, Happened, Limit, ProducerConfig,
    ProducerOptions, ReliableDelivery,
};

use crate::common;
use common::dead_letters::FaultyDeadLetters;
use common::entities::{ledger_id, Ledger, Op};
use common::settle_for;

/// A pool whose only worker fails job 13, giving it up after 2 failures into `dead_letters`.
fn pool_giving_up_13(
    dead_letters: &DeadLetters,
) -> (
    WorkerRegistry<u64>,
    impl Sized,
    actix_delivery::work_pulling::WorkPullingHandle<u64>,
) {
    let registry = WorkerRegistry::new();
    let handler = DeliveryHandler::from_fn(|job: Job<u64>| async move {
        match job.body {
            13 => Err("job 13 cannot be parsed".to_owned()),
            _ => Ok(()),
        }
    });
    let worker = ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
    registry.register_consumer("a", &worker).unwrap();
    let options = WorkPullingOptions::builder(&registry)
        .worker(ProducerConfig {
            resend_timeout: Duration::from_millis(100),
            max_attempts: Limit::At(1),
            ..ProducerConfig::default()
        })
        .give_up_after(2)
        .keep_dead_letters(dead_letters.clone(), "jobs")
        .build()
        .unwrap();
    (
        registry,
        worker,
        ReliableDelivery::work_pulling_producer(options),
    )
}

/// Replays `jobs` entries into `ledger`, effectively once on the replay's id.
fn route_into(dead_letters: &DeadLetters, ledger: &PersistentHandle<Ledger>) {
    let ledger = ledger.clone();
    dead_letters.on_replay("jobs", move |replay: Replay<u64>| {
        let answer = ledger.ask_delivered(replay.info, Op::Apply(replay.body));
        async move {
            match answer.await {
                Ok(Outcome::Done(_)) => Ok(Replayed::Applied),
                Ok(Outcome::AlreadyProcessed) => Ok(Replayed::AlreadyApplied),
                Err(error) => Err(error.to_string().into()),
            }
        }
    });
}

#[actix::test]
async fn a_given_up_job_is_kept_with_its_body_id_and_failures() {
    tokio::time::pause();
    let dead_letters =
        DeadLetters::new(MemoryDeadLetters::new(DeadLetterLimits::default()).unwrap());
    let (_registry, _worker, jobs) = pool_giving_up_13(&dead_letters);
    let outcome = tokio::time::timeout(Duration::from_secs(600), jobs.send(13))
        .await
        .unwrap();
    assert!(
        matches!(
            outcome,
            Err(DeliveryError::HandlingFailed { attempts: 2, .. })
        ),
        "{outcome:?}"
    );
    settle_for(10).await;
    let page = dead_letters
        .list(DeadLetterFilter {
            cause: Some(DeadLetterCause::GivenUp),
            ..DeadLetterFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(page.entries.len(), 1);
    let letter = &page.entries[0].letter;
    assert_eq!(
        (letter.kind, letter.source.as_str(), letter.attempts),
        (SourceKind::WorkPulling, "jobs", 2)
    );
    let origin = letter.origin.as_ref().expect("the job's stable id");
    assert_eq!((&origin.producer_id, origin.seq), (jobs.producer_id(), 1));
    assert_eq!(letter.key, delivery_key(origin));
    assert_eq!(letter.manifest.codec(), Some(Codec::MessagePack));
    assert_eq!(letter.manifest.name(), "u64");
    let body = letter.body.as_ref().expect("its body");
    assert_eq!(Codec::MessagePack.decode::<u64>(body, 64).unwrap(), 13);
    assert!(letter.error.contains("did not confirm"), "{}", letter.error);
}

#[actix::test]
async fn a_replay_is_applied_once_even_when_repeated_after_it_applied() {
    tokio::time::pause();
    let store = FaultyDeadLetters::new();
    let dead_letters = DeadLetters::new(store.clone());
    let (_registry, _worker, jobs) = pool_giving_up_13(&dead_letters);
    let _ = tokio::time::timeout(Duration::from_secs(600), jobs.send(13))
        .await
        .unwrap();
    settle_for(10).await;
    let id = dead_letters
        .list(DeadLetterFilter::default())
        .await
        .unwrap()
        .entries[0]
        .id;
    let journal = MemoryJournal::new();
    let ledger =
        PersistentHandle::<Ledger>::start(PersistentOptions::new(Arc::new(journal), ledger_id()))
            .unwrap();
    route_into(&dead_letters, &ledger);

    store.fail_next_remove();
    let first = dead_letters.replay(id).await;
    assert_eq!(store.injected(), 1, "the fault was injected");
    let error = first.unwrap_err();
    assert_eq!(
        error.happened(),
        Happened::FailedAfter,
        "applied, not removed: {error}"
    );
    assert!(
        dead_letters.get(id).await.is_ok(),
        "still listed after the failed removal"
    );
    assert_eq!(
        dead_letters.replay(id).await.unwrap(),
        Replayed::AlreadyApplied
    );
    assert_eq!(
        dead_letters.replay(id).await,
        Err(DeadLetterError::NotFound(id))
    );
    assert_eq!(ledger.ask(Op::Total).await.unwrap(), 1, "applied once");
    let stats = dead_letters.stats();
    assert_eq!((stats.replayed, stats.already_applied), (1, 1));
    assert_eq!(dead_letters.counts().await.unwrap().entries, 0);
}

#[actix::test]
async fn replays_that_cannot_go_change_nothing_and_say_why() {
    let dead_letters =
        DeadLetters::new(MemoryDeadLetters::new(DeadLetterLimits::default()).unwrap());
    let keep = |source: &str, body: Option<Vec<u8>>| NewDeadLetter {
        kind: SourceKind::WorkPulling,
        source: source.into(),
        cause: DeadLetterCause::GivenUp,
        key: "k".into(),
        origin: None,
        manifest: actix_delivery::codec::Manifest::new(Codec::MessagePack, "Order", 3),
        body_len: body.as_ref().map_or(7, Vec::len) as u64,
        body,
        attempts: 1,
        error: "e".into(),
    };
    let text = Codec::MessagePack.encode("not a number", 64).unwrap();
    let unread = dead_letters
        .keep(keep("jobs", Some(text)))
        .await
        .unwrap()
        .id;
    let no_body = dead_letters.keep(keep("big", None)).await.unwrap().id;
    let no_route = dead_letters
        .keep(keep("nobody", Some(vec![1])))
        .await
        .unwrap()
        .id;
    dead_letters.on_replay("jobs", |_: Replay<u64>| async { Ok(Replayed::Applied) });
    dead_letters.on_replay("big", |_: Replay<u64>| async { Ok(Replayed::Applied) });
    fn failed<T: std::fmt::Debug>(result: Result<T, DeadLetterError>) -> String {
        let error = result.unwrap_err();
        assert_eq!(error.happened(), Happened::CertainlyNot, "{error}");
        error.to_string()
    }
    let why = failed(dead_letters.replay(unread).await);
    assert!(
        why.contains("type `Order` version 3") && why.contains("u64"),
        "{why}"
    );
    assert!(failed(dead_letters.replay(no_body).await).contains("was not kept"));
    assert!(
        failed(dead_letters.replay(no_route).await).contains("no replay route for source `nobody`")
    );
    assert!(failed(dead_letters.replay(99).await).contains("no dead letter 99"));
    assert!(failed(dead_letters.delete(99).await).contains("no dead letter 99"));
    let counts = dead_letters.counts().await.unwrap();
    assert_eq!(counts.entries, 3, "nothing changed");
    for id in [unread, no_body, no_route] {
        assert_eq!(dead_letters.get(id).await.unwrap().replay_failures, 0);
    }
    dead_letters.delete(no_route).await.unwrap();
    assert_eq!(dead_letters.counts().await.unwrap().entries, 2);
}

#[actix::test]
async fn a_failed_replay_says_what_its_route_said_about_the_destination() {
    let dead_letters =
        DeadLetters::new(MemoryDeadLetters::new(DeadLetterLimits::default()).unwrap());
    let from = |source: &str, body| NewDeadLetter {
        source: source.into(),
        ..given_up("k", body)
    };
    let refused = dead_letters.keep(from("refusing", 1)).await.unwrap().id;
    let lost = dead_letters.keep(from("down", 2)).await.unwrap().id;
    dead_letters.on_replay("refusing", |replay: Replay<u64>| async move {
        Err(RouteError::certainly_not(format!(
            "{} is rejected",
            replay.body
        )))
    });
    dead_letters.on_replay("down", |_: Replay<u64>| async { Err("no answer".into()) });
    let error = dead_letters.replay(refused).await.unwrap_err();
    assert_eq!(error.happened(), Happened::CertainlyNot, "{error}");
    assert!(
        error
            .to_string()
            .contains("(the destination did not apply it): 1 is rejected"),
        "{error}"
    );
    let error = dead_letters.replay(lost).await.unwrap_err();
    assert_eq!(error.happened(), Happened::InDoubt, "{error}");
    assert!(error.to_string().contains("no answer"), "{error}");
    // Both stay, their failures noted.
    for (id, why) in [(refused, "1 is rejected"), (lost, "no answer")] {
        let entry = dead_letters.get(id).await.unwrap();
        assert_eq!((entry.replay_failures, &*entry.letter.error), (1, why));
    }
    assert_eq!(dead_letters.stats().replay_failures, 2);
}

#[actix::test]
async fn a_message_a_producer_gives_up_is_kept_with_its_body_and_delivery_id() {
    tokio::time::pause();
    let dead_letters =
        DeadLetters::new(MemoryDeadLetters::new(DeadLetterLimits::default()).unwrap());
    let refusing = DeliveryHandler::from_fn(|_: String| async { Err("never".to_owned()) });
    let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(refusing).build().unwrap());
    let options = ProducerOptions::builder(&consumer)
        .max_attempts(2)
        .resend_timeout(Duration::from_millis(100))
        .keep_dead_letters(dead_letters.clone(), "orders")
        .build()
        .unwrap();
    let orders = ReliableDelivery::producer(options);
    let outcome = orders.send("order 7".to_owned()).await;
    assert_eq!(outcome, Err(DeliveryError::GaveUp { attempts: 2 }));
    settle_for(10).await;
    let page = dead_letters
        .list(DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(page.entries.len(), 1);
    let letter = &page.entries[0].letter;
    assert_eq!(
        (
            letter.kind,
            letter.source.as_str(),
            letter.cause,
            letter.attempts
        ),
        (SourceKind::Producer, "orders", DeadLetterCause::GivenUp, 2)
    );
    let origin = letter.origin.as_ref().unwrap();
    assert_eq!((&origin.producer_id, origin.seq), (orders.producer_id(), 1));
    let body = letter.body.as_ref().unwrap();
    assert_eq!(
        Codec::MessagePack.decode::<String>(body, 64).unwrap(),
        "order 7"
    );
}

#[actix::test]
async fn keeping_dead_letters_with_chunk_size_is_refused_naming_the_option() {
    let dead_letters =
        DeadLetters::new(MemoryDeadLetters::new(DeadLetterLimits::default()).unwrap());
    let handler = DeliveryHandler::from_fn(|_: Vec<u8>| async { Ok::<(), String>(()) });
    let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
    let refused = ProducerOptions::builder(&consumer)
        .chunk_size(1024)
        .keep_dead_letters(dead_letters, "blobs")
        .build()
        .unwrap_err();
    assert_eq!(refused.field, "keep_dead_letters");
    let refused = DeadLetterLimits {
        sample_burst: 0,
        ..DeadLetterLimits::default()
    };
    assert_eq!(
        MemoryDeadLetters::new(refused).err().unwrap().field,
        "sample_burst"
    );
}

fn given_up(key: &str, body: u64) -> NewDeadLetter {
    let body = Codec::MessagePack.encode(&body, 64).unwrap();
    NewDeadLetter {
        kind: SourceKind::WorkPulling,
        source: "jobs".into(),
        cause: DeadLetterCause::GivenUp,
        key: key.into(),
        origin: None,
        manifest: actix_delivery::codec::Manifest::new(Codec::MessagePack, "u64", 1),
        body_len: body.len() as u64,
        body: Some(body),
        attempts: 1,
        error: "e".into(),
    }
}

#[actix::test]
async fn keeps_in_flight_to_a_hanging_store_are_bounded_and_the_rest_counted() {
    use actix_delivery::dead_letters::MAX_RECORDING;
    let store = FaultyDeadLetters::new();
    store.hang_keeps();
    let dead_letters = DeadLetters::new(store);
    for n in 0..MAX_RECORDING + 6 {
        dead_letters.record(given_up(&n.to_string(), n));
    }
    settle_for(10).await;
    assert_eq!(
        dead_letters.stats().keep_failures,
        6,
        "beyond the bound, counted"
    );
}

#[actix::test]
async fn a_second_replay_of_an_entry_being_replayed_is_refused_as_busy() {
    let dead_letters =
        DeadLetters::new(MemoryDeadLetters::new(DeadLetterLimits::default()).unwrap());
    let id = dead_letters.keep(given_up("a", 1)).await.unwrap().id;
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let released = std::sync::Mutex::new(Some(released));
    dead_letters.on_replay("jobs", move |_: Replay<u64>| {
        let released = released.lock().unwrap().take();
        async move {
            if let Some(released) = released {
                let _ = released.await;
            }
            Ok(Replayed::Applied)
        }
    });
    let first = actix::spawn({
        let dead_letters = dead_letters.clone();
        async move { dead_letters.replay(id).await }
    });
    settle_for(1).await;
    assert_eq!(
        dead_letters.replay(id).await,
        Err(DeadLetterError::Busy(id))
    );
    release.send(()).unwrap();
    assert_eq!(first.await.unwrap(), Ok(Replayed::Applied));
    assert_eq!(dead_letters.stats().replayed, 1);
}

#[actix::test]
async fn a_replay_dropped_unfinished_lets_go_of_its_entry() {
    let dead_letters =
        DeadLetters::new(MemoryDeadLetters::new(DeadLetterLimits::default()).unwrap());
    let id = dead_letters.keep(given_up("a", 1)).await.unwrap().id;
    let hang = std::sync::atomic::AtomicBool::new(true);
    dead_letters.on_replay("jobs", move |_: Replay<u64>| {
        let hang = hang.swap(false, std::sync::atomic::Ordering::SeqCst);
        async move {
            if hang {
                std::future::pending::<()>().await;
            }
            Ok(Replayed::Applied)
        }
    });
    // A caller that gives up waiting (an HTTP request cancelled, a timeout).
    let abandoned = tokio::time::timeout(Duration::from_millis(20), dead_letters.replay(id)).await;
    assert!(abandoned.is_err(), "the first replay hangs");
    assert_eq!(dead_letters.replay(id).await, Ok(Replayed::Applied));
}

#[actix::test]
async fn a_replay_goes_under_a_stream_of_its_store_and_source_past_every_id_gone() {
    let stores: Vec<DeadLetters> = (0..2)
        .map(|_| DeadLetters::new(MemoryDeadLetters::new(DeadLetterLimits::default()).unwrap()))
        .collect();
    let (a, b) = (&stores[0], &stores[1]);
    assert_ne!(
        a.replay_info("jobs", 1).producer_id,
        b.replay_info("jobs", 1).producer_id,
        "two stores, two streams"
    );
    assert_ne!(
        a.replay_info("jobs", 1).producer_id,
        a.replay_info("orders", 1).producer_id
    );
    let long = "é".repeat(400);
    assert!(a.replay_info(&long, 1).producer_id.as_str().len() <= 256);
    let ids: Vec<u64> =
        futures_util::future::join_all((0..3).map(|n| a.keep(given_up(&n.to_string(), n))))
            .await
            .into_iter()
            .map(|kept| kept.unwrap().id)
            .collect();
    a.delete(ids[0]).await.unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    a.on_replay("jobs", move |replay: Replay<u64>| {
        log.lock().unwrap().push(replay.info);
        async { Ok(Replayed::Applied) }
    });
    a.replay(ids[2]).await.unwrap();
    let info = seen.lock().unwrap()[0].clone();
    assert_eq!(
        (info.seq, info.window_start),
        (ids[2], ids[1]),
        "ids below the oldest are gone"
    );
    assert_eq!(info.producer_id, a.replay_info("jobs", ids[2]).producer_id);
}
