//! # Operating it: dead letters, the inspector, the console
//!
//! What an operator needs when something is stuck: what was given up and why, kept with its
//! body and replayable; which durable stream holds unconfirmed messages and since when; where
//! the shards live; how far a projection lags. This chapter shows the three tools: the
//! dead-letter store, the command-line inspector and the admin console.
//!
//! ## Dead letters that are kept
//!
//! A message that a part gives up is otherwise gone but for a log line. Give the part a
//! [`DeadLetters`](crate::dead_letters::DeadLetters) handle and it keeps each one, with its body
//! as stored bytes and its [`Manifest`](crate::codec::Manifest), where it came from, its stable
//! key, why ([`DeadLetterCause`](crate::dead_letters::DeadLetterCause)), its attempts and its
//! last error:
//!
//! | part | what it keeps | how |
//! |---|---|---|
//! | a producer | messages it gave up after `max_attempts`, the body in MessagePack | [`ProducerOptionsBuilder::keep_dead_letters`](crate::ProducerOptionsBuilder::keep_dead_letters) |
//! | a consumer | deliveries it refuses: undecodable or incompatible bodies (the bytes as received), malformed ones | [`ConsumerOptionsBuilder::keep_dead_letters`](crate::ConsumerOptionsBuilder::keep_dead_letters) |
//! | a work-pulling pool | jobs it gave up (`give_up_after`), the body in MessagePack | [`WorkPullingOptionsBuilder::keep_dead_letters`](crate::work_pulling::WorkPullingOptionsBuilder::keep_dead_letters) |
//! | an entity host | what its consumer refuses (misrouted, foreign, undecodable) | [`EntityHostOptionsBuilder::keep_dead_letters`](crate::sharding::EntityHostOptionsBuilder::keep_dead_letters) |
//! | a projection | entries its poison policy skipped, the event as stored | [`Projection::keep_dead_letters`](crate::projection::Projection::keep_dead_letters) |
//!
//! The store is bounded: at most `max_entries` entries and `max_bytes` bytes; a body above
//! `max_body_bytes` is not kept (its length is); a second letter of the same source and key
//! updates the first. What a peer sends in bulk (undecodable, incompatible or malformed
//! deliveries) is sampled: each source keeps a burst per cause, then one per interval, and
//! counts the rest, however patient the peer
//! ([`DeadLetterLimits`](crate::dead_letters::DeadLetterLimits)). Beyond the bounds, the
//! oldest entries a peer's input caused are dropped first (counted); a peer's letter for
//! which that leaves no room loses its body (its length stays); then the oldest of the rest
//! go. A peer's flood so replaces its own entries, and takes of the give-ups and poison of
//! this process's parts at most the room of one entry without its body.
//!
//! Three stores keep to the same rules:
//! [`MemoryDeadLetters`](crate::dead_letters::MemoryDeadLetters) (gone at exit),
//! `journal::SqliteDeadLetters` and `journal::PostgresDeadLetters` (features `sqlite`,
//! `postgres`), which keep them in the journal's database, in a table of their own: adding it
//! raises no schema version, so a previous release still opens the journal.
//!
//! ### Replay, effectively once
//!
//! A replay sends an entry back through a route the application registers per source, and
//! removes the entry once the route resolved. The route gets the body decoded (or
//! [`Unreplayable`](crate::dead_letters::DeadLetterError::Unreplayable) when the application
//! no longer reads its type: nothing changes) and the replay's stable delivery id,
//! [`Replay::info`](crate::dead_letters::Replay::info): the same for every replay of the entry.
//! Sent to an effectively-once destination under that id, the entry is applied once, even when
//! a crash comes between the destination's commit and the entry's removal and the operator
//! replays it again (the destination answers "already processed"; `tests/processes/` proves it
//! with SIGKILLs):
//!
//! ```
//! use std::sync::Arc;
//! use actix_delivery::dead_letters::{
//!     DeadLetterLimits, DeadLetters, MemoryDeadLetters, Replay, Replayed, RouteError,
//! };
//! use actix_delivery::journal::{MemoryJournal, PersistenceId};
//! use actix_delivery::persistence::{
//!     CommandError, Decision, EventSourced, Outcome, PersistentHandle, PersistentOptions,
//! };
//! # #[derive(Default, serde::Serialize, serde::Deserialize)] struct Stock(u64);
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Added(u64);
//! # impl EventSourced for Stock {
//! #     type Command = u64; type Event = Added; type Reply = (); type Rejection = String;
//! #     fn decide(&self, n: &u64) -> Result<Decision<Self>, String> { Ok(Decision::persist([Added(*n)], ())) }
//! #     fn apply(&mut self, Added(n): &Added) { self.0 += n }
//! # }
//!
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dead_letters = DeadLetters::new(MemoryDeadLetters::new(DeadLetterLimits::default())?);
//! let stock = PersistentHandle::<Stock>::start(PersistentOptions::new(
//!     Arc::new(MemoryJournal::new()),
//!     PersistenceId::new("stock")?,
//! ))?;
//! // The jobs a pool named "restock" gave up go back to the entity, once each.
//! dead_letters.on_replay("restock", move |replay: Replay<u64>| {
//!     let answer = stock.ask_delivered(replay.info, replay.body);
//!     async move {
//!         match answer.await {
//!             Ok(Outcome::Done(())) => Ok(Replayed::Applied),
//!             Ok(Outcome::AlreadyProcessed) => Ok(Replayed::AlreadyApplied),
//!             // The entity refused it: certainly not applied.
//!             Err(rejected @ CommandError::Rejected(_)) => {
//!                 Err(RouteError::certainly_not(rejected.to_string()))
//!             }
//!             Err(error) => Err(error.to_string().into()),
//!         }
//!     }
//! });
//! # Ok(()) }
//! ```
//!
//! [`DeadLetters::replay`](crate::dead_letters::DeadLetters::replay) replays one entry;
//! [`list`](crate::dead_letters::DeadLetters::list) pages through them with a
//! [`DeadLetterFilter`](crate::dead_letters::DeadLetterFilter) (cause, kind, source, time;
//! [`DeadLetterFilter::parse`](crate::dead_letters::DeadLetterFilter::parse) reads one from
//! query pairs and names the field at fault), and
//! [`delete`](crate::dead_letters::DeadLetters::delete) drops one without replaying it. Every
//! error says whether the operation happened
//! ([`DeadLetterError::happened`](crate::dead_letters::DeadLetterError::happened)); a failed
//! replay says what its route said: a route's error is in doubt unless the route knows the
//! destination refused the message before applying it
//! ([`RouteError::certainly_not`](crate::dead_letters::RouteError::certainly_not), as above).
//!
//! ## The command-line inspector
//!
//! `actix-delivery` (the workspace's `actix-delivery-cli` package: `cargo run -p
//! actix-delivery-cli -- --help`) reads a SQLite journal file or a PostgreSQL schema, read-only
//! and beside the running application (SQLite: a read-only connection that takes no lock):
//!
//! ```text
//! actix-delivery --sqlite orders.db streams              # streams, their highest seq
//! actix-delivery --sqlite orders.db events orders --json # events, MessagePack as JSON
//! actix-delivery --postgres "host=db user=ops dbname=app" durable   # unconfirmed messages
//! actix-delivery --sqlite orders.db check                # gaps, tags, offsets, schema
//! actix-delivery --sqlite orders.db backup copy.db       # an online backup
//! actix-delivery --sqlite orders.db dead-letters list --cause given_up
//! actix-delivery --sqlite orders.db dead-letters show 7  # the body as JSON, or hex
//! actix-delivery --sqlite orders.db --write dead-letters delete 7
//! actix-delivery --write dead-letters replay 7 --console http://127.0.0.1:8080/admin
//! ```
//!
//! `durable` lists each durable producer's stream with the messages it holds unconfirmed (seq,
//! when stored, size), read with the producer's own log; `check` exits 1 naming each broken
//! invariant. A replay needs the application's routes, so `dead-letters replay` asks the
//! application's console (below) to replay the entry, with the bearer token from an
//! environment variable (`ACTIX_DELIVERY_ADMIN_TOKEN`), never the command line. Exit codes: 0
//! done, 1 problems found, 2 usage or bad input (naming the argument), 3 storage or connection
//! errors.
//!
//! ## The admin console
//!
//! With feature `admin`, an `admin::Console` given the application's
//! parts (each under a name: producers, consumers, pools, projections, entity hosts,
//! coordinators and shard maps, nodes, carriers, the dead letters) answers on a scope the
//! application mounts on its own actix-web server. Nothing is collected until a request asks.
//! `examples/actix_web.rs` mounts it at `/admin`:
//!
//! ```text
//! cargo run --example actix_web --features metrics,admin   # then open localhost:8080/admin/
//! ```
//!
//! The page (and `GET /overview`) lists first what needs attention: a durable stream whose
//! oldest unconfirmed message waits longer than `stuck_after`, writes in doubt, a stalled
//! producer or consumer, a pool with jobs and no worker, a projection stopped by a poison
//! event or lagging, shards without a live lease, a carrier that is not connected, the dead
//! letters by cause; then each part's table. A dead letter is shown with its body (MessagePack
//! as JSON), and replayed or deleted by a POST that carries the confirmation token its show
//! returned, so a stray or repeated POST changes nothing. The console has no authentication of
//! its own: mount it behind the application's, or require a bearer token on every route
//! (`Console::require_bearer`). The `admin` module lists every endpoint and error.
