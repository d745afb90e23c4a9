//! The shared journal: PostgreSQL through `tokio-postgres`, group commit, fenced by the
//! database (feature `postgres`).
//!
//! The module map: [`PostgresJournal`] here (its handle, its queue and the [`Journal`]
//! calls), then one file per part:
//!
//! - `config`: [`PostgresConfig`] and [`PostgresStats`] (and the counters behind them);
//! - `options`: [`PostgresOptions`], built around a [`PostgresConfig`] (with TLS and the
//!   metrics label), validated when built;
//! - `connection_string`: parsing a connection string without ever echoing its password;
//! - `connector`: opening connections on the journal's runtime, and what a lost one is;
//! - `tls`: TLS to the server (feature `tls`);
//! - `schema`: the tables, their version check, creation and migrations (`*.sql`);
//! - `statements`: the SQL of the writer's and readers' statements for one schema;
//! - `writer`: the write connection and its group commit;
//! - `reader`: the read connections and what the reads make of their rows;
//! - `listener`: hearing of every process's tagged commits (`LISTEN/NOTIFY`).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::thread;

use tokio::sync::{mpsc, oneshot, Semaphore};

mod config;
mod connection_string;
mod connector;
mod dead_letters;
mod inspect;
mod listener;
mod options;
mod reader;
mod schema;
mod statements;
#[cfg(feature = "tls")]
mod tls;
mod writer;

pub(crate) use config::is_plain_identifier;
pub use config::{PostgresConfig, PostgresStats};
pub(crate) use connection_string::parse_config;
pub(crate) use connector::is_connection_lost;
pub use dead_letters::PostgresDeadLetters;
pub use inspect::PostgresInspector;
pub use options::{PostgresOptions, PostgresOptionsBuilder};
#[cfg(feature = "tls")]
pub use tls::PostgresTls;

use crate::codec::Manifest;
use crate::journal::write::{WriteOp, WriteRequest};
use crate::journal::{
    check_max_events, check_payload, check_tagged_append, normalized, Journal, JournalError,
    JournalFuture, JournalId, Offset, PersistenceId, Snapshot, StoredEvent, Tag, TagNotifications,
    TagQuery, TagSignal, TaggedEvent, MAX_SEQ,
};
use crate::runtime::error_chain::ErrorChain;
use config::Counters;
use connector::Connector;
use reader::Readers;
use statements::Sql;

