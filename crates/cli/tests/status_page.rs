//! `perc serve`'s status page (`GET /`) in a real browser: Debian's chromium, driven through
//! chromedriver by fantoccini. The page is loaded while the demo site is crawled; the test
//! waits until it shows the fixture's page count (the page polls `/v1/status` by itself),
//! checks the numbers and tables it shows against `/v1/status`, and saves a screenshot as
//! `target/status-page.png` for review. `make test` installs chromium and chromium-driver;
//! CHROMIUM and CHROMEDRIVER name other binaries.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fantoccini::Client;

mod common;

use common::browser::{browser, save_screenshot, Driver};
use common::server::Server;
use common::{root, seeds, Site};

/// What the page shows at one instant: the text of the elements with the ids asked for, and
/// the rows of the tables asked for, each as the text of its cells. Read in one script run:
/// the page redraws its numbers and tables every 2 s, so cells read one browser call at a
/// time could come from two drawings, or from a table replaced in between.
struct Shown {
    text: BTreeMap<String, String>,
    tables: BTreeMap<String, Vec<Vec<String>>>,
}

async fn shown(page: &Client, ids: &[&str], tables: &[&str]) -> Shown {
    const READ: &str = r#"
        const [ids, tables] = arguments;
        const text = (e) => (e ? e.innerText.trim() : "");
        const rows = (id) => Array.from(document.querySelectorAll(`#${id} tbody tr`))
            .map((r) => Array.from(r.querySelectorAll("td")).map(text));
        return {
            text: Object.fromEntries(ids.map((id) => [id, text(document.getElementById(id))])),
            tables: Object.fromEntries(tables.map((id) => [id, rows(id)])),
        };"#;
    let v =
        page.execute(READ, vec![serde_json::json!(ids), serde_json::json!(tables)]).await.unwrap();
    Shown {
        text: serde_json::from_value(v["text"].clone()).unwrap(),
        tables: serde_json::from_value(v["tables"].clone()).unwrap(),
    }
}

#[test]
fn the_status_page_shows_the_crawl_in_a_browser() {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let s = seeds(tmp.path(), &[site.base()]);
    let data = tmp.path().join("data");
    let server = Server::start(&data, &["--seeds", s.to_str().unwrap()]);
    let driver = Driver::start();
    // Multi-threaded: the server is asked with a blocking client (block_in_place) between the
    // browser's steps.
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let page = browser(&driver).await;
        page.goto(&format!("{}/", server.base)).await.unwrap();
        assert!(page.title().await.unwrap().starts_with("perc serve"));
        // The page updates itself: wait until it shows the whole demo, indexed and searchable.
        // (Generous: a loaded machine crawls the demo in seconds, not in minutes.)
        let deadline = Instant::now() + Duration::from_secs(240);
        let tables = ["observers", "hosts", "errors", "recrawls"];
        let ids = ["pages", "pending", "documents", "fetched", "waiting", "clusters"];
        let seen = loop {
            let seen = shown(&page, &ids, &tables).await;
            let t = &seen.text;
            if (t["pages"].as_str(), t["pending"].as_str(), t["documents"].as_str())
                == ("17", "0", "13")
            {
                break seen;
            }
            assert!(Instant::now() < deadline, "the page still shows {t:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // What it shows is what /v1/status says (the crawl is over: nothing changes now).
        let status = tokio::task::block_in_place(|| server.json("/v1/status"));
        for (id, key) in
            [("fetched", "fetched"), ("waiting", "waiting"), ("clusters", "duplicate_clusters")]
        {
            assert_eq!(seen.text[id], status[key].to_string(), "#{id}");
        }
        let observers = &seen.tables["observers"];
        let parse = observers.iter().find(|r| r[0] == "parse").expect("a parse row");
        assert_eq!(parse[1], "0", "nothing pending: {observers:?}");
        assert_eq!(parse[2], "0.0", "so nothing waits: {observers:?}");
        assert_eq!(parse[3], status["observers"]["parse"]["runs"].to_string(), "{observers:?}");
        let hosts = &seen.tables["hosts"];
        assert_eq!(hosts.len(), 1, "{hosts:?}");
        assert_eq!(hosts[0][0], site.base().trim_end_matches('/'));
        assert_eq!(hosts[0][1], status["hosts"][&hosts[0][0]]["requests"].to_string());
        let errors = &seen.tables["errors"];
        let missing = errors.iter().find(|r| r[0] == "HTTP 404").expect("the 404s");
        assert_eq!(missing[1], status["not_pages"]["HTTP 404"].to_string());
        assert!(missing[2].contains(&site.url("")), "an example URL: {errors:?}");
        let recrawls = &seen.tables["recrawls"];
        assert_eq!(recrawls.len(), 10, "{recrawls:?}");
        assert!(recrawls.iter().all(|r| r[1].starts_with(&site.base())), "{recrawls:?}");
        // The chart has a line once the rates have a sample (every 2 s): not waited for here.
        save_screenshot(&page, "status-page.png").await;
        page.close().await.unwrap();
    });
    assert_eq!(server.terminate(), Some(0));
}
