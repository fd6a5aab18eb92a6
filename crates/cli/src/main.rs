//! `perc`: the binary. Arguments parse once into a validated configuration; the library
//! crates do the work; only this crate prints.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use perc_crawl::warc::Recorded;
use perc_observers::model::CrawlScope;
use perc_observers::PageInfo;
use url::Url;

use perc_cli::app::{App, Fetching};
use perc_cli::{config, site};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "perc",
    version,
    about = "Incremental web indexing on Percolator-style transactions and observers"
)]
struct Cli {
    /// The store directory (overrides store.data).
    #[arg(long, global = true)]
    data: Option<PathBuf>,
    /// A TOML file layered over the embedded defaults.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Overrides one configuration key: --set crawl.max_depth=3 (repeatable).
    #[arg(long = "set", global = true, value_name = "SECTION.KEY=VALUE")]
    sets: Vec<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Crawl and index from a seed list until the frontier is empty and nothing is pending.
    Crawl {
        /// One URL a line; `#` starts a comment.
        #[arg(long)]
        seeds: PathBuf,
        /// Narrows the scope to URLs starting with this (repeatable).
        #[arg(long = "prefix")]
        prefixes: Vec<String>,
        /// Records every request and response into this WARC (.warc.gz).
        #[arg(long)]
        warc_out: Option<PathBuf>,
    },
    /// Load recorded responses from WARC files and index them.
    Replay { files: Vec<PathBuf> },
    /// Print the canonical URL of a page (exit 1 if the page is unknown).
    Canonical { url: String },
    /// Print a page's indexed record as JSON.
    Page { url: String },
    /// Write the export snapshot as JSON Lines, sorted by URL.
    Export {
        #[arg(long)]
        out: PathBuf,
    },
    /// Fetch known pages again and update the index incrementally.
    Refetch {
        urls: Vec<String>,
        #[arg(long)]
        all: bool,
    },
    /// Pages, clusters, pending notifications, per-observer counters.
    Status,
    /// Process pending notifications until none is left.
    Wait,
    /// Write a deterministic synthetic web: a site directory and/or a WARC (see perc-synth).
    Generate {
        /// Pages in the web.
        #[arg(long)]
        pages: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Write it as a site directory (p/<i>.html and _redirects), servable by any server.
        #[arg(long)]
        site: Option<PathBuf>,
        /// Write it as a WARC (.warc.gz) for `perc replay`.
        #[arg(long)]
        warc: Option<PathBuf>,
        /// The URL the WARC's pages live under.
        #[arg(long, default_value = "http://synth.test/")]
        base: String,
        /// Instead: change this many pages of the site already in --site (version --version),
        /// and print their paths, for `perc refetch`.
        #[arg(long)]
        change: Option<usize>,
        #[arg(long, default_value_t = 1)]
        version: u32,
    },
    /// Distributed mode: serve timestamps to every perc process sharing the store.
    Oracle {
        /// Where to listen, host:port (e.g. 127.0.0.1:7070; port 0 picks a free one).
        #[arg(long)]
        listen: String,
    },
    /// Distributed mode: run observers on the shared store until stopped (SIGTERM, Ctrl-C).
    Worker,
    /// Serve the bundled demo site on 127.0.0.1, crawl it, and show what perc knows.
    Demo {
        /// The site directory.
        #[arg(long, default_value = "fixtures/sites/demo")]
        site: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn load_config(cli: &Cli) -> Result<config::Config> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let mut c = config::load(cli.config.as_deref(), &env, &cli.sets)?;
    if let Some(d) = &cli.data {
        c.store.data = d.display().to_string();
    }
    Ok(c)
}

fn parse_url(raw: &str) -> Result<Url> {
    perc_crawl::normalize(raw).map_err(|e| anyhow!(e))
}

/// Reads a seed list: one URL a line, `#` comments, blank lines ignored.
fn read_seeds(path: &Path) -> Result<Vec<Url>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the seed list {}", path.display()))?;
    let mut seeds = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        seeds.push(
            perc_crawl::normalize(line)
                .map_err(|e| anyhow!("{} line {}: {e}", path.display(), n + 1))?,
        );
    }
    if seeds.is_empty() {
        bail!("the seed list {} has no URL", path.display());
    }
    Ok(seeds)
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let config = load_config(&cli)?;
    match cli.command {
        Command::Crawl { seeds, prefixes, warc_out } => {
            let seeds = read_seeds(&seeds)?;
            let recorder =
                warc_out.as_deref().map(perc_crawl::warc::Recorder::create).transpose()?;
            let app = App::open(config, Fetching::Live { warc_out: recorder }).await?;
            crawl(&app, &seeds, &prefixes).await?;
            app.close().await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Replay { files } => {
            if files.is_empty() {
                bail!("replay needs at least one WARC file");
            }
            let app = App::open(config, Fetching::Offline).await?;
            let mut problems = 0;
            let mut loaded = 0;
            for f in &files {
                // Records stream from a reading thread in batches: memory stays flat in the
                // size of the file.
                let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<Recorded>>(4);
                let (path, max) = (f.clone(), app.config.crawl.body_bytes_max);
                let reading = tokio::task::spawn_blocking(move || {
                    let mut batch = Vec::with_capacity(REPLAY_BATCH);
                    let issues = perc_crawl::warc::read_each(&path, max, |r| {
                        batch.push(r);
                        if batch.len() == REPLAY_BATCH {
                            let _ = tx.blocking_send(std::mem::take(&mut batch));
                        }
                    })?;
                    if !batch.is_empty() {
                        let _ = tx.blocking_send(batch);
                    }
                    Ok::<_, std::io::Error>(issues)
                });
                while let Some(batch) = rx.recv().await {
                    loaded += batch.len();
                    perc_observers::load_recorded(&app.client, &batch).await?;
                }
                let issues = reading.await??;
                for i in &issues {
                    eprintln!("warning: {i}");
                }
                problems += issues.len();
            }
            let s = app.run_until_quiet("replay").await?;
            println!(
                "replayed {loaded} responses from {} file(s) in {:.1}s; {} pages indexed",
                files.len(),
                s.seconds,
                perc_observers::page_count(&app.client).await?
            );
            app.close().await?;
            if problems > 0 {
                eprintln!("{problems} record(s) could not be read (see the warnings above); the others were indexed");
                return Ok(ExitCode::from(1));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Canonical { url } => {
            let url = parse_url(&url)?;
            let app = App::open(config, Fetching::Offline).await?;
            let answer = perc_observers::canonical(&app.client, &url).await?;
            app.close().await?;
            match answer {
                Ok(c) => {
                    println!("{c}");
                    Ok(ExitCode::SUCCESS)
                }
                Err(why) => {
                    eprintln!("{why}");
                    Ok(ExitCode::from(1))
                }
            }
        }
        Command::Page { url } => {
            let url = parse_url(&url)?;
            let app = App::open(config, Fetching::Offline).await?;
            let info = perc_observers::page_info(&app.client, &url).await?;
            app.close().await?;
            match info {
                PageInfo::Page(line) => println!("{}", serde_json::to_string(&line)?),
                PageInfo::NotAPage(meta) => println!(
                    "{}",
                    serde_json::json!({"url": url.as_str(), "kind": meta.kind, "reason": meta.reason, "status": meta.status, "redirect_to": meta.redirect_to})
                ),
                PageInfo::Pending => println!(
                    "{}",
                    serde_json::json!({"url": url.as_str(), "kind": "pending", "reason": "in the frontier, not fetched yet"})
                ),
                PageInfo::Unknown => {
                    eprintln!("{url} is not known to this index");
                    return Ok(ExitCode::from(1));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Export { out } => {
            let app = App::open(config, Fetching::Offline).await?;
            let n = write_export(&app, &out).await?;
            println!("exported {n} pages to {}", out.display());
            app.close().await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Refetch { urls, all } => {
            let app = App::open(config, Fetching::Live { warc_out: None }).await?;
            let targets: Vec<Url> = if all {
                perc_observers::known_urls(&app.client).await?
            } else {
                if urls.is_empty() {
                    bail!("refetch needs URLs, or --all");
                }
                urls.iter().map(|u| parse_url(u)).collect::<Result<_>>()?
            };
            let unknown = perc_observers::refetch(&app.client, &targets).await?;
            for u in &unknown {
                eprintln!("warning: {u} is not known to this index; not fetched");
            }
            let s = app.run_until_quiet("refetch").await?;
            println!(
                "refetched {} pages in {:.1}s; {} pages indexed",
                targets.len() - unknown.len(),
                s.seconds,
                perc_observers::page_count(&app.client).await?
            );
            app.close().await?;
            Ok(if unknown.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Command::Status => {
            let app = App::open(config, Fetching::Offline).await?;
            status(&app).await?;
            app.close().await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Wait => {
            let app = App::open(config, Fetching::Live { warc_out: None }).await?;
            app.run_until_quiet("wait").await?;
            app.close().await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Generate { pages, seed, site, warc, base, change, version } => {
            generate(pages, seed, site.as_deref(), warc.as_deref(), &base, change, version)
        }
        Command::Oracle { listen } => oracle(config, &listen).await,
        Command::Worker => worker(config).await,
        Command::Demo { site } => demo(config, &site).await,
    }
}

/// Responses a replay loads per transaction batch.
const REPLAY_BATCH: usize = 256;

async fn crawl(app: &App, seeds: &[Url], prefixes: &[String]) -> Result<()> {
    let mut all_prefixes = app.config.crawl.prefixes.clone();
    all_prefixes.extend(prefixes.iter().cloned());
    let scope = CrawlScope {
        seeds: seeds.iter().map(Url::to_string).collect(),
        prefixes: all_prefixes,
        max_depth: app.config.crawl.max_depth,
        max_redirects: app.config.crawl.max_redirects,
    };
    perc_observers::seed(&app.client, seeds, &scope).await?;
    let s = app.run_until_quiet("crawl").await?;
    println!(
        "crawled {} URLs in {:.1}s ({:.1} pages/s); {} pages indexed; {} observer failures",
        s.fetched,
        s.seconds,
        s.fetched as f64 / s.seconds.max(0.001),
        perc_observers::page_count(&app.client).await?,
        s.failures
    );
    Ok(())
}

/// Writes the export as it is read (a temporary file renamed at the end, so a reader never
/// sees half of one); returns the number of pages.
async fn write_export(app: &App, out: &Path) -> Result<usize> {
    let tmp = out.with_extension("jsonl.tmp");
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?,
    );
    let mut n = 0;
    perc_observers::export_each(&app.client, |l| {
        serde_json::to_writer(&mut f, &l)?;
        f.write_all(b"\n")?;
        n += 1;
        Ok::<_, anyhow::Error>(())
    })
    .await?;
    f.into_inner().map_err(|e| anyhow!("cannot write {}: {e}", tmp.display()))?.sync_all()?;
    std::fs::rename(&tmp, out).with_context(|| format!("cannot write {}", out.display()))?;
    Ok(n)
}

async fn status(app: &App) -> Result<()> {
    let t = app.client.begin().await?;
    let pages = t.scan(b"p:", b"p;", perc_observers::model::col::EXPORT_LINE).await?.len();
    let clusters = t.scan(b"c:", b"c;", perc_observers::model::col::CLUSTER_CANONICAL).await?.len();
    let frontier = t.scan(b"p:", b"p;", perc_observers::model::col::WANT).await?.len();
    let pending = app.engine.pending_count(1_000_000).await?;
    println!("pages indexed:          {pages}");
    println!("duplicate clusters:     {clusters}");
    println!("URLs in the frontier:   {frontier}");
    println!("pending notifications:  {pending}");
    let stats = perc_cli::app::decode_stats(
        t.get(perc_cli::app::STATS_ROW, perc_cli::app::STATS_COLUMN).await?,
    )?;
    println!(
        "\n{:<10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}",
        "observer", "runs", "commits", "skipped", "conflicts", "failures", "parked"
    );
    for (name, [runs, commits, skipped, conflicts, failures, parked]) in &stats {
        println!("{name:<10} {runs:>9} {commits:>9} {skipped:>9} {conflicts:>9} {failures:>9} {parked:>7}");
    }
    let failed = app.engine.failed_list().await?;
    if !failed.is_empty() {
        println!("\nparked notifications ({}):", failed.len());
        for f in failed {
            println!("  {} {}: {}", f.row.escape_ascii(), f.column.escape_ascii(), f.detail);
        }
    }
    Ok(())
}

fn generate(
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
            println!("{}", perc_synth::Web::path(i));
        }
        return Ok(ExitCode::SUCCESS);
    }
    if site.is_none() && warc.is_none() {
        bail!("generate needs --site DIR and/or --warc FILE");
    }
    if let Some(dir) = site {
        perc_synth::write::site(&web, dir)
            .with_context(|| format!("cannot write the site {}", dir.display()))?;
        println!("wrote {pages} pages to {}", dir.display());
    }
    if let Some(file) = warc {
        perc_synth::write::warc(&web, file)
            .with_context(|| format!("cannot write the WARC {}", file.display()))?;
        println!("wrote {pages} pages to {}", file.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Returns when the process is asked to stop (SIGTERM or Ctrl-C).
async fn stop_requested() -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    Ok(())
}

async fn oracle(config: config::Config, listen: &str) -> Result<ExitCode> {
    let store = perc_cli::app::open_store(&config).await?;
    let oracle = perc_oracle::LocalOracle::open(store, config.txn.oracle_block).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    // The address line is what scripts (and the tests) wait for.
    println!("oracle listening on {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    tokio::select! {
        r = perc_oracle::serve(listener, std::sync::Arc::new(oracle)) => r?,
        r = stop_requested() => r?,
    }
    Ok(ExitCode::SUCCESS)
}

async fn worker(config: config::Config) -> Result<ExitCode> {
    let app = App::open(config, Fetching::Live { warc_out: None }).await?;
    let workers =
        perc_notify::Workers::start(app.engine.clone(), &tokio::runtime::Handle::current());
    println!("worker {} running", app.engine.client().worker());
    std::io::stdout().flush()?;
    stop_requested().await?;
    workers.shutdown().await;
    app.save_stats().await?;
    app.close().await?;
    Ok(ExitCode::SUCCESS)
}

async fn demo(config: config::Config, site: &Path) -> Result<ExitCode> {
    if !site.is_dir() {
        bail!(
            "the demo site {} does not exist (run from the repository's top directory)",
            site.display()
        );
    }
    let served = site::serve(site).await?;
    let base = served.base();
    println!("serving {} at {base}", site.display());
    let app = App::open(config, Fetching::Live { warc_out: None }).await?;
    crawl(&app, std::slice::from_ref(&base), &[]).await?;
    println!();
    for path in
        ["", "about.html", "copy-of-about.html", "old-about", "missing.html", "private/secret.html"]
    {
        let url = base.join(path)?;
        match perc_observers::canonical(&app.client, &url).await? {
            Ok(c) => println!("perc canonical {url}\n  -> {c}"),
            Err(why) => println!("perc canonical {url}\n  -> ({why})"),
        }
    }
    println!();
    status(&app).await?;
    app.close().await?;
    Ok(ExitCode::SUCCESS)
}
