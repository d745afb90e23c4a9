//! `Journal::journal_id`: each journal's storage has an id of its own, kept across reopens and
//! copies, different from every other journal's; a journal made before ids existed (the
//! previous release: schema 3 without the table `journal_identity`) gets one when this version
//! opens it, adding only that table. The PostgreSQL cases (feature `postgres`) need a server:
//! `ACTIX_DELIVERY_POSTGRES`, see `tests/postgres_support`; each uses a schema of its own.

use actix_delivery::journal::{Journal, MemoryJournal, PersistenceId, SqliteJournal};

#[test]
fn each_memory_journal_has_an_id_of_its_own_shared_by_its_clones() {
    let journal = MemoryJournal::new();
    let id = journal.journal_id().unwrap();
    assert_eq!(journal.clone().journal_id(), Some(id.clone()));
    assert_ne!(MemoryJournal::new().journal_id(), Some(id));
}

/// `(tables, user_version)` of the SQLite file at `path`.
fn sqlite_tables(path: &std::path::Path) -> (Vec<String>, i32) {
    let connection = rusqlite::Connection::open(path).unwrap();
    let mut statement = connection
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap();
    let tables = statement
        .query_map([], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let version = connection
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    (tables, version)
}

/// The id is the file's: the same after a reopen and in a backup, another in another file.
#[tokio::test]
async fn a_sqlite_journal_keeps_its_id_in_its_file_and_its_backups() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let journal = SqliteJournal::open(&path).await.unwrap();
    let id = journal.journal_id().unwrap();
    journal.backup(dir.path().join("backup.db")).await.unwrap();
    journal.close().await;
    let reopened = SqliteJournal::open(&path).await.unwrap();
    assert_eq!(reopened.journal_id(), Some(id.clone()));
    reopened.close().await;
    let backup = SqliteJournal::open(dir.path().join("backup.db"))
        .await
        .unwrap();
    assert_eq!(backup.journal_id(), Some(id.clone()));
    let other = SqliteJournal::open(dir.path().join("other.db"))
        .await
        .unwrap();
    assert_ne!(other.journal_id(), Some(id));
}

/// A file as the previous release wrote it (schema 3, no `journal_identity`) gets an id on
/// open, keeps its version and its events, and gains only that table: what the previous
/// release checks (its version and tables) is as it was.
#[tokio::test]
async fn a_sqlite_file_of_the_previous_release_gets_an_id_and_nothing_else_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let stream = PersistenceId::new("s").unwrap();
    let journal = SqliteJournal::open(&path).await.unwrap();
    journal
        .append(&stream, 1, vec![b"a".to_vec(), b"b".to_vec()])
        .await
        .unwrap();
    let first = journal.journal_id().unwrap();
    journal.close().await;
    let (with_id, version) = sqlite_tables(&path);
    assert_eq!(version, 3);
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch("DROP TABLE journal_identity")
        .unwrap();
    let (previous, _) = sqlite_tables(&path);
    assert!(!previous.contains(&"journal_identity".to_owned()));

    let journal = SqliteJournal::open(&path).await.unwrap();
    let given = journal.journal_id().unwrap();
    assert_ne!(given, first, "a new id, as the file had none");
    assert_eq!(journal.replay(&stream, 1, 10, 10).await.unwrap().len(), 2);
    journal.close().await;
    assert_eq!(sqlite_tables(&path), (with_id, 3));
    let reopened = SqliteJournal::open(&path).await.unwrap();
    assert_eq!(reopened.journal_id(), Some(given), "given once");
}

#[cfg(feature = "postgres")]
use crate::postgres_support;

#[cfg(feature = "postgres")]
mod postgres {
    use super::postgres_support::{admin, unique, url};
    use actix_delivery::journal::{
        Journal, JournalError, JournalId, PostgresJournal, PostgresOptions, PostgresOptionsBuilder,
    };
    use tokio_postgres::Client;

    /// A schema of the case's own, dropped when the case ends well.
    struct Schema {
        name: String,
        admin: Client,
    }

    impl Schema {
        async fn new(prefix: &str) -> Self {
            Self {
                name: unique(prefix),
                admin: admin().await,
            }
        }

