//! The JSON views of each part, of the dead letters and of the overview: what the endpoints
//! answer and the page renders. Each part's view is an object with its `name`, the values an
//! operator reads first, and the part's whole `stats`.

use std::time::SystemTime;

use futures_util::FutureExt;
use serde_json::{json, Map, Value};

use crate::admin::confirm::{hex, Action, ConfirmKey};
use crate::codec::Codec;
use crate::delivery::dead_letter_handle::{DeadLetterStats, DeadLetters};
use crate::delivery::dead_letters::{
    DeadLetterCounts, DeadLetterFilter, SourceKind, StoredDeadLetter, MAX_PAGE,
};
use crate::journal::{Journal, Offset, TagQuery};
use crate::projection::ProjectionHandle;
use crate::protocol::consumer::ConsumerStats;
use crate::protocol::producer::ProducerStats;
use crate::sharding::{CoordinatorStats, HostStats, LeaseError, LeaseRecord, LeaseView, ShardId};
use crate::tcp::NodeHandle;
use crate::work_pulling::PoolStats;

/// The most entries of a projection's tag counted as its lag. Counting reads the events
/// themselves (a journal has no count of a tag's entries after an offset), on every refresh
/// of the page (2 s) and for each projection: beyond this, the lag says "at least".
pub(crate) const LAG_CAP: usize = 100;
/// The longest body preview the list shows, in characters.
const PREVIEW_CHARS: usize = 200;
/// The most bytes of a body a preview shows in hex.
const PREVIEW_BYTES: usize = PREVIEW_CHARS / 2 + 1;
/// The largest body a preview decodes to JSON (MessagePack); a larger one is said to be too
/// large to preview, and shown from its first bytes in hex.
const PREVIEW_DECODE_BYTES: usize = 64 << 10;

/// The sections of the console, in the order the page shows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Section {
    Producers,
    Consumers,
    WorkPulling,
    Projections,
    EntityHosts,
    Coordinators,
    ShardMaps,
    Nodes,
    Carriers,
}

impl Section {
    pub(crate) const ALL: [Section; 9] = [
        Self::Producers,
        Self::Consumers,
        Self::WorkPulling,
        Self::Projections,
        Self::EntityHosts,
        Self::Coordinators,
        Self::ShardMaps,
        Self::Nodes,
        Self::Carriers,
    ];

    /// Its key in JSON.
    pub(crate) const fn key(self) -> &'static str {
        match self {
            Self::Producers => "producers",
            Self::Consumers => "consumers",
            Self::WorkPulling => "work_pulling",
            Self::Projections => "projections",
            Self::EntityHosts => "entity_hosts",
            Self::Coordinators => "coordinators",
            Self::ShardMaps => "shard_maps",
            Self::Nodes => "nodes",
            Self::Carriers => "carriers",
        }
    }
}

/// A part that did not answer: stopped, or its arbiter is gone.
fn gone(name: &str) -> Value {
    json!({ "name": name, "running": false, "error": "stopped: it does not answer" })
}

/// A producer's view; `stats` is `None` once it stopped.
pub(crate) fn producer(name: &str, producer_id: &str, stats: Option<ProducerStats>) -> Value {
    let Some(stats) = stats else {
        let mut view = gone(name);
        view["producer_id"] = json!(producer_id);
        return view;
    };
    json!({
        "name": name,
        "producer_id": producer_id,
        "running": true,
        // A durable producer's stream is open once it numbered a message.
        "durable": stats.next_message_id > 0,
        "unconfirmed": stats.unconfirmed,
        "oldest_unconfirmed_ms": stats.oldest_unconfirmed_ms,
        "in_doubt": stats.in_doubt,
        "in_flight": stats.in_flight,
        "queued": stats.queued,
        "sent": stats.sent,
        "retransmitted": stats.retransmitted,
        "confirmed": stats.confirmed,
        "given_up": stats.given_up,
        "stats": stats,
    })
}

