//! The data path's figures, per WARC: `perc replay` through the front door against
//! a bare loop over the same records in the same run (read, parse, blake3, every link
//! resolved, on two threads), with store calls and transactions per indexed page, store bytes
//! per input byte after a garbage collection (by sled tree and by column group), and peak
//! RSS. Each WARC runs in a child process of its own (`perc-bench datapath-one`), so that its
//! peak RSS is its own. Without `--warc`, two perc-synth webs: 5000 pages, and 1000
//! link-heavy pages (300-400 links each, like API documentation); and a real web, the Rust
//! standard library's documentation (rustup's `rust-docs`) served by perc's static site
//! server on 127.0.0.1 and recorded by `wget --warc-file`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use perc_crawl::warc::Recorded;
use perc_pipeline::Pipeline;
use perc_store::{Counted, SledStore, Store};
use perc_synth::{Spec, Web};
use tokio_util::sync::CancellationToken;

use crate::table::{in_a_child, rate, scaled, Table};

/// One WARC's figures, as the child prints them (one JSON line).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Figures {
    pub(crate) warc: String,
    records: usize,
    /// Response body bytes loaded (uncompressed).
    pub(crate) body_bytes: u64,
    pages: usize,
    links: usize,
    pub(crate) bare_s: f64,
    /// The bare loop with what parse does besides: the simhash of each page's text (spec
    /// §6.4a), its main text and language (`perc_crawl::text`).
    #[serde(default)]
    bare_simhash_s: f64,
    pub(crate) replay_s: f64,
    calls_per_page: f64,
    /// The calls by kind, per indexed page: conditional mutations, batched mutations, reads
    /// (single and batched), scans; and the rows the batched calls touched.
    call_kinds: [f64; 5],
    /// Observer transactions (commits) per indexed page.
    txns_per_page: f64,
    /// Per observer: (name, commits per indexed page).
    runs: Vec<(String, f64)>,
    /// Per observer: (name, runs per indexed page, idle runs per page, mean committed run µs).
    #[serde(default)]
    observers: Vec<(String, f64, f64, u64)>,
    pub(crate) disk_bytes: u64,
    live_bytes: u64,
    /// The store's files after `perc compact`'s rewrite, and the seconds it took.
    #[serde(default)]
    compacted_bytes: u64,
    #[serde(default)]
    compact_s: f64,
    /// `perc export`'s read of the store after the replay, each line serialized (s).
    #[serde(default)]
    export_s: f64,
    /// `perc export --links`'s (s), and the edges it wrote.
    #[serde(default)]
    links_s: f64,
    #[serde(default)]
    edges: usize,
    /// On the std docs: the first hit of a search for each of [`TYPE_QUERIES`], and the
    /// seconds the search index took to build.
    #[serde(default)]
    first_hits: Vec<(String, String)>,
    #[serde(default)]
    search_build_s: f64,
    trees: Vec<(String, u64)>,
    /// The largest column groups of the rows tree: (family/group, bytes of values).
    columns: Vec<(String, u64)>,
    rss_kb: u64,
    /// `store.zstd_level` of the run (0: sled's log not compressed).
    #[serde(default)]
    pub(crate) zstd_level: i64,
    /// The row writes given to sled during the replay and the collection pass after it, by
    /// kind of row (`p:`, `e:`, ...): (kind, writes a page, bytes a page), most bytes first.
    #[serde(default)]
    written: Vec<(String, f64, f64)>,
    /// The rows the store keeps after the collection, by kind of row: (kind, rows a page),
    /// most first.
    #[serde(default)]
    live_rows: Vec<(String, f64)>,
}

/// The work a page needs with no store: parse, hash, resolve every link; its links.
pub(crate) fn bare_work(r: &Recorded) -> usize {
    bare_page(r, false)
}

