//! End to end, through the `perc` binary: crawl the fixture site served on 127.0.0.1 (export
//! equals the golden file), replay the WARC the crawl recorded (same export), incremental
//! refetch after a change set (equals a fresh crawl of v2), canonical answers, bad input.
//!
//! Golden files hold `http://demo.test/` where the site's real base URL (a free port) was;
//! `UPDATE_GOLDENFILES=1` (`make golden`) rewrites them.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::{export, golden, ok, perc, root, seeds, Site, PERC};

/// Refetches `changed` into the store at `incremental` (whose export was `v1`), and checks that
/// the export changed and equals a fresh crawl's from `seeds` (in `tmp/fresh`); returns it.
fn refetch_equals_fresh_crawl(
    tmp: &Path,
    incremental: &Path,
    v1: &str,
    changed: &[String],
    seeds: &Path,
) -> String {
    let mut args = vec!["refetch"];
    args.extend(changed.iter().map(String::as_str));
    ok(&perc(incremental, &args));
    let v2_incremental = export(incremental, &tmp.join("v2-incremental.jsonl"));
    assert_ne!(v1, v2_incremental, "the change set changed the export");

    let fresh = tmp.join("fresh");
    ok(&perc(&fresh, &["crawl", "--seeds", seeds.to_str().unwrap()]));
    let v2_fresh = export(&fresh, &tmp.join("v2-fresh.jsonl"));
    common::assert_same_export(&v2_incremental, &v2_fresh, "incremental refetch and a fresh crawl");
    v2_fresh
}

