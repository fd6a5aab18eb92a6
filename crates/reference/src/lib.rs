//! The index computed from scratch (docs/spec.md, "Indexing semantics") over a set of fetched
//! responses, written independently of the observers and the store: no transactions, no
//! notifications, no incremental state; every fact recomputed from the responses in the
//! plainest way. It is the oracle that the incremental pipeline is held to: by the property
//! tests (`crates/pipeline/tests/incremental.rs`, small random webs after random edits) and by
//! the million-page run (`perc-bench scaling --pages 1000000`), which compares a sample of the
//! export's lines against [`Reference::lines`] restricted to that sample.
//!
//! What it shares with the pipeline is the parse of one page (`perc_crawl::parse_for_index`,
//! the content hash, URL normalisation) and the export's record type: what a page *says* is
//! the crawl crate's job; what the index *makes* of it is recomputed here.

use std::collections::{BTreeMap, BTreeSet};

use perc_crawl::{ParsedPage, Response};
use perc_observers::model::{ExportLine, Inlink, LinkLine};
use url::Url;

/// The most near-duplicates a line lists, and the bits two simhashes may differ by.
const NEAR_LISTED_MAX: usize = 20;
const NEAR_BITS_MAX: u32 = 3;

/// What one fetched URL contributes: a page, a redirect, or nothing (an error, not HTML).
#[derive(Clone, Debug, Default)]
pub struct Parsed {
    page: Option<Page>,
    redirect: Option<String>,
}

#[derive(Clone, Debug)]
struct Page {
    hash: String,
    title: String,
    noindex: bool,
    /// (target, anchor, followed): every link.
    links: Vec<(String, String, bool)>,
    declared: Option<String>,
    simhash: Option<u64>,
    lang: Option<&'static str>,
}

impl Parsed {
    /// A page's followed links (what a crawl goes on to); none for what is no page.
    pub fn followed(&self) -> impl Iterator<Item = &str> {
        self.page.iter().flat_map(|p| p.links.iter().filter(|l| l.2).map(|l| l.0.as_str()))
    }

    pub fn is_page(&self) -> bool {
        self.page.is_some()
    }

    /// Where it redirects (HTTP, or a delay-0 refresh), if anywhere but itself.
    pub fn redirect(&self) -> Option<&str> {
        self.redirect.as_deref()
    }
}

/// Parses one response: what the reference keeps of it. Pure, so that callers may parse on
/// several threads and [`Reference::add`] in order.
pub fn parse(url: &str, r: &Response) -> Parsed {
    let html = html(url, r);
    let redirect = redirect(url, r, html.as_ref());
    let page = html.filter(|p| refresh(p).is_none()).map(|p| Page {
        hash: perc_crawl::content_hash(&r.body),
        title: p.title,
        noindex: p.noindex,
        links: p.links.into_iter().map(|l| (l.target.to_string(), l.anchor, l.follow)).collect(),
        declared: p.canonical.map(String::from),
        simhash: p.simhash,
        lang: p.lang,
    });
    Parsed { page, redirect }
}

/// What an HTML response says, when it is one.
fn html(url: &str, r: &Response) -> Option<ParsedPage> {
    if !(200..300).contains(&r.status) || r.content_type.as_deref() != Some("text/html") {
        return None;
    }
    let url = Url::parse(url).ok()?;
    Some(perc_crawl::parse_for_index(&url, &r.body, r.charset.as_deref()))
}

/// The target of a delay-0 refresh.
fn refresh(p: &ParsedPage) -> Option<String> {
    let r = p.refresh.as_ref()?;
    (r.delay_s == 0).then(|| r.target.as_ref().map(Url::to_string)).flatten()
}

/// Where an HTTP or a refresh redirect goes; `None` for what is no redirect, or one to itself.
fn redirect(url: &str, r: &Response, html: Option<&ParsedPage>) -> Option<String> {
    let to = if (300..400).contains(&r.status) {
        let to = r.location.as_ref()?.to_string();
        perc_crawl::normalize(&to).ok()?.to_string()
    } else {
        refresh(html?)?
    };
    (to != url).then_some(to)
}

/// The fetched URLs, parsed: pages and redirects by URL.
#[derive(Default)]
pub struct Reference {
    pages: BTreeMap<String, Page>,
    redirects: BTreeMap<String, String>,
}

impl Reference {
    /// Every response of `fetched`, parsed and added.
    pub fn of(fetched: &BTreeMap<String, Response>) -> Reference {
        let mut r = Reference::default();
        for (url, response) in fetched {
            r.add(url, parse(url, response));
        }
        r
    }

