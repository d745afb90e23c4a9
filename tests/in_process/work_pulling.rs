//! Work pulling with actors, under virtual time: jobs follow demand, a slow worker gets fewer,
//! a worker that stops has its jobs re-routed, a job that fails at a worker moves on while
//! the worker rests, a job that fails everywhere is given up (and, with a durable producer,
//! stays given up across restarts), the registry churns, persistent workers recognise a
//! re-routed job by its stable id, and a durable producer resends its unconfirmed jobs under
//! their ids after a restart.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::durable::DurableOptions;
use actix_delivery::journal::{MemoryJournal, PersistenceId};
use actix_delivery::persistence::{recover_state, PersistentHandle, PersistentOptions};
use actix_delivery::work_pulling::{
    GivenUpJob, Job, RegisterError, WorkPullingHandle, WorkPullingOptions, WorkerRegistry,
};
use actix_delivery::{
    ConsumerHandle, ConsumerOptions, ConsumerRef, Delivery, DeliveryError, DeliveryHandler, Limit,
    ProducerConfig, ReliableDelivery, ReplyTo,
};
use common::entities::{ledger_id, Ledger, Op};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::{confirm_into, settle, settle_for, Confirmations, Gate, Log};

/// A worker whose handler takes `work` of virtual time and records (worker, job body).
fn worker(
    name: &'static str,
    work: Duration,
    log: &Log<(&'static str, u64)>,
) -> ConsumerHandle<Job<u64>> {
    let log = log.clone();
    let handler = DeliveryHandler::from_fn(move |job: Job<u64>| {
        let log = log.clone();
        async move {
            tokio::time::sleep(work).await;
            log.push((name, job.body));
            Ok::<(), String>(())
        }
    });
    ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap())
}

/// The default options of a pool of `registry`'s workers.
fn options_for(registry: &WorkerRegistry<u64>) -> WorkPullingOptions<u64> {
    WorkPullingOptions::builder(registry).build().unwrap()
}

fn options(registry: &WorkerRegistry<u64>, worker_window: usize) -> WorkPullingOptions<u64> {
    let worker = ProducerConfig {
        window_size: worker_window,
        resend_timeout: Duration::from_millis(100),
        ..ProducerConfig::default()
    };
    WorkPullingOptions::builder(registry)
        .worker(worker)
        .build()
        .unwrap()
}

fn tell_all(jobs: &WorkPullingHandle<u64>, range: std::ops::Range<u64>, log: &Confirmations<u64>) {
    for n in range {
        jobs.tell(n, confirm_into(log, n)).unwrap();
    }
}

/// Each of `expected` confirmed exactly once, and `Ok`.
fn assert_confirmed_once(log: &Confirmations<u64>, expected: std::ops::Range<u64>) {
    let mut seen = BTreeMap::new();
    for (n, result) in log.snapshot() {
        assert_eq!(result, Ok(()), "job {n}");
        *seen.entry(n).or_insert(0) += 1;
    }
    let want: BTreeMap<u64, i32> = expected.map(|n| (n, 1)).collect();
    assert_eq!(seen, want, "every job confirmed exactly once");
}

