//! The command-line inspector, run as a process (`CARGO_BIN_EXE_actix-delivery`) on journals
//! the library writes: SQLite files made by the tests (`sqlite`), the repository's journals of
//! earlier schema versions (`sqlite::older_*`), a PostgreSQL schema of its own when
//! `ACTIX_DELIVERY_POSTGRES` names a server (`postgres`; skipped with a note otherwise), and
//! its usage: every command's `--help`, and bad input with its exit code (`usage`). The kept
//! dead letters of a journal's database, listed, shown and deleted: `dead_letters` (SQLite;
//! its checks also run on PostgreSQL in `postgres`). Dead letters replayed through an admin
//! console served in the test process: `replay`.

mod dead_letters;
mod postgres;
mod replay;
mod sqlite;
mod support;
mod usage;
