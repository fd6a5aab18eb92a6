//! The search queue stays bounded when no index drains it (a crawl keeps none): a run that
//! leaves more than `search.queue_max` rows empties it and counts a new generation, and an
//! index built before is built again when it next catches up, so it still ends equal to the
//! pages, old text gone and new text found.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use perc_crawl::{Fetched, Response, Source};
use perc_pipeline::{Backend, Config, CrawlScope, Pipeline, Queued};
use perc_search::{QueryLimits, SearchIndex};
use tokio_util::sync::CancellationToken;
use url::Url;

#[derive(Clone, Default)]
struct Site(Arc<Mutex<BTreeMap<String, String>>>);

#[async_trait]
impl Source for Site {
    async fn get(&self, url: &Url) -> Fetched {
        let (status, body) = match self.0.lock().unwrap().get(url.as_str()) {
            Some(html) => (200, html.clone()),
            None => (404, String::new()),
        };
        Fetched::Response(Response::html(status, body))
    }
}

fn page(word: &str, links: &[String]) -> String {
    let links: String = links.iter().map(|l| format!("<a href=\"{l}\">next</a>")).collect();
    format!("<html><head><title>{word}</title></head><body><p>all about {word} here</p>{links}</body></html>")
}

const BOUNDS: QueryLimits = QueryLimits { bytes_max: 1024, nesting_max: 32 };

/// A site of six pages, each linking to all, and a pipeline in memory that crawls it from
/// the first (with `queue_max` as `search.queue_max`, if given).
struct Six {
    site: Site,
    urls: Vec<String>,
    app: Pipeline,
    scope: CrawlScope,
}

async fn six_pages(queue_max: Option<u64>) -> Six {
    let site = Site::default();
    let urls: Vec<String> = (0..6).map(|i| format!("http://site.test/p{i}")).collect();
    for (i, u) in urls.iter().enumerate() {
        site.0.lock().unwrap().insert(u.clone(), page(&format!("word{i}"), &urls));
    }
    let mut config = Config::defaults();
    config.store.backend = Backend::Memory;
    if let Some(max) = queue_max {
        config.search.queue_max = max;
    }
    let app = Pipeline::builder(config).source(Arc::new(site.clone())).open().await.unwrap();
    let scope = CrawlScope {
        seeds: vec![urls[0].clone()],
        prefixes: vec![],
        max_depth: 20,
        max_redirects: 5,
    };
    Six { site, urls, app, scope }
}

#[test]
fn a_queue_nobody_drains_is_emptied_and_an_older_index_is_built_again() {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let Six { site, urls, app, scope } = six_pages(Some(3)).await;
        let stop = CancellationToken::new();
        let seed = Url::parse(&urls[0]).unwrap();

        // The crawl queued a row per change; nothing drained them: the run's end empties it
        // (and again after the ranks are settled, which queues every page ranked anew).
        assert_eq!(app.search_generation().await.unwrap(), 0);
        app.crawl(std::slice::from_ref(&seed), &scope, &stop).await.unwrap();
        assert!(app.search_caught_up().await.unwrap(), "the queue was emptied");
        let crawled = app.search_generation().await.unwrap();
        assert!(crawled >= 1, "{crawled}");

        // An index catches up: it is built from the pages.
        let index = SearchIndex::open(None).unwrap();
        let caught = index.catch_up(&app, 100, &stop).await.unwrap();
        assert_eq!(caught, Some((6, 0)), "built from the six pages");
        let hits = |q: &str| -> Vec<String> {
            index
                .search(q, &perc_search::Filter::default(), 10, BOUNDS)
                .unwrap()
                .into_iter()
                .map(|h| h.url)
                .collect()
        };
        assert_eq!(hits("word3"), [urls[3].clone()]);

        // A change while no index drains: the queue is emptied again, and the index, of the
        // older generation, is built again rather than left without the change.
        for (i, u) in urls.iter().enumerate() {
            site.0.lock().unwrap().insert(u.clone(), page(&format!("changed{i}"), &urls));
        }
        app.want_again(None).await.unwrap();
        app.run_until_quiet("refetch", &stop).await.unwrap();
        assert!(app.search_caught_up().await.unwrap());
        assert!(app.search_generation().await.unwrap() > crawled);
        let caught = index.catch_up(&app, 100, &stop).await.unwrap();
        assert_eq!(caught, Some((6, 0)), "built again");
        assert_eq!(hits("changed3"), [urls[3].clone()]);
        assert!(hits("word3").is_empty(), "the old text is gone");

        // Rows that wait for an index of this generation are applied, with no build.
        site.0.lock().unwrap().insert(urls[3].clone(), page("again", &urls));
        app.want_again(Some(std::slice::from_ref(&Url::parse(&urls[3]).unwrap()))).await.unwrap();
        app.engine().run_until_quiet().await.unwrap();
        assert!(!app.search_caught_up().await.unwrap(), "a few rows wait");
        let (built, applied) = index.catch_up(&app, 100, &stop).await.unwrap().unwrap();
        assert_eq!(built, 0, "the index is of this generation");
        assert!(applied > 0);
        assert_eq!(hits("again"), [urls[3].clone()]);
    });
}

