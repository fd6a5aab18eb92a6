//! The recrawl as a long-running service meets it.
//!
//! - A site that fails for a while loses nothing (spec §11): through every kind of outage a
//!   refetch can meet (no connection, a timeout, robots.txt unreachable, 5xx, 429) each page
//!   keeps its last version in the export, its fetch state says why it was not refreshed, and
//!   it is asked again sooner; once the site answers, the index follows it again. A URL never
//!   fetched before is recorded with the reason meanwhile, and becomes a page once it answers.
//! - Back-pressure: the scheduler asks for no more due URLs while `recrawl.pending_max`
//!   notifications wait, and for no more than would reach it; nor for any while the oldest
//!   notification waiting has waited `recrawl.pending_age_s`, however few wait.
//! - A URL once found stays known (spec §6.5): a page that loses every inlink stays a page
//!   while it answers, is recrawled like any other, and leaves the export when it answers
//!   404.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use perc_crawl::{Fetched, Response, Source};
use perc_observers::model::CrawlScope;
use perc_pipeline::{Backend, Config, Pipeline};
use perc_txn::ManualClock;
use url::Url;

/// A site that answers from its pages, or, while it is down, with the outage's answer.
#[derive(Clone, Default)]
struct Site {
    pages: Arc<Mutex<BTreeMap<String, String>>>,
    down: Arc<Mutex<Option<Fetched>>>,
}

impl Site {
    fn set(&self, url: &str, html: &str) {
        self.pages.lock().unwrap().insert(url.into(), html.into());
    }
    fn down(&self, outage: Option<Fetched>) {
        *self.down.lock().unwrap() = outage;
    }
}

fn response(status: u16, body: &str) -> Response {
    Response::html(status, body.to_string())
}

/// A pipeline in memory fetching from `site`, configured by `set`, on a clock that stands
/// still unless moved.
async fn app(site: &Site, set: impl FnOnce(&mut Config)) -> (Pipeline, Arc<ManualClock>) {
    let mut config = Config::defaults();
    config.store.backend = Backend::Memory;
    set(&mut config);
    let clock = Arc::new(ManualClock::new(1_000_000));
    let app = Pipeline::builder(config)
        .source(Arc::new(site.clone()))
        .clock(clock.clone())
        .open()
        .await
        .unwrap();
    (app, clock)
}

#[async_trait]
impl Source for Site {
    async fn get(&self, url: &Url) -> Fetched {
        if let Some(outage) = self.down.lock().unwrap().clone() {
            return outage;
        }
        match self.pages.lock().unwrap().get(url.as_str()) {
            Some(html) => Fetched::Response(response(200, html)),
            None => Fetched::Response(response(404, "")),
        }
    }
}

const A: &str = "http://site.test/a";
const B: &str = "http://site.test/b";
const C: &str = "http://site.test/c";

fn page(title: &str, links: &[&str]) -> String {
    let links: String = links.iter().map(|l| format!("<a href=\"{l}\">to {l}</a>")).collect();
    format!(
        "<html><head><title>{title}</title></head><body><p>{title} words</p>{links}</body></html>"
    )
}

async fn export(app: &Pipeline) -> Vec<String> {
    app.export_jsonl().await.unwrap()
}

async fn fetch_state(app: &Pipeline, url: &str) -> serde_json::Value {
    let text = app.page_json(&Url::parse(url).unwrap()).await.unwrap().unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["fetch"].clone()
}

async fn refetch_all(app: &Pipeline) {
    app.want_again(None).await.unwrap();
    app.engine().run_until_quiet().await.unwrap();
}

async fn crawl(app: &Pipeline, seed: &str) {
    let scope =
        CrawlScope { seeds: vec![seed.into()], prefixes: vec![], max_depth: 20, max_redirects: 5 };
    perc_observers::seed(app.client(), &[Url::parse(seed).unwrap()], &scope).await.unwrap();
    app.engine().run_until_quiet().await.unwrap();
}

#[test]
fn an_outage_keeps_every_page_and_the_index_follows_the_site_once_it_is_back() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let site = Site::default();
        site.set(A, &page("A", &[B, C]));
        site.set(B, &page("B", &[A]));
        site.set(C, &page("C", &[A]));
        let (app, _) = app(&site, |c| {
            c.recrawl.min_interval_s = 60;
            c.recrawl.interval_s = 3_600;
        })
        .await;
        crawl(&app, A).await;
        let before = export(&app).await;
        assert_eq!(before.len(), 3, "{before:#?}");

        let outages = [
            Fetched::Unavailable("cannot connect to site.test: Connection refused".into()),
            Fetched::Unavailable("timed out after 30000 ms".into()),
            Fetched::Unavailable("robots.txt unreachable: robots.txt answered HTTP 503".into()),
            Fetched::Response(response(503, "<title>down for maintenance</title>")),
            Fetched::Response(response(429, "")),
        ];
        for (n, outage) in outages.iter().enumerate() {
            site.down(Some(outage.clone()));
            refetch_all(&app).await;
            assert_eq!(export(&app).await, before, "{outage:?} changed the export");
            // The state says why, and asks again sooner each time in a row.
            let state = fetch_state(&app, A).await;
            let failures = n as u64 + 1;
            assert_eq!(state["failures"], failures, "{state}");
            let why = state["failure"].as_str().unwrap();
            match outage {
                Fetched::Unavailable(reason) => assert_eq!(why, reason),
                Fetched::Response(r) => assert_eq!(why, format!("HTTP {}", r.status)),
                _ => unreachable!(),
            }
            let wait_s =
                (state["next_ms"].as_u64().unwrap() - state["last_ms"].as_u64().unwrap()) / 1000;
            assert_eq!(wait_s, (60 << (failures - 1)).min(3_600), "{state}");
            assert_eq!(state["interval_s"], 3_600, "a failure keeps the interval: {state}");
        }

        // The site is back: the next fetches end the streak, and nothing changed.
        site.down(None);
        refetch_all(&app).await;
        assert_eq!(export(&app).await, before);
        let state = fetch_state(&app, A).await;
        assert!(state.get("failures").is_none(), "an answer ends the streak: {state}");

        // The site is back after a change: the index follows it.
        site.set(B, &page("B, changed", &[A]));
        refetch_all(&app).await;
        let after = export(&app).await;
        assert!(after.iter().any(|l| l.contains("B, changed")), "{after:#?}");
    });
}

