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
//! While it runs, `DATA/serve.json` says where it listens: written once bound, before the
//! store is opened, and removed at a clean stop (see [`Claim`]). Beside the API: a search
//! indexer draining the store's search queue into `perc-search`'s index, `GET /metrics`
//! ([`metrics`]) and the status page (`GET /`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use perc_pipeline::config::Serve as ServeConfig;
use perc_pipeline::{Pipeline, PipelineError};
use perc_search::SearchIndex;
use tokio_util::sync::CancellationToken;
use url::Url;

mod api;
mod background;
mod listen;
mod metrics;
mod status;

use api::router;
use background::{index_loop, recrawl, sample_rates, Rate};
use status::StatusRead;

/// The file in the data directory that says where a running server listens.
pub const ADDRESS_FILE: &str = "serve.json";

/// The file in the data directory a running server holds locked: one server a store.
pub const LOCK_FILE: &str = "serve.lock";

/// A server's claim on a sled store's directory, taken once it is bound and before it opens
/// the store: [`LOCK_FILE`] locked for as long as it lives, and [`ADDRESS_FILE`] saying where
/// it listens, removed when the claim is dropped. A command run while the server opens the
/// store finds the address and asks the server, whose answer waits until it serves, rather
/// than failing on the store's lock; a second server on the store is refused at once.
#[derive(Debug)]
pub struct Claim {
    _lock: std::fs::File,
    address: PathBuf,
}

impl Claim {
    /// Claims `dir` (made if missing) for a server listening on `addr`.
    pub fn take(dir: &Path, addr: SocketAddr) -> Result<Claim, PipelineError> {
        std::fs::create_dir_all(dir)
            .map_err(io(format!("cannot create the data directory {}", dir.display())))?;
        let path = dir.join(LOCK_FILE);
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io(format!("cannot open {}", path.display())))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let there = std::fs::read_to_string(dir.join(ADDRESS_FILE))
                    .ok()
                    .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                    .and_then(|v| v["addr"].as_str().map(|a| format!(" on {a}")))
                    .unwrap_or_default();
                return Err(PipelineError::Setup(format!(
                    "another perc serve serves the store at {}{there}",
                    dir.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(io(format!("cannot lock {}", path.display()))(e))
            }
        }
        let address = write_address(dir, addr)?;
        Ok(Claim { _lock: lock, address })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.address);
    }
}

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
    /// The allocator's figures for `GET /metrics` and `/v1/status` ([`Start::allocator`]).
    allocator: Option<AllocatorFigures>,
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
pub struct Start {
    /// The claim on the sled store's directory, held until the server stops.
    pub claim: Option<Claim>,
    /// The write endpoints' token (see [`token`]).
    pub token: Option<String>,
    /// Seeds to add once it listens (`--seeds`), as `POST /v1/seeds` adds them, with the
    /// prefixes that narrow their scope.
    pub seeds: Vec<Url>,
    pub prefixes: Vec<String>,
    /// The process allocator's figures, bytes by kind (`allocated`, `resident`, ...), for
    /// `GET /metrics` and `/v1/status`: the binary knows its global allocator, this crate
    /// does not.
    pub allocator: Option<AllocatorFigures>,
}

/// The process allocator's figures: bytes by kind.
pub type AllocatorFigures = fn() -> Vec<(&'static str, u64)>;

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
/// is called with the address once it is about to answer; the seeds are added before, and
/// their sitemaps read while it serves. The [`Claim`] in `start` goes at the end.
pub async fn run(
    app: Pipeline,
    config: &ServeConfig,
    listener: tokio::net::TcpListener,
    start: Start,
    stop: CancellationToken,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), PipelineError> {
    let Start { claim, token, seeds, prefixes, allocator } = start;
    let addr = listener.local_addr().map_err(io("cannot read the listening address"))?;
    let listener = listener.into_std().map_err(io("cannot hand over the listener"))?;
    // Installed before the workers start, so that their runs are recorded.
    metrics::recorder();
    let app = Arc::new(app);
    let search = open_search(&app)?;
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
    let (api, indexing) = runtimes(config)?;
    ready(addr);
    let indexed = spawn_indexer(&app, search.as_ref(), &stop, &indexing);
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
        allocator,
    });
    if let Some((scope, seeds)) = seeded {
        state.read_sitemaps(seeds, scope);
    }
    let serving = api.spawn(serve_api(
        listener,
        router(state.clone(), config),
        listen::Bounds::of(config),
        stop.clone(),
    ));
    let server =
        async move { serving.await.unwrap_or_else(|e| Err(std::io::Error::other(e.to_string()))) };
    let working = {
        let (app, stop) = (app.clone(), stop.clone());
        // A bulk load killed before its end left the ranks deferred: settled first (at what
        // the store holds; the rank runs correct what changes after).
        indexing.spawn(async move {
            app.settle_ranks().await?;
            app.work(&stop).await
        })
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
    let (worked, served, (), (), (), ()) = tokio::join!(
        worked,
        server,
        recrawl(&app, &stop),
        indexed,
        sample_rates(&state, &stop),
        metrics::keep_up(metrics::UPKEEP_EVERY, &stop)
    );
    drop(state);
    api.shutdown_background();
    indexing.shutdown_background();
    drop(claim);
    match Arc::try_unwrap(app) {
        Ok(app) => app.close().await?,
        Err(_) => tracing::warn!("a request still holds the index; the store closes at exit"),
    }
    worked?;
    served.map_err(io("the HTTP server failed"))
}