fn count(log: &Log<(&'static str, u64)>, name: &str) -> usize {
    log.snapshot().iter().filter(|(w, _)| *w == name).count()
}

#[actix::test]
async fn jobs_go_to_every_worker_with_demand_and_each_is_confirmed_once() {
    tokio::time::pause();
    let (registry, handled, confirmed) = (WorkerRegistry::new(), Log::default(), Log::default());
    for name in ["a", "b", "c"] {
        registry
            .register_consumer(name, &worker(name, Duration::from_millis(5), &handled))
            .unwrap();
    }
    let jobs = ReliableDelivery::work_pulling_producer(options(&registry, 4));
    tell_all(&jobs, 0..300, &confirmed);
    jobs.idle().await;
    assert_confirmed_once(&confirmed, 0..300);
    for name in ["a", "b", "c"] {
        assert!(
            count(&handled, name) >= 80,
            "{name}: {}",
            count(&handled, name)
        );
    }
    let stats = jobs.pool_stats().await.unwrap();
    assert_eq!(
        (stats.workers, stats.confirmed, stats.jobs, stats.rerouted),
        (3, 300, 0, 0)
    );
    assert!(stats.per_worker.iter().all(|w| w.in_flight == 0));
}

/// ACKs a worker forges (a mangled stream id, the next stream number, another token, a seq
/// never sent) are counted and confirm nothing: every job is confirmed once, by its own ACK.
/// The worker streams' numbers are random, so a worker cannot name its neighbour's stream.
#[actix::test]
async fn forged_acks_from_a_worker_are_counted_and_confirm_nothing() {
    use actix_delivery::{Ack, Incarnation, ProducerId};
    tokio::time::pause();
    let (registry, handled, confirmed) = (WorkerRegistry::new(), Log::default(), Log::default());
    let stream_number = |id: &str| {
        let (prefix, number) = id.split_at(id.len() - 16);
        (
            prefix.to_owned(),
            u64::from_str_radix(number, 16).expect("a stream number"),
        )
    };
    let numbers = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let real = worker("w", Duration::from_millis(1), &handled);
    let target = real.consumer_ref();
    let deliveries = Arc::new(AtomicU64::new(0));
    let (seen, seen_numbers) = (deliveries.clone(), numbers.clone());
    let forger = ConsumerRef::from_fn(move |ds: Vec<Delivery<Job<u64>>>| {
        let _keep = &real;
        for d in &ds {
            seen.fetch_add(1, Ordering::SeqCst);
            let reply_to = d.reply_to.clone().expect("the pool wants ACKs");
            let (prefix, number) = stream_number(d.producer_id.as_str());
            seen_numbers.lock().unwrap().insert(number);
            let next_stream = ProducerId::from(format!("{prefix}{:016x}", number + 1));
            let other_token = Incarnation::from_u128(d.incarnation.as_u128() ^ 1);
            for (producer_id, incarnation, seq) in [
                (ProducerId::from("nonsense"), d.incarnation, d.seq),
                (next_stream, d.incarnation, d.seq),
                (d.producer_id.clone(), other_token, d.seq),
                (d.producer_id.clone(), d.incarnation, d.seq + 1_000_000),
            ] {
                reply_to.do_send(Ack {
                    producer_id,
                    incarnation,
                    seq,
                });
            }
        }
        target.do_send_all(ds.into_iter());
    });
    let honest = worker("v", Duration::from_millis(1), &handled);
    let honest_target = honest.consumer_ref();
    let honest_numbers = numbers.clone();
    let honest_link = ConsumerRef::from_fn(move |ds: Vec<Delivery<Job<u64>>>| {
        let _keep = &honest;
        for d in &ds {
            let (_, number) = stream_number(d.producer_id.as_str());
            honest_numbers.lock().unwrap().insert(number);
        }
        honest_target.do_send_all(ds.into_iter());
    });
    registry.register("w", forger).unwrap();
    registry.register("v", honest_link).unwrap();
    let jobs = ReliableDelivery::work_pulling_producer(options(&registry, 4));
    tell_all(&jobs, 0..50, &confirmed);
    jobs.idle().await;
    assert_confirmed_once(&confirmed, 0..50);
    assert_eq!(
        count(&handled, "w") + count(&handled, "v"),
        50,
        "each job handled once"
    );
    assert!(count(&handled, "v") > 0, "both workers took jobs");
    let numbers: Vec<u64> = numbers.lock().unwrap().iter().copied().collect();
    assert_eq!(numbers.len(), 2, "one stream per worker: {numbers:x?}");
    assert!(
        numbers[1] - numbers[0] > 1,
        "the streams' numbers are not consecutive: {numbers:x?}"
    );
    let stats = jobs.pool_stats().await.unwrap();
    assert_eq!(
        stats.ignored_acks,
        4 * deliveries.load(Ordering::SeqCst),
        "{stats:?}"
    );
    assert!(stats.per_worker.iter().all(|w| w.in_flight == 0));
}

#[actix::test]
async fn a_slow_worker_gets_proportionally_fewer_jobs() {
    tokio::time::pause();
    let (registry, handled, confirmed) = (WorkerRegistry::new(), Log::default(), Log::default());
    registry
        .register_consumer("fast", &worker("fast", Duration::from_millis(5), &handled))
        .unwrap();
    registry
        .register_consumer("slow", &worker("slow", Duration::from_millis(50), &handled))
        .unwrap();
    let jobs = ReliableDelivery::work_pulling_producer(options(&registry, 2));
    tell_all(&jobs, 0..1_000, &confirmed);
    jobs.idle().await;
    assert_confirmed_once(&confirmed, 0..1_000);
    let (fast, slow) = (count(&handled, "fast"), count(&handled, "slow"));
    // Ten times the speed, about ten times the jobs: a job costs its sleep plus up to a
    // millisecond of timer granularity (so 5–6 ms against 50–51 ms).
    assert!(fast >= 7 * slow && slow >= 40, "fast {fast}, slow {slow}");
}

#[actix::test]
async fn with_no_worker_jobs_wait_and_go_out_when_one_registers() {
    tokio::time::pause();
    let (registry, handled, confirmed) = (WorkerRegistry::new(), Log::default(), Log::default());
    let jobs = ReliableDelivery::work_pulling_producer(options(&registry, 4));
    tell_all(&jobs, 0..20, &confirmed);
    settle_for(1_000).await;
    assert_eq!(confirmed.len(), 0);
    assert_eq!(jobs.pool_stats().await.unwrap().queued, 20);
    registry
        .register_consumer("late", &worker("late", Duration::ZERO, &handled))
        .unwrap();
    jobs.idle().await;
    assert_confirmed_once(&confirmed, 0..20);
    let order: Vec<u64> = handled.snapshot().into_iter().map(|(_, n)| n).collect();
    assert_eq!(
        order,
        (0..20).collect::<Vec<_>>(),
        "one worker sees the jobs in order"
    );
}

#[actix::test]
async fn the_producer_queue_is_bounded_and_send_waits_for_a_worker() {
    tokio::time::pause();
    let registry = WorkerRegistry::new();
    let producer = ProducerConfig {
        window_size: 4,
        max_pending: 2,
        ..WorkPullingOptions::<u64>::default_producer()
    };
    let options = WorkPullingOptions::builder(&registry)
        .producer(producer)
        .build()
        .unwrap();
    let jobs = ReliableDelivery::work_pulling_producer(options);
    let confirmed = Log::default();
    tell_all(&jobs, 0..6, &confirmed);
    assert!(
        jobs.tell(6, confirm_into(&confirmed, 6)).is_err(),
        "4 in the pool + 2 queued"
    );
    let waiting = actix::spawn(jobs.send(7));
    settle_for(100).await;
    assert!(!waiting.is_finished(), "send waits for room");
    let handled = Log::default();
    registry
        .register_consumer("w", &worker("w", Duration::ZERO, &handled))
        .unwrap();
    assert_eq!(waiting.await.unwrap(), Ok(()));
    jobs.idle().await;
    let refused = confirmed
        .snapshot()
        .into_iter()
        .filter(|(_, r)| r.is_err())
        .collect::<Vec<_>>();
    assert_eq!(refused, [(6, Err(DeliveryError::QueueFull))]);
}

#[actix::test]
async fn a_worker_stopped_mid_job_has_its_jobs_rerouted_in_order_to_the_others() {
    tokio::time::pause();
    let (registry, confirmed) = (WorkerRegistry::new(), Log::default());
    // `stuck` takes jobs and never finishes one.
    let stuck_log = Log::default();
    let log = stuck_log.clone();
    let gate = Gate::default();
    let stuck = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(move |job: Job<u64>| {
            log.push(job.body);
            let gate = gate.clone();
            async move {
                gate.pass().await;
                Ok::<(), String>(())
            }
        }))
        .build()
        .unwrap(),
    );
    registry.register_consumer("stuck", &stuck).unwrap();
    let jobs = ReliableDelivery::work_pulling_producer(options(&registry, 3));
    tell_all(&jobs, 0..3, &confirmed);
    settle().await;
    assert_eq!(stuck_log.snapshot(), [0], "stuck runs its first job");
    tell_all(&jobs, 3..6, &confirmed);
    let handled = Log::default();
    // The new worker is busy a little while the stuck one is stopped.
    registry
        .register_consumer("ok", &worker("ok", Duration::from_millis(1), &handled))
        .unwrap();
    settle_for(50).await;
    stuck.stop();
    jobs.idle().await;
    assert_confirmed_once(&confirmed, 0..6);
    let at_ok: Vec<u64> = handled.snapshot().into_iter().map(|(_, n)| n).collect();
    let (rerouted, rest): (Vec<u64>, Vec<u64>) = at_ok.iter().partition(|n| **n < 3);
    assert_eq!(rerouted, [0, 1, 2], "stuck's jobs, in their order");
    assert!(rest.iter().all(|n| *n >= 3));
    let stats = jobs.pool_stats().await.unwrap();
    assert_eq!((stats.workers, stats.rerouted, stats.left), (1, 3, 1));
    assert_eq!(registry.names(), ["ok"]);
}

