//! The bearer-token guard the console offers ([`Console::require_bearer`](crate::admin::Console::require_bearer)): every route
//! answers `401` with a JSON body unless the request carries `Authorization: Bearer <token>`
//! with the token given (compared in constant time).

use actix_web::http::header::{self, HeaderMap, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};

use crate::admin::confirm::same_secret;
use crate::admin::error::AdminError;
use crate::error::OptionsError;

/// The token every request must carry.
pub(crate) struct Bearer(Box<[u8]>);

impl Bearer {
    /// The guard of `token`: not empty, no whitespace or control characters (it must fit an
    /// HTTP header as it is).
    pub(crate) fn new(token: &str) -> Result<Self, OptionsError> {
        if token.is_empty() {
            return Err(OptionsError::new("bearer token", "must not be empty"));
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(OptionsError::new(
                "bearer token",
                "must not hold whitespace or control characters",
            ));
        }
        Ok(Self(token.as_bytes().into()))
    }

    /// `None` if `headers` carry the token; otherwise the `401` to answer.
    pub(crate) fn refusal(&self, headers: &HeaderMap) -> Option<HttpResponse> {
        let given = headers
            .get(header::AUTHORIZATION)
            .map(|value| value.as_bytes())
            .and_then(|value| {
                let (scheme, token) = value.split_at_checked(7)?;
                scheme.eq_ignore_ascii_case(b"bearer ").then_some(token)
            });
        let error = match given {
            Some(token) if same_secret(token, &self.0) => return None,
            Some(_) => "the bearer token is not the console's",
            None => "this console needs a bearer token: `Authorization: Bearer <token>`",
        };
        let error = AdminError::field(StatusCode::UNAUTHORIZED, "authorization", error);
        let mut response = error.error_response();
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"actix-delivery admin\""),
        );
        Some(response)
    }
}
