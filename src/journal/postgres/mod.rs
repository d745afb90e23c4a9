//! The shared journal: PostgreSQL through `tokio-postgres`, group commit, fenced by the
//! database (feature `postgres`).

use std::error::Error as _;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, NoTls, Statement};

mod connection_string;
mod listener;
mod options;
mod schema;
#[cfg(feature = "tls")]
mod tls;
mod writer;

pub(crate) use connection_string::parse_config;
pub(crate) use options::is_plain_identifier;
pub use options::{PostgresOptions, PostgresStats};
#[cfg(feature = "tls")]
pub use tls::PostgresTls;

use crate::codec::Manifest;
use crate::error::ErrorChain;
use crate::journal::by_tag::corrupt_tag_row;
use crate::journal::write::{WriteOp, WriteRequest};
use crate::journal::{
    check_max_events, check_payload, check_tagged_append, normalized, stored_manifest, Journal,
    JournalError, JournalFuture, JournalId, Offset, PersistenceId, Snapshot, StoredEvent, Tag,
    TagNotifications, TagQuery, TagSignal, TaggedEvent, MAX_SEQ,
};
use options::Counters;

/// The [`Journal`] for applications whose nodes share one database: PostgreSQL, through
/// `tokio-postgres` (feature `postgres`). A commit is durable when PostgreSQL says it is
/// (`synchronous_commit` as the server is configured; the default, `on`, waits for the WAL
/// flush).
///
/// ```no_run
/// use actix_delivery::journal::{Journal, PersistenceId, PostgresJournal, PostgresOptions};
///
/// # async fn demo() -> Result<(), actix_delivery::journal::JournalError> {
/// let journal = PostgresJournal::connect_with(
///     "host=127.0.0.1 user=postgres dbname=orders",
///     PostgresOptions::default().schema("journal"),
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
/// transaction ran, from all streams (up to the batch bounds of [`PostgresOptions`]), and
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
/// after failed attempts, [`PostgresOptions::reconnect_backoff`]); while the server cannot
/// be reached, writes fail with `Storage` errors. Reads use their own connections, which are
/// replaced the same way; a read whose connection broke is retried once on a new one.
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
/// **Reads** (`replay`, `highest_seq`, `load_snapshot`, `events_by_tag`) run on separate connections
/// (`readers`), so they never wait behind the writer's transaction. The connections' I/O runs
/// on the journal's own thread, so the futures can be awaited on any runtime (an Actix
/// arbiter, a current-thread Tokio runtime) and never block the caller's thread. Clones share
/// one journal; when the last handle is dropped (or [`close`](Self::close)d), the writer
/// finishes the writes already queued, replies to each, and the connections close.
///
/// The tables and their version check: [`PostgresJournal::SCHEMA_SQL`]. TLS is not
/// supported: connect over a trusted network or a Unix socket.
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
    /// connect unless [`PostgresOptions::create_tables`] is off.
    pub const SCHEMA_SQL: &'static str = include_str!("schema.sql");

    /// The SQL that migrates the tables from schema version 1 (actix-delivery 0.1) to the
    /// current one, `src/journal/postgres/migrate_1_to_2.sql`. The journal runs it itself on
    /// connect unless [`PostgresOptions::create_tables`] is off; run it by hand (in one
    /// transaction, with the intended schema first in the `search_path`) otherwise.
    pub const MIGRATE_1_TO_2_SQL: &'static str = include_str!("migrate_1_to_2.sql");

    /// The SQL that migrates the tables from schema version 2 to 3 (the tags),
    /// `src/journal/postgres/migrate_2_to_3.sql`; run after [`MIGRATE_1_TO_2_SQL`](Self::MIGRATE_1_TO_2_SQL)
    /// for a schema of version 1. The journal runs it itself on connect unless
    /// [`PostgresOptions::create_tables`] is off.
    pub const MIGRATE_2_TO_3_SQL: &'static str = include_str!("migrate_2_to_3.sql");

    /// The SQL that gives a journal schema its identity, [`Journal::journal_id`], if it has
    /// none (a schema made before ids existed), `src/journal/postgres/identity.sql`: a table
    /// `journal_identity` of one row, a random id. [`SCHEMA_SQL`](Self::SCHEMA_SQL) holds it
    /// too, and the journal runs it itself on connect unless
    /// [`PostgresOptions::create_tables`] is off (then a schema without it is used without
    /// an id, and read models cannot tell it from another journal). It changes neither the
    /// schema version nor another table, so the previous release still reads the journal.
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
    pub async fn connect(config: &str) -> Result<Self, JournalError> {
        Self::connect_with(config, PostgresOptions::default()).await
    }

    /// Connects to the database that `config` names (a libpq-style `key=value` string or a
    /// `postgresql://` URL, as `tokio_postgres::Config` parses them), checks the schema, or
    /// creates the tables if there are none, and opens the writer and the read connections.
    /// Connections without an `application_name` get `actix-delivery journal`.
    ///
    /// # Errors
    /// [`JournalError::InvalidArgument`] for a `config` that does not parse (saying what did
    /// not, never the password) or an invalid option; [`JournalError::Schema`] if the schema
    /// holds a newer or foreign version of the tables (nothing is changed), or none while
    /// `create_tables` is off, or more than one journal id, or tag rows written
    /// under transaction ids this server has not reached (a logical restore into another
    /// cluster: new entries would sort before them; see
    /// [`RENUMBER_TAGS_SQL`](Self::RENUMBER_TAGS_SQL));
    /// [`JournalError::Storage`] if the server cannot be reached, refuses the login, or
    /// refuses to create the tables (privileges), or the journal's thread cannot start.
    pub async fn connect_with(
        config: &str,
        options: PostgresOptions,
    ) -> Result<Self, JournalError> {
        options.validate()?;
        let mut config = parse_config(config).map_err(|reason| JournalError::InvalidArgument {
            persistence_id: None,
            reason,
        })?;
        if config.get_application_name().is_none() {
            config.application_name("actix-delivery journal");
        }
        config.connect_timeout(options.connect_timeout);

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
        let sql = Arc::new(Sql::new(&options.schema));
        #[cfg(feature = "tls")]
        if options.tls.is_some() {
            // Never fall back to an unencrypted connection.
            config.ssl_mode(tokio_postgres::config::SslMode::Require);
        }
        let connector = Connector {
            config,
            runtime: runtime.handle().clone(),
            connect_timeout: options.connect_timeout,
            sql: sql.clone(),
            #[cfg(feature = "tls")]
            tls: options.tls.as_ref().map(tls::PostgresTls::connector),
        };

        let (writes, queue) = mpsc::channel(options.queue_capacity);
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

        let readers = Readers {
            slots: (0..options.readers)
                .map(|_| tokio::sync::Mutex::new(Slot::default()))
                .collect(),
            next: AtomicUsize::new(0),
            connector,
            counters: counters.clone(),
        };
        for slot in 0..options.readers {
            if let Err(err) = readers.connection(slot).await {
                drop((writes, readers));
                let _ = ended.await;
                return Err(err);
            }
        }
        // Validated: fits a u32.
        let max_queued_bytes = u32::try_from(options.max_queued_bytes).unwrap_or(u32::MAX);
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
            check_message(&id, &op)?;
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

/// Refuses a write too large for one protocol message, before it is sent: the server would
/// drop the connection, leaving its outcome unknown (though nothing would be stored).
fn check_message(id: &PersistenceId, op: &WriteOp) -> Result<(), JournalError> {
    let bytes = writer::message_bytes(id, op);
    if writer::fits_one_message(bytes) {
        return Ok(());
    }
    Err(JournalError::invalid(
        id,
        format!(
            "an append of {} payload bytes needs a message of about {bytes} bytes, more than \
             the {} PostgreSQL accepts in one (send it in smaller appends)",
            op.bytes(),
            writer::MAX_MESSAGE_BYTES
        ),
    ))
}

/// The SQL of the journal's statements, for one schema.
struct Sql {
    append: String,
    delete_to: String,
    save_snapshot: String,
    highest_of: String,
    replay: String,
    highest: String,
    load_snapshot: String,
    by_tag: String,
    ceiling: String,
    /// What the writer's and listener's notifications carry: the schema's name.
    schema: String,
}

impl Sql {
    fn new(schema_name: &str) -> Self {
        let events = schema::table(schema_name, "event_journal");
        let streams = schema::table(schema_name, "stream_metadata");
        let snapshots = schema::table(schema_name, "snapshot");
        let tags = schema::table(schema_name, "event_tag");
        Self {
            // One row of $1..$3 and $7..$9 per append (at most one per stream): its stream, the
            // seq it follows, its last seq and its manifest (codec, name, version); one row of
            // $4..$6 per event: the append's row number, seq and payload. A new stream's row is inserted, a known one advanced, each only
            // if it still says `prev`; the events of the appends that won are stored, the others
            // leave no trace. Returns the row numbers of the winners. (`= ANY($1)` steers the
            // planner to the primary key whatever it estimates for `unnest`: never a scan of
            // every stream.) One row of $10..$13 per tag of an event: the append's row number,
            // the event's seq, the tag, the stream's slice; the winners' go into event_tag.
            append: format!(
                "WITH input AS ( \
                     SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[], $7::int2[], \
                     $8::text[], $9::int8[]) \
                     WITH ORDINALITY AS i(persistence_id, prev, last, codec, manifest, version, n) \
                 ), created AS ( \
                     INSERT INTO {streams} AS m (persistence_id, highest_seq) \
                     SELECT persistence_id, last FROM input WHERE prev = 0 \
                     ON CONFLICT (persistence_id) DO UPDATE SET highest_seq = excluded.highest_seq \
                     WHERE m.highest_seq = 0 \
                     RETURNING m.persistence_id \
                 ), advanced AS ( \
                     UPDATE {streams} AS m SET highest_seq = input.last FROM input \
                     WHERE m.persistence_id = ANY($1) AND m.persistence_id = input.persistence_id \
                       AND input.prev > 0 AND m.highest_seq = input.prev \
                     RETURNING m.persistence_id \
                 ), won AS ( \
                     SELECT input.n, input.persistence_id, input.codec, input.manifest, \
                     input.version FROM input WHERE input.persistence_id IN \
                     (SELECT persistence_id FROM created UNION ALL SELECT persistence_id FROM advanced) \
                 ), stored AS ( \
                     INSERT INTO {events} (persistence_id, seq_nr, payload, written_at, \
                     ser_codec, ser_manifest, ser_version) \
                     SELECT won.persistence_id, e.seq_nr, e.payload, now(), won.codec, \
                     won.manifest, won.version \
                     FROM unnest($4::int8[], $5::int8[], $6::bytea[]) AS e(n, seq_nr, payload) \
                     JOIN won ON won.n = e.n \
                 ), tagged AS ( \
                     INSERT INTO {tags} (tag, persistence_id, seq_nr, slice) \
                     SELECT t.tag, won.persistence_id, t.seq_nr, t.slice \
                     FROM unnest($10::int8[], $11::int8[], $12::text[], $13::int2[]) \
                     WITH ORDINALITY AS t(n, seq_nr, tag, slice, i) \
                     JOIN won ON won.n = t.n ORDER BY t.i \
                 ) \
                 SELECT n FROM won"
            ),
            delete_to: format!("DELETE FROM {events} WHERE persistence_id = $1 AND seq_nr <= $2"),
            // Stores the snapshot unless it is beyond the highest seq or older than the
            // current one; returns the highest seq (to tell the first case).
            save_snapshot: format!(
                "WITH h AS ( \
                     SELECT coalesce((SELECT highest_seq FROM {streams} WHERE persistence_id = $1), 0) \
                     AS highest \
                 ), saved AS ( \
                     INSERT INTO {snapshots} AS s (persistence_id, seq_nr, payload, written_at, \
                     ser_codec, ser_manifest, ser_version) \
                     SELECT $1, $2, $3, now(), $4, $5, $6 FROM h WHERE $2 <= h.highest \
                     ON CONFLICT (persistence_id) DO UPDATE \
                     SET seq_nr = excluded.seq_nr, payload = excluded.payload, \
                         written_at = excluded.written_at, ser_codec = excluded.ser_codec, \
                         ser_manifest = excluded.ser_manifest, ser_version = excluded.ser_version \
                     WHERE excluded.seq_nr >= s.seq_nr \
                 ) \
                 SELECT highest FROM h"
            ),
            highest_of: format!(
                "SELECT persistence_id, highest_seq FROM {streams} WHERE persistence_id = ANY($1)"
            ),
            replay: format!(
                "SELECT seq_nr, payload, ser_codec, ser_manifest, ser_version FROM {events} \
                 WHERE persistence_id = $1 AND seq_nr >= $2 AND seq_nr <= $3 \
                 ORDER BY seq_nr LIMIT $4"
            ),
            highest: format!("SELECT highest_seq FROM {streams} WHERE persistence_id = $1"),
            load_snapshot: format!(
                "SELECT seq_nr, payload, ser_codec, ser_manifest, ser_version FROM {snapshots} \
                 WHERE persistence_id = $1"
            ),
            // Only rows of transactions below the snapshot's horizon: see schema.sql.
            by_tag: format!(
                "SELECT t.txid::text::int8, t.ordering, t.persistence_id, t.seq_nr, \
                 (extract(epoch FROM t.written_at) * 1000000)::int8, \
                 e.payload, e.ser_codec, e.ser_manifest, e.ser_version \
                 FROM {tags} t LEFT JOIN {events} e \
                   ON e.persistence_id = t.persistence_id AND e.seq_nr = t.seq_nr \
                 WHERE t.tag = $1 AND (t.txid, t.ordering) > ($2::int8::text::xid8, $3) \
                   AND t.txid < pg_snapshot_xmin(pg_current_snapshot()) \
                   AND t.slice BETWEEN $4 AND $5 \
                 ORDER BY t.txid, t.ordering LIMIT $6"
            ),
            ceiling: schema::highest_offset_sql(schema_name),
            schema: schema_name.to_owned(),
        }
    }
}

/// Opens connections, on the journal's runtime.
#[derive(Clone)]
struct Connector {
    config: Config,
    runtime: Handle,
    connect_timeout: std::time::Duration,
    sql: Arc<Sql>,
    #[cfg(feature = "tls")]
    tls: Option<tls::MakeRustls>,
}

impl Connector {
    /// Connects; must run on the journal's runtime (which then drives the connection).
    async fn open(&self) -> Result<Client, JournalError> {
        self.open_forwarding(None).await
    }

    /// Connects as [`open`](Self::open); the payloads of the notifications the connection
    /// receives (once it `LISTEN`s) go to `notifications`, if given.
    async fn open_forwarding(
        &self,
        notifications: Option<mpsc::UnboundedSender<String>>,
    ) -> Result<Client, JournalError> {
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            return self.open_with(tls.clone(), notifications).await;
        }
        self.open_with(NoTls, notifications).await
    }

    async fn open_with<T>(
        &self,
        tls: T,
        notifications: Option<mpsc::UnboundedSender<String>>,
    ) -> Result<Client, JournalError>
    where
        T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
        T::Stream: Send + 'static,
    {
        let connecting = tokio::time::timeout(self.connect_timeout, self.config.connect(tls));
        let (client, connection) = match connecting.await {
            Ok(Ok(connected)) => connected,
            Ok(Err(err)) => return Err(db_error(None, "cannot connect to PostgreSQL", &err)),
            Err(_) => {
                return Err(JournalError::storage(
                    None,
                    format!(
                        "cannot connect to PostgreSQL: no answer within {:?}",
                        self.connect_timeout
                    ),
                ))
            }
        };
        let Some(notifications) = notifications else {
            tokio::spawn(async move {
                if let Err(err) = connection.await {
                    log::debug!(
                        "journal: a PostgreSQL connection ended: {}",
                        ErrorChain(&err)
                    );
                }
            });
            return Ok(client);
        };
        tokio::spawn(async move {
            let mut connection = connection;
            let mut messages = futures_util::stream::poll_fn(|cx| connection.poll_message(cx));
            while let Some(message) = futures_util::StreamExt::next(&mut messages).await {
                match message {
                    Ok(tokio_postgres::AsyncMessage::Notification(notification)) => {
                        let _ = notifications.send(notification.payload().to_owned());
                    }
                    Ok(_) => {}
                    Err(err) => {
                        log::debug!(
                            "journal: a PostgreSQL connection ended: {}",
                            ErrorChain(&err)
                        );
                        break;
                    }
                }
            }
        });
        Ok(client)
    }

    /// Opens a read connection with its statements prepared; from any runtime.
    async fn open_reader(&self) -> Result<ReadConnection, JournalError> {
        let connector = self.clone();
        let opening = self.runtime.spawn(async move {
            let client = connector.open().await?;
            let sql = &connector.sql;
            let prepared = async {
                Ok::<_, tokio_postgres::Error>((
                    client.prepare(&sql.replay).await?,
                    client.prepare(&sql.highest).await?,
                    client.prepare(&sql.load_snapshot).await?,
                    client.prepare(&sql.by_tag).await?,
                    client.prepare(&sql.ceiling).await?,
                ))
            }
            .await;
            let (replay, highest, load_snapshot, by_tag, ceiling) = prepared
                .map_err(|err| db_error(None, "cannot prepare the journal's reads", &err))?;
            Ok(ReadConnection {
                client,
                replay,
                highest,
                load_snapshot,
                by_tag,
                ceiling,
            })
        });
        opening.await.unwrap_or(Err(JournalError::Closed))
    }
}

