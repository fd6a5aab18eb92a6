//! `perc serve` under load, with the perc binary beside this one in processes
//! of their own, as a user runs them: the API's latency with 64 concurrent clients asking
//! `canonical` and `search` on loopback while a synthetic site is crawled, the crawl's rate
//! with and without those clients, and freshness: how long after a page of the demo site
//! changes the API shows it, with a 1-second minimum revisit interval; and status pages
//! polling a server whose store holds 20,000 pages.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::table::{scaled, Table};

/// The API's clients during the loaded crawls.
const CLIENTS: usize = 64;

/// Each client's pace in the paced crawl: a request every this often (64 clients: 1,600
/// requests a second), as clients with something to do between their questions.
const PACE: Duration = Duration::from_millis(40);

/// Changes of the demo site timed for freshness.
const CHANGES: usize = 20;

pub fn run(scale: f64) -> Result<()> {
    let perc = perc_binary()?;
    let pages = scaled(3000, scale) as usize;
    let tmp = tempfile::tempdir()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let synth = SynthSite::serve(&rt, &tmp.path().join("site"), pages)?;
    let urls = &synth.urls;

    let at = |name: &str| tmp.path().join(name);
    let quiet = rt.block_on(crawl(&perc, &at("quiet"), urls, 0, None, None))?;
    let want = Some(quiet.pages);
    let loaded = rt.block_on(crawl(&perc, &at("loaded"), urls, CLIENTS, None, want))?;
    let paced = rt.block_on(crawl(&perc, &at("paced"), urls, CLIENTS, Some(PACE), want))?;
    let fresh = rt.block_on(freshness(&perc, tmp.path()))?;
    let polled = rt.block_on(status_polling(&perc, tmp.path(), scaled(20_000, scale)))?;

    let mut t = Table::new();
    t.add("synthetic site", format!("{pages} pages"), "perc-synth, seed 11, served on loopback");
    let rate = |c: &Crawled| format!("{:.0} pages/s", c.pages as f64 / c.secs);
    t.add(
        "crawl, no API load",
        rate(&quiet),
        format!("{} pages in {:.1} s", quiet.pages, quiet.secs),
    );
    for (how, c) in [("as fast as they can", &loaded), ("each every 40 ms", &paced)] {
        t.add(
            format!("crawl, {CLIENTS} API clients {how}"),
            rate(c),
            format!(
                "{} pages in {:.1} s; ratio to no load {:.2}",
                c.pages,
                c.secs,
                quiet.secs / c.secs
            ),
        );
        for (name, goal, lat) in [("canonical", 10.0, &c.canonical), ("search", 50.0, &c.search)] {
            t.add(
                format!("GET /v1/{name}, {CLIENTS} clients {how}, during the crawl"),
                format!("p50 {:.2} ms, p99 {:.2} ms", pct(lat, 50.0), pct(lat, 99.0)),
                format!(
                    "{} answers, {:.0}/s; goal p99 ≤ {goal} ms",
                    lat.len(),
                    lat.len() as f64 / c.secs
                ),
            );
        }
    }
    for (name, lat) in
        [("/v1/page shows the change", &fresh.page), ("/v1/search finds it", &fresh.search)]
    {
        t.add(
            format!("freshness: {name}"),
            format!("p50 {:.2} s, max {:.2} s", pct(lat, 50.0), pct(lat, 100.0)),
            format!("{CHANGES} changes of the demo site; recrawl 1-2 s; goal p50 ≤ 2 s"),
        );
    }
    t.add(
        format!("one GET /v1/status, {} pages", polled.pages),
        format!("{:.2} s", polled.first),
        "a store of a replayed perc-synth web (seed 11), search off; the read scans every page row",
    );
    t.add(
        format!("GET /v1/status, {POLLERS} pollers each every 2 s for {POLL_SECS} s"),
        format!(
            "p50 {:.2} s, max {:.2} s",
            pct(&polled.answers, 50.0),
            pct(&polled.answers, 100.0)
        ),
        format!(
            "{} answers, {} failed; the server used {:.2} cores (as {POLLERS} open status pages)",
            polled.answers.len(),
            polled.failed,
            polled.cores
        ),
    );
    t.print("perc serve: API latency under load, crawl rate, freshness, status polling");
    Ok(())
}

