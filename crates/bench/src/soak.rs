//! `perc serve` over hours: a steady state, every stage keeping up under more recrawl than
//! the machine indexes, and an index that still equals a fresh crawl at the end.
//!
//! A synthetic site of 3,000 pages served on loopback; `perc serve` (the release binary, a
//! process of its own) crawls it with every URL due every 2-10 s (`recrawl.interval_s = 2`,
//! `max_interval_s = 10`: a demand of 300-1,500 fetches a second, far more than this machine
//! indexes), while 3% of the pages change every 30 s and a client asks the API (status,
//! canonical, search) every second. Every minute: the server's RSS and its allocator's live
//! and resident bytes (from `/v1/status`: nobody scrapes this server's `/metrics`), the
//! store's bytes on disk, the fetch rate, the oldest pending notification of any observer,
//! and the API's answers that were not 200. At the end the site stops changing, the server
//! is stopped, `perc refetch --all` runs on the store, and its export is compared with a
//! fresh crawl from the same seeds (every URL of the site).
//!
//! What it reports: the trend of RSS and disk over the last half of the run (the steady
//! state: the rise of the least-squares line, as both swing from sample to sample), the
//! largest pending age seen (the back-pressure's bound), the fetch rate against the demand,
//! the non-200 answers, and whether the exports are equal. The per-minute
//! samples are printed as a table, for a plot.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::serve::{perc_binary, run_quiet, status, Served, SynthSite};
use crate::table::Table;

/// A change of 3% of the pages this often.
const CHANGE_EVERY: Duration = Duration::from_secs(30);
/// A sample this often.
const SAMPLE_EVERY: Duration = Duration::from_secs(60);
const MIB: f64 = 1024.0 * 1024.0;

struct Sample {
    minute: f64,
    rss_mib: f64,
    /// jemalloc's live bytes and the pages it holds in RAM (`memory` in `/v1/status`): the
    /// one against the other tells data that grows from memory the allocator keeps.
    allocated_mib: f64,
    allocator_resident_mib: f64,
    disk_mib: f64,
    /// Of `disk_mib`, the search index's share (DATA/search).
    search_mib: f64,
    pages: u64,
    fetches_per_s: f64,
    oldest_s: f64,
    pending: u64,
    lag_s: f64,
    not_ok: u64,
}

