//! `perc`: the binary. Arguments parse once into a validated configuration; the library
//! crates do the work; only this crate prints.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use clap::{CommandFactory, Parser, Subcommand};
use tokio_util::sync::CancellationToken;
use url::Url;

use perc_synth::site;

mod remote;
use perc_pipeline::{config, diff, CrawlScope, Create, Fetching, Pipeline, PipelineError};

/// A line on stdout. A closed stdout (`perc status | head -1`) is an error that `main` turns
/// into a quiet exit, the way Unix tools end on a broken pipe.
macro_rules! out {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout(), $($arg)*)?
    };
}

/// A line on stderr; a closed stderr loses it, and nothing else.
macro_rules! say {
    ($($arg:tt)*) => {
        let _ = writeln!(std::io::stderr(), $($arg)*);
    };
}

/// jemalloc, with one arena for every thread (`.cargo/config.toml` says why).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "perc",
    version,
    about = "Incremental web indexing on Percolator-style transactions and observers"
)]
struct Cli {
    /// The store directory (overrides store.data); `:memory:` keeps the store in memory for
    /// this command only (a throwaway crawl or replay).
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
        /// One URL a line; `#` starts a comment; `-` reads standard input.
        #[arg(long)]
        seeds: PathBuf,
        /// Narrows the scope to URLs starting with this (repeatable).
        #[arg(long = "prefix")]
        prefixes: Vec<String>,
        /// Records every request and response into this WARC (.warc.gz); an existing file is
        /// refused unless --append.
        #[arg(long)]
        warc_out: Option<PathBuf>,
        /// Adds the records to the --warc-out file if it exists (a page whose body is the
        /// same as at its last capture there is a revisit record: the head only).
        #[arg(long, requires = "warc_out")]
        append: bool,
    },
    /// Load recorded responses from WARC files (or directories of them) and index them.
    Replay {
        files: Vec<PathBuf>,
        /// Compare the index with this export (a golden file): print what differs, exit 1 if
        /// anything does. The store is kept in memory unless --data is given.
        #[arg(long, value_name = "GOLDEN.jsonl")]
        expect: Option<PathBuf>,
        /// With --expect: write the index into the golden file instead of comparing.
        #[arg(long, requires = "expect")]
        update: bool,
        /// With --expect: also write the comparison as a JUnit XML report.
        #[arg(long, requires = "expect", value_name = "FILE")]
        junit: Option<PathBuf>,
        /// With --expect: how many of each kind of difference to print.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Compare two exports: pages added and removed, fields and inlinks changed (exit 0 when
    /// equal, 1 when different, 2 on bad input).
    Diff {
        /// The export before (`-`: standard input).
        old: PathBuf,
        /// The export after.
        new: PathBuf,
        /// Print the differences as one JSON object.
        #[arg(long)]
        json: bool,
        /// How many of each kind of difference to print.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Print the canonical URL of a page (exit 1 if the page is unknown).
    Canonical { url: String },
    /// Print a page's indexed record as JSON.
    Page { url: String },
    /// Search the index: the best pages for the words of QUERY, best first, one JSON object
    /// a line (url, title, score, in_degree); exit 1 if none matches. Brings the search
    /// index (DATA/search) up to date with the store first.
    Search {
        #[arg(required = true)]
        query: Vec<String>,
        /// How many pages at most (up to search.limit_max).
        #[arg(long, default_value_t = 10)]
        limit: u64,
    },
    /// Write the export snapshot as JSON Lines, sorted by URL (`--out -`: standard output).
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
    /// Collect old versions, then rewrite the sled store's files from what is live (sled
    /// gives space back slowly: a store is often 2-6 times its data after a large load). The
    /// store must not be in use: stop perc serve and perc worker first.
    Compact,
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
    /// Keep the index current and answer an HTTP API (docs/serve.md) until stopped
    /// (SIGTERM, Ctrl-C): the observers run as in `perc worker`.
    Serve {
        /// Seeds to crawl (one URL a line; - reads stdin), added when it starts.
        #[arg(long)]
        seeds: Option<PathBuf>,
        /// Narrows the scope of the seeds to URLs starting with this (repeatable).
        #[arg(long = "prefix", requires = "seeds")]
        prefixes: Vec<String>,
        /// Where to listen, host:port (default: serve.listen; port 0 picks a free one).
        #[arg(long)]
        listen: Option<String>,
    },
    /// Print the completion script of a shell (bash, zsh, fish, elvish, powershell):
    /// `perc completions bash > ~/.local/share/bash-completion/completions/perc`.
    Completions { shell: clap_complete::Shell },
    /// Print perc's manual page (roff): `perc man > perc.1 && man ./perc.1`.
    Man,
    /// Serve the bundled demo site on 127.0.0.1, crawl it, and show what perc knows.
    Demo {
        /// The site directory.
        #[arg(long, default_value = "fixtures/sites/demo")]
        site: PathBuf,
        /// Where to serve the site: a fixed port, so that a store kept from an earlier run
        /// has its URLs at the same address.
        #[arg(long, default_value = "127.0.0.1:8419")]
        listen: std::net::SocketAddr,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // sled's own error lines repeat what reaches perc as an error value. The long-running
    // servers say at info what an operator watches (rates, backlog, takeovers, epochs).
    let default_filter = match cli.command {
        Command::Worker | Command::Oracle { .. } | Command::Serve { .. } => {
            "warn,sled=off,perc=info,perc_pipeline=info,perc_notify=info,perc_oracle=info"
        }
        _ => "warn,sled=off",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        // Colours for a person at a terminal, never escape codes in a log file.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        // A log line that cannot be written (stderr closed) is dropped; reporting that on
        // stderr would panic the task that logged.
        .log_internal_errors(false)
        .init();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let stop = CancellationToken::new();
    runtime.spawn(signals(stop.clone()));
    match runtime.block_on(run(cli, stop)) {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) if matches!(e.downcast_ref(), Some(PipelineError::Interrupted)) => {
            say!(
                "perc: interrupted; everything done so far is saved. Run the same command again \
                 to resume."
            );
            ExitCode::from(130)
        }
        Err(e) => {
            say!("error: {e:#}");
            match e.downcast_ref::<PipelineError>() {
                Some(p) if p.is_below() => {
                    say!(
                        "perc: what was committed before is intact; run the same command again \
                         once the store and the oracle answer"
                    );
                    ExitCode::from(3)
                }
                _ => ExitCode::from(2),
            }
        }
    }
}

/// The first SIGINT or SIGTERM cancels `stop` (the command winds down and says how to
/// resume); a second one ends the process at once.
async fn signals(stop: CancellationToken) {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        return;
    };
    for n in 0.. {
        tokio::select! {
            r = tokio::signal::ctrl_c() => if r.is_err() { return },
            _ = term.recv() => {}
        }
        if n > 0 {
            say!("perc: interrupted again; stopping now");
            std::process::exit(130);
        }
        say!("perc: stopping (finishing the runs in flight; interrupt again to stop at once)");
        stop.cancel();
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    let broken = |io: &std::io::Error| io.kind() == std::io::ErrorKind::BrokenPipe;
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(broken)
            || matches!(c.downcast_ref(), Some(PipelineError::Io { cause, .. }) if broken(cause))
    })
}

