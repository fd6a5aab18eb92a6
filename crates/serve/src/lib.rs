//! `perc serve`: the index as a long-running service (docs/serve.md). The observers run as
//! in `perc worker`, a scheduler asks for every fetched URL again when it is due (the
//! recrawl), and an HTTP server answers questions about the index while it changes:
//! every answer is a [`Pipeline`] call, the same one the CLI makes, so the two cannot
//! disagree.
//!
//! The API answers JSON; every error is `{"error": "..."}` naming the problem, with its
//! status: 400 a bad or missing parameter or body, 401 a write without the bearer token,
//! 403 a write to a server that has no token, 404 an unknown path or URL, 405 a wrong
//! method, 408 an answer not ready within `serve.request_timeout_ms`, 413 a body and 414 a
//! query string over `serve.body_bytes_max`, 503 a store that does not answer.
//! While it runs, `DATA/serve.json` says where it listens (written once bound, removed at
//! a clean stop). Beside the API: a search indexer draining the store's search queue into
//! `perc-search`'s index, `GET /metrics` ([`metrics`]) and the status page (`GET /`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
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
use perc_pipeline::{Pipeline, PipelineError};
use perc_search::{SearchError, SearchIndex};
use tokio_util::sync::CancellationToken;
use url::Url;

mod listen;
mod metrics;

/// The file in the data directory that says where a running server listens.
pub const ADDRESS_FILE: &str = "serve.json";

/// The file in the data directory that holds the write endpoints' token when the
/// configuration gives none.
pub const TOKEN_FILE: &str = "serve.token";

/// What the handlers share.
struct Served {
    app: Arc<Pipeline>,
    /// The search index (`search.enabled`), kept by [`index_loop`].
    search: Option<Arc<SearchIndex>>,
    /// Searches running at once: one an API thread. More would only share the same cores
    /// among more threads, and every request, a canonical's too, would wait for its turn
    /// among them.
    searching: tokio::sync::Semaphore,
    /// This process's fetch and parse rates over the last minutes ([`sample_rates`]).
    rates: std::sync::Mutex<std::collections::VecDeque<Rate>>,
    query_bytes_max: usize,
    /// The write endpoints' token (its hash: compared in constant time); none: writes are
    /// refused.
    token: Option<blake3::Hash>,
    /// The last status read ([`Served::read_status`]); held while a read is under way, so
    /// the requests that come meanwhile wait for the next one instead of reading too.
    last_status: tokio::sync::Mutex<Option<StatusRead>>,
    /// Exports streaming now (`serve.exports_max`): each holds a snapshot's reads open.
    exports: Arc<tokio::sync::Semaphore>,
    /// A client that takes none of an answer for this long is cut off (`serve.stall_ms`).
    stall: Duration,
    /// Where work that takes a while after an answer runs (the indexing runtime): the
    /// sitemaps of seeds just added.
    background: tokio::runtime::Handle,
    /// The `Host` headers answered (see [`allowed_hosts`]); `None`: any.
    hosts: Option<Vec<String>>,
}

/// The `Host` headers a server listening on `addr` answers. On loopback, only its own names
/// (localhost, 127.0.0.1, [::1], with its port or without) and `serve.hosts`: a web page that
/// rebinds its own domain name to 127.0.0.1 (DNS rebinding) gets 421, so a browser on this
/// machine cannot be used to read the API. Beyond loopback, `serve.hosts` if given, else any
/// (a token guards the writes there).
fn allowed_hosts(addr: SocketAddr, configured: &[String]) -> Option<Vec<String>> {
    let mut hosts: Vec<String> = configured.iter().map(|h| h.to_ascii_lowercase()).collect();
    if addr.ip().is_loopback() {
        for name in ["localhost", "127.0.0.1", "[::1]", &addr.ip().to_string()] {
            hosts.push(name.to_string());
            hosts.push(format!("{name}:{}", addr.port()));
        }
    }
    (!hosts.is_empty()).then_some(hosts)
}

/// What `perc serve` starts with besides its configuration.
#[derive(Debug, Default)]
pub struct Start<'a> {
    /// The sled store's directory: [`ADDRESS_FILE`] is written there while it runs.
    pub data: Option<&'a Path>,
    /// The write endpoints' token (see [`token`]).
    pub token: Option<String>,
    /// Seeds to add once it listens (`--seeds`), as `POST /v1/seeds` adds them, with the
    /// prefixes that narrow their scope.
    pub seeds: Vec<Url>,
    pub prefixes: Vec<String>,
}

