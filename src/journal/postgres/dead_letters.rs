//! [`PostgresDeadLetters`]: the dead-letter store in a PostgreSQL journal's schema, in tables
//! of its own (`dead_letter`, `dead_letter_totals`; see the schema module) that raise no
//! schema version.
//!
//! The store has a connection, thread and runtime of its own (its connection configured as
//! the journal's: server, TLS, timeouts). Several processes may keep dead letters in one
//! schema at once: a keep locks `dead_letter` against the other writers
//! (`SHARE ROW EXCLUSIVE`: reads go on), so that its upsert, the totals and the eviction of
//! the oldest entries see every other keep whole. A removal or a failed replay is one
//! statement, which waits for a keep's lock (the `ROW EXCLUSIVE` lock it takes conflicts with
//! it). The totals row counts the entries and their weight, so a keep reads only the oldest
//! few entries and never scans the table (the totals are counted again, under the lock, when
//! a store opens).
//!
//! Keeps queued behind one another are sent as one pipelined transaction (one round trip,
//! one commit for many); if one of them fails, or one must drop more entries than a statement
//! drops, the transaction is rolled back and each keep of it is committed on its own.

use std::future::Future;
use std::pin::Pin;

use tokio::sync::mpsc;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

use crate::codec::Manifest;
use crate::delivery::dead_letter_store::DeadLetterError;
use crate::delivery::dead_letters::{
    cut_text, DeadLetterCounts, DeadLetterFilter, DeadLetterLimits, DeadLetterPage, FieldError,
    Kept, NewDeadLetter, StoredDeadLetter,
};
use crate::error::Happened;
use crate::journal::dead_letter_sql::{
    check_limits, counts, group, int, list_clause, list_columns, peer_input_causes, storage,
    store_through_client, FilterParams, KeepRequest, Opened, Request, Row, StoreClient, COLUMNS,
};
use crate::journal::postgres::connector::is_connection_lost;
use crate::journal::postgres::connector::Connector;
use crate::journal::postgres::options::PostgresOptions;
use crate::journal::postgres::schema::journal_identity;
use crate::journal::postgres::writer::{pipeline, run_commit};
use crate::journal::postgres::{schema, PostgresJournal};
use crate::journal::{Journal, JournalError, JournalId};
use crate::runtime::error_chain::ErrorChain;

/// The most entries one statement drops (the oldest this many are read to choose them); a
/// keep that must drop more goes on in statements of its own.
const EVICT_SCAN: i64 = 16;

/// Dead letters kept in a [`PostgresJournal`]'s schema (feature `postgres`): durable, shared
/// by every process of the schema, bounded by [`DeadLetterLimits`], one entry per source and
/// key, the oldest a peer's input caused dropped first, then the oldest.
///
/// Its id ([`store_id`](crate::dead_letters::DeadLetterStore::store_id)) is the journal's
/// [`JournalId`](crate::journal::JournalId), so the ids of replays stay the same across
/// restarts and processes. Entry ids come from an identity column: never reused (though not
/// gapless). PostgreSQL's text cannot hold NUL: a NUL in a letter's source, key, error or type
/// name is kept as U+FFFD.
///
/// ```no_run
/// use actix_delivery::dead_letters::{DeadLetterLimits, DeadLetters};
/// use actix_delivery::journal::{PostgresDeadLetters, PostgresJournal};
///
/// # async fn _demo() -> Result<(), Box<dyn std::error::Error>> {
/// let journal = PostgresJournal::connect("host=127.0.0.1 user=postgres dbname=orders").await?;
/// let store = PostgresDeadLetters::open(&journal, DeadLetterLimits::default()).await?;
/// let dead_letters = DeadLetters::new(store); // give clones to the parts, and to the console
/// println!("{} dead letters kept", dead_letters.counts().await?.entries);
/// # Ok(()) }
/// ```
///
/// Errors carry the server's message and SQLSTATE, and say whether the operation happened: an
/// error before the commit was sent did not; a connection lost while a commit (or a removal,
/// a failed replay's note) was on its way may or may not have. A lost connection is opened
/// again at the next operation. Clones share one store; when the last is dropped, its thread
/// finishes the requests already queued and closes its connection. The journal may be closed
/// before it.
#[derive(Clone)]
pub struct PostgresDeadLetters {
    client: StoreClient,
}

