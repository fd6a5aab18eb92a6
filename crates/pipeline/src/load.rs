//! The verbs that put work into the index: a crawl's seeds and scope (with their
//! sitemaps), a replay of WARCs, a refetch, the recrawl of what is due.

use std::path::PathBuf;

use perc_crawl::warc::{Recorded, WarcIssue};
use perc_observers::model::CrawlScope;
use perc_observers::Report;
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::config::Config;
use crate::run::RunSummary;
use crate::{Pipeline, PipelineError, Result};

/// Responses a replay loads per transaction batch.
pub(crate) const REPLAY_BATCH: usize = 256;

/// The crawl's scope from the configured and the given prefixes, and the seeds outside it
/// (fetched, but their links not followed). An error names a prefix that is not an absolute
/// http(s) URL, or says that no seed is inside the prefixes.
pub fn crawl_scope(
    config: &Config,
    seeds: &[Url],
    prefixes: &[String],
) -> Result<(CrawlScope, Vec<Url>)> {
    let mut all_prefixes = config.crawl.prefixes.clone();
    all_prefixes.extend(prefixes.iter().cloned());
    let scope = perc_crawl::Scope::new(seeds, &all_prefixes).map_err(PipelineError::Input)?;
    let outside: Vec<Url> = seeds.iter().filter(|s| !scope.contains(s)).cloned().collect();
    if !all_prefixes.is_empty() && outside.len() == seeds.len() {
        return Err(PipelineError::Input(format!(
            "no seed is inside the scope prefixes ({}): nothing could be crawled",
            all_prefixes.join(", ")
        )));
    }
    let scope = CrawlScope {
        seeds: seeds.iter().map(Url::to_string).collect(),
        prefixes: all_prefixes,
        max_depth: config.crawl.max_depth,
        max_redirects: config.crawl.max_redirects,
    };
    Ok((scope, outside))
}

/// What a replay did.
#[derive(Clone, Debug)]
pub struct Replayed {
    /// WARC files read.
    pub files: usize,
    /// Response records loaded.
    pub loaded: usize,
    /// Records that could not be read, each named by file and offset.
    pub issues: Vec<WarcIssue>,
    pub run: RunSummary,
    /// Pages in the export afterwards.
    pub pages: usize,
}

/// What a refetch did.
#[derive(Clone, Debug)]
pub struct Refetched {
    /// Known URLs whose fetch was asked for again.
    pub refetched: usize,
    /// URLs not known to the index: not fetched.
    pub unknown: Vec<Url>,
    pub run: RunSummary,
    /// Pages in the export afterwards.
    pub pages: usize,
}

impl Pipeline {
    /// Starts (or restarts) a crawl from `seeds` within `scope` and runs it to quiescence;
    /// returns the run's summary and the index's report (its `seeds_answered` counts these
    /// seeds).
    pub async fn crawl(
        &self,
        seeds: &[Url],
        scope: &CrawlScope,
        stop: &CancellationToken,
    ) -> Result<(RunSummary, Report)> {
        // What this crawl wants is wanted after this timestamp: its report counts what it
        // tried, whichever process fetched it.
        let since = self.client.oracle().next().await?;
        // Its pages are ranked once, at the end (see `replay`).
        perc_observers::rank::defer(&self.client).await?;
        self.add_seeds(seeds, scope).await?;
        let run = self.run_until_quiet("crawl", stop).await?;
        Ok((run, perc_observers::report_since(&self.client, seeds, since.0).await?))
    }

    /// Adds `seeds` (and the in-scope URLs of the sitemaps their robots.txt files name) to
    /// the frontier within `scope`, for the workers to crawl: what a crawl starts with.
    pub async fn add_seeds(&self, seeds: &[Url], scope: &CrawlScope) -> Result<()> {
        let wanted = self.with_sitemaps(seeds, scope).await?;
        perc_observers::seed(&self.client, &wanted, scope).await?;
        Ok(())
    }