/// A consumer's view; `by_cause` is its dead letters by cause, with a store.
pub(crate) fn consumer(name: &str, stats: Option<ConsumerStats>, by_cause: Option<Value>) -> Value {
    let Some(stats) = stats else {
        return gone(name);
    };
    json!({
        "name": name,
        "running": true,
        "tracked_producers": stats.tracked_producers,
        "waiting": stats.waiting,
        "deferred": stats.deferred,
        "delivered": stats.delivered,
        "duplicates": stats.duplicates,
        "handler_failures": stats.handler_failures,
        "handler_timeouts": stats.handler_timeouts,
        "refused": stats.refused,
        "dead_letters": by_cause.unwrap_or(Value::Null),
        "stats": stats,
    })
}

/// The dead letters kept under `source` by a consumer, by cause: `{"by_cause": {…},
/// "counted": n, "more": bool}` (counted over one page of at most [`MAX_PAGE`] entries, read
/// without their bodies).
pub(crate) async fn by_cause_of(dead_letters: &DeadLetters, source: &str) -> Value {
    let filter = DeadLetterFilter {
        kind: Some(SourceKind::Consumer),
        source: Some(source.to_owned()),
        limit: Some(MAX_PAGE),
        without_bodies: true,
        ..DeadLetterFilter::default()
    };
    match dead_letters.list(filter).await {
        Ok(page) => {
            let mut by_cause = Map::new();
            for entry in &page.entries {
                let count = by_cause
                    .entry(entry.letter.cause.as_str())
                    .or_insert(json!(0));
                *count = json!(count.as_u64().unwrap_or(0) + 1);
            }
            json!({
                "by_cause": by_cause,
                "counted": page.entries.len(),
                "more": page.next.is_some(),
            })
        }
        Err(error) => json!({ "error": error.to_string() }),
    }
}

/// A work-pulling producer's view: its pool and its producer.
pub(crate) fn work_pulling(
    name: &str,
    producer_id: &str,
    pool: Option<PoolStats>,
    producer_stats: Option<ProducerStats>,
) -> Value {
    let Some(pool) = pool else {
        return gone(name);
    };
    let workers: Vec<Value> = pool
        .per_worker
        .iter()
        .map(|worker| {
            json!({
                "name": &*worker.name,
                "in_flight": worker.in_flight,
                "confirmed": worker.confirmed,
                "failed": worker.failed,
                "failing": worker.failing,
                "resting": worker.resting,
            })
        })
        .collect();
    json!({
        "name": name,
        "running": true,
        "workers": pool.workers,
        "queued": pool.queued,
        "jobs": pool.jobs,
        "assigned": pool.assigned,
        "confirmed": pool.confirmed,
        "rerouted": pool.rerouted,
        "failed": pool.failed,
        "given_up": pool.given_up,
        "joined": pool.joined,
        "left": pool.left,
        "per_worker": workers,
        "producer": producer(name, producer_id, producer_stats),
    })
}

/// A projection's view: its state (`running`, `stopped`, `failed` with `last_error`), offset
/// and counters.
pub(crate) fn projection(name: &str, projection: &ProjectionHandle) -> Value {
    let stats = projection.stats();
    let (state, last_error) = match projection.stopped().now_or_never() {
        None => ("running", None),
        Some(Ok(())) => ("stopped", None),
        Some(Err(error)) => ("failed", Some(error.to_string())),
    };
    json!({
        "name": name,
        "running": state == "running",
        "state": state,
        "last_error": last_error,
        "offset": stats.offset.to_string(),
        "events": stats.events,
        "entries": stats.entries,
        "skipped": stats.skipped,
        "retries": stats.retries,
        "read_failures": stats.read_failures,
        "store_failures": stats.store_failures,
        "conflicts": stats.conflicts,
        "last_batch_lag_ms": stats.lag_ms,
    })
}