pub fn run(minutes: f64, pages: usize, extra: &[String]) -> Result<()> {
    let perc = perc_binary()?;
    let tmp = tempfile::tempdir()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let site_dir = tmp.path().join("site");
    let SynthSite { web, site, urls } = SynthSite::serve(&rt, &site_dir, pages)?;
    let changed = pages * 3 / 100;
    // Every URL of the site is a seed (some pages are linked from none): the store knows
    // each, and a fresh crawl seeded with the same list is what the index must equal.
    let seeds = tmp.path().join("seeds.txt");
    std::fs::write(&seeds, urls.join("\n") + "\n")?;
    let data = tmp.path().join("soak");
    let mut sets: Vec<&str> = vec![
        "crawl.sitemaps=false",
        "recrawl.interval_s=2",
        "recrawl.min_interval_s=2",
        "recrawl.max_interval_s=10",
        "recrawl.tick_ms=200",
    ];
    sets.extend(extra.iter().map(String::as_str));
    // The intervals in force (a later setting of a key wins): the demand they make.
    let setting = |key: &str| -> Option<u64> {
        sets.iter().rev().find_map(|s| s.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
    };
    let (fastest, slowest) = (
        setting("recrawl.min_interval_s").unwrap_or(2).max(1),
        setting("recrawl.max_interval_s").unwrap_or(10).max(1),
    );
    let server = Served::start(&perc, &data, &sets, Some(&seeds))?;
    let samples = rt.block_on(soak(&server, &web, &site_dir, &data, &urls, changed, minutes))?;
    drop(server);

    // The end: the site holds still; every URL is fetched again; the index must equal a
    // fresh crawl of the final site from the same seeds.
    let diff = against_a_fresh_crawl(&perc, tmp.path(), &data, &seeds)?;
    drop(site);

    print_samples(
        &samples,
        &format!(
            "perc serve soak: {pages} pages due every {fastest}-{slowest} s, {changed} changing \
             every 30 s, for {minutes} minutes (samples)"
        ),
    );
    let demand = (pages as u64 / slowest, pages as u64 / fastest);
    print_summary(&samples, minutes, demand, (fastest, slowest), &diff);
    Ok(())
}

/// `perc refetch --all` on the soaked store, then its export against a fresh crawl's from
/// the same seeds: `perc diff`'s output (exit 0: equal).
fn against_a_fresh_crawl(
    perc: &Path,
    dir: &Path,
    data: &Path,
    seeds: &Path,
) -> Result<std::process::Output> {
    let ok = run_quiet;
    ok(Command::new(perc).arg("--data").arg(data).args(["refetch", "--all"]))?;
    let fresh = dir.join("fresh");
    ok(Command::new(perc)
        .arg("--data")
        .arg(&fresh)
        .args(["--set", "crawl.sitemaps=false", "crawl", "--seeds"])
        .arg(seeds))?;
    let (a, b) = (dir.join("soaked.jsonl"), dir.join("fresh.jsonl"));
    ok(Command::new(perc).arg("--data").arg(data).arg("export").arg("--out").arg(&a))?;
    ok(Command::new(perc).arg("--data").arg(&fresh).arg("export").arg("--out").arg(&b))?;
    Ok(Command::new(perc).arg("diff").arg(&a).arg(&b).output()?)
}

/// The minute samples, one row each.
fn print_samples(samples: &[Sample], title: &str) {
    let mut t = Table::new();
    t.add(
        "minute",
        "RSS MiB (allocated, allocator resident) / disk MiB (search) / pages",
        "fetches/s, oldest pending s, pending, recrawl lag s, non-200",
    );
    for s in samples {
        t.add(
            format!("{:.0}", s.minute),
            format!(
                "{:.0} ({:.0}, {:.0}) / {:.0} ({:.0}) / {}",
                s.rss_mib,
                s.allocated_mib,
                s.allocator_resident_mib,
                s.disk_mib,
                s.search_mib,
                s.pages
            ),
            format!(
                "{:.0}, {:.1}, {}, {:.0}, {}",
                s.fetches_per_s, s.oldest_s, s.pending, s.lag_s, s.not_ok
            ),
        );
    }
    t.print(title);
}

/// The figures the soak is run for: growth over the last half, the oldest notification, the
/// fetch rate against the `demand` the intervals make, the API's answers, the final export.
fn print_summary(
    samples: &[Sample],
    minutes: f64,
    demand: (u64, u64),
    (fastest, slowest): (u64, u64),
    diff: &std::process::Output,
) {
    let mut t = Table::new();
    let last_half: Vec<&Sample> = samples.iter().filter(|s| s.minute >= minutes / 2.0).collect();
    let growth = |f: fn(&Sample) -> f64| -> (String, String) {
        let points: Vec<(f64, f64)> = last_half.iter().map(|s| (s.minute, f(s))).collect();
        let (lo, hi) =
            points.iter().fold((f64::MAX, f64::MIN), |(lo, hi), (_, y)| (lo.min(*y), hi.max(*y)));
        let range = format!("{lo:.0}-{hi:.0} MiB over the last half");
        match trend(&points) {
            Some(pct) => (format!("{pct:+.1}%"), range),
            None => ("n/a".into(), range),
        }
    };
    let (rss, rss_range) = growth(|s| s.rss_mib);
    t.add(
        "RSS growth, last half (the least-squares line's rise over it)",
        rss,
        format!("goal < 5% over the last hour of a 2-hour run; {rss_range}"),
    );
    let (allocated, allocated_range) = growth(|s| s.allocated_mib);
    t.add(
        "allocated growth, last half (jemalloc's live bytes)",
        allocated,
        format!("what the process holds, against what the allocator keeps; {allocated_range}"),
    );
    let (disk, disk_range) = growth(|s| s.disk_mib);
    t.add(
        "disk growth, last half (the least-squares line's rise over it)",
        disk,
        format!("goal < 5%; {disk_range}"),
    );
    // The first crawl (every seed at once) is a load, not the recrawl: it ends when the
    // pages stop growing from one sample to the next.
    let crawled = samples.windows(2).position(|w| w[0].pages == w[1].pages).map_or(0, |i| i + 1);
    let largest = |s: &[Sample]| s.iter().map(|s| s.oldest_s).fold(0.0, f64::max);
    t.add(
        "oldest pending notification, largest seen while recrawling",
        format!("{:.1} s", largest(&samples[crawled..])),
        format!(
            "goal < 60 s (twice recrawl.pending_age_s); {:.1} s during the first crawl \
             of every seed at once",
            largest(&samples[..crawled])
        ),
    );
    let rate: Vec<f64> = samples.iter().skip(1).map(|s| s.fetches_per_s).collect();
    let mean_rate = rate.iter().sum::<f64>() / rate.len().max(1) as f64;
    t.add(
        "fetch rate, mean after the first minute",
        format!("{mean_rate:.0}/s"),
        format!(
            "demand {}-{} fetches/s (every URL due every {fastest}-{slowest} s)",
            demand.0, demand.1
        ),
    );
    let not_ok: u64 = samples.iter().map(|s| s.not_ok).sum();
    t.add(
        "API answers other than 200",
        not_ok.to_string(),
        "goal 0 (status, canonical, search every second)",
    );
    t.add(
        "export after refetch --all = a fresh crawl of every URL",
        if diff.status.code() == Some(0) { "equal" } else { "DIFFERENT" },
        String::from_utf8_lossy(&diff.stdout).lines().take(5).collect::<Vec<_>>().join("; "),
    );
    t.print("perc serve soak: steady state and back-pressure");
}

/// How much the least-squares line through `points` (minute, value) rises from the first
/// minute to the last, in percent of its value at the first: the trend of a series that
/// swings from sample to sample (sled's log grows and is cleaned in segments of 8 MiB), which
/// two samples alone would misstate. `None` for fewer than two points.
fn trend(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let (mx, my) = points.iter().fold((0.0, 0.0), |(x, y), p| (x + p.0 / n, y + p.1 / n));
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx == 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    let (first, last) = (points[0].0, points[points.len() - 1].0);
    let start = my + slope * (first - mx);
    (start > 0.0).then(|| 100.0 * slope * (last - first) / start)
}

/// Changes the site every [`CHANGE_EVERY`], asks the API every second and samples every
/// [`SAMPLE_EVERY`], for `minutes`.
async fn soak(
    server: &Served,
    web: &perc_synth::Web,
    site: &Path,
    data: &Path,
    urls: &[String],
    changed: usize,
    minutes: f64,
) -> Result<Vec<Sample>> {
    let http = reqwest::Client::new();
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(minutes * 60.0);
    let (mut next_change, mut next_sample) = (started + CHANGE_EVERY, started + SAMPLE_EVERY);
    let mut version = 1;
    let mut samples = Vec::new();
    let mut not_ok = 0u64;
    let fetches = |s: &serde_json::Value| s["observers"]["fetch"]["runs"].as_u64().unwrap_or(0);
    let mut last = (Instant::now(), 0u64);
    let mut i = 0usize;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_secs(1)).await;
        // The API, as a user asks it: every answer must be 200.
        let u = &urls[i % urls.len()];
        i += 7;
        for r in [
            http.get(format!("{}/v1/canonical", server.base))
                .query(&[("url", u.as_str())])
                .send()
                .await,
            http.get(format!("{}/v1/search", server.base)).query(&[("q", "web page")]).send().await,
        ] {
            // A URL not indexed yet is a 404: an answer, not a failure.
            if !matches!(r.as_ref().map(|r| r.status().as_u16()), Ok(200 | 404)) {
                not_ok += 1;
            }
        }
        if Instant::now() >= next_change {
            next_change += CHANGE_EVERY;
            let changes = web.change_set(changed, u64::from(version));
            perc_synth::write::apply_changes(web, site, &changes, version)?;
            version += 1;
        }
        if Instant::now() >= next_sample {
            next_sample += SAMPLE_EVERY;
            let s = match status(&http, &server.base).await {
                Ok(s) => s,
                Err(e) => {
                    not_ok += 1;
                    eprintln!("soak: a status read failed: {e:#}");
                    continue;
                }
            };
            // From the status, not `/metrics`: the soak's server is one nobody scrapes.
            let memory = |kind: &str| s["memory"][kind].as_f64().unwrap_or(0.0) / MIB;
            let now = (Instant::now(), fetches(&s));
            let secs = now.0.duration_since(last.0).as_secs_f64().max(0.001);
            let sample = Sample {
                minute: started.elapsed().as_secs_f64() / 60.0,
                rss_mib: rss_mib(server.pid())?,
                allocated_mib: memory("allocated"),
                allocator_resident_mib: memory("resident"),
                disk_mib: disk_bytes(data)? as f64 / MIB,
                search_mib: disk_bytes(&data.join("search")).unwrap_or(0) as f64 / MIB,
                pages: s["pages"].as_u64().unwrap_or(0),
                fetches_per_s: now.1.saturating_sub(last.1) as f64 / secs,
                oldest_s: s["oldest_pending_s"].as_f64().unwrap_or(0.0),
                pending: s["pending"].as_u64().unwrap_or(0),
                lag_s: s["recrawl"]["lag_s"].as_f64().unwrap_or(0.0),
                not_ok: std::mem::take(&mut not_ok),
            };
            eprintln!(
                "soak: minute {:.0}: RSS {:.0} MiB (allocated {:.0}, allocator resident {:.0}), disk {:.0} MiB (search {:.0}), {} pages, {:.0} fetches/s, oldest pending {:.1} s",
                sample.minute, sample.rss_mib, sample.allocated_mib, sample.allocator_resident_mib, sample.disk_mib, sample.search_mib, sample.pages, sample.fetches_per_s, sample.oldest_s
            );
            samples.push(sample);
            last = now;
        }
    }
    Ok(samples)
}

