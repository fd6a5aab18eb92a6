//! The index's status, as `GET /v1/status` (JSON or text), `GET /` (the status page) and
//! `GET /metrics` answer it: one store read at a time, a slow one reused for a while.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use perc_pipeline::Pipeline;

use crate::api::{optional_param, Answer, ApiError};
use crate::background::Rate;
use crate::{metrics, Served};

/// A status read: when it ran, and what it found.
pub(crate) struct StatusRead {
    ran: Span,
    /// The wall clock's ms when it started (`read_ms` in `/v1/status`).
    read_ms: u64,
    status: perc_pipeline::Status,
}

/// When a status read started and ended.
struct Span {
    started: Instant,
    ended: Instant,
}

/// A status read that took T answers the requests of the next `STATUS_REUSE` × T as well,
/// once T is over [`STATUS_REUSE_FROM`]: however many clients poll (a status page asks every
/// [`STATUS_POLL_MS`], a metrics scraper, scripts), a server spends at most a fifth of its
/// time reading its status.
const STATUS_REUSE: u32 = 4;
/// Reads quicker than this are never reused but by requests that came while they ran: on a
/// small store every status is fresh.
const STATUS_REUSE_FROM: Duration = Duration::from_millis(100);

impl Span {
    /// Whether this read may answer a request that came at `arrived`: it started after the
    /// request came (it is as fresh as a read of its own), or it was slow and is recent.
    fn answers(&self, arrived: Instant, now: Instant) -> bool {
        let took = self.ended.saturating_duration_since(self.started);
        self.started >= arrived
            || (took >= STATUS_REUSE_FROM
                && now.saturating_duration_since(self.ended) < took * STATUS_REUSE)
    }
}

impl Served {
    /// `perc status`'s read for the status endpoints: one at a time, and a slow one reused
    /// for a while ([`STATUS_REUSE`]). On a big store the read scans every page row and the
    /// lock and lease families (2.3 s at 20,000 pages: docs/benchmarks.md, "serve"); without
    /// this, a status page polling every 2 s would keep reads piling up on each other.
    /// Also when the read started, in the wall clock's ms.
    async fn read_status(&self) -> Result<(perc_pipeline::Status, u64), ApiError> {
        let arrived = Instant::now();
        let mut last = self.last_status.lock().await;
        if let Some(read) = last.as_ref().filter(|r| r.ran.answers(arrived, Instant::now())) {
            return Ok((read.status.clone(), read.read_ms));
        }
        let (started, read_ms) = (Instant::now(), self.app.now_ms());
        let status = status_off_the_api(&self.app).await?;
        let ran = Span { started, ended: Instant::now() };
        *last = Some(StatusRead { ran, read_ms, status: status.clone() });
        Ok((status, read_ms))
    }

    /// `/v1/status`'s JSON: `perc status`'s, and what a server knows besides: the search
    /// index's documents, the recrawl's lag, window and next URLs, each host's politeness
    /// state, the fetch and parse rates of the last minutes, the allocator's figures.
    async fn status_json(
        &self,
        status: perc_pipeline::Status,
        read_ms: u64,
    ) -> Result<serde_json::Value, ApiError> {
        let mut v = status.to_json();
        v["read_ms"] = read_ms.into();
        if let Some(index) = &self.search {
            // Caught up: no queue row waits (the indexer deletes its rows once its index
            // has committed what they asked for).
            let caught_up = self.app.search_caught_up().await?;
            v["search"] = serde_json::json!({
                "documents": index.len(),
                "caught_up": caught_up,
                "indexed_ms": index.caught_up_ms(),
            });
        }
        let (lag_ms, next) = self.app.recrawl_queue(NEXT_RECRAWLS).await?;
        let next: Vec<serde_json::Value> = next
            .into_iter()
            .map(|(ms, url)| serde_json::json!({"url": url, "due_ms": ms}))
            .collect();
        v["recrawl"] = serde_json::json!({
            "lag_s": lag_ms as f64 / 1000.0,
            "window": self.app.recrawl_window(),
            "next": next,
        });
        v["politeness"] = self
            .app
            .host_states()
            .into_iter()
            .map(|h| {
                serde_json::json!({
                    "host": h.host, "in_flight": h.in_flight,
                    "delay_ms": h.delay_ms, "wait_ms": h.wait_ms,
                })
            })
            .collect();
        let rates: Vec<Rate> =
            self.rates.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect();
        v["rates"] = serde_json::json!(rates);
        if let Some(figures) = self.allocator {
            let memory: serde_json::Map<_, _> = figures()
                .into_iter()
                .map(|(kind, bytes)| (kind.to_string(), bytes.into()))
                .collect();
            v["memory"] = memory.into();
        }
        v["now_ms"] = self.app.now_ms().into();
        Ok(v)
    }
}

