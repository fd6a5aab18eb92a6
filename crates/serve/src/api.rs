//! The HTTP API of `perc serve`: its routes, the checks every request passes (the `Host`
//! header, the time allowed, the body's size, the write token), and the handlers, each a
//! [`Pipeline`] call turned into JSON.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use perc_pipeline::config::Serve as ServeConfig;
use perc_pipeline::PipelineError;
use perc_search::SearchError;
use url::Url;

use crate::{metrics, status, Served};

pub(crate) fn router(state: Arc<Served>, config: &ServeConfig) -> Router {
    let limit = Duration::from_millis(config.request_timeout_ms);
    let body_max = usize::try_from(config.body_bytes_max).unwrap_or(usize::MAX);
    Router::new()
        .route("/v1/canonical", get(canonical))
        .route("/v1/page", get(page))
        .route("/v1/status", get(status::status))
        .route("/v1/export", get(export))
        .route("/v1/search", get(search))
        .route("/metrics", get(status::scrape))
        .route("/", get(status::page_of_status))
        .route("/v1/seeds", post(seeds))
        .route("/v1/refetch", post(refetch))
        .fallback(unknown_path)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(body_max))
        .layer(axum::middleware::from_fn(move |request, next| timed(limit, request, next)))
        .layer(axum::middleware::from_fn_with_state(state.clone(), host_checked))
        .with_state(state)
}

/// Answers 408 when the answer's head is not ready within `limit` (a streamed body, once
/// begun, is not cut); records how long each answer's head took.
async fn timed(
    limit: Duration,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = request.uri().path().to_string();
    let started = Instant::now();
    let response = match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("no answer within {} ms (serve.request_timeout_ms)", limit.as_millis()),
        )
        .into_response(),
    };
    metrics::request(&path, response.status().as_u16(), started.elapsed().as_secs_f64());
    response
}

/// Answers 421 to a request whose `Host` header is not one this server answers to (see
/// [`allowed_hosts`]).
async fn host_checked(
    State(s): State<Arc<Served>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(hosts) = &s.hosts {
        let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok());
        let host = host.map(str::to_ascii_lowercase).unwrap_or_default();
        if !hosts.contains(&host) {
            return ApiError::new(
                StatusCode::MISDIRECTED_REQUEST,
                format!(
                    "Host {host:?} is not this server's (it answers to {}; serve.hosts adds names)",
                    hosts.join(", ")
                ),
            )
            .into_response();
        }
    }
    next.run(request).await
}

/// An answer that is not the one asked for: its status and what went wrong.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(serde_json::json!({ "error": self.message }))).into_response()
    }
}

impl From<PipelineError> for ApiError {
    fn from(e: PipelineError) -> ApiError {
        let status = if e.is_below() {
            StatusCode::SERVICE_UNAVAILABLE
        } else if matches!(e, PipelineError::Input(_)) {
            StatusCode::BAD_REQUEST
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        ApiError::new(status, e.to_string())
    }
}

/// A JSON body of type `T`: 413 over the limit, 400 naming what is wrong with it.
fn body<T: serde::de::DeserializeOwned>(raw: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let raw = raw.map_err(|r| ApiError::new(r.status(), r.body_text()))?;
    serde_json::from_slice(&raw)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("the JSON body: {e}")))
}

/// URLs from a body, normalized; 400 naming the first bad one.
fn urls(field: &str, raw: &[String]) -> Result<Vec<Url>, ApiError> {
    raw.iter()
        .enumerate()
        .map(|(i, u)| {
            perc_pipeline::normalize(u).map_err(|e| {
                ApiError::new(StatusCode::BAD_REQUEST, format!("{field}[{i}] {u:?}: {e}"))
            })
        })
        .collect()
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SeedsBody {
    seeds: Vec<String>,
    #[serde(default)]
    prefixes: Vec<String>,
}

/// `POST /v1/seeds` `{"seeds": [...], "prefixes": [...]}`: adds them to what the index
/// crawls (the scope grows by theirs) and answers 202 at once.
async fn seeds(
    State(s): State<Arc<Served>>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Answer {
    s.authorize(&headers)?;
    let b: SeedsBody = body(raw)?;
    if b.seeds.is_empty() {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "no seeds given"));
    }
    let max = s.app.config().crawl.seeds_max;
    if b.seeds.len() as u64 > max {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{} seeds: the most accepted is {max} (crawl.seeds_max)", b.seeds.len()),
        ));
    }
    let seeds = urls("seeds", &b.seeds)?;
    let n = seeds.len();
    let outside = s.add_seeds(seeds, &b.prefixes).await?;
    let outside: Vec<&str> = outside.iter().map(Url::as_str).collect();
    let answer = serde_json::json!({"seeds": n, "outside_scope": outside});
    Ok((StatusCode::ACCEPTED, Json(answer)).into_response())
}

