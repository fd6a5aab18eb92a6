//! Replaying fixture crawls in CI, through the binary: `perc replay --expect`
//! against the committed golden (green), against a golden with a title, a canonical and an
//! inlink changed (exit 1, each named), `--update`, `--junit`, a directory of WARCs, the
//! memory store; and `perc diff` on equal, different, unsorted and malformed exports.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{code, perc_in, root, stderr, stdout};

fn fixture_warc() -> PathBuf {
    root().join("fixtures/crawls/wget-demo.warc.gz")
}

fn fixture_golden() -> PathBuf {
    root().join("fixtures/golden/wget-demo.jsonl")
}

/// The fixture golden with one title, one canonical and one inlink's anchor changed; returns
/// what was changed: (title page, its old title), (canonical page, its old canonical), (the
/// page whose inlink changed, the inlink's source).
fn tampered(into: &Path) -> [(String, String); 3] {
    let text = std::fs::read_to_string(fixture_golden()).unwrap();
    let mut lines: Vec<serde_json::Value> =
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let url = |v: &serde_json::Value| v["url"].as_str().unwrap().to_string();
    let title = {
        let l = &mut lines[0];
        let old = l["title"].as_str().unwrap().to_string();
        l["title"] = "A title from last year".into();
        (url(l), old)
    };
    let canonical = {
        let l = lines.iter_mut().find(|l| l["canonical"] != l["url"]).expect("a duplicate");
        let old = l["canonical"].as_str().unwrap().to_string();
        l["canonical"] = l["url"].clone();
        (url(l), old)
    };
    let inlink = {
        let l = lines.iter_mut().rev().find(|l| !l["inlinks"].as_array().unwrap().is_empty());
        let l = l.expect("a page with inlinks");
        let first = &mut l["inlinks"][0];
        let from = first["from"].as_str().unwrap().to_string();
        first["anchor"] = "an anchor nobody wrote".into();
        (url(l), from)
    };
    let out: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(into, out).unwrap();
    [title, canonical, inlink]
}