    /// Adds what `url` gave (a URL added again replaces what it gave before).
    pub fn add(&mut self, url: &str, parsed: Parsed) {
        self.pages.remove(url);
        self.redirects.remove(url);
        if let Some(p) = parsed.page {
            self.pages.insert(url.to_string(), p);
        }
        if let Some(to) = parsed.redirect {
            self.redirects.insert(url.to_string(), to);
        }
    }

    /// The pages: how many export lines [`Reference::lines`] makes of everything.
    pub fn page_count(&self) -> usize {
        self.pages.len()
    }

    /// The final page of a URL, following redirects; `None` on a cycle.
    fn final_of(&self, x: &str) -> Option<String> {
        let mut cur = x;
        let mut seen = BTreeSet::new();
        while let Some(next) = self.redirects.get(cur) {
            if !seen.insert(cur) {
                return None;
            }
            cur = next;
        }
        Some(cur.to_string())
    }

    /// The page a link to `x` counts for: `x`, or the end of its redirects, if a page.
    fn page_of(&self, x: &str) -> Option<String> {
        self.final_of(x).filter(|f| self.pages.contains_key(f))
    }

    /// The export's lines, in URL order: of every page, or with `only`, of the pages among
    /// those URLs (the facts of a line still come from every page: its in-degree counts the
    /// whole web's links; only the work is restricted to what those lines need). Canonical
    /// URLs by in-degree (`index.canonical_by = "indegree"`).
    pub fn lines(&self, only: Option<&BTreeSet<String>>) -> Vec<ExportLine> {
        self.lines_by(only, &Choice::InDegree)
    }

    /// [`Reference::lines`], with canonical URLs chosen as `choice` says.
    pub fn lines_by(&self, only: Option<&BTreeSet<String>>, choice: &Choice) -> Vec<ExportLine> {
        let mut clusters: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (u, p) in &self.pages {
            clusters.entry(p.hash.as_str()).or_default().push(u);
        }
        let selected: Vec<(&str, &Page)> = self
            .pages
            .iter()
            .filter(|(u, _)| only.is_none_or(|o| o.contains(*u)))
            .map(|(u, p)| (u.as_str(), p))
            .collect();
        // A cluster's simhash is its first member's (in URL order).
        let simhashes: Vec<(&str, u64)> = clusters
            .iter()
            .filter_map(|(hash, members)| Some((*hash, self.pages[members[0]].simhash?)))
            .collect();
        // Near-duplicates: each selected cluster against every other cluster.
        let mut near: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (_, p) in &selected {
            let hash = p.hash.as_str();
            if near.contains_key(hash) {
                continue;
            }
            let found = match self.pages[clusters[hash][0]].simhash {
                None => Vec::new(),
                Some(mine) => simhashes
                    .iter()
                    .filter(|(other, s)| *other != hash && (s ^ mine).count_ones() <= NEAR_BITS_MAX)
                    .map(|(other, _)| *other)
                    .collect(),
            };
            near.insert(hash, found);
        }
        // The pages whose in-degree and inlinks the lines need: the members of the selected
        // clusters (the canonical's choice, its inlinks) and of their near clusters (theirs).
        let needed: Option<BTreeSet<&str>> = only.map(|_| {
            near.iter()
                .flat_map(|(hash, others)| std::iter::once(hash).chain(others))
                .flat_map(|hash| clusters[hash].iter().copied())
                .collect()
        });
        let mut inlinks: BTreeMap<String, Vec<Inlink>> = BTreeMap::new();
        for (src, p) in &self.pages {
            for (t, anchor, _) in &p.links {
                let Some(f) = self.final_of(t) else { continue };
                if needed.as_ref().is_some_and(|n| !n.contains(f.as_str())) {
                    continue;
                }
                inlinks.entry(f).or_default().push(Inlink {
                    from: src.clone(),
                    to: t.clone(),
                    anchor: anchor.clone(),
                });
            }
        }
        let indeg = |u: &str| -> u64 {
            inlinks.get(u).map_or(0, |ls| {
                ls.iter()
                    .filter(|l| l.from != u)
                    .map(|l| l.from.as_str())
                    .collect::<BTreeSet<_>>()
                    .len() as u64
            })
        };
        // Votes: each page's declared canonical, for the page it names or whose alias it is;
        // counted only when that page shares the voter's body.
        let mut votes: BTreeMap<&str, u64> = BTreeMap::new();
        for p in self.pages.values() {
            let Some(named) = p.declared.as_deref().and_then(|d| self.final_of(d)) else {
                continue;
            };
            if let Some((m, _)) =
                self.pages.get_key_value(named.as_str()).filter(|(_, q)| q.hash == p.hash)
            {
                *votes.entry(m).or_default() += 1;
            }
        }
        let ranks = self.pageranks();
        let rank = |u: &str| ranks.get(u).copied().unwrap_or(0.0);
        let canonical_of = |hash: &str| -> &str {
            let members = &clusters[hash];
            let votes_of = |m: &str| votes.get(m).copied().unwrap_or(0);
            match choice {
                Choice::InDegree => members
                    .iter()
                    .min_by_key(|m| {
                        (std::cmp::Reverse((votes_of(m), indeg(m))), m.len(), m.to_string())
                    })
                    .expect("a cluster has a member"),
                Choice::PageRank { chosen } => {
                    let most = members.iter().map(|m| votes_of(m)).max().unwrap_or(0);
                    let best = members
                        .iter()
                        .filter(|m| votes_of(m) == most)
                        .max_by(|a, b| {
                            rank(a).total_cmp(&rank(b)).then(b.len().cmp(&a.len())).then(b.cmp(a))
                        })
                        .expect("a cluster has a member");
                    // Both ranks are within the bound of the exact ones, so the chosen one may
                    // be short of the best by two bounds (and the six decimals').
                    let slack = 2.0 * 0.001f64.max(0.001 * rank(best)) + 2e-6;
                    match chosen.get(hash).and_then(|c| members.iter().find(|m| **m == c)) {
                        Some(c) if votes_of(c) == most && rank(best) - rank(c) <= slack => c,
                        _ => best,
                    }
                }
            }
        };
        let mut out = Vec::new();
        for (u, p) in selected {
            let hash = p.hash.as_str();
            let canonical = canonical_of(hash);
            let (mut links, mut near_duplicates) = (Vec::new(), Vec::new());
            if canonical == u {
                for m in &clusters[hash] {
                    links.extend(inlinks.get(*m).cloned().unwrap_or_default());
                }
                links.sort();
                links.dedup();
                near_duplicates = near[hash].iter().map(|h| canonical_of(h).to_string()).collect();
                near_duplicates.sort();
                near_duplicates.truncate(NEAR_LISTED_MAX);
            }
            out.push(ExportLine {
                url: u.to_string(),
                canonical: canonical.to_string(),
                content_hash: p.hash.clone(),
                title: p.title.clone(),
                in_degree: indeg(u),
                noindex: p.noindex,
                near_duplicates,
                pagerank: ranks.get(u).map_or(0.0, |x| (x * 1e6).round() / 1e6),
                lang: p.lang.map(str::to_string),
                inlinks: links,
            });
        }
        out
    }