/// `perc status`'s read on a blocking thread, so that the API's threads go on answering the
/// small questions meanwhile: it scans the page rows, and counts locks and leases with scans
/// of their families over the whole table (seconds on a big sled store: docs/benchmarks.md,
/// "serve").
async fn status_off_the_api(app: &Arc<Pipeline>) -> Result<perc_pipeline::Status, ApiError> {
    let (app, rt) = (app.clone(), tokio::runtime::Handle::current());
    match tokio::task::spawn_blocking(move || rt.block_on(app.status())).await {
        Ok(status) => Ok(status?),
        Err(e) => Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
    }
}

/// The recrawls `/v1/status` lists.
const NEXT_RECRAWLS: usize = 10;

/// The status page.
const STATUS_PAGE: &str = include_str!("status.html");

/// How often the status page asks `/v1/status` again.
const STATUS_POLL_MS: u64 = 2_000;

/// `GET /`: the status page (docs/serve.md, "Status page"): the numbers as they are now,
/// rendered here, and a small script that asks `/v1/status` every [`STATUS_POLL_MS`] and
/// redraws them, the chart and the tables.
pub(crate) async fn page_of_status(State(s): State<Arc<Served>>) -> Answer {
    let (st, _) = s.read_status().await?;
    let (lag_ms, _) = s.app.recrawl_queue(1).await?;
    let documents = s.search.as_ref().map_or_else(|| "off".to_string(), |i| i.len().to_string());
    let html = STATUS_PAGE
        .replace("{{data}}", &escape(&s.app.config().store.data))
        .replace("{{pages}}", &st.report.pages.to_string())
        .replace("{{fetched}}", &st.report.fetched.to_string())
        .replace("{{waiting}}", &st.report.waiting.to_string())
        .replace("{{pending}}", &st.pending.to_string())
        .replace("{{clusters}}", &st.report.duplicate_clusters.to_string())
        .replace("{{documents}}", &documents)
        .replace("{{lag}}", &format!("{:.1}", lag_ms as f64 / 1000.0))
        .replace("{{poll_ms}}", &STATUS_POLL_MS.to_string());
    Ok(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response())
}

/// Text for HTML.
fn escape(raw: &str) -> String {
    raw.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// `GET /metrics`: Prometheus text (see [`metrics`]).
pub(crate) async fn scrape(State(s): State<Arc<Served>>) -> Answer {
    let (status, _) = s.read_status().await?;
    let text = metrics::render(&s.app, status, s.search.as_deref(), s.allocator).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
}

/// `GET /v1/status`: `perc status` as JSON, and the documents of the search index;
/// `?format=text`: the text `perc status` prints.
pub(crate) async fn status(State(s): State<Arc<Served>>, RawQuery(q): RawQuery) -> Answer {
    let text = match optional_param(q.as_deref(), "format", s.query_bytes_max)?.as_deref() {
        None | Some("json") => false,
        Some("text") => true,
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("format {other:?}: it is json or text"),
            ))
        }
    };
    let (status, read_ms) = s.read_status().await?;
    if text {
        let text = status.to_text();
        return Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response());
    }
    Ok(Json(s.status_json(status, read_ms).await?).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(started_ms: u64, took_ms: u64, base: Instant) -> Span {
        let started = base + Duration::from_millis(started_ms);
        Span { started, ended: started + Duration::from_millis(took_ms) }
    }

    #[test]
    fn a_status_read_answers_who_came_before_it_and_a_slow_one_a_while_longer() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // A quick read answers only the requests that came before it started.
        let quick = read(1_000, 5, t0);
        assert!(quick.answers(at(900), at(1_010)));
        assert!(quick.answers(at(1_000), at(1_010)));
        assert!(!quick.answers(at(1_001), at(1_006)));
        // A read of 2 s answers for 8 s after it ended, not longer.
        let slow = read(1_000, 2_000, t0);
        assert!(slow.answers(at(3_500), at(3_500)));
        assert!(slow.answers(at(10_999), at(10_999)));
        assert!(!slow.answers(at(11_000), at(11_000)));
    }
}
