//! The million-page run's correctness check: the export's lines of a sample of the pages,
//! read from the store at the end of the run, against the same lines computed from scratch by
//! perc-reference over the whole web as the store last saw it (the synthetic web, with the
//! run's updates). The reference shares no code with the observers or the store, so an
//! answer that agrees is the index's, not a copy of it.
//!
//! The sample: the 100 pages with the most in-links (the first of a perc-synth web: the Zipf
//! heads, whose lines carry the most inlinks and whose in-degree folds the most rows) and
//! 9,900 more drawn with a fixed seed.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use perc_observers::model::ExportLine;
use perc_observers::PageInfo;
use perc_synth::{Change, Spec, Web};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::scaling::{peak_rss_kb, Series};

const SAMPLE: usize = 10_000;
const HEADS: usize = 100;

/// The sampled pages of a web of `pages` (all of them, if it has no more than the sample).
pub(crate) fn sample(pages: usize) -> BTreeSet<usize> {
    if pages <= SAMPLE {
        return (0..pages).collect();
    }
    let mut out: BTreeSet<usize> = (0..HEADS).collect();
    let mut rng = StdRng::seed_from_u64(17);
    while out.len() < SAMPLE {
        out.insert(rng.random_range(0..pages));
    }
    out
}

/// The sample file: a header line, then one line per sampled URL with its export line, or
/// `null` for a URL the export has no line for (a redirect, an error, a duplicate's
/// alias...).
#[derive(serde::Serialize, serde::Deserialize)]
struct Header {
    pages: usize,
    /// The pages the run updated, and the version each was left at.
    updated: BTreeMap<usize, u32>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Sampled {
    url: String,
    line: Option<ExportLine>,
}

/// Reads the sampled pages' lines from the store `client` reads (quiescent, after the updates
/// of `series`) into `path`.
pub(crate) async fn write_sample(
    client: &perc_txn::Client,
    web: &Web,
    series: &[Series],
    path: &Path,
) -> Result<()> {
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?,
    );
    let header = Header { pages: web.len(), updated: crate::scaling::versions(web, series) };
    serde_json::to_writer(&mut out, &header)?;
    writeln!(out)?;
    for i in sample(web.len()) {
        let url = web.url(i);
        let line = match perc_observers::page_info(client, &url).await? {
            PageInfo::Page(line, _) => Some(line),
            _ => None,
        };
        serde_json::to_writer(&mut out, &Sampled { url: url.to_string(), line })?;
        writeln!(out)?;
    }
    out.flush()?;
    Ok(())
}

/// What the check found.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Checked {
    pub(crate) sampled: usize,
    /// Of those, the URLs with a line (pages).
    pub(crate) lines: usize,
    pub(crate) equal: usize,
    /// The largest distance of a page's rank from the exact PageRank, and the largest share
    /// of its bound one took (spec §6.4b; within it, the lines count as equal).
    #[serde(default)]
    pub(crate) pagerank_error: f64,
    #[serde(default)]
    pub(crate) pagerank_share: f64,
    /// The first few disagreements, described.
    pub(crate) differences: Vec<String>,
    /// The reference's parse of the whole web and its computation of the sample's lines.
    pub(crate) parse_s: f64,
    pub(crate) lines_s: f64,
    pub(crate) rss_kb: u64,
}

/// The child: checks the sample file at `path`, prints the figures as one JSON line.
pub fn one(path: &Path) -> Result<()> {
    let f = check(path)?;
    println!("{}", serde_json::to_string(&f)?);
    Ok(())
}

/// Compares the sample at `path` with the reference over the web it names.
pub(crate) fn check(path: &Path) -> Result<Checked> {
    let file = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut lines = std::io::BufReader::new(file).lines();
    let header: Header = serde_json::from_str(&lines.next().context("the sample file is empty")??)?;
    let mut stored: BTreeMap<String, Option<ExportLine>> = BTreeMap::new();
    for l in lines {
        let s: Sampled = serde_json::from_str(&l?)?;
        stored.insert(s.url, s.line);
    }

    let web = Web::new(Spec::new(header.pages, crate::scaling::SEED));
    let start = Instant::now();
    let reference = reference_of(&web, &header.updated);
    let parse_s = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let only: BTreeSet<String> = stored.keys().cloned().collect();
    let want: BTreeMap<String, ExportLine> =
        reference.lines(Some(&only)).into_iter().map(|l| (l.url.clone(), l)).collect();
    let lines_s = start.elapsed().as_secs_f64();

    let mut differences = Vec::new();
    let (mut equal, mut pagerank_error, mut pagerank_share) = (0, 0.0f64, 0.0f64);
    for (url, got) in &stored {
        let want = want.get(url);
        let mut got = got.clone();
        if let (Some(g), Some(w)) = (got.as_mut(), want) {
            use perc_observers::rank::{bound, ROUNDING};
            let error = (g.pagerank - w.pagerank).abs();
            pagerank_error = pagerank_error.max(error);
            pagerank_share = pagerank_share.max(error / bound(w.pagerank));
            if error <= bound(w.pagerank) + ROUNDING {
                g.pagerank = w.pagerank;
            }
        }
        if got.as_ref() == want {
            equal += 1;
        } else if differences.len() < 5 {
            differences.push(describe(url, got.as_ref(), want));
        }
    }
    Ok(Checked {
        sampled: stored.len(),
        lines: want.len(),
        equal,
        pagerank_error,
        pagerank_share,
        differences,
        parse_s,
        lines_s,
        rss_kb: peak_rss_kb(),
    })
}