/// A status read: when it ran, and what it found.
struct StatusRead {
    ran: Span,
    /// The wall clock's ms when it started (`read_ms` in `/v1/status`).
    read_ms: u64,
    status: perc_pipeline::Status,
}

/// When a status read started and ended.
struct Span {
    started: Instant,
    ended: Instant,
}

/// A status read that took T answers the requests of the next `STATUS_REUSE` × T as well,
/// once T is over [`STATUS_REUSE_FROM`]: however many clients poll (a status page asks every
/// [`STATUS_POLL_MS`], a metrics scraper, scripts), a server spends at most a fifth of its
/// time reading its status.
const STATUS_REUSE: u32 = 4;
/// Reads quicker than this are never reused but by requests that came while they ran: on a
/// small store every status is fresh.
const STATUS_REUSE_FROM: Duration = Duration::from_millis(100);

impl Span {
    /// Whether this read may answer a request that came at `arrived`: it started after the
    /// request came (it is as fresh as a read of its own), or it was slow and is recent.
    fn answers(&self, arrived: Instant, now: Instant) -> bool {
        let took = self.ended.saturating_duration_since(self.started);
        self.started >= arrived
            || (took >= STATUS_REUSE_FROM
                && now.saturating_duration_since(self.ended) < took * STATUS_REUSE)
    }
}

/// The write endpoints' token: `serve.token`, else the one in `DATA/serve.token`, made
/// (64 hex digits, mode 0600) if there is none; `None` with neither a token nor a data
/// directory (a shared Bigtable store with no token configured).
pub fn token(config: &ServeConfig, data: Option<&Path>) -> Result<Option<String>, PipelineError> {
    if !config.token.is_empty() {
        return Ok(Some(config.token.clone()));
    }
    let Some(dir) = data else { return Ok(None) };
    let path = dir.join(TOKEN_FILE);
    match std::fs::read_to_string(&path) {
        Ok(t) if !t.trim().is_empty() => return Ok(Some(t.trim().to_string())),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(format!("cannot read {}", path.display()))(e)),
    }
    let bytes: [u8; 32] = rand::random();
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(io(format!("cannot write {}", path.display())))?;
    f.write_all(format!("{token}\n").as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(io(format!("cannot write {}", path.display())))?;
    Ok(Some(token))
}

