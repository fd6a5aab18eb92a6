//! `perc diff --html` and `perc replay --expect --html` in a real browser (headless Chromium,
//! as the status page's test): the page written for the demo site's change set is opened from
//! its file, and what it shows (counts, each changed page's fields side by side, the inlinks
//! gained and lost, the pages added and removed) is checked against `perc diff --json` of the
//! same two exports. A title that holds markup shows as text. The page is saved as
//! `target/diff-report.png` for review.

use std::path::Path;

use serde_json::Value;

mod common;

use common::browser::{browser, save_screenshot, Driver};
use common::{code, perc_in, root, stderr, stdout};

/// What the page shows, read in one script run: the counts, and per changed page its URL,
/// its fields' rows (field, old, new) and its inlink rows (sign, from, to, anchor); the
/// added and removed URLs.
const READ: &str = r##"
    const text = (e) => (e ? e.innerText.trim() : "");
    const cells = (rows) => Array.from(rows).map((r) => Array.from(r.querySelectorAll("td")).map(text));
    return {
        title: document.title,
        summary: text(document.getElementById("summary")),
        counts: Object.fromEntries(Array.from(document.querySelectorAll("[data-count]"))
            .map((c) => [c.dataset.count, text(c.querySelector(".n"))])),
        changed: Array.from(document.querySelectorAll("section.page")).map((s) => ({
            url: s.dataset.url,
            fields: cells(s.querySelectorAll("table.fields tbody tr")),
            inlinks: cells(s.querySelectorAll("table.inlinks tbody tr")),
        })),
        added: Array.from(document.querySelectorAll("#added li")).map(text),
        removed: Array.from(document.querySelectorAll("#removed li")).map(text),
        scripts: document.scripts.length,
    };"##;

/// A field's value as the page shows it (see `perc_pipeline::diff`'s html: strings as
/// themselves, lists an item a line, nothing as "(none)").
fn shown(v: &Value) -> String {
    match v {
        Value::Null => "(none)".into(),
        Value::String(s) if s.is_empty() => "(empty)".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => "(empty list)".into(),
        Value::Array(a) => a
            .iter()
            .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_string))
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    }
}

/// The demo's exports before and after its change set, a title made markup and a page
/// added after.
fn exports(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let old = std::fs::read_to_string(root().join("fixtures/golden/demo.jsonl")).unwrap();
    let mut new = std::fs::read_to_string(root().join("fixtures/golden/demo-v2.jsonl")).unwrap();
    new = new.replacen(
        "\"title\":\"About the demo shop\"",
        "\"title\":\"<script>document.title='owned'</script>About\"",
        1,
    );
    assert!(new.contains("<script>"), "the fixture has the title the test changes");
    // And a page added (the change set only removes one), last in URL order.
    let last = new.lines().last().unwrap().to_string();
    new.push_str(&last.replace("/products/widget.html", "/zz-added.html"));
    new.push('\n');
    let (a, b) = (dir.join("demo.jsonl"), dir.join("demo-v2.jsonl"));
    std::fs::write(&a, old).unwrap();
    std::fs::write(&b, new).unwrap();
    (a, b)
}