/// The reference over every page of `web`, each at the version `updated` left it at, parsed
/// on two threads.
fn reference_of(web: &Web, updated: &BTreeMap<usize, u32>) -> perc_reference::Reference {
    const THREADS: usize = 2;
    let parsed: Vec<Vec<(String, perc_reference::Parsed)>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                s.spawn(move || {
                    (t..web.len())
                        .step_by(THREADS)
                        .map(|i| {
                            let url = web.url(i).to_string();
                            let response = match updated.get(&i) {
                                Some(&v) => web.changed(i, v, Change::ContentAndLinks),
                                None => web.response(i),
                            };
                            let parsed = perc_reference::parse(&url, &response);
                            (url, parsed)
                        })
                        .collect()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("a parse thread panicked")).collect()
    });
    let mut reference = perc_reference::Reference::default();
    for (url, p) in parsed.into_iter().flatten() {
        reference.add(&url, p);
    }
    reference
}

/// One disagreement, by field.
fn describe(url: &str, got: Option<&ExportLine>, want: Option<&ExportLine>) -> String {
    let (got, want) = match (got, want) {
        (Some(g), Some(w)) => (g, w),
        (g, w) => {
            return format!(
                "{url}: a line in the store: {}, in the reference: {}",
                g.is_some(),
                w.is_some()
            )
        }
    };
    let mut fields = Vec::new();
    if got.canonical != want.canonical {
        fields.push(format!("canonical {} against {}", got.canonical, want.canonical));
    }
    if got.in_degree != want.in_degree {
        fields.push(format!("in_degree {} against {}", got.in_degree, want.in_degree));
    }
    if got.content_hash != want.content_hash || got.title != want.title {
        fields.push("content".to_string());
    }
    if got.inlinks != want.inlinks {
        fields.push(format!("{} inlinks against {}", got.inlinks.len(), want.inlinks.len()));
    }
    if got.near_duplicates != want.near_duplicates {
        fields.push(format!(
            "near_duplicates {:?} against {:?}",
            got.near_duplicates, want.near_duplicates
        ));
    }
    if got.noindex != want.noindex {
        fields.push("noindex".to_string());
    }
    format!("{url}: {}", fields.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scaling::{measure, Options};

    /// A small web through the whole measured path on sled (replay, collection, the first
    /// series of updates): every sampled page's line agrees with the reference, and the check
    /// would see one that did not.
    #[test]
    fn a_small_run_s_sample_agrees_with_the_reference() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sample.jsonl");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let options = Options { compact: false, sample: Some(path.clone()), updates: Some(12) };
        rt.block_on(measure(400, options)).unwrap();
        let checked = check(&path).unwrap();
        assert_eq!(checked.sampled, 400);
        assert!(checked.lines > 300, "{checked:?}");
        assert_eq!(checked.equal, checked.sampled, "{checked:?}");

        // A line changed in the file is found, and named.
        let text = std::fs::read_to_string(&path).unwrap();
        let head = web_url(0);
        let mut changed = String::new();
        for l in text.lines() {
            if l.contains(&format!("\"url\":\"{head}\"")) {
                changed.push_str(&l.replacen("\"in_degree\":", "\"in_degree\":1", 1));
            } else {
                changed.push_str(l);
            }
            changed.push('\n');
        }
        std::fs::write(&path, changed).unwrap();
        let checked = check(&path).unwrap();
        assert_eq!(checked.equal, checked.sampled - 1);
        assert!(checked.differences[0].contains("in_degree"), "{:?}", checked.differences);
    }

    fn web_url(i: usize) -> String {
        Web::new(Spec::new(400, crate::scaling::SEED)).url(i).to_string()
    }
}