#[actix::test]
async fn a_worker_whose_stream_gives_jobs_up_rests_keeps_its_place_and_its_jobs_move_on() {
    tokio::time::pause();
    let (registry, handled, confirmed) = (WorkerRegistry::new(), Log::default(), Log::default());
    // Deliveries to "gone" are lost: its stream gives each job up after 3 transmissions.
    registry
        .register(
            "gone",
            ConsumerRef::from_fn(|_: Vec<Delivery<Job<u64>>>| {}),
        )
        .unwrap();
    let worker_config = ProducerConfig {
        window_size: 4,
        resend_timeout: Duration::from_millis(100),
        max_attempts: Limit::At(3),
        ..ProducerConfig::default()
    };
    let options = WorkPullingOptions::builder(&registry)
        .worker(worker_config)
        .build()
        .unwrap();
    let jobs = ReliableDelivery::work_pulling_producer(options);
    tell_all(&jobs, 0..4, &confirmed);
    settle_for(50).await;
    registry
        .register_consumer("there", &worker("there", Duration::ZERO, &handled))
        .unwrap();
    tell_all(&jobs, 4..8, &confirmed);
    jobs.idle().await;
    assert_confirmed_once(&confirmed, 0..8);
    let stats = jobs.pool_stats().await.unwrap();
    assert_eq!(
        (
            stats.workers,
            stats.left,
            stats.rerouted,
            stats.failed,
            stats.rests
        ),
        (2, 0, 4, 4, 1),
        "the registry decides who is gone: `gone` stays"
    );
    let gone = &stats.per_worker[0];
    assert_eq!(&*gone.name, "gone", "still first: it joined first");
    assert_eq!(
        (
            gone.confirmed,
            gone.failed,
            gone.failing,
            gone.rests,
            gone.resting
        ),
        (0, 4, 4, 1, true),
        "its four jobs failed at once: one rest (of 8 s)"
    );
    assert_eq!(count(&handled, "there"), 8);
}

/// A worker whose handler fails every run, counting its runs.
fn failing_worker(runs: &Arc<AtomicU64>) -> ConsumerHandle<Job<u64>> {
    let runs = runs.clone();
    let handler = DeliveryHandler::from_fn(move |_: Job<u64>| {
        runs.fetch_add(1, Ordering::SeqCst);
        async { Err::<(), String>("the database is down".into()) }
    });
    ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap())
}

/// With the default settings, a job that fails at one worker moves on: its stream gives it up
/// after 6 transmissions (31.5 s with the default backoff), and the job goes to a worker
/// that does not fail.
#[actix::test]
async fn by_default_a_failing_workers_jobs_move_to_a_healthy_worker() {
    tokio::time::pause();
    let (registry, handled, confirmed) = (WorkerRegistry::new(), Log::default(), Log::default());
    let runs = Arc::new(AtomicU64::new(0));
    registry
        .register_consumer("broken", &failing_worker(&runs))
        .unwrap();
    registry
        .register_consumer(
            "healthy",
            &worker("healthy", Duration::from_millis(5), &handled),
        )
        .unwrap();
    let jobs = ReliableDelivery::work_pulling_producer(options_for(&registry));
    tell_all(&jobs, 0..40, &confirmed);
    let idle = tokio::time::timeout(Duration::from_secs(600), jobs.idle()).await;
    assert!(
        idle.is_ok(),
        "after 10 minutes {} of 40 jobs are confirmed",
        confirmed.len()
    );
    assert_confirmed_once(&confirmed, 0..40);
    assert_eq!(count(&handled, "healthy"), 40);
    // `broken` took its 16 (its window), ran each 6 times, and rested after they failed:
    // meanwhile `healthy` got every job.
    let stats = jobs.pool_stats().await.unwrap();
    let broken = &stats.per_worker[0];
    assert_eq!(
        (
            broken.confirmed,
            broken.failed,
            broken.failing,
            broken.rests
        ),
        (0, 16, 16, 1)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 16 * 6);
    assert_eq!((stats.failed, stats.rerouted, stats.given_up), (16, 16, 0));
}

/// Records the jobs a pool gave up.
struct Graveyard(Log<GivenUpJob<u64>>);

impl actix::Actor for Graveyard {
    type Context = actix::Context<Self>;
}

impl actix::Handler<GivenUpJob<u64>> for Graveyard {
    type Result = ();

    fn handle(&mut self, job: GivenUpJob<u64>, _: &mut actix::Context<Self>) {
        self.0.push(job);
    }
}

/// A dead-letter sink for given-up jobs, and what it received.
fn graveyard() -> (actix::Recipient<GivenUpJob<u64>>, Log<GivenUpJob<u64>>) {
    use actix::Actor;
    let log = Log::default();
    (Graveyard(log.clone()).start().recipient(), log)
}

