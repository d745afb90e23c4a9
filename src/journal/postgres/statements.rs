//! The SQL of the journal's statements for one schema: the writer's (append, delete,
//! snapshot, highest seqs of a group's streams) and the readers' (replay, highest seq,
//! snapshot, by tag, offset ceiling), each prepared once per connection.

use crate::journal::postgres::schema;

/// The SQL of the journal's statements, for one schema.
pub(super) struct Sql {
    pub(super) append: String,
    pub(super) delete_to: String,
    pub(super) save_snapshot: String,
    pub(super) highest_of: String,
    pub(super) replay: String,
    pub(super) highest: String,
    pub(super) load_snapshot: String,
    pub(super) by_tag: String,
    pub(super) ceiling: String,
    /// What the writer's and listener's notifications carry: the schema's name.
    pub(super) schema: String,
}

impl Sql {
    pub(super) fn new(schema_name: &str) -> Self {
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
