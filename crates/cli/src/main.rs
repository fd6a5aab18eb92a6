//! `perc`: the binary. Arguments parse once into a validated configuration; the library
//! crates do the work; only this crate prints. [`args`] is the command line; a command runs
//! in this process ([`local`], [`golden`], [`servers`]) or, on a store `perc serve` holds,
//! through its API ([`remote`]); [`input`] checks what it is given and [`files`] writes
//! what it makes.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use anyhow::{anyhow, Result};
use clap::{CommandFactory, Parser};
use tokio_util::sync::CancellationToken;

use perc_pipeline::{config, PipelineError};

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

/// Opens the store for a command that only reads or adds to an index that exists: a store
/// directory that does not exist (a typo in --data, most likely) is "no perc store", exit 1.
macro_rules! existing {
    ($config:expr, $fetching:expr, $kind:expr) => {
        match crate::open($config, $fetching, perc_pipeline::Create::No, $kind).await {
            Ok(app) => app,
            Err(e @ PipelineError::NoStore { .. }) => {
                say!("{e}");
                return Ok(ExitCode::from(1));
            }
            Err(e) => return Err(e.into()),
        }
    };
}

/// Opens the store as a process of `kind` (the command: `perc status` names processes by it).
async fn open(
    config: perc_pipeline::Config,
    fetching: perc_pipeline::Fetching,
    create: perc_pipeline::Create,
    kind: &'static str,
) -> Result<perc_pipeline::Pipeline, PipelineError> {
    perc_pipeline::Pipeline::builder(config)
        .fetching(fetching)
        .create(create)
        .kind(kind)
        .open()
        .await
}

mod args;
mod files;
mod golden;
mod input;
mod local;
mod remote;
mod servers;

use args::{Cli, Command};

/// jemalloc, with one arena for every thread (`.cargo/config.toml` says why).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's figures, bytes by kind, as of now (`perc_allocator_bytes` in `GET /metrics`);
/// a figure it cannot read is left out.
fn allocator_figures() -> Vec<(&'static str, u64)> {
    use tikv_jemalloc_ctl::{epoch, stats};
    if epoch::advance().is_err() {
        return Vec::new();
    }
    let figures = [
        ("allocated", stats::allocated::read()),
        ("active", stats::active::read()),
        ("resident", stats::resident::read()),
        ("mapped", stats::mapped::read()),
        ("retained", stats::retained::read()),
        ("metadata", stats::metadata::read()),
    ];
    figures.into_iter().filter_map(|(kind, n)| Some((kind, n.ok()? as u64))).collect()
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

async fn run(cli: Cli, stop: CancellationToken) -> Result<ExitCode> {
    // Comparing two files, and describing perc, need no configuration and no store.
    match &cli.command {
        Command::Diff { old, new, json, html, limit } => {
            return golden::diff(old, new, *json, html.as_deref(), *limit)
        }
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
            return remote::through_server(command, &config, &served).await;
        }
        // A server that starts after that look takes the store before this command opens
        // it, having said where it listens: asked then. (Not a crawl of seeds from standard
        // input, which this attempt read.)
        let reads_stdin =
            matches!(&command, Command::Crawl { seeds, .. } if seeds.as_os_str() == "-");
        let again = (!reads_stdin).then(|| command.clone());
        let ran = locally(command, config.clone(), &stop).await;
        return match (ran, again) {
            (Err(e), Some(again)) if in_use(&e) => match remote::find(&config).await {
                Some(served) => remote::through_server(again, &config, &served).await,
                None => Err(e),
            },
            (ran, _) => ran,
        };
    }
    locally(command, config, &stop).await
}

/// Whether `e` says another process holds the store.
fn in_use(e: &anyhow::Error) -> bool {
    e.chain().any(|c| matches!(c.downcast_ref(), Some(PipelineError::InUse(_))))
}

/// `command` on the store itself.
async fn locally(
    command: Command,
    config: config::Config,
    stop: &CancellationToken,
) -> Result<ExitCode> {
    match command {
        Command::Crawl { seeds, prefixes, warc_out, append } => {
            local::crawl_command(config, &seeds, &prefixes, warc_out.as_deref(), append, stop).await
        }
        Command::Replay { files, expect, update, junit, html, limit } => {
            let check = expect.as_deref().map(|golden| golden::Check {
                golden,
                update,
                junit: junit.as_deref(),
                html: html.as_deref(),
                limit,
            });
            golden::replay_command(config, &files, check, stop).await
        }
        Command::Diff { .. } | Command::Completions { .. } | Command::Man => {
            unreachable!("handled before the configuration is read")
        }
        Command::Canonical { url } => local::canonical(config, &url).await,
        Command::Page { url } => local::page(config, &url).await,
        Command::Search { query, limit, lang } => {
            let filter = perc_search::Filter { lang };
            local::search_command(config, &query, &filter, limit, stop).await
        }
        Command::Export { out, links } => {
            local::export(config, &out, files::Exported::of(links)).await
        }
        Command::Refetch { urls, all } => local::refetch(config, &urls, all, stop).await,
        Command::Status => local::status_command(config).await,
        Command::Wait => local::wait(config, stop).await,
        Command::Compact => local::compact(config, stop).await,
        Command::Generate { pages, seed, site, warc, base, change, version } => {
            local::generate(pages, seed, site.as_deref(), warc.as_deref(), &base, change, version)
        }
        Command::Oracle { listen } => servers::oracle(config, &listen, stop).await,
        Command::Worker => servers::worker(config, stop).await,
        Command::Serve { seeds, prefixes, listen } => {
            servers::serve(config, seeds.as_deref(), &prefixes, listen, stop.clone()).await
        }
        Command::Demo { site, listen } => servers::demo(config, &site, listen, stop).await,
    }
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
