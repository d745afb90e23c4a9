//! The tables, and the check that a database holds this crate's schema in its version.
//!
//! The tables (see `schema.sql`, also
//! [`PostgresJournal::SCHEMA_SQL`](super::PostgresJournal::SCHEMA_SQL)) have the shape Akka
//! Persistence JDBC/R2DBC users know: `event_journal(persistence_id, seq_nr, payload, written_at)`
//! keyed by `(persistence_id, seq_nr)`, `snapshot`, plus `stream_metadata(persistence_id,
//! highest_seq)`, which keeps each stream's highest seq across deletions and is the fence, and
//! `journal_schema(application, version)`, one row naming what made the tables. All live in one
//! PostgreSQL schema (`public` by default).
//!
//! Schema 2 adds each payload's manifest (`ser_codec`, `ser_manifest`, `ser_version`) to
//! `event_journal` and `snapshot`; schema 3 the table `event_tag` (see `schema.sql` for how
//! its offset never skips).
//!
//! `journal_identity` holds one row, the journal's [`JournalId`] (`identity.sql`, also
//! [`PostgresJournal::IDENTITY_SQL`](super::PostgresJournal::IDENTITY_SQL)): created with the
//! tables, and for a schema made before ids existed on connect (under the same lock, in the
//! transaction that migrates, if one does). It changes no version: the previous release does
//! not know the table and leaves it alone, so it still reads the journal. With
//! `create_tables` off a schema without it is used without an id (logged).
//!
//! `dead_letter` and `dead_letter_totals` belong to
//! [`PostgresDeadLetters`](super::PostgresDeadLetters), which creates them in the journal's
//! schema when first opened there
//! ([`PostgresDeadLetters::SCHEMA_SQL`](super::PostgresDeadLetters::SCHEMA_SQL)). They raise
//! no schema version: neither the journal's check nor the previous release looks at them.
//!
//! On connect: no journal table in the schema → the tables are created (under an advisory lock, so
//! two nodes starting at once create them once); `journal_schema` says `actix-delivery`, version 1
//! or 2 → migrated to 3 (`migrate_1_to_2.sql`, then `migrate_2_to_3.sql`, under the same lock and
//! in one transaction; what version 1 wrote reads as
//! [`Manifest::legacy`](crate::codec::Manifest::legacy), and what versions 1 and 2 wrote has no
//! tags); version 3, and every table is there → used; anything else (a newer version, another
//! application, journal tables without `journal_schema`, a column the journal uses missing or of
//! another type) → refused with [`JournalError::Schema`], nothing changed. With `create_tables`
//! off, an older schema is refused with an error naming the migrations to run by hand. Then every
//! tag row must be of a transaction the server has run (`txid` below its next one): tag rows
//! restored from a logical dump into another cluster, with lower transaction ids, are refused with
//! a [`JournalError::Schema`] that names
//! [`PostgresJournal::RENUMBER_TAGS_SQL`](super::PostgresJournal::RENUMBER_TAGS_SQL) (see
//! [`check_transaction_ids`]). Tables altered while the journal runs are reported the same way: a
//! statement failing with SQLSTATE 42703, 42P01 or 42804 (undefined column or table, wrong type) is
//! a `Schema` error with the server's message, not a transient `Storage` one.

use tokio_postgres::Client;

use crate::journal::postgres::config::PostgresConfig;
use crate::journal::postgres::db_error;
use crate::journal::{JournalError, JournalId};
use crate::runtime::error_chain::ErrorChain;

/// What `journal_schema.application` holds.
const APPLICATION: &str = "actix-delivery";
/// The schema version this crate reads and writes.
pub(super) const SCHEMA_VERSION: i32 = 3;

/// The migrations, in order: `MIGRATIONS[v - 1]` takes version `v` to `v + 1`, named as the
/// constants of [`PostgresJournal`](super::PostgresJournal) that hold them.
const MIGRATIONS: [(&str, &str); 2] = [
    (
        "MIGRATE_1_TO_2_SQL",
        super::PostgresJournal::MIGRATE_1_TO_2_SQL,
    ),
    (
        "MIGRATE_2_TO_3_SQL",
        super::PostgresJournal::MIGRATE_2_TO_3_SQL,
    ),
];

/// The tables of every schema version, and the one version 3 added.
const TABLES: [&str; 5] = [
    "event_journal",
    "snapshot",
    "stream_metadata",
    "journal_schema",
    "event_tag",
];