/// Status pages open on one server: each asks `/v1/status` every 2 s.
const POLLERS: usize = 4;
/// For this long.
const POLL_SECS: u64 = 30;

struct Polled {
    pages: u64,
    first: f64,
    answers: Vec<f64>,
    failed: usize,
    cores: f64,
}

/// Replays `pages` pages of a synthetic web into a store, serves it (search off: no
/// indexing besides), times one `/v1/status`, then [`POLLERS`] clients each asking every
/// 2 s, and the server's CPU meanwhile.
async fn status_polling(perc: &Path, tmp: &Path, pages: u64) -> Result<Polled> {
    let warc = tmp.join("polled.warc.gz");
    let data = tmp.join("polled");
    let ok = run_quiet;
    let n = pages.to_string();
    ok(Command::new(perc).args(["generate", "--pages", &n, "--seed", "11", "--warc"]).arg(&warc))?;
    ok(Command::new(perc).arg("--data").arg(&data).arg("replay").arg(&warc))?;
    let served = Served::start(perc, &data, &["search.enabled=false"], None)?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(600)).build()?;
    let t = Instant::now();
    status(&http, &served.base).await?;
    let first = t.elapsed().as_secs_f64();
    let cpu = || crate::distributed::cpu_seconds(served.pid());
    let (cpu_before, start) = (cpu(), Instant::now());
    let until = start + Duration::from_secs(POLL_SECS);
    let polls = (0..POLLERS).map(|_| {
        let (http, base) = (http.clone(), served.base.clone());
        async move {
            let (mut answers, mut failed) = (Vec::new(), 0);
            while Instant::now() < until {
                let t = Instant::now();
                match status(&http, &base).await {
                    Ok(_) => answers.push(t.elapsed().as_secs_f64()),
                    Err(_) => failed += 1,
                }
                tokio::time::sleep(Duration::from_secs(2).saturating_sub(t.elapsed())).await;
            }
            (answers, failed)
        }
    });
    let done = futures::future::join_all(polls).await;
    let cores = (cpu() - cpu_before) / start.elapsed().as_secs_f64();
    let failed = done.iter().map(|(_, f)| f).sum();
    let answers = done.into_iter().flat_map(|(a, _)| a).collect();
    Ok(Polled { pages, first, answers, failed, cores })
}

/// A perc-synth web (seed 11) of `pages` pages written as a site into `dir` and served on
/// loopback, with the URL of every page.
pub(crate) struct SynthSite {
    pub(crate) web: perc_synth::Web,
    pub(crate) site: perc_synth::site::Served,
    pub(crate) urls: Vec<String>,
}

impl SynthSite {
    pub(crate) fn serve(rt: &tokio::runtime::Runtime, dir: &Path, pages: usize) -> Result<Self> {
        let web = perc_synth::Web::new(perc_synth::Spec::new(pages, 11));
        perc_synth::write::site(&web, dir)?;
        let site = rt.block_on(perc_synth::site::serve(dir))?;
        let base = site.base();
        let urls = (0..pages)
            .map(|i| base.join(&perc_synth::Web::path(i)).map(String::from))
            .collect::<Result<_, _>>()?;
        Ok(SynthSite { web, site, urls })
    }
}