#[test]
fn crawl_matches_golden_and_replay_matches_crawl() {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let warc = tmp.path().join("crawl.warc.gz");
    let crawl_data = tmp.path().join("crawl");
    let s = seeds(tmp.path(), &[site.base()]);
    // The products are due again sooner than the rest (a per-prefix recrawl interval): the
    // test configuration and one table more.
    let config = tmp.path().join("perc.toml");
    let test = std::fs::read_to_string(root().join("config/test.toml")).unwrap();
    let products = format!(
        "[[recrawl.prefix]]\nprefix = \"{}\"\ninterval_s = 600\nmin_interval_s = 60\n",
        site.url("products")
    );
    std::fs::write(&config, format!("{test}\n{products}")).unwrap();
    let out = ok(&perc(
        &crawl_data,
        &["--config", config.to_str().unwrap(), "crawl", "--seeds", s.to_str().unwrap()]
            .into_iter()
            .chain(["--warc-out", warc.to_str().unwrap()])
            .collect::<Vec<_>>(),
    ));
    assert!(out.contains("pages indexed"), "{out}");
    common::warcio_check(&warc);
    // The heads as the server sent them (its Date field), the length it sent kept aside
    // (the payload is stored decoded), and the sitemaps read at the start recorded too.
    let mut raw = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::MultiGzDecoder::new(std::fs::File::open(&warc).unwrap()),
        &mut raw,
    )
    .unwrap();
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.contains("\r\ndate: ") && raw.contains("\r\nX-Crawler-content-length: "), "heads");
    let uris: Vec<&str> = raw.lines().filter(|l| l.starts_with("WARC-Target-URI")).collect();
    assert!(raw.contains("sitemaps/pages.xml.gz"), "sitemaps: {uris:?}");
    let crawled = export(&crawl_data, &tmp.path().join("crawl.jsonl"));
    golden("demo.jsonl", &crawled.replace(&site.base(), "http://demo.test/"));

    let replay_data = tmp.path().join("replay");
    ok(&perc(&replay_data, &["replay", warc.to_str().unwrap()]));
    let replayed = export(&replay_data, &tmp.path().join("replay.jsonl"));
    assert_eq!(replayed, crawled, "replaying the recorded crawl gives the same export");

    // canonical: a page, a duplicate, an alias, an unknown URL.
    let canon = |u: &str| perc(&crawl_data, &["canonical", &site.url(u)]);
    assert_eq!(ok(&canon("about.html")).trim(), site.url("about.html"));
    assert_eq!(ok(&canon("copy-of-about.html")).trim(), site.url("about.html"));
    assert_eq!(ok(&canon("old-about")).trim(), site.url("about.html"));
    let unknown = canon("never-linked.html");
    assert_eq!(unknown.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&unknown.stderr).trim(),
        format!("{} is not known to this index", site.url("never-linked.html"))
    );
    let private = canon("private/secret.html");
    assert_eq!(private.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&private.stderr).contains("disallowed by robots.txt"));

    // export --links: an edge a line, sorted by (to, from), each with the page it counts for.
    let links = ok(&perc(&crawl_data, &["export", "--links", "--out", "-"]));
    let links: Vec<serde_json::Value> =
        links.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let key = |l: &serde_json::Value| (l["to"].to_string(), l["from"].to_string());
    assert!(links.windows(2).all(|w| key(&w[0]) < key(&w[1])), "sorted, one line an edge");
    let into = |u: &str| -> serde_json::Value {
        links.iter().find(|l| l["to"] == site.url(u)).cloned().expect(u)
    };
    assert_eq!(into("old-about")["target"], site.url("about.html"), "an alias: its page");
    assert_eq!(into("old-about")["from"], site.url(""));
    assert_eq!(into("missing.html")["target"], serde_json::Value::Null, "a 404: none");
    assert_eq!(into("about.html")["target"], site.url("about.html"));
    let inlinks: usize = crawled
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|l| l["inlinks"].as_array().unwrap().len())
        .sum();
    let counted = links.iter().filter(|l| !l["target"].is_null()).count();
    assert_eq!(counted, inlinks, "every edge into a page is some canonical's inlink");

    // page: the export line, or why not.
    let page = ok(&perc(&crawl_data, &["page", &site.url("missing.html")]));
    assert!(page.contains("\"reason\":\"HTTP 404\""), "{page}");
    let page = ok(&perc(&crawl_data, &["page", &site.url("blog/post1.html")]));
    assert!(page.contains("\"noindex\":true"), "{page}");
    // What a page declares and what the export leaves out: its vote, a delayed refresh, its
    // simhash; the near-duplicates of its cluster on the canonical's line.
    let page = ok(&perc(&crawl_data, &["page", &site.url("manual/latest.html")]));
    let v: serde_json::Value = serde_json::from_str(&page).unwrap();
    assert_eq!(v["canonical"], site.url("manual/v1.html"));
    assert_eq!(v["declared_canonical"], site.url("manual/v1.html"));
    assert_eq!(v["simhash"].as_str().map(str::len), Some(16), "{page}");
    let page = ok(&perc(&crawl_data, &["page", &site.url("notice.html")]));
    let v: serde_json::Value = serde_json::from_str(&page).unwrap();
    assert_eq!(v["refresh"], format!("after 30 s to {}", site.url("")));
    assert_eq!(v["fetch"]["interval_s"], 86400, "recrawl.interval_s: {page}");
    let page = ok(&perc(&crawl_data, &["page", &site.url("products/widget-care.html")]));
    let v: serde_json::Value = serde_json::from_str(&page).unwrap();
    assert_eq!(
        v["near_duplicates"],
        serde_json::json!([site.url("products/widget-care-print.html")])
    );
    assert_eq!(v["fetch"]["interval_s"], 600, "its prefix's interval: {page}");
    // One crawl, no change: every page is due after its first interval (a page reached again
    // by a shorter path is fetched again, and that is no change of it).
    for line in crawled.lines() {
        let url = serde_json::from_str::<serde_json::Value>(line).unwrap()["url"]
            .as_str()
            .unwrap()
            .to_string();
        let page = ok(&perc(&crawl_data, &["page", &url]));
        let fetch = &serde_json::from_str::<serde_json::Value>(&page).unwrap()["fetch"];
        let first = if url.contains("/products/") { 600 } else { 86400 };
        assert_eq!(
            (fetch["interval_s"].as_u64(), fetch["changed"].as_u64()),
            (Some(first), Some(0)),
            "{page}"
        );
    }
    let page = ok(&perc(&crawl_data, &["page", &site.url("gadget-moved.html")]));
    assert!(page.contains("refresh redirect to"), "{page}");
    // search: canonical pages only (the copy of about.html is not one; post1 is noindex),
    // ranked, stemmed ("care" finds "Caring"), decoded (the Latin-1 page).
    let search = |q: &str| perc(&crawl_data, &["search", q, "--limit", "20"]);
    let hits = |q: &str| -> Vec<String> {
        ok(&search(q))
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["url"].to_string())
            .map(|u| u.trim_matches('"').replace(&site.base(), "/"))
            .collect()
    };
    assert_eq!(
        hits("widget care")[..2],
        ["/products/widget-care.html", "/products/widget-care-print.html"]
    );
    assert_eq!(hits("about demo shop"), ["/about.html", "/"], "the home page links to it");
    assert_eq!(hits("café"), ["/latin1.html", "/"]);
    let none = search("draft");
    assert_eq!(none.status.code(), Some(1), "a noindex page is not searchable");
    assert_eq!(String::from_utf8_lossy(&none.stderr).trim(), "no page matches \"draft\"");
    let status = ok(&perc(&crawl_data, &["status"]));
    assert!(status.contains("pending notifications:         0"), "{status}");
    // The crawl-rate report: the one host, every request (robots.txt and the 404 counted;
    // the URL robots.txt disallows never asked), the 404 failed. At least: a fetch run that
    // conflicts runs again and asks again (a real request, counted).
    assert!(status.contains("hosts crawled (1, the 1 most asked):"), "{status}");
    let host = site.base().trim_end_matches('/').to_string();
    let line = status.lines().find(|l| l.trim_start().starts_with(&host)).expect("the host");
    let fields: Vec<u64> = line.split_whitespace().skip(1).map_while(|f| f.parse().ok()).collect();
    assert!(fields[0] >= 14 && fields[1] >= 1, "{line}");
    // A replay asks no host.
    let status = ok(&perc(&replay_data, &["status"]));
    assert!(!status.contains("hosts crawled"), "{status}");
}

