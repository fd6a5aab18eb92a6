//! The search index of `perc serve` and `perc search` (docs/serve.md, "Search"): a tantivy
//! index with one document per canonical page that is not noindex (title, forwarded anchor
//! text, main text, language, in-degree, PageRank), kept current from the store's search queue
//! (`perc_observers::search`, Fluo Recipes' ExportQueue). It is derived data: built from the
//! export when it is new (or was left half-built), then brought up to date by draining the
//! queue, which also makes it catch up by itself after any crash. Ranking is BM25 over the
//! three text fields (title and anchors boosted) times `1 + pagerank / (pagerank + 1)`. The body is
//! the page's main text (`perc_crawl::text`: navigation, sidebars and footers left out); a
//! hit shows a snippet of it around the words asked for, and a search may keep only pages
//! of one language.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use perc_pipeline::{importance, Pipeline, PipelineError, Queued, SearchDoc};
use serde::{Deserialize, Serialize};
use tantivy::collector::TopDocs;
use tantivy::directory::MmapDirectory;
use tantivy::query::{BooleanQuery, Occur, Query, QueryParser, TermQuery};
use tantivy::schema::{
    Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, Value, FAST, INDEXED, STORED,
    STRING,
};
use tantivy::snippet::SnippetGenerator;
use tantivy::{DocId, Index, IndexReader, IndexWriter, ReloadPolicy, Score, SegmentReader};
use tantivy::{TantivyDocument, Term};
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// The index on disk (or in memory) failed.
    #[error("the search index in {dir}: {cause}")]
    Index { dir: String, cause: tantivy::TantivyError },
    /// The store below failed.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// A query that means nothing (empty).
    #[error("{0}")]
    Query(String),
}

pub type Result<T, E = SearchError> = std::result::Result<T, E>;

/// The payload of a commit of an index that holds every document (built, then kept), with
/// the search queue's generation it was built in ([`built_mark`]): an index whose last
/// commit lacks it, or names an older generation (the queue was emptied since, and the
/// changes its rows named were never applied), is built again.
const BUILT: &str = "perc-search built v2";

fn built_mark(generation: u64) -> String {
    format!("{BUILT} generation {generation}")
}

/// The writer's memory budget: one thread, tantivy's own default size.
const WRITER_BYTES: usize = 50_000_000;

/// Documents per commit while building from the export.
const BUILD_COMMIT_DOCS: usize = 10_000;

struct Fields {
    url: Field,
    title: Field,
    anchors: Field,
    body: Field,
    lang: Field,
    in_degree: Field,
    pagerank: Field,
}

/// What a query may hold (`search.query_bytes_max`, `search.query_nesting_max`). tantivy's
/// query parser recurses once for each parenthesis and each `NOT`, so a query of a few
/// thousand of them overflows the stack of the thread that parses it and aborts the
/// process; a query is measured against these bounds before it is parsed. The nesting
/// counted is every `(` and every `NOT` word, wherever they stand: a bound on the depth
/// the parser can reach, whatever the query's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryLimits {
    pub bytes_max: usize,
    pub nesting_max: usize,
}

impl From<&perc_pipeline::config::Search> for QueryLimits {
    fn from(c: &perc_pipeline::config::Search) -> QueryLimits {
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        QueryLimits { bytes_max: size(c.query_bytes_max), nesting_max: size(c.query_nesting_max) }
    }
}

impl QueryLimits {
    /// `Err` naming the bound `query` passes, if it passes one.
    pub fn check(&self, query: &str) -> Result<()> {
        if query.len() > self.bytes_max {
            return Err(SearchError::Query(format!(
                "the query has {} bytes; the most accepted is {} (search.query_bytes_max)",
                query.len(),
                self.bytes_max
            )));
        }
        let groups = query.bytes().filter(|&b| b == b'(').count();
        let nots = query
            .match_indices("NOT")
            .filter(|(i, _)| query[i + 3..].starts_with(char::is_whitespace))
            .count();
        if groups + nots > self.nesting_max {
            return Err(SearchError::Query(format!(
                "the query holds {groups} parentheses and {nots} NOTs; the most accepted is {} \
                 together (search.query_nesting_max)",
                self.nesting_max
            )));
        }
        Ok(())
    }
}

