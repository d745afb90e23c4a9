-- The PostgreSQL journal of actix-delivery, schema version 3 (PostgreSQL 13 or newer: xid8).
--
-- PostgresJournal creates these tables itself on first connect, in the schema named by
-- PostgresOptionsBuilder::schema (default `public`), unless
-- PostgresOptionsBuilder::create_tables(false).
-- To create them by hand instead (the journal's role then needs only SELECT, INSERT, UPDATE
-- and DELETE on them):
--
--   psql -v ON_ERROR_STOP=1 -c 'CREATE SCHEMA IF NOT EXISTS journal' \
--        -c 'SET search_path TO journal' -f schema.sql "$DATABASE"
--
-- (or without the first two -c for `public`). Names are unqualified: the tables go into the
-- first schema of the search_path.

-- The events: a gapless seq_nr from 1 per stream. The primary key is the last line of the
-- single-writer fence: no seq is ever stored twice. ser_codec, ser_manifest and ser_version
-- are the payload's manifest: how it was written (codec id, type name, schema version).
CREATE TABLE event_journal (
    persistence_id TEXT NOT NULL,
    seq_nr BIGINT NOT NULL,
    payload BYTEA NOT NULL,
    written_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    ser_codec SMALLINT NOT NULL,
    ser_manifest TEXT NOT NULL,
    ser_version BIGINT NOT NULL,
    PRIMARY KEY (persistence_id, seq_nr)
);

-- The current snapshot of each stream: the state as of event seq_nr.
CREATE TABLE snapshot (
    persistence_id TEXT PRIMARY KEY,
    seq_nr BIGINT NOT NULL,
    payload BYTEA NOT NULL,
    written_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    ser_codec SMALLINT NOT NULL,
    ser_manifest TEXT NOT NULL,
    ser_version BIGINT NOT NULL
);

-- Each stream's highest seq, kept when its events are deleted (so no seq is handed out
-- twice). An append moves it from first_seq - 1 to its last seq in the same statement that
-- stores the events, or stores nothing: this conditional update is the fence.
CREATE TABLE stream_metadata (
    persistence_id TEXT PRIMARY KEY,
    highest_seq BIGINT NOT NULL
);

-- Each entry filed under each of its tags, in the transaction that appends it. The entry's
-- offset in the tag is (txid, ordering): the id of the transaction that wrote it, then a
-- number per row. Readers read only rows whose txid is below pg_snapshot_xmin of their
-- snapshot: every transaction below that horizon has ended, and any still to commit has a
-- higher id, so an offset never skips an entry, also when several processes commit out of
-- order. slice is the stream's slice (0..1023). Deleting events keeps their tag rows.
CREATE TABLE event_tag (
    tag TEXT NOT NULL,
    txid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    ordering BIGINT GENERATED ALWAYS AS IDENTITY,
    persistence_id TEXT NOT NULL,
    seq_nr BIGINT NOT NULL,
    slice SMALLINT NOT NULL,
    written_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (tag, txid, ordering)
);

-- What wrote these tables, and in which version: checked on every connect.
CREATE TABLE journal_schema (
    application TEXT NOT NULL,
    version INTEGER NOT NULL
);
INSERT INTO journal_schema (application, version) VALUES ('actix-delivery', 3);

-- Which journal this is: one row, a random id given once (see identity.sql).
CREATE TABLE journal_identity (
    journal_id TEXT NOT NULL
);
INSERT INTO journal_identity (journal_id) VALUES (gen_random_uuid()::text);
