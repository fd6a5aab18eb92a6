//! `GET /metrics`: Prometheus text (docs/serve.md, "Metrics"). Two kinds of figures:
//! the index's, read from the store at each scrape by the same call as `perc status` (so
//! they are its numbers: every process's observer counters, pages, backlog, hosts), and
//! this process's, recorded where they happen through the `metrics` facade (observer run
//! and request durations, fetches by outcome, bytes, store calls), rendered by
//! `metrics-exporter-prometheus`.

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use perc_pipeline::{Pipeline, PipelineError};
use perc_search::SearchIndex;

/// Seconds, for the duration histograms: 0.5 ms to 10 s.
const BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The process's recorder (installed once; `None` if another one was installed first).
pub fn recorder() -> Option<&'static PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets(BUCKETS)
                .expect("the buckets are not empty")
                .install_recorder()
                .map_err(
                    |e| tracing::warn!(error = %e, "no metrics recorder: GET /metrics is empty"),
                )
                .ok()?;
            describe();
            Some(handle)
        })
        .as_ref()
}

fn describe() {
    describe_gauge!("perc_pages_indexed", "Pages in the export");
    describe_gauge!("perc_duplicate_clusters", "Duplicate clusters of two or more pages");
    describe_gauge!("perc_urls_fetched", "URLs fetched or loaded, pages or not");
    describe_gauge!("perc_urls_answered", "URLs fetched that got an HTTP response");
    describe_gauge!("perc_urls_waiting", "URLs in the frontier not fetched yet");
    describe_gauge!("perc_urls_not_pages", "URLs fetched that are not pages, by reason");
    describe_gauge!("perc_notifications_pending", "Notifications waiting, by observer");
    describe_gauge!(
        "perc_notification_age_seconds",
        "How long the oldest pending notification has waited, by observer (0: none waits)"
    );
    describe_counter!("perc_observer_runs_total", "Observer runs, every process's");
    describe_counter!("perc_observer_commits_total", "Observer runs that committed");
    describe_counter!("perc_observer_skipped_total", "Notifications cleared without a run");
    describe_counter!("perc_observer_conflicts_total", "Observer runs that conflicted");
    describe_counter!("perc_observer_failures_total", "Observer runs that failed");
    describe_counter!("perc_observer_parked_total", "Notifications parked after failures");
    describe_histogram!(
        "perc_observer_run_seconds",
        Unit::Seconds,
        "Committed observer runs in this process"
    );
    describe_counter!("perc_host_requests_total", "Requests to a host, every process's");
    describe_counter!("perc_host_failed_total", "Requests to a host that failed");
    describe_counter!("perc_fetches_total", "Fetches in this process, by outcome");
    describe_counter!("perc_fetch_bytes_total", Unit::Bytes, "Body bytes fetched here");
    describe_counter!("perc_store_calls_total", "Store backend calls from this process");
    describe_gauge!("perc_store_locks", "Locks in the store: commits in flight, or left");
    describe_gauge!("perc_parked", "Parked notifications");
    describe_gauge!("perc_workers_alive", "Other live processes on the store");
    describe_gauge!("perc_oracle_reserved_timestamps", "The oracle's durable high-water mark");
    describe_gauge!(
        "perc_recrawl_lag_seconds",
        Unit::Seconds,
        "Now minus the oldest due time not fetched yet"
    );
    describe_gauge!(
        "perc_recrawl_window",
        "How many notifications the recrawl lets wait for the observers now"
    );
    describe_gauge!("perc_search_documents", "Documents in the search index");
    describe_gauge!(
        "perc_allocator_bytes",
        Unit::Bytes,
        "The memory allocator's figures, by kind: allocated (live objects), active (their \
         pages), resident (held in RAM, its own metadata included), retained (unmapped back \
         to the system but kept as address space)"
    );
    describe_histogram!(
        "perc_http_request_seconds",
        Unit::Seconds,
        "API requests, by endpoint and status"
    );
}