/// Serves `app` on `listener` until `stop`: runs the observers, answers the API, then stops
/// both (requests in flight get `serve.shutdown_ms` to finish) and closes the store. `ready`
/// is called with the address once [`ADDRESS_FILE`] is written (see [`Start`]); the seeds
/// are added then, and their sitemaps read while it serves.
pub async fn run(
    app: Pipeline,
    config: &ServeConfig,
    listener: tokio::net::TcpListener,
    start: Start<'_>,
    stop: CancellationToken,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), PipelineError> {
    let Start { data, token, seeds, prefixes } = start;
    let addr = listener.local_addr().map_err(io("cannot read the listening address"))?;
    let listener = listener.into_std().map_err(io("cannot hand over the listener"))?;
    // Installed before the workers start, so that their runs are recorded.
    metrics::recorder();
    let app = Arc::new(app);
    let search = match app.config().search.enabled {
        true => {
            let dir = SearchIndex::path_for(&app.config().store.data);
            let index = SearchIndex::open(dir.as_deref())
                .map_err(|e| PipelineError::Setup(e.to_string()))?;
            Some(Arc::new(index))
        }
        false => None,
    };
    // The seeds are in the store before anything runs (one transaction: a full disk or a
    // bad prefix fails here, before the address is published).
    let seeded = match seeds.is_empty() {
        true => None,
        false => Some((app.extend_seeds(&seeds, &prefixes).await?.1, seeds)),
    };
    // The API runs on threads of its own: an observer run that parses a big page holds its
    // worker thread for milliseconds, and a request queued behind it would wait as long;
    // the kernel shares the cores between the two runtimes' threads instead. The index is
    // kept on threads of its own at a lower priority (`serve.indexing_nice`): otherwise a
    // request that finds both cores parsing pages waits for a time slice of theirs. (A
    // runtime is shut down, not dropped, on the way out: this is an async context.)
    let api = runtime("perc-api", Some(config.api_threads), 0)?;
    let indexing = match runtime("perc-index", None, config.indexing_nice) {
        Ok(rt) => rt,
        Err(e) => {
            api.shutdown_background();
            return Err(e);
        }
    };
    // Every step that may fail is behind: the address is published now, and removed at
    // the end.
    let address_file = match data.map(|dir| write_address(dir, addr)).transpose() {
        Ok(file) => file,
        Err(e) => {
            api.shutdown_background();
            indexing.shutdown_background();
            return Err(e);
        }
    };
    ready(addr);
    let indexer = match &search {
        Some(index) => {
            let (app, index, stop) = (app.clone(), index.clone(), stop.clone());
            let rt = indexing.handle().clone();
            Some(indexing.spawn_blocking(move || index_loop(&app, &index, &stop, &rt)))
        }
        None => None,
    };
    let state = Arc::new(Served {
        app: app.clone(),
        search,
        searching: tokio::sync::Semaphore::new(config.api_threads),
        rates: Default::default(),
        query_bytes_max: usize::try_from(config.body_bytes_max).unwrap_or(usize::MAX),
        token: token.map(|t| blake3::hash(t.as_bytes())),
        last_status: tokio::sync::Mutex::new(None),
        exports: Arc::new(tokio::sync::Semaphore::new(config.exports_max.max(1))),
        stall: Duration::from_millis(config.stall_ms),
        background: indexing.handle().clone(),
        hosts: allowed_hosts(addr, &config.hosts),
    });
    if let Some((scope, seeds)) = seeded {
        state.read_sitemaps(seeds, scope);
    }
    let router = router(state.clone(), config);
    let shutdown = stop.clone();
    let grace = Duration::from_millis(config.shutdown_ms);
    let stopping = stop.clone();
    let bounds = listen::Bounds {
        header_timeout: Duration::from_millis(config.header_timeout_ms),
        connections_max: config.connections_max,
    };
    let serving = api.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let serving = listen::serve(listener, router, bounds, shutdown);
        tokio::pin!(serving);
        // Requests in flight get the grace period once a stop is asked for.
        tokio::select! {
            () = &mut serving => {}
            () = stop_then(grace, &stopping) => {}
        }
        Ok::<_, std::io::Error>(())
    });
    let server =
        async move { serving.await.unwrap_or_else(|e| Err(std::io::Error::other(e.to_string()))) };
    let indexed = async {
        if let Some(indexer) = indexer {
            let _ = indexer.await;
        }
    };
    let working = {
        let (app, stop) = (app.clone(), stop.clone());
        indexing.spawn(async move { app.work(&stop).await })
    };
    // The workers ending on an error (a full disk) stop the whole server with it: answering
    // 500 to every request while nothing is indexed is no way to fail.
    let worked = async {
        let worked = working
            .await
            .unwrap_or_else(|e| Err(PipelineError::Setup(format!("the workers: {e}"))));
        if worked.is_err() {
            stop.cancel();
        }
        worked
    };
    let (worked, served, (), (), ()) =
        tokio::join!(worked, server, recrawl(&app, &stop), indexed, sample_rates(&state, &stop));
    drop(state);
    api.shutdown_background();
    indexing.shutdown_background();
    if let Some(f) = address_file {
        let _ = std::fs::remove_file(f);
    }
    match Arc::try_unwrap(app) {
        Ok(app) => app.close().await?,
        Err(_) => tracing::warn!("a request still holds the index; the store closes at exit"),
    }
    worked?;
    served.map_err(io("the HTTP server failed"))
}

/// A multi-threaded runtime whose threads are named `name` (`threads` of them, else one a
/// core) and run `nice` steps below the process's priority.
fn runtime(
    name: &'static str,
    threads: Option<usize>,
    nice: i32,
) -> Result<tokio::runtime::Runtime, PipelineError> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        b.worker_threads(n);
    }
    b.on_thread_start(move || lower_priority(nice));
    b.thread_name(name).enable_all().build().map_err(io(format!("cannot start {name}'s threads")))
}

/// Lowers the calling thread's priority by `nice` steps from the process's (Linux keeps a
/// nice value for each thread; raising it needs no privilege). Where it cannot, the thread
/// keeps its priority: the index is then only slower to yield to the API, so this is
/// logged and not an error.
fn lower_priority(nice: i32) {
    if nice == 0 {
        return;
    }
    let me = Some(rustix::thread::gettid());
    let lowered = rustix::process::getpriority_process(me)
        .and_then(|now| rustix::process::setpriority_process(me, (now + nice).min(19)));
    if let Err(e) = lowered {
        tracing::debug!(error = %e, nice, "cannot lower an indexing thread's priority");
    }
}

