//! An effectively-once consumer: a bank account whose deposits arrive by reliable delivery and
//! are stored in a SQLite journal before they are acknowledged. Kill it at any moment (Ctrl-C,
//! `kill -9`) and run it again: it prints the state it recovered, and no deposit it confirmed
//! is lost or counted twice.
//!
//! `cargo run --example persistent_consumer [-- <journal file>]` (default: a file in the
//! system's temporary directory). The producer here lives in memory: deposits it had not
//! handed over when the process died are not resent by the next run.

use std::sync::Arc;
use std::time::Duration;

use actix_delivery::journal::{PersistenceId, SqliteJournal};
use actix_delivery::persistence::{
    Decision, EventSourced, PersistentConfig, PersistentHandle, PersistentOptions,
};
use actix_delivery::{ConsumerOptions, ProducerOptions, ReliableDelivery};
use serde::{Deserialize, Serialize};

/// The account: its state is what its events made it.
#[derive(Default, Serialize, Deserialize)]
struct Account {
    balance: u64,
    deposits: u64,
}

enum Command {
    Deposit(u64),
    Balance,
}

#[derive(Serialize, Deserialize)]
struct Deposited(u64);

impl EventSourced for Account {
    type Command = Command;
    type Event = Deposited;
    type Reply = (u64, u64);
    type Rejection = String;

    fn decide(&self, command: &Command) -> Result<Decision<Self>, String> {
        match *command {
            Command::Deposit(0) => Err("a deposit of 0".into()),
            Command::Deposit(amount) => Ok(Decision::persist(
                [Deposited(amount)],
                (self.balance + amount, self.deposits + 1),
            )),
            Command::Balance => Ok(Decision::reply((self.balance, self.deposits))),
        }
    }

    fn apply(&mut self, Deposited(amount): &Deposited) {
        self.balance += amount;
        self.deposits += 1;
    }
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The crate logs through `log`: show its warnings (or what RUST_LOG asks for) on stderr.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let path = std::env::args().nth(1).map_or_else(
        || std::env::temp_dir().join("actix-delivery-persistent-consumer.db"),
        Into::into,
    );
    let journal = SqliteJournal::open(&path).await?;
    let account = PersistentHandle::<Account>::start(
        PersistentOptions::new(Arc::new(journal), PersistenceId::new("account-42")?).config(
            PersistentConfig {
                snapshot_every: Some(100),
                ..Default::default()
            },
        ),
    )?;
    let (balance, deposits) = account.ask(Command::Balance).await?;
    println!(
        "recovered from {}: balance {balance} after {deposits} deposits",
        path.display()
    );

    // Each delivered message becomes a Deposit command; it is ACKed once the deposit (and the
    // record that this delivery was processed) is in the journal.
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(account.delivery_handler(Command::Deposit)).build()?,
    );
    let producer = ReliableDelivery::producer(ProducerOptions::builder(&consumer).build()?);
    for amount in 1..=20 {
        producer.send(amount).await?;
        let (balance, deposits) = account.ask(Command::Balance).await?;
        println!("deposited {amount:>2}: balance {balance}, {deposits} deposits (kill me now)");
        actix::clock::sleep(Duration::from_millis(150)).await;
    }
    let (balance, deposits) = account.ask(Command::Balance).await?;
    println!("done: balance {balance} after {deposits} deposits; run me again");
    Ok(())
}
