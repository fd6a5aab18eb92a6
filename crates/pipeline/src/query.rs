//! The verbs that read the index: a page's canonical and record, the export, the recrawl's
//! queue, and the search queue an index drains.

use std::time::{Duration, Instant};

use perc_observers::model::ExportLine;
use perc_observers::search::{Documents, Queued, SearchDoc};
use perc_observers::PageInfo;
use url::Url;

use crate::{Pipeline, Result};

/// How often a running process checks the search queue's size.
pub(crate) const QUEUE_CHECK_EVERY: Duration = Duration::from_secs(60);

/// What `perc page` prints and `GET /v1/page` answers for `url`: the export line with what
/// the page declares that the export leaves out (its declared canonical, a delayed refresh,
/// its simhash), or why the URL is not a page, as JSON text (the export line's fields in the
/// export's order); `None` when the index does not know it. With `fetch`, the recrawl state
/// of a URL fetched live: `"fetch": {last_ms, next_ms, interval_s, changed, unchanged}`
/// (times in ms since the epoch), and `failures` and `failure` while its fetches fail (the
/// stored answer stands meanwhile).
pub fn page_record(
    url: &Url,
    info: PageInfo,
    fetch: Option<&perc_observers::model::FetchState>,
) -> Option<String> {
    #[derive(serde::Serialize)]
    struct Shown {
        #[serde(flatten)]
        line: ExportLine,
        #[serde(skip_serializing_if = "Option::is_none")]
        declared_canonical: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        refresh: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        simhash: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        fetch: Option<serde_json::Value>,
    }
    let fetch = fetch.map(|f| {
        let mut v = serde_json::json!({
            "last_ms": f.last_ms, "next_ms": f.next_ms, "interval_s": f.interval_s,
            "changed": f.changed, "unchanged": f.unchanged,
        });
        if let Some(why) = &f.failure {
            v["failures"] = f.failures.into();
            v["failure"] = why.as_str().into();
        }
        v
    });
    Some(match info {
        PageInfo::Page(line, meta) => serde_json::to_string(&Shown {
            line,
            declared_canonical: meta.declared_canonical,
            refresh: meta.refresh,
            simhash: meta.simhash,
            fetch,
        })
        .expect("serializable"),
        PageInfo::NotAPage(meta) => {
            let mut v = serde_json::json!({
                "url": url.as_str(), "kind": meta.kind, "reason": meta.reason,
                "status": meta.status, "redirect_to": meta.redirect_to
            });
            if let Some(f) = fetch {
                v["fetch"] = f;
            }
            v.to_string()
        }
        PageInfo::Pending => serde_json::json!({
            "url": url.as_str(), "kind": "pending", "reason": "in the frontier, not fetched yet"
        })
        .to_string(),
        PageInfo::Unknown => return None,
    })
}

impl Pipeline {
    /// How late the recrawl is: now minus the oldest due time not fetched yet (0 when
    /// nothing is due), in ms; and the next `n` URLs due, with their due times.
    pub async fn recrawl_queue(&self, n: usize) -> Result<(u64, Vec<(u64, String)>)> {
        let now = self.client.clock().now_ms();
        let next = perc_observers::next_due(&self.client, n).await?;
        let lag = next.first().map_or(0, |(due, _)| now.saturating_sub(*due));
        Ok((lag, next))
    }

    /// The canonical URL of a page, a duplicate or an alias; `Err` says what the URL is
    /// instead.
    pub async fn canonical(&self, url: &Url) -> Result<Result<String, String>> {
        Ok(perc_observers::canonical(&self.client, url).await?)
    }

    /// What the index knows of one URL.
    pub async fn page(&self, url: &Url) -> Result<PageInfo> {
        Ok(perc_observers::page_info(&self.client, url).await?)
    }

    /// What `perc page` prints and `GET /v1/page` answers (see [`page_record`]), with the
    /// URL's recrawl state; `None` for a URL the index does not know.
    pub async fn page_json(&self, url: &Url) -> Result<Option<String>> {
        let info = self.page(url).await?;
        let fetch = perc_observers::fetch_state(&self.client, url).await?;
        Ok(page_record(url, info, fetch.as_ref()))
    }