/// A read connection and its prepared statements.
struct ReadConnection {
    client: Client,
    replay: Statement,
    highest: Statement,
    load_snapshot: Statement,
    by_tag: Statement,
    ceiling: Statement,
}

/// The read connections: each read takes the next in turn (and pipelines with the others
/// on it); a lost one is replaced by the next read that comes to it.
struct Readers {
    slots: Vec<tokio::sync::Mutex<Slot>>,
    next: AtomicUsize,
    connector: Connector,
    counters: Arc<Counters>,
}

/// One read connection's place.
#[derive(Default)]
struct Slot {
    connection: Option<Arc<ReadConnection>>,
    /// Whether it ever had one (so that the next one counts as a reconnect).
    opened: bool,
}

impl Readers {
    /// The connection of `slot`, connecting if it has none or lost it.
    async fn connection(&self, slot: usize) -> Result<Arc<ReadConnection>, JournalError> {
        let mut held = self.slots[slot].lock().await;
        if let Some(connection) = &held.connection {
            if !connection.client.is_closed() {
                return Ok(connection.clone());
            }
        }
        let connection = Arc::new(self.connector.open_reader().await?);
        if held.opened {
            Counters::add(&self.counters.reconnects, 1);
        }
        *held = Slot {
            connection: Some(connection.clone()),
            opened: true,
        };
        Ok(connection)
    }