/// Runs a command to its end, its output dropped; its stderr in the error if it fails.
pub(crate) fn run_quiet(c: &mut Command) -> Result<()> {
    let out = c.stdout(Stdio::null()).output()?;
    if !out.status.success() {
        bail!("{c:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// The perc binary beside this one (`make bench` builds both).
pub(crate) fn perc_binary() -> Result<PathBuf> {
    let me = std::env::current_exe()?;
    let perc = me.with_file_name("perc");
    if !perc.exists() {
        bail!("{} is missing: build it first (cargo build --release -p perc-cli)", perc.display());
    }
    Ok(perc)
}

/// A `perc serve` child, stopped with SIGTERM when dropped.
pub(crate) struct Served {
    child: Child,
    pub(crate) base: String,
}

impl Served {
    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn start(
        perc: &Path,
        data: &Path,
        sets: &[&str],
        seeds: Option<&Path>,
    ) -> Result<Served> {
        let mut c = Command::new(perc);
        c.arg("--data").arg(data);
        for s in sets {
            c.args(["--set", s]);
        }
        c.args(["serve", "--listen", "127.0.0.1:0"]);
        if let Some(s) = seeds {
            c.arg("--seeds").arg(s);
        }
        let mut child = c.stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
        let base = line
            .trim()
            .strip_prefix("perc serve: listening on ")
            .ok_or_else(|| anyhow!("perc serve said {line:?}"))?
            .to_string();
        Ok(Served { child, base })
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

pub(crate) async fn status(http: &reqwest::Client, base: &str) -> Result<serde_json::Value> {
    Ok(http.get(format!("{base}/v1/status")).send().await?.error_for_status()?.json().await?)
}

struct Crawled {
    pages: u64,
    secs: f64,
    canonical: Vec<f64>,
    search: Vec<f64>,
}

/// Crawls the site from its first page under `perc serve` on a new store at `data`, with
/// `clients` API clients asking all the while (each as fast as it can, or once a `pace`);
/// done when nothing waits or is pending, two looks in a row, and (if given) `want` pages
/// are indexed.
async fn crawl(
    perc: &Path,
    data: &Path,
    urls: &[String],
    clients: usize,
    pace: Option<Duration>,
    want: Option<u64>,
) -> Result<Crawled> {
    std::fs::create_dir_all(data)?;
    let seeds = data.with_extension("seeds");
    std::fs::write(&seeds, format!("{}\n", urls[0]))?;
    let started = Instant::now();
    let server = Served::start(perc, data, &["crawl.sitemaps=false"], Some(&seeds))?;
    let http = reqwest::Client::builder().pool_max_idle_per_host(CLIENTS).build()?;
    let done = Arc::new(AtomicBool::new(false));
    let latencies = Arc::new(Mutex::new((Vec::new(), Vec::new())));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (http, api, done, latencies) =
            (http.clone(), server.base.clone(), done.clone(), latencies.clone());
        let urls = urls.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(c as u64);
            let (mut canonical, mut search) = (Vec::new(), Vec::new());
            let mut ticks = pace.map(|p| {
                let mut i = tokio::time::interval(p);
                i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                i
            });
            // A connection first, untimed: the loop times answers, not TCP handshakes.
            let _ =
                http.get(format!("{api}/v1/canonical")).query(&[("url", &urls[0])]).send().await;
            while !done.load(Ordering::Relaxed) {
                if let Some(t) = ticks.as_mut() {
                    t.tick().await;
                }
                let asked = Instant::now();
                let is_search = rng.random_bool(0.5);
                let r = if is_search {
                    let w = perc_synth::WORDS;
                    let q = format!(
                        "{} {}",
                        w[rng.random_range(0..w.len())],
                        w[rng.random_range(0..w.len())]
                    );
                    http.get(format!("{api}/v1/search"))
                        .query(&[("q", q.as_str()), ("limit", "10")])
                        .send()
                        .await
                } else {
                    let u = &urls[rng.random_range(0..urls.len())];
                    http.get(format!("{api}/v1/canonical"))
                        .query(&[("url", u.as_str())])
                        .send()
                        .await
                };
                let ok = match r {
                    Ok(r) => matches!(r.status().as_u16(), 200 | 404) && r.bytes().await.is_ok(),
                    Err(_) => false,
                };
                let ms = asked.elapsed().as_secs_f64() * 1000.0;
                if ok {
                    if is_search {
                        search.push(ms)
                    } else {
                        canonical.push(ms)
                    }
                }
            }
            let mut all = latencies.lock().unwrap();
            all.0.extend(canonical);
            all.1.extend(search);
        }));
    }
    let deadline = started + Duration::from_secs(1800);
    let mut idle_looks = 0;
    let pages = loop {
        // As often as the status page asks.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let s = status(&http, &server.base).await?;
        let pages = s["pages"].as_u64().unwrap_or(0);
        let idle = s["fetched"].as_u64() > Some(1) && s["waiting"] == 0 && s["pending"] == 0;
        idle_looks = if idle && want.is_none_or(|w| pages >= w) { idle_looks + 1 } else { 0 };
        if idle_looks == 2 {
            break pages;
        }
        if Instant::now() > deadline {
            bail!("the crawl of {} did not end in 30 minutes: {s}", urls[0]);
        }
    };
    let secs = started.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await?;
    }
    drop(server);
    let (canonical, search) = std::mem::take(&mut *latencies.lock().unwrap());
    Ok(Crawled { pages, secs, canonical, search })
}

