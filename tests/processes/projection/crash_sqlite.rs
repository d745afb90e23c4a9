//! Exactly once into a SQLite read model across real crashes: a child process runs four
//! accounts that keep writing tagged events into a SQLite journal and a projection of them
//! into a SQLite read model (batches of five events, one transaction each). This test
//! SIGKILLs the child at seeded moments, 24 times (`PROJECTION_CRASH_KILLS`), and after each
//! kill reads the read model: no event applied twice. In one life of three the child kills
//! itself instead, inside its n-th transaction (after the handler wrote its rows, before the
//! commit), which a kill from outside hits only by luck. The handler prints the offset of
//! each batch it begins (and takes a few ms, as a real one would); a kill after a batch began
//! whose offset the read model does not hold landed inside a transaction, and a quarter of
//! the kills must land there. A last life writes nothing
//! and runs until the projection has caught up; then the read model must equal the fold of the
//! journal (each account's state as the entity recovers it), every tagged event applied once.
//!
//! Replay a seed with
//! `PROJECTION_CRASH_SEED=5 cargo test --test processes projection::crash_sqlite::`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_delivery::journal::{Journal, Offset, TagQuery};
use actix_delivery::persistence::PersistentConfig;
use actix_delivery::projection::{Projection, SqliteReadModel};
use futures_util::future::join_all;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::bank::{self, Account};
use super::sqlite;
use crate::process;

/// The test that is the child (it does nothing unless [`CHILD_DIR`] is set).
const ENTRY: &str = concat!(module_path!(), "::child_process_entry");
/// Set for the child: the directory of the journal and the read model.
const CHILD_DIR: &str = "PROJECTION_CRASH_SQLITE_DIR";
/// Set for the child's last life: write nothing, catch up, say so.
const CHILD_FINISH: &str = "PROJECTION_CRASH_SQLITE_FINISH";
/// Set for the child: SIGKILL itself inside this handler call (counted from 1).
const CHILD_KILL_AT: &str = "PROJECTION_CRASH_SQLITE_KILL_AT";
const ACCOUNTS: usize = 4;

/// The child: opens the journal and the read model, starts the projection, prints `ready`,
/// then keeps its accounts writing (or, in its last life, waits for the projection to catch
/// up with the journal and prints `caught-up`). The handler prints `begin <position>` before
/// it writes a batch, and takes 0 to 3 ms.
#[test]
fn child_process_entry() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return; // run as an ordinary test: nothing to do
    };
    let dir = PathBuf::from(dir);
    let finish = std::env::var(CHILD_FINISH).is_ok();
    let kill_at: Option<u64> = std::env::var(CHILD_KILL_AT)
        .ok()
        .map(|n| n.parse().unwrap());
    actix::System::new().block_on(async move {
        let journal: Arc<dyn Journal> = Arc::new(
            process::open_journal(dir.join("journal.db"))
                .await
                .expect("open the journal"),
        );
        let mut model = SqliteReadModel::open(dir.join("model.db")).await.unwrap();
        model.execute_batch(sqlite::TABLES).await.unwrap();
        let options = bank::options("balances").batch_size(5).build().unwrap();
        let mut calls = 0;
        let projection = Projection::of::<Account>(journal.clone(), options).exactly_once_sqlite(
            model,
            move |transaction, events| {
                calls += 1;
                if let Some(last) = events.last() {
                    println!("begin {}", last.offset.parts().1);
                }
                sqlite::apply(transaction, events)?;
                std::thread::sleep(Duration::from_micros(calls % 4 * 1000));
                if kill_at == Some(calls) {
                    process::sigkill_self();
                }
                Ok(())
            },
        );
        println!("ready");
        if finish {
            let query = TagQuery::new(bank::account_tag());
            let all = journal.events_by_tag(&query, Offset::START, usize::MAX);
            let last = all
                .await
                .unwrap()
                .last()
                .map_or(Offset::START, |e| e.offset);
            while projection.stats().offset < last {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            println!("caught-up");
            projection.stop();
            projection.stopped().await.unwrap();
            return;
        }
        let accounts = bank::open(&journal, "", ACCOUNTS, &PersistentConfig::default());
        join_all(accounts.iter().enumerate().map(|(n, account)| async move {
            for k in 0.. {
                account
                    .ask(bank::amount(k * ACCOUNTS as u64 + n as u64))
                    .await
                    .unwrap();
            }
        }))
        .await;
    });
}