    /// Forgets `slot`'s connection if it is still `lost`.
    async fn discard(&self, slot: usize, lost: &Arc<ReadConnection>) {
        let mut held = self.slots[slot].lock().await;
        if held
            .connection
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, lost))
        {
            held.connection = None;
        }
    }

    /// Runs `statement` of the next connection with `params` and reads its rows with
    /// `read`; once more on a new connection if it failed because its connection was lost
    /// (reads change nothing, so a retry is safe). Errors name stream `id`, if any.
    async fn run<T>(
        &self,
        id: Option<&PersistenceId>,
        what: &str,
        statement: fn(&ReadConnection) -> &Statement,
        params: &[&(dyn ToSql + Sync)],
        read: impl FnOnce(Vec<tokio_postgres::Row>) -> Result<T, JournalError>,
    ) -> Result<T, JournalError> {
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let mut retried = false;
        loop {
            let connection = self.connection(slot).await?;
            match connection
                .client
                .query(statement(&connection), params)
                .await
            {
                Ok(rows) => return read(rows),
                Err(err) if !retried && is_connection_lost(&err) => {
                    self.discard(slot, &connection).await;
                    retried = true;
                }
                Err(err) => return Err(db_error(id, what, &err)),
            }
        }
    }

    async fn replay(
        &self,
        id: &PersistenceId,
        from_seq: u64,
        to_seq: u64,
        max_events: usize,
    ) -> Result<Vec<StoredEvent>, JournalError> {
        let (from, to) = (sql_bound(from_seq), sql_bound(to_seq));
        let limit = i64::try_from(max_events).unwrap_or(i64::MAX);
        let params: [&(dyn ToSql + Sync); 4] = [&id.as_str(), &from, &to, &limit];
        let events = self
            .run(
                Some(id),
                "replay failed",
                |c| &c.replay,
                &params,
                |rows| Replayed::from_rows(id, rows),
            )
            .await?;
        check_replayed(id, from_seq, to_seq, events.0)
    }

    async fn highest_seq(&self, id: &PersistenceId) -> Result<u64, JournalError> {
        let highest = self
            .run(
                Some(id),
                "reading the highest seq failed",
                |c| &c.highest,
                &[&id.as_str()],
                |rows| Highest::from_rows(id, rows),
            )
            .await?;
        Ok(highest.0)
    }

    async fn load_snapshot(&self, id: &PersistenceId) -> Result<Option<Snapshot>, JournalError> {
        self.run(
            Some(id),
            "loading the snapshot failed",
            |c| &c.load_snapshot,
            &[&id.as_str()],
            |rows| Option::<Snapshot>::from_rows(id, rows),
        )
        .await
    }

    async fn by_tag(
        &self,
        query: &TagQuery,
        after: Offset,
        max_events: usize,
    ) -> Result<Vec<TaggedEvent>, JournalError> {
        let Some((transaction, position)) = after.to_bigints() else {
            return Err(JournalError::InvalidArgument {
                persistence_id: None,
                reason: format!("offset {after} is beyond any PostgreSQL offset"),
            });
        };
        let (first, last) = (query.slices.first() as i16, query.slices.last() as i16);
        let limit = i64::try_from(max_events).unwrap_or(i64::MAX);
        let params: [&(dyn ToSql + Sync); 6] = [
            &query.tag.as_str(),
            &transaction,
            &position,
            &first,
            &last,
            &limit,
        ];
        let what = format!("reading tag `{}` failed", query.tag);
        self.run(
            None,
            &what,
            |c| &c.by_tag,
            &params,
            |rows| tagged_events(query, after, rows),
        )
        .await
    }
}