impl PostgresDeadLetters {
    /// The SQL that creates the store's tables, if they are not there: `dead_letter` (the
    /// entries) and `dead_letter_totals` (one row: how many there are and their weight).
    /// Names are unqualified: run it with the journal's schema first in the `search_path`.
    /// [`open`](Self::open) runs it itself if the tables are missing (which needs the
    /// `CREATE` privilege on the schema). Neither table is the journal's: the journal's
    /// schema version and check ignore them, and the previous release leaves them alone.
    pub const SCHEMA_SQL: &'static str = concat!(
        "
CREATE TABLE IF NOT EXISTS dead_letter (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind TEXT NOT NULL,
    source TEXT NOT NULL,
    cause TEXT NOT NULL,
    key TEXT NOT NULL,
    weight BIGINT NOT NULL,
    body_len BIGINT NOT NULL,
    attempts BIGINT NOT NULL,
    first_at BIGINT NOT NULL,
    last_at BIGINT NOT NULL,
    replay_failures BIGINT NOT NULL,
    ser_codec SMALLINT NOT NULL,
    ser_manifest TEXT NOT NULL,
    ser_version BIGINT NOT NULL,
    error TEXT NOT NULL,
    origin BYTEA,
    body BYTEA,
    UNIQUE (kind, source, key)
);
CREATE INDEX IF NOT EXISTS dead_letter_by_source ON dead_letter (source, id);
CREATE INDEX IF NOT EXISTS dead_letter_peer_input ON dead_letter (id)
    WHERE cause IN (",
        peer_input_causes!(),
        ");
CREATE TABLE IF NOT EXISTS dead_letter_totals (
    entries BIGINT NOT NULL,
    bytes BIGINT NOT NULL
);
"
    );

    /// Opens the store in `journal`'s schema, creating its tables if they are not there, and
    /// counts its totals again (under the store's lock).
    ///
    /// # Errors
    /// [`DeadLetterError::Invalid`] naming the bound of `limits` that is invalid, or the
    /// `journal` if it has no id (a schema without `journal_identity` while `create_tables`
    /// is off); [`DeadLetterError::Storage`] if the server cannot be reached, the tables cannot
    /// be created (privileges: see [`SCHEMA_SQL`](Self::SCHEMA_SQL)) or read, or the store's
    /// thread cannot start.
    pub async fn open(
        journal: &PostgresJournal,
        limits: DeadLetterLimits,
    ) -> Result<Self, DeadLetterError> {
        check_limits(&limits)?;
        let id = journal.journal_id().ok_or_else(|| {
            FieldError::new(
                "journal",
                "its schema has no id (no journal_identity, and create_tables is off): give \
                 it one with PostgresJournal::IDENTITY_SQL",
            )
        })?;
        let runtime = new_runtime()?;
        let mut connector = journal.shared.readers.connector.clone();
        connector.runtime = runtime.handle().clone();
        Self::start(runtime, connector, Identity::Known(id), limits).await
    }

    /// Opens the store in the journal's schema of the database `connection` names (a
    /// libpq-style `key=value` string or a `postgresql://` URL, as
    /// [`PostgresJournal::connect_with`] takes it) without connecting the journal: for a tool
    /// that removes or lists entries beside the applications that use the journal (the
    /// command-line inspector's `dead-letters delete`). `options` give the schema, the
    /// connect timeout and TLS. It reads the schema's
    /// [`JournalId`](crate::journal::JournalId) from its identity table, then opens as
    /// [`open`](Self::open) does (creating the store's tables if they are not there).
    /// Connections without an `application_name` get `actix-delivery dead letters`.
    ///
    /// # Errors
    /// [`DeadLetterError::Invalid`] naming the bound of `limits` that is invalid, naming
    /// `connection` for a connection string that does not parse (never echoing the
    /// password), or naming `journal` for a schema that holds no journal, another
    /// application's tables, a journal of a newer schema version or one without an id (left
    /// untouched); [`DeadLetterError::Storage`] as [`open`](Self::open).
    pub async fn connect(
        connection: &str,
        options: &PostgresOptions,
        limits: DeadLetterLimits,
    ) -> Result<Self, DeadLetterError> {
        check_limits(&limits)?;
        let runtime = new_runtime()?;
        let connector = Connector::for_connection(
            connection,
            options,
            "actix-delivery dead letters",
            runtime.handle().clone(),
        )
        .map_err(|err| match err {
            JournalError::InvalidArgument { reason, .. } => FieldError::new("connection", reason),
            other => FieldError::new("connection", other.to_string()),
        })?;
        Self::start(runtime, connector, Identity::FromSchema, limits).await
    }

    /// Starts the store's thread, driving `runtime`, and waits until it opened.
    async fn start(
        runtime: tokio::runtime::Runtime,
        connector: Connector,
        identity: Identity,
        limits: DeadLetterLimits,
    ) -> Result<Self, DeadLetterError> {
        let worker = Worker::new(connector, limits.clone());
        let thread = "actix-delivery-postgres-dead-letters";
        let client = StoreClient::start(thread, limits, move |queue, opened| {
            runtime.block_on(worker.serve(identity, queue, opened))
        })
        .await?;
        Ok(Self { client })
    }
}

/// The runtime of a store's thread.
fn new_runtime() -> Result<tokio::runtime::Runtime, DeadLetterError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| {
            storage(
                Happened::CertainlyNot,
                format_args!("cannot start a runtime: {}", ErrorChain(&err)),
            )
        })
}

/// Where the store's id comes from.
enum Identity {
    /// The journal's, which connected to the schema.
    Known(JournalId),
    /// The schema's identity table, read (and the schema's marks checked) when the store
    /// opens.
    FromSchema,
}

store_through_client!(PostgresDeadLetters);

