//! Distributed mode end to end, through the `perc` binary: the Cloud Bigtable emulator, a
//! `perc oracle` server and several `perc worker` processes replay a WARC that an embedded
//! crawl recorded, and the export equals the embedded crawl's. Then the same with a worker
//! killed (SIGKILL) mid-run and the oracle server killed and restarted: the other workers
//! resolve what the dead one left and finish with the same export. And two oracles started on
//! one table: the second fences the first, and no timestamp is handed out twice.
//!
//! Every server is started here, on 127.0.0.1 and a port the kernel picks; without the
//! emulator these tests fail with a message saying how to get it.
#![cfg(feature = "bigtable")]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use perc_bigtable::Emulator;
use perc_synth::site;

mod common;

use common::{ok, root, PERC};

/// A child process killed (SIGKILL) when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The distributed configuration: config/bigtable.toml on the emulator and oracle given,
/// with short liveness and lease expiry so that a dead worker is noticed quickly.
struct Cluster {
    emulator: Emulator,
    oracle_addr: String,
    table: &'static str,
}

impl Cluster {
    /// A fresh emulator and an oracle on it (kept alive by the returned process).
    fn start(table: &'static str) -> (Cluster, Proc) {
        let emulator = Emulator::start().unwrap_or_else(|e| panic!("{e}"));
        let (oracle, oracle_addr) = start_oracle(&emulator, "127.0.0.1:0");
        (Cluster { emulator, oracle_addr, table }, oracle)
    }

    /// The `--set` values every process of the cluster gets.
    fn sets(&self) -> Vec<String> {
        vec![
            format!("bigtable.emulator={}", self.emulator.addr()),
            format!("bigtable.table={}", self.table),
            format!("oracle.server={}", self.oracle_addr),
            "txn.liveness_ttl_ms=1000".to_string(),
            "txn.lock_ttl_ms=3000".to_string(),
            "workers.lease_ttl_ms=1000".to_string(),
            "workers.failure_backoff_ms=10".to_string(),
            "workers.idle_ms=5".to_string(),
            "workers.gather_ms=10".to_string(),
            "workers.gc_interval_ms=0".to_string(),
            "workers.report_ms=200".to_string(),
        ]
    }

    fn args(&self) -> Vec<String> {
        let mut a =
            vec!["--config".to_string(), root().join("config/bigtable.toml").display().to_string()];
        for set in self.sets() {
            a.push("--set".into());
            a.push(set);
        }
        a
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(PERC);
        c.args(self.args()).args(args).env_remove("RUST_LOG");
        c
    }

    fn run(&self, args: &[&str]) -> String {
        ok(&common::finish(self.command(args), &format!("perc {}", args.join(" "))))
    }