/// A worker whose handler fails job 13 (counting those runs) and records the others.
fn worker_failing_13(
    name: &'static str,
    runs: &Arc<AtomicU64>,
    log: &Log<(&'static str, u64)>,
) -> ConsumerHandle<Job<u64>> {
    let (runs, log) = (runs.clone(), log.clone());
    let handler = DeliveryHandler::from_fn(move |job: Job<u64>| {
        let result = if job.body == 13 {
            runs.fetch_add(1, Ordering::SeqCst);
            Err(format!("job {} cannot be parsed", job.body))
        } else {
            log.push((name, job.body));
            Ok(())
        };
        async move { result }
    });
    ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap())
}

/// Worker streams that give a job up after 2 transmissions, 100 ms apart.
fn impatient_workers() -> ProducerConfig {
    ProducerConfig {
        window_size: 2,
        resend_timeout: Duration::from_millis(100),
        max_attempts: Limit::At(2),
        ..ProducerConfig::default()
    }
}

/// A job that fails at every worker is given up after `give_up_after` failures: its sender
/// hears `HandlingFailed`, the dead-letter sink gets it with its id, and no worker sees it
/// again; the producer is idle again.
#[actix::test]
async fn a_job_that_fails_everywhere_is_given_up_dead_lettered_and_never_sent_again() {
    tokio::time::pause();
    let (registry, handled, confirmed) = (WorkerRegistry::new(), Log::default(), Log::default());
    let runs = Arc::new(AtomicU64::new(0));
    for name in ["a", "b"] {
        registry
            .register_consumer(name, &worker_failing_13(name, &runs, &handled))
            .unwrap();
    }
    let (sink, dead) = graveyard();
    let options = WorkPullingOptions::builder(&registry)
        .worker(impatient_workers())
        .give_up_after(3)
        .dead_letters(sink)
        .build()
        .unwrap();
    let jobs = ReliableDelivery::work_pulling_producer(options);
    let poison = jobs.send(13);
    tell_all(&jobs, 0..10, &confirmed);
    let outcome = tokio::time::timeout(Duration::from_secs(600), poison)
        .await
        .expect("job 13 is settled");
    let Err(DeliveryError::HandlingFailed {
        attempts,
        last_error,
    }) = outcome
    else {
        panic!("job 13: {outcome:?}");
    };
    assert_eq!(attempts, 3);
    assert!(
        last_error.contains("did not confirm it in 2 transmissions"),
        "{last_error}"
    );
    assert!(last_error.starts_with("worker `"), "{last_error}");
    jobs.idle().await;
    settle_for(600_000).await;
    assert_eq!(runs.load(Ordering::SeqCst), 3 * 2, "never sent again");
    assert_confirmed_once(&confirmed, 0..10);
    let dead = dead.snapshot();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].job.body, dead[0].attempts), (13, 3));
    assert_eq!(dead[0].last_error, last_error);
    assert_eq!(
        (&dead[0].job.info.producer_id, dead[0].job.info.seq),
        (jobs.producer_id(), 1),
        "its stable id"
    );
    let stats = jobs.pool_stats().await.unwrap();
    assert_eq!(
        (
            stats.given_up,
            stats.failed,
            stats.rerouted,
            stats.confirmed,
            stats.jobs
        ),
        (1, 3, 2, 10, 0)
    );
    let producer = jobs.stats().await.unwrap();
    assert_eq!((producer.given_up, producer.confirmed), (1, 10));
}

#[actix::test]
async fn registry_churn_loses_no_job_and_confirms_each_once() {
    tokio::time::pause();
    let (registry, handled, confirmed) = (WorkerRegistry::new(), Log::default(), Log::default());
    let jobs = ReliableDelivery::work_pulling_producer(options(&registry, 2));
    let mut workers = Vec::new();
    for round in 0..20u64 {
        tell_all(&jobs, round * 50..(round + 1) * 50, &confirmed);
        let name = ["a", "b", "c"][(round % 3) as usize];
        if registry.names().iter().any(|n| n == name) {
            registry.deregister(name);
        } else {
            let consumer = worker(name, Duration::from_millis(1 + round % 4), &handled);
            registry.register_consumer(name, &consumer).unwrap();
            workers.push(consumer);
        }
        settle_for(7).await;
    }
    if registry.names().is_empty() {
        registry
            .register_consumer("last", &worker("last", Duration::ZERO, &handled))
            .unwrap();
    }
    jobs.idle().await;
    assert_confirmed_once(&confirmed, 0..1_000);
    let stats = jobs.pool_stats().await.unwrap();
    assert!(
        stats.left >= 5 && stats.rerouted > 0,
        "churn re-routed jobs: {stats:?}"
    );
    assert!(handled.len() >= 1_000, "each job handled at least once");
}

#[test]
fn invalid_options_and_names_are_refused_with_the_reason() {
    let registry = WorkerRegistry::<u64>::new();
    let bounded = ProducerConfig {
        max_attempts: Limit::At(3),
        ..WorkPullingOptions::<u64>::default_producer()
    };
    let error = WorkPullingOptions::builder(&registry)
        .producer(bounded)
        .build()
        .unwrap_err();
    assert_eq!(error.field, "max_attempts");
    assert!(error.reason.contains("give_up_after"), "{error}");
    let error = WorkPullingOptions::builder(&registry)
        .give_up_after(0)
        .build()
        .unwrap_err();
    assert_eq!(error.field, "give_up_after");
    let named_worker = ProducerConfig {
        producer_id: Some("mine".into()),
        ..ProducerConfig::default()
    };
    let error = WorkPullingOptions::builder(&registry)
        .worker(named_worker)
        .build()
        .unwrap_err();
    assert_eq!(error.field, "producer_id");
    let long_id = ProducerConfig {
        producer_id: Some("p".repeat(240)),
        ..WorkPullingOptions::<u64>::default_producer()
    };
    let error = WorkPullingOptions::builder(&registry)
        .producer(long_id)
        .build()
        .unwrap_err();
    assert!(error.reason.contains("239"), "{error}");

    let lost = || ConsumerRef::from_fn(|_: Vec<Delivery<Job<u64>>>| {});
    assert_eq!(
        registry.register("", lost()),
        Err(RegisterError::InvalidName(0))
    );
    assert_eq!(
        registry.register(&"n".repeat(129), lost()),
        Err(RegisterError::InvalidName(129))
    );
    registry.register("w", lost()).unwrap();
    assert_eq!(
        registry.register("w", lost()),
        Err(RegisterError::NameTaken("w".into()))
    );
    assert!(registry.deregister("w"));
    assert!(!registry.deregister("w"));
}

