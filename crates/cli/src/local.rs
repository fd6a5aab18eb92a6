//! The commands that open the store in this process, do their work and end: crawl,
//! canonical, page, search, export, refetch, status, wait, compact; and generate, which
//! needs no store. (On a store that `perc serve` holds, the ones that ask the index go
//! through its API instead: [`crate::remote`].)

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use perc_pipeline::{config, CrawlScope, Create, Fetching, Pipeline, PipelineError};
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::files::{write_export, Exported};
use crate::input::{crawl_scope, parse_url, read_seeds, search_limit};

/// `perc crawl`.
pub(crate) async fn crawl_command(
    config: config::Config,
    seeds: &Path,
    prefixes: &[String],
    warc_out: Option<&Path>,
    append: bool,
    stop: &CancellationToken,
) -> Result<ExitCode> {
    let seeds = read_seeds(seeds, config.crawl.seeds_max)?;
    let scope = crawl_scope(&config, &seeds, prefixes)?;
    let recorder = warc_out.map(|p| perc_pipeline::Recorder::create(p, append)).transpose()?;
    let app =
        crate::open(config, Fetching::Live { warc_out: recorder }, Create::IfMissing, "crawl")
            .await?;
    let result = crawl(&app, &seeds, &scope, stop).await;
    app.close().await?;
    result
}

/// `perc canonical URL`.
pub(crate) async fn canonical(config: config::Config, url: &str) -> Result<ExitCode> {
    let url = parse_url(url)?;
    let app = existing!(config, Fetching::Offline, "canonical");
    let answer = app.canonical(&url).await?;
    app.close().await?;
    match answer {
        Ok(c) => {
            out!("{c}");
            Ok(ExitCode::SUCCESS)
        }
        Err(why) => {
            say!("{why}");
            Ok(ExitCode::from(1))
        }
    }
}

