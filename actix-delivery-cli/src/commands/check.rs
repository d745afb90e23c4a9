//! `check`: the journal's invariants.

use actix_delivery::journal::{CheckReport, SchemaInfo};
use serde_json::json;

use crate::failure::{Failure, Status};
use crate::output::Output;
use crate::{Context, AFTER_HELP};

/// Check the journal's invariants; exit 1 naming each broken one.
///
/// In one consistent read: its schema version (against this code's), its identity, each
/// stream's seqs from its deletion point to its highest seq (gaps, duplicates, events beyond
/// the highest seq), snapshots within their streams, tag rows pointing at events that are
/// neither stored nor deleted, tag offsets rising with seqs, tag slices.
#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct Args {
    /// List at most this many problems.
    #[arg(long, value_name = "N", allow_negative_numbers = true, default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    max_problems: u64,
}

pub async fn run(args: Args, context: &Context, out: &mut Output) -> Result<Status, Failure> {
    let report = context
        .inspector()
        .check(args.max_problems as usize)
        .await
        .map_err(|err| Failure::journal("check", &err))?;
    if context.json {
        out.json(&to_json(&report))?;
    } else {
        print(out, &report)?;
    }
    Ok(if report.passed() {
        Status::Clean
    } else {
        Status::ProblemsFound
    })
}

fn identity(schema: &SchemaInfo) -> String {
    schema
        .journal_id
        .as_ref()
        .map_or_else(|| "none".to_owned(), |id| id.as_str().to_owned())
}

fn print(out: &mut Output, report: &CheckReport) -> std::io::Result<()> {
    let schema = &report.schema;
    out.line(&format!(
        "journal: {} (schema version {}, this code's {}), journal id {}",
        schema.location,
        schema.version,
        schema.current,
        identity(schema)
    ))?;
    out.line(&format!(
        "{} streams, {} tag rows",
        report.streams, report.tag_rows
    ))?;
    for note in &report.notes {
        out.line(&format!("note: {note}"))?;
    }
    for problem in &report.problems {
        out.line(&format!("problem: {problem}"))?;
    }
    match (report.problems.len(), report.truncated) {
        (0, _) => out.line("ok: no problem found"),
        (count, false) => out.line(&format!("{count} problem(s) found")),
        (count, true) => out.line(&format!(
            "{count} problems listed, and more found (raise --max-problems)"
        )),
    }
}

fn to_json(report: &CheckReport) -> serde_json::Value {
    let schema = &report.schema;
    let problems: Vec<serde_json::Value> = report
        .problems
        .iter()
        .map(|problem| {
            json!({
                "kind": problem.kind.name(),
                "stream": problem.persistence_id,
                "detail": problem.detail,
            })
        })
        .collect();
    json!({
        "location": schema.location,
        "schema_version": schema.version,
        "current_version": schema.current,
        "journal_id": schema.journal_id.as_ref().map(|id| id.as_str()),
        "streams": report.streams,
        "tag_rows": report.tag_rows,
        "notes": report.notes,
        "problems": problems,
        "truncated": report.truncated,
        "passed": report.passed(),
    })
}