/// The SQL of the store's statements, for one schema.
struct Sql {
    schema: String,
    entries: String,
    totals: String,
    lock: String,
    keep: String,
    evict: String,
    drop_body: String,
    list: String,
    get: String,
    remove: String,
    replay_failed: String,
    counts: String,
}

impl Sql {
    fn new(schema_name: &str) -> Self {
        let t = schema::table(schema_name, "dead_letter");
        let totals = schema::table(schema_name, "dead_letter_totals");
        // The next entries but `$kept` to go, in order: the oldest EVICT_SCAN a peer's input
        // caused (found by the partial index), then, only if there are fewer (so that the scan
        // by id skips fewer) and `$own` allows, the oldest of the others; with how many come
        // before each and what they weigh with it. Those to drop while the totals (`after`)
        // are beyond the bounds `$max_entries`, `$max_bytes`: the rule of DeadLetterBook::keep
        // (the worker does the rest of it for a peer's letter, which drops no other entry here).
        let peer = peer_input_causes!();
        let evict = |kept: &str, max_entries: &str, max_bytes: &str, own: &str| {
            format!(
                "peer_oldest AS ( \
                     SELECT id, weight FROM {t} WHERE {kept} AND cause IN ({peer}) \
                     ORDER BY id LIMIT {EVICT_SCAN} \
                 ), own_oldest AS ( \
                     SELECT id, weight FROM {t} WHERE {kept} AND cause NOT IN ({peer}) \
                         AND {own} AND (SELECT count(*) FROM peer_oldest) < {EVICT_SCAN} \
                     ORDER BY id LIMIT {EVICT_SCAN} \
                 ), oldest AS ( \
                     SELECT id, weight, row_number() OVER w AS n, \
                         (sum(weight) OVER w)::int8 AS freed \
                     FROM (SELECT id, weight, 0 AS own FROM peer_oldest \
                         UNION ALL SELECT id, weight, 1 AS own FROM own_oldest) o \
                     WINDOW w AS (ORDER BY own, id) \
                 ), evicted AS ( \
                     DELETE FROM {t} WHERE id = ANY (ARRAY( \
                         SELECT oldest.id FROM oldest, after \
                         WHERE oldest.n - 1 < after.entries - {max_entries} \
                            OR oldest.freed - oldest.weight < after.bytes - {max_bytes})) \
                     RETURNING weight \
                 )"
            )
        };
        let over = |max_entries: &str, max_bytes: &str| {
            format!("(entries > {max_entries} OR bytes > {max_bytes}) AND entries > 1")
        };
        Self {
            schema: schema_name.to_owned(),
            lock: format!("LOCK TABLE {t} IN SHARE ROW EXCLUSIVE MODE"),
            // $1..$3 the key (kind, source, key), $4..$14 the letter, $13 the time, $14 its
            // weight, $15 and $16 the bounds, $17 whether entries of this process may be
            // dropped for it (not for a peer's letter). Returns the entry's id, whether it was
            // there, how many entries were dropped, and whether the store is still beyond its
            // bounds (then the worker goes on).
            keep: format!(
                "WITH existing AS ( \
                     SELECT id, weight FROM {t} \
                     WHERE kind = $1::text AND source = $2::text AND key = $3::text \
                 ), updated AS ( \
                     UPDATE {t} SET cause = $4::text, origin = $5::bytea, ser_codec = $6::int2, \
                         ser_manifest = $7::text, ser_version = $8::int8, body = $9::bytea, \
                         body_len = $10::int8, attempts = $11::int8, error = $12::text, \
                         last_at = $13::int8, weight = $14::int8 \
                     WHERE id = (SELECT id FROM existing) \
                     RETURNING id \
                 ), inserted AS ( \
                     INSERT INTO {t} (kind, source, key, cause, origin, ser_codec, ser_manifest, \
                         ser_version, body, body_len, attempts, error, first_at, last_at, \
                         replay_failures, weight) \
                     SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13, 0, $14 \
                     WHERE NOT EXISTS (SELECT 1 FROM existing) \
                     RETURNING id \
                 ), after AS ( \
                     SELECT entries + (SELECT count(*) FROM inserted) AS entries, \
                         bytes + $14 - coalesce((SELECT weight FROM existing), 0) AS bytes \
                     FROM {totals} \
                 ), {eviction}, counted AS ( \
                     UPDATE {totals} SET \
                         entries = entries + (SELECT count(*) FROM inserted) \
                             - (SELECT count(*) FROM evicted), \
                         bytes = bytes + $14 - coalesce((SELECT weight FROM existing), 0) \
                             - coalesce((SELECT sum(weight) FROM evicted), 0) \
                     RETURNING entries, bytes \
                 ) \
                 SELECT (SELECT id FROM updated UNION ALL SELECT id FROM inserted), \
                     EXISTS (SELECT 1 FROM existing), (SELECT count(*) FROM evicted), \
                     (SELECT {over} FROM counted)",
                eviction = evict(
                    "id <> coalesce((SELECT id FROM existing), 0)",
                    "$15::int8",
                    "$16::int8",
                    "$17::bool"
                ),
                over = over("$15::int8", "$16::int8"),
            ),
            // What a keep whose statement could not drop enough drops next: $1 the entry kept,
            // $2 and $3 the bounds, $4 whether entries of this process may go.
            evict: format!(
                "WITH after AS (SELECT entries, bytes FROM {totals}), {eviction}, counted AS ( \
                     UPDATE {totals} SET entries = entries - (SELECT count(*) FROM evicted), \
                         bytes = bytes - coalesce((SELECT sum(weight) FROM evicted), 0) \
                     RETURNING entries, bytes \
                 ) \
                 SELECT (SELECT count(*) FROM evicted), (SELECT {over} FROM counted)",
                eviction = evict("id <> $1::int8", "$2::int8", "$3::int8", "$4::bool"),
                over = over("$2::int8", "$3::int8"),
            ),
            // A peer's letter $1 with no other entry of a peer's left to drop, the store beyond
            // `max_bytes` $3 but not beyond `max_entries` $2: its body goes (its length stays).
            // Returns whether it went, and whether the store is still beyond its bounds.
            drop_body: format!(
                "WITH old AS ( \
                     SELECT id, octet_length(body)::int8 AS freed FROM {t} \
                     WHERE id = $1::int8 AND body IS NOT NULL \
                         AND (SELECT entries <= $2::int8 AND bytes > $3::int8 FROM {totals}) \
                 ), stripped AS ( \
                     UPDATE {t} SET weight = {t}.weight - old.freed, body = NULL FROM old \
                     WHERE {t}.id = old.id RETURNING old.freed \
                 ), counted AS ( \
                     UPDATE {totals} SET bytes = bytes - (SELECT freed FROM stripped) \
                     WHERE EXISTS (SELECT 1 FROM stripped) RETURNING entries, bytes \
                 ) \
                 SELECT EXISTS (SELECT 1 FROM stripped), \
                     coalesce((SELECT {over} FROM counted), (SELECT {over} FROM {totals}))",
                over = over("$2::int8", "$3::int8"),
            ),
            list: format!(
                "SELECT {} FROM {t} {}",
                list_columns("$8::bool"),
                list_clause(|n| {
                    let ty = if (2..=4).contains(&n) { "text" } else { "int8" };
                    format!("${n}::{ty}")
                })
            ),
            get: format!("SELECT {COLUMNS} FROM {t} WHERE id = $1::int8"),
            remove: format!(
                "WITH removed AS (DELETE FROM {t} WHERE id = $1::int8 RETURNING weight), \
                 counted AS ( \
                     UPDATE {totals} SET entries = entries - 1, \
                         bytes = bytes - (SELECT weight FROM removed) \
                     WHERE EXISTS (SELECT 1 FROM removed) \
                 ) \
                 SELECT count(*) FROM removed"
            ),
            // $1 the entry, $2 the time, $3 the error (cut already).
            replay_failed: format!(
                "WITH old AS ( \
                     SELECT id, octet_length(error) AS length FROM {t} WHERE id = $1::int8 \
                     FOR UPDATE \
                 ), noted AS ( \
                     UPDATE {t} SET replay_failures = least({t}.replay_failures + 1, 4294967295), \
                         last_at = $2::int8, error = $3::text, \
                         weight = {t}.weight + octet_length($3::text) - old.length \
                     FROM old WHERE {t}.id = old.id \
                     RETURNING octet_length($3::text) - old.length AS grown \
                 ), counted AS ( \
                     UPDATE {totals} SET bytes = bytes + (SELECT grown FROM noted) \
                     WHERE EXISTS (SELECT 1 FROM noted) \
                 ) \
                 SELECT count(*) FROM noted"
            ),
            counts: format!(
                "SELECT cause, count(*), coalesce(sum(weight), 0)::int8 FROM {t} GROUP BY cause"
            ),
            entries: t,
            totals,
        }
    }
}

