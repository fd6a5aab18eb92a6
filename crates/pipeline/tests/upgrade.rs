//! A store an earlier perc wrote opens in this one. Its URLs' frontier entries and recrawl
//! states, kept in their page rows then, move to their fetch rows when a pipeline opens the
//! store; nothing is lost (the states keep their counts and validators), a URL that was
//! waiting for its fetch is fetched, and the index goes on as if it had been written this
//! way. A store of a later layout is refused before anything is written.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use perc_crawl::{Fetched, Response, Source};
use perc_observers::model::{self, col, rows, CrawlScope};
use perc_pipeline::{Backend, Config, Pipeline};
use url::Url;

struct Site(BTreeMap<String, String>);

#[async_trait]
impl Source for Site {
    async fn get(&self, url: &Url) -> Fetched {
        match self.0.get(url.as_str()) {
            Some(html) => Fetched::Response(Response::html(200, html.clone())),
            None => Fetched::Response(Response::html(404, String::new())),
        }
    }
}

const A: &str = "http://site.test/a";
const B: &str = "http://site.test/b";
const C: &str = "http://site.test/c";
/// Linked from nowhere: the earlier store has it waiting in its frontier, never fetched.
const D: &str = "http://site.test/d";

fn site() -> Arc<Site> {
    let page = |title: &str, links: &[&str]| {
        let links: String = links.iter().map(|l| format!("<a href=\"{l}\">{l}</a>")).collect();
        format!(
            "<html><head><title>{title}</title></head><body><p>{title}</p>{links}</body></html>"
        )
    };
    Arc::new(Site(BTreeMap::from([
        (A.into(), page("A", &[B, C])),
        (B.into(), page("B", &[A])),
        (C.into(), page("C", &[A, B])),
        (D.into(), page("D", &[])),
    ])))
}

async fn open(config: &Config) -> Result<Pipeline, perc_pipeline::PipelineError> {
    Pipeline::builder(config.clone()).source(site()).open().await
}

/// Every cell of `column` in the rows of `kind`, by URL.
async fn cells(app: &Pipeline, kind: &'static rows::Prefix, column: &[u8]) -> Vec<(String, Bytes)> {
    let t = app.client().begin().await.unwrap();
    let found = t.scan(kind.start(), kind.end(), column).await.unwrap();
    found.into_iter().map(|(row, v)| (kind.key_of(&row).unwrap().to_string(), v)).collect()
}

/// Rewrites the store as the earlier layout kept it: every want and fetch state in its page
/// row with the fetch's ack, no layout version; and `D` wanted, not yet fetched.
async fn as_the_earlier_layout(app: &Pipeline) {
    let moved = [col::WANT, col::FETCH_STATE];
    let mut t = app.client().begin().await.unwrap();
    for column in moved {
        for (url, value) in cells(app, &rows::FETCHES, column).await {
            t.set(model::page(&url), Bytes::from_static(column), value);
            t.delete(model::fetch_row(&url), Bytes::from_static(column));
        }
    }
    let want = serde_json::json!({"depth": 0, "gen": t.start_ts().0, "hops": 0});
    t.set(model::page(D), Bytes::from_static(col::WANT), want.to_string());
    t.delete(Bytes::from_static(model::CONFIG_ROW), Bytes::from_static(col::LAYOUT));
    t.commit().await.unwrap();
    // The fetches that served A, B and C acknowledged their wants at the page rows.
    let mut t = app.client().begin().await.unwrap();
    for url in [A, B, C] {
        perc_notify::record_run(&mut t, &model::page(url), "fetch");
    }
    t.commit().await.unwrap();
}

/// A sled store in `dir` crawled from A until quiet: its configuration, the pipeline and its
/// export.
async fn crawled_from_a(dir: &std::path::Path) -> (Config, Pipeline, Vec<String>) {
    let mut config = Config::defaults();
    config.store.backend = Backend::Sled;
    config.store.data = dir.join("data").display().to_string();
    let app = open(&config).await.unwrap();
    let scope =
        CrawlScope { seeds: vec![A.into()], prefixes: vec![], max_depth: 5, max_redirects: 5 };
    perc_observers::seed(app.client(), &[Url::parse(A).unwrap()], &scope).await.unwrap();
    app.engine().run_until_quiet().await.unwrap();
    let crawled = app.export_jsonl().await.unwrap();
    (config, app, crawled)
}