/// A process's resident set (VmRSS), in MiB.
fn rss_mib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")?;
    Ok(kb / 1024.0)
}

/// The bytes of the files under `dir`. A file removed between the listing and its size
/// (the search index deletes merged segments while the server runs) counts 0.
fn disk_bytes(dir: &Path) -> Result<u64> {
    let mut n = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = match entry.metadata() {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        n += if meta.is_dir() { disk_bytes(&entry.path())? } else { meta.len() };
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::trend;

    #[test]
    fn the_trend_is_the_lines_rise_not_the_last_samples_swing() {
        // A series that swings between 100 and 140 around a flat line: no trend, though
        // its last sample is 40% above its first.
        let swinging: Vec<(f64, f64)> =
            (0..60).map(|m| (m as f64, if m % 2 == 0 { 100.0 } else { 140.0 })).collect();
        assert!(trend(&swinging).unwrap().abs() < 2.0, "{:?}", trend(&swinging));
        // A line from 100 to 110: +10%.
        let rising: Vec<(f64, f64)> =
            (0..=60).map(|m| (m as f64, 100.0 + m as f64 / 6.0)).collect();
        assert!((trend(&rising).unwrap() - 10.0).abs() < 1e-9);
        assert_eq!(trend(&[(1.0, 5.0)]), None);
    }
}
