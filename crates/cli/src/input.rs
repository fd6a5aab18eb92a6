//! What a command is given, checked: URLs, seed lists, the crawl's scope, a search limit.
//! Bad input is an error that names it (the line of a seed list, the key of a bound).

use std::io::{BufRead, Write};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use perc_pipeline::{config, CrawlScope};
use url::Url;

pub(crate) fn parse_url(raw: &str) -> Result<Url> {
    perc_pipeline::normalize(raw).map_err(|e| anyhow!(e))
}

/// Reads a seed list (`-`: standard input) as it streams: one URL a line, `#` comments, blank
/// lines ignored. A line longer than [`SEED_LINE_BYTES_MAX`], more than `seeds_max` seeds, or
/// a bad URL is an error naming the line; credentials in a seed are dropped with a warning.
pub(crate) fn read_seeds(path: &Path, seeds_max: u64) -> Result<Vec<Url>> {
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
pub(crate) const SEED_LINE_BYTES_MAX: usize = 8192;

/// The crawl's scope (see [`perc_pipeline::crawl_scope`]), with a warning per seed outside it.
pub(crate) fn crawl_scope(
    config: &config::Config,
    seeds: &[Url],
    prefixes: &[String],
) -> Result<CrawlScope> {
    let (scope, outside) = perc_pipeline::crawl_scope(config, seeds, prefixes)?;
    for s in outside {
        say!("warning: the seed {s} is outside the scope prefixes: fetched, but its links are not followed");
    }
    Ok(scope)
}

/// `perc search --limit`, checked against `search.limit_max`.
pub(crate) fn search_limit(config: &config::Config, limit: u64) -> Result<usize> {
    let max = config.search.limit_max;
    if !(1..=max).contains(&limit) {
        bail!("--limit {limit}: it must be 1 to {max} (search.limit_max)");
    }
    Ok(usize::try_from(limit)?)
}