/// `perc page URL`.
pub(crate) async fn page(config: config::Config, url: &str) -> Result<ExitCode> {
    let url = parse_url(url)?;
    let app = existing!(config, Fetching::Offline, "page");
    let record = app.page_json(&url).await?;
    app.close().await?;
    match record {
        Some(record) => out!("{record}"),
        None => {
            say!("{url} is not known to this index");
            return Ok(ExitCode::from(1));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `perc search QUERY…`.
pub(crate) async fn search_command(
    config: config::Config,
    query: &[String],
    filter: &perc_search::Filter,
    limit: u64,
    stop: &CancellationToken,
) -> Result<ExitCode> {
    let limit = search_limit(&config, limit)?;
    let app = existing!(config, Fetching::Offline, "search");
    let hits = search(&app, &query.join(" "), filter, limit, stop).await;
    app.close().await?;
    print_hits(&query.join(" "), hits?)
}

/// `perc export [--links] --out FILE`.
pub(crate) async fn export(config: config::Config, out: &Path, what: Exported) -> Result<ExitCode> {
    let app = existing!(config, Fetching::Offline, "export");
    let written = write_export(&app, out, what).await;
    app.close().await?;
    let n = written?;
    if out.as_os_str() != "-" {
        out!("exported {n} {} to {}", what.unit(), out.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `perc refetch URL…|--all`.
pub(crate) async fn refetch(
    config: config::Config,
    urls: &[String],
    all: bool,
    stop: &CancellationToken,
) -> Result<ExitCode> {
    let app = existing!(config, Fetching::Live { warc_out: None }, "refetch");
    let targets: Option<Vec<Url>> = if all {
        None
    } else {
        if urls.is_empty() {
            bail!("refetch needs URLs, or --all");
        }
        Some(urls.iter().map(|u| parse_url(u)).collect::<Result<_>>()?)
    };
    let result = app.refetch(targets.as_deref(), stop).await;
    app.close().await?;
    let r = result?;
    for u in &r.unknown {
        say!("warning: {u} is not known to this index; not fetched");
    }
    out!("refetched {} pages in {:.1}s; {} pages indexed", r.refetched, r.run.seconds, r.pages);
    Ok(if r.unknown.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `perc status`.
pub(crate) async fn status_command(config: config::Config) -> Result<ExitCode> {
    let app = existing!(config, Fetching::Offline, "status");
    let shown = status(&app).await;
    app.close().await?;
    shown?;
    Ok(ExitCode::SUCCESS)
}

/// `perc wait`.
pub(crate) async fn wait(config: config::Config, stop: &CancellationToken) -> Result<ExitCode> {
    let app = existing!(config, Fetching::Live { warc_out: None }, "wait");
    let waited = app.wait(stop).await;
    app.close().await?;
    waited?;
    Ok(ExitCode::SUCCESS)
}

/// `perc compact`.
pub(crate) async fn compact(config: config::Config, stop: &CancellationToken) -> Result<ExitCode> {
    let data = config.store.data.clone();
    let done = match perc_pipeline::compact(config, stop).await {
        Err(e @ PipelineError::NoStore { .. }) => {
            say!("{e}");
            return Ok(ExitCode::from(1));
        }
        done => done?,
    };
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    out!(
        "compacted {data}: {:.1} MiB -> {:.1} MiB on disk ({} keys; {} old versions \
         collected first; {} blobs no row referred to left behind)",
        mib(done.files.bytes_before),
        mib(done.files.bytes_after),
        done.files.keys,
        done.collected.write_records_removed,
        done.files.blobs_dropped
    );
    Ok(ExitCode::SUCCESS)
}

/// Crawls `seeds` within `scope` until nothing is pending, and says what it did; exit 1
/// when no seed could be fetched.
pub(crate) async fn crawl(
    app: &Pipeline,
    seeds: &[Url],
    scope: &CrawlScope,
    stop: &CancellationToken,
) -> Result<ExitCode> {
    let (s, r) = app.crawl(seeds, scope, stop).await?;
    // The URLs this crawl wanted that were fetched, by this process or by workers elsewhere.
    out!(
        "crawl done in {:.1}s: {} URLs tried this run ({:.1}/s); in the index, {} URLs \
         answered and {} pages indexed",
        s.seconds,
        r.tried,
        r.tried as f64 / s.seconds.max(0.001),
        r.answered,
        r.pages
    );
    if !r.not_pages.is_empty() {
        out!("not pages: {}", perc_pipeline::status_text::by_reason(&r.not_pages));
    }
    if s.failures > 0 {
        say!("{} observer runs failed (perc status lists what is parked)", s.failures);
    }
    if r.seeds_answered == 0 {
        say!("no seed could be fetched (perc page SEED says why)");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints search hits, a JSON object a line; exit 1, saying so, when there is none.
pub(crate) fn print_hits(query: &str, hits: Vec<perc_search::Hit>) -> Result<ExitCode> {
    if hits.is_empty() {
        say!("no page matches {query:?}");
        return Ok(ExitCode::from(1));
    }
    for hit in hits {
        out!("{}", serde_json::to_string(&hit).expect("a hit serializes"));
    }
    Ok(ExitCode::SUCCESS)
}

/// `perc search`: catches the search index up with the store, then asks it. SIGINT/SIGTERM
/// during the catch-up (a first build of a big store takes minutes) stops it there.
async fn search(
    app: &Pipeline,
    query: &str,
    filter: &perc_search::Filter,
    limit: usize,
    stop: &CancellationToken,
) -> Result<Vec<perc_search::Hit>> {
    use perc_search::{SearchError, SearchIndex};
    let below = |e: SearchError| match e {
        SearchError::Pipeline(p) => anyhow::Error::from(p),
        other => anyhow!("{other}"),
    };
    let index = SearchIndex::open(SearchIndex::path_for(&app.config().store.data).as_deref())
        .map_err(below)?;
    let batch = usize::try_from(app.config().search.batch).unwrap_or(usize::MAX);
    if index.catch_up(app, batch, stop).await.map_err(below)?.is_none() {
        return Err(PipelineError::Interrupted.into());
    }
    index.search(query, filter, limit, (&app.config().search).into()).map_err(below)
}

/// Prints `perc status`'s text.
pub(crate) async fn status(app: &Pipeline) -> Result<()> {
    out!("{}", app.status().await?.to_text().trim_end());
    Ok(())
}

/// `perc generate`: a synthetic web written as a site and/or a WARC, or a change of a site
/// written before.
pub(crate) fn generate(
    pages: usize,
    seed: u64,
    site: Option<&Path>,
    warc: Option<&Path>,
    base: &str,
    change: Option<usize>,
    version: u32,
) -> Result<ExitCode> {
    if pages == 0 {
        bail!("--pages must be at least 1");
    }
    let mut spec = perc_synth::Spec::new(pages, seed);
    spec.base = Url::parse(base).with_context(|| format!("--base {base:?} is not a URL"))?;
    let web = perc_synth::Web::new(spec);
    if let Some(k) = change {
        let dir = site.ok_or_else(|| anyhow!("--change needs the --site to change"))?;
        if version == 0 {
            bail!("--version must be at least 1 (0 is the original)");
        }
        let changes = web.change_set(k, u64::from(version));
        perc_synth::write::apply_changes(&web, dir, &changes, version)
            .with_context(|| format!("cannot write into {}", dir.display()))?;
        for (i, _) in changes {
            out!("{}", perc_synth::Web::path(i));
        }
        return Ok(ExitCode::SUCCESS);
    }
    if site.is_none() && warc.is_none() {
        bail!("generate needs --site DIR and/or --warc FILE");
    }
    if let Some(dir) = site {
        perc_synth::write::site(&web, dir)
            .with_context(|| format!("cannot write the site {}", dir.display()))?;
        out!("wrote {pages} pages to {}", dir.display());
    }
    if let Some(file) = warc {
        perc_synth::write::warc(&web, file)
            .with_context(|| format!("cannot write the WARC {}", file.display()))?;
        out!("wrote {pages} pages to {}", file.display());
    }
    Ok(ExitCode::SUCCESS)
}