impl Readers {
    /// See [`PostgresJournal::offset_ceiling`](Journal::offset_ceiling).
    async fn ceiling(&self) -> Result<Offset, JournalError> {
        self.run(
            None,
            "reading the offset ceiling failed",
            |c| &c.ceiling,
            &[],
            |rows| {
                let Some(row) = rows.first() else {
                    return Ok(Offset::START);
                };
                let read =
                    (|| Ok::<_, tokio_postgres::Error>((row.try_get(0)?, row.try_get(1)?)))();
                match read {
                    Ok((transaction, position)) => {
                        offset_of(transaction, position).ok_or_else(|| {
                            JournalError::storage(
                                None,
                                format!("a tag row at offset {transaction}:{position}"),
                            )
                        })
                    }
                    Err(err) => Err(JournalError::storage(
                        None,
                        format!("reading the offset ceiling: {}", ErrorChain(&err)),
                    )),
                }
            },
        )
        .await
    }
}

/// The offset of a tag row's `txid` and `ordering`, unless one of them is negative.
fn offset_of(transaction: i64, position: i64) -> Option<Offset> {
    match (u64::try_from(transaction), u64::try_from(position)) {
        (Ok(transaction), Ok(position)) => Some(Offset::from_parts(transaction, position)),
        _ => None,
    }
}