#[test]
fn the_diff_report_shows_every_difference_in_a_browser() {
    let tmp = tempfile::tempdir().unwrap();
    let (old, new) = exports(tmp.path());
    let (o, n) = (old.to_str().unwrap(), new.to_str().unwrap());
    let report = tmp.path().join("report.html");
    let out = perc_in(tmp.path(), &["diff", o, n, "--html", report.to_str().unwrap()]);
    assert_eq!(code(&out), 1, "they differ: {}", stderr(&out));
    assert!(stdout(&out).contains("changed"), "the text is still printed: {}", stdout(&out));
    let json = perc_in(tmp.path(), &["diff", o, n, "--json"]);
    let want: Value = serde_json::from_str(&stdout(&json)).unwrap();
    let changed = want["changed"].as_array().unwrap();
    let some = |k: &str| !want[k].as_array().unwrap().is_empty();
    assert!(changed.len() >= 3 && some("added") && some("removed"), "{want}");

    // `--html -` writes the same page on standard output, and nothing else.
    let piped = perc_in(tmp.path(), &["diff", o, n, "--html", "-"]);
    assert_eq!(stdout(&piped), std::fs::read_to_string(&report).unwrap());

    let driver = Driver::start();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let page = browser(&driver).await;
        page.goto(&format!("file://{}", report.display())).await.unwrap();
        let seen = page.execute(READ, vec![]).await.unwrap();
        assert_eq!(seen["title"], format!("perc diff: {o} → {n}"), "no script ran");
        assert_eq!(seen["scripts"], 0, "a title's markup is text, not an element");
        for (key, list) in [("changed", "changed"), ("added", "added"), ("removed", "removed")] {
            let n = want[list].as_array().unwrap().len();
            assert_eq!(seen["counts"][key], n.to_string(), "{key}");
        }
        assert_eq!(seen["counts"]["old"], want["old_pages"].to_string());
        assert_eq!(seen["counts"]["new"], want["new_pages"].to_string());
        assert_eq!(seen["added"], want["added"]);
        assert_eq!(seen["removed"], want["removed"]);
        let pages = seen["changed"].as_array().unwrap();
        assert_eq!(pages.len(), changed.len());
        let mut markup_shown = false;
        for (got, p) in pages.iter().zip(changed) {
            assert_eq!(got["url"], p["url"]);
            let fields: Vec<Vec<String>> = p["fields"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| {
                    vec![
                        f["field"].as_str().unwrap().to_string(),
                        shown(&f["old"]),
                        shown(&f["new"]),
                    ]
                })
                .collect();
            let rows: Vec<Vec<String>> = serde_json::from_value(got["fields"].clone()).unwrap();
            assert_eq!(rows, fields, "{}", p["url"]);
            markup_shown |= rows.iter().any(|r| r[2].starts_with("<script>document.title='owned'"));
            let mut inlinks = Vec::new();
            for (sign, key) in [("+", "inlinks_added"), ("−", "inlinks_removed")] {
                for l in p[key].as_array().unwrap() {
                    let s = |k: &str| l[k].as_str().unwrap().to_string();
                    inlinks.push(vec![sign.to_string(), s("from"), s("to"), s("anchor")]);
                }
            }
            let rows: Vec<Vec<String>> = serde_json::from_value(got["inlinks"].clone()).unwrap();
            assert_eq!(rows, inlinks, "{}", p["url"]);
        }
        assert!(markup_shown, "the title with markup is shown as its text");
        assert!(
            changed.iter().any(|p| !p["inlinks_added"].as_array().unwrap().is_empty()
                || !p["inlinks_removed"].as_array().unwrap().is_empty()),
            "the change set moves inlinks: the test sees inlink rows"
        );
        save_screenshot(&page, "diff-report.png").await;
        page.close().await.unwrap();
    });
}

#[test]
fn replay_expect_writes_the_report_beside_its_verdict() {
    let tmp = tempfile::tempdir().unwrap();
    let warc = root().join("fixtures/crawls/wget-demo.warc.gz");
    let golden = root().join("fixtures/golden/wget-demo.jsonl");
    let report = tmp.path().join("report.html");
    let args = |g: &Path| {
        let (w, g, r) = (warc.to_str().unwrap(), g.to_str().unwrap(), report.to_str().unwrap());
        perc_in(tmp.path(), &["replay", w, "--expect", g, "--html", r])
    };
    let out = args(&golden);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let page = std::fs::read_to_string(&report).unwrap();
    assert!(page.contains("The same: 17 pages."), "{page}");

    let edited = tmp.path().join("golden.jsonl");
    let text = std::fs::read_to_string(&golden).unwrap();
    std::fs::write(&edited, text.replacen("\"in_degree\":9", "\"in_degree\":8", 1)).unwrap();
    let out = args(&edited);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let page = std::fs::read_to_string(&report).unwrap();
    assert!(page.contains("1 changed, 0 added, 0 removed (17 pages → 17)."), "{page}");
    assert!(page.contains("<td>in_degree</td><td class=\"old\"><code>8</code></td><td class=\"new\"><code>9</code></td>"), "{page}");
    // --html needs --expect (nothing to compare without a golden).
    let out = perc_in(tmp.path(), &["replay", warc.to_str().unwrap(), "--html", "x.html"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
}