#[test]
fn refetch_after_a_change_set_equals_a_fresh_crawl() {
    let tmp = tempfile::tempdir().unwrap();
    let web = tmp.path().join("web");
    common::copy_dir(&root().join("fixtures/sites/demo"), &web);
    let site = Site::start(&web);
    let s = seeds(tmp.path(), &[site.base()]);
    let incremental = tmp.path().join("incremental");
    ok(&perc(&incremental, &["crawl", "--seeds", s.to_str().unwrap()]));
    let v1 = export(&incremental, &tmp.path().join("v1.jsonl"));

    // The change set: files replaced or added, and `_deleted` listing files removed.
    let changes = root().join("fixtures/changes/v2");
    common::copy_dir(&changes, &web);
    let deleted = std::fs::read_to_string(web.join("_deleted")).unwrap();
    let mut changed: Vec<String> = Vec::new();
    for f in deleted.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        std::fs::remove_file(web.join(f)).unwrap();
        changed.push(site.url(f));
    }
    for entry in walk(&changes) {
        let rel = entry.strip_prefix(&changes).unwrap().to_str().unwrap().to_string();
        if rel != "_deleted" {
            changed.push(site.url(&rel));
        }
    }
    let v2_fresh = refetch_equals_fresh_crawl(tmp.path(), &incremental, &v1, &changed, &s);
    golden("demo-v2.jsonl", &v2_fresh.replace(&site.base(), "http://demo.test/"));
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

