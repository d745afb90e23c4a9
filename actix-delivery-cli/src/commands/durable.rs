//! `durable`: durable producers' streams and the messages they hold unconfirmed.

use std::time::SystemTime;

use actix_delivery::durable::{
    is_durable_stream, read_durable_stream, DurableStreamInfo, StoredWhen, UnconfirmedMessage,
};
use actix_delivery::journal::PersistenceId;
use serde_json::{json, Value};

use crate::commands::{stream_id, MAX_LIMIT};
use crate::failure::{chain, Failure, Status};
use crate::output::{self, duration, note, Output};
use crate::{Context, AFTER_HELP};

/// Show durable producers' unconfirmed messages.
///
/// Each durable producer's stream: owner, message type, openings, next seq, and each message
/// stored and not yet confirmed (seq, when stored and how long ago, size): what the producer
/// sends again when it next starts. Read as the producer reads its stream, without opening
/// it.
#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct Args {
    /// Only this stream (else every durable producer's stream, a page at a time).
    #[arg(value_name = "STREAM", value_parser = stream_id)]
    stream: Option<PersistenceId>,

    /// Start after this persistence id (the last one of the previous page).
    #[arg(long, value_name = "ID", value_parser = stream_id, conflicts_with = "stream")]
    after: Option<PersistenceId>,

    /// At most this many durable streams.
    #[arg(long, value_name = "N", allow_negative_numbers = true, default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=MAX_LIMIT))]
    limit: u64,
}

/// Streams looked at per page while looking for durable ones.
const SCAN_PAGE: usize = 500;

pub async fn run(args: Args, context: &Context, out: &mut Output) -> Result<Status, Failure> {
    let inspector = context.inspector();
    let now = SystemTime::now();
    let mut status = Status::Clean;
    if let Some(stream) = &args.stream {
        let info = inspector
            .stream(stream)
            .await
            .map_err(|err| Failure::journal(&format!("stream `{stream}`"), &err))?;
        match info {
            None => {
                return Err(Failure::usage(format!(
                    "STREAM: no stream `{stream}` in {}",
                    inspector.schema().location
                )));
            }
            Some(info) if !is_durable_stream(&info) => {
                return Err(Failure::usage(format!(
                    "STREAM: stream `{stream}` is not a durable producer's (its entries are of \
                     type {})",
                    info.type_name.as_deref().unwrap_or("(unnamed)")
                )));
            }
            Some(_) => {}
        }
        return match read_durable_stream(inspector, stream).await {
            Ok(Some(durable)) => {
                print(out, context.json, &durable, now)?;
                Ok(Status::Clean)
            }
            Ok(None) => {
                print_empty(out, context.json, stream)?;
                Ok(Status::Clean)
            }
            Err(err) => Err(Failure::journal(
                &format!("durable stream `{stream}`"),
                &err,
            )),
        };
    }

    let limit = args.limit as usize;
    let mut after = args.after.clone();
    let mut shown = 0;
    let mut last_shown = None;
    'pages: loop {
        let page = inspector
            .streams(after.as_ref(), SCAN_PAGE)
            .await
            .map_err(|err| Failure::journal("streams", &err))?;
        for stream in &page {
            if !is_durable_stream(stream) {
                continue;
            }
            if shown == limit {
                break 'pages;
            }
            let id = &stream.persistence_id;
            match read_durable_stream(inspector, id).await {
                Ok(Some(durable)) => print(out, context.json, &durable, now)?,
                Ok(None) => print_empty(out, context.json, id)?,
                Err(err) => {
                    status = Status::ProblemsFound;
                    let reason = chain(&err);
                    if context.json {
                        out.json(&json!({ "stream": id.as_str(), "error": reason }))?;
                    } else {
                        out.line(&format!("{id}: cannot be read: {reason}"))?;
                    }
                }
            }
            shown += 1;
            last_shown = Some(id.clone());
        }
        match page.last() {
            Some(last) if page.len() == SCAN_PAGE => after = Some(last.persistence_id.clone()),
            _ => break,
        }
    }
    out.flush()?;
    if shown == limit
        && let Some(last) = last_shown
    {
        note(&format!(
            "(more durable streams may follow: --after {last})"
        ));
    }
    if shown == 0 && !context.json {
        note("(no durable producer's stream)");
    }
    Ok(status)
}