/// [`bare_work`], with the simhash of the page's text when `simhash`.
fn bare_page(r: &Recorded, simhash: bool) -> usize {
    if r.response.status != 200 {
        return 0;
    }
    let body = &r.response.body;
    let charset = r.response.charset.as_deref();
    let parsed = if simhash {
        perc_crawl::parse_for_index(&r.url, body, charset)
    } else {
        perc_crawl::parse(&r.url, body, charset)
    };
    std::hint::black_box(perc_crawl::content_hash(body));
    std::hint::black_box(parsed.simhash);
    parsed.links.len()
}

/// [`bare_work`] (with the simhash when `simhash`) on every record, on two threads.
fn bare(records: &[Recorded], simhash: bool) -> (usize, f64) {
    let start = Instant::now();
    let next = Mutex::new(records.iter());
    let links = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let Some(r) = next.lock().expect("not poisoned").next() else { break };
                links.fetch_add(bare_page(r, simhash), std::sync::atomic::Ordering::Relaxed);
            });
        }
    });
    (links.into_inner(), start.elapsed().as_secs_f64())
}

/// Queries for the names of the std library's types: each should find the type's own page
/// first (`std/collections/struct.HashMap.html` for `HashMap`).
const TYPE_QUERIES: [&str; 6] = ["HashMap", "Vec", "Option", "String", "Arc", "BTreeMap"];

/// The child: one WARC, start to end.
pub fn one(warc: &Path) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let f = rt.block_on(measure(warc))?;
    println!("{}", serde_json::to_string(&f)?);
    Ok(())
}