    fn worker(&self) -> Proc {
        let mut child = self
            .command(&["worker"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a worker");
        first_line(&mut child, "worker ");
        Proc(child)
    }
}

/// Starts `perc oracle` on `listen` and returns it with the address it reports.
fn start_oracle(emulator: &Emulator, listen: &str) -> (Proc, String) {
    let (child, addr) = spawn_oracle(emulator, listen, Stdio::null());
    (Proc(child), addr)
}

/// Starts `perc oracle` on `listen`, its stderr to `stderr`; the address it reports.
fn spawn_oracle(emulator: &Emulator, listen: &str, stderr: Stdio) -> (Child, String) {
    let mut child = Command::new(PERC)
        .arg("--config")
        .arg(root().join("config/bigtable.toml"))
        .args(["--set", &format!("bigtable.emulator={}", emulator.addr())])
        .args(["oracle", "--listen", listen])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("start the oracle");
    let line = first_line(&mut child, "oracle listening on ");
    let addr = line.trim().rsplit(' ').next().unwrap().to_string();
    (child, addr)
}

#[test]
fn a_second_oracle_on_the_table_fences_the_first_and_no_timestamp_is_handed_out_twice() {
    use perc_oracle::{ClientConfig, Oracle, RemoteOracle};
    let emulator = Emulator::start().unwrap_or_else(|e| panic!("{e}"));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let oracle = |listen: &str| spawn_oracle(&emulator, listen, Stdio::piped());
    let client = |addr: &str| {
        let config = ClientConfig { reconnect_for_ms: 200, ..ClientConfig::default() };
        rt.block_on(RemoteOracle::connect(addr, config)).expect("connect to an oracle")
    };
    let (mut first, first_addr) = oracle("127.0.0.1:0");
    let from_first = client(&first_addr);
    let mut handed_out = Vec::new();
    for _ in 0..50 {
        handed_out.push(rt.block_on(from_first.next()).unwrap());
    }
    // A second oracle on the same table while the first still serves (a supervisor that took
    // a paused oracle for dead).
    let (mut second, second_addr) = oracle("127.0.0.1:0");
    let from_second = client(&second_addr);
    for _ in 0..50 {
        handed_out.push(rt.block_on(from_second.next()).unwrap());
    }
    // The first finds the newer mark (at its next check or reservation), stops answering and
    // exits with an error that says why; what it handed out before that is its own.
    let mut refused = None;
    for _ in 0..1_000_000 {
        match rt.block_on(from_first.next()) {
            Ok(ts) => handed_out.push(ts),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    assert!(refused.is_some(), "the superseded oracle kept handing out timestamps");
    let status = first.wait().unwrap();
    assert_eq!(status.code(), Some(1), "the superseded oracle exited with {status}");
    let mut stderr = String::new();
    std::io::Read::read_to_string(first.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("superseded"), "{stderr}");
    // The second goes on serving.
    for _ in 0..50 {
        handed_out.push(rt.block_on(from_second.next()).unwrap());
    }
    let n = handed_out.len();
    handed_out.sort();
    handed_out.dedup();
    assert_eq!(handed_out.len(), n, "a timestamp handed out twice");
    let _ = second.kill();
    let _ = second.wait();
}

/// Reads the child's first stdout line, which must start with `prefix`.
fn first_line(child: &mut Child, prefix: &str) -> String {
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    out.read_line(&mut line).expect("read the first line");
    assert!(line.starts_with(prefix), "expected {prefix:?}, got {line:?}");
    // Keep draining it.
    std::thread::spawn(move || for _ in out.lines() {});
    line
}

/// A generated site of `n` pages: links forward and back, a page every page links to,
/// duplicates, and links to missing pages.
fn write_site(dir: &Path, n: usize) {
    for i in 0..n {
        let mut body = format!("<html><head><title>Page {i}</title></head><body><p>page {i}</p>");
        if i % 7 == 3 {
            body = "<html><head><title>Twin</title></head><body><p>twin</p>".to_string();
        }
        for t in [0, (i + 1) % n, (i * 3 + 2) % n, (i * i) % n, n + i % 3] {
            body.push_str(&format!("<a href=\"/p{t}.html\">to {t}</a>\n"));
        }
        body.push_str("</body></html>");
        std::fs::write(dir.join(format!("p{i}.html")), body).unwrap();
    }
}

/// What an embedded crawl of a generated site left: its export, the WARC it recorded, and the
/// site, still served, with its seed list.
struct Embedded {
    export: String,
    warc: PathBuf,
    seeds: PathBuf,
    _site: (tokio::runtime::Runtime, site::Served),
}

/// Crawls a generated site embedded (sled), recording a WARC.
fn embedded_crawl(tmp: &Path) -> Embedded {
    let site_dir = tmp.join("site");
    std::fs::create_dir_all(&site_dir).unwrap();
    write_site(&site_dir, 60);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let served = rt.block_on(site::serve(&site_dir)).unwrap();
    let seeds = tmp.join("seeds.txt");
    std::fs::write(&seeds, format!("{}p0.html\n", served.base())).unwrap();
    let warc = tmp.join("crawl.warc.gz");
    let data = tmp.join("embedded");
    let embedded = |args: &[&str]| {
        ok(&Command::new(PERC)
            .arg("--config")
            .arg(root().join("config/test.toml"))
            .arg("--data")
            .arg(&data)
            .args(args)
            .env_remove("RUST_LOG")
            .output()
            .unwrap())
    };
    embedded(&["crawl", "--seeds", seeds.to_str().unwrap(), "--warc-out", warc.to_str().unwrap()]);
    let out = tmp.join("embedded.jsonl");
    embedded(&["export", "--out", out.to_str().unwrap()]);
    Embedded { export: std::fs::read_to_string(out).unwrap(), warc, seeds, _site: (rt, served) }
}

fn export(cluster: &Cluster, tmp: &Path) -> String {
    let out = tmp.join("distributed.jsonl");
    cluster.run(&["export", "--out", out.to_str().unwrap()]);
    std::fs::read_to_string(out).unwrap()
}

#[test]
fn three_workers_on_bigtable_replay_to_the_embedded_export() {
    let tmp = tempfile::tempdir().unwrap();
    let embedded = embedded_crawl(tmp.path());
    let expected = &embedded.export;
    assert!(expected.lines().count() > 40, "the site was crawled");
    let emulator = Emulator::start().unwrap_or_else(|e| panic!("{e}"));
    let (_oracle, oracle_addr) = start_oracle(&emulator, "127.0.0.1:0");

    // The committed fixture WARC (recorded by wget) gives the embedded run's export, which
    // tests/e2e.rs checks against the golden file.
    let fixture = Cluster { emulator, oracle_addr, table: "fixture" };
    let workers: Vec<Proc> = (0..3).map(|_| fixture.worker()).collect();
    let wget = root().join("fixtures/crawls/wget-demo.warc.gz");
    // The loader only loads and watches: the three workers do the work.
    fixture.run(&["--set", "workers.scanners=0", "replay", wget.to_str().unwrap()]);
    let golden = std::fs::read_to_string(root().join("fixtures/golden/wget-demo.jsonl")).unwrap();
    assert_eq!(export(&fixture, tmp.path()), golden);
    // While the workers run: they are listed, alive, with their scanners; the oracle with
    // its address and epoch; their counters as they saved them (every 200 ms here).
    let pages = golden.lines().count();
    let status = (0..100)
        .map(|_| fixture.run(&["status"]))
        .find(|s| observer_commits(s, "parse") >= pages)
        .expect("the workers' counters reach the store while they run");
    assert!(status.contains("processes on this store (3 alive):"), "{status}");
    assert_eq!(status.matches(" alive ").count(), 3, "{status}");
    assert_eq!(status.matches("2 scanner(s)").count(), 3, "{status}");
    // Each named by what it is: `perc worker`.
    let kind = |l: &str| l.split_whitespace().nth(1).map(str::to_owned);
    let named =
        status.lines().filter(|l| l.contains(" alive ") && kind(l).as_deref() == Some("worker"));
    assert_eq!(named.count(), 3, "{status}");
    // (The oracle keeps its mark in its own table, "perc", not in this one.)
    let oracle = format!("oracle:                        {}, epoch ", fixture.oracle_addr);
    assert!(status.contains(&oracle), "{status}");
    assert!(status.contains("pending notifications:         0"), "{status}");
    assert!(!status.contains("open locks"), "{status}");
    drop(workers);

    // A bigger crawl's WARC, on a table of its own.
    let cluster = Cluster { table: "crawl", ..fixture };
    let _workers: Vec<Proc> = (0..3).map(|_| cluster.worker()).collect();
    let warc = embedded.warc.to_str().unwrap();
    let out = cluster.run(&["--set", "workers.scanners=0", "replay", warc]);
    assert!(out.contains("pages indexed"), "{out}");
    assert_eq!(&export(&cluster, tmp.path()), expected);
    let canonical = cluster.run(&["canonical", &first_url(expected)]);
    assert!(canonical.starts_with("http://127.0.0.1:"), "{canonical}");
    // Crawling the same site live through Bigtable changes nothing. The crawling process
    // only watches: its summary counts what the workers fetched for it. `wait` then finds
    // nothing pending.
    let seeds = embedded.seeds.to_str().unwrap();
    let crawled = cluster.run(&["--set", "workers.scanners=0", "crawl", "--seeds", seeds]);
    let tried: usize = crawled
        .split(" URLs tried this run")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a crawl summary: {crawled}"));
    assert!(tried >= expected.lines().count(), "{crawled}");
    cluster.run(&["wait"]);
    assert_eq!(&export(&cluster, tmp.path()), expected);
    let status = cluster.run(&["status"]);
    assert!(status.contains("pending notifications:         0"), "{status}");
}

#[test]
fn a_killed_worker_and_a_restarted_oracle_leave_the_export_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let embedded = embedded_crawl(tmp.path());
    let (expected, warc) = (&embedded.export, &embedded.warc);
    let emulator = Emulator::start().unwrap_or_else(|e| panic!("{e}"));
    let (oracle, oracle_addr) = start_oracle(&emulator, "127.0.0.1:0");
    let cluster = Cluster { emulator, oracle_addr: oracle_addr.clone(), table: "crawl" };
    // One worker that logs each run, so the test can kill it in the middle of the work.
    let mut doomed = cluster
        .command(&["worker"])
        .env("RUST_LOG", "perc_notify=debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let runs = BufReader::new(doomed.stderr.take().unwrap());
    let loader = Proc(
        cluster
            .command(&["--set", "workers.scanners=0", "replay", warc.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut seen = 0;
    for line in runs.lines() {
        if line.unwrap().contains("observer ran") {
            seen += 1;
            if seen == 40 {
                break;
            }
        }
    }
    assert_eq!(seen, 40, "the first worker ran observers before it was killed");
    doomed.kill().unwrap(); // SIGKILL: no cleanup, locks and leases left behind.
    doomed.wait().unwrap();
    // The oracle dies too and comes back on the same port: clients reconnect.
    drop(oracle);
    let (_oracle, again) = start_oracle(&cluster.emulator, &oracle_addr);
    assert_eq!(again, oracle_addr);
    let _workers: Vec<Proc> = (0..2).map(|_| cluster.worker()).collect();
    let mut loader = loader;
    let out = finish(&mut loader.0);
    assert!(out.contains("pages indexed"), "{out}");
    assert_eq!(&export(&cluster, tmp.path()), expected);
}

/// Waits for the loader; its stdout, or a failure with its stderr.
fn finish(child: &mut Child) -> String {
    use std::io::Read;
    let (mut stdout, mut stderr) = (String::new(), String::new());
    child.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "the loader failed: {stderr}\n{stdout}");
    stdout
}

fn first_url(export: &str) -> String {
    export
        .lines()
        .next()
        .unwrap()
        .split("\"url\":\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string()
}

/// A port nobody listens on now (the kernel's pick, released at once).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The shell block that follows the "recipe" marker in docs/deployment.md.
fn deployment_recipe() -> String {
    let doc = std::fs::read_to_string(root().join("docs/deployment.md")).unwrap();
    let marked = doc.split("<!-- recipe:").nth(1).expect("docs/deployment.md marks its recipe");
    let block = marked.split("```sh\n").nth(1).expect("a sh block follows the marker");
    block.split("\n```").next().unwrap().to_string()
}

#[test]
fn the_deployment_recipe_runs_as_written_from_any_directory() {
    use std::os::unix::process::CommandExt;
    let recipe = deployment_recipe();
    assert!(recipe.contains("perc worker"), "{recipe}");
    let tmp = tempfile::tempdir().unwrap();
    let bin = Path::new(PERC).parent().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut shell = Command::new("bash");
    shell
        .args(["-euo", "pipefail", "-c", &recipe])
        .current_dir(tmp.path())
        .env("PATH", path)
        .env("EMU_PORT", free_port().to_string())
        .env("ORACLE_PORT", free_port().to_string())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    for (k, _) in
        std::env::vars().filter(|(k, _)| k.starts_with("PERC_") && k != "PERC_CBTEMULATOR")
    {
        shell.env_remove(k);
    }
    let child = shell.spawn().expect("bash");
    // Whatever happens, the recipe's process group (emulator, oracle, workers) ends: after
    // its run, or when the run takes far longer than it should.
    let group = child.id();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(std::time::Duration::from_secs(240)).is_err() {
            // `--`: a negative pid after it is a process group, never an option.
            let group = format!("-{group}");
            let _ = Command::new("kill").args(["-s", "KILL", "--", &group]).status();
        }
    });
    let out = child.wait_with_output().unwrap();
    let _ = done.send(());
    watchdog.join().unwrap();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the recipe failed: {stderr}\n{stdout}");
    assert!(stdout.contains("pages indexed"), "{stdout}");
    assert!(stdout.contains("pending notifications:         0"), "{stdout}");
    // The status the recipe printed names the three workers and the oracle with its epoch.
    assert!(stdout.contains("processes on this store (3 alive):"), "{stdout}");
    assert!(stdout.contains(", epoch 1, "), "{stdout}");
    // The same WARC replayed embedded gives the same export.
    let data = tmp.path().join("embedded");
    let warc = tmp.path().join("demo.warc.gz");
    let embedded = tmp.path().join("embedded.jsonl");
    for args in [
        vec!["replay", warc.to_str().unwrap()],
        vec!["export", "--out", embedded.to_str().unwrap()],
    ] {
        let mut run = Command::new(PERC);
        run.arg("--data").arg(&data).args(args).env_remove("RUST_LOG");
        ok(&run.output().unwrap());
    }
    let got = std::fs::read_to_string(tmp.path().join("index.jsonl")).unwrap();
    assert!(got.lines().count() > 80, "{got}");
    assert_eq!(got, std::fs::read_to_string(embedded).unwrap());
}

#[test]
fn a_loader_killed_in_its_first_commit_is_rerun_at_once_and_finishes_in_one_run() {
    let tmp = tempfile::tempdir().unwrap();
    let (cluster, _oracle) = Cluster::start("loader");
    let _worker = cluster.worker();
    let wget = root().join("fixtures/crawls/wget-demo.warc.gz");
    let replay = ["--set", "workers.scanners=0", "replay", wget.to_str().unwrap()];
    // The loader logs each commit's prewrite: it is killed right after its first one, with
    // its locks in the table and its liveness fresh.
    let mut doomed = cluster
        .command(&replay)
        .env("RUST_LOG", "perc_txn=debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = BufReader::new(doomed.stderr.take().unwrap()).lines();
    assert!(
        log.any(|l| l.unwrap().contains("prewritten; committing")),
        "the loader reached its first commit"
    );
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    // Rerun at once: it waits out the dead loader's locks, says so, and finishes.
    let rerun = cluster.command(&replay).output().unwrap();
    let stderr = String::from_utf8_lossy(&rerun.stderr);
    assert!(rerun.status.success(), "the rerun failed ({}): {stderr}", rerun.status);
    let golden = std::fs::read_to_string(root().join("fixtures/golden/wget-demo.jsonl")).unwrap();
    assert_eq!(export(&cluster, tmp.path()), golden);
    let status = cluster.run(&["status"]);
    assert!(status.contains("pending notifications:         0"), "{status}");
}

#[test]
fn a_loader_that_died_mid_commit_leaves_locks_the_rerun_waits_out_saying_so() {
    use perc_pipeline::{config, Create, Fetching, Pipeline};
    let tmp = tempfile::tempdir().unwrap();
    let (cluster, _oracle) = Cluster::start("dead-loader");
    let _worker = cluster.worker();
    let wget = root().join("fixtures/crawls/wget-demo.warc.gz");
    let liveness = ["--set", "txn.liveness_ttl_ms=3000"];
    // A loader dies between its prewrite and its commit point: its locks on the rows of the
    // WARC's first responses stay, and its heartbeat is fresh for 3 s more.
    let sets = [cluster.sets(), vec![liveness[1].to_string()]].concat();
    let config = config::load(Some(&root().join("config/bigtable.toml")), &[], &sets).unwrap();
    let mut urls = Vec::new();
    perc_crawl::warc::read_each(&wget, 1 << 20, |r| urls.push(r.url.to_string())).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let dead = Pipeline::open(config, Fetching::Offline, Create::IfMissing).await.unwrap();
        let mut t = dead.client().begin().await.unwrap();
        for url in &urls[..10] {
            let row = perc_observers::model::page(url);
            let raw = bytes::Bytes::from_static(perc_observers::model::col::RAW);
            t.set(row, raw, b"half-loaded".to_vec());
        }
        let crashed = t.commit_crashing_at(perc_txn::CommitStep::AfterPrewriteAll).await.unwrap();
        assert!(matches!(crashed, perc_txn::Crashed::BeforeCommitPoint));
        std::mem::forget(dead); // no deregistration: it died
    });
    drop(rt);
    // Not a quiet, empty store: status shows the dead loader's locks.
    let status = cluster.run(&[&liveness[..], &["status"][..]].concat());
    assert!(status.contains("open locks:                    10 "), "{status}");
    let replay = ["--set", "workers.scanners=0", "replay", wget.to_str().unwrap()];
    let rerun = cluster.command(&[&liveness[..], &replay[..]].concat()).output().unwrap();
    let stderr = String::from_utf8_lossy(&rerun.stderr);
    assert!(rerun.status.success(), "the rerun failed ({}): {stderr}", rerun.status);
    assert!(
        stderr.contains("waiting: lock conflict"),
        "the rerun says what it waits for: {stderr}"
    );
    let golden = std::fs::read_to_string(root().join("fixtures/golden/wget-demo.jsonl")).unwrap();
    assert_eq!(export(&cluster, tmp.path()), golden);
}

#[test]
fn an_unreachable_table_is_waited_for_saying_so_then_exits_3() {
    let addr = format!("127.0.0.1:{}", free_port());
    let out = Command::new(PERC)
        .arg("--config")
        .arg(root().join("config/bigtable.toml"))
        .args(["--set", &format!("bigtable.emulator={addr}")])
        .args(["--set", "bigtable.connect_for_ms=300"])
        .args(["oracle", "--listen", "127.0.0.1:0"])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains(&format!("waiting for the Bigtable emulator at {addr}")), "{stderr}");
    assert!(stderr.contains("bigtable.connect_for_ms"), "{stderr}");
    assert!(stderr.contains("run the same command again"), "{stderr}");
}

#[test]
fn a_loader_with_no_live_worker_says_so_and_finishes_once_one_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let (cluster, _oracle) = Cluster::start("nobody");
    let wget = root().join("fixtures/crawls/wget-demo.warc.gz");
    let mut loader = Proc(
        cluster
            .command(&["--set", "workers.scanners=0", "replay", wget.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut log = BufReader::new(loader.0.stderr.take().unwrap()).lines();
    let said = log.by_ref().map(Result::unwrap).find(|l| l.contains("no worker is alive"));
    let said = said.expect("the loader says that nobody works");
    assert!(said.contains("perc --config FILE worker"), "it says how to start one: {said}");
    // The worker logs at info, without RUST_LOG: its rate, backlog and takeovers every
    // workers.report_ms; plain text, since its stderr is no terminal.
    let mut worker = cluster.command(&["worker"]);
    worker.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut worker = Proc(worker.spawn().unwrap());
    first_line(&mut worker.0, "worker ");
    let rest: Vec<String> = log.map(Result::unwrap).collect();
    let status = loader.0.wait().unwrap();
    assert!(status.success(), "the loader failed: {rest:?}");
    let worker_log = BufReader::new(worker.0.stderr.take().unwrap()).lines();
    let report = worker_log.map(Result::unwrap).find(|l| l.contains("runs/s")).unwrap();
    assert!(report.contains("INFO") && report.contains("notifications pending"), "{report}");
    assert!(report.contains("leases taken over"), "{report}");
    assert!(!report.contains('\x1b') && !said.contains('\x1b'), "no colours off a terminal");
    let golden = std::fs::read_to_string(root().join("fixtures/golden/wget-demo.jsonl")).unwrap();
    assert_eq!(export(&cluster, tmp.path()), golden);
}

/// The commits of `observer` in a `perc status` table.
fn observer_commits(status: &str, observer: &str) -> usize {
    status
        .lines()
        .find(|l| l.split_whitespace().next() == Some(observer))
        .and_then(|l| l.split_whitespace().nth(2))
        .map_or(0, |n| n.parse().unwrap())
}

/// `perc serve` on Bigtable beside a `perc worker`: the two share the table's work, the
/// server answers while they crawl, and the export through its API is the embedded crawl's.
#[test]
fn perc_serve_and_a_worker_on_bigtable_crawl_to_the_embedded_export() {
    let tmp = tempfile::tempdir().unwrap();
    let embedded = embedded_crawl(tmp.path());
    let (cluster, _oracle) = Cluster::start("serve");
    let _worker = cluster.worker();
    let data = tmp.path().join("serving");
    let mut child = cluster
        .command(&["--data", data.to_str().unwrap(), "--set", "serve.token=secret"])
        .args(["serve", "--listen", "127.0.0.1:0", "--seeds", embedded.seeds.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start perc serve");
    let line = first_line(&mut child, "perc serve: listening on ");
    let base = line.trim().rsplit(' ').next().unwrap().to_string();
    let server = Proc(child);
    let http = reqwest::blocking::Client::new();
    let get = |path: &str| http.get(format!("{base}{path}")).send().unwrap().text().unwrap();
    let pages = embedded.export.lines().count() as u64;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let status: serde_json::Value = serde_json::from_str(&get("/v1/status")).unwrap();
        if status["pages"].as_u64() == Some(pages)
            && status["pending"] == 0
            && status["waiting"] == 0
        {
            // The worker did part of the work.
            assert!(status["workers"].as_u64() >= Some(1), "{status}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "two minutes and not crawled: {status}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // The ranks, kept as pages come, within their bound of the settled crawl's.
    common::assert_same_export(&get("/v1/export"), &embedded.export, "serve on Bigtable");
    let page = first_url(&embedded.export);
    let canonical: serde_json::Value =
        serde_json::from_str(&get(&format!("/v1/canonical?url={page}"))).unwrap();
    assert!(canonical["canonical"].is_string(), "{canonical}");
    let stopped = Command::new("kill").args(["-TERM", &server.0.id().to_string()]).status();
    assert!(stopped.unwrap().success());
    let mut server = server;
    assert_eq!(server.0.wait().unwrap().code(), Some(0));
}
