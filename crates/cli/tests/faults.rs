//! Faults and hostile inputs, through the `perc` binary: each test is named after
//! the case it covers, and each failed before the fix it checks.

use std::io::{BufRead, BufReader, Lines};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{export, root, seeds, Site};

/// A small deterministic generator (splitmix64), so that every run kills at the same points.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n.max(1)
    }
}

/// Lock and liveness TTLs far longer than the test: a restart that waited for the dead
/// process's locks to age would time out instead of finishing.
const LONG_TTLS: [&str; 4] =
    ["--set", "txn.lock_ttl_ms=600000", "--set", "txn.liveness_ttl_ms=600000"];

fn command(data: &Path, args: &[&str]) -> Command {
    common::command(data, &[&LONG_TTLS[..], args].concat())
}

/// Runs `cmd` to its end, failing the test if it runs longer than `limit`. Its output goes
/// to files, so that a pipe nobody reads never blocks it.
fn finish_within(cmd: &mut Command, logs: &Path, limit: Duration, what: &str) -> (bool, String) {
    let (out, err) = (logs.with_extension("out"), logs.with_extension("err"));
    let mut child = cmd
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status.success(), std::fs::read_to_string(&err).unwrap());
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} did not finish within {limit:?}:\n{}",
                std::fs::read_to_string(&err).unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A run of `args` on `data` that logs each observer run on stderr, and that stderr's lines.
fn spawn_logging_runs(data: &Path, args: &[&str]) -> (Child, Lines<BufReader<ChildStderr>>) {
    let mut child = command(data, args)
        .env("RUST_LOG", "perc_notify=debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stderr.take().unwrap()).lines();
    (child, lines)
}

/// Reads `lines` until `n` observer runs are logged or the process ends; returns how many were.
fn count_runs(lines: &mut Lines<BufReader<ChildStderr>>, n: usize) -> usize {
    let mut runs = 0;
    while runs < n {
        match lines.next() {
            Some(line) => runs += usize::from(line.unwrap().contains("observer ran")),
            None => break,
        }
    }
    runs
}

/// Runs `args` on `data`, killing it with SIGKILL once it has logged `kill_at` observer runs
/// (0: after `delay_ms`, while it is still loading). Returns how many runs it logged.
fn run_and_kill(data: &Path, args: &[&str], kill_at: usize, delay_ms: u64) -> usize {
    let (mut child, mut lines) = spawn_logging_runs(data, args);
    let runs = if kill_at == 0 {
        std::thread::sleep(Duration::from_millis(delay_ms));
        0
    } else {
        count_runs(&mut lines, kill_at)
    };
    child.kill().unwrap(); // SIGKILL (harmless if it already ended)
    child.wait().unwrap();
    runs
}

/// Kills `args` at 20 points of its run drawn from `seed` and checks each time that ONE
/// restart of the same command finishes and leaves the export `want` (after `fix`).
fn kill_and_restart_20_times(
    tmp: &Path,
    args: &[&str],
    seed: u64,
    want: &str,
    fix: &dyn Fn(String) -> String,
) {
    // The uninterrupted run: how many observer runs there are to kill between.
    let total = run_and_kill(&tmp.join("whole"), args, usize::MAX, 0);
    assert!(total > 20, "only {total} observer runs");
    assert_eq!(fix(export(&tmp.join("whole"), &tmp.join("whole.jsonl"))), want);
    let mut rng = Rng(seed);
    for i in 0..20 {
        let data = tmp.join(format!("killed{i}"));
        // One point in five is during loading, before any observer ran; the others are spread
        // over the first 70% of the runs (how many runs a crawl takes varies by up to 15%
        // with the gathering of weak notifications: a point past the end is no kill).
        let kill_at = if i % 5 == 0 { 0 } else { 1 + rng.below(total as u64 * 7 / 10) as usize };
        let delay_ms = rng.below(40);
        let runs = run_and_kill(&data, args, kill_at, delay_ms);
        assert!(
            kill_at == 0 || runs == kill_at,
            "the run ended after {runs} observer runs, before it could be killed at {kill_at} \
             (the uninterrupted run had {total})"
        );
        let mut restart = command(&data, args);
        restart.env("RUST_LOG", "perc_cli=debug,perc_txn=debug,perc_notify=debug");
        let what = format!("the restart after a kill at run {kill_at} (+{delay_ms} ms)");
        let (ok, stderr) = finish_within(&mut restart, &data, Duration::from_secs(60), &what);
        assert!(ok, "{what} failed:\n{stderr}");
        let got = fix(export(&data, &tmp.join(format!("killed{i}.jsonl"))));
        assert_eq!(got, want, "killed at run {kill_at} (+{delay_ms} ms), restarted once");
    }
}

#[test]
fn restart_after_kill9_of_a_crawl_finishes_in_one_run() {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let s = seeds(tmp.path(), &[site.base()]);
    let want = std::fs::read_to_string(root().join("fixtures/golden/demo.jsonl")).unwrap();
    let base = site.base();
    kill_and_restart_20_times(
        tmp.path(),
        &["crawl", "--seeds", s.to_str().unwrap()],
        7,
        &want,
        &|e| e.replace(&base, "http://demo.test/"),
    );
}

#[test]
fn restart_after_kill9_of_a_replay_finishes_in_one_run() {
    let tmp = tempfile::tempdir().unwrap();
    let warc = root().join("fixtures/crawls/wget-demo.warc.gz");
    let want = std::fs::read_to_string(root().join("fixtures/golden/wget-demo.jsonl")).unwrap();
    kill_and_restart_20_times(tmp.path(), &["replay", warc.to_str().unwrap()], 11, &want, &|e| e);
}

/// The same with sled's log not compressed (`store.zstd_level = 0`; the default compresses):
/// sled recovers the plain log, and later commands (the export here, with the default level)
/// open the store as it was made.
#[test]
fn restart_after_kill9_of_an_uncompressed_replay_finishes_in_one_run() {
    let tmp = tempfile::tempdir().unwrap();
    let warc = root().join("fixtures/crawls/wget-demo.warc.gz");
    let want = std::fs::read_to_string(root().join("fixtures/golden/wget-demo.jsonl")).unwrap();
    let args = ["--set", "store.zstd_level=0", "replay", warc.to_str().unwrap()];
    kill_and_restart_20_times(tmp.path(), &args, 13, &want, &|e| e);
    let conf = std::fs::read(tmp.path().join("whole/conf")).unwrap();
    let conf = String::from_utf8_lossy(&conf);
    assert!(conf.contains("use_compression: false"), "the store is not compressed: {conf}");
}

/// The stderr of a run, for assertions.
fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts that a run's stderr says `what`.
fn says(out: &std::process::Output, what: &str) {
    let err = stderr_of(out);
    assert!(err.contains(what), "expected {what:?} in:\n{err}");
}

/// A store in a temporary directory with the wget demo crawl replayed into it.
fn demo_replayed() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("store");
    let warc = root().join("fixtures/crawls/wget-demo.warc.gz");
    common::ok(&common::perc(&data, &["replay", warc.to_str().unwrap()]));
    (tmp, data)
}

