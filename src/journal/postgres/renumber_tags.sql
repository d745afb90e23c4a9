-- Re-numbers the tag rows of the PostgreSQL journal of actix-delivery (schema version 3) after
-- the tables were restored by a logical dump (pg_dump / pg_restore, or a copy of the rows)
-- into a cluster whose transaction ids are lower than those that wrote them. PostgresJournal
-- refuses to open such a schema: an entry's offset in its tag is (txid, ordering), so entries
-- appended now would sort before the restored ones, and every tag reader (projection) that
-- has read past them would never see the new ones.
--
-- Run it in one transaction, with the journal's schema first in the search_path and no
-- journal connected to it:
--
--   psql -v ON_ERROR_STOP=1 -1 -c 'SET search_path TO journal' -f renumber_tags.sql "$DATABASE"
--
-- Every tag row gets this transaction's id; ordering (never reused, handed out by its
-- sequence in the order the rows were inserted) is kept and now decides the order alone.
-- Afterwards:
--
-- - each stream's entries are still in seq order in each tag (an append to a stream takes its
--   ordering only after the previous append to that stream committed: the fence waits for it);
-- - entries of different streams written by concurrent transactions may come in another
--   order than before;
-- - every entry appended afterwards sorts after all of them (its transaction id is higher).
--
-- Offsets stored before mean nothing afterwards: reset every projection of the schema (its
-- read model and its offset) so that it reads the tags again from the start. One that is not
-- reset either reads every entry again (its offset's transaction id is below this
-- transaction's) or is above Journal::offset_ceiling (refused), until entries appended
-- afterwards pass it, after which it would skip entries: it never resumes correctly.
SET LOCAL lock_timeout = '10s';
LOCK TABLE event_tag IN EXCLUSIVE MODE;
UPDATE event_tag SET txid = pg_current_xact_id();