/// An index built from nothing holds every change committed before its snapshot: the drain
/// that follows the build deletes those rows unapplied (a first search after a crawl applied
/// every page twice, a commit a bucket) and applies the changes committed since.
#[test]
fn a_drain_after_a_build_applies_only_what_changed_since() {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let Six { site, urls, app, scope } = six_pages(None).await;
        let stop = CancellationToken::new();
        app.crawl(&[Url::parse(&urls[0]).unwrap()], &scope, &stop).await.unwrap();
        assert!(!app.search_caught_up().await.unwrap(), "the crawl's rows wait");

        // A mirror of an index: built at a snapshot, then a page changes, then it drains.
        let mut mirror = BTreeMap::new();
        let built = app
            .search_documents(|d| {
                mirror.insert(d.url.clone(), d);
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(built.count, 6);
        site.0.lock().unwrap().insert(urls[3].clone(), page("again", &urls));
        app.want_again(Some(&[Url::parse(&urls[3]).unwrap()])).await.unwrap();
        app.engine().run_until_quiet().await.unwrap();
        let mut calls = 0;
        let applied = app
            .drain_search(1000, Some(built.at), |queued| {
                calls += 1;
                for q in queued {
                    match q {
                        Queued::Index(d) => mirror.insert(d.url.clone(), d.clone()),
                        Queued::Remove(url) => mirror.remove(url),
                    };
                }
                Ok::<_, ()>(())
            })
            .await
            .unwrap()
            .unwrap();
        assert!(app.search_caught_up().await.unwrap());
        assert!((1..6).contains(&applied), "only the change is applied: {applied}");
        assert_eq!(calls, 1, "the rows of every bucket in one transaction");
        let mut want = BTreeMap::new();
        app.search_documents(|d| {
            want.insert(d.url.clone(), d);
            Ok(())
        })
        .await
        .unwrap();
        assert_eq!(mirror, want);
        assert!(mirror[&urls[3]].title == "again");

        // A fresh index catches up: built, and nothing applied twice.
        let index = SearchIndex::open(None).unwrap();
        site.0.lock().unwrap().insert(urls[4].clone(), page("later", &urls));
        app.want_again(Some(&[Url::parse(&urls[4]).unwrap()])).await.unwrap();
        app.engine().run_until_quiet().await.unwrap();
        assert_eq!(index.catch_up(&app, 100, &stop).await.unwrap(), Some((6, 0)));
        let hits = index.search("later", &perc_search::Filter::default(), 10, BOUNDS).unwrap();
        assert_eq!(hits.iter().map(|h| h.url.as_str()).collect::<Vec<_>>(), [urls[4].as_str()]);
    });
}