/// Ends a child's life: waits until it has killed itself (`self_kill`: its output ends), or
/// SIGKILLs it after `life`. Returns the highest offset position it printed as
/// `begin <position>` (the last read-model transaction it began).
pub fn end_life(
    child: process::Child,
    self_kill: bool,
    life: Duration,
    context: &str,
) -> Option<u64> {
    let mut lines = Vec::new();
    if self_kill {
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Ok(line) = child.try_line() {
            assert!(
                Instant::now() < deadline,
                "{context}: the child did not kill itself"
            );
            match line {
                Some(line) => lines.push(line),
                None => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    } else {
        std::thread::sleep(life);
    }
    lines.extend(child.kill_collect());
    lines
        .iter()
        .filter_map(|line| line.strip_prefix("begin ")?.parse::<u64>().ok())
        .max()
}

/// The read model's stored offset position (0 if none), and its applied events.
fn model_now(path: &Path) -> (u64, Vec<(String, u64, String)>) {
    let connection = rusqlite::Connection::open(path).unwrap();
    let stored: Option<i64> = connection
        .query_row(
            "SELECT offset_position FROM projection_offset WHERE projection = 'balances'",
            [],
            |row| row.get(0),
        )
        .ok();
    (stored.unwrap_or(0) as u64, sqlite::read(path).1)
}

#[test]
fn a_sqlite_read_model_holds_every_event_exactly_once_across_sigkills() {
    let seed: u64 = std::env::var("PROJECTION_CRASH_SEED").map_or(3, |s| s.parse().unwrap());
    let kills: u32 = std::env::var("PROJECTION_CRASH_KILLS").map_or(24, |s| s.parse().unwrap());
    let mut rng = SmallRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let env = [(CHILD_DIR, dir.path().display().to_string())];
    let model = dir.path().join("model.db");
    let mut inside_a_transaction = 0;
    for life in 0..kills {
        let context = format!("seed {seed}, life {life}");
        let kill_at = rng.random_ratio(1, 3).then(|| rng.random_range(1..=20u64));
        let mut env = env.to_vec();
        if let Some(n) = kill_at {
            env.push((CHILD_KILL_AT, n.to_string()));
        }
        let child = process::spawn(ENTRY, &env);
        child
            .wait_for("ready", Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{context}: the child did not start"));
        let life = Duration::from_millis(rng.random_range(10..=150));
        let begun = end_life(child, kill_at.is_some(), life, &context);
        let (stored, applied) = model_now(&model);
        sqlite::assert_applied_once(&applied, &context);
        if begun.is_some_and(|begun| begun > stored) {
            inside_a_transaction += 1;
        }
    }
    let child = process::spawn(ENTRY, &[env[0].clone(), (CHILD_FINISH, "1".into())]);
    child
        .wait_for("caught-up", Duration::from_secs(60))
        .unwrap_or_else(|| panic!("seed {seed}: the last life did not catch up"));
    assert!(
        child.finish().success(),
        "seed {seed}: the last life failed"
    );
    assert!(
        inside_a_transaction * 4 >= kills,
        "seed {seed}: only {inside_a_transaction} of {kills} kills landed inside a transaction"
    );
    let (_, applied) = model_now(&model);
    sqlite::assert_applied_once(&applied, &format!("seed {seed}, at the end"));
    let (balances, journal_events) = journal_now(&dir.path().join("journal.db"));
    assert_eq!(
        sqlite::read(&model).0,
        balances,
        "seed {seed}: the read model is the fold"
    );
    let applied: Vec<(String, u64)> = applied.into_iter().map(|(a, s, _)| (a, s)).collect();
    let mut sorted = applied.clone();
    sorted.sort();
    assert_eq!(
        sorted, journal_events,
        "seed {seed}: every tagged event, once"
    );
    println!(
        "seed {seed}: {} events, {kills} kills, {inside_a_transaction} inside a read-model \
         transaction",
        journal_events.len()
    );
    assert!(
        journal_events.len() > 200,
        "seed {seed}: {} events",
        journal_events.len()
    );
}

/// The accounts as the journal holds them, and every tagged (account, seq), sorted.
fn journal_now(path: &Path) -> (BTreeMap<String, Account>, Vec<(String, u64)>) {
    actix::System::new().block_on(async {
        let journal = process::open_journal(path).await.unwrap();
        let balances: BTreeMap<String, Account> = bank::fold(&journal, "", ACCOUNTS)
            .await
            .into_iter()
            .filter(|(_, account)| account.events > 0)
            .collect();
        let query = TagQuery::new(bank::account_tag());
        let tagged = journal
            .events_by_tag(&query, Offset::START, usize::MAX)
            .await
            .unwrap();
        let mut events: Vec<(String, u64)> = tagged
            .into_iter()
            .map(|e| (e.persistence_id.to_string(), e.seq))
            .collect();
        events.sort();
        journal.close().await;
        (balances, events)
    })
}
