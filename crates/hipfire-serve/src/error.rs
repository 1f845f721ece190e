//! The crate's two error types.
//!
//! [`ServeError`] is for the operator: the server could not start or stopped abnormally (a bind
//! failure, an engine that died). [`ApiError`] is for a client: one request was refused, and it
//! becomes an HTTP status plus OpenAI's error body
//! (`{"error": {"message", "type", "param", "code"}}`), which the official SDKs parse into their
//! typed exceptions. A request error never stops the server.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use thiserror::Error;

/// Why the server could not start or run.
#[derive(Debug, Error)]
pub enum ServeError {
    /// Binding the listening socket failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// An I/O failure while serving (the runtime, the socket).
    #[error("serving: {0}")]
    Io(#[from] std::io::Error),
    /// A setting is out of range.
    #[error("invalid setting: {0}")]
    Config(String),
    /// The KV cache the slots may fill does not fit in memory.
    #[error(
        "{slots} slots × {ctx} positions need {need_mib} MiB of KV cache, but only {avail_mib} MiB \
         of memory is available; lower --parallel or --ctx-size"
    )]
    KvBudget {
        /// Sequence slots (`--parallel`).
        slots: usize,
        /// Positions per slot.
        ctx: usize,
        /// MiB the slots can fill.
        need_mib: u64,
        /// MiB the OS reports available.
        avail_mib: u64,
    },
    /// The engine thread failed to start or panicked.
    #[error("engine: {0}")]
    Engine(String),
}

/// OpenAI's `error.type` values that this server uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A malformed or out-of-range request (400).
    InvalidRequest,
    /// Missing or wrong API key (401).
    Authentication,
    /// The queue is full (429).
    RateLimit,
    /// Something failed inside the server (500) or it is shutting down (503).
    Server,
    /// No such route (404).
    NotFound,
}

impl ErrorKind {
    /// The `type` string OpenAI's API puts in the body for this kind.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::RateLimit => "rate_limit_error",
            ErrorKind::Server => "server_error",
            ErrorKind::NotFound => "not_found_error",
        }
    }
}

/// One refused request: the status, OpenAI's error fields, and (for 429) when to retry.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// `error.type`.
    pub kind: ErrorKind,
    /// `error.message`: what was wrong, with the offending value.
    pub message: String,
    /// `error.param`: the request field at fault, when one is.
    pub param: Option<&'static str>,
    /// `error.code`: a machine-readable reason (`context_length_exceeded`, ...).
    pub code: Option<&'static str>,
    /// `Retry-After` seconds (429 and 503 only).
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    /// 400 for a bad field.
    pub fn invalid(param: Option<&'static str>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: ErrorKind::InvalidRequest,
            message: message.into(),
            param,
            code: None,
            retry_after_s: None,
        }
    }

    /// The same error with a machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// 401.
    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            kind: ErrorKind::Authentication,
            message: "missing or incorrect API key (send `Authorization: Bearer KEY`)".into(),
            param: None,
            code: Some("invalid_api_key"),
            retry_after_s: None,
        }
    }

    /// 429: every slot is busy and the queue is full.
    pub fn queue_full(retry_after_s: u64) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: ErrorKind::RateLimit,
            message: "the server's request queue is full; retry later".into(),
            param: None,
            code: Some("queue_full"),
            retry_after_s: Some(retry_after_s),
        }
    }

    /// 503: shutting down.
    pub fn draining() -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: ErrorKind::Server,
            message: "the server is shutting down".into(),
            param: None,
            code: Some("shutting_down"),
            retry_after_s: Some(1),
        }
    }

    /// 500 with the engine's reason.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: ErrorKind::Server,
            message: message.into(),
            param: None,
            code: None,
            retry_after_s: None,
        }
    }

    /// 404 for an unknown route.
    pub fn not_found(path: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            kind: ErrorKind::NotFound,
            message: format!("no route {path}"),
            param: None,
            code: None,
            retry_after_s: None,
        }
    }

    /// The JSON body, OpenAI's shape.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind.as_str(),
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after_s {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        resp
    }
}