/// The entries of a read by tag after `after`, from its rows.
fn tagged_events(
    query: &TagQuery,
    after: Offset,
    rows: Vec<tokio_postgres::Row>,
) -> Result<Vec<TaggedEvent>, JournalError> {
    let corrupt_row = |err: &dyn std::fmt::Display| corrupt_tag_row(query, err);
    let mut events = Vec::with_capacity(rows.len());
    let mut last = None;
    let mut previous = after;
    for row in rows {
        let transaction: i64 = row
            .try_get(0)
            .map_err(|err| corrupt_row(&ErrorChain(&err)))?;
        let position: i64 = row
            .try_get(1)
            .map_err(|err| corrupt_row(&ErrorChain(&err)))?;
        let id: String = row
            .try_get(2)
            .map_err(|err| corrupt_row(&ErrorChain(&err)))?;
        let id = PersistenceId::new(id).map_err(|err| corrupt_row(&err))?;
        let raw_seq: i64 = row.try_get(3).map_err(|err| corrupt(&id, 0, &err))?;
        let seq = seq_from_sql(&id, raw_seq, 0)?;
        let micros: i64 = row.try_get(4).map_err(|err| corrupt(&id, seq, &err))?;
        let written_at = std::time::UNIX_EPOCH
            + std::time::Duration::from_micros(u64::try_from(micros).unwrap_or(0));
        let Some(offset) = offset_of(transaction, position) else {
            return Err(corrupt_row(&format!("offset {transaction}:{position}")));
        };
        if offset <= previous {
            return Err(corrupt_row(&format!(
                "offset {offset} after {previous}: out of order"
            )));
        }
        previous = offset;
        let payload: Option<Vec<u8>> = row.try_get(5).map_err(|err| corrupt(&id, seq, &err))?;
        let event = match payload {
            Some(payload) => Some(StoredEvent {
                seq,
                payload,
                manifest: manifest_at(&row, 6, &id, seq, &mut last)?,
            }),
            None => None,
        };
        events.push(TaggedEvent {
            offset,
            persistence_id: id,
            seq,
            written_at,
            event,
        });
    }
    Ok(events)
}