/// The scrape: the index's figures set from `st`, a status read, then everything rendered.
pub async fn render(
    app: &Pipeline,
    st: perc_pipeline::Status,
    search: Option<&SearchIndex>,
    allocator: Option<crate::AllocatorFigures>,
) -> Result<String, PipelineError> {
    let Some(handle) = recorder() else { return Ok(String::new()) };
    let r = &st.report;
    gauge!("perc_pages_indexed").set(r.pages as f64);
    gauge!("perc_duplicate_clusters").set(r.duplicate_clusters as f64);
    gauge!("perc_urls_fetched").set(r.fetched as f64);
    gauge!("perc_urls_answered").set(r.answered as f64);
    gauge!("perc_urls_waiting").set(r.waiting as f64);
    // A reason that had URLs and has none now reads 0, not its last count.
    {
        let mut shown = REASONS_SHOWN.lock().unwrap_or_else(|p| p.into_inner());
        for reason in shown.iter().filter(|reason| !r.not_pages.contains_key(*reason)) {
            gauge!("perc_urls_not_pages", "reason" => reason.clone()).set(0.0);
        }
        for (reason, n) in &r.not_pages {
            gauge!("perc_urls_not_pages", "reason" => reason.clone()).set(*n as f64);
            shown.insert(reason.clone());
        }
    }
    let mut observers: std::collections::BTreeSet<&String> = st.counters.keys().collect();
    observers.extend(st.pending_by_observer.keys());
    for name in observers {
        let pending = st.pending_by_observer.get(name).copied().unwrap_or(0);
        gauge!("perc_notifications_pending", "observer" => name.clone()).set(pending as f64);
        let age_ms = st.oldest_pending_ms.get(name).copied().unwrap_or(0);
        gauge!("perc_notification_age_seconds", "observer" => name.clone())
            .set(age_ms as f64 / 1000.0);
        let [runs, commits, skipped, conflicts, failures, parked] =
            st.counters.get(name).copied().unwrap_or_default();
        for (metric, v) in [
            ("perc_observer_runs_total", runs),
            ("perc_observer_commits_total", commits),
            ("perc_observer_skipped_total", skipped),
            ("perc_observer_conflicts_total", conflicts),
            ("perc_observer_failures_total", failures),
            ("perc_observer_parked_total", parked),
        ] {
            counter!(metric, "observer" => name.clone()).absolute(v);
        }
    }
    for (host, [requests, failed, _, _]) in &st.hosts {
        counter!("perc_host_requests_total", "host" => host.clone()).absolute(*requests);
        counter!("perc_host_failed_total", "host" => host.clone()).absolute(*failed);
    }
    gauge!("perc_store_locks").set(st.locks as f64);
    gauge!("perc_parked").set(st.parked.len() as f64);
    gauge!("perc_workers_alive").set(st.workers.iter().filter(|w| w.alive).count() as f64);
    gauge!("perc_oracle_reserved_timestamps").set(st.oracle.reserved_to as f64);
    let calls = app.store_calls();
    for (kind, n) in [
        ("read_row", calls.read_row),
        ("read_rows", calls.read_rows),
        ("check_and_mutate", calls.check_and_mutate),
        ("mutate_rows", calls.mutate_rows),
        ("scan", calls.scan),
        ("sync", calls.sync),
    ] {
        counter!("perc_store_calls_total", "kind" => kind).absolute(n);
    }
    let (lag_ms, _) = app.recrawl_queue(1).await?;
    gauge!("perc_recrawl_lag_seconds").set(lag_ms as f64 / 1000.0);
    gauge!("perc_recrawl_window").set(app.recrawl_window() as f64);
    if let Some(index) = search {
        gauge!("perc_search_documents").set(index.len() as f64);
    }
    for (kind, bytes) in allocator.map(|figures| figures()).unwrap_or_default() {
        gauge!("perc_allocator_bytes", "kind" => kind).set(bytes as f64);
    }
    handle.run_upkeep();
    Ok(handle.render())
}

/// How often the histograms' samples are folded into their buckets between scrapes.
pub(crate) const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Folds the histograms' samples into their buckets every `every` until `stop`. The
/// recorder keeps each sample (observer runs, requests: thousands a second) until then, and
/// a scrape is the only other time it does: a server nobody scraped grew by the samples of
/// every run it made (~2 MiB a minute while recrawling).
pub(crate) async fn keep_up(every: Duration, stop: &tokio_util::sync::CancellationToken) {
    let Some(handle) = recorder() else { return };
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => handle.run_upkeep(),
        }
    }
}

/// The reasons `perc_urls_not_pages` was ever set for, by this process.
static REASONS_SHOWN: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Records one API request's duration (the endpoint: the path of a route, else "other").
pub fn request(path: &str, status: u16, seconds: f64) {
    let endpoint = match path {
        "/" | "/metrics" | "/v1/canonical" | "/v1/page" | "/v1/search" | "/v1/status"
        | "/v1/export" | "/v1/seeds" | "/v1/refetch" => path.to_string(),
        _ => "other".to_string(),
    };
    metrics::histogram!("perc_http_request_seconds", "endpoint" => endpoint, "status" => status.to_string())
        .record(seconds);
}

#[cfg(test)]
mod tests {
    use tokio_util::sync::CancellationToken;

    use super::*;

    /// jemalloc, whose figures say what this test process holds (nextest runs each test in
    /// a process of its own).
    #[global_allocator]
    static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

    fn live() -> i64 {
        tikv_jemalloc_ctl::epoch::advance().unwrap();
        tikv_jemalloc_ctl::stats::allocated::read().unwrap() as i64
    }

    /// Records `n` run durations, yielding now and then as a server's tasks do.
    async fn runs(n: usize) {
        for i in 0..n {
            metrics::histogram!("perc_observer_run_seconds", "observer" => "parse")
                .record(0.001 * (i % 7) as f64);
            if i % 10_000 == 0 {
                tokio::task::yield_now().await;
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn histogram_samples_are_folded_without_a_scrape() {
        recorder().expect("the first recorder of this process");
        // Without the upkeep, every sample stays: a million runs hold megabytes.
        let before = live();
        runs(1_000_000).await;
        let kept = live() - before;
        assert!(kept > 4_000_000, "{kept} bytes held by a million samples");

        // With it (on this paused clock, each sleep ends as soon as every task waits), the
        // samples go into the buckets as they come.
        let stop = CancellationToken::new();
        let upkeep = tokio::spawn({
            let stop = stop.clone();
            async move { keep_up(Duration::from_millis(1), &stop).await }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let before = live();
        for _ in 0..10 {
            runs(100_000).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let held = live() - before;
        assert!(held < 2_000_000, "{held} bytes held by a million samples with the upkeep");
        stop.cancel();
        upkeep.await.unwrap();
    }
}
