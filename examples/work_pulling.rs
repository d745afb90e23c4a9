//! A pool of workers that come and go while jobs flow: one work-pulling producer, workers
//! started and stopped (mid-job) at random, each job confirmed exactly once to its sender,
//! and, because the workers are effectively once (each applies a job to the ledger entity
//! of the account it names, hosted by an `EntityHostHandle`, which records the job's stable id
//! with its event: `EntityHostHandle::job_handler`), every job applied exactly once although some
//! ran twice.
//!
//! Run with `cargo run --example work_pulling`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_delivery::journal::{MemoryJournal, PersistenceId};
use actix_delivery::persistence::{recover_state, Decision, EventSourced};
use actix_delivery::sharding::{EntityHostHandle, EntityHostOptions, EntityId};
use actix_delivery::work_pulling::{WorkPullingOptions, WorkerRegistry};
use actix_delivery::{
    ConsumerHandle, ConsumerOptions, DeliveryError, ProducerConfig, ReliableDelivery,
};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

const JOBS: u64 = 20_000;
const WORKERS: usize = 4;
const ACCOUNTS: u64 = 16;

/// The ledger of one account, which the workers apply jobs to: how often each job was
/// applied.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Ledger {
    applied: BTreeMap<u64, u32>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Applied(u64);

impl EventSourced for Ledger {
    type Command = u64;
    type Event = Applied;
    type Reply = ();
    type Rejection = String;

    fn decide(&self, job: &u64) -> Result<Decision<Self>, String> {
        Ok(Decision::persist([Applied(*job)], ()))
    }

    fn apply(&mut self, Applied(job): &Applied) {
        *self.applied.entry(*job).or_default() += 1;
    }
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("error")).init();
    let journal = MemoryJournal::new();
    let ledgers = EntityHostHandle::<Ledger>::start(
        Arc::new(journal.clone()),
        EntityHostOptions::builder("ledger").build()?,
    )?;
    let registry = WorkerRegistry::new();
    let worker_settings = ProducerConfig {
        window_size: 8,
        resend_timeout: Duration::from_millis(50),
        ..ProducerConfig::default()
    };
    let jobs = ReliableDelivery::work_pulling_producer(
        WorkPullingOptions::builder(&registry)
            .worker(worker_settings)
            .build()?,
    );

    // The jobs: told at once, confirmed when a worker's ledger commit is ACKed.
    let confirmations: Arc<Mutex<BTreeMap<u64, u32>>> = Arc::default();
    let failed = Arc::new(AtomicU64::new(0));
    for job in 0..JOBS {
        let (confirmations, failed) = (confirmations.clone(), failed.clone());
        jobs.tell(job, move |result: Result<(), DeliveryError>| match result {
            Ok(()) => *confirmations.lock().unwrap().entry(job).or_default() += 1,
            Err(_) => drop(failed.fetch_add(1, Ordering::Relaxed)),
        })
        .map_err(|_| "the producer refused a job")?;
    }

    // Workers come and go: every 20 ms one of the slots is (re)started or stopped, mid-job.
    let start_worker = |n: usize| -> Result<ConsumerHandle<_>, Box<dyn std::error::Error>> {
        // Job n is for account n % ACCOUNTS.
        let to_account = |job: u64| {
            let account = EntityId::new(format!("account-{}", job % ACCOUNTS));
            (account.expect("a valid id"), job)
        };
        let worker = ReliableDelivery::consumer(
            ConsumerOptions::builder(ledgers.job_handler(to_account))
                .name(format!("worker-{n}"))
                .build()?,
        );
        registry.register_consumer(&format!("worker-{n}"), &worker)?;
        Ok(worker)
    };
    let mut slots: Vec<Option<ConsumerHandle<_>>> = (0..WORKERS)
        .map(|n| start_worker(n).map(Some))
        .collect::<Result<_, _>>()?;
    let (mut rng, mut started, mut stopped) = (rand::rngs::SmallRng::seed_from_u64(7), 0, 0);
    while confirmations.lock().unwrap().len() < JOBS as usize {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let n = rng.random_range(0..WORKERS);
        match slots[n].take() {
            // Keep at least one worker running.
            Some(worker) if slots.iter().any(Option::is_some) => {
                worker.stop();
                stopped += 1;
            }
            Some(worker) => slots[n] = Some(worker),
            None => {
                slots[n] = Some(start_worker(n)?);
                started += 1;
            }
        }
    }
    jobs.idle().await;

    let stats = jobs.pool_stats().await?;
    let confirmed_once = confirmations.lock().unwrap().values().all(|&n| n == 1);
    let mut applied = BTreeMap::new();
    for account in 0..ACCOUNTS {
        let id = PersistenceId::new(format!("ledger|account-{account}"))?;
        applied.extend(recover_state::<Ledger>(&journal, &id).await?.applied);
    }
    let applied_once = applied.len() == JOBS as usize && applied.values().all(|&n| n == 1);
    println!("{JOBS} jobs, {WORKERS} worker slots: {started} workers started, {stopped} stopped mid-stream");
    println!(
        "pool: {} jobs routed, {} re-routed from a worker that left, {} confirmed",
        stats.assigned, stats.rerouted, stats.confirmed
    );
    println!(
        "every job confirmed exactly once: {confirmed_once} ({} failed)",
        failed.load(Ordering::Relaxed)
    );
    println!(
        "every job applied to its account's ledger exactly once (from the journal): {applied_once}"
    );
    if !(confirmed_once && applied_once) {
        return Err("a job was lost or doubled".into());
    }
    Ok(())
}