#[test]
fn closed_stdout_ends_the_command_quietly() {
    let (_tmp, data) = demo_replayed();
    for args in [&["status"][..], &["export", "--out", "-"]] {
        // `perc status | head -0`: the reader is gone before perc writes.
        let mut child =
            command(&data, args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr_of(&out));
        assert_eq!(stderr_of(&out), "", "{args:?} ends quietly");
    }
}

#[test]
fn an_export_to_a_pipe_or_device_writes_into_it_and_leaves_it_one() {
    use std::os::unix::fs::FileTypeExt;
    let (tmp, data) = demo_replayed();
    let file = tmp.path().join("export.jsonl");
    let expected = export(&data, &file);
    // `--out /dev/null` once renamed a regular file over the device; a FIFO shows the same
    // without touching the machine's /dev/null.
    let fifo = tmp.path().join("fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    // A writer end held open here lets the reader start at once, and its end of file come
    // only once this end is closed after perc: a perc that never opened the pipe fails the
    // comparison instead of hanging the test.
    let hold = std::fs::OpenOptions::new().read(true).write(true).open(&fifo).unwrap();
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    common::ok(&common::perc(&data, &["export", "--out", fifo.to_str().unwrap()]));
    drop(hold);
    assert_eq!(reader.join().unwrap(), expected, "the lines went through the pipe");
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo(), "still a FIFO");
    assert!(!tmp.path().join("fifo.tmp").exists(), "no temporary file left beside it");
}

