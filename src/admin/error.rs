//! What a request to the console gets when it fails: an HTTP status and a JSON body naming the
//! error, the field at fault (when one is) and whether anything happened.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

use crate::delivery::dead_letter_store::DeadLetterError;
use crate::delivery::dead_letters::FieldError;
use crate::error::Happened;

/// A failed request: its status, what went wrong, the field at fault, and whether the
/// operation happened (`certainly_not` for everything the console refuses itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AdminError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    pub(crate) field: Option<&'static str>,
    pub(crate) happened: Happened,
}

impl AdminError {
    /// A refusal of the console's own: nothing was done.
    pub(crate) fn refused(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            field: None,
            happened: Happened::CertainlyNot,
        }
    }

    /// A refusal naming the field at fault.
    pub(crate) fn field(
        status: StatusCode,
        field: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            field: Some(field),
            ..Self::refused(status, message)
        }
    }

    /// No dead-letter store was given to the console.
    pub(crate) fn no_store() -> Self {
        Self::refused(
            StatusCode::NOT_FOUND,
            "no dead-letter store was given to the console (Console::dead_letters)",
        )
    }
}

impl From<FieldError> for AdminError {
    fn from(error: FieldError) -> Self {
        Self::field(StatusCode::BAD_REQUEST, error.field, error.to_string())
    }
}

impl From<DeadLetterError> for AdminError {
    fn from(error: DeadLetterError) -> Self {
        let happened = error.happened();
        let (status, field) = match &error {
            DeadLetterError::NotFound(_) => (StatusCode::NOT_FOUND, Some("id")),
            DeadLetterError::Invalid(field) => (StatusCode::BAD_REQUEST, Some(field.field)),
            // The entry is as it was: the application reads it no more, or has no route.
            DeadLetterError::NoRoute(_) => (StatusCode::UNPROCESSABLE_ENTITY, Some("source")),
            DeadLetterError::Busy(_) => (StatusCode::CONFLICT, Some("id")),
            DeadLetterError::Unreplayable { .. } => (StatusCode::UNPROCESSABLE_ENTITY, None),
            // The destination failed (the error says whether it may have applied the message).
            DeadLetterError::ReplayFailed { .. } => (StatusCode::BAD_GATEWAY, None),
            _ if happened == Happened::CertainlyNot => (StatusCode::SERVICE_UNAVAILABLE, None),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, None),
        };
        Self {
            status,
            message: error.to_string(),
            field,
            happened,
        }
    }
}

impl std::fmt::Display for AdminError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl ResponseError for AdminError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut body = json!({
            "error": self.message,
            "happened": happened_name(self.happened),
        });
        if let Some(field) = self.field {
            body["field"] = json!(field);
        }
        HttpResponse::build(self.status).json(body)
    }
}

/// How JSON spells a [`Happened`].
pub(crate) fn happened_name(happened: Happened) -> &'static str {
    match happened {
        Happened::CertainlyNot => "certainly_not",
        Happened::InDoubt => "in_doubt",
        Happened::FailedAfter => "failed_after",
    }
}
