//! # Testing an application that uses it
//!
//! What your tests can control: time (retransmissions and timeouts run in virtual time), the
//! journal (a [`MemoryJournal`](crate::journal::MemoryJournal) that fails, holds or loses
//! commits on demand), and what each part counts (every handle's `stats()`). For crashes, real
//! processes and `kill -9`.
//!
//! ## Virtual time
//!
//! Under `tokio::time::pause()` (Tokio's `test-util` feature, in your dev-dependencies) the
//! clock stands still while anything can run and jumps to the next timer when nothing can, so
//! minutes of retransmission take no real time and every timing is exact. A handler that fails
//! twice runs three times, its message is retransmitted twice, one resend timeout (500 ms by
//! default) after each failure:
//!
//! ```
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerOptions, ReliableDelivery};
//!
//! # /*
//! #[actix::test]
//! # */
//! async fn a_failing_handler_gets_its_message_again() {
//!     tokio::time::pause();
//!     let runs = Arc::new(AtomicU32::new(0));
//!     let counted = runs.clone();
//!     let handler = DeliveryHandler::from_fn(move |_order: String| {
//!         let run = counted.fetch_add(1, Ordering::Relaxed) + 1;
//!         async move { if run < 3 { Err("not yet") } else { Ok(()) } }
//!     });
//!     let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
//!     let producer =
//!         ReliableDelivery::producer(ProducerOptions::builder(&consumer).build().unwrap());
//!
//!     let started = tokio::time::Instant::now();
//!     producer.send("espresso".to_string()).await.unwrap();
//!     assert_eq!(runs.load(Ordering::Relaxed), 3);
//!     assert!(started.elapsed() >= Duration::from_millis(1_000));
//!     assert_eq!(producer.stats().await.unwrap().retransmitted, 2);
//! }
//! # fn main() {
//! #     actix::System::new().block_on(a_failing_handler_gets_its_message_again());
//! # }
//! ```
//!
//! `#[actix::test]` runs each test on an Actix system of its own. Wait for what you assert on
//! (`send(…).await`, a handle's `idle()`, `opened()` or `stopped()`, or a short
//! `tokio::time::sleep`, which under a paused clock returns once everything else has run), never
//! on a real delay.
//!
//! ## A journal that misbehaves on demand
//!
//! [`MemoryJournal`](crate::journal::MemoryJournal) has the semantics of the durable journals
//! ("committed" means stored in this process) and a fault hook,
//! [`MemoryJournal::faults`](crate::journal::MemoryJournal::faults): fail the nth append,
//! hold commits until released, or crash, which fails every held append as a process that died
//! before its commit would. A persistent entity answers only what was committed, and a new
//! incarnation recovers exactly that:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use actix_delivery::journal::{MemoryJournal, PersistenceId};
//! use actix_delivery::persistence::{Decision, EventSourced, PersistentHandle, PersistentOptions};
//!
//! #[derive(Default, serde::Serialize, serde::Deserialize)]
//! struct Account {
//!     balance: u64,
//! }
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Deposited(u64);
//!
//! impl EventSourced for Account {
//!     type Command = u64;
//!     type Event = Deposited;
//!     type Reply = u64;
//!     type Rejection = String;
//!
//!     fn decide(&self, amount: &u64) -> Result<Decision<Self>, String> {
//!         Ok(Decision::persist([Deposited(*amount)], self.balance + amount))
//!     }
//!
//!     fn apply(&mut self, Deposited(amount): &Deposited) {
//!         self.balance += amount;
//!     }
//! }
//!
//! fn start(journal: &MemoryJournal) -> PersistentHandle<Account> {
//!     let id = PersistenceId::new("account-1").unwrap();
//!     PersistentHandle::start(PersistentOptions::new(Arc::new(journal.clone()), id)).unwrap()
//! }
//!
//! # /*
//! #[actix::test]
//! # */
//! async fn a_deposit_is_answered_once_committed_and_lost_with_a_crash_before() {
//!     tokio::time::pause();
//!     let journal = MemoryJournal::new();
//!     let faults = journal.faults();
//!     let account = start(&journal);
//!     account.opened().await.unwrap();
//!
//!     faults.hold_commits(); // appends wait instead of committing
//!     let deposit = account.ask(50);
//!     tokio::time::sleep(Duration::from_millis(1)).await;
//!     assert_eq!(faults.held(), 1); // decided and written, not committed: no answer yet
//!     faults.release();
//!     assert_eq!(deposit.await.unwrap(), 50);
//!
//!     faults.hold_commits();
//!     let lost = account.ask(10);
//!     tokio::time::sleep(Duration::from_millis(1)).await;
//!     faults.crash(); // the held append fails, as in a process killed before its commit
//!     assert!(lost.await.is_err());
//!
//!     let recovered = start(&journal); // the next life reads what was committed
//!     assert_eq!(recovered.ask(0).await.unwrap(), 50);
//! }
//! # fn main() {
//! #     actix::System::new()
//! #         .block_on(a_deposit_is_answered_once_committed_and_lost_with_a_crash_before());
//! # }
//! ```
//!
//! The same journal under a [durable producer](super::durable_producers) shows what your
//! code hears when a store is in doubt (`DeliveryError::InDoubt`), and what the next start
//! resends.
//!
//! ## Counters as assertions
//!
//! Every part counts what it did: `ProducerHandle::stats` (sent, confirmed, retransmitted,
//! in flight, queued, ignored ACKs, …), `ConsumerHandle::stats` (handled, duplicates, every
//! refusal by kind), `PersistentHandle::stats`, `MemoryJournal::stats` (appends and commits,
//! so a test sees how its writes were batched), and the stats of nodes, carriers, pools, hosts
//! and projections. Assert on them rather than on log lines: they are the same figures the
//! `metrics` feature exports.
//!
//! ## Crashes: real processes
//!
//! What survives `kill -9` can only be shown by killing a process. The crate's own crash tests
//! re-run their test binary as a child (naming the child's test by an environment variable),
//! let it write to a SQLite journal in a temporary directory, SIGKILL it at seeded moments
//! (aimed at markers the child prints, not at guessed delays) and check from the journal what
//! survived; `tests/README.md` describes them and how to replay a seed. Run such tests in a
//! release build too: an optimized child reaches other moments between two markers.
