//! The commands that run until stopped: `perc oracle`, `perc worker`, `perc serve`, and
//! `perc demo` (which serves its site while it crawls it).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use perc_pipeline::{config, Create, Fetching, PipelineError};
use perc_synth::site;
use tokio_util::sync::CancellationToken;

use crate::input::{crawl_scope, read_seeds};
use crate::local::{crawl, status};

/// `perc oracle`: serves the shared store's timestamps until stopped, or until an oracle
/// opened later takes over (exit 1).
pub(crate) async fn oracle(
    config: config::Config,
    listen: &str,
    stop: &CancellationToken,
) -> Result<ExitCode> {
    let oracle = perc_pipeline::shared_oracle(&config).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    // The address line is what scripts (and the tests) wait for.
    out!("oracle listening on {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    tracing::info!(
        epoch = oracle.epoch(),
        "serving timestamps; an oracle opened later on this store supersedes this one"
    );
    tokio::select! {
        r = perc_pipeline::serve_oracle(listener, oracle) => match r {
            // Another oracle took over the table: not an error of this one, and nothing a
            // restart of this one would mend (exit 1, so a supervisor can tell).
            Err(e) if e.get_ref().is_some_and(|i| i.is::<perc_pipeline::OracleError>()) => {
                say!("perc oracle: {e}; stopping");
                return Ok(ExitCode::from(1));
            }
            r => r?,
        },
        _ = stop.cancelled() => {}
    }
    Ok(ExitCode::SUCCESS)
}

/// `perc worker`: runs the observers on the shared store until stopped.
pub(crate) async fn worker(config: config::Config, stop: &CancellationToken) -> Result<ExitCode> {
    let app =
        crate::open(config, Fetching::Live { warc_out: None }, Create::IfMissing, "worker").await?;
    out!("worker {} running", app.worker_id());
    std::io::stdout().flush()?;
    let worked = app.work(stop).await;
    app.close().await?;
    worked?;
    Ok(ExitCode::SUCCESS)
}

/// The shortest `serve.token` accepted on an address beyond loopback.
pub(crate) const TOKEN_CHARS_MIN: usize = 16;

/// `perc serve`: the index as a service (docs/serve.md) until stopped.
pub(crate) async fn serve(
    config: config::Config,
    seeds: Option<&Path>,
    prefixes: &[String],
    listen: Option<String>,
    stop: CancellationToken,
) -> Result<ExitCode> {
    let seeds = seeds.map(|s| read_seeds(s, config.crawl.seeds_max)).transpose()?;
    let listen = listen.unwrap_or_else(|| config.serve.listen.clone());
    let addr: std::net::SocketAddr = listen.parse().map_err(|e| {
        anyhow!("listen address {listen:?}: {e} (give host:port, e.g. 127.0.0.1:8420)")
    })?;
    if !addr.ip().is_loopback() && config.serve.token.chars().count() < TOKEN_CHARS_MIN {
        bail!(
            "refusing to listen on {addr}: not a loopback address, and serve.token is {} (set \
             one of {TOKEN_CHARS_MIN} characters or more: anyone who reaches the address could \
             add seeds)",
            match config.serve.token.is_empty() {
                true => "empty",
                false => "too short",
            }
        );
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let data =
        (config.store.backend == config::Backend::Sled).then(|| PathBuf::from(&config.store.data));
    let serve_config = config.serve.clone();
    if let Some(seeds) = &seeds {
        // Bad prefixes fail here, before the store is opened.
        crawl_scope(&config, seeds, prefixes)?;
    }
    // Said before the store is opened: a command run meanwhile asks this server.
    let bound = listener.local_addr().context("cannot read the listening address")?;
    let claim = data.as_deref().map(|d| perc_serve::Claim::take(d, bound)).transpose()?;
    let Some(app) = open_waiting(config, &stop).await? else {
        return Err(PipelineError::Interrupted.into());
    };
    let token = perc_serve::token(&serve_config, data.as_deref())?;
    let start = perc_serve::Start {
        claim,
        token,
        seeds: seeds.unwrap_or_default(),
        prefixes: prefixes.to_vec(),
        allocator: Some(crate::allocator_figures),
    };
    perc_serve::run(app, &serve_config, listener, start, stop, |addr| {
        // A closed stdout loses the line, and nothing else: the address is in serve.json.
        let _ = writeln!(std::io::stdout(), "perc serve: listening on http://{addr}");
        let _ = std::io::stdout().flush();
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

/// How long `perc serve` waits for a store another process holds: a command such as `perc
/// status` holds it for well under a second; a crawl, for longer than a server should wait.
const STORE_WAIT: Duration = Duration::from_secs(30);

/// Opens the store for `perc serve`, waiting up to [`STORE_WAIT`] while another process holds
/// it; `None` if stopped meanwhile.
async fn open_waiting(
    config: config::Config,
    stop: &CancellationToken,
) -> Result<Option<perc_pipeline::Pipeline>, PipelineError> {
    let began = Instant::now();
    let mut said = false;
    loop {
        let opened = crate::open(
            config.clone(),
            Fetching::Live { warc_out: None },
            Create::IfMissing,
            "serve",
        )
        .await;
        match opened {
            Err(PipelineError::InUse(_)) if began.elapsed() < STORE_WAIT => {
                if !said {
                    say!("perc serve: another process holds the store; waiting for it");
                    said = true;
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    () = stop.cancelled() => return Ok(None),
                }
            }
            opened => return opened.map(Some),
        }
    }
}

/// `perc demo`: serves the demo site, crawls it, and shows what perc answers about it.
pub(crate) async fn demo(
    config: config::Config,
    site: &Path,
    listen: std::net::SocketAddr,
    stop: &CancellationToken,
) -> Result<ExitCode> {
    if !site.is_dir() {
        bail!(
            "the demo site {} does not exist (run from the repository's top directory)",
            site.display()
        );
    }
    let served = site::serve_on(site, listen).await.with_context(|| {
        format!(
            "cannot serve the demo site at {listen}: `perc demo --listen 127.0.0.1:PORT` picks \
             another address (a store kept from an earlier demo knows the site's pages at the \
             address they were crawled at)"
        )
    })?;
    let base = served.base();
    out!("serving {} at {base}", site.display());
    let seeds = std::slice::from_ref(&base);
    let scope = crawl_scope(&config, seeds, &[])?;
    let app =
        crate::open(config, Fetching::Live { warc_out: None }, Create::IfMissing, "demo").await?;
    crawl(&app, seeds, &scope, stop).await?;
    out!();
    for path in
        ["", "about.html", "copy-of-about.html", "old-about", "missing.html", "private/secret.html"]
    {
        let url = base.join(path)?;
        match app.canonical(&url).await? {
            Ok(c) => out!("perc canonical {url}\n  -> {c}"),
            Err(why) => out!("perc canonical {url}\n  -> ({why})"),
        }
    }
    out!();
    status(&app).await?;
    app.close().await?;
    Ok(ExitCode::SUCCESS)
}