#[test]
fn a_url_never_fetched_is_recorded_with_the_reason_until_it_answers() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let site = Site::default();
        site.set(A, &page("A", &[]));
        let (app, _) = app(&site, |_| {}).await;
        site.down(Some(Fetched::Unavailable("cannot connect to site.test".into())));
        crawl(&app, A).await;
        assert!(export(&app).await.is_empty());
        let text = app.page_json(&Url::parse(A).unwrap()).await.unwrap().unwrap();
        assert!(text.contains("cannot connect to site.test"), "{text}");
        site.down(None);
        refetch_all(&app).await;
        assert_eq!(export(&app).await.len(), 1);
    });
}

/// Eight pages that link to each other, crawled, each due again a minute after its fetch;
/// configured further by `set`.
async fn eight_pages_crawled(set: impl FnOnce(&mut Config)) -> (Pipeline, Arc<ManualClock>) {
    let site = Site::default();
    let urls: Vec<String> = (0..8).map(|i| format!("http://site.test/p{i}")).collect();
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    for u in &urls {
        site.set(u, &page(u, &refs));
    }
    let (app, clock) = app(&site, |c| {
        c.recrawl.interval_s = 60;
        c.recrawl.min_interval_s = 60;
        set(c);
    })
    .await;
    crawl(&app, &urls[0]).await;
    assert_eq!(export(&app).await.len(), 8);
    (app, clock)
}

#[test]
fn the_recrawl_asks_for_nothing_while_the_index_is_behind() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (app, clock) = eight_pages_crawled(|c| c.recrawl.pending_max = 3).await;
        // Every URL is due; nothing waits: it asks for as many as would reach the bound.
        clock.advance_ms(61_000);
        assert_eq!(app.recrawl_due().await.unwrap(), 3);
        // Three fetches wait now: it asks for nothing more.
        assert_eq!(app.recrawl_due().await.unwrap(), 0);
        assert_eq!(app.recrawl_due().await.unwrap(), 0);
        // Once the index has caught up, the rest are asked for, a bounded share at a time.
        app.engine().run_until_quiet().await.unwrap();
        assert_eq!(app.recrawl_due().await.unwrap(), 3);
        app.engine().run_until_quiet().await.unwrap();
        assert_eq!(app.recrawl_due().await.unwrap(), 2, "the last two due");
        app.engine().run_until_quiet().await.unwrap();
        assert_eq!(app.recrawl_due().await.unwrap(), 0, "none due until the next interval");
    });
}

#[test]
fn the_recrawl_asks_for_nothing_while_a_notification_has_waited_too_long() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (app, clock) = eight_pages_crawled(|c| c.recrawl.pending_age_s = 30).await;
        // One notification waits for parse (a row with nothing to parse), far under
        // pending_max, for 31 s: every URL is due, and none is asked for.
        let parse = app.engine().registry().all().find(|r| r.name == "parse").unwrap();
        let mut t = app.client().begin().await.unwrap();
        t.notify(&b"waiting"[..], parse.column.clone());
        t.commit().await.unwrap();
        clock.advance_ms(31_000);
        assert_eq!(app.recrawl_due().await.unwrap(), 0);
        clock.advance_ms(30_000);
        assert_eq!(app.recrawl_due().await.unwrap(), 0);
        // Once it has run, the due URLs are asked for again.
        app.engine().run_until_quiet().await.unwrap();
        assert_eq!(app.recrawl_due().await.unwrap(), 8);
    });
}

#[test]
fn an_orphan_stays_a_page_while_it_answers_and_leaves_when_it_is_gone() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let site = Site::default();
        site.set(A, &page("A", &[B]));
        site.set(B, &page("B", &[]));
        let (app, _) = app(&site, |_| {}).await;
        crawl(&app, A).await;
        assert_eq!(export(&app).await.len(), 2);
        // A no longer links to B: B keeps its line, with no inlink.
        site.set(A, &page("A", &[]));
        refetch_all(&app).await;
        let lines = export(&app).await;
        assert_eq!(lines.len(), 2, "{lines:#?}");
        let b: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!((b["url"].as_str(), b["in_degree"].as_u64()), (Some(B), Some(0)), "{b}");
        // It is still recrawled: a change of it is indexed.
        site.set(B, &page("B, changed", &[]));
        refetch_all(&app).await;
        assert!(export(&app).await[1].contains("B, changed"));
        // Gone (404): it leaves the export, and stays known as what it answered.
        site.pages.lock().unwrap().remove(B);
        refetch_all(&app).await;
        assert_eq!(export(&app).await.len(), 1);
        let text = app.page_json(&Url::parse(B).unwrap()).await.unwrap().unwrap();
        assert!(text.contains("HTTP 404"), "{text}");
    });
}
