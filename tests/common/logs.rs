//! The crate's log lines, kept for the tests that check what a line says: the logger is
//! installed by the first [`keep`] of a test binary (the binaries that use it set no other
//! logger) and keeps every record of the crate at `info` and above from then on.

use std::sync::{Mutex, Once, PoisonError};

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Keeper;

impl log::Log for Keeper {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.target().starts_with("actix_delivery")
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            let line = format!("{} {}", record.level(), record.args());
            LINES
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(line);
        }
    }

    fn flush(&self) {}
}

/// Starts keeping the crate's log lines (from now on; idempotent).
pub fn keep() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        log::set_logger(&Keeper).expect("no other logger in this test binary");
        log::set_max_level(log::LevelFilter::Info);
    });
}

/// The lines kept so far that contain every one of `texts`.
pub fn lines_containing(texts: &[&str]) -> Vec<String> {
    let lines = LINES.lock().unwrap_or_else(PoisonError::into_inner);
    lines
        .iter()
        .filter(|line| texts.iter().all(|text| line.contains(text)))
        .cloned()
        .collect()
}