/// A worker applying each job to the shared ledger entity, whose ACKs can be swallowed (the
/// worker "dies" after its commit, before its ACK gets out).
/// The ledger entity on `journal`.
fn start_ledger(journal: &MemoryJournal) -> PersistentHandle<Ledger> {
    PersistentHandle::start(PersistentOptions::new(
        Arc::new(journal.clone()),
        ledger_id(),
    ))
    .unwrap()
}

fn ledger_worker(entity: &PersistentHandle<Ledger>, swallow_acks: bool) -> ConsumerRef<Job<u64>> {
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(entity.job_handler(Op::Apply))
            .build()
            .unwrap(),
    );
    if !swallow_acks {
        return consumer.consumer_ref();
    }
    let black_hole = ReplyTo::from_fn(|_| {});
    let target = consumer.consumer_ref();
    ConsumerRef::from_fn(move |deliveries: Vec<Delivery<Job<u64>>>| {
        let _keep = &consumer;
        target.do_send_all(deliveries.into_iter().map(|mut d| {
            d.reply_to = Some(black_hole.clone());
            d
        }));
    })
}

#[actix::test]
async fn persistent_workers_recognise_a_rerouted_job_by_its_id_and_store_it_once() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let entity = start_ledger(&journal);
    let (registry, confirmed) = (WorkerRegistry::new(), Log::default());
    registry
        .register("mute", ledger_worker(&entity, true))
        .unwrap();
    let jobs = ReliableDelivery::work_pulling_producer(options(&registry, 8));
    tell_all(&jobs, 0..8, &confirmed);
    settle_for(500).await;
    assert_eq!(
        confirmed.len(),
        0,
        "mute committed the jobs, its ACKs never came"
    );
    let ledger = recover_state::<Ledger>(&journal, &ledger_id())
        .await
        .unwrap();
    assert_eq!(ledger.total, 8);
    registry.deregister("mute");
    registry
        .register("next", ledger_worker(&entity, false))
        .unwrap();
    jobs.idle().await;
    assert_confirmed_once(&confirmed, 0..8);
    assert_eq!(jobs.pool_stats().await.unwrap().rerouted, 8);
    let ledger = recover_state::<Ledger>(&journal, &ledger_id())
        .await
        .unwrap();
    let once: BTreeMap<u64, u32> = (0..8).map(|n| (n, 1)).collect();
    assert_eq!(ledger.applied, once, "every job's event stored once");
}

#[actix::test]
async fn a_restarted_durable_producer_resends_its_unconfirmed_jobs_under_their_ids() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let stream = PersistenceId::new("jobs").unwrap();
    let start = |registry: &WorkerRegistry<u64>| {
        let durable = DurableOptions::new(Arc::new(journal.clone()), stream.clone(), "jobs");
        ReliableDelivery::durable_work_pulling_producer(options(registry, 4), durable).unwrap()
    };
    // First life: no worker; five jobs stored, none confirmed.
    let first = start(&WorkerRegistry::new());
    for n in 0..5 {
        assert_eq!(first.store(n).await.unwrap().id.0, n + 1);
    }
    let ids_before = first.pool_stats().await.unwrap();
    assert_eq!(ids_before.queued, 5);
    first.stop();
    first.stopped().await.unwrap();

    // Second life: a worker that records the job ids it sees.
    let (registry, seen) = (WorkerRegistry::new(), Log::default());
    let log = seen.clone();
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(move |job: Job<u64>| {
            log.push((job.info.producer_id.to_string(), job.info.seq, job.body));
            async { Ok::<(), String>(()) }
        }))
        .build()
        .unwrap(),
    );
    registry.register_consumer("w", &consumer).unwrap();
    let second = start(&registry);
    second.idle().await;
    let expected: Vec<_> = (0..5).map(|n| ("jobs".to_string(), n + 1, n)).collect();
    assert_eq!(
        seen.snapshot(),
        expected,
        "the stored jobs, under their seqs"
    );
    assert_eq!(second.pool_stats().await.unwrap().confirmed, 5);
}

/// A durable work-pulling producer records a given-up job as settled: its caller hears
/// `HandlingFailed` once the record is in the journal, and the next start of the stream does
/// not send it again.
#[actix::test]
async fn a_durable_producer_records_a_given_up_job_and_a_restart_does_not_send_it_again() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let durable = || {
        let stream = PersistenceId::new("jobs").unwrap();
        DurableOptions::new(Arc::new(journal.clone()), stream, "jobs")
    };
    // First life: every worker fails job 13.
    let (registry, handled, runs) = (WorkerRegistry::new(), Log::default(), Arc::default());
    for name in ["a", "b"] {
        registry
            .register_consumer(name, &worker_failing_13(name, &runs, &handled))
            .unwrap();
    }
    let options = WorkPullingOptions::builder(&registry)
        .worker(impatient_workers())
        .give_up_after(2)
        .build()
        .unwrap();
    let first = ReliableDelivery::durable_work_pulling_producer(options, durable()).unwrap();
    let stored = first.store(13).await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(600), stored.confirmed())
        .await
        .expect("job 13 is settled");
    assert!(
        matches!(
            outcome,
            Err(DeliveryError::HandlingFailed { attempts: 2, .. })
        ),
        "{outcome:?}"
    );
    let stats = first.stats().await.unwrap();
    assert_eq!(
        (stats.given_up, stats.unconfirmed),
        (1, 0),
        "recorded settled"
    );
    first.stop();
    first.stopped().await.unwrap();

    // Second life: a worker that handles everything it gets.
    let (registry, seen) = (WorkerRegistry::new(), Log::default());
    registry
        .register_consumer("w", &worker("w", Duration::ZERO, &seen))
        .unwrap();
    let second =
        ReliableDelivery::durable_work_pulling_producer(options_for(&registry), durable()).unwrap();
    second.send(14).await.unwrap();
    second.idle().await;
    assert_eq!(seen.snapshot(), [("w", 14)], "job 13 is not sent again");
    assert_eq!(second.stats().await.unwrap().resumed, 0);
    assert_eq!(runs.load(Ordering::SeqCst), 2 * 2);
}