/// The [`Journal`] for applications whose nodes share one database: PostgreSQL, through
/// `tokio-postgres` (feature `postgres`). A commit is durable when PostgreSQL says it is
/// (`synchronous_commit` as the server is configured; the default, `on`, waits for the WAL
/// flush).
///
/// ```no_run
/// use actix_delivery::journal::{Journal, PersistenceId, PostgresJournal, PostgresOptions};
///
/// # async fn _demo() -> Result<(), Box<dyn std::error::Error>> {
/// let journal = PostgresJournal::connect_with(
///     "host=127.0.0.1 user=postgres dbname=orders",
///     PostgresOptions::builder().schema("journal").build()?,
/// )
/// .await?; // creates the tables on first connect
/// let id = PersistenceId::new("order-4711")?;
/// let next = journal.highest_seq(&id).await? + 1;
/// journal.append(&id, next, vec![b"created".to_vec()]).await?; // committed when Ok
/// # Ok(()) }
/// ```
///
/// **The fence.** Every node may append to every stream; the database makes a second writer
/// harmless. An append is one conditional statement: it moves the stream's row in
/// `stream_metadata` from `first_seq - 1` to its last seq and stores its events, or (if the
/// row says otherwise) does neither, and the caller gets [`JournalError::Conflict`] with the
/// stream's real highest seq. Writers of one stream on different nodes are serialised by that
/// row's lock: the later one waits for the earlier one's commit, then sees its new highest
/// seq. The primary key `(persistence_id, seq_nr)` of `event_journal` backs this up: no seq
/// is ever stored twice.
///
/// **Group commit.** One writer connection takes every write that arrived while its previous
/// transaction ran, from all streams (up to the batch bounds of [`PostgresConfig`]), and
/// sends them as one pipelined transaction: `BEGIN`, one set-based statement for all the
/// appends (one more for each further append to a stream already in it), the deletes and
/// snapshots, `COMMIT`, in one round trip. A conflict is not an error inside the transaction
/// (the statement just leaves that append out), so it refuses only its own append. A database
/// error (a deadlock with another node, a foreign row in the way) rolls the group back; its
/// writes are then retried one per transaction, so only the one at fault fails.
///
/// **Lost connections.** If the connection breaks (or the server restarts) while a group's
/// transaction is in flight, each of its callers gets a [`JournalError::Storage`] error that
/// says the write *may or may not* be stored (the commit may have been applied before its
/// answer was lost): re-read the stream before going on. Nothing is ever reported `Ok` that
/// PostgreSQL did not confirm. The writer connects again on the next write (with backoff
/// after failed attempts, [`PostgresOptionsBuilder::reconnect_backoff`]); while the server
/// cannot be reached, writes fail with `Storage` errors. Reads use their own connections,
/// which are replaced the same way; a read whose connection broke is retried once on a new
/// one.
///
/// **Bounded.** Writes queue in front of the writer up to `queue_capacity` writes and
/// `max_queued_bytes` payload bytes; beyond that callers wait. Events and snapshots larger
/// than [`PostgresJournal::MAX_PAYLOAD_BYTES`] are refused.
///
/// **Tags.** A tagged append ([`Journal::append_tagged`]) writes an `event_tag` row per tag of
/// each entry in its transaction, numbered by the transaction's id and a per-row number: the
/// [`Offset`] [`Journal::events_by_tag`] reads after, which never skips an entry, also when
/// processes commit out of order (the query reads only below `pg_snapshot_xmin`, so a
/// transaction left open anywhere on the server holds the live tail back until it ends; see
/// [`Offset`]). The transaction also sends a `pg_notify` (channel `actix_delivery_tags`,
/// payload the schema's name) that [`Journal::tag_notifications`] listens for on a
/// connection of its own (opened at its first call, connected again after a loss); every
/// `NOTIFY` takes a lock that serialises the commits of the server's notifying transactions,
/// which the group commit makes one per group. Needs PostgreSQL 13 or newer (`xid8`).
///
/// **Reads** (`replay`, `highest_seq`, `load_snapshot`, `events_by_tag`) run on separate
/// connections (`readers`), so they never wait behind the writer's transaction. The connections'
/// I/O runs on the journal's own thread, so the futures can be awaited on any runtime (an Actix
/// arbiter, a current-thread Tokio runtime) and never block the caller's thread. Clones share one
/// journal; when the last handle is dropped (or [`close`](Self::close)d), the writer finishes the
/// writes already queued, replies to each, and the connections close.
///
/// The tables and their version check: [`PostgresJournal::SCHEMA_SQL`]. TLS needs the feature
/// `tls` (`PostgresOptionsBuilder::tls`: `sslmode=require` or `verify-full`); without it,
/// connect over a trusted network or a Unix socket.
#[derive(Clone)]
pub struct PostgresJournal {
    shared: Arc<Shared>,
}

struct Shared {
    writes: mpsc::Sender<WriteRequest>,
    queued_bytes: Arc<Semaphore>,
    max_queued_bytes: u32,
    readers: Readers,
    counters: Arc<Counters>,
    signal: Arc<TagSignal>,
    /// The journal's identity, if its schema has one.
    id: Option<JournalId>,
    /// Whether the listener for other processes' tagged commits was started.
    listening: std::sync::Once,
    /// Resolves (with an error: its sender is dropped) when the journal's thread has ended.
    thread: Mutex<Option<oneshot::Receiver<()>>>,
}

impl PostgresJournal {
    /// The largest event or snapshot payload the PostgreSQL journal stores: 512 MiB
    /// (PostgreSQL's own limit for a value is 1 GB).
    pub const MAX_PAYLOAD_BYTES: usize = crate::journal::MAX_PAYLOAD_BYTES;

    /// The SQL that creates the journal's tables (the current schema version), also in the crate's
    /// `src/journal/postgres/schema.sql`. Table names are unqualified: run it with the
    /// intended schema first in the `search_path`. The journal runs it itself on first
    /// connect unless [`PostgresOptionsBuilder::create_tables`] is off.
    pub const SCHEMA_SQL: &'static str = include_str!("schema.sql");

    /// The SQL that migrates the tables from schema version 1 (actix-delivery 0.1) to the
    /// current one, `src/journal/postgres/migrate_1_to_2.sql`. The journal runs it itself on
    /// connect unless [`PostgresOptionsBuilder::create_tables`] is off; run it by hand (in
    /// one transaction, with the intended schema first in the `search_path`) otherwise.
    pub const MIGRATE_1_TO_2_SQL: &'static str = include_str!("migrate_1_to_2.sql");

