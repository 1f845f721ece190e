//! The axum edge: routes, the API-key check, request parsing, and turning engine events into
//! a JSON response or a server-sent-event stream.
//!
//! A handler parses and checks the body (a 4xx here never reaches the engine), tokenises the
//! prompt, submits a job and then only waits on the job's event channel. Dropping the response
//! — the client closed the connection — drops that channel's receiver, which the engine sees
//! before its next step and answers by cancelling the sequence and freeing its slot.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::mpsc::{self, UnboundedReceiver};

use hipfire_model::Model;

use crate::api::{
    chunk, full_response, parse_body, ChatRequest, CompletionRequest, Endpoint, FinishReason,
    Generation, ResponseMeta, COMPLETION_DEFAULT_MAX_TOKENS,
};
use crate::engine::{EngineHandle, Event};
use crate::error::ApiError;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The engine's handle (and the metrics).
    pub engine: EngineHandle,
    /// The model, for its tokenizer and context length (the engine thread holds its slots).
    pub model: Arc<Model>,
    /// Name reported as `model` (the file's stem).
    pub model_name: Arc<str>,
    /// `--api-key`: when set, `/v1/*` requires `Authorization: Bearer <key>`.
    pub api_key: Option<Arc<str>>,
    /// Unix seconds at start (`/v1/models`' `created`).
    pub started: u64,
}

/// Every route. `/health` and `/metrics` stay open with an API key (load balancers and
/// scrapers probe them without credentials); `/v1/*` does not.
pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_key));
    Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(state)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Constant-time comparison, so the key cannot be guessed byte by byte from response times.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn require_key(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !same_key(given.as_bytes(), key.as_bytes()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

async fn not_found(uri: Uri) -> Response {
    ApiError::not_found(uri.path()).into_response()
}

async fn health(State(st): State<AppState>) -> Response {
    if st.engine.is_draining() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "draining"})),
        )
            .into_response()
    } else {
        Json(json!({"status": "ok"})).into_response()
    }
}

async fn metrics(State(st): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.engine.metrics.render(),
    )
        .into_response()
}

async fn models(State(st): State<AppState>) -> Response {
    Json(json!({
        "object": "list",
        "data": [{
            "id": &*st.model_name,
            "object": "model",
            "created": st.started,
            "owned_by": "hipfire",
        }],
    }))
    .into_response()
}

async fn chat(State(st): State<AppState>, body: Bytes) -> Response {
    let checked = parse_body::<ChatRequest>(&body).and_then(|req| {
        let prompt = req.prompt_tokens(st.model.tokenizer())?;
        req.sampling
            .check(Endpoint::Chat, prompt, st.model.ctx_len(), None)
    });
    respond(st, Endpoint::Chat, checked).await
}

async fn completions(State(st): State<AppState>, body: Bytes) -> Response {
    let checked = parse_body::<CompletionRequest>(&body).and_then(|req| {
        let prompt = req.prompt_tokens(st.model.tokenizer())?;
        req.sampling.check(
            Endpoint::Completion,
            prompt,
            st.model.ctx_len(),
            Some(COMPLETION_DEFAULT_MAX_TOKENS),
        )
    });
    respond(st, Endpoint::Completion, checked).await
}

/// Submit a checked generation and answer it (or the refusal).
async fn respond(
    st: AppState,
    endpoint: Endpoint,
    checked: Result<Generation, ApiError>,
) -> Response {
    let refuse = |e: ApiError| {
        st.engine
            .metrics
            .request(endpoint.label(), e.status.as_u16());
        e.into_response()
    };
    let gen = match checked {
        Ok(g) => g,
        Err(e) => return refuse(e),
    };
    let (stream, include_usage) = (gen.stream, gen.include_usage);
    let (tx, rx) = mpsc::unbounded_channel();
    if let Err(e) = st.engine.submit(gen, tx) {
        return refuse(e);
    }
    let meta = ResponseMeta {
        id: format!(
            "{}-{:016x}",
            match endpoint {
                Endpoint::Chat => "chatcmpl",
                Endpoint::Completion => "cmpl",
            },
            rand::random::<u64>()
        ),
        created: unix_now(),
        model: st.model_name.to_string(),
    };
    if stream {
        sse(endpoint, meta, rx, include_usage).into_response()
    } else {
        collect(endpoint, meta, rx).await
    }
}

/// Wait for the whole text, then answer once.
async fn collect(
    endpoint: Endpoint,
    meta: ResponseMeta,
    mut rx: UnboundedReceiver<Event>,
) -> Response {
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Done { finish, usage } => {
                return Json(full_response(endpoint, &meta, &text, finish, usage)).into_response()
            }
            Event::Failed(why) => return ApiError::internal(why).into_response(),
        }
    }
    ApiError::internal("the engine dropped the request").into_response()
}

/// The SSE stream's state: the engine's events, chunks decoded but not yet yielded, and
/// whether the last has been queued.
struct SseState {
    endpoint: Endpoint,
    meta: ResponseMeta,
    rx: UnboundedReceiver<Event>,
    pending: VecDeque<SseEvent>,
    first: bool,
    include_usage: bool,
    ended: bool,
}

impl SseState {
    fn data(v: serde_json::Value) -> SseEvent {
        SseEvent::default().data(v.to_string())
    }

    /// Queue the chunks one engine event makes.
    fn on_event(&mut self, ev: Option<Event>) {
        let (ep, first) = (self.endpoint, self.first);
        match ev {
            Some(Event::Text(t)) => {
                self.first = false;
                self.pending.push_back(Self::data(chunk(
                    ep,
                    &self.meta,
                    Some(&t),
                    first,
                    None,
                    None,
                )));
            }
            Some(Event::Done { finish, usage }) => {
                self.pending.push_back(Self::data(chunk(
                    ep,
                    &self.meta,
                    first.then_some(""),
                    first,
                    Some(finish),
                    None,
                )));
                if self.include_usage {
                    self.pending.push_back(Self::data(chunk(
                        ep,
                        &self.meta,
                        None,
                        false,
                        None::<FinishReason>,
                        Some(usage),
                    )));
                }
                self.pending.push_back(SseEvent::default().data("[DONE]"));
                self.ended = true;
            }
            Some(Event::Failed(why)) => {
                self.pending
                    .push_back(Self::data(ApiError::internal(why).body()));
                self.ended = true;
            }
            None => {
                self.pending.push_back(Self::data(
                    ApiError::internal("the engine dropped the request").body(),
                ));
                self.ended = true;
            }
        }
    }
}

fn sse(
    endpoint: Endpoint,
    meta: ResponseMeta,
    rx: UnboundedReceiver<Event>,
    include_usage: bool,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let state = SseState {
        endpoint,
        meta,
        rx,
        pending: VecDeque::new(),
        first: true,
        include_usage,
        ended: false,
    };
    let stream = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(e) = s.pending.pop_front() {
                return Some((Ok(e), s));
            }
            if s.ended {
                return None;
            }
            let ev = s.rx.recv().await;
            s.on_event(ev);
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}