        fn options(&self) -> PostgresOptionsBuilder {
            PostgresOptions::builder().schema(&self.name)
        }

        async fn connect(&self) -> Result<PostgresJournal, JournalError> {
            PostgresJournal::connect_with(&url(), self.options().build().unwrap()).await
        }

        /// The ids in `journal_identity`.
        async fn ids(&self) -> Vec<String> {
            let rows = self
                .admin
                .query(
                    &format!("SELECT journal_id FROM \"{}\".journal_identity", self.name),
                    &[],
                )
                .await
                .unwrap();
            rows.iter().map(|row| row.get(0)).collect()
        }

        /// `journal_schema`'s rows.
        async fn marks(&self) -> Vec<(String, i32)> {
            let rows = self
                .admin
                .query(
                    &format!(
                        "SELECT application, version FROM \"{}\".journal_schema",
                        self.name
                    ),
                    &[],
                )
                .await
                .unwrap();
            rows.iter().map(|row| (row.get(0), row.get(1))).collect()
        }

        async fn drop(self) {
            self.admin
                .batch_execute(&format!("DROP SCHEMA \"{}\" CASCADE", self.name))
                .await
                .unwrap();
        }
    }

    /// The id is the schema's: created with the tables, the same on every connect, another
    /// in another schema of the same database.
    #[tokio::test]
    async fn a_postgres_journal_keeps_its_id_in_its_schema() {
        let (schema, other) = (Schema::new("jid").await, Schema::new("jid_other").await);
        let journal = schema.connect().await.unwrap();
        let id = journal.journal_id().unwrap();
        assert_eq!(schema.ids().await, [id.as_str().to_owned()]);
        journal.close().await;
        let again = schema.connect().await.unwrap();
        assert_eq!(again.journal_id(), Some(id.clone()));
        let elsewhere = other.connect().await.unwrap();
        assert_ne!(elsewhere.journal_id(), Some(id));
        again.close().await;
        elsewhere.close().await;
        schema.drop().await;
        other.drop().await;
    }

    /// A schema as the previous release made it (schema 3, no `journal_identity`): with
    /// `create_tables` off it opens without an id, changing nothing; on a connect that may
    /// create tables it gets one, keeping `journal_schema` (one row, version 3) as the
    /// previous release checks it; `IDENTITY_SQL` run by hand does the same.
    #[tokio::test]
    async fn a_postgres_schema_of_the_previous_release_gets_an_id_and_keeps_its_version() {
        let schema = Schema::new("jid_previous").await;
        schema.connect().await.unwrap().close().await;
        let drop_identity = format!("DROP TABLE \"{}\".journal_identity", schema.name);
        schema.admin.batch_execute(&drop_identity).await.unwrap();

        let untouched = schema.options().create_tables(false).build().unwrap();
        let untouched = PostgresJournal::connect_with(&url(), untouched)
            .await
            .unwrap();
        assert_eq!(untouched.journal_id(), None);
        untouched.close().await;
        let missing = schema
            .admin
            .query_one(
                "SELECT to_regclass($1) IS NULL",
                &[&format!("\"{}\".journal_identity", schema.name)],
            )
            .await
            .unwrap();
        assert!(missing.get::<_, bool>(0), "nothing created");

        let journal = schema.connect().await.unwrap();
        let id = journal.journal_id().unwrap();
        assert_eq!(schema.ids().await, [id.as_str().to_owned()]);
        assert_eq!(schema.marks().await, [("actix-delivery".to_owned(), 3)]);
        journal.close().await;

        schema.admin.batch_execute(&drop_identity).await.unwrap();
        schema
            .admin
            .batch_execute(&format!(
                "BEGIN; SET LOCAL search_path TO \"{}\"; {} COMMIT;",
                schema.name,
                PostgresJournal::IDENTITY_SQL
            ))
            .await
            .unwrap();
        let by_hand = JournalId::new(schema.ids().await.remove(0)).unwrap();
        let options = schema.options().create_tables(false).build().unwrap();
        let journal = PostgresJournal::connect_with(&url(), options)
            .await
            .unwrap();
        assert_eq!(journal.journal_id(), Some(by_hand));
        journal.close().await;
        schema.drop().await;
    }
}