    /// The SQL that migrates the tables from schema version 2 to 3 (the tags),
    /// `src/journal/postgres/migrate_2_to_3.sql`; run after
    /// [`MIGRATE_1_TO_2_SQL`](Self::MIGRATE_1_TO_2_SQL) for a schema of version 1. The journal runs
    /// it itself on connect unless [`PostgresOptionsBuilder::create_tables`] is off.
    pub const MIGRATE_2_TO_3_SQL: &'static str = include_str!("migrate_2_to_3.sql");

    /// The SQL that gives a journal schema its identity, [`Journal::journal_id`], if it has
    /// none (a schema made before ids existed), `src/journal/postgres/identity.sql`: a table
    /// `journal_identity` of one row, a random id. [`SCHEMA_SQL`](Self::SCHEMA_SQL) holds it
    /// too, and the journal runs it itself on connect unless
    /// [`PostgresOptionsBuilder::create_tables`] is off (then a schema without it is used
    /// without an id, and read models cannot tell it from another journal). It changes neither
    /// the schema version nor another table, so the previous release still reads the journal.
    pub const IDENTITY_SQL: &'static str = include_str!("identity.sql");

    /// The SQL that re-numbers the tag rows after a logical restore (`pg_dump`/`pg_restore`)
    /// into a cluster whose transaction ids are lower than those that wrote them,
    /// `src/journal/postgres/renumber_tags.sql`; [`connect_with`](Self::connect_with) refuses
    /// such a schema and names it. Every tag row gets the id of the transaction that runs it,
    /// keeping its `ordering`, which then orders the entries alone: each stream's entries stay
    /// in seq order, entries of different streams written concurrently may change places,
    /// and every entry appended afterwards sorts after them all. Offsets stored before mean
    /// nothing afterwards: reset the projections (read model and offset) to read from
    /// [`Offset::START`]. A physical copy (`pg_basebackup`, a file-system snapshot,
    /// `pg_upgrade`) keeps the transaction ids and needs none of this. Run it in one
    /// transaction, with the journal's schema first in the `search_path` and no journal
    /// connected.
    pub const RENUMBER_TAGS_SQL: &'static str = include_str!("renumber_tags.sql");

    /// Connects with default [`PostgresOptions`] (tables in `public`).
    ///
    /// # Errors
    /// As [`connect_with`](Self::connect_with).
    pub async fn connect(connection: &str) -> Result<Self, JournalError> {
        Self::connect_with(connection, PostgresOptions::default()).await
    }

    /// Connects to the database that `connection` names (a libpq-style `key=value` string or a
    /// `postgresql://` URL, as `tokio_postgres::Config` parses them), checks the schema, or
    /// creates the tables if there are none, and opens the writer and the read connections.
    /// Connections without an `application_name` get `actix-delivery journal`.
    ///
    /// # Errors
    /// [`JournalError::InvalidArgument`] for a `connection` that does not parse (saying what did
    /// not, never the password); [`JournalError::Schema`] if the schema
    /// holds a newer or foreign version of the tables (nothing is changed), or none while
    /// `create_tables` is off, or more than one journal id, or tag rows written
    /// under transaction ids this server has not reached (a logical restore into another
    /// cluster: new entries would sort before them; see
    /// [`RENUMBER_TAGS_SQL`](Self::RENUMBER_TAGS_SQL));
    /// [`JournalError::Storage`] if the server cannot be reached, refuses the login, or
    /// refuses to create the tables (privileges), or the journal's thread cannot start.
    /// (Invalid settings were refused when the `options` were built.)
    pub async fn connect_with(
        connection: &str,
        options: PostgresOptions,
    ) -> Result<Self, JournalError> {
        let config = &options.config;
        let mut server =
            parse_config(connection).map_err(|reason| JournalError::InvalidArgument {
                persistence_id: None,
                reason,
            })?;
        if server.get_application_name().is_none() {
            server.application_name("actix-delivery journal");
        }
        server.connect_timeout(config.connect_timeout);

        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|err| {
                JournalError::storage(
                    None,
                    format!("cannot start a runtime: {}", ErrorChain(&err)),
                )
            })?;
        let counters = Arc::new(Counters::default());
        let signal = Arc::new(TagSignal::default());
        let sql = Arc::new(Sql::new(&config.schema));
        #[cfg(feature = "tls")]
        if options.tls.is_some() {
            // Never fall back to an unencrypted connection.
            server.ssl_mode(tokio_postgres::config::SslMode::Require);
        }
        let connector = Connector {
            config: server,
            runtime: runtime.handle().clone(),
            connect_timeout: config.connect_timeout,
            sql: sql.clone(),
            #[cfg(feature = "tls")]
            tls: options.tls.as_ref().map(tls::PostgresTls::connector),
        };

