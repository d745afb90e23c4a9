-- Migrates the PostgreSQL journal of actix-delivery from schema version 1 to 2: the manifest
-- columns. Rows written before (and by nodes of the earlier version still connected) read as
-- bincode, no name, version 1, which is how that version wrote them. PostgresJournal runs
-- this itself on connect, under the same lock as the creation of the tables, unless
-- PostgresOptions::create_tables(false); to run it by hand instead:
--
--   psql -v ON_ERROR_STOP=1 -1 -c 'SET search_path TO journal' -f migrate_1_to_2.sql "$DATABASE"
ALTER TABLE event_journal
    ADD COLUMN ser_codec SMALLINT NOT NULL DEFAULT 1,
    ADD COLUMN ser_manifest TEXT NOT NULL DEFAULT '',
    ADD COLUMN ser_version BIGINT NOT NULL DEFAULT 1;
ALTER TABLE snapshot
    ADD COLUMN ser_codec SMALLINT NOT NULL DEFAULT 1,
    ADD COLUMN ser_manifest TEXT NOT NULL DEFAULT '',
    ADD COLUMN ser_version BIGINT NOT NULL DEFAULT 1;
UPDATE journal_schema SET version = 2 WHERE application = 'actix-delivery' AND version = 1;