/// Adds to a projection's view how far behind `journal` it is: `lag_events` (the entries of
/// `query` after `offset`, up to [`LAG_CAP`], `lag_events_capped` when there are more) and
/// `lag_seconds` (since the oldest of them was committed), and `lag_events_shown` (the count
/// as the page shows it: `≥ 100` when capped). It reads at most `LAG_CAP + 1`
/// events: a lag of more than [`LAG_CAP`] is shown as "≥ 100".
pub(crate) async fn add_lag(
    view: &mut Value,
    journal: &dyn Journal,
    query: &TagQuery,
    offset: Offset,
) {
    match journal.events_by_tag(query, offset, LAG_CAP + 1).await {
        Ok(events) => {
            let oldest = events.first().map(|event| event.written_at);
            let seconds = oldest.map(|at| {
                SystemTime::now()
                    .duration_since(at)
                    .map_or(0.0, |since| since.as_secs_f64())
            });
            let capped = events.len() > LAG_CAP;
            view["lag_events"] = json!(events.len().min(LAG_CAP));
            view["lag_events_capped"] = json!(capped);
            view["lag_events_shown"] = json!(if capped {
                format!("≥ {LAG_CAP}")
            } else {
                events.len().to_string()
            });
            view["lag_seconds"] = json!(seconds.unwrap_or(0.0));
        }
        Err(error) => view["lag_error"] = json!(error.to_string()),
    }
}

/// An entity host's view.
pub(crate) fn entity_host(name: &str, entity_type: &str, shards: u32, stats: HostStats) -> Value {
    json!({
        "name": name,
        "running": true,
        "entity_type": entity_type,
        "shards": shards,
        "active": stats.active,
        "stopping": stats.stopping,
        "held": stats.held,
        "activations": stats.activations,
        "refused_full": stats.refused_full,
        "refused_not_hosted": stats.refused_not_hosted,
        "stats": stats,
    })
}

/// A coordinator's view; `stats` is `None` once it stopped.
pub(crate) fn coordinator(
    name: &str,
    member: &str,
    entity_type: &str,
    stats: Option<CoordinatorStats>,
) -> Value {
    let Some(stats) = stats else {
        return gone(name);
    };
    json!({
        "name": name,
        "running": true,
        "member": member,
        "entity_type": entity_type,
        "shards_owned": stats.shards_owned,
        "members": stats.members,
        "renew_failures": stats.renew_failures,
        "lost": stats.lost,
        "handoffs": stats.handoffs,
        "stats": stats,
    })
}

/// A shard map's view: each lease (`live` while time is left on it), the live members, and
/// (with the shard count) the shards without a live lease.
pub(crate) fn shard_map(
    name: &str,
    namespace: &str,
    shards: Option<u32>,
    records: Result<Vec<LeaseRecord>, LeaseError>,
    view: Result<LeaseView, LeaseError>,
) -> Value {
    let (records, view) = match (records, view) {
        (Ok(records), Ok(view)) => (records, view),
        (Err(error), _) | (_, Err(error)) => {
            return json!({ "name": name, "namespace": namespace, "error": error.to_string() });
        }
    };
    let leases: Vec<Value> = records
        .iter()
        .map(|record| {
            let live = view
                .leases
                .get(&record.shard)
                .is_some_and(|lease| lease.owner == record.owner && lease.token == record.token);
            json!({
                "shard": record.shard.0,
                "owner": record.owner,
                "token": record.token,
                "expires_in_ms": record.expires_in_ms,
                "live": live,
                "address": view.leases.get(&record.shard).and_then(|lease| lease.address.clone()),
            })
        })
        .collect();
    let members: Vec<Value> = view
        .members
        .iter()
        .map(|member| json!({ "id": member.id, "address": member.address }))
        .collect();
    let unowned: Option<Vec<u32>> = shards.map(|shards| {
        (0..shards)
            .filter(|shard| !view.leases.contains_key(&ShardId(*shard)))
            .collect()
    });
    json!({
        "name": name,
        "namespace": namespace,
        "shards": shards,
        "leases": leases,
        "members": members,
        "without_live_lease": unowned,
    })
}