    /// The link graph (`perc export --links`): an edge for each page's link, with the page it
    /// counts for (the end of the target's redirects, if that is a page), in (to, from) order.
    pub fn link_lines(&self) -> Vec<LinkLine> {
        let mut out = Vec::new();
        for (from, p) in &self.pages {
            for (to, anchor, _) in &p.links {
                out.push(LinkLine {
                    from: from.clone(),
                    to: to.clone(),
                    target: self.page_of(to),
                    anchor: anchor.clone(),
                });
            }
        }
        out.sort_by(|a, b| (&a.to, &a.from).cmp(&(&b.to, &b.from)));
        out
    }

    /// PageRank, exactly (to 1e-12): nodes are the pages; q → p for each distinct pair where
    /// q links to p or to an alias of p (the edges the in-degree counts, q ≠ p); PR(p) = 0.15 +
    /// 0.85 · Σ PR(q) / outdeg(q), no redistribution of the rank of pages with no edge out.
    /// By iteration from 1.0: the map is a contraction (factor 0.85 in the sum of ranks).
    pub fn pageranks(&self) -> BTreeMap<String, f64> {
        let index: BTreeMap<&str, usize> =
            self.pages.keys().enumerate().map(|(i, u)| (u.as_str(), i)).collect();
        let out: Vec<BTreeSet<usize>> = self
            .pages
            .iter()
            .map(|(q, p)| {
                p.links
                    .iter()
                    .filter_map(|(t, _, _)| index.get(self.page_of(t)?.as_str()).copied())
                    .filter(|&target| target != index[q.as_str()])
                    .collect()
            })
            .collect();
        let mut rank = vec![1.0_f64; out.len()];
        loop {
            let mut next = vec![0.15_f64; out.len()];
            for (q, targets) in out.iter().enumerate() {
                let share = 0.85 * rank[q] / targets.len() as f64;
                for &p in targets {
                    next[p] += share;
                }
            }
            let moved = rank.iter().zip(&next).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            rank = next;
            if moved < 1e-12 {
                break;
            }
        }
        self.pages.keys().cloned().zip(rank).collect()
    }
}