#[test]
fn closed_stderr_never_kills_or_hangs_a_crawl() {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let s = seeds(tmp.path(), &[site.base()]);
    let data = tmp.path().join("store");
    // Debug logging: every observer run writes to the closed stderr.
    let mut child = command(&data, &["crawl", "--seeds", s.to_str().unwrap()])
        .env("RUST_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("a crawl with a closed stderr did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    let want = std::fs::read_to_string(root().join("fixtures/golden/demo.jsonl")).unwrap();
    let got = export(&data, &tmp.path().join("out.jsonl"));
    assert_eq!(got.replace(&site.base(), "http://demo.test/"), want);
}

/// Runs `args` on `data` and sends it `signal` (`INT`, `TERM`) once it has logged `runs`
/// observer runs; returns its exit code and the stderr lines after the signal.
fn signal_after_runs(
    data: &Path,
    args: &[&str],
    runs: usize,
    signal: &str,
) -> (Option<i32>, Vec<String>) {
    let (mut child, mut lines) = spawn_logging_runs(data, args);
    let seen = count_runs(&mut lines, runs);
    if seen == runs {
        let sent =
            Command::new("kill").args([&format!("-{signal}"), &child.id().to_string()]).status();
        assert!(sent.unwrap().success());
    }
    assert_eq!(seen, runs, "the run ended before it could be signalled");
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    (child.wait().unwrap().code(), rest)
}

#[test]
fn sigint_during_a_crawl_closes_the_warc_and_the_next_run_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let s = seeds(tmp.path(), &[site.base()]);
    let data = tmp.path().join("store");
    let warc = tmp.path().join("crawl.warc.gz");
    let args = ["crawl", "--seeds", s.to_str().unwrap(), "--warc-out", warc.to_str().unwrap()];
    let (code, rest) = signal_after_runs(&data, &args, 30, "INT");
    assert_eq!(code, Some(130), "exit status after SIGINT");
    assert!(
        rest.iter().any(|l| l.contains("Run the same command again to resume")),
        "says how to resume: {rest:?}"
    );
    // The WARC ends on a record boundary: every record in it reads back.
    let replayed = tmp.path().join("replayed");
    let out = common::perc(&replayed, &["replay", warc.to_str().unwrap()]);
    assert!(out.status.success(), "the WARC reads back whole: {}", stderr_of(&out));
    // The next run resumes and finishes with the export of an uninterrupted crawl.
    common::ok(&common::perc(&data, &["crawl", "--seeds", s.to_str().unwrap()]));
    let want = std::fs::read_to_string(root().join("fixtures/golden/demo.jsonl")).unwrap();
    let got = export(&data, &tmp.path().join("out.jsonl"));
    assert_eq!(got.replace(&site.base(), "http://demo.test/"), want);
}

#[test]
fn warc_out_refuses_an_existing_file_unless_append() {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let s = seeds(tmp.path(), &[site.base()]);
    let warc = tmp.path().join("crawl.warc.gz");
    let w = warc.to_str().unwrap();
    common::ok(&common::perc(
        &tmp.path().join("a"),
        &["crawl", "--seeds", s.to_str().unwrap(), "--warc-out", w],
    ));
    let first = std::fs::read(&warc).unwrap();
    let out = common::perc(
        &tmp.path().join("b"),
        &["crawl", "--seeds", s.to_str().unwrap(), "--warc-out", w],
    );
    assert_eq!(out.status.code(), Some(2));
    says(&out, "--append");
    assert_eq!(std::fs::read(&warc).unwrap(), first, "the first run's records are intact");
    assert!(!tmp.path().join("b").exists(), "nothing was crawled");
    common::ok(&common::perc(
        &tmp.path().join("c"),
        &["crawl", "--seeds", s.to_str().unwrap(), "--warc-out", w, "--append"],
    ));
    let both = std::fs::read(&warc).unwrap();
    assert!(both.len() > first.len() && both.starts_with(&first), "records were appended");
    // The site did not change: each refetched payload is a revisit of the first run's
    // capture (the head only), and the file replays to the crawl's export, every record of
    // the second run read as the response it stands for.
    let (responses, revisits) = common::warcio_check(&warc);
    assert!(revisits >= 17, "every page at least: {revisits}");
    let replayed = common::ok(&common::perc(&tmp.path().join("d"), &["replay", w]));
    assert!(
        replayed.starts_with(&format!("replayed {} responses ", responses + revisits)),
        "{replayed}"
    );
    let want = std::fs::read_to_string(root().join("fixtures/golden/demo.jsonl")).unwrap();
    let got = export(&tmp.path().join("d"), &tmp.path().join("d.jsonl"));
    assert_eq!(got.replace(&site.base(), "http://demo.test/"), want);
}