#[test]
fn replay_expect_is_green_on_the_committed_golden_and_touches_no_disk() {
    let cwd = tempfile::tempdir().unwrap();
    let out = perc_in(
        cwd.path(),
        &[
            "replay",
            fixture_warc().to_str().unwrap(),
            "--expect",
            fixture_golden().to_str().unwrap(),
        ],
    );
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("are the same: 17 pages"), "{}", stdout(&out));
    // The store was in memory: the default data directory (./data) was never created.
    let left: Vec<_> = std::fs::read_dir(cwd.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn replay_expect_names_each_difference_and_exits_1() {
    let tmp = tempfile::tempdir().unwrap();
    let golden = tmp.path().join("golden.jsonl");
    let [(title_page, old_title), (dup, old_canonical), (linked, source)] = tampered(&golden);
    let junit = tmp.path().join("report.xml");
    let out = perc_in(
        tmp.path(),
        &[
            "replay",
            fixture_warc().to_str().unwrap(),
            "--expect",
            golden.to_str().unwrap(),
            "--junit",
            junit.to_str().unwrap(),
        ],
    );
    assert_eq!(code(&out), 1, "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("3 pages changed, 0 added, 0 removed"), "{text}");
    assert!(text.contains(&format!("  {title_page}\n")), "{text}");
    assert!(text.contains(&format!("\"A title from last year\" → \"{old_title}\"")), "{text}");
    assert!(text.contains(&format!("  {dup}\n")), "{text}");
    assert!(text.contains(&format!("canonical:  \"{dup}\" → \"{old_canonical}\"")), "{text}");
    assert!(text.contains(&format!("  {linked}\n")), "{text}");
    assert!(text.contains(&format!("- from {source} (to ")), "{text}");
    assert!(text.contains("\"an anchor nobody wrote\""), "{text}");
    assert!(stderr(&out).contains("--update"), "{}", stderr(&out));
    let report = std::fs::read_to_string(&junit).unwrap();
    assert!(report.contains("tests=\"4\" failures=\"3\""), "{report}");
    assert!(report.contains("changed: canonical"), "{report}");
    assert!(report.contains("14 pages unchanged"), "{report}");
}

#[test]
fn update_rewrites_the_golden_then_it_is_green() {
    let tmp = tempfile::tempdir().unwrap();
    let golden = tmp.path().join("golden.jsonl");
    tampered(&golden);
    let args = |update: bool| {
        let mut a = vec![
            "replay".to_string(),
            fixture_warc().display().to_string(),
            "--expect".into(),
            golden.display().to_string(),
        ];
        if update {
            a.push("--update".into());
        }
        a
    };
    let run = |update| {
        let a = args(update);
        perc_in(tmp.path(), &a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let out = run(true);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("updated"), "{}", stdout(&out));
    assert!(stdout(&out).contains("17 pages (3 changed, 0 added, 0 removed)"), "{}", stdout(&out));
    assert_eq!(
        std::fs::read_to_string(&golden).unwrap(),
        std::fs::read_to_string(fixture_golden()).unwrap()
    );
    assert_eq!(code(&run(false)), 0);
    let again = run(true);
    assert!(stdout(&again).contains("is up to date: 17 pages"), "{}", stdout(&again));
    // A golden that does not exist yet: --update writes it, --expect alone says how.
    let new = tmp.path().join("new.jsonl");
    let missing = perc_in(
        tmp.path(),
        &["replay", fixture_warc().to_str().unwrap(), "--expect", new.to_str().unwrap()],
    );
    assert_eq!(code(&missing), 2);
    assert!(
        stderr(&missing).contains("does not exist: --update writes it"),
        "{}",
        stderr(&missing)
    );
    assert!(!new.exists());
}

/// A golden named wrongly gets the right message; one with a byte order mark (saved by an
/// editor) is still the export; one that is a symbolic link is updated through the link.
#[test]
fn goldens_that_are_a_directory_a_bom_or_a_link() {
    let tmp = tempfile::tempdir().unwrap();
    let warc = fixture_warc();
    let w = warc.to_str().unwrap();
    let out = perc_in(tmp.path(), &["replay", w, "--expect", tmp.path().to_str().unwrap()]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("is a directory: --expect names a golden export file"));

    let bom = tmp.path().join("bom.jsonl");
    let golden = std::fs::read(fixture_golden()).unwrap();
    std::fs::write(&bom, [&b"\xEF\xBB\xBF"[..], &golden].concat()).unwrap();
    let out = perc_in(tmp.path(), &["replay", w, "--expect", bom.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));

    let real = tmp.path().join("real.jsonl");
    std::fs::write(&real, "").unwrap();
    let link = tmp.path().join("link.jsonl");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let out = perc_in(tmp.path(), &["replay", w, "--expect", link.to_str().unwrap(), "--update"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "still a link");
    assert_eq!(std::fs::read(&real).unwrap(), golden, "the file it points to was updated");
}

#[test]
fn a_directory_of_warcs_replays_with_expect() {
    let tmp = tempfile::tempdir().unwrap();
    let warcs = tmp.path().join("warcs");
    std::fs::create_dir(&warcs).unwrap();
    std::fs::copy(fixture_warc(), warcs.join("a.warc.gz")).unwrap();
    std::fs::write(warcs.join("README"), "not a WARC").unwrap();
    let out = perc_in(
        tmp.path(),
        &["replay", warcs.to_str().unwrap(), "--expect", fixture_golden().to_str().unwrap()],
    );
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("from 1 file(s)"), "{}", stderr(&out));
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = perc_in(tmp.path(), &["--data", ":memory:", "replay", empty.to_str().unwrap()]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("holds no .warc or .warc.gz file"), "{}", stderr(&out));
}

#[test]
fn a_memory_store_is_for_commands_that_fill_it() {
    let tmp = tempfile::tempdir().unwrap();
    let out =
        perc_in(tmp.path(), &["--data", ":memory:", "replay", fixture_warc().to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("17 pages indexed"), "{}", stdout(&out));
    let status = perc_in(tmp.path(), &["--data", ":memory:", "status"]);
    assert_eq!(code(&status), 1);
    let why = stderr(&status);
    assert!(why.contains("no perc store at :memory:: a memory store is new and empty"), "{why}");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[test]
fn diff_exits_0_1_or_2_and_names_the_bad_line() {
    let tmp = tempfile::tempdir().unwrap();
    let golden = fixture_golden();
    let g = golden.to_str().unwrap();
    let same = perc_in(tmp.path(), &["diff", g, g]);
    assert_eq!(code(&same), 0);
    assert!(stdout(&same).contains("are the same: 17 pages"));

    let changed = tmp.path().join("changed.jsonl");
    let [(title_page, _), _, _] = tampered(&changed);
    let c = changed.to_str().unwrap();
    let differ = perc_in(tmp.path(), &["diff", g, c]);
    assert_eq!(code(&differ), 1);
    assert!(stdout(&differ).contains("3 pages changed"), "{}", stdout(&differ));
    let json = perc_in(tmp.path(), &["diff", g, c, "--json"]);
    assert_eq!(code(&json), 1);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["equal"], false);
    assert_eq!(v["changed"][0]["url"], title_page.as_str());
    assert_eq!(v["changed"][0]["fields"][0]["field"], "title");

    let text = std::fs::read_to_string(&golden).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.swap(3, 4);
    let unsorted = tmp.path().join("unsorted.jsonl");
    std::fs::write(&unsorted, lines.join("\n")).unwrap();
    let out = perc_in(tmp.path(), &["diff", g, unsorted.to_str().unwrap()]);
    assert_eq!(code(&out), 2);
    let e = stderr(&out);
    assert!(e.contains(&format!("{} line 5: ", unsorted.display())), "{e}");
    assert!(e.contains("sorted by URL"), "{e}");

    let malformed = tmp.path().join("malformed.jsonl");
    std::fs::write(&malformed, format!("{}\n{{\"url\": \"http://x/\", oops\n", lines[0])).unwrap();
    let out = perc_in(tmp.path(), &["diff", malformed.to_str().unwrap(), g]);
    assert_eq!(code(&out), 2);
    let e = stderr(&out);
    assert!(e.contains(&format!("{} line 2: not a JSON export line", malformed.display())), "{e}");

    let missing = perc_in(tmp.path(), &["diff", g, "nope.jsonl"]);
    assert_eq!(code(&missing), 2);
    assert!(stderr(&missing).contains("cannot read nope.jsonl"), "{}", stderr(&missing));

    // `-` reads standard input.
    let mut child = Command::new(common::PERC)
        .args(["diff", "-", g])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", stdout(&out));
}