/// The search indexer on the indexing runtime's blocking threads, when search is on: the
/// future ends when the indexer does.
fn spawn_indexer(
    app: &Arc<Pipeline>,
    search: Option<&Arc<SearchIndex>>,
    stop: &CancellationToken,
    indexing: &tokio::runtime::Runtime,
) -> impl std::future::Future<Output = ()> {
    let indexer = search.map(|index| {
        let (app, index, stop) = (app.clone(), index.clone(), stop.clone());
        let rt = indexing.handle().clone();
        indexing.spawn_blocking(move || index_loop(&app, &index, &stop, &rt))
    });
    async move {
        if let Some(indexer) = indexer {
            let _ = indexer.await;
        }
    }
}

/// The search index beside the store, unless `search.enabled` is off.
fn open_search(app: &Pipeline) -> Result<Option<Arc<SearchIndex>>, PipelineError> {
    if !app.config().search.enabled {
        return Ok(None);
    }
    let dir = SearchIndex::path_for(&app.config().store.data);
    let index =
        SearchIndex::open(dir.as_deref()).map_err(|e| PipelineError::Setup(e.to_string()))?;
    Ok(Some(Arc::new(index)))
}

/// The API's runtime and the indexing's; on an error, what was started is stopped.
fn runtimes(
    config: &ServeConfig,
) -> Result<(tokio::runtime::Runtime, tokio::runtime::Runtime), PipelineError> {
    let api = runtime("perc-api", Some(config.api_threads), 0)?;
    match runtime("perc-index", None, config.indexing_nice) {
        Ok(indexing) => Ok((api, indexing)),
        Err(e) => {
            api.shutdown_background();
            Err(e)
        }
    }
}

/// Answers on `listener` until `stop`, then gives the requests in flight the grace period.
async fn serve_api(
    listener: std::net::TcpListener,
    router: Router,
    bounds: listen::Bounds,
    stop: CancellationToken,
) -> Result<(), std::io::Error> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let serving = listen::serve(listener, router, bounds, stop.clone());
    tokio::pin!(serving);
    tokio::select! {
        () = &mut serving => {}
        () = stop_then(bounds.grace, &stop) => {}
    }
    Ok(())
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
    // The priority the steps count from is the process's, read here once: a thread a lowered
    // thread starts (a blocking task's) starts at its parent's priority, and must not go
    // `nice` steps lower again.
    let base = rustix::process::getpriority_process(None).unwrap_or(0);
    b.on_thread_start(move || lower_priority(base, nice));
    b.thread_name(name).enable_all().build().map_err(io(format!("cannot start {name}'s threads")))
}

/// Sets the calling thread's priority `nice` steps below `base`, the process's (Linux keeps a
/// nice value for each thread; lowering it needs no privilege). Where it cannot, the thread
/// keeps its priority: the index is then only slower to yield to the API, so this is
/// logged and not an error.
fn lower_priority(base: i32, nice: i32) {
    if nice == 0 {
        return;
    }
    let me = Some(rustix::thread::gettid());
    let lowered = rustix::process::setpriority_process(me, (base + nice).min(19));
    if let Err(e) = lowered {
        tracing::debug!(error = %e, nice, "cannot lower an indexing thread's priority");
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