/// The store's connection and its prepared statements.
struct Connection {
    client: Client,
    begin: Statement,
    lock: Statement,
    commit: Statement,
    keep: Statement,
    evict: Statement,
    drop_body: Statement,
    list: Statement,
    get: Statement,
    remove: Statement,
    replay_failed: Statement,
    counts: Statement,
}

/// The store's worker: serves the requests in order on its connection, opened again after a
/// loss.
struct Worker {
    connector: Connector,
    limits: DeadLetterLimits,
    sql: Sql,
    connection: Option<Connection>,
}

/// The answer to one of a pipelined transaction's statements.
enum Answer {
    Done,
    Kept(KeptRow),
}

/// What the keep statement says.
struct KeptRow {
    kept: Kept,
    over: bool,
}

type Pipelined<'a> = Pin<Box<dyn Future<Output = Result<Answer, tokio_postgres::Error>> + 'a>>;

/// A failed statement: what was done, and the server's message and SQLSTATE.
fn failed(happened: Happened, what: &str, err: &tokio_postgres::Error) -> DeadLetterError {
    storage(
        happened,
        format_args!("dead letters: {what}: {}", ErrorChain(err)),
    )
}

/// Replaces NUL, which PostgreSQL's text cannot hold, and cuts `text` again (a replacement is
/// longer).
fn text_for_postgres(text: &mut String) {
    if text.contains('\0') {
        *text = text.replace('\0', "\u{fffd}");
        cut_text(text);
    }
}