#[test]
fn bad_input_is_named_and_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let data = tmp.path().join("store");
    let warc = tmp.path().join("crawl.warc.gz");
    let s = seeds(tmp.path(), &[site.base()]);
    ok(&perc(
        &data,
        &["crawl", "--seeds", s.to_str().unwrap(), "--warc-out", warc.to_str().unwrap()],
    ));
    let before = export(&data, &tmp.path().join("before.jsonl"));

    // A seed list with an invalid URL: named by file and line; nothing crawled, nothing lost.
    let bad = tmp.path().join("bad-seeds.txt");
    std::fs::write(&bad, format!("{}\nnot a url\n", site.base())).unwrap();
    let out = perc(&data, &["crawl", "--seeds", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{} line 2: invalid URL \"not a url\"", bad.display())), "{err}");
    std::fs::write(&bad, "ftp://example.test/\n").unwrap();
    let err =
        String::from_utf8_lossy(&perc(&data, &["crawl", "--seeds", bad.to_str().unwrap()]).stderr)
            .into_owned();
    assert!(err.contains("line 1: unsupported URL scheme \"ftp\""), "{err}");

    // A bad config file and a bad override.
    let cfg = tmp.path().join("bad.toml");
    std::fs::write(&cfg, "[crawl]\nmax_depth = -1x\n").unwrap();
    let out = Command::new(PERC)
        .args(["--config", cfg.to_str().unwrap(), "--data", data.to_str().unwrap(), "status"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not valid TOML"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = perc(&data, &["--set", "crawl.max_depth=deep", "status"]);
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("crawl.max_depth must be a integer, not \"deep\""));

    // An invalid URL argument, an unknown page.
    let out = perc(&data, &["canonical", "::nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid URL \"::nope\""));
    assert_eq!(perc(&data, &["page", "http://unknown.test/"]).status.code(), Some(1));

    // A corrupt WARC: the bad member is named by file and offset; the rest is indexed.
    let mut bytes = std::fs::read(&warc).unwrap();
    let starts: Vec<usize> = bytes
        .windows(3)
        .enumerate()
        .filter(|(_, w)| *w == b"\x1f\x8b\x08")
        .map(|(i, _)| i)
        .collect();
    let victim = starts[starts.len() / 2];
    for b in &mut bytes[victim + 12..victim + 30] {
        *b ^= 0xff;
    }
    let corrupt = tmp.path().join("corrupt.warc.gz");
    std::fs::write(&corrupt, &bytes).unwrap();
    let replay = tmp.path().join("replay");
    let out = perc(&replay, &["replay", corrupt.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}: at byte {victim}: corrupt gzip member", corrupt.display())),
        "{err}"
    );
    let replayed = export(&replay, &tmp.path().join("replayed.jsonl"));
    assert!(
        replayed.lines().count() >= before.lines().count() - 1,
        "the good records were indexed:\n{replayed}"
    );
    let out = perc(&replay, &["replay", tmp.path().join("nonexistent.warc.gz").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("nonexistent.warc.gz: No such file"), "{said}");
    assert_eq!(said.matches("nonexistent.warc.gz").count(), 1, "the path once: {said}");

    // After all that, the first store still holds what it held.
    assert_eq!(export(&data, &tmp.path().join("after.jsonl")), before);
}

/// A WARC written by another tool replays too, and perc agrees with itself on content. GNU
/// Wget 1.21.3 recorded it from the demo site served by Python's http.server (which knows no
/// `_redirects`: /old-about answers 404): in `fixtures/sites/demo`,
/// `python3 -m http.server --bind 127.0.0.1 18931`, and elsewhere `wget --recursive
/// --level=inf --no-warc-keep-log --warc-file=wget-demo http://127.0.0.1:18931/`. Wget follows
/// refresh redirects too, though not the way the HTML standard reads a quoted URL: it asks for
/// `/'products/gadget.html'`, a 404 that perc replays as one.
#[test]
fn a_wget_warc_replays() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("store");
    let out = ok(&perc(
        &data,
        &["replay", root().join("fixtures/crawls/wget-demo.warc.gz").to_str().unwrap()],
    ));
    assert!(out.contains("17 pages indexed"), "{out}");
    let got = export(&data, &tmp.path().join("wget.jsonl"));
    golden("wget-demo.jsonl", &got);
    // The home page's content hash is the one perc's own crawl computes.
    let ours = std::fs::read_to_string(root().join("fixtures/golden/demo.jsonl")).unwrap();
    let hash = |text: &str| {
        text.lines().next().unwrap().split("\"content_hash\":\"").nth(1).unwrap()[..64].to_string()
    };
    assert_eq!(hash(&got), hash(&ours));
    let canon = ok(&perc(&data, &["canonical", "http://127.0.0.1:18931/copy-of-about.html"]));
    assert_eq!(canon.trim(), "http://127.0.0.1:18931/about.html");
    // Refresh redirects and declared canonicals, as in perc's own crawl.
    let canon = ok(&perc(&data, &["canonical", "http://127.0.0.1:18931/gadget-moved.html"]));
    assert_eq!(canon.trim(), "http://127.0.0.1:18931/products/gadget.html");
    let canon = ok(&perc(&data, &["canonical", "http://127.0.0.1:18931/manual/latest.html"]));
    assert_eq!(canon.trim(), "http://127.0.0.1:18931/manual/v1.html");
}

