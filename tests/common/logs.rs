//! The logger of a test binary: installed by the first [`keep`] (no test sets another: one
//! binary runs the tests of many areas, and a process has one logger). It keeps every record
//! of the crate at `info` and above, for the tests that check what a line says, and prints
//! what `RUST_LOG` asks for, as `env_logger` does, for whoever debugs a test.

use std::sync::{Mutex, Once, OnceLock, PoisonError};

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Keeper {
    /// `RUST_LOG`'s printer (errors only without it, as `env_logger`'s default).
    print: env_logger::Logger,
}

impl Keeper {
    fn keeps(metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Info && metadata.target().starts_with("actix_delivery")
    }
}

impl log::Log for Keeper {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        Self::keeps(metadata) || self.print.enabled(metadata)
    }

    fn log(&self, record: &log::Record<'_>) {
        if Self::keeps(record.metadata()) {
            let line = format!("{} {}", record.level(), record.args());
            LINES
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(line);
        }
        if self.print.matches(record) {
            self.print.log(record);
        }
    }

    fn flush(&self) {
        self.print.flush();
    }
}

/// Starts keeping the crate's log lines (from now on; idempotent), and printing `RUST_LOG`'s.
pub fn keep() {
    static KEEPER: OnceLock<Keeper> = OnceLock::new();
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let keeper = KEEPER.get_or_init(|| Keeper {
            print: env_logger::Builder::from_default_env()
                .is_test(true)
                .build(),
        });
        log::set_logger(keeper).expect("no other logger in this test binary");
        log::set_max_level(keeper.print.filter().max(log::LevelFilter::Info));
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
