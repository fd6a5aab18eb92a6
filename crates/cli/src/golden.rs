//! `perc replay` (with `--expect GOLDEN`, the CI check against a golden export) and
//! `perc diff`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Result};
use perc_pipeline::{config, diff, Create, Fetching, Pipeline};
use tokio_util::sync::CancellationToken;

use crate::files::write_atomically;

/// `perc replay FILE…`, and with `--expect`, the check against a golden export.
pub(crate) async fn replay_command(
    config: config::Config,
    files: &[PathBuf],
    check: Option<Check<'_>>,
    stop: &CancellationToken,
) -> Result<ExitCode> {
    if files.is_empty() {
        bail!("replay needs at least one WARC file");
    }
    let app = crate::open(config, Fetching::Offline, Create::IfMissing, "replay").await?;
    let result = match &check {
        None => replay(&app, files, stop).await,
        Some(check) => replay_expect(&app, files, check, stop).await,
    };
    app.close().await?;
    result
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
pub(crate) struct Check<'a> {
    pub(crate) golden: &'a Path,
    pub(crate) update: bool,
    pub(crate) junit: Option<&'a Path>,
    pub(crate) html: Option<&'a Path>,
    pub(crate) limit: usize,
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
    report(&d, &names, check.html, check.limit)?;
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

/// The text of `d` on standard output, and its HTML page into `html` when asked for (for
/// `-`, on standard output in place of the text).
fn report(
    d: &diff::ExportDiff,
    names: &diff::Names,
    html: Option<&Path>,
    limit: usize,
) -> Result<()> {
    match html {
        Some(path) if path.as_os_str() == "-" => {
            write!(std::io::stdout(), "{}", d.html(names))?;
            return Ok(());
        }
        Some(path) => write_html(path, d, names)?,
        None => {}
    }
    write!(std::io::stdout(), "{}", d.text(names, limit))?;
    Ok(())
}

/// `d`'s HTML page into the file `path`.
fn write_html(path: &Path, d: &diff::ExportDiff, names: &diff::Names) -> Result<()> {
    write_atomically(path, |w| Ok(w.write_all(d.html(names).as_bytes())?))
}

/// `perc diff OLD NEW`.
pub(crate) fn diff(
    old: &Path,
    new: &Path,
    json: bool,
    html: Option<&Path>,
    limit: usize,
) -> Result<ExitCode> {
    if old.as_os_str() == "-" && new.as_os_str() == "-" {
        bail!("only one side of perc diff can be standard input");
    }
    let d = diff::diff(diff::Side::file(old)?, diff::Side::file(new)?)?;
    let (o, n) = (old.display().to_string(), new.display().to_string());
    let names = diff::Names { old: &o, new: &n };
    if json {
        if html.is_some_and(|p| p.as_os_str() == "-") {
            bail!("--json and --html - both write standard output: name a file for --html");
        }
        if let Some(path) = html {
            write_html(path, &d, &names)?;
        }
        let mut v = serde_json::to_value(&d)?;
        v["equal"] = d.is_empty().into();
        out!("{v}");
    } else {
        report(&d, &names, html, limit)?;
    }
    Ok(if d.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