#[test]
fn max_pages_bounds_a_crawl_and_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let s = seeds(tmp.path(), &[site.base()]);
    let data = tmp.path().join("store");
    // Without the sitemaps: their URLs are seeds too, and could take the whole budget before
    // the seed list's one is fetched (which URLs get it depends on scheduling).
    let limited = ["--set", "crawl.max_pages=3", "--set", "crawl.sitemaps=false"];
    ok(&perc(&data, &[&limited[..], &["crawl", "--seeds", s.to_str().unwrap()]].concat()));
    let pages = export(&data, &tmp.path().join("limited.jsonl"));
    assert!(pages.lines().count() <= 3, "{pages}");
    assert!(pages.lines().count() >= 1, "the seed was fetched");
    let status = ok(&perc(&data, &["status"]));
    assert!(status.contains("pending notifications:         0"), "{status}");
    // URLs over the budget say so (which ones depends on scheduling; most of them do).
    let paths = [
        "about.html",
        "copy-of-about.html",
        "products/",
        "blog/post1.html",
        "latin1.html",
        "broken.html",
        "missing.html",
    ];
    let over = paths
        .iter()
        .filter(|p| {
            ok(&perc(&data, &["page", &site.url(p)])).contains("reached crawl.max_pages = 3")
        })
        .count();
    assert!(over >= paths.len() - 2, "only {over} of {} URLs were held back", paths.len());
}

/// `perc generate` writes a synthetic web and a change set; refetching the changed pages
/// gives the export a fresh crawl of the changed web gives (both crawls seeded with every
/// page, so that a page a change leaves unlinked is still known to the fresh one).
#[test]
fn a_generated_web_and_its_change_set_index_incrementally() {
    let tmp = tempfile::tempdir().unwrap();
    let web = tmp.path().join("web");
    let gen = |args: &[&str]| {
        let mut all =
            vec!["generate", "--pages", "120", "--seed", "4", "--site", web.to_str().unwrap()];
        all.extend_from_slice(args);
        ok(&perc(&tmp.path().join("unused"), &all))
    };
    gen(&[]);
    let site = Site::start(&web);
    let all: Vec<String> = (0..120).map(|i| site.url(&format!("p/{i}.html"))).collect();
    let s = seeds(tmp.path(), &all);
    let incremental = tmp.path().join("incremental");
    ok(&perc(&incremental, &["crawl", "--seeds", s.to_str().unwrap()]));
    let v1 = export(&incremental, &tmp.path().join("v1.jsonl"));
    assert!(v1.lines().count() > 100, "{}", v1.lines().count());

    let changed: Vec<String> = gen(&["--change", "6", "--version", "1"])
        .lines()
        .map(|p| site.url(p.trim_start_matches('/')))
        .collect();
    assert_eq!(changed.len(), 6);
    refetch_equals_fresh_crawl(tmp.path(), &incremental, &v1, &changed, &s);
}

/// The bytes of every file under `dir`.
fn disk_bytes(dir: &Path) -> u64 {
    walk(dir).iter().map(|f| std::fs::metadata(f).unwrap().len()).sum()
}

