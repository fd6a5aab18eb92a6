//! Each stage alone, on rows set up for it: what it buffers (writes, deletes, notifications)
//! and what it returns, against a golden file in `tests/golden/` that a reader can check
//! line by line against the stage's contract in its module; and a second run of the stage
//! on what the first committed changes nothing. `PERC_UPDATE_GOLDEN=1 cargo test -p
//! perc-observers --test stages` rewrites the files (review the diff).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use perc_notify::{Observer, Registry};
use perc_observers::model::{
    self, col, CrawlScope, Forward, Meta, PageKind, RawHead, Recrawl, Schedule,
};
use perc_observers::{alias, cluster, dedup, export, forward, indegree, invert, parse, runs};
use perc_oracle::{LocalOracle, Oracle};
use perc_store::{MemStore, Store};
use perc_txn::{Client, ManualClock, Transaction, TxnConfig};

const A: &str = "http://s.test/a";
const B: &str = "http://s.test/b";
const C: &str = "http://s.test/c";

/// A store in memory and a client whose commits notify the pipeline's observers (the same
/// registry, so strong notifications follow from the writes as in a run).
async fn client() -> Client {
    let store: Arc<dyn Store> = Arc::new(MemStore::new(perc_notify::schema()));
    let oracle: Arc<dyn Oracle> = Arc::new(LocalOracle::open(store.clone(), 64).await.unwrap());
    let schedule = Schedule { default: Recrawl::default(), prefixes: Vec::new() };
    let registry: Registry =
        perc_observers::registry_with(Arc::new(perc_crawl::Offline), schedule, 4096).unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000));
    perc_notify::client_for(store, oracle, clock, TxnConfig::default(), Arc::new(registry))
        .await
        .unwrap()
}

/// Commits the cells `set` writes.
async fn given(c: &Client, set: impl FnOnce(&mut Transaction)) {
    let mut t = c.begin().await.unwrap();
    set(&mut t);
    t.commit().await.unwrap();
}

fn html(title: &str, extra: &str) -> Bytes {
    let head =
        RawHead { status: Some(200), content_type: Some("text/html".into()), ..RawHead::default() };
    let body = format!(
        "<html><head><title>{title}</title>{extra}</head><body><p>{title}: the words of a \
         page about {title}, long enough for a simhash of several shingles.</p>\
         <a href=\"{B}\">to b</a> <a href=\"{C}\" rel=\"nofollow\">to c</a></body></html>"
    );
    model::encode_raw(&head, body.as_bytes())
}

/// A page's `page:meta`, as parse writes it, with `title` and content hash h1.
fn page_meta(title: &str) -> Vec<u8> {
    let meta = Meta {
        kind: PageKind::Page,
        status: Some(200),
        title: title.into(),
        content_hash: "h1".into(),
        ..Meta::default()
    };
    serde_json::to_vec(&meta).unwrap()
}

fn text(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => s.replace('\0', "\\0"),
        Err(_) => format!("{} bytes", b.len()),
    }
}

/// What `t` would commit, one line a cell, then what the stage returned.
fn buffered(t: &Transaction, returned: &str) -> String {
    let mut out = String::new();
    for (row, column, value, unchecked) in t.buffered_writes() {
        let how = if unchecked { " (unchecked)" } else { "" };
        // indegree's and rank's marks are the run's start: masked.
        let start = Bytes::from(t.start_ts().0.to_string());
        let value = value.map(|v| {
            if [col::FOLDED, col::RANK_FOLDED].contains(&column.as_ref()) && v == start {
                Bytes::from_static(b"<start_ts>")
            } else {
                v
            }
        });
        match value {
            Some(v) => writeln!(out, "set    {} {}{how} = {}", text(&row), text(&column), text(&v)),
            None => writeln!(out, "delete {} {}{how}", text(&row), text(&column)),
        }
        .unwrap();
    }
    for (row, column, conditional) in t.buffered_notifications() {
        let how = if conditional { " (if its probes were ever written)" } else { "" };
        writeln!(out, "notify {} {}{how}", text(&row), text(&column)).unwrap();
    }
    for (row, column) in t.buffered_deletes_at_commit() {
        writeln!(out, "delete {} {} (at commit, no lock)", text(row), text(column)).unwrap();
    }
    writeln!(out, "returns {returned}").unwrap();
    out
}