async fn measure(warc: &Path) -> Result<Figures> {
    // The defaults, or what `PERC_<SECTION>_<KEY>` variables set (to measure a setting).
    let env: Vec<(String, String)> = std::env::vars().collect();
    let config = perc_pipeline::config::load(None, &env, &[])?;
    // The bare loop reads the records into memory first (reading is timed in neither).
    let (records, issues) = perc_crawl::warc::read(warc, config.crawl.body_bytes_max)?;
    if !issues.is_empty() {
        bail!("{}: {} unreadable records", warc.display(), issues.len());
    }
    let body_bytes: u64 = records.iter().map(|r| r.response.body.len() as u64).sum();
    let (links, bare_s) = bare(&records, false);
    let (_, bare_simhash_s) = bare(&records, true);
    drop(records);

    let dir = tempfile::tempdir()?;
    let mut config = config;
    config.store.data = dir.path().display().to_string();
    let zstd_level = config.store.zstd_level;
    let options = perc_pipeline::sled_options(&config.store);
    let sled = Arc::new(SledStore::open(dir.path(), perc_notify::schema(), &options)?);
    let store = Arc::new(Counted::new(sled.clone() as Arc<dyn Store>));
    let pipeline = Pipeline::builder(config).store(store.clone()).open().await?;
    let before = store.counts();
    let start = Instant::now();
    let r = pipeline.replay(&[warc.to_path_buf()], &CancellationToken::new()).await?;
    let replay_s = start.elapsed().as_secs_f64();
    let after = store.counts();
    let calls = after.row_ops() - before.row_ops();
    let pages = r.pages.max(1);
    let per_page = |n: u64| n as f64 / pages as f64;
    let call_kinds = [
        per_page(after.check_and_mutate - before.check_and_mutate),
        per_page(after.mutate_rows - before.mutate_rows),
        per_page(after.read_row + after.read_rows - before.read_row - before.read_rows),
        per_page(after.scan - before.scan),
        per_page(after.batched_rows - before.batched_rows),
    ];
    let stats = pipeline.engine().stats();
    let commits: u64 = stats.iter().map(|s| s.commits).sum();
    let runs = stats
        .iter()
        .filter(|s| s.commits > 0)
        .map(|s| (s.name.clone(), s.commits as f64 / pages as f64))
        .collect();
    let observers = stats
        .iter()
        .filter(|s| s.runs > 0)
        .map(|s| {
            let per = |n: u64| n as f64 / pages as f64;
            (s.name.clone(), per(s.runs), per(s.idle), s.latency_us_mean)
        })
        .collect();
    // The two exports, each line serialized as `perc export` writes it.
    let mut bytes = 0usize;
    let start = Instant::now();
    pipeline
        .export(|l| {
            bytes += serde_json::to_vec(&l).expect("a line serializes").len();
            Ok(())
        })
        .await?;
    let export_s = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let edges = pipeline
        .export_links(|l| {
            bytes += serde_json::to_vec(&l).expect("a line serializes").len();
            Ok(())
        })
        .await?;
    let links_s = start.elapsed().as_secs_f64();
    std::hint::black_box(bytes);
    // Search, where the web has pages users search by name: each query's first hit.
    let (mut first_hits, mut search_build_s) = (Vec::new(), 0.0);
    if warc.file_name().is_some_and(|n| n.to_string_lossy().starts_with("std-docs")) {
        let start = Instant::now();
        let index = perc_search::SearchIndex::open(None)?;
        index.catch_up(&pipeline, 256, &CancellationToken::new()).await?;
        search_build_s = start.elapsed().as_secs_f64();
        let limits = perc_search::QueryLimits::from(&pipeline.config().search);
        for q in TYPE_QUERIES {
            let hits = index.search(q, &perc_search::Filter::default(), 1, limits)?;
            let first = hits.first().map_or("(none)".to_string(), |h| h.url.clone());
            first_hits.push((q.to_string(), first));
        }
    }
    // What a running store keeps after its collector has run.
    perc_txn::gc::collect(pipeline.client(), 4096).await?;
    pipeline.close().await?;
    let usage = sled.usage()?;
    let mut columns: Vec<(String, u64)> =
        usage.columns.iter().map(|(k, c)| (k.clone(), c.inline_bytes + c.blob_bytes)).collect();
    columns.sort_by_key(|c| std::cmp::Reverse(c.1));
    columns.truncate(8);
    let mut written: Vec<(String, f64, f64)> = sled
        .written()
        .into_iter()
        .map(|(b, w, n)| (format!("{}:", b as char), per_page(w), per_page(n)))
        .collect();
    written.sort_by(|a, b| b.2.total_cmp(&a.2));
    let mut live_rows: Vec<(String, f64)> = usage
        .rows_by_kind
        .iter()
        .map(|(b, n)| (format!("{}:", *b as char), per_page(*n)))
        .collect();
    live_rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    // `perc compact`'s rewrite of the files (its collection pass is the one above).
    drop((store, sled));
    let start = Instant::now();
    let compacted =
        SledStore::compact(dir.path(), &options, &|| false)?.context("the compaction stopped")?;
    let compact_s = start.elapsed().as_secs_f64();
    Ok(Figures {
        warc: warc.display().to_string(),
        records: r.loaded,
        body_bytes,
        pages: r.pages,
        links,
        bare_s,
        bare_simhash_s,
        replay_s,
        calls_per_page: calls as f64 / pages as f64,
        call_kinds,
        txns_per_page: commits as f64 / pages as f64,
        runs,
        observers,
        disk_bytes: usage.disk_bytes,
        live_bytes: usage.live_bytes(),
        compacted_bytes: compacted.bytes_after,
        compact_s,
        export_s,
        links_s,
        edges,
        first_hits,
        search_build_s,
        trees: usage.trees.iter().map(|t| (t.name.clone(), t.key_bytes + t.value_bytes)).collect(),
        columns,
        rss_kb: crate::scaling::peak_rss_kb(),
        zstd_level,
        written,
        live_rows,
    })
}