/// The parameters of the keep statement for `keep`: its letter with NUL replaced in its
/// texts (PostgreSQL's text cannot hold it), weighed as kept.
struct KeepParams {
    kind: &'static str,
    source: String,
    key: String,
    cause: &'static str,
    origin: Option<Vec<u8>>,
    codec: i16,
    manifest: String,
    version: i64,
    body: Option<Vec<u8>>,
    body_len: i64,
    attempts: i64,
    error: String,
    now: i64,
    weight: i64,
    max_entries: i64,
    max_bytes: i64,
    /// Whether entries of this process (give-ups, poison) may be dropped for the letter by
    /// the keep statement: not for a peer's (the worker makes room for one, see `keep_alone`).
    own_may_go: bool,
}

impl KeepParams {
    /// The parameters of a keep's letter (its reply goes apart).
    fn of(
        mut letter: NewDeadLetter,
        origin: Option<Vec<u8>>,
        now_ms: u64,
        limits: &DeadLetterLimits,
    ) -> Self {
        text_for_postgres(&mut letter.source);
        text_for_postgres(&mut letter.key);
        text_for_postgres(&mut letter.error);
        let manifest = &letter.manifest;
        if manifest.name().contains('\0') {
            let name = manifest.name().replace('\0', "\u{fffd}");
            letter.manifest = Manifest::from_stored(manifest.codec_id(), name, manifest.version());
        }
        Self {
            kind: letter.kind.as_str(),
            cause: letter.cause.as_str(),
            origin,
            codec: i16::from(letter.manifest.codec_id()),
            manifest: letter.manifest.name().to_owned(),
            version: i64::from(letter.manifest.version()),
            body_len: int(letter.body_len),
            attempts: i64::from(letter.attempts),
            now: int(now_ms),
            weight: int(letter.weight()),
            max_entries: int(limits.max_entries),
            max_bytes: int(limits.max_bytes),
            own_may_go: !letter.cause.is_peer_input(),
            source: letter.source,
            key: letter.key,
            body: letter.body,
            error: letter.error,
        }
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 17] {
        [
            &self.kind,
            &self.source,
            &self.key,
            &self.cause,
            &self.origin,
            &self.codec,
            &self.manifest,
            &self.version,
            &self.body,
            &self.body_len,
            &self.attempts,
            &self.error,
            &self.now,
            &self.weight,
            &self.max_entries,
            &self.max_bytes,
            &self.own_may_go,
        ]
    }
}

impl KeptRow {
    fn of(row: &tokio_postgres::Row) -> Result<Self, tokio_postgres::Error> {
        let id: i64 = row.try_get(0)?;
        let evicted: i64 = row.try_get(2)?;
        Ok(Self {
            kept: Kept {
                id: id as u64,
                updated: row.try_get(1)?,
                evicted: evicted as u64,
            },
            over: row.try_get(3)?,
        })
    }
}

impl Worker {
    fn new(connector: Connector, limits: DeadLetterLimits) -> Self {
        let sql = Sql::new(&connector.sql.schema);
        Self {
            connector,
            limits,
            sql,
            connection: None,
        }
    }

    /// Reads the journal's id if it is not known, opens the tables, then serves the requests
    /// until every sender is gone.
    async fn serve(
        mut self,
        identity: Identity,
        mut queue: mpsc::Receiver<Request>,
        opened: Opened,
    ) {
        let setup = match identity {
            Identity::Known(id) => self.setup().await.map(|()| id),
            Identity::FromSchema => match self.identify().await {
                Ok(id) => self.setup().await.map(|()| id),
                Err(err) => Err(err),
            },
        };
        let failed = setup.is_err();
        if opened.send(setup).is_err() || failed {
            return;
        }
        let mut carried = None;
        loop {
            let request = match carried.take() {
                Some(request) => request,
                None => match queue.recv().await {
                    Some(request) => request,
                    None => break,
                },
            };
            match request {
                Request::Keep(first) => {
                    let (keeps, next) = group(first, || queue.try_recv().ok());
                    carried = next;
                    self.keep_group(keeps).await;
                }
                Request::List { filter, reply } => {
                    let _ = reply.send(self.list(&filter).await);
                }
                Request::Get { id, reply } => {
                    let _ = reply.send(self.get(id).await);
                }
                Request::Remove { id, reply } => {
                    let result = self
                        .write("remove an entry", |c| &c.remove, &[&int(id)])
                        .await;
                    let _ = reply.send(result.map(|removed| removed > 0));
                }
                Request::ReplayFailed {
                    id,
                    mut error,
                    now_ms,
                    reply,
                } => {
                    cut_text(&mut error);
                    text_for_postgres(&mut error);
                    let (id, now) = (int(id), int(now_ms));
                    let result = self
                        .write(
                            "note a failed replay",
                            |c| &c.replay_failed,
                            &[&id, &now, &error],
                        )
                        .await;
                    let _ = reply.send(result.map(|noted| noted > 0));
                }
                Request::Counts { reply } => {
                    let _ = reply.send(self.counts().await);
                }
            }
        }
    }