/// What a read makes of its rows.
trait FromRows: Sized {
    fn from_rows(id: &PersistenceId, rows: Vec<tokio_postgres::Row>) -> Result<Self, JournalError>;
}

struct Replayed(Vec<StoredEvent>);

impl FromRows for Replayed {
    fn from_rows(id: &PersistenceId, rows: Vec<tokio_postgres::Row>) -> Result<Self, JournalError> {
        let mut events = Vec::with_capacity(rows.len());
        let mut last = None;
        for row in rows {
            let raw: i64 = row.try_get(0).map_err(|err| corrupt(id, 0, &err))?;
            let seq = seq_from_sql(id, raw, 0)?;
            let payload: Vec<u8> = row.try_get(1).map_err(|err| corrupt(id, seq, &err))?;
            let manifest = manifest(&row, id, seq, &mut last)?;
            events.push(StoredEvent {
                seq,
                payload,
                manifest,
            });
        }
        Ok(Self(events))
    }
}

struct Highest(u64);

impl FromRows for Highest {
    fn from_rows(id: &PersistenceId, rows: Vec<tokio_postgres::Row>) -> Result<Self, JournalError> {
        match rows.first() {
            None => Ok(Self(0)),
            Some(row) => {
                let raw: i64 = row.try_get(0).map_err(|err| corrupt(id, 0, &err))?;
                Ok(Self(seq_from_sql(id, raw, 0)?))
            }
        }
    }
}