/// Records the Rust standard library's documentation as a WARC at `out`: the docs of the
/// toolchain that runs this (rustup's `rust-docs` component), served on a free port of
/// 127.0.0.1, crawled by wget from `std/index.html` without climbing above `std/`, HTML only.
pub fn std_docs_warc(out: &Path) -> Result<()> {
    let sysroot = std::process::Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .context("run rustc --print sysroot")?;
    let html =
        PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim()).join("share/doc/rust/html");
    if !html.join("std/index.html").is_file() {
        bail!("no {}/std/index.html (rustup component add rust-docs)", html.display());
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let site = rt.block_on(perc_synth::site::serve(&html))?;
    let scratch = tempfile::tempdir()?;
    let stem = out.to_string_lossy();
    let stem = stem.strip_suffix(".warc.gz").ok_or_else(|| anyhow!("{stem}: not a .warc.gz"))?;
    let status = std::process::Command::new("wget")
        .args(["--quiet", "--recursive", "--no-parent", "--level=inf", "--no-warc-keep-log"])
        .arg(r"--reject-regex=\.(js|css|svg|woff2?|png|ico|txt|json)$")
        .arg(format!("--warc-file={stem}"))
        .arg("--directory-prefix")
        .arg(scratch.path())
        .arg(site.base().join("std/index.html")?.as_str())
        .status()
        .context("run wget (apt-get install wget)")?;
    // 8: some links led to a 404, as links in these docs do to crates not built here.
    if !matches!(status.code(), Some(0 | 8)) {
        bail!("wget failed: {status}");
    }
    drop(site);
    Ok(())
}

/// The parent: the given WARCs (or two generated ones), each in a child, then the tables; the
/// figures, for the targets' table.
pub fn run(scale: f64, warcs: &[PathBuf]) -> Result<Vec<Figures>> {
    println!("# perc-bench datapath (scale {scale}; 2 worker threads; sled 0.34 in a temp dir)");
    let tmp = tempfile::tempdir()?;
    let files = if warcs.is_empty() { default_webs(scale, tmp.path())? } else { warcs.to_vec() };
    // Each web twice: as configured by default (sled's log compressed, `store.zstd_level = 1`),
    // and with it not compressed (`0`), so that the cost and the gain of compression show side
    // by side.
    let mut all: Vec<Figures> = Vec::new();
    for f in &files {
        let args = [std::ffi::OsStr::new("datapath-one"), f.as_os_str()];
        all.push(in_a_child(&args, &[])?);
        all.push(in_a_child(&args, &[("PERC_STORE_ZSTD_LEVEL", "0")])?);
    }
    for f in &all {
        print(f);
    }
    Ok(all)
}

/// The webs measured when none is named: two perc-synth webs written into `dir`, and the std
/// docs when they can be recorded.
fn default_webs(scale: f64, dir: &Path) -> Result<Vec<PathBuf>> {
    let synth = dir.join("synth.warc.gz");
    perc_synth::write::warc(&Web::new(Spec::new(scaled(5_000, scale) as usize, 7)), &synth)?;
    let mut heavy = Spec::new(scaled(1_000, scale) as usize, 9);
    heavy.links = (300, 400);
    let linked = dir.join("link-heavy.warc.gz");
    perc_synth::write::warc(&Web::new(heavy), &linked)?;
    let mut files = vec![synth, linked];
    let std_docs = dir.join("std-docs.warc.gz");
    match std_docs_warc(&std_docs) {
        Ok(()) => files.push(std_docs),
        Err(e) => println!("(not measured: the std docs web: {e:#})"),
    }
    Ok(files)
}