    /// `seeds`, and (with `crawl.sitemaps`) the in-scope URLs of the sitemaps their
    /// robots.txt files name.
    pub(crate) async fn with_sitemaps(
        &self,
        seeds: &[Url],
        scope: &CrawlScope,
    ) -> Result<Vec<Url>> {
        let mut wanted = seeds.to_vec();
        if self.config.crawl.sitemaps {
            wanted.extend(self.sitemap_seeds(seeds, scope).await?);
        }
        Ok(wanted)
    }

    /// The in-scope URLs of the sitemaps that the seeds' robots.txt files name, not seeds
    /// already (spec §6.1). Each sitemap that cannot be read is a warning naming it.
    pub(crate) async fn sitemap_seeds(
        &self,
        seeds: &[Url],
        scope: &CrawlScope,
    ) -> Result<Vec<Url>> {
        let in_scope = perc_crawl::Scope::new(seeds, &scope.prefixes)
            .map_err(|e| PipelineError::Setup(e.to_string()))?;
        let mut origins = std::collections::BTreeSet::new();
        let mut roots = Vec::new();
        for seed in seeds {
            if !origins.insert(seed.origin().ascii_serialization()) {
                continue;
            }
            for line in self.source.sitemaps_of(seed).await {
                match seed.join(line.trim()).map(String::from).map(|u| perc_crawl::normalize(&u)) {
                    Ok(Ok(u)) => roots.push(u),
                    _ => tracing::warn!("robots.txt of {seed}: Sitemap: {line:?} is not a URL"),
                }
            }
        }
        let known: std::collections::HashSet<&Url> = seeds.iter().collect();
        let wanted = |u: &Url| in_scope.contains(u) && !known.contains(u);
        let most = usize::try_from(self.config.crawl.sitemap_urls_max).unwrap_or(usize::MAX);
        let (urls, warnings) =
            perc_crawl::sitemap::collect(self.source.as_ref(), &roots, &wanted, most).await;
        for w in warnings {
            tracing::warn!("{w}");
        }
        Ok(urls)
    }

    /// Loads every response record of `files` (a directory: its WARCs, in name order) and
    /// runs the observers to quiescence. Records stream from a reading thread in batches:
    /// memory stays flat in the size of the files.
    pub async fn replay(&self, files: &[PathBuf], stop: &CancellationToken) -> Result<Replayed> {
        let files = perc_crawl::warc::expand(files)
            .map_err(PipelineError::io("cannot list the WARC directory"))?;
        let mut issues = Vec::new();
        let mut loaded = 0;
        // The rank runs wait, and the ranks are settled at the end
        // (`perc_observers::rank::settle`, in `run_until_quiet`): ~35 rounds of pushes from
        // nothing cost more than the replay.
        perc_observers::rank::defer(&self.client).await?;
        for f in &files {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<Recorded>>(4);
            let (path, max) = (f.clone(), self.config.crawl.body_bytes_max);
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
            loop {
                let batch = tokio::select! {
                    b = rx.recv() => b,
                    _ = stop.cancelled() => return Err(PipelineError::Interrupted),
                };
                let Some(batch) = batch else { break };
                loaded += batch.len();
                perc_observers::load_recorded(&self.client, &batch).await?;
            }
            let read = reading.await.expect("the WARC reader does not panic");
            issues.extend(read.map_err(PipelineError::io(format!("cannot read {}", f.display())))?);
        }
        let run = self.run_until_quiet("replay", stop).await?;
        let pages = perc_observers::page_count(&self.client).await?;
        Ok(Replayed { files: files.len(), loaded, issues, run, pages })
    }

    /// Fetches `targets` again (all known URLs when `None`) and runs the observers to
    /// quiescence.
    pub async fn refetch(
        &self,
        targets: Option<&[Url]>,
        stop: &CancellationToken,
    ) -> Result<Refetched> {
        let (refetched, unknown) = self.want_again(targets).await?;
        let run = self.run_until_quiet("refetch", stop).await?;
        let pages = perc_observers::page_count(&self.client).await?;
        Ok(Refetched { refetched, unknown, run, pages })
    }

