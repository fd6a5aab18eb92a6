//! `perc serve` end to end (docs/serve.md): the API answering while the demo site is crawled,
//! bad requests each with its status and a message, and a clean stop on SIGTERM.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::server::{documents, q, Server};
use common::{root, seeds, Site};

/// Scrapes `/metrics`, parses it as Prometheus text and checks its figures against
/// `/v1/status` read just before (a counters save between the two may shift a count: the
/// pair is read again, a few times at most).
fn metrics_agree_with_status(server: &Server) {
    use prometheus_parse::{Scrape, Value};
    let mut last = String::new();
    for _ in 0..5 {
        let status = server.json("/v1/status");
        let (code, text) = server.get("/metrics");
        assert_eq!(code, 200, "{text}");
        let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
        let value = |metric: &str, label: Option<(&str, &str)>| -> Option<f64> {
            scrape.samples.iter().find_map(|s| {
                let fits =
                    s.metric == metric && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v));
                match (&s.value, fits) {
                    (Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v), true) => Some(*v),
                    _ => None,
                }
            })
        };
        let n = |v: &serde_json::Value| v.as_u64().map(|n| n as f64);
        let mut agree = value("perc_pages_indexed", None) == n(&status["pages"])
            && value("perc_urls_fetched", None) == n(&status["fetched"])
            && value("perc_duplicate_clusters", None) == n(&status["duplicate_clusters"])
            && value("perc_search_documents", None) == n(&status["search"]["documents"])
            && value("perc_recrawl_window", None) == n(&status["recrawl"]["window"]);
        let observers = status["observers"].as_object().expect("observers");
        assert!(observers.len() >= 5, "{status}");
        for (name, c) in observers {
            for field in ["runs", "commits", "skipped", "conflicts", "failures", "parked"] {
                let metric = format!("perc_observer_{field}_total");
                agree &= value(&metric, Some(("observer", name))) == n(&c[field]);
            }
            agree &=
                value("perc_notifications_pending", Some(("observer", name))) == n(&c["pending"]);
        }
        if agree {
            // This process's own: its runs' and requests' durations, its fetches.
            let histogram = |metric: &str, label: (&str, &str)| -> f64 {
                scrape
                    .samples
                    .iter()
                    .find_map(|s| match &s.value {
                        Value::Histogram(h)
                            if s.metric == metric && s.labels.get(label.0) == Some(label.1) =>
                        {
                            h.iter().map(|b| b.count).fold(0.0, f64::max).into()
                        }
                        _ => None,
                    })
                    .unwrap_or(0.0)
            };
            assert!(
                histogram("perc_observer_run_seconds", ("observer", "parse")) >= 17.0,
                "{text}"
            );
            assert!(
                histogram("perc_http_request_seconds", ("endpoint", "/v1/status")) >= 1.0,
                "{text}"
            );
            assert!(value("perc_fetches_total", Some(("outcome", "2xx"))) >= Some(17.0), "{text}");
            assert!(value("perc_fetch_bytes_total", None) > Some(5_000.0), "{text}");
            assert!(
                value("perc_store_calls_total", Some(("kind", "read_rows"))) > Some(0.0),
                "{text}"
            );
            // The allocator's figures: live bytes, within what it holds in RAM.
            let allocated = value("perc_allocator_bytes", Some(("kind", "allocated")));
            let resident = value("perc_allocator_bytes", Some(("kind", "resident")));
            assert!(allocated > Some(1e6) && resident >= allocated, "{text}");
            // And in the status, for a client that does not scrape.
            let memory = |kind: &str| status["memory"][kind].as_f64();
            assert!(memory("allocated") > Some(1e6), "{status}");
            assert!(memory("resident") >= memory("allocated"), "{status}");
            return;
        }
        last = format!("{status}\n{text}");
    }
    panic!("/metrics and /v1/status disagree:\n{last}");
}

