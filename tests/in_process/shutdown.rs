//! The coordinated shutdown (`actix_delivery::shutdown`): phases in order, the tasks of a phase
//! at once, one deadline for the whole run, one run however often it is asked for, and the
//! parts of this crate stopped for real. Under virtual time.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::durable::DurableOptions;
use actix_delivery::journal::{Journal, MemoryJournal, PersistenceId};
use actix_delivery::shutdown::{Phase, Shutdown, TaskOutcome};
use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerOptions, ReliableDelivery};

/// A task that records `name` when it begins and ends after `takes`.
fn timed(
    events: &Rc<RefCell<Vec<String>>>,
    name: &'static str,
    takes: Duration,
) -> impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>>>> + use<>
{
    let events = events.clone();
    move || {
        events.borrow_mut().push(format!("{name} begins"));
        Box::pin(async move {
            tokio::time::sleep(takes).await;
            events.borrow_mut().push(format!("{name} ends"));
            Ok(())
        })
    }
}

#[actix::test]
async fn phases_run_in_order_and_the_tasks_of_a_phase_at_once() {
    tokio::time::pause();
    let shutdown = Shutdown::new(Duration::from_secs(30)).unwrap();
    let events = Rc::new(RefCell::new(Vec::new()));
    // Registered out of order: the phase decides, not the registration.
    shutdown.add_task(
        Phase::Journals,
        "journal",
        timed(&events, "journal", Duration::ZERO),
    );
    shutdown.add_task(
        Phase::Producers,
        "p1",
        timed(&events, "p1", Duration::from_secs(2)),
    );
    shutdown.add_task(
        Phase::Producers,
        "p2",
        timed(&events, "p2", Duration::from_secs(1)),
    );
    shutdown.add_task(
        Phase::Unready,
        "unready",
        timed(&events, "unready", Duration::ZERO),
    );
    assert!(!shutdown.is_shutting_down());
    let watch = shutdown.watch();

    let started = tokio::time::Instant::now();
    let report = shutdown.run("a test").await;

    assert!(shutdown.is_shutting_down() && watch.is_shutting_down());
    assert_eq!(
        *events.borrow(),
        [
            "unready begins",
            "unready ends",
            "p1 begins",
            "p2 begins",
            "p2 ends",
            "p1 ends",
            "journal begins",
            "journal ends"
        ]
    );
    // The producers ran at once: 2 s in all (and the timer's millisecond steps), not 3.
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_millis(2100),
        "{took:?}"
    );
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.reason, "a test");
    let producers = &report.phases[3];
    assert_eq!(producers.phase, Phase::Producers);
    let names: Vec<_> = producers.tasks.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["p1", "p2"], "in the order registered");
    assert_eq!(report.phases.len(), Phase::ALL.len());
    assert_eq!(report.tasks().count(), 4);
}

#[actix::test]
async fn the_deadline_times_out_the_phase_it_cuts_and_the_phases_after_it_are_begun_not_awaited() {
    tokio::time::pause();
    let shutdown = Shutdown::new(Duration::from_secs(5)).unwrap();
    let events = Rc::new(RefCell::new(Vec::new()));
    shutdown.add_task(
        Phase::Drain,
        "quick",
        timed(&events, "quick", Duration::from_secs(1)),
    );
    shutdown.add_task(
        Phase::Drain,
        "stuck",
        timed(&events, "stuck", Duration::from_secs(3600)),
    );
    shutdown.add_task(
        Phase::Producers,
        "producer",
        timed(&events, "producer", Duration::from_secs(1)),
    );

    let started = tokio::time::Instant::now();
    let report = shutdown.run("a test").await;

    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_millis(5100),
        "the deadline, no longer: {took:?}"
    );
    assert!(!report.is_clean());
    let drain = report
        .phases
        .iter()
        .find(|p| p.phase == Phase::Drain)
        .unwrap();
    let outcomes: Vec<_> = drain.tasks.iter().map(|t| t.outcome.clone()).collect();
    assert_eq!(outcomes, [TaskOutcome::Done, TaskOutcome::TimedOut]);
    assert!(!drain.past_deadline);
    let producers = report
        .phases
        .iter()
        .find(|p| p.phase == Phase::Producers)
        .unwrap();
    assert!(producers.past_deadline);
    assert_eq!(producers.tasks[0].outcome, TaskOutcome::NotAwaited);
    // Begun all the same: a part past the deadline is still asked to stop.
    assert!(events.borrow().contains(&"producer begins".to_owned()));
    assert!(!events.borrow().contains(&"producer ends".to_owned()));
    // Phases without tasks are not marked.
    let entities = report
        .phases
        .iter()
        .find(|p| p.phase == Phase::Entities)
        .unwrap();
    assert!(!entities.past_deadline);
    let text = report.to_string();
    assert!(
        text.contains("stuck timed out") && text.contains("producer begun after the deadline"),
        "{text}"
    );
}