/// The tables of schema `version`.
fn tables(version: i32) -> &'static [&'static str] {
    if version >= 3 {
        &TABLES
    } else {
        &TABLES[..4]
    }
}

/// The columns schema 2 added (see [`COLUMNS`]).
const MANIFEST_COLUMNS: [(&str, &str, &str); 6] = [
    ("event_journal", "ser_codec", "smallint"),
    ("event_journal", "ser_manifest", "text"),
    ("event_journal", "ser_version", "bigint"),
    ("snapshot", "ser_codec", "smallint"),
    ("snapshot", "ser_manifest", "text"),
    ("snapshot", "ser_version", "bigint"),
];

/// The columns schema 3 added: the table `event_tag`.
const TAG_COLUMNS: [(&str, &str, &str); 7] = [
    ("event_tag", "tag", "text"),
    ("event_tag", "txid", "xid8"),
    ("event_tag", "ordering", "bigint"),
    ("event_tag", "persistence_id", "text"),
    ("event_tag", "seq_nr", "bigint"),
    ("event_tag", "slice", "smallint"),
    ("event_tag", "written_at", "timestamp with time zone"),
];

/// The columns of schema version 1, with their types as `format_type` spells them; version 2
/// adds [`MANIFEST_COLUMNS`], version 3 [`TAG_COLUMNS`].
const COLUMNS: [(&str, &str, &str); 12] = [
    ("event_journal", "persistence_id", "text"),
    ("event_journal", "seq_nr", "bigint"),
    ("event_journal", "payload", "bytea"),
    ("event_journal", "written_at", "timestamp with time zone"),
    ("snapshot", "persistence_id", "text"),
    ("snapshot", "seq_nr", "bigint"),
    ("snapshot", "payload", "bytea"),
    ("snapshot", "written_at", "timestamp with time zone"),
    ("stream_metadata", "persistence_id", "text"),
    ("stream_metadata", "highest_seq", "bigint"),
    ("journal_schema", "application", "text"),
    ("journal_schema", "version", "integer"),
];

/// SQLSTATEs that say a table or column is not what the journal's statements expect: an
/// undefined column (42703) or table (42P01), a column of another type (42804). The tables
/// were altered behind the journal's back: no retry helps.
const ALTERED: [&str; 3] = ["42703", "42P01", "42804"];

/// A [`JournalError::Schema`] for `err` if it says the tables were altered (see
/// [`ALTERED`]), keeping what failed (`what`) and the server's message.
pub(super) fn altered(what: &str, err: &tokio_postgres::Error) -> Option<JournalError> {
    let code = err.code()?.code();
    ALTERED.contains(&code).then(|| {
        schema_error(format!(
            "tables altered by hand: {what}: {}",
            ErrorChain(err)
        ))
    })
}

/// `schema.table`, for SQL text (the schema is a validated plain identifier).
pub(super) fn table(schema: &str, table: &str) -> String {
    format!("\"{schema}\".{table}")
}

fn expected() -> String {
    format!("an {APPLICATION} journal, schema version {SCHEMA_VERSION}")
}

fn schema_error(found: String) -> JournalError {
    JournalError::Schema {
        found,
        expected: expected(),
    }
}

