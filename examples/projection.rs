//! A read model fed from the journal, exactly once: the bank's accounts (persistent entities
//! whose events are tagged `account`) write to a SQLite journal, and a projection keeps a
//! table of balances in a SQLite file of its own, each batch of events applied in the
//! transaction that stores the projection's offset.
//!
//! Kill it at any moment (Ctrl-C, `kill -9`) and run it again: the accounts recover, the
//! projection goes on from its stored offset, and once it has caught up the program checks
//! the read model against the journal (each account's balance as the entity recovers it, and
//! the number of events behind it): no event lost, none applied twice.
//!
//! `cargo run --example projection [-- <directory>]` (default: the system's temporary
//! directory); it writes `bank.journal` and `bank-read-model.db` there.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::journal::{Journal, Offset, PersistenceId, SqliteJournal, Tag, TagQuery};
use actix_delivery::persistence::{
    recover_state, Decision, EventSourced, PersistentHandle, PersistentOptions,
};
use actix_delivery::projection::{
    Envelope, HandlerError, Projection, ProjectionHandle, ProjectionOptions, SqliteReadModel,
};
use serde::{Deserialize, Serialize};

const ACCOUNTS: usize = 5;
const ROUNDS: u64 = 30;

/// An account: its state is what its events made it.
#[derive(Default, Serialize, Deserialize)]
struct Account {
    balance: i64,
    events: i64,
}

#[derive(Debug, Serialize, Deserialize)]
enum AccountEvent {
    Deposited(i64),
    Withdrew(i64),
}

impl EventSourced for Account {
    /// An amount: deposited if positive, withdrawn if negative (refused beyond the balance).
    type Command = i64;
    type Event = AccountEvent;
    type Reply = i64;
    type Rejection = String;

    fn decide(&self, &amount: &i64) -> Result<Decision<Self>, String> {
        if amount < 0 && self.balance + amount < 0 {
            return Err(format!("only {} left", self.balance));
        }
        let event = if amount >= 0 {
            AccountEvent::Deposited(amount)
        } else {
            AccountEvent::Withdrew(-amount)
        };
        Ok(Decision::persist([event], self.balance + amount))
    }

    fn apply(&mut self, event: &AccountEvent) {
        self.balance += match *event {
            AccountEvent::Deposited(n) => n,
            AccountEvent::Withdrew(n) => -n,
        };
        self.events += 1;
    }

    /// Every event of an account is filed under `account`: the projection follows that tag.
    fn tags(_: &AccountEvent) -> Vec<Tag> {
        vec![Tag::from_static("account")]
    }
}

/// The read model's table.
const BALANCES: &str = "CREATE TABLE IF NOT EXISTS balances (
    account TEXT PRIMARY KEY, balance INTEGER NOT NULL, events INTEGER NOT NULL)";

/// Applies a batch of events to the read model, in the projection's transaction.
fn apply(
    transaction: &rusqlite::Transaction<'_>,
    events: &[Envelope<AccountEvent>],
) -> Result<(), HandlerError> {
    for envelope in events {
        let delta = match envelope.event {
            AccountEvent::Deposited(n) => n,
            AccountEvent::Withdrew(n) => -n,
        };
        transaction.execute(
            "INSERT INTO balances (account, balance, events) VALUES (?1, ?2, 1) \
             ON CONFLICT (account) DO UPDATE SET balance = balance + ?2, events = events + 1",
            rusqlite::params![envelope.persistence_id.as_str(), delta],
        )?;
    }
    Ok(())
}

/// The read model's accounts, read as any reader of it would: a connection of its own.
fn read_model(path: &Path) -> rusqlite::Result<Vec<(String, i64, i64)>> {
    let connection = rusqlite::Connection::open(path)?;
    let mut statement =
        connection.prepare("SELECT account, balance, events FROM balances ORDER BY account")?;
    let rows = statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?;
    rows.collect()
}

/// Waits until the projection has handled every tagged entry committed so far; its error if
/// it stops first (an entry it cannot get past, a read model that does not fit the journal).
async fn catch_up(
    journal: &dyn Journal,
    projection: &ProjectionHandle,
) -> Result<(), Box<dyn std::error::Error>> {
    let query = TagQuery::new(Tag::from_static("account"));
    let mut last = Offset::START;
    loop {
        let page = journal.events_by_tag(&query, last, 10_000).await?;
        match page.last() {
            Some(newest) => last = newest.offset,
            None => break,
        }
    }
    let caught_up = async {
        while projection.stats().offset < last {
            actix::clock::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        () = caught_up => Ok(()),
        stopped = projection.stopped() => Err(match stopped {
            Err(error) => error.into(),
            Ok(()) => "the projection stopped before catching up".into(),
        }),
    }
}

/// Compares the read model with the journal: each account's state as the entity recovers it.
async fn check(journal: &dyn Journal, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let mut expected = Vec::new();
    for n in 0..ACCOUNTS {
        let id = PersistenceId::new(format!("account-{n}"))?;
        let account = recover_state::<Account>(journal, &id).await?;
        if account.events > 0 {
            expected.push((id.to_string(), account.balance, account.events));
        }
    }
    let found = read_model(path)?;
    let events: i64 = found.iter().map(|(_, _, events)| events).sum();
    if found == expected {
        println!("the read model equals the journal: {events} events, each applied once");
        Ok(())
    } else {
        Err(format!("the read model {found:?} differs from the journal {expected:?}").into())
    }
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let dir = std::env::args()
        .nth(1)
        .map_or_else(std::env::temp_dir, Into::into);
    let journal: Arc<dyn Journal> = Arc::new(SqliteJournal::open(dir.join("bank.journal")).await?);
    let model_path = dir.join("bank-read-model.db");
    let mut model = SqliteReadModel::open(&model_path).await?;
    model.execute_batch(BALANCES).await?;

    let options = ProjectionOptions::builder("balances", Tag::from_static("account")).build()?;
    let projection =
        Projection::of::<Account>(journal.clone(), options).exactly_once_sqlite(model, apply);
    catch_up(&*journal, &projection).await?;
    println!(
        "caught up from offset {} ({} events handled in this run)",
        projection.stats().offset,
        projection.stats().events
    );
    check(&*journal, &model_path).await?;

    let accounts: Vec<PersistentHandle<Account>> = (0..ACCOUNTS)
        .map(|n| {
            let id = PersistenceId::new(format!("account-{n}"))?;
            Ok(PersistentHandle::start(PersistentOptions::new(
                journal.clone(),
                id,
            ))?)
        })
        .collect::<Result<_, Box<dyn std::error::Error>>>()?;
    for round in 1..=ROUNDS {
        for (n, account) in accounts.iter().enumerate() {
            let amount = if (round + n as u64).is_multiple_of(3) {
                -7
            } else {
                10 + n as i64
            };
            let _ = account.ask(amount).await; // a refused withdrawal stores nothing
        }
        let stats = projection.stats();
        let total: i64 = read_model(&model_path)?
            .iter()
            .map(|(_, balance, _)| balance)
            .sum();
        println!(
            "round {round:>2}: read model total {total}, {} events projected, lag {} ms \
             (kill me now)",
            stats.events, stats.lag_ms
        );
        actix::clock::sleep(Duration::from_millis(100)).await;
    }
    catch_up(&*journal, &projection).await?;
    check(&*journal, &model_path).await?;
    projection.stop();
    projection.stopped().await?;
    println!("done; run me again");
    Ok(())
}