/// A durable producer whose record of a give-up failed restarts and sends the job again (it
/// cannot know that the record did not commit): the pool answers the copy given up again, so
/// the caller hears `HandlingFailed`, never `Ok`, and no worker runs the job again.
#[actix::test]
async fn a_given_up_job_sent_again_after_a_failed_record_is_given_up_again_not_confirmed() {
    use common::journals::{Fault, Faulty};
    tokio::time::pause();
    let journal = Faulty::new(MemoryJournal::new());
    let stream = PersistenceId::new("jobs").unwrap();
    let (registry, handled, runs) = (WorkerRegistry::new(), Log::default(), Arc::default());
    for name in ["a", "b"] {
        registry
            .register_consumer(name, &worker_failing_13(name, &runs, &handled))
            .unwrap();
    }
    let options = WorkPullingOptions::builder(&registry)
        .worker(impatient_workers())
        .give_up_after(2)
        .build()
        .unwrap();
    let durable = DurableOptions::new(Arc::new(journal.clone()), stream, "jobs");
    let jobs = ReliableDelivery::durable_work_pulling_producer(options, durable).unwrap();
    let stored = jobs.store(13).await.unwrap();
    // The next append is the record of the give-up: it fails, nothing is written.
    journal.arm(Fault::BeforeCommit);
    let outcome = tokio::time::timeout(Duration::from_secs(600), stored.confirmed())
        .await
        .expect("job 13 is settled");
    assert_eq!(journal.injected(Fault::BeforeCommit), 1);
    assert!(
        matches!(
            outcome,
            Err(DeliveryError::HandlingFailed { attempts: 2, .. })
        ),
        "{outcome:?}"
    );
    jobs.idle().await;
    let stats = jobs.stats().await.unwrap();
    assert_eq!(
        (
            stats.resumed,
            stats.given_up,
            stats.confirmed,
            stats.unconfirmed
        ),
        (0, 1, 0, 0),
        "sent again to its own confirmation, given up again and recorded: {stats:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2 * 2, "no worker ran it again");
}

#[actix::test]
async fn announced_workers_are_registered_and_deregistered_after_a_silent_timeout() {
    use actix_delivery::work_pulling::{Announcement, AnnouncerHandle, WorkerDiscovery};
    tokio::time::pause();
    let (registry, handled, confirmed) = (WorkerRegistry::new(), Log::default(), Log::default());
    // "Addresses" resolve to local consumers here (over TCP they are node addresses); the
    // link to `a` can be cut, as by its process dying.
    let (link_a, cut_a, _) =
        common::cuttable(worker("a", Duration::from_millis(2), &handled).consumer_ref());
    let b = worker("b", Duration::from_millis(2), &handled).consumer_ref();
    let consumers = BTreeMap::from([("a".to_string(), link_a), ("b".to_string(), b)]);
    let discovery = WorkerDiscovery::start(&registry, Duration::from_secs(3), move |a| {
        consumers.get(&a.consumer).cloned()
    })
    .unwrap();
    let announcements = ReliableDelivery::consumer(
        ConsumerOptions::builder(discovery.handler())
            .build()
            .unwrap(),
    );
    let announce = |name: &str, consumer: &str| {
        let announcement = Announcement {
            name: name.into(),
            node: None,
            consumer: consumer.into(),
        };
        AnnouncerHandle::start(&announcements, announcement, Duration::from_secs(1)).unwrap()
    };
    let a = announce("a", "a");
    let _b = announce("b", "b");
    let _unknown = announce("c", "nowhere");
    settle_for(10).await;
    assert_eq!(registry.names(), ["a", "b"]);
    let jobs = ReliableDelivery::work_pulling_producer(options(&registry, 4));
    tell_all(&jobs, 0..200, &confirmed);
    settle_for(20).await;
    // `a` dies: silent, and what was sent to it is lost. 3 s later it is deregistered and
    // its jobs are re-routed.
    cut_a.store(true, std::sync::atomic::Ordering::SeqCst);
    drop(a);
    settle_for(2_000).await;
    assert_eq!(registry.names(), ["a", "b"], "not yet: the timeout is 3 s");
    settle_for(2_000).await;
    assert_eq!(registry.names(), ["b"]);
    jobs.idle().await;
    assert_confirmed_once(&confirmed, 0..200);
    assert!(jobs.pool_stats().await.unwrap().rerouted >= 1);
    let stats = discovery.stats().await.unwrap();
    assert_eq!((stats.registered, stats.expired), (2, 1));
    assert!(
        stats.refused >= 2,
        "`nowhere` resolves to nothing, every time: {stats:?}"
    );
    assert!(stats.announcements >= 8, "{stats:?}");
}

/// A worker leaves while it finishes a job: the job is re-routed to `b`, then the worker's
/// late ACK (its stream takes the ACKs on their way for a `resend_timeout` after it left)
/// confirms it. `b` is a persistent worker whose first copy of the
/// job is lost; it records a later job (whose `window_start` passed the copy's seq), so the
/// copy's retransmission is stale there: ACKed without running, and `b`'s slot comes back.
#[actix::test]
async fn a_late_copy_of_a_job_confirmed_elsewhere_frees_its_persistent_workers_slot() {
    tokio::time::pause();
    let registry = WorkerRegistry::<u64>::new();
    let journal = MemoryJournal::new();
    let entity = start_ledger(&journal);
    let b = ReliableDelivery::consumer(
        ConsumerOptions::builder(entity.job_handler(Op::Apply))
            .build()
            .unwrap(),
    );
    let b_target = b.consumer_ref();
    let dropped_once = Arc::new(AtomicBool::new(false));
    let copies_seen = Arc::new(AtomicU64::new(0));
    let (d, c) = (dropped_once.clone(), copies_seen.clone());
    let b_link = ConsumerRef::from_fn(move |ds: Vec<Delivery<Job<u64>>>| {
        let _keep = &b;
        let ds: Vec<_> = ds
            .into_iter()
            .filter(|x| {
                if x.body.body != 0 {
                    return true;
                }
                c.fetch_add(1, Ordering::SeqCst);
                d.swap(true, Ordering::SeqCst) // drop the first transmission of job 0
            })
            .collect();
        b_target.do_send_all(ds.into_iter());
    });

    let (reg, handled_a) = (registry.clone(), Log::default());
    let la = handled_a.clone();
    let b_slot = std::sync::Mutex::new(Some(b_link));
    let a = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(move |job: Job<u64>| {
            la.push(job.body);
            if let Some(link) = b_slot.lock().unwrap().take() {
                reg.register("b", link).unwrap();
            }
            reg.deregister("a");
            async {
                // Finishes after the pool re-routed the job: its ACK comes late.
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok::<(), String>(())
            }
        }))
        .build()
        .unwrap(),
    );
    registry.register("a", a.consumer_ref()).unwrap();
    let jobs = ReliableDelivery::work_pulling_producer(options(&registry, 4));
    let confirmed = Log::default();
    jobs.tell(0, confirm_into(&confirmed, 0)).unwrap();
    settle_for(50).await;
    jobs.tell(1, confirm_into(&confirmed, 1)).unwrap();
    settle_for(10_000).await;
    let stats = jobs.pool_stats().await.unwrap();
    assert_eq!(confirmed.len(), 2, "both jobs confirmed to the caller");
    assert!(
        copies_seen.load(Ordering::SeqCst) >= 2,
        "b got the copy again"
    );
    assert_eq!(
        entity.stats().await.unwrap().stale,
        1,
        "the copy was stale at b"
    );
    let in_flight: usize = stats.per_worker.iter().map(|w| w.in_flight).sum();
    assert_eq!(in_flight, 0, "b's slot came back: {stats:?}");
    let ledger = recover_state::<Ledger>(&journal, &ledger_id())
        .await
        .unwrap();
    // Job 0 was done by `a` (a plain worker), job 1 at b's entity; the copy ran nowhere.
    assert_eq!(ledger.applied, BTreeMap::from([(1, 1)]));
}