/// Checks the schema, creating the tables if there are none, migrating older ones and giving
/// the journal its identity if it has none (as far as the options allow); returns the
/// journal's id.
pub(super) async fn check_or_create(
    client: &Client,
    options: &PostgresConfig,
) -> Result<Option<JournalId>, JournalError> {
    let schema = &options.schema;
    match inspect(client, schema).await? {
        Found::Current => match identity(client, schema).await? {
            Some(id) => return Ok(Some(id)),
            None if !options.create_tables => {
                log::warn!(
                    "journal in schema `{schema}` has no identity (no row in \
                     journal_identity, and create_tables is off): read models of it cannot \
                     tell it from another journal; give it one with \
                     PostgresJournal::IDENTITY_SQL"
                );
                return Ok(None);
            }
            None => {}
        },
        Found::Empty if !options.create_tables => {
            return Err(schema_error(format!(
                "no journal tables in schema `{}` (create them with PostgresJournal::SCHEMA_SQL, \
                 or allow create_tables)",
                options.schema
            )))
        }
        Found::Older(version) if !options.create_tables => {
            let names: Vec<&str> = MIGRATIONS[(version - 1) as usize..]
                .iter()
                .map(|(name, _)| *name)
                .collect();
            return Err(schema_error(format!(
                "schema version {version} in schema `{}` (migrate it with \
                 PostgresJournal::{}, in one transaction, or allow create_tables)",
                options.schema,
                names.join(" then PostgresJournal::")
            )));
        }
        Found::Empty | Found::Older(_) => {}
    }
    // Serialise creators: another node may be doing the same right now.
    let create = format!(
        "BEGIN; \
         SELECT pg_advisory_xact_lock(hashtext('actix-delivery journal schema {schema}')); \
         SET LOCAL search_path TO \"{schema}\";",
        schema = options.schema
    );
    client
        .batch_execute(&create)
        .await
        .map_err(|err| db_error(None, "cannot start creating the tables", &err))?;
    let result = async {
        let exists = client
            .query_opt(
                "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1",
                &[&options.schema],
            )
            .await
            .map_err(|err| db_error(None, "cannot look up the schema", &err))?;
        if exists.is_none() {
            // Only when missing: CREATE SCHEMA IF NOT EXISTS needs the privilege regardless.
            client
                .batch_execute(&format!("CREATE SCHEMA \"{}\"", options.schema))
                .await
                .map_err(|err| db_error(None, "cannot create the schema", &err))?;
        }
        match inspect(client, &options.schema).await? {
            Found::Empty => client
                .batch_execute(super::PostgresJournal::SCHEMA_SQL)
                .await
                .map_err(|err| db_error(None, "cannot create the tables", &err))?,
            Found::Older(version) => {
                for (_, migration) in &MIGRATIONS[(version - 1) as usize..] {
                    client
                        .batch_execute(migration)
                        .await
                        .map_err(|err| db_error(None, "cannot migrate the tables", &err))?;
                }
                log::info!(
                    "journal in schema `{}` migrated from schema version {version} to \
                     {SCHEMA_VERSION}",
                    options.schema
                );
            }
            Found::Current => {}
        }
        client
            .batch_execute(super::PostgresJournal::IDENTITY_SQL)
            .await
            .map_err(|err| db_error(None, "cannot give the journal its identity", &err))?;
        Ok((
            inspect(client, &options.schema).await?,
            identity(client, &options.schema).await?,
        ))
    }
    .await;
    match result {
        Ok((Found::Current, Some(id))) => client
            .batch_execute("COMMIT")
            .await
            .map(|()| Some(id))
            .map_err(|err| db_error(None, "cannot commit the new tables", &err)),
        Ok((Found::Current, None)) => {
            let _ = client.batch_execute("ROLLBACK").await;
            Err(schema_error(
                "no row in journal_identity after one was given".into(),
            ))
        }
        Ok((Found::Empty | Found::Older(_), _)) => {
            let _ = client.batch_execute("ROLLBACK").await;
            Err(schema_error(
                "tables that vanished, or kept their version, while being created or migrated"
                    .into(),
            ))
        }
        Err(err) => {
            let _ = client.batch_execute("ROLLBACK").await;
            Err(err)
        }
    }
}

/// The highest offset `(txid, ordering)` of any tag row in `schema`: one row, or none while
/// there are no tag rows. The newest row of each tag through the primary key `(tag, txid,
/// ordering)`, tag after tag (a loose index scan: two index probes per distinct tag, where
/// `max` would read every row), then the highest of those.
pub(super) fn highest_offset_sql(schema: &str) -> String {
    let tags = table(schema, "event_tag");
    format!(
        "WITH RECURSIVE tags AS ( \
             (SELECT tag FROM {tags} ORDER BY tag LIMIT 1) \
             UNION ALL \
             SELECT (SELECT t.tag FROM {tags} t WHERE t.tag > tags.tag ORDER BY t.tag LIMIT 1) \
             FROM tags WHERE tags.tag IS NOT NULL \
         ) \
         SELECT newest.txid::text::int8, newest.ordering FROM tags CROSS JOIN LATERAL ( \
             SELECT t.txid, t.ordering FROM {tags} t WHERE t.tag = tags.tag \
             ORDER BY t.txid DESC, t.ordering DESC LIMIT 1 \
         ) newest \
         ORDER BY newest.txid DESC, newest.ordering DESC LIMIT 1"
    )
}