/// A TCP node's view.
pub(crate) fn node(name: &str, node: &NodeHandle) -> Value {
    let stats = node.stats();
    let mut peers: Vec<Value> = node
        .peers()
        .into_iter()
        .map(|(addr, id)| {
            json!({
                "addr": addr.to_string(),
                "connected": id.is_some(),
                "node_id": id.map(|id| id.to_string()),
            })
        })
        .collect();
    peers.sort_by(|a, b| a["addr"].as_str().cmp(&b["addr"].as_str()));
    json!({
        "name": name,
        "running": true,
        "node_id": node.id().to_string(),
        "listening": node.local_addr().map(|addr| addr.to_string()),
        "peers": peers,
        "connections_open": stats.connections_open,
        "connections_opened": stats.connections_opened,
        "connections_accepted": stats.connections_accepted,
        "refusals": {
            "connect_failures": stats.connect_failures,
            "handshake_failures": stats.handshake_failures,
            "tls_failures": stats.tls_failures,
            "version_refusals": stats.version_refusals,
            "connections_refused": stats.connections_refused,
            "unauthorized_deliveries": stats.unauthorized_deliveries,
            "decode_failures": stats.decode_failures,
            "undecodable_bodies": stats.undecodable_bodies,
        },
        "stats": stats,
    })
}

/// A NATS carrier's view.
#[cfg(feature = "nats")]
pub(crate) fn carrier(name: &str, carrier: &crate::nats::NatsCarrierHandle) -> Value {
    let stats = carrier.stats();
    let connection = format!("{:?}", carrier.client().connection_state()).to_lowercase();
    json!({
        "name": name,
        "running": true,
        "connection": connection,
        "refusals": {
            "decode_failures": stats.decode_failures,
            "version_refusals": stats.version_refusals,
            "undecodable_bodies": stats.undecodable_bodies,
            "foreign_reply_subjects": stats.foreign_reply_subjects,
            "publish_failures": stats.publish_failures,
        },
        "stats": stats,
    })
}

/// How many entries a store holds, by cause.
pub(crate) fn counts(counts: &DeadLetterCounts) -> Value {
    let by_cause: Map<String, Value> = counts
        .by_cause
        .iter()
        .map(|(cause, count)| (cause.as_str().to_owned(), json!(count)))
        .collect();
    json!({ "entries": counts.entries, "bytes": counts.bytes, "by_cause": by_cause })
}

/// What the dead-letter handle did since it was made.
pub(crate) fn handle_stats(stats: &DeadLetterStats) -> Value {
    json!({
        "kept": stats.kept,
        "evicted": stats.evicted,
        "sampled_out": stats.sampled_out,
        "keep_failures": stats.keep_failures,
        "replayed": stats.replayed,
        "already_applied": stats.already_applied,
        "replay_failures": stats.replay_failures,
    })
}

/// An entry as the list shows it: everything but its body, with a preview of the body.
pub(crate) fn dead_letter_summary(entry: &StoredDeadLetter) -> Value {
    let mut view = dead_letter_fields(entry);
    view["preview"] = json!(preview(entry));
    view
}

/// An entry but its body.
fn dead_letter_fields(entry: &StoredDeadLetter) -> Value {
    let letter = &entry.letter;
    let manifest = &letter.manifest;
    let origin = letter.origin.as_ref().map(|origin| {
        json!({
            "producer_id": origin.producer_id.to_string(),
            "incarnation": origin.incarnation.to_string(),
            "seq": origin.seq,
        })
    });
    json!({
        "id": entry.id,
        "kind": letter.kind.as_str(),
        "source": letter.source,
        "cause": letter.cause.as_str(),
        "key": letter.key,
        "origin": origin,
        "manifest": {
            "codec": manifest.codec().map_or_else(|| format!("codec {}", manifest.codec_id()), |codec| codec.name().to_owned()),
            "type": manifest.name(),
            "version": manifest.version(),
        },
        "body_len": letter.body_len,
        "body_kept": letter.body.is_some(),
        "attempts": letter.attempts,
        "error": letter.error,
        "first_at_ms": entry.first_at_ms,
        "last_at_ms": entry.last_at_ms,
        "replay_failures": entry.replay_failures,
    })
}