#[test]
fn the_api_answers_while_it_crawls_and_a_sigterm_stops_it_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let s = seeds(tmp.path(), &[site.base()]);
    let data = tmp.path().join("data");
    let server = Server::start(&data, &["--seeds", s.to_str().unwrap()]);
    let address: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("serve.json")).unwrap()).unwrap();
    assert_eq!(format!("http://{}", address["addr"].as_str().unwrap()), server.base);

    // While it crawls: an answer about the seed, whichever it is by now.
    let (status, body) = server.get(&format!("/v1/canonical?url={}", q(&site.base())));
    assert!(status == 200 || status == 404, "{status}: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(v.get("canonical").is_some() || v.get("error").is_some(), "{body}");

    let status = server.until("the demo's 17 pages", |s| s["pages"] == 17 && s["pending"] == 0);
    assert_eq!(status["duplicate_clusters"], 3, "{status}");
    // The server's own counters, before it saved any.
    assert!(status["observers"]["parse"]["commits"].as_u64() >= Some(17), "{status}");
    assert!(status["hosts"].as_object().is_some_and(|h| h.len() == 1), "{status}");
    let canonical =
        server.json(&format!("/v1/canonical?url={}", q(&site.url("copy-of-about.html"))));
    assert_eq!(canonical["canonical"], site.url("about.html"));
    assert_eq!(canonical["url"], site.url("copy-of-about.html"));
    let canonical = server.json(&format!("/v1/canonical?url={}", q(&site.url("old-about"))));
    assert_eq!(canonical["canonical"], site.url("about.html"));
    server.fails(
        &format!("/v1/canonical?url={}", q(&site.url("never-linked.html"))),
        404,
        "is not known to this index",
    );
    let page = server.json(&format!("/v1/page?url={}", q(&site.url("missing.html"))));
    assert_eq!(page["reason"], "HTTP 404");
    let page = server.json(&format!("/v1/page?url={}", q(&site.url("manual/latest.html"))));
    assert_eq!(page["canonical"], site.url("manual/v1.html"));
    assert_eq!(page["declared_canonical"], site.url("manual/v1.html"));

    // The export: the golden crawl's (the ranks, kept as pages come, within their bound of
    // the crawl's settled ones).
    let (status, exported) = server.get("/v1/export");
    assert_eq!(status, 200);
    let want = std::fs::read_to_string(root().join("fixtures/golden/demo.jsonl")).unwrap();
    let shown = exported.replace(&site.base(), "http://demo.test/");
    common::assert_same_export(&shown, &want, "perc serve's export and the golden crawl's");

    // Search: every canonical page that is not noindex, once the indexer has caught up.
    let base = site.base();
    let indexed = server.until("the search index", |s| {
        s["search"]["caught_up"] == true && s["search"]["documents"] == documents(&want)
    });
    assert_eq!(indexed["search"]["documents"], 13, "{indexed}");
    let hits = server.search("widget care", &base);
    assert_eq!(hits[..2], ["/products/widget-care.html", "/products/widget-care-print.html"]);
    assert_eq!(server.search("draft", &base), Vec::<String>::new(), "noindex");
    let v = server.json("/v1/search?q=widget&limit=1");
    assert_eq!(v["query"], "widget");
    assert_eq!(v["hits"].as_array().map(Vec::len), Some(1), "{v}");
    assert!(v["hits"][0]["score"].as_f64() > Some(0.0) && v["hits"][0]["in_degree"] == 5, "{v}");
    // A hit's snippet is its main text around the words; `lang` keeps one language.
    let v = server.json("/v1/search?q=widget+care&lang=eng");
    let hit = &v["hits"][0];
    assert_eq!(hit["lang"], "eng", "{v}");
    let snippet = hit["snippet"].as_str().unwrap_or_else(|| panic!("{v}"));
    assert!(snippet.to_lowercase().contains("widget"), "{snippet}");
    assert_eq!(server.json("/v1/search?q=widget+care&lang=deu")["hits"], serde_json::json!([]));
    let (status, body) = server.get("/v1/search?q=widget&lang=EN");
    assert!(status == 400 && body.contains("ISO 639-3"), "{status} {body}");

    // The threads that index yield to the API's: 5 nice steps below (serve.indexing_nice),
    // or at the lowest priority already if the server was started at 15 or more.
    let threads = server.thread_nice();
    let nice = |prefix: &str| -> Vec<i32> {
        threads.iter().filter(|(n, _)| n.starts_with(prefix)).map(|t| t.1).collect()
    };
    let (indexing, api) = (nice("perc-index"), nice("perc-api"));
    let base = api.first().copied().unwrap_or_else(|| panic!("no API thread: {threads:?}"));
    assert!(api.iter().all(|&n| n == base), "{threads:?}");
    let want = (base + 5).min(19);
    assert!(indexing.len() >= 2 && indexing.iter().all(|&n| n == want), "{threads:?}");

    // Metrics: Prometheus text whose counters are perc status's numbers.
    metrics_agree_with_status(&server);

    // The CLI on the served store asks the server (sled admits one process).
    let cli = |args: &[&str]| common::perc(&data, args);
    let status = common::ok(&cli(&["status"]));
    assert!(status.starts_with("pages indexed:                 17\n"), "{status}");
    assert!(status.contains("\nobserver "), "{status}");
    let about = common::ok(&cli(&["canonical", &site.url("copy-of-about.html")]));
    assert_eq!(about.trim(), site.url("about.html"));
    let unknown = cli(&["canonical", &site.url("never-linked.html")]);
    assert_eq!(unknown.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&unknown.stderr).trim(),
        format!("{} is not known to this index", site.url("never-linked.html"))
    );
    let page = common::ok(&cli(&["page", &site.url("manual/latest.html")]));
    assert_eq!(
        page.trim(),
        server.get(&format!("/v1/page?url={}", q(&site.url("manual/latest.html")))).1
    );
    assert_eq!(common::ok(&cli(&["export", "--out", "-"])), server.get("/v1/export").1);
    let links = server.get("/v1/export?links=1").1;
    assert!(links.lines().count() > 17 && links.contains("\"target\":null"), "{links}");
    assert_eq!(common::ok(&cli(&["export", "--links", "--out", "-"])), links);
    let searched = common::ok(&cli(&["search", "widget", "care", "--limit", "1"]));
    let first = format!("{{\"url\":\"{}\"", site.url("products/widget-care.html"));
    assert!(searched.starts_with(&first), "{searched}");
    let refetch = common::ok(&cli(&["refetch", &site.url("about.html")]));
    assert!(refetch.contains("fetches 1 pages again"), "{refetch}");
    let again = common::ok(&cli(&["crawl", "--seeds", s.to_str().unwrap()]));
    assert!(again.contains("crawls 1 seeds"), "{again}");
    server.until("the refetch and the seed done", |s| s["pending"] == 0);

    // Bad requests: each its status and what is wrong, and nothing changes.
    server.fails("/v1/status?format=xml", 400, "format \"xml\": it is json or text");
    server.fails("/v1/search", 400, "missing query parameter q");
    server.fails("/v1/search?q=%20", 400, "the query is empty");
    server.fails(
        "/v1/search?q=a&limit=0",
        400,
        "limit \"0\": it must be 1 to 100 (search.limit_max)",
    );
    server.fails("/v1/search?q=a&limit=x", 400, "limit \"x\"");
    server.fails("/v1/search?q=a&q=b", 400, "q given more than once");
    server.fails("/v1/canonical", 400, "missing query parameter url");
    server.fails("/v1/page?uri=x", 400, "missing query parameter url");
    server.fails("/v1/canonical?url=a&url=b", 400, "url given more than once");
    server.fails("/v1/canonical?url=not%20a%20url", 400, "url \"not a url\"");
    server.fails("/v1/canonical?url=ftp://h.test/x", 400, "url \"ftp://h.test/x\"");
    server.fails("/v1/export?links=yes", 400, "links \"yes\": it must be 1 or 0");
    server.fails("/v1/nothing", 404, "no such endpoint: /v1/nothing");
    server.fails("/v2/canonical", 404, "no such endpoint: /v2/canonical");
    let (code, page) = server.get("/");
    assert_eq!(code, 200);
    assert!(page.contains("<div class=\"n\" id=\"pages\">17</div>"), "the status page: {page}");
    let long = format!("/v1/canonical?url=http://h.test/{}", "a".repeat(5000));
    server.fails(&long, 414, "the most accepted is 4096");
    let post =
        server.client.post(format!("{}/v1/canonical", server.base)).body("{}").send().unwrap();
    assert_eq!(post.status().as_u16(), 405);
    assert!(post.text().unwrap().contains("POST is not allowed on /v1/canonical"));
    assert_eq!(server.get("/v1/export").1, exported, "bad requests change nothing");

    // SIGTERM: exit 0, the address file gone, the store whole and free for the CLI.
    assert_eq!(server.terminate(), Some(0));
    assert!(!data.join("serve.json").exists());
    let after = common::export(&data, &tmp.path().join("after.jsonl"));
    assert_eq!(after, exported);
}

