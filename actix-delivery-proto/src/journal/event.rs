//! What a journal stores: events and snapshots, and the limits on them (core data, apart from
//! the `Journal` trait and its implementations).

use crate::codec::Manifest;

/// The largest seq a stream can reach: `2^53 - 1`, as for deliveries (the largest integer
/// every JSON peer represents exactly, and a comfortable fit for SQL `BIGINT`).
pub const MAX_SEQ: u64 = crate::protocol::envelope::MAX_SEQ;

/// The largest event or snapshot payload the crate's journals store: 512 MiB (SQLite's and
/// PostgreSQL's own limits for one value are about 1 GB). What `Journal::max_payload`
/// returns unless a journal says otherwise.
pub const MAX_PAYLOAD_BYTES: usize = 512 << 20;

/// One stored event of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEvent {
    /// Its seq in the stream, from 1.
    pub seq: u64,
    /// The bytes appended.
    pub payload: Vec<u8>,
    /// How they were written (as given to `Journal::append_as`).
    pub manifest: Manifest,
}

/// A stream's snapshot: the state as of event `seq`, encoded by the layer above.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The seq of the last event the state includes.
    pub seq: u64,
    /// The encoded state.
    pub payload: Vec<u8>,
    /// How it was written.
    pub manifest: Manifest,
}

impl Snapshot {
    /// The state `payload` as of event `seq`, of [`Manifest::raw`] bytes.
    pub fn new(seq: u64, payload: Vec<u8>) -> Self {
        Self {
            seq,
            payload,
            manifest: Manifest::raw(),
        }
    }
}