        let (writes, queue) = mpsc::channel(config.queue_capacity);
        let (opened, writer_ready) = oneshot::channel();
        let (alive, ended) = oneshot::channel::<()>();
        let writer = writer::Writer::new(
            connector.clone(),
            options.clone(),
            counters.clone(),
            signal.clone(),
        );
        thread::Builder::new()
            .name("actix-delivery-postgres".to_string())
            .spawn(move || {
                let _alive = alive; // dropped when the thread ends
                runtime.block_on(writer.run(queue, opened));
                // Dropping the runtime ends the read connections' tasks.
            })
            .map_err(|err| {
                JournalError::storage(None, format!("cannot start a thread: {}", ErrorChain(&err)))
            })?;
        // The writer checks (or creates) the schema; readers connect only after it is done.
        let id = match writer_ready.await.unwrap_or(Err(JournalError::Closed)) {
            Ok(id) => id,
            Err(err) => {
                drop(writes);
                let _ = ended.await;
                return Err(err);
            }
        };

        let readers = Readers::new(config.readers, connector, counters.clone());
        for slot in 0..config.readers {
            if let Err(err) = readers.connection(slot).await {
                drop((writes, readers));
                let _ = ended.await;
                return Err(err);
            }
        }
        // Validated: fits a u32.
        let max_queued_bytes = u32::try_from(config.max_queued_bytes).unwrap_or(u32::MAX);
        Ok(Self {
            shared: Arc::new(Shared {
                writes,
                queued_bytes: Arc::new(Semaphore::new(max_queued_bytes as usize)),
                max_queued_bytes,
                readers,
                counters,
                signal,
                id,
                listening: std::sync::Once::new(),
                thread: Mutex::new(Some(ended)),
            }),
        })
    }

    /// The counters since the journal was connected (shared by all clones).
    pub fn stats(&self) -> PostgresStats {
        let writes = &self.shared.writes;
        self.shared
            .counters
            .read(writes.max_capacity() - writes.capacity())
    }

    /// Drops this handle; if it was the last one, waits until every queued write has been
    /// committed or failed (and its caller told) and the connections are closed. With other
    /// clones alive it returns at once and the journal stays open.
    pub async fn close(self) {
        let Ok(shared) = Arc::try_unwrap(self.shared) else {
            return;
        };
        let thread = shared
            .thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(shared); // closes the queue: the writer drains it and the thread ends
        if let Some(thread) = thread {
            let _ = thread.await;
        }
    }

    async fn write(&self, id: PersistenceId, op: WriteOp) -> Result<(), JournalError> {
        let bytes = u32::try_from(op.bytes()).unwrap_or(u32::MAX);
        let permit = self
            .shared
            .queued_bytes
            .clone()
            .acquire_many_owned(bytes.min(self.shared.max_queued_bytes))
            .await
            .map_err(|_| JournalError::Closed)?;
        let (reply, result) = oneshot::channel();
        self.shared
            .writes
            .send(WriteRequest {
                id,
                op,
                reply,
                _permit: permit,
            })
            .await
            .map_err(|_| JournalError::Closed)?;
        result.await.unwrap_or(Err(JournalError::Closed))
    }
}