#[test]
fn a_bad_listen_address_is_refused_before_anything_is_created() {
    let tmp = tempfile::tempdir().unwrap();
    let data: PathBuf = tmp.path().join("data");
    for (listen, says) in
        [("0.0.0.0:0", "not a loopback address"), ("localhost", "listen address \"localhost\"")]
    {
        let out = common::perc(&data, &["serve", "--listen", listen]);
        assert_eq!(out.status.code(), Some(2), "{listen}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{listen}: {err}");
        assert!(!data.exists(), "nothing was created");
    }
}

#[test]
fn seeds_and_refetches_are_posted_with_the_token() {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let data = tmp.path().join("data");
    let server = Server::start(&data, &[]);
    // The token perc serve made: 64 hex digits, readable by its owner only.
    let file = data.join("serve.token");
    let token = std::fs::read_to_string(&file).unwrap().trim().to_string();
    assert!(token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);

    let seeds = serde_json::json!({"seeds": [site.base()]}).to_string();
    let t = Some(token.as_str());
    server.post_fails("/v1/seeds", None, &seeds, 401, "missing Authorization: Bearer");
    server.post_fails("/v1/seeds", Some("nope"), &seeds, 401, "wrong bearer token");
    server.post_fails("/v1/seeds", t, "{not json", 400, "the JSON body: key must be a string");
    server.post_fails("/v1/seeds", t, r#"{"seeds": []}"#, 400, "no seeds given");
    server.post_fails("/v1/seeds", t, r#"{"seeds": ["a b"]}"#, 400, "seeds[0] \"a b\"");
    server.post_fails("/v1/seeds", t, r#"{"sedes": []}"#, 400, "unknown field `sedes`");
    let big = serde_json::json!({"seeds": ["x".repeat(5000)]}).to_string();
    server.post_fails("/v1/seeds", t, &big, 413, "length limit exceeded");
    server.fails("/v1/seeds", 405, "GET is not allowed on /v1/seeds");
    assert_eq!(server.json("/v1/status")["fetched"], 0, "nothing bad was taken");

    let (status, body) = server.post("/v1/seeds", t, &seeds);
    assert_eq!(status, 202, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v, serde_json::json!({"seeds": 1, "outside_scope": []}));
    server.until("the demo's 17 pages", |s| s["pages"] == 17 && s["pending"] == 0);
    let (_, exported) = server.get("/v1/export");
    let want = std::fs::read_to_string(root().join("fixtures/golden/demo.jsonl")).unwrap();
    let shown = exported.replace(&site.base(), "http://demo.test/");
    common::assert_same_export(&shown, &want, "perc serve's export and the golden crawl's");

    // A refetch: the known URL asked for again, the unknown one named; the index settles
    // where it was (the site did not change).
    let fetched = server.json("/v1/status")["fetched"].as_u64().unwrap();
    let body = serde_json::json!({"urls": [site.url("about.html"), "http://unknown.test/x"]});
    let (status, text) = server.post("/v1/refetch", t, &body.to_string());
    assert_eq!(status, 202, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v, serde_json::json!({"refetching": 1, "unknown": ["http://unknown.test/x"]}));
    server.post_fails("/v1/refetch", t, r#"{"urls": ["a"], "all": true}"#, 400, "either");
    server.post_fails("/v1/refetch", None, r#"{"all": true}"#, 401, "missing Authorization");
    server.until("the refetch", |s| s["pending"] == 0 && s["fetched"].as_u64() == Some(fetched));
    assert_eq!(server.get("/v1/export").1, exported);
    assert_eq!(server.terminate(), Some(0));
    // A restart keeps the token.
    let again = Server::start(&data, &[]);
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), token);
    assert_eq!(again.post("/v1/refetch", t, r#"{"all": true}"#).0, 202);
    assert_eq!(again.terminate(), Some(0));
}

#[test]
fn the_recrawl_picks_up_a_changed_site_and_a_restart_keeps_the_index() {
    let tmp = tempfile::tempdir().unwrap();
    let web = tmp.path().join("web");
    common::copy_dir(&root().join("fixtures/sites/demo"), &web);
    let site = Site::start(&web);
    let s = seeds(tmp.path(), &[site.base()]);
    let data = tmp.path().join("data");
    // Every URL due again after a second, at most two.
    let fast = [
        "--set",
        "recrawl.interval_s=1",
        "--set",
        "recrawl.min_interval_s=1",
        "--set",
        "recrawl.max_interval_s=2",
        "--set",
        "recrawl.tick_ms=100",
    ];
    let mut args = vec!["--seeds", s.to_str().unwrap()];
    args.extend(fast);
    let server = Server::start(&data, &args);
    let golden =
        |name: &str| std::fs::read_to_string(root().join("fixtures/golden").join(name)).unwrap();
    let export =
        |server: &Server| server.get("/v1/export").1.replace(&site.base(), "http://demo.test/");
    let v1 = server.until("the demo's 17 pages", |s| s["pages"] == 17 && s["pending"] == 0);
    common::assert_same_export(&export(&server), &golden("demo.jsonl"), "perc serve's crawl");
    let base = site.base();
    server.until_search("title:old", &base, &["/broken.html"]);
    assert_eq!(server.search("gadget version two", &base), Vec::<String>::new());

    // Unchanged pages are fetched again, and nothing after fetch runs for them.
    let runs = |s: &serde_json::Value, o: &str| s["observers"][o]["runs"].as_u64().unwrap_or(0);
    let (fetches, parses) = (runs(&v1, "fetch"), runs(&v1, "parse"));
    // The refetches are conditional: the site answers 304 (its pages have ETags).
    let again = server.until("every page fetched again and answered 304", |s| {
        runs(s, "fetch") >= fetches + 24 && site.not_modified() >= 17
    });
    assert_eq!(runs(&again, "parse"), parses, "an unchanged page is not parsed again: {again}");

    // The site changes: the recrawl finds it, and the index becomes a fresh crawl's of it.
    common::apply_v2(&web);
    let want = golden("demo-v2.jsonl");
    let deadline = Instant::now() + Duration::from_secs(60);
    while common::export_difference(&export(&server), &want).is_some() {
        assert!(
            Instant::now() < deadline,
            "a minute and the recrawl has not caught up:\n{}",
            export(&server)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Search follows: the gadget's new title, the old page gone.
    server.until("the search index of v2", |s| {
        s["search"]["caught_up"] == true && s["search"]["documents"] == documents(&want)
    });
    server.until_search("gadget version two", &base, &["/products/gadget.html"]);
    server.until_search("title:old", &base, &[]);
    let page = server.json(&format!("/v1/page?url={}", q(&site.url("products/widget-care.html"))));
    assert_eq!(page["near_duplicates"], serde_json::json!([]), "{page}");
    // Its recrawl state: fetched more than once, due again within the bounds.
    let fetch = &page["fetch"];
    let (last, next) = (fetch["last_ms"].as_u64().unwrap(), fetch["next_ms"].as_u64().unwrap());
    assert!(next > last && next - last <= 2000, "{page}");
    assert!(fetch["unchanged"].as_u64() >= Some(1), "{page}");
    let served = export(&server);
    assert_eq!(server.terminate(), Some(0));

    // A restart serves the same index at once.
    let again = Server::start(&data, &fast);
    assert_eq!(export(&again), served);
    assert_eq!(again.terminate(), Some(0));
}

#[test]
fn after_a_kill_the_search_index_catches_up_with_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let data = tmp.path().join("data");
    let base = site.base();
    // An indexer that looks at its queue once, at the start (an empty store), then not for
    // an hour: once that look is over, the crawl's pages stay queued.
    let server = Server::start(&data, &["--set", "search.tick_ms=3600000"]);
    server.until("the indexer's first look", |s| s["search"]["indexed_ms"].is_u64());
    let token = std::fs::read_to_string(data.join("serve.token")).unwrap();
    let body = serde_json::json!({ "seeds": [site.base()] }).to_string();
    assert_eq!(server.post("/v1/seeds", Some(token.trim()), &body).0, 202);
    server.until("the demo's 17 pages", |s| s["pages"] == 17 && s["pending"] == 0);
    let status = server.json("/v1/status");
    let (read, now) = (status["read_ms"].as_u64(), status["now_ms"].as_u64());
    assert!(read.is_some_and(|r| Some(r) <= now), "when the store was read: {status}");
    assert_eq!(status["search"]["documents"], 0, "{status}");
    assert_eq!(status["search"]["caught_up"], false, "the crawl's rows wait: {status}");
    assert_eq!(server.search("widget", &base), Vec::<String>::new());
    server.kill();
    // The address file of a killed server stays; the CLI sees nobody answers there, and
    // reads the store (as the kill left it: the last unflushed runs are redone at restart).
    assert!(data.join("serve.json").exists());
    let status = common::ok(&common::perc(&data, &["status"]));
    assert!(status.starts_with("pages indexed:"), "{status}");

    // The queue is in the store: a restart drains it, and the index is the store's.
    let server = Server::start(&data, &[]);
    let want = std::fs::read_to_string(root().join("fixtures/golden/demo.jsonl")).unwrap();
    server.until("the caught-up index", |s| {
        s["search"]["caught_up"] == true && s["search"]["documents"] == documents(&want)
    });
    let hits = server.search("widget care", &base);
    assert_eq!(hits[..2], ["/products/widget-care.html", "/products/widget-care-print.html"]);
    assert_eq!(server.terminate(), Some(0));

    // The CLI catches up the same index, and finds the same.
    let cli = common::ok(&common::perc(&data, &["search", "widget", "care", "--limit", "2"]));
    let urls: Vec<String> = cli
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["url"]
                .as_str()
                .unwrap()
                .replace(&base, "/")
        })
        .collect();
    assert_eq!(urls, hits[..2]);
}

/// A server says where it listens before it opens the store: a command run while it starts
/// asks it and gets its answer once it serves, and a server started while another process
/// holds the store waits for it. Before, whichever of the two came second failed on sled's
/// lock, in every order.
#[test]
fn a_command_beside_a_starting_server_asks_it_and_the_server_waits_for_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let warc = root().join("fixtures/crawls/wget-demo.warc.gz");
    common::ok(&common::perc(&data, &["replay", warc.to_str().unwrap()]));

    // Another process holds the store: a worker, until told to stop.
    let mut worker = common::command(&data, &["worker"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(worker.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("worker "), "{line}");
    // With no server, a command on the held store says so (after sled's 2 s wait).
    let held = common::perc(&data, &["status"]);
    assert_eq!(held.status.code(), Some(2), "{}", common::stderr(&held));
    assert!(common::stderr(&held).contains("holds it"), "{}", common::stderr(&held));

    // The server claims the store's directory and waits for the store.
    let starting = {
        let data = data.clone();
        std::thread::spawn(move || Server::start(&data, &[]))
    };
    let claimed = Instant::now();
    while !data.join("serve.json").exists() {
        assert!(claimed.elapsed() < Duration::from_secs(60), "no serve.json");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A second server on the store is refused at once.
    let second = common::perc(&data, &["serve", "--listen", "127.0.0.1:0"]);
    assert_eq!(second.status.code(), Some(2));
    assert!(
        common::stderr(&second).contains("another perc serve serves the store at"),
        "{}",
        common::stderr(&second)
    );
    assert!(data.join("serve.json").exists(), "the first server's address stays");

    // A command now asks the starting server, which answers once the store is let go of:
    // the worker stops once the server has said it waits for the store (sled's own wait for
    // a lock is 2 s, and over by then).
    let status = {
        let data = data.clone();
        std::thread::spawn(move || common::perc(&data, &["status"]))
    };
    let log = data.with_extension("serve.log");
    let waits = |log: &std::path::Path| {
        std::fs::read_to_string(log).is_ok_and(|l| l.contains("holds the store; waiting"))
    };
    while !waits(&log) {
        assert!(claimed.elapsed() < Duration::from_secs(60), "the server does not wait");
        std::thread::sleep(Duration::from_millis(20));
    }
    let sent = Command::new("kill").args(["-TERM", &worker.id().to_string()]).status();
    assert!(sent.unwrap().success());
    assert!(worker.wait().unwrap().success());
    let server = starting.join().unwrap();
    let status = common::ok(&status.join().unwrap());
    assert!(status.starts_with("pages indexed:                 17\n"), "{status}");
    assert_eq!(server.terminate(), Some(0));
    assert!(!data.join("serve.json").exists());
}