    /// Asks for `targets` again (all known URLs when `None`) without waiting: how many were
    /// asked for, and the URLs not known (not asked for).
    pub async fn want_again(&self, targets: Option<&[Url]>) -> Result<(usize, Vec<Url>)> {
        let all;
        let targets = match targets {
            Some(t) => t,
            None => {
                all = perc_observers::known_urls(&self.client).await?;
                &all
            }
        };
        let unknown = perc_observers::refetch(&self.client, targets).await?;
        Ok((targets.len() - unknown.len(), unknown))
    }

    /// Adds `seeds` to what this index crawls, without waiting: the stored scope grows by
    /// theirs (narrowed by `prefixes`, else their origins), and they are fetched (again).
    /// Returns the seeds outside `prefixes` (fetched, their links not followed), and the
    /// scope they were added with, for [`Pipeline::add_sitemap_urls`]. One transaction: it
    /// fetches nothing, so it answers at once whatever the seeds' hosts do.
    pub async fn extend_seeds(
        &self,
        seeds: &[Url],
        prefixes: &[String],
    ) -> Result<(Vec<Url>, CrawlScope)> {
        let (scope, outside) = crawl_scope(&self.config, seeds, prefixes)?;
        perc_observers::seed_more(&self.client, seeds, &scope).await?;
        Ok((outside, scope))
    }

    /// With `crawl.sitemaps`, adds the in-scope URLs of the sitemaps that the seeds' robots.txt
    /// files name to the frontier; how many. It fetches robots.txt and the sitemaps, politely:
    /// seconds or minutes, which `perc serve` spends after it has answered.
    pub async fn add_sitemap_urls(&self, seeds: &[Url], scope: &CrawlScope) -> Result<usize> {
        if !self.config.crawl.sitemaps {
            return Ok(0);
        }
        let urls = self.sitemap_seeds(seeds, scope).await?;
        if !urls.is_empty() {
            perc_observers::seed_more(&self.client, &urls, scope).await?;
        }
        Ok(urls.len())
    }

    /// Asks again for the URLs that are due for a recrawl now (at most `recrawl.batch`),
    /// without waiting; how many. Back-pressure: it asks for no more than the room in the
    /// recrawl's window on the notifications waiting for the observers, which follows how
    /// long the oldest of them has waited ([`crate::pace`]); the URLs left due are asked for
    /// at a later tick (the recrawl's lag shows how late), so a recrawl that asks more than
    /// the machine indexes never buries the stages after the fetch.
    pub async fn recrawl_due(&self) -> Result<usize> {
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        let recrawl = &self.config.recrawl;
        let pending_max = size(recrawl.pending_max);
        let backlog = self.engine.backlog(pending_max).await?;
        let registry = self.engine.registry();
        let observed = |name: &str| registry.all().any(|r| r.name == name);
        // A column no observer watches waits for nobody: it does not hold the recrawl.
        let oldest_ms = (backlog.iter())
            .filter(|(name, _)| observed(name))
            .map(|(_, b)| b.oldest_ms)
            .max()
            .unwrap_or(0);
        let pending = backlog.values().map(|b| b.pending).sum();
        let age_max_ms = recrawl.pending_age_s.saturating_mul(1000);
        let now = self.client.clock().now_ms();
        let waiting = crate::pace::Waiting { now_ms: now, pending, oldest_ms };
        let room = self.pace().room(waiting, age_max_ms, pending_max);
        let limit = size(recrawl.batch).min(room);
        if limit == 0 {
            return Ok(0);
        }
        let asked = perc_observers::recrawl_due(&self.client, now, limit).await?;
        self.pace().asked(asked, room);
        Ok(asked)
    }

    /// How many notifications the recrawl lets wait now ([`crate::pace`]).
    pub fn recrawl_window(&self) -> usize {
        self.pace().window()
    }

    fn pace(&self) -> std::sync::MutexGuard<'_, crate::pace::Pace> {
        self.pace.lock().unwrap_or_else(|p| p.into_inner())
    }
}