impl fmt::Debug for PostgresJournal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresJournal")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Journal for PostgresJournal {
    fn append_as(
        &self,
        id: &PersistenceId,
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
        manifest: Manifest,
    ) -> JournalFuture<'_, ()> {
        self.append_tagged(id, first_seq, payloads, manifest, Vec::new())
    }

    fn append_tagged(
        &self,
        id: &PersistenceId,
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
        manifest: Manifest,
        tags: Vec<Vec<Tag>>,
    ) -> JournalFuture<'_, ()> {
        let id = id.clone();
        Box::pin(async move {
            check_tagged_append(
                &id,
                first_seq,
                &payloads,
                &tags,
                self.max_payload(),
                "PostgreSQL",
            )?;
            if payloads.is_empty() {
                return Ok(());
            }
            let op = WriteOp::Append {
                first_seq,
                payloads,
                manifest,
                tags: normalized(tags),
            };
            writer::check_message(&id, &op)?;
            self.write(id, op).await
        })
    }

    fn replay(
        &self,
        id: &PersistenceId,
        from_seq: u64,
        to_seq: u64,
        max_events: usize,
    ) -> JournalFuture<'_, Vec<StoredEvent>> {
        let id = id.clone();
        Box::pin(async move {
            if max_events == 0 || from_seq > to_seq {
                return Ok(Vec::new());
            }
            self.shared
                .readers
                .replay(&id, from_seq, to_seq, max_events)
                .await
        })
    }

    fn highest_seq(&self, id: &PersistenceId) -> JournalFuture<'_, u64> {
        let id = id.clone();
        Box::pin(async move { self.shared.readers.highest_seq(&id).await })
    }

    fn delete_to(&self, id: &PersistenceId, to_seq: u64) -> JournalFuture<'_, ()> {
        let id = id.clone();
        Box::pin(async move {
            if to_seq == 0 {
                return Ok(());
            }
            self.write(id, WriteOp::DeleteTo { to_seq }).await
        })
    }

    fn save_snapshot(&self, id: &PersistenceId, snapshot: Snapshot) -> JournalFuture<'_, ()> {
        let id = id.clone();
        Box::pin(async move {
            if snapshot.seq == 0 {
                return Err(JournalError::invalid(
                    &id,
                    "a snapshot's seq starts at 1, not 0",
                ));
            }
            if snapshot.seq > MAX_SEQ {
                return Err(JournalError::invalid(
                    &id,
                    format!("a snapshot at seq {} is beyond any seq", snapshot.seq),
                ));
            }
            check_payload(
                &id,
                snapshot.payload.len(),
                self.max_payload(),
                "PostgreSQL",
            )?;
            self.write(id, WriteOp::SaveSnapshot(snapshot)).await
        })
    }

    fn load_snapshot(&self, id: &PersistenceId) -> JournalFuture<'_, Option<Snapshot>> {
        let id = id.clone();
        Box::pin(async move { self.shared.readers.load_snapshot(&id).await })
    }

    fn events_by_tag(
        &self,
        query: &TagQuery,
        after: Offset,
        max_events: usize,
    ) -> JournalFuture<'_, Vec<TaggedEvent>> {
        let query = query.clone();
        Box::pin(async move {
            check_max_events(max_events)?;
            self.shared.readers.by_tag(&query, after, max_events).await
        })
    }

    fn tag_notifications(&self) -> Option<TagNotifications> {
        let shared = &self.shared;
        shared.listening.call_once(|| {
            let (connector, signal) = (shared.readers.connector.clone(), shared.signal.clone());
            shared
                .readers
                .connector
                .runtime
                .spawn(listener::listen(connector, signal));
        });
        Some(shared.signal.subscribe())
    }

    /// The highest offset of this journal's own tag rows, in any tag ([`Offset::START`]
    /// while it has none), read on a read connection: every entry committed before the call
    /// is visible to its statement, so none has a higher offset. An offset above it was not
    /// given by this journal: it comes from another journal (in this database or another),
    /// from this schema before it was reset, or from before a logical restore. Activity
    /// elsewhere on the server (other schemas, other applications) does not raise it. Cheap:
    /// two index probes per distinct tag. Takes no transaction id.
    fn offset_ceiling(&self) -> JournalFuture<'_, Offset> {
        Box::pin(async move { self.shared.readers.ceiling().await })
    }

    /// The schema's, from its table `journal_identity` (see
    /// [`IDENTITY_SQL`](PostgresJournal::IDENTITY_SQL)): `None` only for a schema without
    /// one while `create_tables` is off.
    fn journal_id(&self) -> Option<JournalId> {
        self.shared.id.clone()
    }

    fn max_payload(&self) -> usize {
        Self::MAX_PAYLOAD_BYTES
    }
}

/// A seq read from the database: must be within `0..=MAX_SEQ`, else the data is corrupt
/// (reported at `context_seq`).
fn seq_from_sql(id: &PersistenceId, raw: i64, context_seq: u64) -> Result<u64, JournalError> {
    match u64::try_from(raw) {
        Ok(seq) if seq <= MAX_SEQ => Ok(seq),
        _ => Err(JournalError::Corrupt {
            persistence_id: id.clone(),
            seq: context_seq,
            reason: format!("a stored seq_nr of {raw} is out of range"),
        }),
    }
}

/// A [`JournalError::Storage`] for a failed database operation: `what`, then the error with
/// its causes ([`ErrorChain`]: the server's message and SQLSTATE); or a
/// [`JournalError::Schema`] if the error says the tables were altered (an undefined column or
/// table, a wrong type).
fn db_error(id: Option<&PersistenceId>, what: &str, err: &tokio_postgres::Error) -> JournalError {
    schema::altered(what, err)
        .unwrap_or_else(|| JournalError::storage(id, format!("{what}: {}", ErrorChain(err))))
}