/// Refuses a schema whose tag rows carry a transaction id this server has not assigned yet
/// (at or above `pg_snapshot_xmax` of a snapshot taken after they were read): the tables were
/// restored from a logical dump into another cluster, whose ids are lower. An entry's offset
/// is `(txid, ordering)`, so what is appended now would sort before those rows, and a tag
/// reader that has read past them would never see it. Reads the highest offset as
/// [`highest_offset_sql`] does.
pub(super) async fn check_transaction_ids(
    client: &Client,
    schema: &str,
) -> Result<(), JournalError> {
    let failed = |err| db_error(None, "cannot check the transaction ids of the tags", &err);
    let newest = client
        .query_opt(&highest_offset_sql(schema), &[])
        .await
        .map_err(failed)?;
    let highest: Option<i64> = newest
        .map(|row| row.try_get(0))
        .transpose()
        .map_err(failed)?;
    let xmax: i64 = client
        .query_one(NEXT_TRANSACTION_SQL, &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(failed)?;
    match highest {
        Some(highest) if highest >= xmax => Err(JournalError::Schema {
            found: format!(
                "tag rows in schema `{schema}` written by transaction {highest}, but this server \
                 has not reached that transaction id (its next one is {xmax}): the tables were \
                 restored from a logical dump (pg_dump/pg_restore) into another cluster. An \
                 entry's offset in its tag starts with its transaction's id, so entries \
                 appended now would sort before those rows, and every tag reader (projection) \
                 that has read past them would miss them"
            ),
            expected: format!(
                "tag rows of transactions this server has run (restore physically instead: \
                 pg_basebackup or a file-system copy, or pg_upgrade, which keep the \
                 transaction ids; or re-number the tag rows with \
                 PostgresJournal::RENUMBER_TAGS_SQL and reset the projections of schema \
                 `{schema}`)"
            ),
        }),
        _ => Ok(()),
    }
}

/// The server's first transaction id not yet assigned (`pg_snapshot_xmax` of the current
/// snapshot).
const NEXT_TRANSACTION_SQL: &str = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8";

/// Checks that every column the journal uses is there, with its type: a table altered by
/// hand (a column dropped, renamed or retyped) is refused on connect rather than failing
/// every write later.
async fn check_columns(client: &Client, schema: &str, version: i32) -> Result<(), JournalError> {
    let rows = client
        .query(
            "SELECT c.relname::text, a.attname::text, format_type(a.atttypid, a.atttypmod) \
             FROM pg_catalog.pg_attribute a \
             JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = ANY($2) AND a.attnum > 0 \
               AND NOT a.attisdropped",
            &[&schema, &&TABLES[..]],
        )
        .await
        .map_err(|err| db_error(None, "cannot read the catalog", &err))?;
    let mut found = Vec::with_capacity(rows.len());
    for row in &rows {
        let read = (|| {
            Ok::<_, tokio_postgres::Error>((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
        })();
        let column: (String, String, String) =
            read.map_err(|err| db_error(None, "cannot read the catalog", &err))?;
        found.push(column);
    }
    let manifest_columns = if version >= 2 {
        &MANIFEST_COLUMNS[..]
    } else {
        &[]
    };
    let tag_columns = if version >= 3 { &TAG_COLUMNS[..] } else { &[] };
    let expected = COLUMNS.iter().chain(manifest_columns).chain(tag_columns);
    for &(table, column, expected_type) in expected {
        let actual = found
            .iter()
            .find(|(t, c, _)| t == table && c == column)
            .map(|(_, _, ty)| ty.as_str());
        match actual {
            Some(ty) if ty == expected_type => {}
            Some(ty) => {
                return Err(schema_error(format!(
                    "tables altered by hand: column `{column}` of `{schema}.{table}` is of type \
                     {ty}, not {expected_type}"
                )))
            }
            None => {
                return Err(schema_error(format!(
                    "tables altered by hand: `{schema}.{table}` has no column `{column}`"
                )))
            }
        }
    }
    Ok(())
}

/// The [`JournalId`] of the journal in `schema`, its marks checked as the journal checks a
/// schema it connects to (no journal tables, another application's tables and a newer schema
/// version are refused), without writing anything: what a store that writes beside the
/// journal without connecting it names the schema by.
pub(super) async fn journal_identity(
    client: &Client,
    schema: &str,
) -> Result<JournalId, JournalError> {
    if let Found::Empty = inspect(client, schema).await? {
        return Err(schema_error(format!(
            "no journal tables in schema `{schema}`"
        )));
    }
    identity(client, schema).await?.ok_or_else(|| {
        schema_error(format!(
            "a journal without an id in schema `{schema}` (no row in journal_identity): \
             PostgresJournal::IDENTITY_SQL gives it one"
        ))
    })
}

/// The journal's id, from `journal_identity`: `None` without the table or a row.
async fn identity(client: &Client, schema: &str) -> Result<Option<JournalId>, JournalError> {
    let identity = table(schema, "journal_identity");
    let failed = |err| db_error(None, "cannot read journal_identity", &err);
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&identity])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(failed)?;
    if !exists {
        return Ok(None);
    }
    let rows = client
        .query(&format!("SELECT journal_id::text FROM {identity}"), &[])
        .await
        .map_err(failed)?;
    match rows.as_slice() {
        [] => Ok(None),
        [row] => {
            let id: String = row.try_get(0).map_err(failed)?;
            JournalId::new(id).map(Some).map_err(|err| {
                schema_error(format!("journal_identity in schema `{schema}` holds {err}"))
            })
        }
        more => Err(schema_error(format!(
            "journal_identity in schema `{schema}` with {} rows instead of one",
            more.len()
        ))),
    }
}

/// What the schema holds.
enum Found {
    /// No journal table: the tables are to be created.
    Empty,
    /// This crate's tables, current version.
    Current,
    /// This crate's tables, an older version: to be migrated.
    Older(i32),
}

/// Reads which journal tables exist and what `journal_schema` says; refuses anything but
/// none of them or this crate's current schema.
async fn inspect(client: &Client, schema: &str) -> Result<Found, JournalError> {
    let rows = client
        .query(
            "SELECT c.relname FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = ANY($2) AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
            &[&schema, &&TABLES[..]],
        )
        .await
        .map_err(|err| db_error(None, "cannot read the catalog", &err))?;
    let mut present = Vec::with_capacity(rows.len());
    for row in rows {
        let name: String = row
            .try_get(0)
            .map_err(|err| db_error(None, "cannot read the catalog", &err))?;
        present.push(name);
    }
    if present.is_empty() {
        return Ok(Found::Empty);
    }
    if !present.iter().any(|name| name == "journal_schema") {
        return Err(schema_error(format!(
            "tables {} in schema `{schema}` not made by {APPLICATION} (no journal_schema table)",
            present.join(", ")
        )));
    }
    let marks = client
        .query(
            &format!(
                "SELECT application::text, version::int4 FROM {}",
                table(schema, "journal_schema")
            ),
            &[],
        )
        .await
        .map_err(|err| match err.code() {
            // Columns of other names or types: somebody else's table.
            Some(_) => schema_error(format!(
                "a journal_schema table in schema `{schema}` of another shape ({})",
                ErrorChain(&err)
            )),
            None => db_error(None, "cannot read journal_schema", &err),
        })?;
    let mut marks_read = Vec::with_capacity(marks.len());
    for row in &marks {
        let application: Option<String> = row.try_get(0).unwrap_or(None);
        let version: Option<i32> = row.try_get(1).unwrap_or(None);
        marks_read.push((application, version));
    }
    match marks_read.as_slice() {
        [(Some(application), Some(version))] if application == APPLICATION => {
            if *version > SCHEMA_VERSION {
                return Err(schema_error(format!(
                    "schema version {version} in schema `{schema}`, written by a newer version \
                     of {APPLICATION} (this one reads schema versions 1 to {SCHEMA_VERSION})"
                )));
            }
            if !(1..=SCHEMA_VERSION).contains(version) {
                return Err(schema_error(format!(
                    "schema version {version} in schema `{schema}`"
                )));
            }
            if let Some(missing) = tables(*version)
                .iter()
                .find(|table| !present.iter().any(|name| name == *table))
            {
                return Err(schema_error(format!(
                    "schema version {version} in schema `{schema}` without its table `{missing}`"
                )));
            }
            check_columns(client, schema, *version).await?;
            Ok(if *version < SCHEMA_VERSION {
                Found::Older(*version)
            } else {
                Found::Current
            })
        }
        [(application, version)] => Err(schema_error(format!(
            "journal_schema in schema `{schema}` says application {application:?}, version {version:?}"
        ))),
        other => Err(schema_error(format!(
            "journal_schema in schema `{schema}` with {} rows instead of one",
            other.len()
        ))),
    }
}
