//! Running the binary, and the journals it is run on: written by the library itself (a
//! persistent entity with tags, bincode and MessagePack appends, a durable producer with
//! unconfirmed messages).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use actix_delivery::codec::{Codec, Manifest};
use actix_delivery::durable::DurableOptions;
use actix_delivery::journal::{Journal, PersistenceId, SqliteJournal, Tag};
use actix_delivery::persistence::{
    Decision, EventSourced, PersistentConfig, PersistentHandle, PersistentOptions,
};
use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerOptions, ReliableDelivery};
use serde::{Deserialize, Serialize};

/// What a run of the binary did.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The stdout's lines, each parsed as JSON.
    pub fn json_lines(&self) -> Vec<serde_json::Value> {
        self.stdout
            .lines()
            .map(|line| {
                serde_json::from_str(line)
                    .unwrap_or_else(|err| panic!("not JSON ({err}): {line}\n{self:?}"))
            })
            .collect()
    }

    /// Asserts the exit code, showing the run when it is another.
    pub fn expect(self, code: i32) -> Self {
        assert_eq!(self.code, code, "exit code: {self:#?}");
        self
    }
}

/// Runs the binary with `args`.
pub fn run<I, S>(args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    run_env(args, &[])
}

/// Runs the binary with `args`, each variable of `env` set to its value or removed (`None`).
pub fn run_env<I, S>(args: I, env: &[(&str, Option<&str>)]) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut command = Command::new(env!("CARGO_BIN_EXE_actix-delivery"));
    command.args(args);
    for (name, value) in env {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    let output = command.output().expect("run the binary");
    Run {
        code: output.status.code().expect("an exit code, not a signal"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    }
}

/// Runs the binary on the SQLite journal `file` with `args`.
pub fn sqlite(file: &Path, args: &[&str]) -> Run {
    let mut all = vec!["--sqlite".as_ref(), file.as_os_str()];
    all.extend(args.iter().map(|arg| std::ffi::OsStr::new(*arg)));
    run(all)
}

/// An account: deposits and withdrawals, its events tagged `account`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Account {
    balance: i64,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum AccountEvent {
    Deposited { amount: i64 },
    Withdrew { amount: i64 },
}

impl EventSourced for Account {
    type Command = i64;
    type Event = AccountEvent;
    type Reply = i64;
    type Rejection = String;

    fn decide(&self, &amount: &i64) -> Result<Decision<Self>, String> {
        let event = if amount >= 0 {
            AccountEvent::Deposited { amount }
        } else {
            AccountEvent::Withdrew { amount: -amount }
        };
        Ok(Decision::persist([event], self.balance + amount))
    }

    fn apply(&mut self, event: &AccountEvent) {
        match *event {
            AccountEvent::Deposited { amount } => self.balance += amount,
            AccountEvent::Withdrew { amount } => self.balance -= amount,
        }
    }

    fn tags(_: &AccountEvent) -> Vec<Tag> {
        vec![Tag::from_static("account")]
    }
}

/// A message of the durable producer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Order {
    pub id: u64,
    pub total: u64,
}

pub fn id(name: &str) -> PersistenceId {
    PersistenceId::new(name).unwrap()
}

/// Writes the fixture's streams into `journal`:
/// - `account-1`: an `Account` (MessagePack, the default), +100, +50, −30, +20, −10, each
///   entry tagged `account`;
/// - `account-2`: an `Account` with a snapshot every 2 events and the events before it
///   deleted: +1, +2, +3, +4, +5 (deleted to 4, snapshot at 4);
/// - `legacy-1`: three bincode payloads of `app::Legacy` version 2, tagged `legacy`;
/// - `plain-1`: one MessagePack value `{"name": "x", "n": 7}` written with `append_as`;
/// - `orders-out`: a durable producer `fixture-producer` of `Order`s that stored orders 1, 2
///   and 3, of which only order 1 was confirmed.
pub async fn write_fixture(journal: Arc<dyn Journal>) {
    let account = PersistentHandle::<Account>::start(PersistentOptions::new(
        journal.clone(),
        id("account-1"),
    ))
    .unwrap();
    for amount in [100, 50, -30, 20, -10] {
        account.ask(amount).await.unwrap();
    }
    account.stop();
    let _ = account.stopped().await;

    let compacted = PersistentConfig {
        snapshot_every: Some(2),
        delete_events_on_snapshot: true,
        ..PersistentConfig::default()
    };
    let account = PersistentHandle::<Account>::start(
        PersistentOptions::new(journal.clone(), id("account-2")).config(compacted),
    )
    .unwrap();
    for amount in [1, 2, 3, 4, 5] {
        account.ask(amount).await.unwrap();
    }
    account.stop();
    let _ = account.stopped().await;

    let legacy: Vec<Vec<u8>> = (1u32..=3)
        .map(|n| actix_delivery::codec::encode(&(n, format!("legacy {n}"))).unwrap())
        .collect();
    let tags = vec![vec![Tag::from_static("legacy")]; legacy.len()];
    journal
        .append_tagged(
            &id("legacy-1"),
            1,
            legacy,
            Manifest::new(Codec::Bincode, "app::Legacy", 2),
            tags,
        )
        .await
        .unwrap();
    let plain = Codec::MessagePack
        .encode(&serde_json::json!({ "name": "x", "n": 7 }), 1 << 20)
        .unwrap();
    journal
        .append_as(
            &id("plain-1"),
            1,
            vec![plain],
            Manifest::new(Codec::MessagePack, "app::Plain", 1),
        )
        .await
        .unwrap();

    let handler = DeliveryHandler::from_fn(|order: Order| async move {
        if order.id == 1 {
            Ok(())
        } else {
            Err("not now".to_string())
        }
    });
    let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
    let options = ProducerOptions::builder(&consumer)
        .producer_id("fixture-producer")
        .build()
        .unwrap();
    let producer = ReliableDelivery::durable_producer(
        options,
        DurableOptions::new(journal.clone(), id("orders-out"), "fixture-producer"),
    )
    .unwrap();
    let first = producer.store(Order { id: 1, total: 500 }).await.unwrap();
    producer.store(Order { id: 2, total: 700 }).await.unwrap();
    producer.store(Order { id: 3, total: 900 }).await.unwrap();
    first.confirmed().await.unwrap();
    // The settlement of order 1 is recorded behind its ACK.
    actix_rt::time::sleep(Duration::from_millis(300)).await;
    producer.stop();
    let _ = producer.stopped().await;
    consumer.stop();
}

/// The fixture journal, written once per test run (then copied by each test).
fn fixture() -> &'static Path {
    static FIXTURE: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fixture.journal");
        let (live, file) = (dir.path().join("live.journal"), path.clone());
        // A backup, not a copy of the live files: the newest commits may still be in the -wal
        // of a journal whose last handle is still being dropped.
        std::thread::spawn(move || {
            actix::System::new().block_on(async move {
                let journal = SqliteJournal::open(&live).await.unwrap();
                write_fixture(Arc::new(journal.clone())).await;
                journal.backup(&file).await.unwrap();
                journal.close().await;
            })
        })
        .join()
        .unwrap();
        (dir, path)
    });
    path
}

/// A copy of the fixture journal in a directory of its own (which the caller keeps).
pub fn fixture_copy() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.sqlite");
    std::fs::copy(fixture(), &path).unwrap();
    (dir, path)
}

/// A copy of the repository's journal fixture `name` (`tests/fixtures/`, written by earlier
/// releases).
pub fn old_fixture_copy(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name);
    std::fs::copy(source, &path).unwrap();
    (dir, path)
}