/// The recrawl scheduler: every `recrawl.tick_ms`, asks again for the URLs that are due
/// (the fetch observer reschedules each). An error is logged and tried again next tick.
async fn recrawl(app: &Pipeline, stop: &CancellationToken) {
    let tick = Duration::from_millis(app.config().recrawl.tick_ms);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(tick) => {}
        }
        match app.recrawl_due().await {
            Ok(0) => {}
            Ok(n) => tracing::debug!("recrawl: {n} URLs due"),
            Err(e) => {
                app.note(&e);
                tracing::warn!(error = %e, "recrawl: cannot ask for the due URLs");
            }
        }
    }
}

/// One point of the status page's chart: this process's fetches and parses a second over
/// the [`RATE_SAMPLE_MS`] before `ms`.
#[derive(Clone, Copy, Debug, serde::Serialize)]
struct Rate {
    ms: u64,
    fetched_per_s: f64,
    parsed_per_s: f64,
}

/// How often the rates are sampled, and how many samples are kept (10 minutes).
const RATE_SAMPLE_MS: u64 = 2_000;
const RATES_KEPT: usize = 300;

/// Samples this process's fetch runs and parse commits every [`RATE_SAMPLE_MS`] (counters
/// in memory: no store read) into `served.rates`, until `stop`.
async fn sample_rates(served: &Served, stop: &CancellationToken) {
    let counts = || {
        let stats = served.app.observer_stats();
        let of = |name: &str| stats.iter().find(|s| s.name == name);
        (of("fetch").map_or(0, |s| s.runs), of("parse").map_or(0, |s| s.commits))
    };
    let mut last = (served.app.now_ms(), counts());
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(RATE_SAMPLE_MS)) => {}
        }
        let now = (served.app.now_ms(), counts());
        let secs = (now.0.saturating_sub(last.0) as f64 / 1000.0).max(0.001);
        let rate = Rate {
            ms: now.0,
            fetched_per_s: now.1 .0.saturating_sub(last.1 .0) as f64 / secs,
            parsed_per_s: now.1 .1.saturating_sub(last.1 .1) as f64 / secs,
        };
        last = now;
        let mut rates = served.rates.lock().unwrap_or_else(|p| p.into_inner());
        if rates.len() == RATES_KEPT {
            rates.pop_front();
        }
        rates.push_back(rate);
    }
}

/// The search indexer, on a thread of its own (tantivy's commits block): brings the index
/// up to date with the store every `search.tick_ms` until `stop`. An error is logged and
/// tried again next tick; the queue keeps what was not indexed.
fn index_loop(
    app: &Pipeline,
    index: &SearchIndex,
    stop: &CancellationToken,
    rt: &tokio::runtime::Handle,
) {
    let search = &app.config().search;
    let tick = Duration::from_millis(search.tick_ms);
    let batch = usize::try_from(search.batch).unwrap_or(usize::MAX);
    while !stop.is_cancelled() {
        match rt.block_on(index.catch_up(app, batch, stop)) {
            Ok(None) => break,
            Ok(Some((0, 0))) => {}
            Ok(Some((built, applied))) => tracing::debug!(built, applied, "search: indexed"),
            Err(e) => {
                if let SearchError::Pipeline(p) = &e {
                    app.note(p);
                }
                tracing::warn!(error = %e, "search: cannot bring the index up to date");
            }
        }
        rt.block_on(async {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(tick) => {}
            }
        });
    }
}

/// Returns `grace` after `stop` is cancelled.
async fn stop_then(grace: Duration, stop: &CancellationToken) {
    stop.cancelled().await;
    tokio::time::sleep(grace).await;
}

