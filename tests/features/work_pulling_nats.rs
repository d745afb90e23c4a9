//! Work pulling to workers over a real NATS server (feature `nats`): workers expose their
//! job consumer on a subject of their own and announce it on the registration subject; a
//! worker whose connection dies goes silent, is deregistered after the discovery's timeout,
//! and its jobs are re-routed to the others.

use crate::common;
use crate::nats_support;
use crate::remote;

use std::time::Duration;

use actix_delivery::nats::NatsCarrierHandle;
use actix_delivery::work_pulling::{
    Announcement, AnnouncerHandle, Job, WorkPullingOptions, WorkerDiscovery, WorkerRegistry,
};
use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerConfig, ReliableDelivery};
use common::{confirm_into, Confirmations, Log};
use nats_support::{carrier, unique};
use remote::{assert_each_confirmed_once, wait_until};

/// A worker process: its own connection, its job consumer on its own subject, announcing
/// itself on `registration` every 200 ms.
async fn worker(
    name: &str,
    registration: &str,
    handled: &Log<(String, u64)>,
) -> (NatsCarrierHandle, AnnouncerHandle) {
    let carrier = carrier().await;
    let (log, me) = (handled.clone(), name.to_string());
    let handler = DeliveryHandler::from_fn(move |job: Job<u64>| {
        log.push((me.clone(), job.body));
        async {
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok::<(), String>(())
        }
    });
    let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
    let subject = unique(&format!("jobs-{name}"));
    carrier.expose(&subject, &consumer).await.unwrap();
    let announcement = Announcement {
        name: name.into(),
        node: None,
        consumer: subject,
    };
    let to = carrier.consumer_ref::<Announcement>(registration).unwrap();
    let announcer = AnnouncerHandle::start(to, announcement, Duration::from_millis(200)).unwrap();
    (carrier, announcer)
}

#[actix::test]
async fn a_dead_nats_worker_is_deregistered_and_its_jobs_go_to_the_others() {
    const JOBS: u64 = 600;
    let registration = unique("workers");
    let hub = carrier().await;
    let registry = WorkerRegistry::new();
    let resolver = hub.clone();
    let discovery = WorkerDiscovery::start(&registry, Duration::from_secs(1), move |a| {
        resolver.consumer_ref::<Job<u64>>(&a.consumer).ok()
    })
    .unwrap();
    let announcements = ReliableDelivery::consumer(
        ConsumerOptions::builder(discovery.handler())
            .build()
            .unwrap(),
    );
    hub.expose(&registration, &announcements).await.unwrap();

    let handled = Log::default();
    let (doomed, doomed_announcer) = worker("doomed", &registration, &handled).await;
    let (_survivor, _announcer) = worker("survivor", &registration, &handled).await;
    assert!(wait_until(Duration::from_secs(5), || registry.names().len() == 2).await);

    let worker_streams = ProducerConfig {
        window_size: 8,
        resend_timeout: Duration::from_millis(100),
        ..ProducerConfig::default()
    };
    let options = WorkPullingOptions::builder(&registry)
        .worker(worker_streams)
        .build()
        .unwrap();
    let jobs = ReliableDelivery::work_pulling_producer(options);
    let confirmed = Confirmations::<u64>::default();
    for n in 1..=JOBS {
        jobs.tell(n, confirm_into(&confirmed, n)).unwrap();
    }
    let doomed_has_worked = || {
        handled
            .snapshot()
            .iter()
            .filter(|(w, _)| w == "doomed")
            .count()
            >= 20
    };
    assert!(wait_until(Duration::from_secs(10), doomed_has_worked).await);
    // The worker's process dies: its connection is gone, it stops announcing.
    doomed.stop();
    drop(doomed_announcer);
    assert!(wait_until(Duration::from_secs(20), || confirmed.len() as u64 == JOBS).await);
    assert_each_confirmed_once(&confirmed, JOBS, "over NATS");
    assert_eq!(registry.names(), ["survivor"]);
    let (pool, found) = (
        jobs.pool_stats().await.unwrap(),
        discovery.stats().await.unwrap(),
    );
    assert!(pool.rerouted >= 1, "the dead worker held jobs: {pool:?}");
    assert_eq!((found.registered, found.expired), (2, 1), "{found:?}");
}