impl Served {
    /// Whether `headers` carry the write endpoints' bearer token.
    fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(want) = self.token else {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "this server has no token (serve.token), so it takes no writes",
            ));
        };
        // The scheme's name is case-insensitive (RFC 9110 §11.1): "bearer" is "Bearer".
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().split_once(char::is_whitespace))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "missing Authorization: Bearer TOKEN (the token is serve.token, or the \
                     one in DATA/serve.token)",
                )
            })?;
        // blake3's Hash compares in constant time.
        if blake3::hash(given.trim().as_bytes()) != want {
            return Err(ApiError::new(StatusCode::UNAUTHORIZED, "wrong bearer token"));
        }
        Ok(())
    }

    /// Adds `seeds` to what the index crawls at once (one transaction), and reads their
    /// sitemaps in the background: robots.txt and the sitemap files are fetched politely,
    /// which takes as long as their hosts take. Returns the seeds outside `prefixes`.
    async fn add_seeds(
        &self,
        seeds: Vec<Url>,
        prefixes: &[String],
    ) -> Result<Vec<Url>, PipelineError> {
        let (outside, scope) = self.app.extend_seeds(&seeds, prefixes).await?;
        self.read_sitemaps(seeds, scope);
        Ok(outside)
    }

    /// Reads the sitemaps of `seeds` in the background, adding their in-scope URLs.
    pub(crate) fn read_sitemaps(&self, seeds: Vec<Url>, scope: perc_pipeline::CrawlScope) {
        let app = self.app.clone();
        self.background.spawn(async move {
            match app.add_sitemap_urls(&seeds, &scope).await {
                Ok(0) => {}
                Ok(n) => tracing::info!("{n} URLs of the seeds' sitemaps added to the frontier"),
                Err(e) => {
                    app.note(&e);
                    tracing::warn!(error = %e, "cannot read the seeds' sitemaps");
                }
            }
        });
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RefetchBody {
    #[serde(default)]
    urls: Vec<String>,
    #[serde(default)]
    all: bool,
}

/// `POST /v1/refetch` `{"urls": [...]}` or `{"all": true}`: asks for them again and answers
/// 202 at once, naming the URLs the index does not know.
async fn refetch(
    State(s): State<Arc<Served>>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Answer {
    s.authorize(&headers)?;
    let b: RefetchBody = body(raw)?;
    let targets = match (b.all, b.urls.is_empty()) {
        (true, true) => None,
        (false, false) => Some(urls("urls", &b.urls)?),
        _ => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "give either \"urls\": [...] or \"all\": true",
            ))
        }
    };
    let (refetching, unknown) = s.app.want_again(targets.as_deref()).await?;
    let unknown: Vec<&str> = unknown.iter().map(Url::as_str).collect();
    let answer = serde_json::json!({"refetching": refetching, "unknown": unknown});
    Ok((StatusCode::ACCEPTED, Json(answer)).into_response())
}

pub(crate) type Answer = Result<Response, ApiError>;

/// The one parameter `name` of a query string: 414 over the cap, 400 missing, repeated or
/// not UTF-8.
fn param(query: Option<&str>, name: &str, max: usize) -> Result<String, ApiError> {
    optional_param(query, name, max)?.ok_or_else(|| {
        ApiError::new(StatusCode::BAD_REQUEST, format!("missing query parameter {name}"))
    })
}

/// The parameter `name` if it is there: 414 over the cap, 400 repeated or not UTF-8 (a
/// parameter is never decoded lossily: a URL with its bytes replaced is another URL).
pub(crate) fn optional_param(
    query: Option<&str>,
    name: &str,
    max: usize,
) -> Result<Option<String>, ApiError> {
    let query = query.unwrap_or("");
    if query.len() > max {
        return Err(ApiError::new(
            StatusCode::URI_TOO_LONG,
            format!("the query string has {} bytes; the most accepted is {max}", query.len()),
        ));
    }
    // The form grammar: '+' is a space, then %XX escapes.
    let decode = |raw: &str| -> Vec<u8> {
        percent_encoding::percent_decode(raw.replace('+', " ").as_bytes()).collect()
    };
    let mut found = query
        .split('&')
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .filter(|(k, _)| decode(k) == name.as_bytes());
    let Some((_, value)) = found.next() else { return Ok(None) };
    if found.next().is_some() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("query parameter {name} given more than once"),
        ));
    }
    String::from_utf8(decode(value)).map(Some).map_err(|_| {
        ApiError::new(StatusCode::BAD_REQUEST, format!("query parameter {name} is not UTF-8"))
    })
}