#[test]
fn seed_list_from_dev_zero_fails_fast_naming_the_line() {
    let tmp = tempfile::tempdir().unwrap();
    let out = common::perc(&tmp.path().join("s"), &["crawl", "--seeds", "/dev/zero"]);
    assert_eq!(out.status.code(), Some(2));
    says(&out, "/dev/zero line 1: longer than 8192 bytes");
    let many = tmp.path().join("many.txt");
    std::fs::write(&many, "http://a.test/1\nhttp://a.test/2\nhttp://a.test/3\n").unwrap();
    let out = common::perc(
        &tmp.path().join("s"),
        &["--set", "crawl.seeds_max=2", "crawl", "--seeds", many.to_str().unwrap()],
    );
    says(&out, "line 3: more than crawl.seeds_max = 2 seeds");
}

#[test]
fn credentials_in_seeds_and_links_are_never_stored_or_exported() {
    let tmp = tempfile::tempdir().unwrap();
    let web = tmp.path().join("web");
    std::fs::create_dir_all(&web).unwrap();
    std::fs::write(web.join("a.html"), "<title>a</title>").unwrap();
    std::fs::write(web.join("b.html"), "<title>b</title>").unwrap();
    let site = Site::start(&web);
    let b_with_creds = site.url("b.html").replace("http://", "http://bob:hunter2@");
    std::fs::write(
        web.join("index.html"),
        format!("<a href='{b_with_creds}'>b</a><a href='a.html'>a</a>"),
    )
    .unwrap();
    let with_creds = site.base().replace("http://", "http://alice:secret@");
    let s = seeds(tmp.path(), &[with_creds]);
    let data = tmp.path().join("store");
    let out = common::perc(&data, &["crawl", "--seeds", s.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    says(&out, "credentials removed from the seed");
    assert!(!stderr_of(&out).contains("secret"));
    let got = export(&data, &tmp.path().join("out.jsonl"));
    assert!(got.contains(&format!("\"url\":\"{}\"", site.base())), "{got}");
    for secret in ["alice", "secret", "bob", "hunter2"] {
        assert!(!got.contains(secret), "{secret} in the export: {got}");
    }
    let b = common::ok(&common::perc(&data, &["page", &site.url("b.html")]));
    assert!(b.contains("\"in_degree\":1"), "the link was followed and inverted: {b}");
}

#[test]
fn a_link_longer_than_the_limit_is_dropped_and_the_page_keeps_its_other_links() {
    let tmp = tempfile::tempdir().unwrap();
    let web = tmp.path().join("web");
    std::fs::create_dir_all(&web).unwrap();
    let long = format!("{}.html", "x".repeat(5000));
    std::fs::write(
        web.join("index.html"),
        format!("<a href='a.html'>a</a><a href='{long}'>long</a><a href='b.html'>b</a>"),
    )
    .unwrap();
    std::fs::write(web.join("a.html"), "<title>a</title>").unwrap();
    std::fs::write(web.join("b.html"), "<title>b</title>").unwrap();
    let site = Site::start(&web);
    let s = seeds(tmp.path(), &[site.base()]);
    let data = tmp.path().join("store");
    common::ok(&common::perc(&data, &["crawl", "--seeds", s.to_str().unwrap()]));
    let got = export(&data, &tmp.path().join("out.jsonl"));
    assert_eq!(got.lines().count(), 3, "{got}");
    for page in ["a.html", "b.html"] {
        let line = common::ok(&common::perc(&data, &["page", &site.url(page)]));
        assert!(line.contains("\"in_degree\":1"), "{page}: {line}");
    }
    let status = common::ok(&common::perc(&data, &["status"]));
    assert!(!status.contains("parked notifications"), "{status}");
    assert!(!got.contains(&long));
}

/// A page nested 80,000 elements deep took the parser minutes (its cost is elements times
/// depth): it is recorded, not parsed, and the crawl and a search over the store go on.
#[test]
fn a_page_nested_past_the_limit_is_recorded_not_parsed() {
    let tmp = tempfile::tempdir().unwrap();
    let web = tmp.path().join("web");
    std::fs::create_dir_all(&web).unwrap();
    std::fs::write(
        web.join("index.html"),
        "<title>home</title><p>the home page</p><a href='deep.html'>deep</a>",
    )
    .unwrap();
    let n = 80_000;
    let deep = format!("<title>deep</title>{}x{}", "<div>".repeat(n), "</div>".repeat(n));
    std::fs::write(web.join("deep.html"), deep).unwrap();
    let site = Site::start(&web);
    let s = seeds(tmp.path(), &[site.base()]);
    let data = tmp.path().join("store");
    let mut run = command(&data, &["crawl", "--seeds", s.to_str().unwrap()]);
    let (ok, stderr) =
        finish_within(&mut run, &tmp.path().join("log"), Duration::from_secs(120), "the crawl");
    assert!(ok, "{stderr}");
    let page = common::ok(&common::perc(&data, &["page", &site.url("deep.html")]));
    assert!(page.contains("HTML nested more than 512 elements deep"), "{page}");
    let got = export(&data, &tmp.path().join("out.jsonl"));
    assert_eq!(got.lines().count(), 1, "the home page alone: {got}");
    let found = common::perc(&data, &["search", "home"]);
    assert_eq!(found.status.code(), Some(0), "{}", stderr_of(&found));
}

/// A robots.txt larger than a page may be is read up to 500 KiB and obeyed (RFC 9309), not
/// taken for an unreachable one (which would give the whole host up).
#[test]
fn a_huge_robots_txt_is_read_up_to_500_kib() {
    let tmp = tempfile::tempdir().unwrap();
    let web = tmp.path().join("web");
    std::fs::create_dir_all(web.join("private")).unwrap();
    let padding = "# a comment to make the file large\n".repeat(60_000); // ~2 MiB
    std::fs::write(
        web.join("robots.txt"),
        format!("User-agent: *\nDisallow: /private/\n{padding}"),
    )
    .unwrap();
    std::fs::write(web.join("index.html"), "<a href='a.html'>a</a><a href='private/x.html'>x</a>")
        .unwrap();
    std::fs::write(web.join("a.html"), "<title>a</title>").unwrap();
    std::fs::write(web.join("private/x.html"), "<title>x</title>").unwrap();
    let site = Site::start(&web);
    let s = seeds(tmp.path(), &[site.base()]);
    let data = tmp.path().join("store");
    common::ok(&common::perc(&data, &["crawl", "--seeds", s.to_str().unwrap()]));
    let page = common::ok(&common::perc(&data, &["page", &site.url("private/x.html")]));
    assert!(page.contains("disallowed by robots.txt"), "{page}");
    let got = export(&data, &tmp.path().join("out.jsonl"));
    assert_eq!(got.lines().count(), 2, "the home page and a.html: {got}");
}

#[test]
fn scope_prefixes_are_urls_matched_at_segment_boundaries() {
    let tmp = tempfile::tempdir().unwrap();
    let s = seeds(tmp.path(), &["http://127.0.0.1:1/docs/".to_string()]);
    let data = tmp.path().join("store");
    let out = common::perc(&data, &["crawl", "--seeds", s.to_str().unwrap(), "--prefix", "docs/"]);
    assert_eq!(out.status.code(), Some(2));
    says(&out, "the scope prefix \"docs/\" is not an absolute http(s) URL");
    let out = common::perc(
        &data,
        &["crawl", "--seeds", s.to_str().unwrap(), "--prefix", "http://127.0.0.1:1/docs.evil/"],
    );
    assert_eq!(out.status.code(), Some(2));
    says(&out, "no seed is inside the scope prefixes");
}

#[test]
fn read_commands_on_a_missing_store_say_so_and_create_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let typo = tmp.path().join("dtaa");
    for args in [
        &["status"][..],
        &["canonical", "http://h.test/"],
        &["page", "http://h.test/"],
        &["export", "--out", "-"],
        &["wait"],
        &["refetch", "--all"],
    ] {
        let out = common::perc(&typo, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        says(&out, &format!("no perc store at {}", typo.display()));
        assert!(!typo.exists(), "{args:?} created {}", typo.display());
    }
}

#[test]
fn config_values_that_would_hang_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("store");
    let warc = root().join("fixtures/crawls/wget-demo.warc.gz");
    for (set, want) in [
        ("oracle.block=0", "oracle.block = 0 is out of range"),
        ("store.cache_bytes=0", "store.cache_bytes = 0 is out of range"),
        ("workers.scan_batch=0", "workers.scan_batch = 0 is out of range"),
        ("workers.scanners=0", "workers.scanners = 0 leaves nobody to run the observers"),
    ] {
        let out = finish_within(
            command(&data, &["--set", set, "replay", warc.to_str().unwrap()]).stdin(Stdio::null()),
            &tmp.path().join("cfg"),
            Duration::from_secs(30),
            set,
        );
        assert!(!out.0, "{set} was accepted");
        assert!(out.1.contains(want), "{set}: {}", out.1);
    }
    let out = command(&data, &["status"]).env("PERC_CRAWL_MAX_DEPHT", "3").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    says(&out, "did you mean \"CRAWL_MAX_DEPTH\"");
}

#[test]
fn unreachable_seeds_are_given_up_with_a_reason_and_the_crawl_ends() {
    let tmp = tempfile::tempdir().unwrap();
    // Port 1 of 127.0.0.1: nothing listens there, so every connection is refused.
    let dead = "http://127.0.0.1:1/".to_string();
    let s = seeds(tmp.path(), std::slice::from_ref(&dead));
    let data = tmp.path().join("store");
    let mut run = command(&data, &["crawl", "--seeds", s.to_str().unwrap()]);
    let (ok, stderr) =
        finish_within(&mut run, &tmp.path().join("dead"), Duration::from_secs(60), "the crawl");
    assert!(!ok, "a crawl that fetched no seed fails");
    assert!(stderr.contains("no seed could be fetched"), "{stderr}");
    let page = common::ok(&common::perc(&data, &["page", &dead]));
    assert!(page.contains("robots.txt unreachable"), "{page}");
    assert!(page.contains("given up"), "{page}");
    let status = common::ok(&common::perc(&data, &["status"]));
    assert!(status.contains("URLs waiting to be fetched:    0"), "{status}");
    assert!(status.contains("1 robots.txt unreachable (host given up)"), "{status}");

    // With a seed that answers too, the crawl succeeds and its summary names the failure.
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let s = seeds(tmp.path(), &[site.base(), dead]);
    let out = common::ok(&common::perc(
        &tmp.path().join("both"),
        &["crawl", "--seeds", s.to_str().unwrap()],
    ));
    assert!(out.contains("robots.txt unreachable (host given up)"), "{out}");
}

/// The store on a full filesystem: a tmpfs of 300 KiB mounted in a mount namespace of the
/// test's own (`unshare`, as root or in a user namespace), so no privilege outlives it. The
/// demo crawl's store now takes about 600 KiB (once under make test's load it fitted in
/// 600 KiB, and the crawl did not fail): half of that fills whatever the timing.
#[test]
fn disk_full_stops_the_crawl_with_one_clear_error_and_resumes_when_space_is_back() {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let s = seeds(tmp.path(), &[site.base()]);
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let script = r#"
        set -u
        mount -t tmpfs -o size=300k tmpfs "$MNT" || exit 90
        perc() { "$PERC" --config "$CONFIG" --data "$MNT/store" "$@"; }
        timeout 30 "$PERC" --config "$CONFIG" --data "$MNT/store" crawl --seeds "$SEEDS" \
            > "$OUT/full.out" 2> "$OUT/full.err"
        echo $? > "$OUT/full.rc"
        mount -o remount,size=64m tmpfs "$MNT" || exit 91
        perc crawl --seeds "$SEEDS" > "$OUT/again.out" 2> "$OUT/again.err"
        echo $? > "$OUT/again.rc"
        perc export --out "$OUT/export.jsonl" > /dev/null
    "#;
    in_mount_namespace(tmp.path(), script, &s, Duration::from_secs(120));
    let read = |f: &str| std::fs::read_to_string(tmp.path().join(f)).unwrap();
    let full_rc: i32 = read("full.rc").trim().parse().unwrap();
    let full_err = read("full.err");
    assert_ne!(full_rc, 124, "the crawl on a full disk did not stop within 30 s: {full_err}");
    assert_eq!(full_rc, 2, "{full_err}");
    let errors: Vec<&str> = full_err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(
        errors,
        [format!(
            "error: no space left on device writing the store at {}/store; what was stored \
             before is intact: free some space and run the same command again",
            mnt.display()
        )],
        "one clear error: {full_err}"
    );
    assert!(full_err.lines().count() < 20, "no flood of errors: {full_err}");
    assert_eq!(read("again.rc").trim(), "0", "{}", read("again.err"));
    let want = std::fs::read_to_string(root().join("fixtures/golden/demo.jsonl")).unwrap();
    assert_eq!(read("export.jsonl").replace(&site.base(), "http://demo.test/"), want);
}

/// Runs `script` with `sh` in a mount namespace of its own (as root, or as a user mapped to
/// root), so that it may mount a small tmpfs on `$MNT` (`tmp/mnt`); it has `$OUT` (`tmp`),
/// `$PERC`, `$CONFIG` (the test configuration) and `$SEEDS` (`seeds`). Fails the test with
/// its stderr if it fails or outlasts `limit`.
fn in_mount_namespace(tmp: &Path, script: &str, seeds: &Path, limit: Duration) {
    let is_root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    let mut unshare = Command::new("unshare");
    if !is_root {
        unshare.args(["--user", "--map-root-user"]);
    }
    unshare
        .args(["--mount", "sh", "-c", script])
        .env("MNT", tmp.join("mnt"))
        .env("OUT", tmp)
        .env("PERC", common::PERC)
        .env("CONFIG", root().join("config/test.toml"))
        .env("SEEDS", seeds)
        .env_remove("RUST_LOG");
    let (ok, stderr) = finish_within(&mut unshare, &tmp.join("unshare"), limit, "the script");
    assert!(ok, "the script (mounting a tmpfs in a mount namespace of its own) failed: {stderr}");
}

/// `perc serve` on a disk that fills stops with the one clear error and exit 2, rather than
/// stay up answering 500 to everything; once there is space, it serves again.
#[test]
fn serve_on_a_full_disk_exits_2_with_one_clear_error_and_serves_again_with_space() {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let s = seeds(tmp.path(), &[site.base()]);
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let script = r#"
        set -u
        mount -t tmpfs -o size=300k tmpfs "$MNT" || exit 90
        timeout 60 "$PERC" --config "$CONFIG" --data "$MNT/store" serve --listen 127.0.0.1:0 \
            --seeds "$SEEDS" > "$OUT/full.out" 2> "$OUT/full.err"
        echo $? > "$OUT/full.rc"
        mount -o remount,size=64m tmpfs "$MNT" || exit 91
        # The stopped server's address file, left by its exit on the full disk: the wait
        # below is for the new one's.
        rm -f "$MNT/store/serve.json"
        "$PERC" --config "$CONFIG" --data "$MNT/store" serve --listen 127.0.0.1:0 \
            > "$OUT/again.out" 2> "$OUT/again.err" &
        pid=$!
        # Serves again: the status it answers is the store's (the address is in serve.json).
        for i in $(seq 600); do
            [ -s "$MNT/store/serve.json" ] && break
            sleep 0.1
        done
        "$PERC" --config "$CONFIG" --data "$MNT/store" status > "$OUT/status.out" 2>&1
        echo $? > "$OUT/status.rc"
        kill -TERM $pid; wait $pid; echo $? > "$OUT/again.rc"
    "#;
    in_mount_namespace(tmp.path(), script, &s, Duration::from_secs(200));
    let read = |f: &str| std::fs::read_to_string(tmp.path().join(f)).unwrap();
    let full_err = read("full.err");
    let full_rc: i32 = read("full.rc").trim().parse().unwrap();
    assert_ne!(full_rc, 124, "perc serve on a full disk was still up after 60 s: {full_err}");
    assert_eq!(full_rc, 2, "{full_err}");
    let errors: Vec<&str> = full_err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "one clear error: {full_err}");
    assert!(errors[0].contains("no space left on device writing the store at"), "{full_err}");
    assert_eq!(read("status.rc").trim(), "0", "{}", read("status.out"));
    assert!(read("status.out").contains("pages"), "{}", read("status.out"));
    assert_eq!(read("again.rc").trim(), "0", "{}", read("again.err"));
}