struct Fresh {
    page: Vec<f64>,
    search: Vec<f64>,
}

/// The demo site served from a copy, crawled under `perc serve` with 1-2 s recrawl
/// intervals; then [`CHANGES`] times: a page gets a new word, and the time until
/// `/v1/page` shows its new content hash and `/v1/search` finds the word.
async fn freshness(perc: &Path, tmp: &Path) -> Result<Fresh> {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/sites/demo");
    let dir = tmp.join("demo");
    copy_dir(&demo, &dir)?;
    let site = perc_synth::site::serve(&dir).await?;
    let data = tmp.join("fresh");
    std::fs::create_dir_all(&data)?;
    let seeds = tmp.join("fresh.seeds");
    std::fs::write(&seeds, format!("{}\n", site.base()))?;
    let sets = [
        "recrawl.interval_s=1",
        "recrawl.min_interval_s=1",
        "recrawl.max_interval_s=2",
        "recrawl.tick_ms=100",
    ];
    let server = Served::start(perc, &data, &sets, Some(&seeds))?;
    let http = reqwest::Client::new();
    loop {
        let s = status(&http, &server.base).await?;
        if s["pages"].as_u64() >= Some(17) && s["pending"] == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let page = site.base().join("about.html")?.to_string();
    let file = dir.join("about.html");
    let original = std::fs::read_to_string(&file)?;
    let hash = |v: &serde_json::Value| v["content_hash"].as_str().unwrap_or("").to_string();
    let get_page = || async {
        let r = http
            .get(format!("{}/v1/page", server.base))
            .query(&[("url", page.as_str())])
            .send()
            .await?;
        Ok::<serde_json::Value, anyhow::Error>(r.json().await?)
    };
    let mut fresh = Fresh { page: Vec::new(), search: Vec::new() };
    for k in 0..CHANGES {
        let before = hash(&get_page().await?);
        let word = format!("freshness{k}x");
        std::fs::write(&file, original.replace("</body>", &format!("<p>{word}</p></body>")))
            .context("changing the page")?;
        let changed = Instant::now();
        let (mut seen_page, mut seen_search) = (None, None);
        while seen_page.is_none() || seen_search.is_none() {
            if changed.elapsed() > Duration::from_secs(60) {
                bail!("change {k} not visible in a minute");
            }
            if seen_page.is_none() && hash(&get_page().await?) != before {
                seen_page = Some(changed.elapsed().as_secs_f64());
            }
            if seen_search.is_none() {
                let r = http
                    .get(format!("{}/v1/search", server.base))
                    .query(&[("q", word.as_str())])
                    .send()
                    .await?;
                let v: serde_json::Value = r.json().await?;
                if v["hits"].as_array().is_some_and(|h| !h.is_empty()) {
                    seen_search = Some(changed.elapsed().as_secs_f64());
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        fresh.page.extend(seen_page);
        fresh.search.extend(seen_search);
    }
    drop(server);
    Ok(fresh)
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// The `p`th percentile of `v` (nearest rank), 0 for none.
fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}
