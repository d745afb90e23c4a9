-- Migrates the PostgreSQL journal of actix-delivery from schema version 2 to 3: the tags
-- (PostgreSQL 13 or newer). Entries written before have no tags. PostgresJournal runs this
-- itself on connect, under the same lock as the creation of the tables, unless
-- PostgresOptionsBuilder::create_tables(false); to run it by hand instead:
--
--   psql -v ON_ERROR_STOP=1 -1 -c 'SET search_path TO journal' -f migrate_2_to_3.sql "$DATABASE"
--
-- Nodes of the earlier version still connected go on appending untagged entries. Creating a
-- table takes no lock on the others; the timeout only bounds the wait on journal_schema.
SET LOCAL lock_timeout = '10s';
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
UPDATE journal_schema SET version = 3 WHERE application = 'actix-delivery' AND version = 2;
