//! `streams`: the journal's streams, a page at a time.

use actix_delivery::journal::{PersistenceId, StreamInfo};
use serde_json::json;

use crate::commands::{stream_id, MAX_LIMIT};
use crate::failure::{Failure, Status};
use crate::output::{self, note, opt, Output};
use crate::{Context, AFTER_HELP};

/// List the streams with their highest seq, a page at a time.
///
/// Each stream (persistence id) with its highest seq, deletion point (SQLite), stored range,
/// snapshot, newest write and type name, in persistence-id order. When the page is full, a note
/// on stderr says where the next one starts (--after).
#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct Args {
    /// Start after this persistence id (the last one of the previous page).
    #[arg(long, value_name = "ID", value_parser = stream_id)]
    after: Option<PersistenceId>,

    /// At most this many streams.
    #[arg(long, value_name = "N", allow_negative_numbers = true, default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=MAX_LIMIT))]
    limit: u64,
}

pub async fn run(args: Args, context: &Context, out: &mut Output) -> Result<Status, Failure> {
    let limit = args.limit as usize;
    let streams = context
        .inspector()
        .streams(args.after.as_ref(), limit)
        .await
        .map_err(|err| Failure::journal("streams", &err))?;
    if context.json {
        for stream in &streams {
            out.json(&to_json(stream))?;
        }
    } else {
        let rows: Vec<Vec<String>> = streams.iter().map(row).collect();
        out.table(
            &[
                "STREAM",
                "HIGHEST",
                "DELETED TO",
                "STORED",
                "SNAPSHOT",
                "LAST WRITTEN",
                "TYPE",
            ],
            &rows,
        )?;
    }
    if streams.len() == limit
        && let Some(last) = streams.last()
    {
        out.flush()?;
        note(&format!(
            "(more streams may follow: --after {})",
            last.persistence_id
        ));
    }
    Ok(Status::Clean)
}

fn row(stream: &StreamInfo) -> Vec<String> {
    let stored = match (stream.first_stored, stream.highest_seq) {
        (Some(first), highest) => format!("{first}..{highest}"),
        (None, _) => "none".to_owned(),
    };
    vec![
        stream.persistence_id.to_string(),
        stream.highest_seq.to_string(),
        opt(stream.deleted_to),
        stored,
        opt(stream.snapshot.map(|(seq, _)| seq)),
        stream
            .last_written_at
            .map_or_else(|| "-".to_owned(), output::time),
        stream.type_name.clone().unwrap_or_else(|| "-".to_owned()),
    ]
}

fn to_json(stream: &StreamInfo) -> serde_json::Value {
    json!({
        "stream": stream.persistence_id.as_str(),
        "highest_seq": stream.highest_seq,
        "deleted_to": stream.deleted_to,
        "first_stored": stream.first_stored,
        "snapshot_seq": stream.snapshot.map(|(seq, _)| seq),
        "snapshot_written_at": stream.snapshot.map(|(_, at)| output::time(at)),
        "last_written_at": stream.last_written_at.map(output::time),
        "last_written_at_ms": stream.last_written_at.map(output::millis),
        "type": stream.type_name,
    })
}