/// How a cluster's canonical is chosen after the votes.
pub enum Choice<'a> {
    /// The highest in-degree, then the shorter URL, then the smaller.
    InDegree,
    /// The highest exact PageRank, then the shorter URL, then the smaller; or the member
    /// `chosen` names for the cluster's content hash, when its rank is within the rank's
    /// bound of the best's (the pipeline's ranks are within the bound of the exact ones, so
    /// two members that close may be chosen either way).
    PageRank { chosen: &'a BTreeMap<String, String> },
}

/// Spec §6 over `fetched`: every page's export line, in URL order.
pub fn reference(fetched: &BTreeMap<String, Response>) -> Vec<ExportLine> {
    Reference::of(fetched).lines(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use perc_synth::{Spec, Web};

    fn response(status: u16, location: Option<&str>, body: String) -> Response {
        Response {
            status,
            content_type: Some("text/html".into()),
            charset: None,
            location: location.map(|l| Url::parse(l).unwrap()),
            retry_after_s: None,
            body: body.into(),
            received: None,
        }
    }

    fn page(links: &[&str]) -> Response {
        let anchors: String = links.iter().map(|l| format!("<a href=\"{l}\">x</a>")).collect();
        response(200, None, format!("<html><body>{anchors} {}</body></html>", links.join(" ")))
    }

    fn moved(to: &str) -> Response {
        response(301, Some(to), String::new())
    }

    /// A small web whose ranks follow by hand: `a` and `b` link to `c` (b through an alias
    /// of c, and to itself through an alias of its own), `c` links nowhere; `x → y → z → x`
    /// is a cycle, and a 404 counts for nobody.
    #[test]
    fn pagerank_is_the_fixed_point_over_the_in_degree_s_edges() {
        let u = |p: &str| format!("http://h.test/{p}");
        let fetched: BTreeMap<String, Response> = [
            (u("a"), page(&[&u("c"), &u("gone")])),
            (u("b"), page(&[&u("to-c"), &u("to-b")])),
            (u("c"), page(&[])),
            (u("to-c"), moved(&u("c"))),
            (u("to-b"), moved(&u("b"))),
            (u("gone"), response(404, None, String::new())),
            (u("x"), page(&[&u("y")])),
            (u("y"), page(&[&u("z")])),
            (u("z"), page(&[&u("x")])),
        ]
        .into_iter()
        .collect();
        let ranks = Reference::of(&fetched).pageranks();
        let near = |p: &str, want: f64| {
            let got = ranks[&u(p)];
            assert!((got - want).abs() < 1e-9, "{p}: {got} against {want}");
        };
        // a and b have no edge in; c has both (a's share is whole: the 404 is no page).
        near("a", 0.15);
        near("b", 0.15);
        near("c", 0.15 + 0.85 * (0.15 + 0.15));
        for p in ["x", "y", "z"] {
            near(p, 1.0);
        }
        assert_eq!(ranks.len(), 6, "the pages only: {ranks:?}");
    }

    /// A web of 2,000 pages (duplicates, redirects, broken pages, Zipf in-links): the lines of a
    /// sample, computed for the sample alone, are the same lines as in the whole reference.
    #[test]
    fn a_sample_s_lines_are_the_whole_reference_s_lines_of_it() {
        let web = Web::new(Spec::new(2_000, 3));
        let fetched: BTreeMap<String, Response> =
            web.responses().map(|(u, r)| (u.to_string(), r)).collect();
        let reference = Reference::of(&fetched);
        let all = reference.lines(None);
        assert!(all.len() > 1_800, "{} lines", all.len());
        // Pages 0-9 (most in-links), every 37th page, and a URL that is no page.
        let mut sample: BTreeSet<String> = (0..10).map(|i| web.url(i).to_string()).collect();
        sample.extend((0..2_000).step_by(37).map(|i| web.url(i).to_string()));
        sample.insert("http://synth.test/no-such-page".to_string());
        let lines = reference.lines(Some(&sample));
        let expected: Vec<ExportLine> =
            all.into_iter().filter(|l| sample.contains(&l.url)).collect();
        assert!(lines.len() > 50, "{} lines", lines.len());
        assert!(lines.iter().any(|l| l.inlinks.len() > 100), "a head page with its inlinks");
        assert!(lines.iter().any(|l| l.canonical != l.url), "a duplicate in the sample");
        assert_eq!(lines, expected);
    }
}