fn load_config(cli: &Cli) -> Result<config::Config> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    // --data is the last layer; a golden check runs in a throwaway store unless told where
    // to keep one.
    let mut sets = cli.sets.clone();
    let throwaway = matches!(cli.command, Command::Replay { expect: Some(_), .. });
    match &cli.data {
        Some(d) => sets.push(format!("store.data={}", d.display())),
        None if throwaway => sets.push(format!("store.data={}", perc_pipeline::MEMORY)),
        None => {}
    }
    Ok(config::load(cli.config.as_deref(), &env, &sets)?)
}

fn parse_url(raw: &str) -> Result<Url> {
    perc_pipeline::normalize(raw).map_err(|e| anyhow!(e))
}

/// Reads a seed list (`-`: standard input) as it streams: one URL a line, `#` comments, blank
/// lines ignored. A line longer than [`SEED_LINE_BYTES_MAX`], more than `seeds_max` seeds, or
/// a bad URL is an error naming the line; credentials in a seed are dropped with a warning.
fn read_seeds(path: &Path, seeds_max: u64) -> Result<Vec<Url>> {
    let name = path.display().to_string();
    let input: Box<dyn BufRead> = if name == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(path)
                .with_context(|| format!("cannot read the seed list {name}"))?,
        ))
    };
    let mut input = std::io::Read::take(input, u64::MAX);
    let mut seeds = Vec::new();
    let mut line = Vec::new();
    for n in 1.. {
        line.clear();
        input.set_limit(SEED_LINE_BYTES_MAX as u64 + 1);
        let got = input
            .read_until(b'\n', &mut line)
            .with_context(|| format!("cannot read the seed list {name}"))?;
        if got == 0 {
            break;
        }
        if line.len() > SEED_LINE_BYTES_MAX && !line.ends_with(b"\n") {
            bail!("{name} line {n}: longer than {SEED_LINE_BYTES_MAX} bytes; is this a seed list?");
        }
        let text = std::str::from_utf8(&line)
            .map_err(|_| anyhow!("{name} line {n}: not UTF-8 text; is this a seed list?"))?;
        let text = text.split('#').next().unwrap_or("").trim();
        if text.is_empty() {
            continue;
        }
        let url = perc_pipeline::normalize(text).map_err(|e| anyhow!("{name} line {n}: {e}"))?;
        if perc_pipeline::had_userinfo(text) {
            say!("warning: {name} line {n}: credentials removed from the seed; perc never sends or stores them ({url})");
        }
        if seeds.len() as u64 >= seeds_max {
            bail!("{name} line {n}: more than crawl.seeds_max = {seeds_max} seeds");
        }
        seeds.push(url);
    }
    if seeds.is_empty() {
        bail!("the seed list {name} has no URL");
    }
    Ok(seeds)
}