fn print(
    out: &mut Output,
    json: bool,
    durable: &DurableStreamInfo,
    now: SystemTime,
) -> std::io::Result<()> {
    if json {
        return out.json(&to_json(durable, now));
    }
    let oldest = durable
        .unconfirmed
        .iter()
        .map(|message| message.stored.time())
        .min()
        .map_or_else(|| "-".to_owned(), |at| duration(output::age(at, now)));
    out.line(&format!(
        "{}: producer `{}`, messages of {}, opened {} times, next seq {}, {} unconfirmed, \
         oldest {}",
        durable.persistence_id,
        durable.producer_id,
        durable
            .message_type
            .as_deref()
            .unwrap_or("an unrecorded type"),
        durable.openings,
        durable.next_seq,
        durable.unconfirmed.len(),
        oldest,
    ))?;
    for message in &durable.unconfirmed {
        out.line(&format!("  {}", message_line(message, now)))?;
    }
    for header in &durable.partly_stored {
        out.line(&format!(
            "  seqs {} to {}: a chunked message only partly stored (never sent; the next \
             opening settles it)",
            header.first_seq,
            header.last_seq()
        ))?;
    }
    Ok(())
}

fn print_empty(out: &mut Output, json: bool, stream: &PersistenceId) -> std::io::Result<()> {
    if json {
        out.json(&json!({ "stream": stream.as_str(), "created": false }))
    } else {
        out.line(&format!("{stream}: not created yet"))
    }
}

fn message_line(message: &UnconfirmedMessage, now: SystemTime) -> String {
    let seq = if message.first_seq == message.seq {
        format!("seq {}", message.seq)
    } else {
        format!(
            "seq {} (chunks {} to {})",
            message.seq, message.first_seq, message.seq
        )
    };
    let when = match message.stored {
        StoredWhen::At(at) => format!(
            "stored {} ({} ago)",
            output::time(at),
            duration(output::age(at, now))
        ),
        StoredWhen::NotAfter(at) => format!(
            "stored by {} (at least {} ago; compacted into the snapshot)",
            output::time(at),
            duration(output::age(at, now))
        ),
        _ => "stored at an unknown time".to_owned(),
    };
    format!("{seq}: {when}, {} bytes", message.bytes)
}

fn to_json(durable: &DurableStreamInfo, now: SystemTime) -> Value {
    let unconfirmed: Vec<Value> = durable
        .unconfirmed
        .iter()
        .map(|message| {
            let at = message.stored.time();
            json!({
                "seq": message.seq,
                "first_seq": message.first_seq,
                "bytes": message.bytes,
                "stored_at": output::time(at),
                "stored_at_ms": output::millis(at),
                "stored_exactly": matches!(message.stored, StoredWhen::At(_)),
                "age_ms": u64::try_from(output::age(at, now).as_millis()).unwrap_or(u64::MAX),
            })
        })
        .collect();
    let partly: Vec<Value> = durable
        .partly_stored
        .iter()
        .map(|header| {
            json!({
                "first_seq": header.first_seq,
                "chunks": header.chunks,
                "message_len": header.message_len,
            })
        })
        .collect();
    json!({
        "stream": durable.persistence_id.as_str(),
        "created": true,
        "producer_id": durable.producer_id,
        "incarnation_id": durable.incarnation.to_string(),
        "message_type": durable.message_type,
        "openings": durable.openings,
        "next_seq": durable.next_seq,
        "unconfirmed": unconfirmed,
        "partly_stored": partly,
    })
}
