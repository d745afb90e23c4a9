//! Opening connections: on the journal's own runtime (which then drives them), over TLS when
//! the options ask for it, optionally forwarding the notifications a connection receives
//! (the listener's); and what counts as a lost connection.

use std::error::Error as _;
use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio_postgres::{Client, Config, NoTls};

use crate::journal::postgres::connection_string::parse_config;
use crate::journal::postgres::db_error;
use crate::journal::postgres::options::PostgresOptions;
use crate::journal::postgres::statements::Sql;
#[cfg(feature = "tls")]
use crate::journal::postgres::tls;
use crate::journal::JournalError;
use crate::runtime::error_chain::ErrorChain;

/// Opens connections, on the journal's runtime.
#[derive(Clone)]
pub(super) struct Connector {
    pub(super) config: Config,
    pub(super) runtime: Handle,
    pub(super) connect_timeout: std::time::Duration,
    pub(super) sql: Arc<Sql>,
    #[cfg(feature = "tls")]
    pub(super) tls: Option<tls::MakeRustls>,
}

impl Connector {
    /// Opens connections to the database `connection` names (a libpq-style `key=value` string
    /// or a `postgresql://` URL), as `options` say (schema, connect timeout, TLS), on
    /// `runtime`: for a tool that works without a journal (the inspector, a dead-letter store
    /// opened on its own). A connection string without an `application_name` gets
    /// `application_name`.
    ///
    /// # Errors
    /// [`JournalError::InvalidArgument`] for a `connection` that does not parse (saying what
    /// did not, never the password).
    pub(super) fn for_connection(
        connection: &str,
        options: &PostgresOptions,
        application_name: &str,
        runtime: Handle,
    ) -> Result<Self, JournalError> {
        let config = &options.config;
        let mut server =
            parse_config(connection).map_err(|reason| JournalError::InvalidArgument {
                persistence_id: None,
                reason,
            })?;
        if server.get_application_name().is_none() {
            server.application_name(application_name);
        }
        server.connect_timeout(config.connect_timeout);
        #[cfg(feature = "tls")]
        if options.tls.is_some() {
            server.ssl_mode(tokio_postgres::config::SslMode::Require);
        }
        Ok(Self {
            config: server,
            runtime,
            connect_timeout: config.connect_timeout,
            sql: Arc::new(Sql::new(&config.schema)),
            #[cfg(feature = "tls")]
            tls: options.tls.as_ref().map(tls::PostgresTls::connector),
        })
    }

    /// Connects; must run on the journal's runtime (which then drives the connection).
    pub(super) async fn open(&self) -> Result<Client, JournalError> {
        self.open_forwarding(None).await
    }

    /// Connects as [`open`](Self::open); the payloads of the notifications the connection
    /// receives (once it `LISTEN`s) go to `notifications`, if given.
    pub(super) async fn open_forwarding(
        &self,
        notifications: Option<mpsc::UnboundedSender<String>>,
    ) -> Result<Client, JournalError> {
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            return self.open_with(tls.clone(), notifications).await;
        }
        self.open_with(NoTls, notifications).await
    }

    async fn open_with<T>(
        &self,
        tls: T,
        notifications: Option<mpsc::UnboundedSender<String>>,
    ) -> Result<Client, JournalError>
    where
        T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
        T::Stream: Send + 'static,
    {
        let connecting = tokio::time::timeout(self.connect_timeout, self.config.connect(tls));
        let (client, connection) = match connecting.await {
            Ok(Ok(connected)) => connected,
            Ok(Err(err)) => return Err(db_error(None, "cannot connect to PostgreSQL", &err)),
            Err(_) => {
                return Err(JournalError::storage(
                    None,
                    format!(
                        "cannot connect to PostgreSQL: no answer within {:?}",
                        self.connect_timeout
                    ),
                ))
            }
        };
        let Some(notifications) = notifications else {
            tokio::spawn(async move {
                if let Err(err) = connection.await {
                    log::debug!(
                        "journal: a PostgreSQL connection ended: {}",
                        ErrorChain(&err)
                    );
                }
            });
            return Ok(client);
        };
        tokio::spawn(async move {
            let mut connection = connection;
            let mut messages = futures_util::stream::poll_fn(|cx| connection.poll_message(cx));
            while let Some(message) = futures_util::StreamExt::next(&mut messages).await {
                match message {
                    Ok(tokio_postgres::AsyncMessage::Notification(notification)) => {
                        let _ = notifications.send(notification.payload().to_owned());
                    }
                    Ok(_) => {}
                    Err(err) => {
                        log::debug!(
                            "journal: a PostgreSQL connection ended: {}",
                            ErrorChain(&err)
                        );
                        break;
                    }
                }
            }
        });
        Ok(client)
    }
}

/// Whether `err` means the connection is gone (rather than a statement failing on a live
/// one): closed, an I/O error, or the server ending the session (class 57: shutdown,
/// `pg_terminate_backend`; class 08: connection exceptions).
pub(crate) fn is_connection_lost(err: &tokio_postgres::Error) -> bool {
    if err.is_closed() {
        return true;
    }
    if let Some(code) = err.code() {
        let code = code.code();
        return code.starts_with("57P") || code.starts_with("08");
    }
    err.source()
        .is_some_and(|source| source.downcast_ref::<std::io::Error>().is_some())
}