/// Writes [`ADDRESS_FILE`] in `dir` (a temporary file renamed over it); its path.
fn write_address(dir: &Path, addr: SocketAddr) -> Result<PathBuf, PipelineError> {
    let path = dir.join(ADDRESS_FILE);
    let tmp = dir.join(format!("{ADDRESS_FILE}.tmp"));
    let body = serde_json::json!({"addr": addr.to_string(), "pid": std::process::id()});
    std::fs::write(&tmp, format!("{body}\n"))
        .map_err(io(format!("cannot write {}", tmp.display())))?;
    std::fs::rename(&tmp, &path).map_err(io(format!("cannot write {}", path.display())))?;
    Ok(path)
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PipelineError {
    let what = what.into();
    move |cause| PipelineError::Io { what, cause }
}

fn router(state: Arc<Served>, config: &ServeConfig) -> Router {
    let limit = Duration::from_millis(config.request_timeout_ms);
    let body_max = usize::try_from(config.body_bytes_max).unwrap_or(usize::MAX);
    Router::new()
        .route("/v1/canonical", get(canonical))
        .route("/v1/page", get(page))
        .route("/v1/status", get(status))
        .route("/v1/export", get(export))
        .route("/v1/search", get(search))
        .route("/metrics", get(scrape))
        .route("/", get(page_of_status))
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
    let started = std::time::Instant::now();
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
struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
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

impl Served {
    /// `perc status`'s read for the status endpoints: one at a time, and a slow one reused
    /// for a while ([`STATUS_REUSE`]). On a big store the read scans every page row and the
    /// lock and lease families (2.3 s at 20,000 pages: docs/benchmarks.md, "serve"); without
    /// this, a status page polling every 2 s would keep reads piling up on each other.
    /// Also when the read started, in the wall clock's ms.
    async fn read_status(&self) -> Result<(perc_pipeline::Status, u64), ApiError> {
        let arrived = Instant::now();
        let mut last = self.last_status.lock().await;
        if let Some(read) = last.as_ref().filter(|r| r.ran.answers(arrived, Instant::now())) {
            return Ok((read.status.clone(), read.read_ms));
        }
        let (started, read_ms) = (Instant::now(), self.app.now_ms());
        let status = status_off_the_api(&self.app).await?;
        let ran = Span { started, ended: Instant::now() };
        *last = Some(StatusRead { ran, read_ms, status: status.clone() });
        Ok((status, read_ms))
    }

    /// `/v1/status`'s JSON: `perc status`'s, and what a server knows besides: the search
    /// index's documents, the recrawl's lag and next URLs, each host's politeness state,
    /// the fetch and parse rates of the last minutes.
    async fn status_json(
        &self,
        status: perc_pipeline::Status,
        read_ms: u64,
    ) -> Result<serde_json::Value, ApiError> {
        let mut v = status.to_json();
        v["read_ms"] = read_ms.into();
        if let Some(index) = &self.search {
            // Caught up: no queue row waits (the indexer deletes its rows once its index
            // has committed what they asked for).
            let caught_up = self.app.search_caught_up().await?;
            v["search"] = serde_json::json!({
                "documents": index.len(),
                "caught_up": caught_up,
                "indexed_ms": index.caught_up_ms(),
            });
        }
        let (lag_ms, next) = self.app.recrawl_queue(NEXT_RECRAWLS).await?;
        let next: Vec<serde_json::Value> = next
            .into_iter()
            .map(|(ms, url)| serde_json::json!({"url": url, "due_ms": ms}))
            .collect();
        v["recrawl"] = serde_json::json!({"lag_s": lag_ms as f64 / 1000.0, "next": next});
        v["politeness"] = self
            .app
            .host_states()
            .into_iter()
            .map(|h| {
                serde_json::json!({
                    "host": h.host, "in_flight": h.in_flight,
                    "delay_ms": h.delay_ms, "wait_ms": h.wait_ms,
                })
            })
            .collect();
        let rates: Vec<Rate> =
            self.rates.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect();
        v["rates"] = serde_json::json!(rates);
        v["now_ms"] = self.app.now_ms().into();
        Ok(v)
    }

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
    fn read_sitemaps(&self, seeds: Vec<Url>, scope: perc_pipeline::CrawlScope) {
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

type Answer = Result<Response, ApiError>;

/// The one parameter `name` of a query string: 414 over the cap, 400 missing, repeated or
/// not UTF-8.
fn param(query: Option<&str>, name: &str, max: usize) -> Result<String, ApiError> {
    optional_param(query, name, max)?.ok_or_else(|| {
        ApiError::new(StatusCode::BAD_REQUEST, format!("missing query parameter {name}"))
    })
}

/// The parameter `name` if it is there: 414 over the cap, 400 repeated or not UTF-8 (a
/// parameter is never decoded lossily: a URL with its bytes replaced is another URL).
fn optional_param(query: Option<&str>, name: &str, max: usize) -> Result<Option<String>, ApiError> {
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

/// `GET /v1/search?q=Q&limit=N`: `{"query", "hits": [{url, title, score, in_degree}]}`, the
/// best N (10 unless given; at most `search.limit_max`) first.
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
    let index = s.search.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this server keeps no search index (search.enabled = false)",
        )
    })?;
    let q2 = query.clone();
    let bounds = perc_search::QueryLimits::from(&s.app.config().search);
    let _turn = s.searching.acquire().await.expect("the semaphore is never closed");
    let hits = tokio::task::spawn_blocking(move || index.search(&q2, limit as usize, bounds))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| match e {
            SearchError::Query(why) => ApiError::new(StatusCode::BAD_REQUEST, why),
            other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
        })?;
    Ok(Json(serde_json::json!({"query": query, "hits": hits})).into_response())
}