/// A command that opens the store on a full disk (sled writes as it opens, even for a read)
/// says that the disk is full, once, and exits 2; once there is space it answers.
#[test]
fn a_full_disk_is_named_when_a_command_opens_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let s = seeds(tmp.path(), &[site.base()]);
    std::fs::create_dir_all(tmp.path().join("mnt")).unwrap();
    let script = r#"
        set -u
        mount -t tmpfs -o size=32m tmpfs "$MNT" || exit 90
        perc() { "$PERC" --config "$CONFIG" --data "$MNT/store" "$@"; }
        perc crawl --seeds "$SEEDS" > /dev/null 2> "$OUT/crawl.err" || exit 92
        dd if=/dev/zero of="$MNT/filler" bs=4k 2>/dev/null
        perc status > /dev/null 2> "$OUT/full.err"
        echo $? > "$OUT/full.rc"
        rm "$MNT/filler"
        perc status > "$OUT/status.out" 2> "$OUT/again.err"
        echo $? > "$OUT/again.rc"
    "#;
    in_mount_namespace(tmp.path(), script, &s, Duration::from_secs(120));
    let read = |f: &str| std::fs::read_to_string(tmp.path().join(f)).unwrap();
    let full_err = read("full.err");
    assert_eq!(read("full.rc").trim(), "2", "{full_err}");
    let errors: Vec<&str> = full_err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "one clear error: {full_err}");
    assert!(errors[0].contains("no space left on device"), "{full_err}");
    assert!(!full_err.contains("another perc process"), "no misleading hint: {full_err}");
    assert_eq!(read("again.rc").trim(), "0", "{}", read("again.err"));
    assert!(read("status.out").contains("pages"), "{}", read("status.out"));
}