/// The `url` parameter, normalized as the index keys it.
fn url_param(query: Option<&str>, max: usize) -> Result<Url, ApiError> {
    let raw = param(query, "url", max)?;
    perc_pipeline::normalize(&raw)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("url {raw:?}: {e}")))
}

fn json_text(text: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], text).into_response()
}

/// `GET /v1/canonical?url=U`: `{"url", "canonical"}`, or 404 saying what U is instead.
async fn canonical(State(s): State<Arc<Served>>, RawQuery(q): RawQuery) -> Answer {
    let url = url_param(q.as_deref(), s.query_bytes_max)?;
    match s.app.canonical(&url).await? {
        Ok(c) => Ok(Json(serde_json::json!({"url": url.as_str(), "canonical": c})).into_response()),
        Err(why) => Err(ApiError::new(StatusCode::NOT_FOUND, why)),
    }
}

/// `GET /v1/page?url=U`: what `perc page` prints, or 404.
async fn page(State(s): State<Arc<Served>>, RawQuery(q): RawQuery) -> Answer {
    let url = url_param(q.as_deref(), s.query_bytes_max)?;
    match s.app.page_json(&url).await? {
        Some(record) => Ok(json_text(record)),
        None => {
            Err(ApiError::new(StatusCode::NOT_FOUND, format!("{url} is not known to this index")))
        }
    }
}

/// `GET /v1/search?q=Q&limit=N&lang=L`: `{"query", "hits": [{url, title, score, in_degree, pagerank,
/// lang, snippet}]}`, the best N (10 unless given; at most `search.limit_max`) first, of the
/// pages whose main text is in language L (ISO 639-3) when L is given.
async fn search(State(s): State<Arc<Served>>, RawQuery(q): RawQuery) -> Answer {
    let query = param(q.as_deref(), "q", s.query_bytes_max)?;
    let max = s.app.config().search.limit_max;
    let limit = match optional_param(q.as_deref(), "limit", s.query_bytes_max)? {
        None => 10.min(max),
        Some(raw) => {
            raw.parse::<u64>().ok().filter(|n| (1..=max).contains(n)).ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("limit {raw:?}: it must be 1 to {max} (search.limit_max)"),
                )
            })?
        }
    };
    let filter =
        perc_search::Filter { lang: optional_param(q.as_deref(), "lang", s.query_bytes_max)? };
    let index = s.search.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this server keeps no search index (search.enabled = false)",
        )
    })?;
    let q2 = query.clone();
    let bounds = perc_search::QueryLimits::from(&s.app.config().search);
    let _turn = s.searching.acquire().await.expect("the semaphore is never closed");
    let hits =
        tokio::task::spawn_blocking(move || index.search(&q2, &filter, limit as usize, bounds))
            .await
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
            .map_err(|e| match e {
                SearchError::Query(why) => ApiError::new(StatusCode::BAD_REQUEST, why),
                other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
            })?;
    Ok(Json(serde_json::json!({"query": query, "hits": hits})).into_response())
}

/// `GET /v1/export`: the export as JSON Lines, streamed: the bytes `perc export` writes
/// (`?links=1`: the link graph, the bytes `perc export --links` writes). The
/// export hands its lines to a callback; each waits (`block_in_place`, so the runtime's other
/// tasks go on) until the response has room: memory holds a few lines, not the export. At
/// most `serve.exports_max` stream at once (503 beyond), and a client that takes no line for
/// `serve.stall_ms` is cut off, which ends the export's snapshot too.
async fn export(State(s): State<Arc<Served>>, RawQuery(q): RawQuery) -> Answer {
    let links = match optional_param(q.as_deref(), "links", s.query_bytes_max)?.as_deref() {
        None | Some("0") | Some("false") => false,
        Some("1") | Some("true") => true,
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("links {other:?}: it must be 1 or 0 (true or false)"),
            ))
        }
    };
    let Ok(permit) = s.exports.clone().try_acquire_owned() else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "as many exports as serve.exports_max are streaming now: ask again later",
        ));
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let (app, stall) = (s.app.clone(), s.stall);
    tokio::spawn(async move {
        let _permit = permit;
        let tx2 = tx.clone();
        let rt = tokio::runtime::Handle::current();
        let send = |mut text: Vec<u8>| {
            text.push(b'\n');
            // A client that went away, or stalled, ends the export.
            let sent = tokio::task::block_in_place(|| {
                rt.block_on(tx2.send_timeout(Ok(Bytes::from(text)), stall))
            });
            sent.map_err(|_| PipelineError::Interrupted)
        };
        let result = if links {
            app.export_links(|line| send(json_of(&line))).await
        } else {
            app.export(|line| send(json_of(&line))).await
        };
        if let Err(e) = result {
            if !matches!(e, PipelineError::Interrupted) {
                let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
            }
        }
    });
    let body = Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }));
    Ok(([(header::CONTENT_TYPE, "application/jsonl")], body).into_response())
}

