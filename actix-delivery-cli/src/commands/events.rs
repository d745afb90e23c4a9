//! `events`: a stream's events, decoded where their codec allows.

use std::time::SystemTime;

use actix_delivery::codec::Manifest;
use actix_delivery::journal::{InspectedEvent, PersistenceId};
use serde_json::{json, Value};

use crate::commands::{stream_id, MAX_LIMIT};
use crate::decode::{show, Shown};
use crate::failure::{Failure, Status};
use crate::output::{self, cut, hex, note, Output};
use crate::{Context, AFTER_HELP};

/// Print a stream's events, decoded where their codec allows.
///
/// Each event: seq, when written, manifest (codec, type name, version), tags, and the payload:
/// as JSON where its codec is self-describing (MessagePack: a persistent actor's entry as its
/// list of events, any other value as it is), else in hex (bincode, raw bytes, legacy
/// entries).
#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct Args {
    /// The stream (persistence id).
    #[arg(value_name = "STREAM", value_parser = stream_id)]
    stream: PersistenceId,

    /// From this seq on.
    #[arg(long, value_name = "SEQ", allow_negative_numbers = true, default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..))]
    from: u64,

    /// At most this many events.
    #[arg(long, value_name = "N", allow_negative_numbers = true, default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=MAX_LIMIT))]
    limit: u64,
}

/// Payloads longer than this are cut in the table (never in JSON).
const TABLE_PAYLOAD: usize = 160;

pub async fn run(args: Args, context: &Context, out: &mut Output) -> Result<Status, Failure> {
    let inspector = context.inspector();
    let stream = &args.stream;
    let failed = |err| Failure::journal(&format!("events of stream `{stream}`"), &err);
    let Some(info) = inspector.stream(stream).await.map_err(failed)? else {
        return Err(Failure::usage(format!(
            "STREAM: no stream `{stream}` in {}",
            inspector.schema().location
        )));
    };
    let limit = args.limit as usize;
    let events = inspector
        .events(stream, args.from, limit)
        .await
        .map_err(failed)?;
    if context.json {
        for event in &events {
            out.json(&to_json(stream, event))?;
        }
    } else {
        let rows: Vec<Vec<String>> = events.iter().map(row).collect();
        out.table(&["SEQ", "WRITTEN AT", "MANIFEST", "TAGS", "PAYLOAD"], &rows)?;
    }
    out.flush()?;
    match events.last() {
        Some(last) if events.len() == limit && last.event.seq < info.highest_seq => {
            note(&format!(
                "(more events follow: --from {})",
                last.event.seq + 1
            ));
        }
        None if info.first_stored.is_none() => note(&format!(
            "(stream `{stream}` holds no events: highest seq {}, all deleted)",
            info.highest_seq
        )),
        None => note(&format!(
            "(no events from seq {}: the stream's highest seq is {})",
            args.from, info.highest_seq
        )),
        Some(_) => {}
    }
    Ok(Status::Clean)
}

/// A manifest for people: `msgpack app::Event v2`, `raw`, `codec 7 app::Event v2`.
pub(super) fn manifest_text(manifest: &Manifest) -> String {
    let codec = match manifest.codec() {
        Some(codec) => codec.name().to_owned(),
        None if manifest.codec_id() == 0 => return "raw".to_owned(),
        None => format!("codec {}", manifest.codec_id()),
    };
    let name = if manifest.name().is_empty() {
        "(unnamed)"
    } else {
        manifest.name()
    };
    format!("{codec} {name} v{}", manifest.version())
}

pub(super) fn manifest_json(manifest: &Manifest) -> Value {
    json!({
        "codec": manifest.codec().map_or(if manifest.codec_id() == 0 { "raw" } else { "unknown" }, |codec| codec.name()),
        "codec_id": manifest.codec_id(),
        "type": manifest.name(),
        "version": manifest.version(),
    })
}

fn row(inspected: &InspectedEvent) -> Vec<String> {
    let event = &inspected.event;
    let payload = match show(&event.payload, &event.manifest) {
        Shown::Events(events) => Value::Array(events).to_string(),
        Shown::Value(value) => value.to_string(),
        Shown::Bytes => format!("{} bytes: {}", event.payload.len(), hex(&event.payload)),
    };
    let tags: Vec<&str> = inspected.tags.iter().map(|tag| tag.as_str()).collect();
    vec![
        event.seq.to_string(),
        output::time(inspected.written_at),
        manifest_text(&event.manifest),
        if tags.is_empty() {
            "-".to_owned()
        } else {
            tags.join(",")
        },
        cut(&payload, TABLE_PAYLOAD),
    ]
}

fn to_json(stream: &PersistenceId, inspected: &InspectedEvent) -> Value {
    let event = &inspected.event;
    let written_at: SystemTime = inspected.written_at;
    let mut line = json!({
        "stream": stream.as_str(),
        "seq": event.seq,
        "written_at": output::time(written_at),
        "written_at_ms": output::millis(written_at),
        "manifest": manifest_json(&event.manifest),
        "tags": inspected.tags.iter().map(|tag| tag.as_str()).collect::<Vec<_>>(),
        "bytes": event.payload.len(),
    });
    let (key, value) = match show(&event.payload, &event.manifest) {
        Shown::Events(events) => ("events", Value::Array(events)),
        Shown::Value(value) => ("value", value),
        Shown::Bytes => ("hex", Value::String(hex(&event.payload))),
    };
    line[key] = value;
    line
}