/// One answer to a query.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hit {
    pub url: String,
    pub title: String,
    pub score: f32,
    pub in_degree: u64,
    pub pagerank: f64,
    /// The language of its main text (ISO 639-3), `None` when undetermined.
    pub lang: Option<String>,
    /// Its main text around the words asked for (at most [`SNIPPET_CHARS`] characters; its
    /// beginning when they are only in the title or the anchors).
    pub snippet: String,
}

/// The most characters of a hit's snippet.
pub const SNIPPET_CHARS: usize = 200;

/// What a search asks for besides its words.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only pages whose main text is in this language (ISO 639-3: three lowercase letters).
    pub lang: Option<String>,
}

pub struct SearchIndex {
    index: Index,
    writer: Mutex<IndexWriter>,
    reader: IndexReader,
    /// The directory of an index on disk: its cache of mapped files is pruned after each
    /// commit (see [`SearchIndex::commit`]).
    mapped: Option<MmapDirectory>,
    fields: Fields,
    /// Where it lives, for messages ("memory" for an index in memory).
    dir: String,
    /// The search queue's generation its documents are of (see [`BUILT`]).
    generation: std::sync::atomic::AtomicU64,
    /// When the last [`SearchIndex::catch_up`] that finished began (the store's clock, ms);
    /// 0 before the first.
    caught_up_ms: std::sync::atomic::AtomicU64,
}

/// Text fields are split into words, lowercased and stemmed as English ("caring" finds
/// "care"), with positions for phrase queries.
fn words() -> TextOptions {
    TextOptions::default().set_indexing_options(
        TextFieldIndexing::default()
            .set_tokenizer("en_stem")
            .set_index_option(IndexRecordOption::WithFreqsAndPositions),
    )
}

fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let fields = Fields {
        url: b.add_text_field("url", STRING | STORED),
        title: b.add_text_field("title", words() | STORED),
        anchors: b.add_text_field("anchors", words()),
        body: b.add_text_field("body", words() | STORED),
        lang: b.add_text_field("lang", STRING | STORED),
        in_degree: b.add_u64_field("in_degree", INDEXED | FAST | STORED),
        pagerank: b.add_f64_field("pagerank", FAST | STORED),
    };
    (b.build(), fields)
}

impl SearchIndex {
    /// The index in `dir` (made if missing; one of another schema is derived data of an
    /// older perc, and is replaced), or in memory for `None`.
    pub fn open(dir: Option<&Path>) -> Result<SearchIndex> {
        let (schema, fields) = schema();
        let name = dir.map_or_else(|| "memory".to_string(), |d| d.display().to_string());
        let fail = |cause| SearchError::Index { dir: name.clone(), cause };
        let (index, mapped) = match dir {
            None => (Index::create_in_ram(schema), None),
            Some(d) => {
                let (index, mapped) = open_dir(d, schema).map_err(fail)?;
                (index, Some(mapped))
            }
        };
        let writer = index.writer_with_num_threads(1, WRITER_BYTES).map_err(fail)?;
        let reader =
            index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into().map_err(fail)?;
        Ok(SearchIndex {
            index,
            writer: Mutex::new(writer),
            reader,
            mapped,
            fields,
            dir: name,
            generation: Default::default(),
            caught_up_ms: Default::default(),
        })
    }

    /// The index of the store `data` (`DATA/search`), or one in memory for a store in
    /// memory.
    pub fn path_for(data: &str) -> Option<PathBuf> {
        (data != perc_pipeline::MEMORY).then(|| Path::new(data).join("search"))
    }

    fn fail(&self, cause: tantivy::TantivyError) -> SearchError {
        SearchError::Index { dir: self.dir.clone(), cause }
    }