/// The longest line a seed list may have.
const SEED_LINE_BYTES_MAX: usize = 8192;

/// Opens the store for a command that only reads or adds to an index that exists: a store
/// directory that does not exist (a typo in --data, most likely) is "no perc store", exit 1.
macro_rules! existing {
    ($config:expr, $fetching:expr) => {
        match Pipeline::open($config, $fetching, Create::No).await {
            Ok(app) => app,
            Err(e @ PipelineError::NoStore { .. }) => {
                say!("{e}");
                return Ok(ExitCode::from(1));
            }
            Err(e) => return Err(e.into()),
        }
    };
}

async fn run(cli: Cli, stop: CancellationToken) -> Result<ExitCode> {
    // Comparing two files, and describing perc, need no configuration and no store.
    match &cli.command {
        Command::Diff { old, new, json, limit } => return diff(old, new, *json, *limit),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut Cli::command(), "perc", &mut script);
            std::io::stdout().write_all(&script)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Man => {
            let mut page = Vec::new();
            clap_mangen::Man::new(Cli::command()).render(&mut page)?;
            std::io::stdout().write_all(&page)?;
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
    let config = load_config(&cli)?;
    let where_ = match config.store.backend {
        config::Backend::Sled => format!("the store at {}", config.store.data),
        config::Backend::Bigtable => format!("the Bigtable table {}", config.bigtable.table),
        config::Backend::Memory => "the memory store".to_string(),
    };
    dispatch(cli.command, config, stop).await.map_err(|e| {
        // A full disk is the user's to fix: say where, once, and that nothing is lost.
        if let Some(PipelineError::OutOfSpace(_)) = e.downcast_ref() {
            anyhow!(
                "no space left on device writing {where_}; what was stored before is intact: \
                 free some space and run the same command again"
            )
        } else {
            e
        }
    })
}

async fn dispatch(
    command: Command,
    config: config::Config,
    stop: CancellationToken,
) -> Result<ExitCode> {
    let asks_the_index = matches!(
        command,
        Command::Status
            | Command::Canonical { .. }
            | Command::Page { .. }
            | Command::Export { .. }
            | Command::Search { .. }
            | Command::Refetch { .. }
            | Command::Crawl { .. }
    );
    if asks_the_index {
        if let Some(served) = remote::find(&config).await {
            return through_server(command, &config, &served).await;
        }
    }
    match command {
        Command::Crawl { seeds, prefixes, warc_out, append } => {
            let seeds = read_seeds(&seeds, config.crawl.seeds_max)?;
            let scope = crawl_scope(&config, &seeds, &prefixes)?;
            let recorder = warc_out
                .as_deref()
                .map(|p| perc_pipeline::Recorder::create(p, append))
                .transpose()?;
            let app =
                Pipeline::open(config, Fetching::Live { warc_out: recorder }, Create::IfMissing)
                    .await?;
            let result = crawl(&app, &seeds, &scope, &stop).await;
            app.close().await?;
            result
        }
        Command::Replay { files, expect, update, junit, limit } => {
            if files.is_empty() {
                bail!("replay needs at least one WARC file");
            }
            let app = Pipeline::open(config, Fetching::Offline, Create::IfMissing).await?;
            let result = match &expect {
                None => replay(&app, &files, &stop).await,
                Some(golden) => {
                    let check = Check { golden, update, junit: junit.as_deref(), limit };
                    replay_expect(&app, &files, &check, &stop).await
                }
            };
            app.close().await?;
            result
        }
        Command::Diff { .. } | Command::Completions { .. } | Command::Man => {
            unreachable!("handled before the configuration is read")
        }
        Command::Canonical { url } => {
            let url = parse_url(&url)?;
            let app = existing!(config, Fetching::Offline);
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
        Command::Page { url } => {
            let url = parse_url(&url)?;
            let app = existing!(config, Fetching::Offline);
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
        Command::Search { query, limit } => {
            let limit = search_limit(&config, limit)?;
            let app = existing!(config, Fetching::Offline);
            let hits = search(&app, &query.join(" "), limit, &stop).await;
            app.close().await?;
            print_hits(&query.join(" "), hits?)
        }
        Command::Export { out } => {
            let app = existing!(config, Fetching::Offline);
            let written = write_export(&app, &out).await;
            app.close().await?;
            let n = written?;
            if out.as_os_str() != "-" {
                out!("exported {n} pages to {}", out.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Refetch { urls, all } => {
            let app = existing!(config, Fetching::Live { warc_out: None });
            let targets: Option<Vec<Url>> = if all {
                None
            } else {
                if urls.is_empty() {
                    bail!("refetch needs URLs, or --all");
                }
                Some(urls.iter().map(|u| parse_url(u)).collect::<Result<_>>()?)
            };
            let result = app.refetch(targets.as_deref(), &stop).await;
            app.close().await?;
            let r = result?;
            for u in &r.unknown {
                say!("warning: {u} is not known to this index; not fetched");
            }
            out!(
                "refetched {} pages in {:.1}s; {} pages indexed",
                r.refetched,
                r.run.seconds,
                r.pages
            );
            Ok(if r.unknown.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Command::Status => {
            let app = existing!(config, Fetching::Offline);
            let shown = status(&app).await;
            app.close().await?;
            shown?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Wait => {
            let app = existing!(config, Fetching::Live { warc_out: None });
            let waited = app.wait(&stop).await;
            app.close().await?;
            waited?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Compact => {
            let data = config.store.data.clone();
            let done = match perc_pipeline::compact(config, &stop).await {
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
        Command::Generate { pages, seed, site, warc, base, change, version } => {
            generate(pages, seed, site.as_deref(), warc.as_deref(), &base, change, version)
        }
        Command::Oracle { listen } => oracle(config, &listen, &stop).await,
        Command::Worker => worker(config, &stop).await,
        Command::Serve { seeds, prefixes, listen } => {
            serve(config, seeds.as_deref(), &prefixes, listen, stop).await
        }
        Command::Demo { site, listen } => demo(config, &site, listen, &stop).await,
    }
}

/// The crawl's scope (see [`perc_pipeline::crawl_scope`]), with a warning per seed outside it.
fn crawl_scope(config: &config::Config, seeds: &[Url], prefixes: &[String]) -> Result<CrawlScope> {
    let (scope, outside) = perc_pipeline::crawl_scope(config, seeds, prefixes)?;
    for s in outside {
        say!("warning: the seed {s} is outside the scope prefixes: fetched, but its links are not followed");
    }
    Ok(scope)
}

async fn crawl(
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

/// A command on a store that `perc serve` holds, through its API (see [`remote`]).
async fn through_server(
    command: Command,
    config: &config::Config,
    served: &remote::Served,
) -> Result<ExitCode> {
    let not_found = |answer: &remote::Answer| -> Option<ExitCode> {
        (answer.status == 404).then(|| {
            say!("{}", answer.message());
            ExitCode::from(1)
        })
    };
    match command {
        Command::Status => {
            let text = served.get("/v1/status", &[("format", "text")]).await?.ok()?;
            out!("{}", text.trim_end());
        }
        Command::Canonical { url } => {
            let url = parse_url(&url)?;
            let answer = served.get("/v1/canonical", &[("url", url.as_str())]).await?;
            if let Some(code) = not_found(&answer) {
                return Ok(code);
            }
            let v = remote::json(answer)?;
            out!("{}", v["canonical"].as_str().unwrap_or_default());
        }
        Command::Page { url } => {
            let url = parse_url(&url)?;
            let answer = served.get("/v1/page", &[("url", url.as_str())]).await?;
            if let Some(code) = not_found(&answer) {
                return Ok(code);
            }
            out!("{}", answer.ok()?.trim_end());
        }
        Command::Export { out } => {
            let n = if out.as_os_str() == "-" {
                let mut f = std::io::BufWriter::new(std::io::stdout().lock());
                let n = served.export(&mut f).await?;
                f.flush()?;
                n
            } else {
                let mut tmp = Replacement::create(&out)?;
                let n = served.export(&mut tmp.file).await?;
                tmp.finish()?;
                out!("exported {n} pages to {}", out.display());
                n
            };
            tracing::debug!(lines = n, "exported through perc serve");
        }
        Command::Search { query, limit } => {
            let (q, limit) = (query.join(" "), search_limit(config, limit)?.to_string());
            let answer = served.get("/v1/search", &[("q", &q), ("limit", &limit)]).await?;
            let hits: Vec<perc_search::Hit> =
                serde_json::from_value(remote::json(answer)?["hits"].take())
                    .context("perc serve's search hits")?;
            return print_hits(&q, hits);
        }
        Command::Refetch { urls, all } => {
            let body = if all {
                serde_json::json!({ "all": true })
            } else {
                if urls.is_empty() {
                    bail!("refetch needs URLs, or --all");
                }
                let urls: Vec<String> =
                    urls.iter().map(|u| parse_url(u).map(String::from)).collect::<Result<_>>()?;
                serde_json::json!({ "urls": urls })
            };
            let v = remote::json(served.post("/v1/refetch", &body).await?)?;
            let unknown = v["unknown"].as_array().cloned().unwrap_or_default();
            for u in &unknown {
                say!(
                    "warning: {} is not known to this index; not fetched",
                    u.as_str().unwrap_or("")
                );
            }
            out!(
                "perc serve at {} fetches {} pages again (it indexes them as they come)",
                served.base(),
                v["refetching"]
            );
            return Ok(if unknown.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) });
        }
        Command::Crawl { seeds, prefixes, warc_out, .. } => {
            if warc_out.is_some() {
                bail!(
                    "--warc-out: perc serve at {} holds this store and records nothing; stop it \
                     to crawl with --warc-out",
                    served.base()
                );
            }
            let seeds = read_seeds(&seeds, config.crawl.seeds_max)?;
            let seeds: Vec<&str> = seeds.iter().map(Url::as_str).collect();
            let body = serde_json::json!({ "seeds": seeds, "prefixes": prefixes });
            let v = remote::json(served.post("/v1/seeds", &body).await?)?;
            for u in v["outside_scope"].as_array().into_iter().flatten() {
                say!(
                    "warning: the seed {} is outside the prefixes: fetched, its links not followed",
                    u.as_str().unwrap_or("")
                );
            }
            out!(
                "perc serve at {} crawls {} seeds (perc status shows how far it is)",
                served.base(),
                v["seeds"]
            );
        }
        _ => unreachable!("only the commands that ask the index go through a server"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `perc search --limit`, checked against `search.limit_max`.
fn search_limit(config: &config::Config, limit: u64) -> Result<usize> {
    let max = config.search.limit_max;
    if !(1..=max).contains(&limit) {
        bail!("--limit {limit}: it must be 1 to {max} (search.limit_max)");
    }
    Ok(usize::try_from(limit)?)
}

/// Prints search hits, a JSON object a line; exit 1, saying so, when there is none.
fn print_hits(query: &str, hits: Vec<perc_search::Hit>) -> Result<ExitCode> {
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
    index.search(query, limit, (&app.config().search).into()).map_err(below)
}

async fn replay(app: &Pipeline, files: &[PathBuf], stop: &CancellationToken) -> Result<ExitCode> {
    let r = app.replay(files, stop).await?;
    for i in &r.issues {
        say!("warning: {i}");
    }
    out!(
        "replayed {} responses from {} file(s) in {:.1}s; {} pages indexed",
        r.loaded,
        r.files,
        r.run.seconds,
        r.pages
    );
    if !r.issues.is_empty() {
        say!(
            "{} record(s) could not be read (see the warnings above); the others were indexed",
            r.issues.len()
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// What `replay --expect` compares with, and what it does with the outcome.
struct Check<'a> {
    golden: &'a Path,
    update: bool,
    junit: Option<&'a Path>,
    limit: usize,
}

/// `perc replay FILE… --expect GOLDEN`: replays, then compares the export with the golden
/// (exit 1 when they differ) or, with `--update`, rewrites the golden.
async fn replay_expect(
    app: &Pipeline,
    files: &[PathBuf],
    check: &Check<'_>,
    stop: &CancellationToken,
) -> Result<ExitCode> {
    // A golden that is a symbolic link is read and written through it: --update rewrites
    // the file it points to, and the link stays.
    let resolved = std::fs::canonicalize(check.golden).ok();
    let golden = resolved.as_deref().unwrap_or(check.golden);
    if golden.is_dir() {
        bail!("{} is a directory: --expect names a golden export file", check.golden.display());
    }
    if !check.update && !golden.is_file() {
        bail!("{} does not exist: --update writes it from this replay", golden.display());
    }
    let r = app.replay(files, stop).await?;
    for i in &r.issues {
        say!("warning: {i}");
    }
    say!("replayed {} responses from {} file(s); {} pages indexed", r.loaded, r.files, r.pages);
    let got = app.export_jsonl().await?;
    let unreadable = !r.issues.is_empty();
    if unreadable {
        say!("{} record(s) could not be read (see the warnings above)", r.issues.len());
    }
    let name = check.golden.display().to_string();
    let names = diff::Names { old: &name, new: "this replay" };
    let was = golden.is_file().then(|| compare(golden, &got)).transpose()?;
    if check.update {
        write_atomically(golden, |w| {
            for l in &got {
                writeln!(w, "{l}")?;
            }
            Ok(())
        })?;
        match was {
            Some(d) if d.is_empty() => out!("{name} is up to date: {} pages", got.len()),
            Some(d) => out!(
                "updated {name}: {} pages ({} changed, {} added, {} removed)",
                got.len(),
                d.changed.len(),
                d.added.len(),
                d.removed.len()
            ),
            None => out!("wrote {name}: {} pages", got.len()),
        }
        return Ok(if unreadable { ExitCode::from(1) } else { ExitCode::SUCCESS });
    }
    let d = was.expect("the golden exists when not updating");
    if let Some(path) = check.junit {
        let suite = format!("perc replay --expect {name}");
        write_atomically(path, |w| Ok(w.write_all(d.junit(&suite, &names).as_bytes())?))?;
    }
    write!(std::io::stdout(), "{}", d.text(&names, check.limit))?;
    if !d.is_empty() {
        say!("the index differs from {name}; to accept it, run the same command with --update");
    }
    Ok(if d.is_empty() && !unreadable { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The golden file against this run's export lines; a golden that is not an export is bad
/// input (exit 2).
fn compare(golden: &Path, got: &[String]) -> Result<diff::ExportDiff> {
    let lines = got.iter().map(Ok);
    let new = diff::Side { name: "this replay".into(), lines };
    Ok(diff::diff(diff::Side::file(golden)?, new)?)
}

/// `perc diff OLD NEW`.
fn diff(old: &Path, new: &Path, json: bool, limit: usize) -> Result<ExitCode> {
    if old.as_os_str() == "-" && new.as_os_str() == "-" {
        bail!("only one side of perc diff can be standard input");
    }
    let d = diff::diff(diff::Side::file(old)?, diff::Side::file(new)?)?;
    if json {
        let mut v = serde_json::to_value(&d)?;
        v["equal"] = d.is_empty().into();
        out!("{v}");
    } else {
        let (o, n) = (old.display().to_string(), new.display().to_string());
        write!(std::io::stdout(), "{}", d.text(&diff::Names { old: &o, new: &n }, limit))?;
    }
    Ok(if d.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Writes a file through a temporary one renamed at the end, so that a reader never sees
/// half of it.
fn write_atomically(path: &Path, write: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<()> {
    let mut tmp = Replacement::create(path)?;
    write(&mut tmp.file).with_context(|| format!("cannot write {}", tmp.path.display()))?;
    tmp.finish()
}

/// A file written beside the one it replaces, renamed over it once complete and synced. A
/// target that exists and is not a regular file (`/dev/null`, a FIFO, a terminal) is written
/// in place: renaming over it would replace the device or pipe with a file.
struct Replacement<'a> {
    target: &'a Path,
    path: PathBuf,
    file: std::io::BufWriter<std::fs::File>,
}

impl Replacement<'_> {
    fn create(target: &Path) -> Result<Replacement<'_>> {
        let special = std::fs::metadata(target).is_ok_and(|m| !m.is_file() && !m.is_dir());
        let path = if special {
            target.to_path_buf()
        } else {
            let mut name = target.as_os_str().to_owned();
            name.push(".tmp");
            PathBuf::from(name)
        };
        let file = std::fs::File::create(&path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(Replacement { target, path, file: std::io::BufWriter::new(file) })
    }

    fn finish(self) -> Result<()> {
        let what = || format!("cannot write {}", self.path.display());
        let file = self.file.into_inner().map_err(|e| anyhow!("{}: {e}", what()))?;
        if self.path == self.target {
            return Ok(()); // written in place: nothing to sync or rename
        }
        file.sync_all()?;
        std::fs::rename(&self.path, self.target)
            .with_context(|| format!("cannot write {}", self.target.display()))
    }
}

/// Writes the export as it is read, to stdout for `-`, else through a temporary file (see
/// [`write_atomically`]); returns the number of pages.
async fn write_export(app: &Pipeline, out: &Path) -> Result<usize> {
    if out.as_os_str() == "-" {
        let mut f = std::io::BufWriter::new(std::io::stdout().lock());
        let n = export_lines(app, &mut f).await?;
        f.flush()?;
        return Ok(n);
    }
    let mut tmp = Replacement::create(out)?;
    let n = export_lines(app, &mut tmp.file).await?;
    tmp.finish()?;
    Ok(n)
}

/// The export as JSON Lines into `w`; returns the number of lines.
async fn export_lines(app: &Pipeline, w: &mut impl Write) -> Result<usize> {
    let n = app
        .export(|l| {
            serde_json::to_writer(&mut *w, &l)
                .map_err(std::io::Error::from)
                .and_then(|()| w.write_all(b"\n"))
                .map_err(|cause| PipelineError::Io {
                    what: "cannot write the export".into(),
                    cause,
                })
        })
        .await?;
    Ok(n)
}

async fn status(app: &Pipeline) -> Result<()> {
    out!("{}", app.status().await?.to_text().trim_end());
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

async fn oracle(
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

async fn worker(config: config::Config, stop: &CancellationToken) -> Result<ExitCode> {
    let app = Pipeline::open(config, Fetching::Live { warc_out: None }, Create::IfMissing).await?;
    out!("worker {} running", app.worker_id());
    std::io::stdout().flush()?;
    let worked = app.work(stop).await;
    app.close().await?;
    worked?;
    Ok(ExitCode::SUCCESS)
}

/// The shortest `serve.token` accepted on an address beyond loopback.
const TOKEN_CHARS_MIN: usize = 16;

async fn serve(
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
    let app = Pipeline::open(config, Fetching::Live { warc_out: None }, Create::IfMissing).await?;
    let token = perc_serve::token(&serve_config, data.as_deref())?;
    let start = perc_serve::Start {
        data: data.as_deref(),
        token,
        seeds: seeds.unwrap_or_default(),
        prefixes: prefixes.to_vec(),
    };
    perc_serve::run(app, &serve_config, listener, start, stop, |addr| {
        // A closed stdout loses the line, and nothing else: the address is in serve.json.
        let _ = writeln!(std::io::stdout(), "perc serve: listening on http://{addr}");
        let _ = std::io::stdout().flush();
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

async fn demo(
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
    let app = Pipeline::open(config, Fetching::Live { warc_out: None }, Create::IfMissing).await?;
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

#[cfg(test)]
mod tests {
    /// The one arena is built into jemalloc from `.cargo/config.toml` when it compiles: a build
    /// that lost that setting would go back to four arenas a core, and to the memory they strand.
    #[test]
    fn the_allocator_has_one_arena() {
        assert_eq!(tikv_jemalloc_ctl::opt::narenas::read().unwrap(), 1);
    }
}