/// Runs a stage in a transaction of its own: what it buffers and what it returns (`run`'s
/// text) against the golden file `name`; then commits.
async fn first_run(c: &Client, name: &str, run: impl AsyncFnOnce(&mut Transaction) -> String) {
    let mut t = c.begin().await.unwrap();
    let returned = run(&mut t).await;
    golden(name, &buffered(&t, &returned));
    t.commit().await.unwrap();
}

/// A stage that returns nothing: its first run against its golden, then a second run that
/// changes nothing.
async fn runs_once(c: &Client, name: &str, run: impl AsyncFn(&mut Transaction)) {
    first_run(c, name, async |t| {
        run(t).await;
        "()".into()
    })
    .await;
    changes_nothing(c, run).await;
}

/// Runs a stage again on what the first run committed: it buffers nothing.
async fn changes_nothing(c: &Client, run: impl AsyncFnOnce(&mut Transaction)) {
    let mut again = c.begin().await.unwrap();
    run(&mut again).await;
    assert!(again.is_empty(), "{}", buffered(&again, ""));
}

/// The buffered writes of `t` outside the search queue (which some stages append to on
/// every run: the indexer drains it, and a row of it changes no document).
fn writes_but_the_queue(t: &Transaction) -> Vec<String> {
    let queue = model::rows::QUEUE.start();
    t.buffered_writes()
        .into_iter()
        .filter(|(row, ..)| !row.starts_with(queue))
        .map(|(row, column, ..)| format!("{} {}", text(&row), text(&column)))
        .collect()
}

/// `got` against `tests/golden/<name>.txt` (or rewrites it under PERC_UPDATE_GOLDEN).
fn golden(name: &str, got: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/{name}.txt"));
    // Timestamps vary with the oracle's batches: shown as <ts>.
    let got = mask_timestamps(got);
    if std::env::var_os("PERC_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (PERC_UPDATE_GOLDEN=1 writes it)", path.display()));
    assert_eq!(got, want, "{name}: the stage buffers other than its golden file says");
}