/// `perc status`'s read on a blocking thread, so that the API's threads go on answering the
/// small questions meanwhile: it scans the page rows, and counts locks and leases with scans
/// of their families over the whole table (seconds on a big sled store: docs/benchmarks.md,
/// "serve").
async fn status_off_the_api(app: &Arc<Pipeline>) -> Result<perc_pipeline::Status, ApiError> {
    let (app, rt) = (app.clone(), tokio::runtime::Handle::current());
    match tokio::task::spawn_blocking(move || rt.block_on(app.status())).await {
        Ok(status) => Ok(status?),
        Err(e) => Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
    }
}

/// The recrawls `/v1/status` lists.
const NEXT_RECRAWLS: usize = 10;

/// The status page.
const STATUS_PAGE: &str = include_str!("status.html");

/// How often the status page asks `/v1/status` again.
const STATUS_POLL_MS: u64 = 2_000;

/// `GET /`: the status page (docs/serve.md, "Status page"): the numbers as they are now,
/// rendered here, and a small script that asks `/v1/status` every [`STATUS_POLL_MS`] and
/// redraws them, the chart and the tables.
async fn page_of_status(State(s): State<Arc<Served>>) -> Answer {
    let (st, _) = s.read_status().await?;
    let (lag_ms, _) = s.app.recrawl_queue(1).await?;
    let documents = s.search.as_ref().map_or_else(|| "off".to_string(), |i| i.len().to_string());
    let html = STATUS_PAGE
        .replace("{{data}}", &escape(&s.app.config().store.data))
        .replace("{{pages}}", &st.report.pages.to_string())
        .replace("{{fetched}}", &st.report.fetched.to_string())
        .replace("{{waiting}}", &st.report.waiting.to_string())
        .replace("{{pending}}", &st.pending.to_string())
        .replace("{{clusters}}", &st.report.duplicate_clusters.to_string())
        .replace("{{documents}}", &documents)
        .replace("{{lag}}", &format!("{:.1}", lag_ms as f64 / 1000.0))
        .replace("{{poll_ms}}", &STATUS_POLL_MS.to_string());
    Ok(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response())
}

/// Text for HTML.
fn escape(raw: &str) -> String {
    raw.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// `GET /metrics`: Prometheus text (see [`metrics`]).
async fn scrape(State(s): State<Arc<Served>>) -> Answer {
    let (status, _) = s.read_status().await?;
    let text = metrics::render(&s.app, status, s.search.as_deref()).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
}

/// `GET /v1/status`: `perc status` as JSON, and the documents of the search index;
/// `?format=text`: the text `perc status` prints.
async fn status(State(s): State<Arc<Served>>, RawQuery(q): RawQuery) -> Answer {
    let text = match optional_param(q.as_deref(), "format", s.query_bytes_max)?.as_deref() {
        None | Some("json") => false,
        Some("text") => true,
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("format {other:?}: it is json or text"),
            ))
        }
    };
    let (status, read_ms) = s.read_status().await?;
    if text {
        let text = status.to_text();
        return Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response());
    }
    Ok(Json(s.status_json(status, read_ms).await?).into_response())
}