impl FromRows for Option<Snapshot> {
    fn from_rows(id: &PersistenceId, rows: Vec<tokio_postgres::Row>) -> Result<Self, JournalError> {
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let raw: i64 = row.try_get(0).map_err(|err| corrupt(id, 0, &err))?;
        let seq = seq_from_sql(id, raw, 0)?;
        if seq == 0 {
            return Err(JournalError::Corrupt {
                persistence_id: id.clone(),
                seq,
                reason: "a snapshot at seq 0".into(),
            });
        }
        let payload: Vec<u8> = row.try_get(1).map_err(|err| corrupt(id, seq, &err))?;
        let manifest = manifest(row, id, seq, &mut None)?;
        Ok(Some(Snapshot {
            seq,
            payload,
            manifest,
        }))
    }
}

/// The manifest in columns 2 to 4 of `row` (see [`stored_manifest`]).
fn manifest(
    row: &tokio_postgres::Row,
    id: &PersistenceId,
    seq: u64,
    last: &mut Option<Manifest>,
) -> Result<Manifest, JournalError> {
    manifest_at(row, 2, id, seq, last)
}

/// The manifest in columns `first` to `first + 2` of `row` (see [`stored_manifest`]).
fn manifest_at(
    row: &tokio_postgres::Row,
    first: usize,
    id: &PersistenceId,
    seq: u64,
    last: &mut Option<Manifest>,
) -> Result<Manifest, JournalError> {
    let codec: i16 = row.try_get(first).map_err(|err| corrupt(id, seq, &err))?;
    let name: &str = row
        .try_get(first + 1)
        .map_err(|err| corrupt(id, seq, &err))?;
    let version: i64 = row
        .try_get(first + 2)
        .map_err(|err| corrupt(id, seq, &err))?;
    stored_manifest(id, seq, (i64::from(codec), name, version), last)
}