#[test]
fn a_compacted_store_answers_the_same_on_less_disk_and_takes_new_pages() {
    let tmp = tempfile::tempdir().unwrap();
    let warc = |name: &str, seed: &str, base: &str| {
        let f = tmp.path().join(name);
        let args = ["generate", "--pages", "300", "--seed", seed, "--base", base, "--warc"];
        let mut all = args.to_vec();
        all.push(f.to_str().unwrap());
        ok(&perc(&tmp.path().join("unused"), &all));
        f
    };
    let (one, two) = (
        warc("one.warc.gz", "5", "http://one.test/"),
        warc("two.warc.gz", "6", "http://two.test/"),
    );
    let data = tmp.path().join("data");
    ok(&perc(&data, &["replay", one.to_str().unwrap()]));
    let before = export(&data, &tmp.path().join("before.jsonl"));
    let bytes = disk_bytes(&data);

    let said = ok(&perc(&data, &["compact"]));
    assert!(said.starts_with("compacted "), "{said}");
    assert!(disk_bytes(&data) < bytes, "{} against {bytes} before", disk_bytes(&data));
    assert_eq!(export(&data, &tmp.path().join("after.jsonl")), before);

    // Pages indexed after the compaction write new values beside the old ones.
    ok(&perc(&data, &["replay", two.to_str().unwrap()]));
    let both = export(&data, &tmp.path().join("both.jsonl"));
    let of_one: String = both
        .lines()
        .filter(|l| l.contains("\"url\":\"http://one.test/"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(of_one, before);
    assert!(both.lines().count() > before.lines().count());

    // A missing store and a memory store are refused (a store in use: crates/store).
    let missing = perc(&tmp.path().join("none"), &["compact"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no perc store"));
    let memory = perc(&data, &["--set", "store.backend=memory", "compact"]);
    assert_eq!(memory.status.code(), Some(2), "{}", String::from_utf8_lossy(&memory.stderr));
    assert!(String::from_utf8_lossy(&memory.stderr).contains("sled store"));
}

/// `make run` is `perc --data ./data demo`: run twice on the store it keeps, it must answer
/// the same. The demo serves its site at a fixed address (`--listen`), so the second run
/// refetches the pages the first crawled, instead of crawling the site again under another
/// port beside them.
#[test]
fn the_demo_run_twice_on_its_store_answers_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let site = root().join("fixtures/sites/demo");
    let args = ["demo", "--site", site.to_str().unwrap(), "--listen", &listen];
    let data = tmp.path().join("data");
    // The answers and the summary's counts: the lines that name no time or rate.
    let answers = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.contains("->") || l.trim_start().starts_with("pages"))
            .map(str::to_string)
            .collect()
    };
    let first = answers(&ok(&perc(&data, &args)));
    assert!(
        first.iter().any(|l| l.contains(&format!("-> http://{listen}/about.html"))),
        "{first:?}"
    );
    let second = answers(&ok(&perc(&data, &args)));
    assert_eq!(first, second);
}

/// `perc completions SHELL` and `perc man` describe every command, and need no store.
#[test]
fn completions_and_the_manual_page_name_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    let none = tmp.path().join("no-store");
    let commands = ["crawl", "replay", "diff", "canonical", "search", "serve", "completions"];
    let bash = ok(&perc(&none, &["completions", "bash"]));
    assert!(commands.iter().all(|c| bash.contains(c)), "{bash}");
    let zsh = ok(&perc(&none, &["completions", "zsh"]));
    assert!(zsh.starts_with("#compdef perc"), "{zsh}");
    let fish = ok(&perc(&none, &["completions", "fish"]));
    assert!(fish.contains("complete -c perc"), "{fish}");
    let man = ok(&perc(&none, &["man"]));
    assert!(man.contains(".TH perc"), "{man}");
    assert!(commands.iter().all(|c| man.contains(c)), "{man}");
    let out = perc(&none, &["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tcsh"));
    assert!(!none.exists(), "describing perc creates no store");
}