/// `GET /v1/export`: the export as JSON Lines, streamed: the bytes `perc export` writes. The
/// export hands its lines to a callback; each waits (`block_in_place`, so the runtime's other
/// tasks go on) until the response has room: memory holds a few lines, not the export. At
/// most `serve.exports_max` stream at once (503 beyond), and a client that takes no line for
/// `serve.stall_ms` is cut off, which ends the export's snapshot too.
async fn export(State(s): State<Arc<Served>>) -> Answer {
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
        let result = app
            .export(|line| {
                let mut text = serde_json::to_vec(&line).expect("serializable");
                text.push(b'\n');
                // A client that went away, or stalled, ends the export.
                let sent = tokio::task::block_in_place(|| {
                    rt.block_on(tx2.send_timeout(Ok(Bytes::from(text)), stall))
                });
                sent.map_err(|_| PipelineError::Interrupted)
            })
            .await;
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
    use perc_pipeline::{Config, Fetching};
    use perc_store::{Call, Hook, Hooked, MemStore, Store};

    /// Once armed, freezes every scan, and says when the first one came.
    struct FrozenScans(Arc<tokio::sync::Notify>, Arc<std::sync::atomic::AtomicBool>);

    #[async_trait::async_trait]
    impl Hook for FrozenScans {
        async fn before(&self, call: Call<'_>) {
            let armed = self.1.load(std::sync::atomic::Ordering::SeqCst);
            if armed && matches!(call, Call::Scan(_) | Call::ScanMany(_)) {
                self.0.notify_one();
                std::future::pending::<()>().await;
            }
        }
    }

    #[test]
    fn a_stop_ends_the_search_index_build_in_its_tracks() {
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        let scanned = Arc::new(tokio::sync::Notify::new());
        let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let app = rt.block_on(async {
            let mut config = Config::defaults();
            config.store.backend = perc_pipeline::Backend::Memory;
            let hook = FrozenScans(scanned.clone(), armed.clone());
            let store = Hooked::new(MemStore::new(perc_notify::schema()), hook);
            let store: Arc<dyn Store> = Arc::new(store);
            Pipeline::builder(config).store(store).fetching(Fetching::Offline).open().await
        });
        let app = Arc::new(app.unwrap());
        let index = Arc::new(SearchIndex::open(None).unwrap());
        armed.store(true, std::sync::atomic::Ordering::SeqCst);
        let stop = CancellationToken::new();
        let (done, returned) = std::sync::mpsc::channel();
        let looping = {
            let (app, index, stop, handle) =
                (app.clone(), index.clone(), stop.clone(), rt.handle().clone());
            std::thread::spawn(move || {
                index_loop(&app, &index, &stop, &handle);
                done.send(()).unwrap();
            })
        };
        // The build's first scan is frozen: only the stop can end the loop now.
        rt.block_on(scanned.notified());
        stop.cancel();
        assert!(
            returned.recv_timeout(Duration::from_secs(60)).is_ok(),
            "the loop did not end on the stop"
        );
        looping.join().unwrap();
    }

    fn read(started_ms: u64, took_ms: u64, base: Instant) -> Span {
        let started = base + Duration::from_millis(started_ms);
        Span { started, ended: started + Duration::from_millis(took_ms) }
    }

    #[test]
    fn a_status_read_answers_who_came_before_it_and_a_slow_one_a_while_longer() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // A quick read answers only the requests that came before it started.
        let quick = read(1_000, 5, t0);
        assert!(quick.answers(at(900), at(1_010)));
        assert!(quick.answers(at(1_000), at(1_010)));
        assert!(!quick.answers(at(1_001), at(1_006)));
        // A read of 2 s answers for 8 s after it ended, not longer.
        let slow = read(1_000, 2_000, t0);
        assert!(slow.answers(at(3_500), at(3_500)));
        assert!(slow.answers(at(10_999), at(10_999)));
        assert!(!slow.answers(at(11_000), at(11_000)));
    }

    /// A server of `pages` pages loaded into a memory store, with `exports_max` exports at
    /// once and `stall_ms`.
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
            let stalled = export(State(s.clone())).await.unwrap();
            assert_eq!(stalled.status(), StatusCode::OK);
            let mut body = stalled.into_body().into_data_stream();
            let first = body.next().await.unwrap().unwrap();
            assert!(first.starts_with(b"{\"url\":\"http://h.test/p0\""), "{first:?}");
            // The client reads no more: the export holds its turn until it is cut off.
            let refused = export(State(s.clone())).await.unwrap_err();
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
            let whole = export(State(s.clone())).await.unwrap();
            let bytes = axum::body::to_bytes(whole.into_body(), usize::MAX).await.unwrap();
            assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), 300);
        });
    }
}