/// An entry as the show endpoint answers it: its summary, its body (decoded to JSON when its
/// codec is MessagePack, else in hex) and the confirmation tokens of its replay and delete.
pub(crate) fn dead_letter(entry: &StoredDeadLetter, key: &ConfirmKey) -> Value {
    let mut view = dead_letter_fields(entry);
    let map = view.as_object_mut().expect("an object");
    match decoded(entry) {
        Body::Json(value) => {
            map.insert("body".into(), value);
        }
        Body::Hex(hex, why) => {
            map.insert("body_hex".into(), json!(hex));
            map.insert("body_not_json".into(), json!(why));
        }
        Body::None => {}
    }
    map.insert(
        "confirm".into(),
        json!({
            "replay": key.token(Action::Replay, entry),
            "delete": key.token(Action::Delete, entry),
        }),
    );
    view
}

enum Body {
    Json(Value),
    Hex(String, String),
    None,
}

fn decoded(entry: &StoredDeadLetter) -> Body {
    let Some(body) = &entry.letter.body else {
        return Body::None;
    };
    let hexed = |why: String| Body::Hex(hex(body), why);
    match entry.letter.manifest.codec() {
        Some(Codec::MessagePack) => {
            match Codec::MessagePack.decode::<Value>(body, body.len() as u64) {
                Ok(value) => Body::Json(value),
                Err(error) => hexed(format!("it does not decode as MessagePack: {error}")),
            }
        }
        Some(codec) => hexed(format!("its codec ({codec}) is not self-describing")),
        None => hexed(format!(
            "its codec ({}) is unknown to this version",
            entry.letter.manifest.codec_id()
        )),
    }
}

/// The body in a line, at most [`PREVIEW_CHARS`] characters: its JSON (MessagePack, at most
/// [`PREVIEW_DECODE_BYTES`]) or its first [`PREVIEW_BYTES`] in hex. Only that prefix is
/// read: a large body costs no more than a small one.
fn preview(entry: &StoredDeadLetter) -> Option<String> {
    let body = entry.letter.body.as_deref()?;
    let prefix = hex(&body[..body.len().min(PREVIEW_BYTES)]);
    let msgpack = entry.letter.manifest.codec() == Some(Codec::MessagePack);
    let text = if msgpack && body.len() > PREVIEW_DECODE_BYTES {
        format!(
            "{} bytes, too large to preview as JSON: {prefix}",
            body.len()
        )
    } else if msgpack {
        match Codec::MessagePack.decode::<Value>(body, body.len() as u64) {
            Ok(value) => value.to_string(),
            Err(_) => prefix,
        }
    } else {
        prefix
    };
    Some(match text.char_indices().nth(PREVIEW_CHARS) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text,
    })
}

