//! # Upgrading without downtime
//!
//! Nodes of two consecutive releases run side by side in one deployment: they deliver to each
//! other over TCP and NATS, in both directions, and share a PostgreSQL journal and lease store.
//! So a deployment upgrades one node at a time, under load, and never stops as a whole. This
//! chapter is the policy; the compatibility suite (`tests/compat/` in the repository, run by
//! `.ci/compat`) proves it for every release against the one before, built from the
//! repository's history.
//!
//! ## Which releases roll to which
//!
//! A release rolls from the release before it, and back to it until its write formats are
//! raised (below). To go further, roll through each release in between. The formats of each
//! release are listed under "Wire and storage formats" in `CHANGELOG.md`; a change of one is
//! always marked there.
//!
//! ## Write old, read new, switch by choice
//!
//! Everything a node sends or stores is written in a format the previous release reads, until
//! the operator raises it once every node runs the new release; a node reads both the old
//! format and the new one.
//!
//! - **The wire.** A node speaks a range of protocol versions (this release: 3 and 4, the previous
//!   release: 4) and offers at most its `wire_version` when it connects (TCP:
//!   [`NodeOptionsBuilder::wire_version`](crate::tcp::NodeOptionsBuilder::wire_version); NATS:
//!   `nats::NatsOptionsBuilder::wire_version`). A TCP connection settles on the highest version
//!   both ends speak, in its handshake: the accepting node answers the offer with the highest
//!   version it speaks up to it, and a node of this release reads a newer release's longer opening
//!   frame, so the next release can roll onto this one. A NATS carrier, which has no handshake,
//!   reads every version of its range and writes its `wire_version`. What a version lacks is not
//!   sent to a peer of that version: version 3 has no chunks, so a [large
//!   message](super::large_messages)'s chunks are not sent on a link at version 3 (each held
//!   transmission counted in `chunks_held_for_version`) and keep their producer's window occupied:
//!   a producer that chunks stalls until its link speaks 4, or its `max_attempts` gives the message
//!   up. Send no chunked messages to nodes of a release that speaks only 3. A NATS ACK is written
//!   at the version of the deliveries it answers. The default, 4, is what the previous release
//!   speaks: from it, nothing is set and nothing raised. From a release that speaks only 3, set
//!   `wire_version` to 3 on every node of this release until the last node of that release is gone.
//! - **Journals.** The schema version (SQLite's `PRAGMA user_version`, PostgreSQL's
//!   `journal_schema.version`; both 3 in this release and the one before) counts only changes
//!   an older release cannot read, and a journal of a newer schema is refused by older code. So
//!   a release adds what the previous one ignores (a table, a column it never selects, the
//!   journal's identity row) without raising it, and a change the previous release could not
//!   read is never made by a node on its own: it is an explicit migration step, an API call and
//!   a documented command, run after the roll.
//! - **What a journal holds** (entries with their manifests, snapshots, a durable producer's
//!   log, a persistent consumer's marks, leases) keeps its format between consecutive releases,
//!   or is written in the old one until the operator raises it, as the wire is.
//! - **Your message types** evolve by the rules of [Changing your types](super::schema_evolution):
//!   raise a type's version only once every node that reads it has the upcaster.
//!
//! ## Rolling a deployment
//!
//! 1. Upgrade one node at a time: stop it gracefully (SIGTERM, which a
//!    [`Shutdown`](crate::shutdown::Shutdown) turns into stopping the parts in order: a
//!    [shard coordinator](crate::sharding::ShardCoordinatorHandle) hands its shards to the
//!    other nodes; a durable producer keeps what is unconfirmed in its journal, and its next
//!    life sends it), start it on the new release, wait until it is ready.
//! 2. When every node runs the new release, raise the write formats that the release's
//!    changelog names (`wire_version`, when the previous release spoke an older version), one
//!    node at a time again: a node of the new release reads both, so a half-raised deployment
//!    delivers.
//! 3. Until then, a node can be rolled back to the previous release (the compatibility suite
//!    does so). Once raised, the previous release no longer reads what is written: roll back
//!    only after lowering the formats again on every node.
//!
//! A node of the previous release never needs a setting for this: it offers its one version,
//! and the new node answers in it.
//!
//! ## What the compatibility suite proves
//!
//! For the previous release's commit (recorded in `tests/compat/previous-release`):
//!
//! - a consumer of either release receives every message of producers of the other, exactly
//!   once, over TCP with a shared secret, over mutual TLS and over NATS, from plain and durable
//!   producers; a durable producer of one release continues the SQLite journal stream the other
//!   wrote;
//! - three nodes of the previous release (sharded entities on a shared PostgreSQL journal and
//!   lease store, deliveries over NATS, a durable producer over TCP on each) are replaced one at
//!   a time by SIGTERM with nodes of this release under a steady load, then one node is rolled
//!   back: no deposit lost, none applied twice (from the journal), every number a node stored
//!   delivered; the confirmation latency during the roll is reported (`benches/README.md`
//!   quotes it: 0.9 s at p99, 1.2 s at most, while a node's shards move).