#[actix::test]
async fn a_second_announcer_of_a_name_in_force_is_refused_until_the_first_goes_silent() {
    use actix_delivery::work_pulling::{Announcement, AnnouncerHandle, WorkerDiscovery};
    tokio::time::pause();
    let registry = WorkerRegistry::<u64>::new();
    let handled = Log::default();
    let consumers = BTreeMap::from([
        (
            "x".to_string(),
            worker("x", Duration::ZERO, &handled).consumer_ref(),
        ),
        (
            "y".to_string(),
            worker("y", Duration::ZERO, &handled).consumer_ref(),
        ),
    ]);
    let discovery = WorkerDiscovery::start(&registry, Duration::from_secs(3), move |a| {
        consumers.get(&a.consumer).cloned()
    })
    .unwrap();
    let announcements = ReliableDelivery::consumer(
        ConsumerOptions::builder(discovery.handler())
            .build()
            .unwrap(),
    );
    let announce = |consumer: &str| {
        let announcement = Announcement {
            name: "w".into(),
            node: None,
            consumer: consumer.into(),
        };
        AnnouncerHandle::start(&announcements, announcement, Duration::from_secs(1)).unwrap()
    };
    let x = announce("x");
    settle_for(10).await;
    let _y = announce("y");
    settle_for(10_000).await;
    let stats = discovery.stats().await.unwrap();
    assert_eq!(stats.registered, 1, "no flapping: {stats:?}");
    assert!(stats.refused >= 9, "{stats:?}");
    // x goes silent: after the timeout the name is y's.
    drop(x);
    settle_for(5_000).await;
    let stats = discovery.stats().await.unwrap();
    assert_eq!((stats.registered, stats.expired), (2, 1), "{stats:?}");
    assert_eq!(registry.names(), ["w"]);
    // Deregistered behind the discovery's back: the next announcement registers it again.
    registry.deregister("w");
    settle_for(1_500).await;
    assert_eq!(registry.names(), ["w"]);
}

/// A job's id names one message of its producer: a sender that writes a range of seqs into it
/// (a chunked message's `first_seq`) does not get the other seqs of the range recorded as
/// processed, so the jobs of those seqs are still applied.
#[actix::test]
async fn a_job_id_claiming_a_range_of_seqs_marks_only_its_own() {
    use actix_delivery::{DeliveryInfo, Incarnation, ProducerId};
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let entity = start_ledger(&journal);
    let stream = Incarnation::from_u128(3);
    let worker = ReliableDelivery::consumer(
        ConsumerOptions::builder(entity.job_handler(Op::Apply))
            .build()
            .unwrap(),
    );
    let (reply_to, acks) = common::ack_probe();
    let job = |seq: u64, first_seq| Job {
        info: DeliveryInfo {
            producer_id: ProducerId::from("jobs"),
            incarnation: stream.id(),
            seq,
            window_start: 1,
            trace_context: None,
            first_seq,
        },
        body: seq,
    };
    for (n, body) in [job(5, Some(1)), job(2, None)].into_iter().enumerate() {
        let delivery = Delivery::new("jobs/1", stream, n as u64 + 1, body, reply_to.clone());
        worker.recipient().do_send(delivery);
    }
    settle_for(100).await;
    assert_eq!(acks.len(), 2);
    let ledger = recover_state::<Ledger>(&journal, &ledger_id())
        .await
        .unwrap();
    let applied: BTreeMap<u64, u32> = [(2, 1), (5, 1)].into();
    assert_eq!(
        ledger.applied, applied,
        "job 2 applied, not taken as processed"
    );
}