/// Replaces the 16-hex-digit timestamps in row keys (change rows, queue rows) with `<ts>`.
fn mask_timestamps(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("\\0") {
        out.push_str(&rest[..i + 2]);
        rest = &rest[i + 2..];
        if rest.bytes().take_while(u8::is_ascii_hexdigit).count() == 16 {
            out.push_str("<ts>");
            rest = &rest[16..];
        }
    }
    out.push_str(rest);
    out
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
fn parse_writes_what_a_page_is_and_a_second_run_only_queues_it_again() {
    rt().block_on(async {
        let c = client().await;
        let page = model::page(A);
        let canonical = format!("<link rel=\"canonical\" href=\"{A}\">");
        given(&c, |t| {
            t.set(page.clone(), Bytes::from_static(col::RAW), html("a", &canonical));
            // In the frontier: its links are for discover to follow.
            t.set(
                model::fetch_row(A),
                Bytes::from_static(col::WANT),
                r#"{"depth":0,"gen":1,"hops":0}"#,
            );
        })
        .await;
        let mut t = c.begin().await.unwrap();
        let parsed = parse::run(&mut t, &page).await.unwrap().expect("a page row with a record");
        let returned = format!(
            "meta_changed {}, simhash {}, links before {:?}, links {:?}",
            parsed.meta_changed,
            parsed.simhash.is_some(),
            parsed.links_before,
            parsed.links
        );
        golden("parse", &buffered(&t, &returned));
        t.commit().await.unwrap();

        let mut again = c.begin().await.unwrap();
        let parsed = parse::run(&mut again, &page).await.unwrap().unwrap();
        assert!(!parsed.meta_changed);
        assert_eq!(writes_but_the_queue(&again), Vec::<String>::new());
    });
}

#[test]
fn dedup_registers_a_member_and_says_which_cluster_it_joined() {
    rt().block_on(async {
        let c = client().await;
        let page = model::page(A);
        given(&c, |t| t.set(page.clone(), Bytes::from_static(col::HASH), "h1")).await;
        first_run(&c, "dedup-join", async |t| {
            match dedup::run(t, &page, Some(0xfeed)).await.unwrap() {
                Some(j) => format!("joined {} ({})", j.hash, text(&j.simhash)),
                None => "nothing".into(),
            }
        })
        .await;

        // Its body changes: it leaves h1 (told) and joins h2.
        given(&c, |t| t.set(page.clone(), Bytes::from_static(col::HASH), "h2")).await;
        first_run(&c, "dedup-move", async |t| {
            let joined = dedup::run(t, &page, Some(0xbeef)).await.unwrap();
            joined.map_or("nothing".into(), |j| format!("joined {}", j.hash))
        })
        .await;
        changes_nothing(&c, async |t| {
            assert!(dedup::run(t, &page, Some(0xbeef)).await.unwrap().is_none());
        })
        .await;
    });
}

#[test]
fn invert_writes_the_edges_that_came_and_removes_those_that_went() {
    rt().block_on(async {
        let c = client().await;
        let page = model::page(A);
        // B was parsed (its inlinks are counted: told); C never was (not told).
        given(&c, |t| t.set(model::page(B), Bytes::from_static(col::META), "{}")).await;
        let before = vec![(C.to_string(), "old".to_string())];
        let now = vec![(B.to_string(), "to b".to_string())];
        first_run(&c, "invert", async |t| {
            invert::run(t, &page, &before, &now).await.unwrap();
            "()".into()
        })
        .await;
        changes_nothing(&c, async |t| invert::run(t, &page, &now, &now).await.unwrap()).await;
    });
}

#[test]
fn alias_registers_a_redirect_at_its_target() {
    rt().block_on(async {
        let c = client().await;
        let page = model::page(A);
        given(&c, |t| t.set(page.clone(), Bytes::from_static(col::REDIRECT), B)).await;
        let run = async |t: &mut Transaction| alias::run(t, &page).await.unwrap();
        runs_once(&c, "alias", run).await;
    });
}

#[test]
fn export_makes_the_line_from_the_pages_cells() {
    rt().block_on(async {
        let c = client().await;
        let page = model::page(A);
        let meta = page_meta("a");
        given(&c, |t| {
            t.set(page.clone(), Bytes::from_static(col::META), meta.clone());
            t.set(page.clone(), Bytes::from_static(col::CANONICAL), B);
            t.set(page.clone(), Bytes::from_static(col::INDEG), "3");
        })
        .await;
        let run = async |t: &mut Transaction| export::run(t, &page).await.unwrap();
        runs_once(&c, "export", run).await;
    });
}

/// Two members of cluster h1: the one with the higher in-degree is chosen, and the choice
/// says which members' canonical moved and what to forward.
#[test]
fn cluster_chooses_a_canonical_and_returns_what_follows() {
    rt().block_on(async {
        let c = client().await;
        let head = model::cluster_head("h1");
        given(&c, |t| {
            for (url, indeg) in [(A, "1"), (B, "5")] {
                t.set(model::member("h1", url), Bytes::from_static(col::MEMBER), "");
                t.set(model::page(url), Bytes::from_static(col::INDEG), indeg);
                let names = format!("[\"{url}\"]");
                t.set(model::page(url), Bytes::from_static(col::NAMES), names);
                t.set(model::page(url), Bytes::from_static(col::HASH_REGISTERED), "h1");
            }
        })
        .await;
        first_run(&c, "cluster", async |t| {
            let choice = cluster::run(t, &head).await.unwrap().expect("a cluster with members");
            let moved: Vec<String> = choice.moved.iter().map(|r| text(r)).collect();
            format!(
                "moved {moved:?}; forward {:?} of {:?} to {}",
                choice.forward.names.iter().map(|n| n.as_deref().map(text)).collect::<Vec<_>>(),
                choice.forward.members,
                choice.forward.canonical
            )
        })
        .await;
        changes_nothing(&c, async |t| {
            assert!(cluster::run(t, &head).await.unwrap().unwrap().moved.is_empty());
        })
        .await;
    });
}

#[test]
fn forward_gives_the_canonical_every_members_names() {
    rt().block_on(async {
        let c = client().await;
        let f = || Forward {
            hash: "h1".into(),
            members: vec![A.into(), B.into()],
            names: vec![
                Some(Bytes::from(format!("[\"{A}\"]"))),
                Some(Bytes::from(format!("[\"{B}\"]"))),
            ],
            forwarded: vec![Some(Bytes::from(format!("[\"{A}\"]"))), None],
            canonical: B.into(),
        };
        let mut t = c.begin().await.unwrap();
        forward::run(&mut t, &f()).await.unwrap();
        golden("forward", &buffered(&t, "()"));
        t.commit().await.unwrap();

        let mut again = c.begin().await.unwrap();
        let mut now = f();
        now.forwarded = vec![None, Some(Bytes::from(format!("[\"{A}\",\"{B}\"]")))];
        forward::run(&mut again, &now).await.unwrap();
        assert_eq!(writes_but_the_queue(&again), Vec::<String>::new());
    });
}

/// An edge from `source` into B and its change row (+1, written at `ts`), as invert leaves
/// them.
fn link_into_b(t: &mut Transaction, source: &str, anchor: &str, ts: u64) {
    t.set(model::edge(B, source), Bytes::from_static(col::EDGE), anchor.to_string());
    t.set(model::delta(B, source, ts), Bytes::from_static(col::DELTA), "1");
}

/// B's `page:meta`: a page, as parse leaves it.
fn b_is_a_page(t: &mut Transaction) {
    t.set(model::page(B), Bytes::from_static(col::META), page_meta("b"));
}

/// A page with two change rows (+1 from A, +1 from C): its counts, names and what follows.
#[test]
fn indegree_folds_a_pages_changes_and_returns_what_follows() {
    rt().block_on(async {
        let c = client().await;
        let page = model::page(B);
        given(&c, |t| {
            b_is_a_page(t);
            t.set(page.clone(), Bytes::from_static(col::HASH_REGISTERED), "h1");
            t.set(page.clone(), Bytes::from_static(col::ALONE), "h1");
            link_into_b(t, A, "to b", 1);
            link_into_b(t, C, "b", 2);
        })
        .await;
        first_run(&c, "indegree", async |t| {
            let follow = indegree::run(t, &page, 4096).await.unwrap();
            format!(
                "export {}, forward {:?}",
                follow.export,
                follow.forward.as_ref().map(|f| (&f.members, &f.canonical))
            )
        })
        .await;
        changes_nothing(&c, async |t| {
            let follow = indegree::run(t, &page, 4096).await.unwrap();
            assert!(!follow.export && follow.forward.is_none());
        })
        .await;
    });
}

/// Two pages that link to each other (A also to C, which is no page), each with the word to
/// resolve its out-set as parse leaves it: the bucket's run resolves both, ranks them in
/// memory until each residual is within ε, and takes its rows; a second run changes nothing.
#[test]
fn rank_resolves_out_sets_and_ranks_a_bucket_in_one_run() {
    rt().block_on(async {
        let c = client().await;
        let links = |targets: &[&str]| {
            serde_json::to_vec(&targets.iter().map(|t| (*t, "x")).collect::<Vec<_>>()).unwrap()
        };
        given(&c, |t| {
            for (url, targets) in [(A, links(&[B, C])), (B, links(&[A]))] {
                t.set(model::page(url), Bytes::from_static(col::META), page_meta(url));
                t.set(model::page(url), Bytes::from_static(col::LINKS), targets);
            }
            model::signals::rank_targets_changed(t, [A, B]);
        })
        .await;
        let head = model::rank_head(model::rank_bucket(A));
        first_run(&c, "rank", async |t| {
            perc_observers::rank::run(t, &head).await.unwrap();
            "()".into()
        })
        .await;
        // PR = 1 for both (each the other's only source): within ε / 0.15 of it; the rank
        // shown is the rank (it moved from nothing).
        let t = c.begin().await.unwrap();
        for url in [A, B] {
            let state = perc_observers::rank::state_of(&t, url).await.unwrap();
            let (x, a) = (state.x, state.a);
            assert!((x - 1.0).abs() <= perc_observers::rank::EPSILON / 0.15, "{url}: {x}");
            assert!((0.15 + a - x).abs() <= perc_observers::rank::EPSILON, "{url}: {x} {a}");
            let raw = t.get(&model::rank_row(url), col::RANK).await.unwrap().unwrap();
            assert_eq!(model::rank_of(&raw), Some(x), "{url}");
        }
        changes_nothing(&c, async |t| perc_observers::rank::run(t, &head).await.unwrap()).await;
    });
}

/// A change row committed before the page's mark (`indeg:folded`) was folded by the run that
/// wrote the mark, and only a crash kept it from being deleted: not counted again, and
/// deleted with the rows this run folds.
#[test]
fn indegree_does_not_fold_again_a_change_row_older_than_its_mark() {
    rt().block_on(async {
        let c = client().await;
        let page = model::page(B);
        given(&c, |t| {
            b_is_a_page(t);
            t.set(page.clone(), Bytes::from_static(col::BASE), "1");
            link_into_b(t, A, "to b", 1);
        })
        .await;
        let mark = c.begin().await.unwrap().start_ts().0;
        given(&c, |t| {
            t.set(page.clone(), Bytes::from_static(col::FOLDED), mark.to_string());
            link_into_b(t, C, "b", 2);
        })
        .await;
        let mut t = c.begin().await.unwrap();
        indegree::run(&mut t, &page, 4096).await.unwrap();
        let base = t
            .buffered_writes()
            .into_iter()
            .find(|(row, column, ..)| row == &page && column.as_ref() == col::BASE);
        assert_eq!(base.and_then(|(_, _, v, _)| v), Some(Bytes::from("2")));
        let deleted: Vec<Bytes> =
            t.buffered_deletes_at_commit().iter().map(|(row, _)| row.clone()).collect();
        assert_eq!(deleted, vec![model::delta(B, A, 1), model::delta(B, C, 2)]);
        t.commit().await.unwrap();
        let t = c.begin().await.unwrap();
        let (start, end) = model::children(&model::rows::DELTAS, B);
        assert_eq!(t.scan(&start, &end, col::DELTA).await.unwrap(), vec![]);
        assert_eq!(t.get(&page, col::INDEG).await.unwrap(), Some(Bytes::from("2")));
    });
}

/// discover puts the in-scope targets of a page's links in the frontier, one hop deeper.
#[test]
fn discover_wants_the_links_in_scope() {
    rt().block_on(async {
        let c = client().await;
        let page = model::page(A);
        let scope =
            CrawlScope { seeds: vec![A.into()], prefixes: vec![], max_depth: 3, max_redirects: 5 };
        let follow = format!(
            r#"{{"depth":0,"hops":0,"links":["{B}","http://elsewhere.test/x"],"redirect":null}}"#
        );
        given(&c, |t| {
            t.set(
                Bytes::from_static(model::CONFIG_ROW),
                Bytes::from_static(col::SCOPE),
                serde_json::to_vec(&scope).unwrap(),
            );
            t.set(page.clone(), Bytes::from_static(col::FOLLOW), follow);
        })
        .await;
        let discover = perc_observers::discover::Discover::default();
        let column = Bytes::from_static(col::FOLLOW);
        let mut t = c.begin().await.unwrap();
        discover.observe(&mut t, &page, &column).await.unwrap();
        let got = buffered(&t, "()");
        // The generation is the transaction's start: masked.
        let got = got.replace(&format!("\"gen\":{}", t.start_ts().0), "\"gen\":<ts>");
        golden("discover", &got);
        t.commit().await.unwrap();

        changes_nothing(&c, async |t| discover.observe(t, &page, &column).await.unwrap()).await;
    });
}

/// The parse run composes its stages: a new page's run writes its own cells, its edges,
/// its cluster's first choice (cluster::found) and its export line in one transaction.
#[test]
fn the_parse_run_composes_parse_export_dedup_a_first_choice_invert_and_alias() {
    rt().block_on(async {
        let c = client().await;
        let page = model::page(A);
        given(&c, |t| t.set(page.clone(), Bytes::from_static(col::RAW), html("a", ""))).await;
        let mut t = c.begin().await.unwrap();
        runs::Parse.observe(&mut t, &page, &Bytes::from_static(col::RAW)).await.unwrap();
        let cells: Vec<String> = t
            .buffered_writes()
            .into_iter()
            .map(|(row, column, ..)| format!("{} {}", text(&row), text(&column)))
            .collect();
        for (stage, cell) in [
            ("parse", format!("p:{A} page:meta")),
            ("export", format!("p:{A} export:line")),
            ("dedup", format!("p:{A} dedup:registered")),
            ("a new cluster's first choice", format!("p:{A} page:canonical")),
            ("forward after the choice", format!("p:{A} fwd:names")),
        ] {
            assert!(cells.contains(&cell), "{stage} wrote no {cell}:\n{cells:#?}");
        }
        assert!(
            cells.iter().any(|c| c.starts_with(&format!("e:{B}\\0{A}"))),
            "invert wrote no edge to b:\n{cells:#?}"
        );
    });
}