    /// The export, one line at a time in URL order; returns the number of lines.
    pub async fn export(&self, mut each: impl FnMut(ExportLine) -> Result<()>) -> Result<usize> {
        let mut n = 0;
        perc_observers::export_each(&self.client, |l| {
            n += 1;
            each(l)
        })
        .await?;
        Ok(n)
    }

    /// The link graph, one edge at a time in (to, from) order, at one snapshot
    /// (`perc export --links`); returns how many edges.
    pub async fn export_links(
        &self,
        mut each: impl FnMut(perc_observers::model::LinkLine) -> Result<()>,
    ) -> Result<usize> {
        let mut n = 0;
        perc_observers::links_each(&self.client, |l| {
            n += 1;
            each(l)
        })
        .await?;
        Ok(n)
    }

    /// Hands the search queue (docs/serve.md, "Search") to `apply`, `max` rows a
    /// transaction; `apply` makes a search index hold what they ask for durably, then they
    /// are deleted (see `perc_observers::search::drain`). An index just built from
    /// [`Pipeline::search_documents`] gives the snapshot it was built at (`built_at`): the
    /// rows committed before it are deleted without being applied. `apply`'s error leaves
    /// them queued and is returned inside. Returns the URLs applied.
    pub async fn drain_search<E>(
        &self,
        max: usize,
        built_at: Option<u64>,
        apply: impl FnMut(&[Queued]) -> Result<(), E>,
    ) -> Result<Result<usize, E>> {
        Ok(perc_observers::search::drain(&self.client, max, built_at, apply).await?)
    }

    /// Whether the search queue is empty: an index that drained it is caught up.
    pub async fn search_caught_up(&self) -> Result<bool> {
        Ok(perc_observers::search::caught_up(&self.client).await?)
    }

    /// Every search document at one snapshot, in URL order: what an index built from nothing
    /// holds before it drains the queue. Returns how many, the queue's generation at that
    /// snapshot (see [`Pipeline::search_generation`]) and the snapshot's timestamp.
    pub async fn search_documents(
        &self,
        each: impl FnMut(SearchDoc) -> Result<()>,
    ) -> Result<Documents> {
        perc_observers::search::each_document(&self.client, each).await
    }

    /// The search queue's generation: how many times [`Pipeline::trim_search_queue`]
    /// emptied it. An index built in an older one missed rows, and is built again.
    pub async fn search_generation(&self) -> Result<u64> {
        Ok(perc_observers::search::generation(&self.client).await?)
    }

    /// Empties the search queue if it holds more than `search.queue_max` rows (nothing
    /// drains it: a crawl or replay keeps no search index); the rows deleted.
    pub async fn trim_search_queue(&self) -> Result<usize> {
        let keep = usize::try_from(self.config.search.queue_max).unwrap_or(usize::MAX);
        Ok(perc_observers::search::trim(&self.client, keep).await?)
    }

    /// [`Pipeline::trim_search_queue`] at the end of a run (`now`), and every
    /// [`QUEUE_CHECK_EVERY`] while one goes on: the queue stays bounded in every process,
    /// whether or not a search index drains it. A failure is logged; the next check tries
    /// again.
    pub async fn bound_search_queue(&self, now: bool) {
        {
            let mut checked = self.queue_checked.lock().unwrap_or_else(|p| p.into_inner());
            if !now && checked.is_some_and(|at| at.elapsed() < QUEUE_CHECK_EVERY) {
                return;
            }
            *checked = Some(Instant::now());
        }
        match self.trim_search_queue().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                "the search queue held more than search.queue_max rows: {n} deleted (a search \
                 index built before is built again when it next catches up)"
            ),
            Err(e) => tracing::warn!(error = %e, "cannot check the search queue's size"),
        }
    }

    /// The export as JSON Lines (one string a page, without the newline), in URL order.
    pub async fn export_jsonl(&self) -> Result<Vec<String>> {
        let mut lines = Vec::new();
        self.export(|l| {
            lines.push(serde_json::to_string(&l).expect("an export line serializes"));
            Ok(())
        })
        .await?;
        Ok(lines)
    }
}