/// A job's stable id is bound to the worker stream that carries it: a sender that knows a
/// producer's id and the public id of its jobs' token (in every `Job::info`, log and dead
/// letter) and names them in a job of its own, far ahead, gets a dead letter, not a window
/// moved at the persistent worker, and the producer's genuine jobs go on being applied.
#[actix::test]
async fn a_job_naming_another_producers_id_is_a_dead_letter_and_moves_no_window() {
    use actix_delivery::{DeadLetterReason, DeliveryInfo, Incarnation};
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let entity = start_ledger(&journal);
    let (sink, dead_letters) = common::dead_letter_log();
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(entity.job_handler(Op::Apply))
            .dead_letters(sink)
            .build()
            .unwrap(),
    );
    let seen: Arc<std::sync::Mutex<Option<DeliveryInfo>>> = Arc::default();
    let tap = {
        let (seen, target) = (seen.clone(), consumer.consumer_ref());
        ConsumerRef::from_fn(move |deliveries: Vec<Delivery<Job<u64>>>| {
            *seen.lock().unwrap() = Some(deliveries[0].body.info.clone());
            target.do_send_all(deliveries.into_iter());
        })
    };
    let (registry, confirmed) = (WorkerRegistry::new(), Log::default());
    registry.register("ledger", tap).unwrap();
    let jobs = ReliableDelivery::work_pulling_producer(options(&registry, 8));
    tell_all(&jobs, 0..1, &confirmed);
    jobs.idle().await;
    let genuine = seen.lock().unwrap().clone().expect("the tap saw the job");

    let (reply_to, acks) = common::ack_probe();
    let forged = Job {
        info: DeliveryInfo {
            seq: 1_000_000,
            window_start: 1_000_000,
            ..genuine.clone()
        },
        body: 999,
    };
    let carrier = format!("{}/0000000000000001", genuine.producer_id);
    let delivery = Delivery::new(carrier, Incarnation::from_u128(666), 1, forged, reply_to);
    consumer.recipient().do_send(delivery);
    settle_for(10).await;

    tell_all(&jobs, 1..5, &confirmed);
    jobs.idle().await;
    assert_confirmed_once(&confirmed, 0..5);
    let ledger = recover_state::<Ledger>(&journal, &ledger_id())
        .await
        .unwrap();
    let once: BTreeMap<u64, u32> = (0..5).map(|n| (n, 1)).collect();
    assert_eq!(
        ledger.applied, once,
        "every genuine job applied, the forged one never"
    );
    assert!(
        acks.snapshot().is_empty(),
        "the forged delivery is not ACKed"
    );
    let letters = dead_letters.snapshot();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason, DeadLetterReason::ForeignOrigin);
}

/// Jobs into sharded entities: a worker on an entity host applies each job to the entity it
/// names and dies after the entity's commit, before its ACKs leave; a worker on a new host
/// over the same journal (another process would recover from it just so) gets the jobs
/// re-routed, and the entities answer them "already processed": each job's event is stored
/// once.
#[actix::test]
async fn jobs_into_sharded_entities_are_stored_once_when_a_worker_dies_after_the_commit() {
    use actix_delivery::sharding::{EntityHostHandle, EntityHostOptions, EntityId};
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let account = |n: u64| EntityId::new(format!("a{}", n % 4)).unwrap();
    let start_host = || {
        EntityHostHandle::<Ledger>::start(
            Arc::new(journal.clone()),
            EntityHostOptions::builder("ledger").build().unwrap(),
        )
        .unwrap()
    };
    let worker = |host: &EntityHostHandle<Ledger>| {
        ReliableDelivery::consumer(
            ConsumerOptions::builder(host.job_handler(move |n: u64| (account(n), Op::Apply(n))))
                .build()
                .unwrap(),
        )
    };
    let applied = |entity: u64| {
        let journal = journal.clone();
        async move {
            let id = PersistenceId::new(format!("ledger|a{entity}")).unwrap();
            recover_state::<Ledger>(&journal, &id)
                .await
                .unwrap()
                .applied
        }
    };
    let first_host = start_host();
    let dying = worker(&first_host);
    let (registry, confirmed) = (WorkerRegistry::new(), Log::default());
    let black_hole = ReplyTo::from_fn(|_| {});
    let target = dying.consumer_ref();
    let mute = ConsumerRef::from_fn(move |deliveries: Vec<Delivery<Job<u64>>>| {
        target.do_send_all(deliveries.into_iter().map(|mut d| {
            d.reply_to = Some(black_hole.clone()); // its ACKs die with it
            d
        }));
    });
    registry.register("dying", mute).unwrap();
    let jobs = ReliableDelivery::work_pulling_producer(options(&registry, 8));
    tell_all(&jobs, 0..8, &confirmed);
    settle_for(200).await;
    assert_eq!(confirmed.len(), 0, "committed, never ACKed");
    for entity in 0..4 {
        assert_eq!(
            applied(entity).await.len(),
            2,
            "a{entity} committed its jobs"
        );
    }
    // The worker dies with its host; another host on the same journal takes its place.
    registry.deregister("dying");
    dying.stop();
    first_host.stop();
    first_host.stopped().await;
    let second_host = start_host();
    let next = worker(&second_host);
    registry.register_consumer("next", &next).unwrap();
    jobs.idle().await;
    assert_confirmed_once(&confirmed, 0..8);
    assert_eq!(
        second_host.stats().already_processed,
        8,
        "answered from the record"
    );
    for entity in 0..4 {
        let once: BTreeMap<u64, u32> = (0..8).filter(|n| n % 4 == entity).map(|n| (n, 1)).collect();
        assert_eq!(
            applied(entity).await,
            once,
            "a{entity}: each job's event stored once"
        );
    }
}