    /// Whether its last commit holds every document of the search queue's `generation` (it
    /// was built in it, and kept since).
    pub fn is_built(&self, generation: u64) -> Result<bool> {
        let metas = self.index.load_metas().map_err(|e| self.fail(e))?;
        let built = metas.payload.as_deref() == Some(built_mark(generation).as_str());
        if built {
            self.generation.store(generation, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(built)
    }

    /// How many documents it holds (as of its last commit).
    pub fn len(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    /// When the last catch-up that finished began (the store's clock, ms): the index holds
    /// every change committed before then. `None` before the first.
    pub fn caught_up_ms(&self) -> Option<u64> {
        Some(self.caught_up_ms.load(std::sync::atomic::Ordering::Acquire)).filter(|&ms| ms > 0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn document(&self, d: &SearchDoc) -> TantivyDocument {
        let f = &self.fields;
        let mut doc = TantivyDocument::default();
        doc.add_text(f.url, &d.url);
        doc.add_text(f.title, &d.title);
        for a in &d.anchors {
            doc.add_text(f.anchors, a);
        }
        doc.add_text(f.body, &d.body);
        if let Some(lang) = &d.lang {
            doc.add_text(f.lang, lang);
        }
        doc.add_u64(f.in_degree, d.in_degree);
        doc.add_f64(f.pagerank, d.pagerank);
        doc
    }

    /// Makes the index hold what `queued` says, durably (a commit), and visible to searches.
    /// Idempotent: a URL's document is replaced, never added twice. Nothing queued, nothing
    /// committed.
    pub fn apply(&self, queued: &[Queued]) -> Result<()> {
        if queued.is_empty() {
            return Ok(());
        }
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        for q in queued {
            let url = match q {
                Queued::Index(d) => &d.url,
                Queued::Remove(url) => url,
            };
            writer.delete_term(Term::from_field_text(self.fields.url, url));
            if let Queued::Index(d) = q {
                writer.add_document(self.document(d)).map_err(|e| self.fail(e))?;
            }
        }
        self.commit(&mut writer)
    }

    fn commit(&self, writer: &mut IndexWriter) -> Result<()> {
        let mut prepared = writer.prepare_commit().map_err(|e| self.fail(e))?;
        prepared
            .set_payload(&built_mark(self.generation.load(std::sync::atomic::Ordering::SeqCst)));
        prepared.commit().map_err(|e| self.fail(e))?;
        self.reader.reload().map_err(|e| self.fail(e))?;
        // tantivy's directory keeps an entry for every file it ever mapped, segments merged
        // away and deleted included, until asked what it holds: asking prunes the entries of
        // files nobody maps any more. Unasked, a server committing every second grew by
        // ~10 MiB an hour.
        if let Some(mapped) = &self.mapped {
            mapped.get_cache_info();
        }
        Ok(())
    }

    /// Builds the index from nothing: every document of the store at one snapshot. Returns
    /// how many, and the snapshot's timestamp: the queue rows committed before it hold no
    /// change the index lacks (the drain that follows deletes them unapplied).
    pub async fn build(&self, pipeline: &Pipeline) -> Result<(usize, u64)> {
        let writer = || self.writer.lock().unwrap_or_else(|p| p.into_inner());
        writer().delete_all_documents().map_err(|e| self.fail(e))?;
        let mut pending = 0;
        let mut failed = None;
        let documents = pipeline
            .search_documents(|d| {
                if failed.is_some() {
                    return Ok(());
                }
                let mut w = writer();
                match w.add_document(self.document(&d)) {
                    Ok(_) => pending += 1,
                    Err(e) => failed = Some(e),
                }
                // Big builds commit now and then (without the payload: a crash rebuilds).
                if pending >= BUILD_COMMIT_DOCS {
                    pending = 0;
                    if let Err(e) = w.commit() {
                        failed = Some(e);
                    }
                }
                Ok(())
            })
            .await?;
        if let Some(e) = failed {
            return Err(self.fail(e));
        }
        self.generation.store(documents.generation, std::sync::atomic::Ordering::SeqCst);
        self.commit(&mut writer())?;
        Ok((documents.count, documents.at))
    }

    /// Brings the index up to date with the store: builds it if it is not built, then
    /// drains every bucket of the queue, `batch` rows a transaction. Returns the documents
    /// built and the URLs applied, or `None` if `stop` came first. A stop ends a build or a
    /// drain between two of its store calls, as a crash would: a build not finished is begun
    /// again by the next catch-up, and the queue keeps what was not applied. (A first build
    /// of a big store takes minutes; a stop may not.)
    pub async fn catch_up(
        &self,
        pipeline: &Pipeline,
        batch: usize,
        stop: &CancellationToken,
    ) -> Result<Option<(usize, usize)>> {
        let catching_up = async {
            let began = pipeline.now_ms().max(1);
            let generation = pipeline.search_generation().await?;
            let (built, built_at) = match self.is_built(generation)? {
                true => (0, None),
                false => {
                    let (n, at) = self.build(pipeline).await?;
                    (n, Some(at))
                }
            };
            let applied = pipeline.drain_search(batch, built_at, |q| self.apply(q)).await??;
            self.caught_up_ms.store(began, std::sync::atomic::Ordering::Release);
            Ok((built, applied))
        };
        tokio::select! {
            biased;
            () = stop.cancelled() => Ok(None),
            caught = catching_up => caught.map(Some),
        }
    }

    /// The best `limit` pages for `query` (tantivy's query language: words, "phrases",
    /// `+must`, `-not`, `title:word`; every word must match) that pass `filter`, best first,
    /// ties by URL. A query beyond `bounds` is refused before it is parsed.
    pub fn search(
        &self,
        query: &str,
        filter: &Filter,
        limit: usize,
        bounds: QueryLimits,
    ) -> Result<Vec<Hit>> {
        if query.trim().is_empty() {
            return Err(SearchError::Query("the query is empty".into()));
        }
        bounds.check(query)?;
        let f = &self.fields;
        let mut parser = QueryParser::for_index(&self.index, vec![f.title, f.anchors, f.body]);
        parser.set_conjunction_by_default();
        parser.set_field_boost(f.title, 2.0);
        parser.set_field_boost(f.anchors, 1.5);
        // A query with a syntax error is searched for its words, as a search box does.
        let (words, _) = parser.parse_query_lenient(query);
        let query: Box<dyn Query> = match &filter.lang {
            None => words.box_clone(),
            Some(lang) => {
                if lang.len() != 3 || !lang.bytes().all(|b| b.is_ascii_lowercase()) {
                    return Err(SearchError::Query(format!(
                        "lang {lang:?}: a language is its ISO 639-3 code, three lowercase \
                         letters (eng, deu, fra)"
                    )));
                }
                let term = Term::from_field_text(f.lang, lang);
                Box::new(BooleanQuery::new(vec![
                    (Occur::Must, words.box_clone()),
                    (Occur::Must, Box::new(TermQuery::new(term, IndexRecordOption::Basic))),
                ]))
            }
        };
        let searcher = self.reader.searcher();
        let ranked = TopDocs::with_limit(limit.max(1)).tweak_score(|segment: &SegmentReader| {
            let rank = segment
                .fast_fields()
                .f64("pagerank")
                .expect("the schema has pagerank as a fast field")
                .first_or_default_col(0.0);
            move |doc: DocId, score: Score| score * importance(rank.get_val(doc)) as f32
        });
        let answer = |e: tantivy::TantivyError| match e {
            tantivy::TantivyError::SchemaError(why)
            | tantivy::TantivyError::InvalidArgument(why) => {
                SearchError::Query(format!("the query cannot be answered: {why}"))
            }
            other => self.fail(other),
        };
        let top = searcher.search(&query, &ranked).map_err(answer)?;
        let mut snippets =
            SnippetGenerator::create(&searcher, &*words, f.body).map_err(|e| self.fail(e))?;
        snippets.set_max_num_chars(SNIPPET_CHARS);
        let mut hits = Vec::with_capacity(top.len());
        for (score, address) in top {
            let doc: TantivyDocument = searcher.doc(address).map_err(|e| self.fail(e))?;
            let text = |field| doc.get_first(field).and_then(|v| v.as_str()).unwrap_or("");
            let around = snippets.snippet_from_doc(&doc);
            let snippet = if around.fragment().is_empty() {
                beginning(text(f.body), SNIPPET_CHARS)
            } else {
                around.fragment().to_string()
            };
            hits.push(Hit {
                url: text(f.url).to_string(),
                title: text(f.title).to_string(),
                score,
                in_degree: doc.get_first(f.in_degree).and_then(|v| v.as_u64()).unwrap_or(0),
                pagerank: doc.get_first(f.pagerank).and_then(|v| v.as_f64()).unwrap_or(0.0),
                lang: Some(text(f.lang).to_string()).filter(|l| !l.is_empty()),
                snippet,
            });
        }
        hits.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.url.cmp(&b.url)));
        Ok(hits)
    }

    /// Every URL it holds, sorted (for checks against the export).
    pub fn urls(&self) -> Result<Vec<String>> {
        let searcher = self.reader.searcher();
        let mut urls = Vec::new();
        for segment in searcher.segment_readers() {
            let store = segment.get_store_reader(0).map_err(|e| self.fail(e.into()))?;
            for doc in segment.doc_ids_alive() {
                let d: TantivyDocument = store.get(doc).map_err(|e| self.fail(e))?;
                if let Some(u) = d.get_first(self.fields.url).and_then(|v| v.as_str()) {
                    urls.push(u.to_string());
                }
            }
        }
        urls.sort();
        Ok(urls)
    }
}

/// The first words of `text`, at most `chars` characters, cut at a space when there is one.
fn beginning(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        None => text.to_string(),
        Some((end, _)) => {
            let cut = text[..end].rfind(' ').filter(|&i| i > 0).unwrap_or(end);
            text[..cut].to_string()
        }
    }
}

/// Opens or makes the index in `dir`, and its directory; replaces one of another schema
/// (derived data).
fn open_dir(dir: &Path, schema: Schema) -> tantivy::Result<(Index, MmapDirectory)> {
    let open = |schema: Schema| -> tantivy::Result<(Index, MmapDirectory)> {
        std::fs::create_dir_all(dir)?;
        let mapped = MmapDirectory::open(dir)?;
        Ok((Index::open_or_create(mapped.clone(), schema)?, mapped))
    };
    match open(schema.clone()) {
        Err(tantivy::TantivyError::SchemaError(why)) => {
            tracing::warn!(dir = %dir.display(), %why, "the search index is of another schema: building it again");
            std::fs::remove_dir_all(dir)?;
            open(schema)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const BOUNDS: QueryLimits = QueryLimits { bytes_max: 1024, nesting_max: 32 };

    fn doc(url: &str, title: &str, anchors: &[&str], body: &str, in_degree: u64) -> Queued {
        Queued::Index(SearchDoc {
            url: url.into(),
            title: title.into(),
            anchors: anchors.iter().map(|a| a.to_string()).collect(),
            body: body.into(),
            lang: None,
            in_degree,
            // A rank that grows with the in-degree.
            pagerank: 0.15 * (1.0 + in_degree as f64),
        })
    }

    #[test]
    fn ranks_by_text_and_pagerank_and_applies_idempotently() {
        let dir = tempfile::tempdir().unwrap();
        let index = SearchIndex::open(Some(dir.path())).unwrap();
        assert!(!index.is_built(0).unwrap());
        let batch = [
            doc("http://h/a", "Widgets", &[], "all about widgets and gadgets", 0),
            doc("http://h/b", "Gadgets", &["widgets"], "gadgets only", 5),
            doc("http://h/c", "Other", &[], "nothing here", 9),
        ];
        index.apply(&batch).unwrap();
        index.apply(&batch).unwrap();
        assert_eq!(index.len(), 3, "applying twice replaces, never duplicates");
        assert!(index.is_built(0).unwrap());
        assert!(!index.is_built(1).unwrap(), "a newer generation builds again");
        let urls = |q: &str| -> Vec<String> {
            index
                .search(q, &Filter::default(), 10, BOUNDS)
                .unwrap()
                .into_iter()
                .map(|h| h.url)
                .collect()
        };
        assert_eq!(urls("nothing"), ["http://h/c"]);
        assert_eq!(urls("widgets gadgets").len(), 2, "every word must match");
        assert_eq!(urls("widgets -gadgets"), Vec::<String>::new());
        // The same text: the page of the higher rank first, whatever the URL order.
        index
            .apply(&[
                doc("http://h/d", "Twin", &[], "twin", 0),
                doc("http://h/e", "Twin", &[], "twin", 3),
            ])
            .unwrap();
        assert_eq!(
            urls("twin"),
            ["http://h/e", "http://h/d"],
            "the rank orders pages whose text matches alike"
        );
        index
            .apply(&[Queued::Remove("http://h/d".into()), Queued::Remove("http://h/e".into())])
            .unwrap();
        // A removal, and a reopened index keeps what was committed.
        index.apply(&[Queued::Remove("http://h/a".into())]).unwrap();
        drop(index);
        let index = SearchIndex::open(Some(dir.path())).unwrap();
        assert_eq!(index.urls().unwrap(), ["http://h/b", "http://h/c"]);
        let hit = &index.search("gadgets", &Filter::default(), 1, BOUNDS).unwrap()[0];
        assert_eq!((hit.title.as_str(), hit.in_degree), ("Gadgets", 5));
        assert!(index.search("  ", &Filter::default(), 5, BOUNDS).is_err());
        // A broken query is searched for its words.
        assert_eq!(index.search("title:(", &Filter::default(), 5, BOUNDS).unwrap().len(), 0);
    }

    #[test]
    fn a_hit_shows_its_snippet_and_a_search_keeps_one_language() {
        let index = SearchIndex::open(None).unwrap();
        let text = |lang: Option<&str>, url: &str, body: &str| {
            let Queued::Index(mut d) = doc(url, "Rivers", &["river guide"], body, 0) else {
                unreachable!()
            };
            d.lang = lang.map(str::to_string);
            Queued::Index(d)
        };
        let long = format!(
            "{} The river floods in spring. {}",
            "Words before. ".repeat(40),
            "And after. ".repeat(40)
        );
        index
            .apply(&[
                text(Some("eng"), "http://h/en", &long),
                text(Some("deu"), "http://h/de", "Der Fluss river im Tal."),
                text(None, "http://h/none", "river without a language"),
            ])
            .unwrap();
        let ask = |q: &str, lang: Option<&str>| {
            let filter = Filter { lang: lang.map(str::to_string) };
            index.search(q, &filter, 10, BOUNDS)
        };
        let hits = ask("floods", None).unwrap();
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].lang.as_deref(), Some("eng"));
        let snippet = &hits[0].snippet;
        assert!(snippet.contains("The river floods in spring"), "{snippet}");
        assert!(snippet.chars().count() <= SNIPPET_CHARS, "{snippet}");
        let urls = |hits: Vec<Hit>| hits.into_iter().map(|h| h.url).collect::<Vec<_>>();
        assert_eq!(urls(ask("river", Some("deu")).unwrap()), ["http://h/de"]);
        assert_eq!(urls(ask("river", Some("fra")).unwrap()), Vec::<String>::new());
        assert_eq!(ask("river", None).unwrap().len(), 3);
        // Words only in the anchors: the snippet is the main text's beginning.
        let hits = ask("guide", Some("deu")).unwrap();
        assert_eq!(hits[0].snippet, "Der Fluss river im Tal.");
        let hit = ask("guide", Some("eng")).unwrap().remove(0);
        assert!(hit.snippet.starts_with("Words before.") && hit.snippet.ends_with("before."));
        assert_eq!(ask("guide", None).unwrap().iter().filter(|h| h.lang.is_none()).count(), 1);
        for bad in ["en", "ENG", "english", ""] {
            match ask("river", Some(bad)) {
                Err(SearchError::Query(why)) => assert!(why.contains("ISO 639-3"), "{why}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    /// The queries that overflowed a thread's stack are refused, naming the bound, and the
    /// deepest query the widest accepted bounds admit parses on a thread with the stack a
    /// search runs on (tokio's blocking threads': 2 MiB), in a debug build (whose frames are
    /// larger than a release build's).
    #[test]
    fn a_query_too_deep_or_too_long_is_refused_before_it_is_parsed() {
        let index = SearchIndex::open(None).unwrap();
        index.apply(&[doc("http://h/a", "Widgets", &[], "widgets", 0)]).unwrap();
        let refused =
            |q: &str, bounds: QueryLimits| match index.search(q, &Filter::default(), 10, bounds) {
                Err(SearchError::Query(why)) => why,
                other => panic!("{:.40}...: {other:?}", q),
            };
        let why = refused(&"(".repeat(800), BOUNDS);
        assert!(why.contains("800 parentheses") && why.contains("query_nesting_max"), "{why}");
        let wide = QueryLimits { bytes_max: 65_536, nesting_max: 64 };
        let why = refused(&"NOT ".repeat(3000), wide);
        assert!(why.contains("3000 NOTs"), "{why}");
        let why = refused(&"+(".repeat(1000), wide);
        assert!(why.contains("1000 parentheses"), "{why}");
        let why = refused(&"widget ".repeat(200), BOUNDS);
        assert!(why.contains("1400 bytes") && why.contains("query_bytes_max"), "{why}");
        // A query the index cannot answer (`*` on a field that is not a fast field) is the
        // query's fault: refused as one, without the index's internals.
        for q in ["url:*", "title:*"] {
            let why = refused(q, BOUNDS);
            assert!(why.starts_with("the query cannot be answered: "), "{q}: {why}");
        }
        assert!(index.search("in_degree:*", &Filter::default(), 10, BOUNDS).is_ok());
        // Hyphens and words that hold NOT are no nesting.
        assert!(BOUNDS.check(&"NOTE well-known ".repeat(50)).is_ok());

        const STACK: usize = 2 * 1024 * 1024;
        let index = Arc::new(index);
        let deepest = [
            format!("{}widgets{}", "(".repeat(64), ")".repeat(64)),
            format!("{}widgets", "NOT ".repeat(64)),
            format!("{}widgets{}", "+(".repeat(32), ")".repeat(32)) + &" NOT x".repeat(32),
        ];
        for q in deepest {
            let index = index.clone();
            let parsed = std::thread::Builder::new()
                .stack_size(STACK)
                .spawn(move || index.search(&q, &Filter::default(), 10, wide).map(|_| ()))
                .unwrap()
                .join();
            assert!(matches!(parsed, Ok(Ok(()))), "{parsed:?}");
        }
    }

    /// jemalloc, whose figures say what this test process holds (nextest runs each test in
    /// a process of its own).
    #[global_allocator]
    static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

    fn live() -> i64 {
        tikv_jemalloc_ctl::epoch::advance().unwrap();
        tikv_jemalloc_ctl::stats::allocated::read().unwrap() as i64
    }

    /// A server commits its index every time the search queue has news, for weeks: what the
    /// index holds in memory must not grow with the commits. tantivy's directory kept an
    /// entry for each file it had ever mapped (each commit writes a segment of several
    /// files; merges delete them).
    #[test]
    fn commits_do_not_grow_what_the_index_holds_in_memory() {
        // In memory where there is a tmpfs: a commit syncs its files, which on a disk takes
        // a thousand commits minutes.
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() };
        let dir = dir.unwrap();
        let index = SearchIndex::open(Some(dir.path())).unwrap();
        let commit = |i: usize| {
            let url = format!("http://h/{}", i % 20);
            index.apply(&[doc(&url, "Widgets", &[], &format!("widgets {i}"), 0)]).unwrap();
        };
        // What is held between merges: the least of a window of commits. A merge holds its
        // buffers for a while (longer on a loaded machine), a leak raises every figure.
        let floor = |commits: std::ops::Range<usize>| {
            commits.map(|i| (commit(i), live()).1).min().expect("a window of commits")
        };
        (0..50).for_each(commit);
        let before = floor(50..100);
        (100..450).for_each(commit);
        let held = floor(450..500) - before;
        // Unpruned, 400 commits held ~650 kB more.
        assert!(held < 256_000, "{held} bytes more after 400 commits");
        assert_eq!(index.len(), 20);
    }
}