/// One WARC's table.
fn print(f: &Figures) {
    let name =
        Path::new(&f.warc).file_name().map_or(f.warc.clone(), |n| n.to_string_lossy().into_owned());
    let mut t = Table::new();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    t.add(
        "bare loop (read records, parse + blake3 + links, 2 threads)",
        rate(f.records as u64, f.bare_s),
        format!("{} records, {:.1} MiB of bodies, {} links", f.records, mib(f.body_bytes), f.links),
    );
    t.add(
        "perc replay",
        rate(f.records as u64, f.replay_s),
        format!("{} pages indexed in {:.1} s", f.pages, f.replay_s),
    );
    t.add(
        "bare loop + simhash, main text and language",
        rate(f.records as u64, f.bare_simhash_s),
        format!(
            "the three cost {:.0} µs a record, 2 threads",
            (f.bare_simhash_s - f.bare_s) * 2e6 / f.records.max(1) as f64
        ),
    );
    t.add("replay / bare throughput", format!("{:.2}", f.bare_s / f.replay_s), "goal >= 0.5");
    t.add(
        "perc export (pages)",
        rate(f.pages as u64, f.export_s),
        format!("{} pages in {:.2} s, one snapshot", f.pages, f.export_s),
    );
    t.add(
        "perc export --links (edges)",
        rate(f.edges as u64, f.links_s),
        format!("{} edges in {:.2} s, each resolved to its page", f.edges, f.links_s),
    );
    if !f.first_hits.is_empty() {
        let shown: Vec<String> = f
            .first_hits
            .iter()
            .map(|(q, url)| {
                format!("{q} → {}", url.rsplit_once("/std/").map_or(url.as_str(), |u| u.1))
            })
            .collect();
        t.add(
            "search for a type's name: the first hit",
            format!("{:.1} s to index", f.search_build_s),
            shown.join(", "),
        );
    }
    let [cam, batches, reads, scans, rows] = f.call_kinds;
    t.add(
        "store calls per indexed page",
        format!("{:.1}", f.calls_per_page),
        format!(
            "goal <= 30; {cam:.1} conditional mutations, {batches:.1} batched mutations \
             ({rows:.1} rows in batches), {reads:.1} reads, {scans:.1} scans"
        ),
    );
    t.add(
        "observer transactions per indexed page",
        format!("{:.1}", f.txns_per_page),
        format!(
            "goal <= 6; {}",
            f.runs.iter().map(|(n, r)| format!("{n} {r:.2}")).collect::<Vec<_>>().join(", ")
        ),
    );
    t.add(
        "observer runs per indexed page",
        format!("{:.1}", f.observers.iter().map(|o| o.1).sum::<f64>()),
        f.observers
            .iter()
            .map(|(n, r, idle, us)| format!("{n} {r:.2} ({idle:.2} idle, {us} µs a commit)"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    t.add(
        "store on disk after replay + GC / body bytes",
        format!("{:.2}", f.disk_bytes as f64 / f.body_bytes.max(1) as f64),
        format!(
            "goal <= 1.0; {:.1} MiB on disk, {:.1} MiB live ({:.2}x); trees: {}",
            mib(f.disk_bytes),
            mib(f.live_bytes),
            f.live_bytes as f64 / f.body_bytes.max(1) as f64,
            f.trees
                .iter()
                .map(|(n, b)| format!("{n} {:.1} MiB", mib(*b)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    t.add(
        "store on disk after perc compact / body bytes",
        format!("{:.2}", f.compacted_bytes as f64 / f.body_bytes.max(1) as f64),
        format!(
            "goal <= 1.0; {:.1} MiB on disk, the files rewritten in {:.1} s",
            mib(f.compacted_bytes),
            f.compact_s
        ),
    );
    t.add(
        "largest column groups (values)",
        "",
        f.columns
            .iter()
            .map(|(n, b)| format!("{n} {:.1} MiB", mib(*b)))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let given: f64 = f.written.iter().map(|w| w.2).sum();
    let html = f.body_bytes as f64 / f.pages.max(1) as f64;
    t.add(
        "row records given to sled a page (replay and collection)",
        format!("{:.1} KiB", given / 1024.0),
        format!(
            "{:.1}x the page's HTML; by kind of row: {}",
            given / html.max(1.0),
            f.written
                .iter()
                .take(6)
                .map(|(k, w, n)| format!("{k} {w:.1} writes, {:.1} KiB", n / 1024.0))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    );
    t.add(
        "rows kept a page (after the collection)",
        format!("{:.1}", f.live_rows.iter().map(|r| r.1).sum::<f64>()),
        format!(
            "one sled key each (sled keeps a record of every node of up to 16 keys); by kind of \
             row: {}",
            f.live_rows.iter().map(|(k, n)| format!("{k} {n:.2}")).collect::<Vec<_>>().join(", ")
        ),
    );
    t.add("peak RSS", format!("{} MiB", f.rss_kb / 1024), "the child process, both loops");
    t.print(&format!("the data path on {name}, store.zstd_level = {}", f.zstd_level));
}