#[actix::test]
async fn a_panicking_task_is_reported_failed_and_the_run_goes_on() {
    tokio::time::pause();
    let shutdown = Shutdown::new(Duration::from_secs(5)).unwrap();
    let events = Rc::new(RefCell::new(Vec::new()));
    shutdown.add_task(
        Phase::Producers,
        "panics at once",
        || -> std::future::Ready<Result<(), String>> { panic!("at once") },
    );
    shutdown.add_task(Phase::Producers, "panics later", || async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        panic!("later")
    });
    shutdown.add_task(
        Phase::Journals,
        "journal",
        timed(&events, "journal", Duration::ZERO),
    );

    let report = shutdown.clone().run("a test").await;

    let outcomes: Vec<_> = report
        .tasks()
        .filter(|(phase, _)| *phase == Phase::Producers)
        .map(|(_, task)| task.outcome.clone())
        .collect();
    assert_eq!(
        outcomes,
        [
            TaskOutcome::Failed("panicked: at once".into()),
            TaskOutcome::Failed("panicked: later".into())
        ]
    );
    assert_eq!(*events.borrow(), ["journal begins", "journal ends"]);
    // A second caller gets the report, not a poisoned run.
    assert_eq!(shutdown.run("again").await.reason, "a test");
}

#[actix::test]
async fn the_run_goes_on_when_its_future_is_dropped() {
    tokio::time::pause();
    let shutdown = Shutdown::new(Duration::from_secs(5)).unwrap();
    let events = Rc::new(RefCell::new(Vec::new()));
    shutdown.add_task(Phase::Unready, "unready", {
        let watch = shutdown.watch();
        let events = events.clone();
        move || {
            events.borrow_mut().push(format!(
                "unready sees shutting down: {}",
                watch.is_shutting_down()
            ));
            async { Ok(()) }
        }
    });
    shutdown.add_task(
        Phase::Producers,
        "producer",
        timed(&events, "producer", Duration::from_secs(1)),
    );
    drop(shutdown.run("dropped at once"));
    assert!(shutdown.is_shutting_down(), "from the call on");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        *events.borrow(),
        [
            "unready sees shutting down: true",
            "producer begins",
            "producer ends"
        ]
    );
    assert!(shutdown.run("later").await.is_clean());
}

#[actix::test]
async fn a_failing_task_is_reported_with_its_reason_and_the_run_goes_on() {
    tokio::time::pause();
    let shutdown = Shutdown::new(Duration::from_secs(5)).unwrap();
    let events = Rc::new(RefCell::new(Vec::new()));
    shutdown.add_task(Phase::Producers, "fails", || async {
        Err("its journal is gone".to_owned())
    });
    shutdown.add_task(
        Phase::Journals,
        "journal",
        timed(&events, "journal", Duration::ZERO),
    );

    let report = shutdown.run("a test").await;

    let failed = &report
        .phases
        .iter()
        .find(|p| p.phase == Phase::Producers)
        .unwrap()
        .tasks[0];
    assert_eq!(
        failed.outcome,
        TaskOutcome::Failed("its journal is gone".into())
    );
    assert_eq!(*events.borrow(), ["journal begins", "journal ends"]);
    assert!(report
        .to_string()
        .contains("fails failed: its journal is gone"));
}

#[actix::test]
async fn a_second_run_or_a_late_task_runs_nothing_again() {
    tokio::time::pause();
    let shutdown = Shutdown::new(Duration::from_secs(5)).unwrap();
    let runs = Rc::new(RefCell::new(0));
    let counted = runs.clone();
    shutdown.add_task(Phase::Producers, "once", move || {
        *counted.borrow_mut() += 1;
        async { Ok(()) }
    });
    let first = shutdown.run("first");
    let late = Rc::new(RefCell::new(false));
    let ran = late.clone();
    shutdown.add_task(Phase::Journals, "late", move || {
        *ran.borrow_mut() = true;
        async { Ok(()) }
    });
    let (first, second) = tokio::join!(first, shutdown.clone().run("second"));
    assert_eq!(*runs.borrow(), 1);
    assert!(
        !*late.borrow(),
        "a task registered after the run began is not run"
    );
    assert_eq!(
        (first.reason.as_str(), second.reason.as_str()),
        ("first", "first")
    );
}

#[test]
fn a_zero_deadline_is_refused_naming_it() {
    let error = Shutdown::new(Duration::ZERO).unwrap_err();
    assert_eq!(error.field, "deadline", "{error}");
}

/// The parts of this crate, registered as they are: every one has stopped when the run
/// resolves.
#[actix::test]
async fn the_crates_parts_stop_for_real_in_their_phases() {
    tokio::time::pause();
    let journal = Arc::new(MemoryJournal::new());
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(|_: String| async {
            Ok::<(), std::io::Error>(())
        }))
        .build()
        .unwrap(),
    );
    let stream = PersistenceId::new("orders").unwrap();
    let producer = ReliableDelivery::durable_producer(
        ProducerOptions::builder(&consumer).build().unwrap(),
        DurableOptions::new(journal.clone(), stream.clone(), "orders-api"),
    )
    .unwrap();
    producer.opened().await.unwrap();
    producer.send("espresso".to_owned()).await.unwrap();

    let shutdown = Shutdown::new(Duration::from_secs(30)).unwrap();
    shutdown.add(Phase::Producers, "orders", &producer);
    shutdown.add(Phase::Entities, "consumer", &consumer);
    let report = shutdown.run("a test").await;

    assert!(report.is_clean(), "{report}");
    // Stopped: their `stopped()` have resolved.
    tokio::time::timeout(Duration::from_secs(1), producer.stopped())
        .await
        .expect("stopped")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(1), consumer.stopped())
        .await
        .expect("stopped");
    assert!(
        journal.highest_seq(&stream).await.unwrap() > 0,
        "the stream was written"
    );
}
