-- Migrates the PostgreSQL journal of actix-delivery from schema version 1 to 2: the manifest
-- columns. Rows written before (and by nodes of the earlier version still connected) read as
-- bincode, no name, version 1, which is how that version wrote them. PostgresJournal runs
-- this itself on connect, under the same lock as the creation of the tables, unless
-- PostgresOptionsBuilder::create_tables(false); to run it by hand instead:
--
--   psql -v ON_ERROR_STOP=1 -1 -c 'SET search_path TO journal' -f migrate_1_to_2.sql "$DATABASE"
-- ALTER TABLE waits for an exclusive lock of each table, and every journal statement would
-- queue behind it: give up after 10 s (a long reader in the way) rather than stall them all;
-- the connect then fails and can be retried. Adding a column with a constant default changes
-- no row (PostgreSQL 11 or newer).
SET LOCAL lock_timeout = '10s';
ALTER TABLE event_journal
    ADD COLUMN ser_codec SMALLINT NOT NULL DEFAULT 1,
    ADD COLUMN ser_manifest TEXT NOT NULL DEFAULT '',
    ADD COLUMN ser_version BIGINT NOT NULL DEFAULT 1;
ALTER TABLE snapshot
    ADD COLUMN ser_codec SMALLINT NOT NULL DEFAULT 1,
    ADD COLUMN ser_manifest TEXT NOT NULL DEFAULT '',
    ADD COLUMN ser_version BIGINT NOT NULL DEFAULT 1;
UPDATE journal_schema SET version = 2 WHERE application = 'actix-delivery' AND version = 1;