/// What needs an operator's eye, from the views of every section and the dead letters'
/// counts: a line per stuck stream, stalled part, failed or lagging projection, shard
/// without a live lease, disconnected carrier, and the dead letters kept.
pub(crate) fn attention(
    sections: &[(Section, Vec<Value>)],
    dead_letters: Option<&Value>,
    stuck_after_ms: u64,
) -> Vec<Value> {
    let mut out = Vec::new();
    let mut note = |section: Section, name: &Value, what: String| {
        out.push(json!({ "section": section.key(), "name": name, "what": what }));
    };
    let number = |view: &Value, key: &str| view.get(key).and_then(Value::as_u64).unwrap_or(0);
    let seconds = |ms: u64| format!("{:.1} s", ms as f64 / 1000.0);
    for (section, views) in sections {
        for view in views {
            let name = &view["name"];
            if let Some(error) = view.get("error") {
                note(
                    *section,
                    name,
                    error.as_str().unwrap_or("stopped").to_owned(),
                );
                continue;
            }
            match section {
                Section::Producers => {
                    let oldest = view["oldest_unconfirmed_ms"].as_u64();
                    if let Some(oldest) = oldest.filter(|oldest| *oldest >= stuck_after_ms) {
                        note(
                            *section,
                            name,
                            format!(
                                "durable stream stuck: {} unconfirmed, the oldest for {}",
                                number(view, "unconfirmed"),
                                seconds(oldest)
                            ),
                        );
                    }
                    if number(view, "in_doubt") > 0 {
                        note(
                            *section,
                            name,
                            format!(
                                "{} writes in doubt, waiting for the stream's next opening",
                                number(view, "in_doubt")
                            ),
                        );
                    }
                    if view["durable"] != true {
                        stalled(&mut note, *section, view, "in flight", stuck_after_ms);
                    }
                }
                Section::Consumers => stalled(&mut note, *section, view, "waiting", stuck_after_ms),
                Section::WorkPulling => {
                    if number(view, "workers") == 0 && number(view, "jobs") > 0 {
                        note(
                            *section,
                            name,
                            format!("no worker: {} jobs wait", number(view, "jobs")),
                        );
                    }
                }
                Section::Projections => {
                    if let Some(error) = view["last_error"].as_str() {
                        note(*section, name, format!("failed: {error}"));
                    } else if view["state"] == "stopped" {
                        note(*section, name, "stopped".into());
                    }
                    let lag_ms = (view["lag_seconds"].as_f64().unwrap_or(0.0) * 1000.0) as u64;
                    if lag_ms >= stuck_after_ms && number(view, "lag_events") > 0 {
                        note(
                            *section,
                            name,
                            format!(
                                "behind by {}{} events, the oldest committed {} ago",
                                if view["lag_events_capped"] == true {
                                    "≥ "
                                } else {
                                    ""
                                },
                                number(view, "lag_events"),
                                seconds(lag_ms)
                            ),
                        );
                    }
                }
                Section::ShardMaps => {
                    let unowned = view["without_live_lease"].as_array().map_or(0, Vec::len);
                    if unowned > 0 {
                        note(
                            *section,
                            name,
                            format!("{unowned} shards without a live lease"),
                        );
                    }
                }
                Section::Carriers => {
                    if view["connection"] != "connected" {
                        note(*section, name, format!("connection {}", view["connection"]));
                    }
                }
                Section::EntityHosts | Section::Coordinators | Section::Nodes => {}
            }
        }
    }
    if let Some(counts) = dead_letters
        && number(counts, "entries") > 0
    {
        let by_cause = counts["by_cause"].as_object().map(|by_cause| {
            let causes = by_cause.iter().map(|(cause, n)| format!("{n} {cause}"));
            causes.collect::<Vec<_>>().join(", ")
        });
        out.push(json!({
            "section": "dead_letters",
            "name": "dead letters",
            "what": format!("{} kept ({})", number(counts, "entries"), by_cause.unwrap_or_default()),
        }));
    }
    out
}

/// Notes a part whose work has waited without progress for `stuck_after_ms` or longer.
fn stalled(
    note: &mut impl FnMut(Section, &Value, String),
    section: Section,
    view: &Value,
    what: &str,
    stuck_after_ms: u64,
) {
    let Some(stalled) = view["stalled_ms"].as_u64() else {
        return;
    };
    if stalled >= stuck_after_ms {
        let count = match section {
            Section::Consumers => {
                view["waiting"].as_u64().unwrap_or(0) + view["deferred"].as_u64().unwrap_or(0)
            }
            _ => view["in_flight"].as_u64().unwrap_or(0),
        };
        note(
            section,
            &view["name"],
            format!(
                "stalled: {count} {what}, none settled for {:.1} s",
                stalled as f64 / 1000.0
            ),
        );
    }
}