/// Checks that replayed events are ascending and within the range asked for.
fn check_replayed(
    id: &PersistenceId,
    from_seq: u64,
    to_seq: u64,
    events: Vec<StoredEvent>,
) -> Result<Vec<StoredEvent>, JournalError> {
    let mut expected = from_seq.max(1);
    for event in &events {
        if event.seq < expected || event.seq > to_seq {
            return Err(JournalError::Corrupt {
                persistence_id: id.clone(),
                seq: event.seq,
                reason: format!("out of order: expected seq {expected} or later"),
            });
        }
        expected = event.seq + 1;
    }
    Ok(events)
}

/// SQL integers are `i64`; a bound above `i64::MAX` means "no bound".
fn sql_bound(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

/// A stored value that is not what the schema says.
fn corrupt(id: &PersistenceId, seq: u64, err: &tokio_postgres::Error) -> JournalError {
    JournalError::Corrupt {
        persistence_id: id.clone(),
        seq,
        reason: ErrorChain(err).to_string(),
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

/// Whether `err` means the connection is gone (rather than a statement failing on a live
/// one): closed, an I/O error, or the server ending the session (class 57: shutdown,
/// `pg_terminate_backend`; class 08: connection exceptions).
pub(crate) fn is_connection_lost(err: &tokio_postgres::Error) -> bool {
    if err.is_closed() {
        return true;
    }
    if let Some(code) = err.code() {
        let code = code.code();
        return code.starts_with("57P") || code.starts_with("08");
    }
    err.source()
        .is_some_and(|source| source.downcast_ref::<std::io::Error>().is_some())
}

/// A [`JournalError::Storage`] for a failed database operation: `what`, then the error with
/// its causes ([`ErrorChain`]: the server's message and SQLSTATE); or a
/// [`JournalError::Schema`] if the error says the tables were altered (an undefined column or
/// table, a wrong type).
fn db_error(id: Option<&PersistenceId>, what: &str, err: &tokio_postgres::Error) -> JournalError {
    schema::altered(what, err)
        .unwrap_or_else(|| JournalError::storage(id, format!("{what}: {}", ErrorChain(err))))
}
