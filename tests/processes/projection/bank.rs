//! The bank the projection tests project: accounts whose events are tagged `account` (and a
//! withdrawal also `withdrawal`), a read model of balances, and how to check it against the
//! journal.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_delivery::journal::{Journal, PersistenceId, Tag};
use actix_delivery::persistence::{
    recover_state, Decision, EventSourced, PersistentConfig, PersistentHandle, PersistentOptions,
};
use actix_delivery::projection::{Envelope, HandlerFuture, ProjectionOptions};
use serde::{Deserialize, Serialize};

/// An account: its balance and how many events made it.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    pub balance: i64,
    pub events: u32,
}

/// What happened to an account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AccountEvent {
    Deposited(i64),
    Withdrew(i64),
}

impl EventSourced for Account {
    /// An amount: deposited if positive, withdrawn if negative; 0 stores nothing.
    type Command = i64;
    type Event = AccountEvent;
    type Reply = i64;
    type Rejection = String;

    fn decide(&self, &amount: &i64) -> Result<Decision<Self>, String> {
        let event = match amount {
            0 => return Ok(Decision::reply(self.balance)),
            n if n > 0 => AccountEvent::Deposited(n),
            n => AccountEvent::Withdrew(-n),
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

    fn tags(event: &AccountEvent) -> Vec<Tag> {
        match event {
            AccountEvent::Deposited(_) => vec![account_tag()],
            AccountEvent::Withdrew(_) => vec![account_tag(), Tag::from_static("withdrawal")],
        }
    }
}

pub fn account_tag() -> Tag {
    Tag::from_static("account")
}

pub fn account_id(prefix: &str, n: usize) -> PersistenceId {
    PersistenceId::new(format!("{prefix}account-{n}")).unwrap()
}

/// The amount of command `k`: mostly deposits, every fourth a withdrawal.
pub fn amount(k: u64) -> i64 {
    let n = (k % 50 + 1) as i64;
    if k % 4 == 3 {
        -n
    } else {
        n * 3
    }
}

/// Starts `count` accounts named `<prefix>account-<n>`.
pub fn open(
    journal: &Arc<dyn Journal>,
    prefix: &str,
    count: usize,
    config: &PersistentConfig,
) -> Vec<PersistentHandle<Account>> {
    (0..count)
        .map(|n| {
            PersistentHandle::start(
                PersistentOptions::new(journal.clone(), account_id(prefix, n))
                    .config(config.clone()),
            )
            .unwrap()
        })
        .collect()
}

/// Runs commands `range` round-robin over `accounts`, each awaited.
pub async fn run(accounts: &[PersistentHandle<Account>], range: std::ops::Range<u64>) {
    for k in range {
        let account = &accounts[k as usize % accounts.len()];
        account.ask(amount(k)).await.unwrap();
    }
}

/// The accounts as the journal holds them: each recovered by the entity itself.
pub async fn fold(journal: &dyn Journal, prefix: &str, count: usize) -> BTreeMap<String, Account> {
    let mut accounts = BTreeMap::new();
    for n in 0..count {
        let id = account_id(prefix, n);
        let state = recover_state::<Account>(journal, &id).await.unwrap();
        accounts.insert(id.to_string(), state);
    }
    accounts
}

/// Every (stream, seq, event) handled, in order.
pub type Handled = Vec<(String, u64, AccountEvent)>;

/// A read model in memory: the balances, and every event handled.
#[derive(Clone, Default)]
pub struct Balances {
    inner: Arc<Mutex<(BTreeMap<String, Account>, Handled)>>,
}

impl Balances {
    /// Applies `events`.
    pub fn apply(&self, events: &[Envelope<AccountEvent>]) {
        let mut inner = self.inner.lock().unwrap();
        for envelope in events {
            let id = envelope.persistence_id.to_string();
            inner
                .0
                .entry(id.clone())
                .or_default()
                .apply(&envelope.event);
            inner.1.push((id, envelope.seq, envelope.event.clone()));
        }
    }

    /// An at-least-once handler that applies each batch.
    pub fn handler(
        &self,
    ) -> impl for<'a> FnMut(&'a [Envelope<AccountEvent>]) -> HandlerFuture<'a> + 'static + use<>
    {
        let balances = self.clone();
        move |events| {
            balances.apply(events);
            Box::pin(async { Ok(()) })
        }
    }

    pub fn accounts(&self) -> BTreeMap<String, Account> {
        self.inner.lock().unwrap().0.clone()
    }

    pub fn handled(&self) -> Handled {
        self.inner.lock().unwrap().1.clone()
    }
}

/// Asserts that `keys` holds each (stream, seq) once, each stream's in seq order (`context`
/// in the message).
pub fn assert_once_in_order<'a>(keys: impl IntoIterator<Item = (&'a str, u64)>, context: &str) {
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for (id, seq) in keys {
        let previous = last.insert(id, seq).unwrap_or(0);
        assert!(
            seq > previous,
            "{context}: {id}: seq {seq} after {previous}: twice or out of order"
        );
    }
}

/// Asserts that `handled` holds each (stream, seq) once, each stream's in seq order.
pub fn assert_each_once_in_order(handled: &[(String, u64, AccountEvent)]) {
    assert_once_in_order(
        handled.iter().map(|(id, seq, _)| (id.as_str(), *seq)),
        "handled",
    );
}

/// Projection options for the tests: short waits.
pub fn options(name: &str) -> actix_delivery::projection::ProjectionOptionsBuilder {
    ProjectionOptions::builder(name, account_tag())
        .poll_interval(Duration::from_millis(20))
        .max_poll_interval(Duration::from_millis(200))
        .retry_backoff(Duration::from_millis(10), Duration::from_millis(100))
}

/// Waits (virtual or real time, as the runtime has it) until `done`, at most `within`.
pub async fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {within:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
