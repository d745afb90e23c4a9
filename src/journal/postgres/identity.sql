-- The identity of a PostgreSQL journal of actix-delivery: one row, a random id given once, which
-- read models record to refuse following another journal (Journal::journal_id). schema.sql
-- creates it with the other tables; PostgresJournal runs this itself on connect for a schema
-- made before ids existed, unless PostgresOptionsBuilder::create_tables(false). To run it by
-- hand:
--
--   psql -v ON_ERROR_STOP=1 -1 -c 'SET search_path TO journal' -f identity.sql "$DATABASE"
--
-- It changes no version and none of the journal's other tables: the previous release does not
-- know this table and leaves it alone.
CREATE TABLE IF NOT EXISTS journal_identity (
    journal_id TEXT NOT NULL
);
INSERT INTO journal_identity (journal_id)
SELECT gen_random_uuid()::text WHERE NOT EXISTS (SELECT 1 FROM journal_identity);