    /// The id of the journal in the store's schema, its marks checked first (nothing is
    /// written to a schema that holds no journal).
    async fn identify(&self) -> Result<JournalId, DeadLetterError> {
        let client =
            self.connector.open().await.map_err(|err| {
                storage(Happened::CertainlyNot, format_args!("dead letters: {err}"))
            })?;
        journal_identity(&client, &self.sql.schema)
            .await
            .map_err(|err| match err {
                JournalError::Schema { .. } => FieldError::new("journal", err.to_string()).into(),
                other => storage(
                    Happened::CertainlyNot,
                    format_args!("dead letters: {other}"),
                ),
            })
    }

    /// Creates the tables if they are missing and counts the totals again, in one
    /// transaction under the store's lock; then prepares the statements.
    async fn setup(&mut self) -> Result<(), DeadLetterError> {
        let cannot = |what: &'static str| {
            move |err: tokio_postgres::Error| failed(Happened::CertainlyNot, what, &err)
        };
        let client =
            self.connector.open().await.map_err(|err| {
                storage(Happened::CertainlyNot, format_args!("dead letters: {err}"))
            })?;
        let sql = &self.sql;
        // The tables and the index the eviction needs (a store whose tables an earlier version
        // made gets it now).
        let index = schema::table(&sql.schema, "dead_letter_peer_input");
        let exists: bool = client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL \
                     AND to_regclass($3) IS NOT NULL",
                &[&sql.entries, &sql.totals, &index],
            )
            .await
            .and_then(|row| row.try_get(0))
            .map_err(cannot("cannot look for the tables"))?;
        let create = if exists {
            String::new()
        } else {
            format!(
                "SELECT pg_advisory_xact_lock(hashtext('actix-delivery dead letters {schema}')); \
                 SET LOCAL search_path TO \"{schema}\"; {tables}",
                schema = sql.schema,
                tables = PostgresDeadLetters::SCHEMA_SQL,
            )
        };
        let setup = format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; {create} {lock}; \
             DELETE FROM {totals}; \
             INSERT INTO {totals} (entries, bytes) \
                 SELECT count(*), coalesce(sum(weight), 0) FROM {entries}; \
             COMMIT",
            lock = sql.lock,
            totals = sql.totals,
            entries = sql.entries,
        );
        if let Err(err) = client.batch_execute(&setup).await {
            let _ = client.batch_execute("ROLLBACK").await;
            let what = if exists {
                "cannot count the totals"
            } else {
                "cannot create the tables or their index (create them with \
                 PostgresDeadLetters::SCHEMA_SQL)"
            };
            return Err(failed(Happened::CertainlyNot, what, &err));
        }
        self.connection = Some(self.prepare(client).await?);
        Ok(())
    }

    /// Prepares the statements on `client`.
    async fn prepare(&self, client: Client) -> Result<Connection, DeadLetterError> {
        let sql = &self.sql;
        let prepared = async {
            Ok::<_, tokio_postgres::Error>([
                client
                    .prepare("BEGIN ISOLATION LEVEL READ COMMITTED")
                    .await?,
                client.prepare(&sql.lock).await?,
                client.prepare("COMMIT").await?,
                client.prepare(&sql.keep).await?,
                client.prepare(&sql.evict).await?,
                client.prepare(&sql.drop_body).await?,
                client.prepare(&sql.list).await?,
                client.prepare(&sql.get).await?,
                client.prepare(&sql.remove).await?,
                client.prepare(&sql.replay_failed).await?,
                client.prepare(&sql.counts).await?,
            ])
        }
        .await;
        let [begin, lock, commit, keep, evict, drop_body, list, get, remove, replay_failed, counts] =
            prepared.map_err(|err| {
                failed(
                    Happened::CertainlyNot,
                    "cannot prepare the statements",
                    &err,
                )
            })?;
        Ok(Connection {
            client,
            begin,
            lock,
            commit,
            keep,
            evict,
            drop_body,
            list,
            get,
            remove,
            replay_failed,
            counts,
        })
    }

    /// The connection, opened (and its statements prepared) if there is none or it was lost.
    async fn connection(&mut self) -> Result<&Connection, DeadLetterError> {
        if self
            .connection
            .as_ref()
            .is_some_and(|connection| connection.client.is_closed())
        {
            self.connection = None;
        }
        if self.connection.is_none() {
            let client = self.connector.open().await.map_err(|err| {
                storage(Happened::CertainlyNot, format_args!("dead letters: {err}"))
            })?;
            self.connection = Some(self.prepare(client).await?);
        }
        Ok(self.connection.as_ref().expect("connected"))
    }

    /// Forgets the connection if `err` says it is lost.
    fn lost(&mut self, err: &tokio_postgres::Error) -> bool {
        let lost = is_connection_lost(err) || err.as_db_error().is_none();
        if lost {
            self.connection = None;
        }
        lost
    }

    /// Runs the read `statement` with `params`; once more on a new connection if the
    /// connection was lost (a read changes nothing).
    async fn read(
        &mut self,
        what: &str,
        statement: fn(&Connection) -> &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, DeadLetterError> {
        let mut retried = false;
        loop {
            let connection = self.connection().await?;
            match connection.client.query(statement(connection), params).await {
                Ok(rows) => return Ok(rows),
                Err(err) if self.lost(&err) && !retried => retried = true,
                Err(err) => return Err(failed(Happened::CertainlyNot, what, &err)),
            }
        }
    }

    /// Runs the write `statement` (one statement, its own transaction) with `params`; the
    /// count in its one row. A lost connection leaves it in doubt: it may have committed.
    async fn write(
        &mut self,
        what: &str,
        statement: fn(&Connection) -> &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<i64, DeadLetterError> {
        let connection = self.connection().await?;
        let result = connection
            .client
            .query_one(statement(connection), params)
            .await
            .and_then(|row| row.try_get(0));
        result.map_err(|err| {
            let happened = if self.lost(&err) {
                Happened::InDoubt
            } else {
                Happened::CertainlyNot
            };
            failed(happened, what, &err)
        })
    }

    async fn list(&mut self, filter: &DeadLetterFilter) -> Result<DeadLetterPage, DeadLetterError> {
        let p = FilterParams::of(filter);
        let params: [&(dyn ToSql + Sync); 8] = [
            &p.after,
            &p.cause,
            &p.kind,
            &p.source,
            &p.since,
            &p.until,
            &p.rows,
            &p.without_bodies,
        ];
        let rows = self.read("list entries", |c| &c.list, &params).await?;
        let entries = rows
            .iter()
            .map(|row| entry(row).and_then(Row::into_entry))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DeadLetterPage::of(entries, filter))
    }

    async fn get(&mut self, id: u64) -> Result<Option<StoredDeadLetter>, DeadLetterError> {
        let rows = self.read("read an entry", |c| &c.get, &[&int(id)]).await?;
        rows.first()
            .map(|row| entry(row).and_then(Row::into_entry))
            .transpose()
    }

    async fn counts(&mut self) -> Result<DeadLetterCounts, DeadLetterError> {
        let what = "count the entries";
        let rows = self.read(what, |c| &c.counts, &[]).await?;
        let rows = rows
            .iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|err| failed(Happened::CertainlyNot, what, &err))?;
        counts(rows)
    }

    /// Commits `keeps` in one pipelined transaction, or, if one of them failed or must drop
    /// more than its statement did, each on its own; answers each once committed (or failed).
    async fn keep_group(&mut self, keeps: Vec<KeepRequest>) {
        let (params, replies): (Vec<KeepParams>, Vec<_>) = keeps
            .into_iter()
            .map(|keep| {
                let params = KeepParams::of(keep.letter, keep.origin, keep.now_ms, &self.limits);
                (params, keep.reply)
            })
            .unzip();
        let pipelined = if params.len() == 1 {
            Ok(None)
        } else {
            self.keep_pipelined(&params).await
        };
        match pipelined {
            Ok(Some(kept)) => {
                for (reply, kept) in replies.into_iter().zip(kept) {
                    let _ = reply.send(Ok(kept));
                }
            }
            Ok(None) => {
                for (reply, params) in replies.into_iter().zip(&params) {
                    let _ = reply.send(self.keep_alone(params).await);
                }
            }
            Err(err) => {
                for reply in replies {
                    let _ = reply.send(Err(err.clone()));
                }
            }
        }
    }

    /// Sends `BEGIN`, the lock and every keep at once and, if all of them went through and
    /// none must drop more entries, `COMMIT`: the keeps' answers. `None` when the
    /// transaction was rolled back, to be redone keep by keep.
    async fn keep_pipelined(
        &mut self,
        keeps: &[KeepParams],
    ) -> Result<Option<Vec<Kept>>, DeadLetterError> {
        let what = "keep a letter";
        let connection = self.connection().await?;
        let client = &connection.client;
        let params: Vec<[&(dyn ToSql + Sync); 17]> = keeps.iter().map(KeepParams::params).collect();
        let mut futures: Vec<Pipelined<'_>> = Vec::with_capacity(keeps.len() + 2);
        for statement in [&connection.begin, &connection.lock] {
            futures.push(Box::pin(async move {
                client.execute(statement, &[]).await.map(|_| Answer::Done)
            }));
        }
        for params in &params {
            futures.push(Box::pin(async move {
                let row = client.query_one(&connection.keep, params).await?;
                KeptRow::of(&row).map(Answer::Kept)
            }));
        }
        let answers = pipeline(futures).await;
        let mut kept = Vec::with_capacity(keeps.len());
        let mut redo = false;
        let mut refused = None;
        for answer in answers {
            match answer {
                Ok(Answer::Done) => {}
                Ok(Answer::Kept(row)) => {
                    redo |= row.over;
                    kept.push(row.kept);
                }
                Err(err) if self.lost(&err) => {
                    // COMMIT was not sent: the server rolls the transaction back.
                    return Err(failed(Happened::CertainlyNot, what, &err));
                }
                Err(err) => {
                    refused.get_or_insert(err);
                }
            }
        }
        if redo || refused.is_some() {
            if let Some(err) = refused {
                log::debug!(
                    "dead letters: a group of {} keeps was refused, each is kept on its own: {}",
                    keeps.len(),
                    ErrorChain(&err)
                );
            }
            self.rollback().await;
            return Ok(None);
        }
        self.commit(what).await.map(|()| Some(kept))
    }

    /// Keeps one letter in a transaction of its own, dropping as many entries as it must, by
    /// the rule of `DeadLetterBook::keep`: the entries of a peer's first; for a peer's letter,
    /// once none is left, entries of this process only for `max_entries`, then its own body,
    /// then entries of this process for `max_bytes`.
    async fn keep_alone(&mut self, keep: &KeepParams) -> Result<Kept, DeadLetterError> {
        let what = "keep a letter";
        let totals = self.sql.totals.clone();
        let connection = self.connection().await?;
        let client = &connection.client;
        let result = async {
            client.execute(&connection.begin, &[]).await?;
            client.execute(&connection.lock, &[]).await?;
            let row = client.query_one(&connection.keep, &keep.params()).await?;
            let KeptRow { mut kept, mut over } = KeptRow::of(&row)?;
            let id = kept.id as i64;
            // Drops entries (of a peer's only, unless `own`) while beyond `max_bytes` (or not
            // looking at the bytes): how many, and whether the store is still beyond its bounds.
            let evict = |max_bytes: i64, own: bool| async move {
                let params: [&(dyn ToSql + Sync); 4] = [&id, &keep.max_entries, &max_bytes, &own];
                let row = client.query_one(&connection.evict, &params).await?;
                Ok::<_, tokio_postgres::Error>((row.try_get::<_, i64>(0)?, row.try_get(1)?))
            };
            let mut own = keep.own_may_go;
            while over {
                let (evicted, still) = evict(keep.max_bytes, own).await?;
                kept.evicted += evicted as u64;
                over = still;
                if evicted > 0 || !over {
                    continue;
                }
                if own {
                    log::warn!(
                        "dead letters: the totals in `{}` count entries that are not there \
                         (they are counted again when a store opens)",
                        totals
                    );
                    break;
                }
                // A peer's letter, no other entry of a peer's left: entries of this process go
                // for `max_entries` alone, then its body for the bytes, then entries of this
                // process for the bytes.
                let (evicted, _) = evict(i64::MAX, true).await?;
                kept.evicted += evicted as u64;
                let params: [&(dyn ToSql + Sync); 3] = [&id, &keep.max_entries, &keep.max_bytes];
                let row = client.query_one(&connection.drop_body, &params).await?;
                over = row.try_get(1)?;
                own = true;
            }
            Ok::<_, tokio_postgres::Error>(kept)
        }
        .await;
        match result {
            Ok(kept) => self.commit(what).await.map(|()| kept),
            Err(err) => {
                // COMMIT was not sent: nothing happened, whether the connection is lost or not.
                if !self.lost(&err) {
                    self.rollback().await;
                }
                Err(failed(Happened::CertainlyNot, what, &err))
            }
        }
    }

    /// Sends `COMMIT` and waits for its answer. A refused commit did not happen; one whose
    /// answer was lost with the connection may have. A session ended right after the server
    /// confirmed the commit (the confirmation came, then the error) counts as committed.
    async fn commit(&mut self, what: &str) -> Result<(), DeadLetterError> {
        let connection = self.connection.as_ref().expect("in a transaction");
        let result = run_commit(&connection.client, &connection.commit).await;
        result.map_err(|err| {
            let happened = if self.lost(&err) {
                Happened::InDoubt
            } else {
                Happened::CertainlyNot
            };
            failed(happened, &format!("{what}, at its commit"), &err)
        })
    }

    /// Rolls the open transaction back (a lost connection has done so by itself).
    async fn rollback(&mut self) {
        let Some(connection) = &self.connection else {
            return;
        };
        if let Err(err) = connection.client.batch_execute("ROLLBACK").await {
            self.lost(&err);
        }
    }
}

/// Reads an entry's columns ([`COLUMNS`]; the inspector's reads too).
pub(super) fn entry(row: &tokio_postgres::Row) -> Result<Row, DeadLetterError> {
    let read = || {
        Ok::<_, tokio_postgres::Error>(Row {
            id: row.try_get(0)?,
            kind: row.try_get(1)?,
            source: row.try_get(2)?,
            cause: row.try_get(3)?,
            key: row.try_get(4)?,
            origin: row.try_get(5)?,
            codec: i64::from(row.try_get::<_, i16>(6)?),
            manifest: row.try_get(7)?,
            version: row.try_get(8)?,
            body: row.try_get(9)?,
            body_len: row.try_get(10)?,
            attempts: row.try_get(11)?,
            error: row.try_get(12)?,
            first_at: row.try_get(13)?,
            last_at: row.try_get(14)?,
            replay_failures: row.try_get(15)?,
        })
    };
    read().map_err(|err| failed(Happened::CertainlyNot, "read an entry", &err))
}