/// A line of either export, as its JSON.
fn json_of(line: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(line).expect("an export line serializes")
}

async fn unknown_path(uri: Uri) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("no such endpoint: {}", uri.path()))
}

async fn wrong_method(method: axum::http::Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{method} is not allowed on {}", uri.path()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use perc_pipeline::Pipeline;
    use perc_pipeline::{Config, Fetching};

    /// A server of `pages` pages loaded into a memory store, with `exports_max` exports at
    async fn served(pages: usize, exports_max: usize, stall_ms: u64) -> Arc<Served> {
        let mut config = Config::defaults();
        config.store.backend = perc_pipeline::Backend::Memory;
        let app = Pipeline::builder(config).fetching(Fetching::Offline).open().await.unwrap();
        let recorded: Vec<perc_crawl::warc::Recorded> = (0..pages)
            .map(|i| perc_crawl::warc::Recorded {
                url: Url::parse(&format!("http://h.test/p{i}")).unwrap(),
                response: perc_crawl::Response::html(
                    200,
                    format!("<title>page {i}</title><p>text of page {i}</p>"),
                ),
            })
            .collect();
        perc_observers::load_recorded(app.client(), &recorded).await.unwrap();
        app.engine().run_until_quiet().await.unwrap();
        Arc::new(Served {
            app: Arc::new(app),
            search: None,
            searching: tokio::sync::Semaphore::new(1),
            rates: Default::default(),
            query_bytes_max: 4096,
            token: None,
            last_status: tokio::sync::Mutex::new(None),
            exports: Arc::new(tokio::sync::Semaphore::new(exports_max)),
            stall: Duration::from_millis(stall_ms),
            background: tokio::runtime::Handle::current(),
            hosts: None,
            allocator: None,
        })
    }

    /// An export reads its lines a page at a time and streams them: a client that stops
    /// reading holds a bounded channel's worth, is cut off after `serve.stall_ms`, and gives
    /// its turn back; meanwhile an export beyond `serve.exports_max` is answered 503.
    #[test]
    fn a_stalled_export_is_cut_off_and_exports_beyond_the_cap_are_refused() {
        use futures::StreamExt as _;
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let s = served(300, 1, 300).await;
            let stalled = export(State(s.clone()), RawQuery(None)).await.unwrap();
            assert_eq!(stalled.status(), StatusCode::OK);
            let mut body = stalled.into_body().into_data_stream();
            let first = body.next().await.unwrap().unwrap();
            assert!(first.starts_with(b"{\"url\":\"http://h.test/p0\""), "{first:?}");
            // The client reads no more: the export holds its turn until it is cut off.
            let refused = export(State(s.clone()), RawQuery(None)).await.unwrap_err();
            assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE, "{}", refused.message);
            assert!(refused.message.contains("serve.exports_max"), "{}", refused.message);
            let deadline = Instant::now() + Duration::from_secs(60);
            while s.exports.available_permits() == 0 {
                assert!(Instant::now() < deadline, "the stalled export was never cut off");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // What the stalled client can still read is what was sent before the cut: a
            // bounded part of the 300 lines, and then the end.
            let mut lines = first.iter().filter(|&&b| b == b'\n').count();
            while let Some(chunk) = body.next().await {
                lines += chunk.unwrap().iter().filter(|&&b| b == b'\n').count();
            }
            assert!((1..300).contains(&lines), "{lines} lines");
            // A client that reads gets the whole export.
            let whole = export(State(s.clone()), RawQuery(None)).await.unwrap();
            let bytes = axum::body::to_bytes(whole.into_body(), usize::MAX).await.unwrap();
            assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), 300);
        });
    }
}