#[test]
fn a_store_of_the_earlier_layout_is_moved_over_when_it_opens() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let (config, app, crawled) = crawled_from_a(tmp.path()).await;
        assert_eq!(crawled.len(), 3, "{crawled:#?}");
        let states = cells(&app, &rows::FETCHES, col::FETCH_STATE).await;
        assert_eq!(states.len(), 3, "{states:?}");
        as_the_earlier_layout(&app).await;
        assert!(cells(&app, &rows::FETCHES, col::WANT).await.is_empty());
        app.close().await.unwrap();

        // The opening moves every want and state, and marks the layout.
        let app = open(&config).await.unwrap();
        assert_eq!(cells(&app, &rows::PAGES, col::WANT).await, vec![]);
        assert_eq!(cells(&app, &rows::PAGES, col::FETCH_STATE).await, vec![]);
        assert_eq!(cells(&app, &rows::FETCHES, col::FETCH_STATE).await, states);
        let wanted: Vec<String> =
            cells(&app, &rows::FETCHES, col::WANT).await.into_iter().map(|(u, _)| u).collect();
        assert_eq!(wanted, [A, B, C, D]);
        let t = app.client().begin().await.unwrap();
        let layout = t.get(model::CONFIG_ROW, col::LAYOUT).await.unwrap();
        assert_eq!(layout.as_deref(), Some(perc_observers::LAYOUT.to_string().as_bytes()));
        drop(t);

        // The URL that was waiting is fetched; the others are the index they were.
        app.engine().run_until_quiet().await.unwrap();
        let with_d = app.export_jsonl().await.unwrap();
        assert_eq!(with_d.len(), 4, "{with_d:#?}");
        assert!(crawled.iter().all(|line| with_d.contains(line)), "{crawled:#?}\n{with_d:#?}");

        // A refetch of everything finds it unchanged: the moved states were read.
        app.want_again(None).await.unwrap();
        app.engine().run_until_quiet().await.unwrap();
        assert_eq!(app.export_jsonl().await.unwrap(), with_d);
        let state = perc_observers::fetch_state(app.client(), &Url::parse(A).unwrap())
            .await
            .unwrap()
            .expect("A's state");
        assert_eq!((state.changed, state.unchanged), (0, 1), "{state:?}");

        // A store marked with a later layout is refused, and left as it is.
        let mut t = app.client().begin().await.unwrap();
        let later = (perc_observers::LAYOUT + 1).to_string();
        t.set(
            Bytes::from_static(model::CONFIG_ROW),
            Bytes::from_static(col::LAYOUT),
            later.clone(),
        );
        t.commit().await.unwrap();
        app.close().await.unwrap();
        let refused = open(&config).await.err().expect("a later layout is refused").to_string();
        assert!(
            refused.contains(&format!("layout {later}")) && refused.contains("later perc"),
            "{refused}"
        );
    });
}

/// A store of layout 2 (change rows deleted in the folding run's transaction, no mark kept)
/// is marked as of this layout with nothing moved: a URL without a mark folds every change
/// row it sees (here one left for B, with its edge, as a layout-2 parse run would have).
#[test]
fn a_store_of_layout_2_is_marked_and_indexes_on() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let (config, app, crawled) = crawled_from_a(tmp.path()).await;
        let marks = cells(&app, &rows::PAGES, col::FOLDED).await;
        assert!(!marks.is_empty(), "the crawl's in-degree runs keep marks");
        let mut t = app.client().begin().await.unwrap();
        for (url, _) in &marks {
            t.delete(model::page(url), Bytes::from_static(col::FOLDED));
        }
        t.set(Bytes::from_static(model::CONFIG_ROW), Bytes::from_static(col::LAYOUT), "2");
        let x = "http://site.test/x";
        t.set_unchecked(model::edge(B, x), Bytes::from_static(col::EDGE), "from x");
        let ts = t.start_ts().0;
        t.set_unchecked(model::delta(B, x, ts), Bytes::from_static(col::DELTA), "1");
        t.notify(model::page(B), Bytes::from_static(col::INDEG_DIRTY));
        t.commit().await.unwrap();
        app.close().await.unwrap();

        let app = open(&config).await.unwrap();
        let t = app.client().begin().await.unwrap();
        let layout = t.get(model::CONFIG_ROW, col::LAYOUT).await.unwrap();
        assert_eq!(layout.as_deref(), Some(perc_observers::LAYOUT.to_string().as_bytes()));
        drop(t);
        app.engine().run_until_quiet().await.unwrap();
        let in_degree = |lines: &[String]| -> serde_json::Value {
            let line = lines.iter().find(|l| l.contains(&format!("\"url\":\"{B}\""))).unwrap();
            serde_json::from_str::<serde_json::Value>(line).unwrap()["in_degree"].clone()
        };
        let before = in_degree(&crawled).as_u64().unwrap();
        let now = app.export_jsonl().await.unwrap();
        assert_eq!(in_degree(&now).as_u64(), Some(before + 1), "{now:#?}");
        app.close().await.unwrap();
    });
}

/// A store of layout 3 kept a page's whole rank state in its `k:` row (`<x> <a>`) and had no
/// shards: opening it moves each page's state into its shard, the rank shown being the rank,
/// and the index goes on as it was.
#[test]
fn a_store_of_layout_3_moves_its_ranks_into_their_shards() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let (config, app, _) = crawled_from_a(tmp.path()).await;
        let mut states = BTreeMap::new();
        let mut t = app.client().begin().await.unwrap();
        for url in [A, B, C] {
            let state = perc_observers::rank::state_of(&t, url).await.unwrap();
            assert!(state.x > 0.0, "{url}: {state:?}");
            t.set(
                model::rank_row(url),
                Bytes::from_static(col::RANK),
                format!("{} {}", state.x, state.a),
            );
            states.insert(url, state);
        }
        let shards =
            t.scan(rows::SHARDS.start(), rows::SHARDS.end(), col::RANK_STATE).await.unwrap();
        assert!(!shards.is_empty());
        for (row, _) in shards {
            t.delete(row, Bytes::from_static(col::RANK_STATE));
        }
        t.set(Bytes::from_static(model::CONFIG_ROW), Bytes::from_static(col::LAYOUT), "3");
        t.commit().await.unwrap();
        let as_layout_3 = app.export_jsonl().await.unwrap();
        app.close().await.unwrap();

        let app = open(&config).await.unwrap();
        let t = app.client().begin().await.unwrap();
        let layout = t.get(model::CONFIG_ROW, col::LAYOUT).await.unwrap();
        assert_eq!(layout.as_deref(), Some(perc_observers::LAYOUT.to_string().as_bytes()));
        for (url, state) in &states {
            let moved = perc_observers::rank::state_of(&t, url).await.unwrap();
            assert_eq!((moved.x, moved.a, moved.shown), (state.x, state.a, state.x), "{url}");
        }
        drop(t);
        app.engine().run_until_quiet().await.unwrap();
        assert_eq!(app.export_jsonl().await.unwrap(), as_layout_3);
        app.close().await.unwrap();
    });
}