/// The demo's robots.txt names a sitemap index: a gzip urlset (a page no followed link
/// reaches, and a URL out of scope), a broken file and a missing one.
#[test]
fn sitemaps_seed_the_crawl_and_a_bad_one_is_a_warning_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let s = seeds(tmp.path(), &[site.base()]);
    let data = tmp.path().join("store");
    let out = common::perc(&data, &["crawl", "--seeds", s.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    let warned = |what: &str| err.lines().any(|l| l.contains("WARN") && l.contains(what));
    assert!(
        warned(&format!("sitemap {}: not well-formed XML", site.url("sitemaps/broken.xml"))),
        "{err}"
    );
    assert!(warned(&format!("sitemap {}: HTTP 404", site.url("sitemaps/missing.xml"))), "{err}");
    let pages = export(&data, &tmp.path().join("out.jsonl"));
    // Only a nofollow link leads to it: the sitemap does.
    assert!(pages.contains(&format!("\"url\":\"{}\"", site.url("blog/hidden.html"))), "{pages}");
    let page = common::perc(&data, &["page", "http://elsewhere.test/not-in-scope.html"]);
    assert_eq!(page.status.code(), Some(1), "out of scope: never fetched nor known");
    // Switched off, the sitemaps are not read.
    let off = tmp.path().join("off");
    common::ok(&common::perc(
        &off,
        &["--set", "crawl.sitemaps=false", "crawl", "--seeds", s.to_str().unwrap()],
    ));
    let pages = export(&off, &tmp.path().join("off.jsonl"));
    assert!(!pages.contains("blog/hidden.html"), "{pages}");
}

#[test]
fn status_and_the_crawl_summary_count_what_they_say() {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let s = seeds(tmp.path(), &[site.base()]);
    let data = tmp.path().join("store");
    let out = common::ok(&common::perc(&data, &["crawl", "--seeds", s.to_str().unwrap()]));
    // 25 URLs: 17 pages (one only the sitemap leads to), a 404, 6 redirects (2 HTTP, 4
    // refresh: a chain of one each and a loop of two), and one robots.txt refuses (never
    // asked for). The sitemap files are no URLs of the index.
    assert!(out.contains("in the index, 24 URLs answered and 17 pages indexed"), "{out}");
    assert!(out.contains("not pages: 6 redirect, 1 HTTP 404, 1 disallowed by robots.txt"), "{out}");
    let status = common::ok(&common::perc(&data, &["status"]));
    for line in [
        "pages indexed:                 17",
        // Three clusters of two or more; the singletons are not "duplicate clusters".
        "duplicate clusters (2+ pages): 3",
        "URLs fetched or loaded:        25 (24 answered)",
        "URLs waiting to be fetched:    0",
    ] {
        assert!(status.contains(line), "{line:?} in:\n{status}");
    }
}

#[test]
fn sigterm_during_a_replay_stops_cleanly_and_the_next_run_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let warc = root().join("fixtures/crawls/wget-demo.warc.gz");
    let data = tmp.path().join("store");
    let (code, rest) = signal_after_runs(&data, &["replay", warc.to_str().unwrap()], 20, "TERM");
    assert_eq!(code, Some(130));
    assert!(rest.iter().any(|l| l.contains("Run the same command again to resume")), "{rest:?}");
    common::ok(&common::perc(&data, &["replay", warc.to_str().unwrap()]));
    let want = std::fs::read_to_string(root().join("fixtures/golden/wget-demo.jsonl")).unwrap();
    assert_eq!(export(&data, &tmp.path().join("out.jsonl")), want);
}
