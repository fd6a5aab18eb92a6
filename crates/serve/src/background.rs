//! What `perc serve` runs beside its API: the recrawl scheduler, the search indexer, and
//! the sampling of the fetch and parse rates the status page shows.

use std::time::Duration;

use perc_pipeline::Pipeline;
use perc_search::{SearchError, SearchIndex};
use tokio_util::sync::CancellationToken;

use crate::Served;

/// The recrawl scheduler: every `recrawl.tick_ms`, asks again for the URLs that are due
/// (the fetch observer reschedules each). An error is logged and tried again next tick.
pub(crate) async fn recrawl(app: &Pipeline, stop: &CancellationToken) {
    let tick = Duration::from_millis(app.config().recrawl.tick_ms);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(tick) => {}
        }
        match app.recrawl_due().await {
            Ok(0) => {}
            Ok(n) => tracing::debug!("recrawl: {n} URLs due"),
            Err(e) => {
                app.note(&e);
                tracing::warn!(error = %e, "recrawl: cannot ask for the due URLs");
            }
        }
    }
}

/// One point of the status page's chart: this process's fetches and parses a second over
/// the [`RATE_SAMPLE_MS`] before `ms`.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub(crate) struct Rate {
    ms: u64,
    fetched_per_s: f64,
    parsed_per_s: f64,
}

/// How often the rates are sampled, and how many samples are kept (10 minutes).
const RATE_SAMPLE_MS: u64 = 2_000;
const RATES_KEPT: usize = 300;

/// Samples this process's fetch runs and parse commits every [`RATE_SAMPLE_MS`] (counters
/// in memory: no store read) into `served.rates`, until `stop`.
pub(crate) async fn sample_rates(served: &Served, stop: &CancellationToken) {
    let counts = || {
        let stats = served.app.observer_stats();
        let of = |name: &str| stats.iter().find(|s| s.name == name);
        (of("fetch").map_or(0, |s| s.runs), of("parse").map_or(0, |s| s.commits))
    };
    let mut last = (served.app.now_ms(), counts());
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(RATE_SAMPLE_MS)) => {}
        }
        let now = (served.app.now_ms(), counts());
        let secs = (now.0.saturating_sub(last.0) as f64 / 1000.0).max(0.001);
        let rate = Rate {
            ms: now.0,
            fetched_per_s: now.1 .0.saturating_sub(last.1 .0) as f64 / secs,
            parsed_per_s: now.1 .1.saturating_sub(last.1 .1) as f64 / secs,
        };
        last = now;
        let mut rates = served.rates.lock().unwrap_or_else(|p| p.into_inner());
        if rates.len() == RATES_KEPT {
            rates.pop_front();
        }
        rates.push_back(rate);
    }
}

/// The search indexer, on a thread of its own (tantivy's commits block): brings the index
/// up to date with the store every `search.tick_ms` until `stop`. An error is logged and
/// tried again next tick; the queue keeps what was not indexed.
pub(crate) fn index_loop(
    app: &Pipeline,
    index: &SearchIndex,
    stop: &CancellationToken,
    rt: &tokio::runtime::Handle,
) {
    let search = &app.config().search;
    let tick = Duration::from_millis(search.tick_ms);
    let batch = usize::try_from(search.batch).unwrap_or(usize::MAX);
    while !stop.is_cancelled() {
        match rt.block_on(index.catch_up(app, batch, stop)) {
            Ok(None) => break,
            Ok(Some((0, 0))) => {}
            Ok(Some((built, applied))) => tracing::debug!(built, applied, "search: indexed"),
            Err(e) => {
                if let SearchError::Pipeline(p) = &e {
                    app.note(p);
                }
                tracing::warn!(error = %e, "search: cannot bring the index up to date");
            }
        }
        rt.block_on(async {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(tick) => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use perc_pipeline::{Config, Fetching};
    use perc_store::{Call, Hook, Hooked, MemStore, Store};
    use std::sync::Arc;

    /// Once armed, freezes every scan, and says when the first one came.
    struct FrozenScans(Arc<tokio::sync::Notify>, Arc<std::sync::atomic::AtomicBool>);

    #[async_trait::async_trait]
    impl Hook for FrozenScans {
        async fn before(&self, call: Call<'_>) {
            let armed = self.1.load(std::sync::atomic::Ordering::SeqCst);
            if armed && matches!(call, Call::Scan(_) | Call::ScanMany(_)) {
                self.0.notify_one();
                std::future::pending::<()>().await;
            }
        }
    }

    #[test]
    fn a_stop_ends_the_search_index_build_in_its_tracks() {
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        let scanned = Arc::new(tokio::sync::Notify::new());
        let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let app = rt.block_on(async {
            let mut config = Config::defaults();
            config.store.backend = perc_pipeline::Backend::Memory;
            let hook = FrozenScans(scanned.clone(), armed.clone());
            let store = Hooked::new(MemStore::new(perc_notify::schema()), hook);
            let store: Arc<dyn Store> = Arc::new(store);
            Pipeline::builder(config).store(store).fetching(Fetching::Offline).open().await
        });
        let app = Arc::new(app.unwrap());
        let index = Arc::new(SearchIndex::open(None).unwrap());
        armed.store(true, std::sync::atomic::Ordering::SeqCst);
        let stop = CancellationToken::new();
        let (done, returned) = std::sync::mpsc::channel();
        let looping = {
            let (app, index, stop, handle) =
                (app.clone(), index.clone(), stop.clone(), rt.handle().clone());
            std::thread::spawn(move || {
                index_loop(&app, &index, &stop, &handle);
                done.send(()).unwrap();
            })
        };
        // The build's first scan is frozen: only the stop can end the loop now.
        rt.block_on(scanned.notified());
        stop.cancel();
        assert!(
            returned.recv_timeout(Duration::from_secs(60)).is_ok(),
            "the loop did not end on the stop"
        );
        looping.join().unwrap();
    }
}
