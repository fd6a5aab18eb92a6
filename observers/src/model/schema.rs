//! The pipeline's schema: row keys and column names, and which observer writes each.
//!
//! ```text
//!   row                    columns (transactional)                      written by
//!   f:<url>                crawl:want   {depth, gen, hops}              loader, discover,
//!                                                                       the scheduler
//!                          crawl:state  the recrawl state: when, the    fetch
//!                                       validators, the interval
//!   p:<url>                crawl:raw    fetch outcome + zstd body       fetch, replay loader
//!                          page:meta    kind, reason, title, noindex…   parse
//!                          page:links   [[target, anchor]]              parse
//!                          page:follow  {depth, hops, targets}          parse
//!                          page:hash    content hash ("" if no page)    parse
//!                          page:redirect  target ("" if none)           parse
//!                          page:declared  declared canonical ("")       parse
//!                          page:canonical                               cluster
//!                          cluster:alone  the cluster's hash, if the    cluster
//!                                       page is its only member
//!                          indeg:indeg  in-degree                       indegree
//!                          indeg:names  the page and its aliases        indegree
//!                          fwd:names    the names whose inlinks the     forward (in
//!                                       canonical carries               cluster's choice;
//!                                                                       indegree's run
//!                                                                       for a cluster
//!                                                                       of one)
//!                          export:line  the serving copy (JSON; its     export (in the
//!                                       inlinks are read from the e:    runs of parse,
//!                                       rows of fwd:names)              indegree, cluster)
//!                          dedup:registered, alias:done                 their stages' memory
//!                          indeg:base   edges into this URL, counted    indegree
//!                          indeg:extra  sources reaching it only        indegree
//!                                       through aliases
//!                          indeg:alias_of  an alias: the page its       indegree
//!                                       inlinks are counted at
//!                          indeg:chain  commit timestamps of the        indegree
//!                                       redirects its chain read
//!                          indeg:folded every change row (d:) of the    indegree
//!                                       URL committed before this
//!                                       timestamp is folded
//!   e:<target>\0<source>   edge:anchor                                  invert
//!   d:<target>\0<source>\0<ts>                                          invert, indegree
//!                          indeg:delta  +1/-1: an edge not yet counted, (which folds them
//!                                       or 0: look at this source       and deletes them
//!                                       again; one row per writing      at its commit);
//!                                       transaction                     <ts>: the writer's
//!                                                                       start_ts
//!   k:<url>                rank:rank    "<x>": the page's PageRank as   rank
//!                                       shown (near its state's x,
//!                                       see rank::shard::leeway)
//!                          rank:out     {targets}: what its pushes go   rank
//!                                       to
//!                          rank:cluster the hash of its cluster, when   cluster (by
//!                                       that has more than one member   PageRank only)
//!                                       and chooses by PageRank: whom
//!                                       a move of its rank concerns
//!   h:<bucket><shard>      rank:state   x, A and the rank shown of the  rank
//!                                       shard's pages (binary, see
//!                                       rank::shard)
//!   g:<bucket>             rank:dirty   notify: the bucket's pushes     parse, indegree,
//!                                                                       rank
//!                          rank:folded  every push row of the bucket    rank
//!                                       committed before this is folded
//!   g:<bucket>\0<target>\0 rank:push    the change of what the target's  rank
//!     <ts>                               sources push it (decimal)
//!                          rank:resolve resolve the target's out-set    parse, indegree
//!                                       again
//!   x:<page>\0<source>     indeg:via    how many of the page's aliases  indegree (the
//!                                       the source links to             aliases' runs)
//!                          indeg:adds   set: the source counts through  indegree (the
//!                                       aliases only                    page's run)
//!   a:<page>\0<alias>      indeg:alias  the alias's chain ends here     indegree (the alias's)
//!   r:<target>\0<source>   alias:from   (source redirects to target)    alias
//!   c:<hash>               cluster:canonical                            cluster
//!                          near:registered  "<simhash> <canonical>":  cluster
//!                                       its entry in the block cells
//!                          near:list    canonical URLs of the near-     cluster, near
//!                                       duplicate clusters (JSON)
//!   c:<hash>\0<url>        cluster:member  the body's simhash (hex)     dedup
//!   s:<b><block>           near:block   the band index: a line          cluster
//!                                       "<hash> <simhash> <canonical>"
//!                                       for each cluster whose simhash
//!                                       has this block, b = 0..3,
//!                                       block = bits 16b..16b+15 (hex)
//!   n:<ms>\0<url>          crawl:due    (due for a recrawl at ms, 16   fetch (and the
//!                                       hex digits: time order)         scheduler's delete)
//!   q:<bb>\0<url>\0<ts>    search:queued  (the URL's search document     export, invert,
//!                                       may have changed; bb: a byte    forward (and the
//!                                       of its blake3, in hex)          indexer's delete)
//!   m:config               crawl:scope  {seeds, prefixes, limits}       loader
//!                          crawl:layout the store's layout version      the upgrade
//!                                       ([`crate::upgrade`])
//!                          cluster:by   "pagerank" when the canonical   the opening
//!                                       choice ranks by PageRank        ([`crate::rule`])
//!                          rank:deferred  a bulk load's rank runs wait  crawl, replay
//!                                       ([`crate::rank::settle`])
//! ```
//!
//! A URL's frontier entry and recrawl state live in a row of their own (`f:`), not in its
//! page row: a recrawl that finds the page unchanged rewrites that small row (the want, the
//! fetch's state and ack), and the page row, which holds every stage's cells, only changes
//! when the page does. An embedded store rewrites a row's whole record for any of its
//! cells, so this is what keeps an unchanged recrawl's writes small.
//!
//! Inlinks live in rows of their own under the target's prefix, so that a page every page
//! links to is many small rows, not one huge one; readers get them with a prefix scan. No
//! observer copies them into a list: a list on a page every page links to would be rewritten,
//! whole, on every change of any of its inlinks (O(in-degree) per update). The export line
//! holds the page's own fields, and readers join the canonical's inlinks from the `e:` rows
//! of its `fwd:names` ([`inlinks`]). Hot
//! rows (`indeg:dirty`, `cluster:dirty`) are only ever notified
//! weakly: many writers, no conflicts.
//!
//! "cluster" above is cluster's choice: a run of cluster, or, for a new cluster's first
//! member, that page's parse run ([`crate::cluster::found`]).

use bytes::Bytes;

/// The kinds of row (the table above), each the prefix of its keys: the one place the
/// prefixes are spelled.
pub mod rows {
    /// A kind of row: its keys are `<letter>:<key>`.
    #[derive(Debug, PartialEq, Eq)]
    pub struct Prefix {
        /// `<letter>:`, and the key right after every row of the kind: `<letter>;`.
        start: [u8; 2],
        end: [u8; 2],
    }

    impl Prefix {
        /// The prefix, as a key begins with it.
        pub fn prefix(&'static self) -> &'static str {
            std::str::from_utf8(&self.start).expect("an ASCII letter and a colon")
        }
        /// The first key of the kind's range.
        pub fn start(&'static self) -> &'static [u8] {
            &self.start
        }
        /// The first key past every row of the kind.
        pub fn end(&'static self) -> &'static [u8] {
            &self.end
        }
        /// The key of `row` after the prefix, if it is a row of this kind.
        pub fn key_of<'r>(&self, row: &'r [u8]) -> Option<&'r str> {
            std::str::from_utf8(row.strip_prefix(&self.start[..])?).ok()
        }
    }

    const fn kind(letter: u8) -> Prefix {
        Prefix { start: [letter, b':'], end: [letter, b':' + 1] }
    }

    pub static PAGES: Prefix = kind(b'p');
    pub static FETCHES: Prefix = kind(b'f');
    pub static EDGES: Prefix = kind(b'e');
    pub static DELTAS: Prefix = kind(b'd');
    pub static VIAS: Prefix = kind(b'x');
    pub static ALIASES: Prefix = kind(b'a');
    pub static REDIRECTS: Prefix = kind(b'r');
    pub static CLUSTERS: Prefix = kind(b'c');
    pub static BANDS: Prefix = kind(b's');
    pub static DUE: Prefix = kind(b'n');
    pub static QUEUE: Prefix = kind(b'q');
    pub static PUSHES: Prefix = kind(b'g');
    pub static RANKS: Prefix = kind(b'k');
    pub static SHARDS: Prefix = kind(b'h');
}

use rows::*;

pub mod col {
    pub const WANT: &[u8] = b"crawl:want";
    pub const RAW: &[u8] = b"crawl:raw";
    pub const FETCH_STATE: &[u8] = b"crawl:state";
    pub const DUE: &[u8] = b"crawl:due";
    pub const META: &[u8] = b"page:meta";
    pub const LINKS: &[u8] = b"page:links";
    pub const FOLLOW: &[u8] = b"page:follow";
    pub const HASH: &[u8] = b"page:hash";
    pub const REDIRECT: &[u8] = b"page:redirect";
    pub const CANONICAL: &[u8] = b"page:canonical";
    pub const DECLARED: &[u8] = b"page:declared";
    pub const HASH_REGISTERED: &[u8] = b"dedup:registered";
    pub const TARGET_REGISTERED: &[u8] = b"alias:done";
    pub const INDEG_DIRTY: &[u8] = b"indeg:dirty";
    pub const INDEG: &[u8] = b"indeg:indeg";
    pub const NAMES: &[u8] = b"indeg:names";
    pub const BASE: &[u8] = b"indeg:base";
    pub const EXTRA: &[u8] = b"indeg:extra";
    pub const ALIAS_OF: &[u8] = b"indeg:alias_of";
    pub const CHAIN: &[u8] = b"indeg:chain";
    pub const FOLDED: &[u8] = b"indeg:folded";
    pub const VIA: &[u8] = b"indeg:via";
    pub const ADDS: &[u8] = b"indeg:adds";
    pub const ALIAS: &[u8] = b"indeg:alias";
    pub const DELTA: &[u8] = b"indeg:delta";
    pub const CLUSTER_DIRTY: &[u8] = b"cluster:dirty";
    pub const CLUSTER_CANONICAL: &[u8] = b"cluster:canonical";
    pub const ALONE: &[u8] = b"cluster:alone";
    pub const NEAR_DIRTY: &[u8] = b"near:dirty";
    pub const NEAR_REGISTERED: &[u8] = b"near:registered";
    pub const NEAR_LIST: &[u8] = b"near:list";
    pub const BLOCK: &[u8] = b"near:block";
    pub const MEMBER: &[u8] = b"cluster:member";
    pub const EDGE: &[u8] = b"edge:anchor";
    pub const ALIAS_FROM: &[u8] = b"alias:from";
    pub const FWD_NAMES: &[u8] = b"fwd:names";
    pub const EXPORT_DIRTY: &[u8] = b"export:dirty";
    pub const EXPORT_LINE: &[u8] = b"export:line";
    pub const SCOPE: &[u8] = b"crawl:scope";
    pub const LAYOUT: &[u8] = b"crawl:layout";
    pub const SEARCH_QUEUED: &[u8] = b"search:queued";
    pub const SEARCH_GENERATION: &[u8] = b"search:generation";
    pub const RANK_DIRTY: &[u8] = b"rank:dirty";
    pub const RANK: &[u8] = b"rank:rank";
    pub const RANK_OUT: &[u8] = b"rank:out";
    pub const RANK_FOLDED: &[u8] = b"rank:folded";
    pub const PUSH: &[u8] = b"rank:push";
    pub const RESOLVE: &[u8] = b"rank:resolve";
    pub const RESOLVES: &[u8] = b"rank:resolves";
    pub const RANK_DEFERRED: &[u8] = b"rank:deferred";
    pub const RANK_CLUSTER: &[u8] = b"rank:cluster";
    pub const RANK_STATE: &[u8] = b"rank:state";
    pub const CANONICAL_BY: &[u8] = b"cluster:by";
}

pub fn page(url: &str) -> Bytes {
    Bytes::from(format!("{}{url}", PAGES.prefix()))
}

/// The URL of a page row.
pub fn url_of(row: &[u8]) -> Option<&str> {
    PAGES.key_of(row)
}

/// The row of `url`'s frontier entry and recrawl state.
pub fn fetch_row(url: &str) -> Bytes {
    Bytes::from(format!("{}{url}", FETCHES.prefix()))
}

/// The URL of a fetch row ([`fetch_row`]).
pub fn url_of_fetch(row: &[u8]) -> Option<&str> {
    FETCHES.key_of(row)
}

pub fn edge(target: &str, source: &str) -> Bytes {
    Bytes::from(format!("{}{target}\0{source}", EDGES.prefix()))
}

/// A row holding a not yet counted change of the edges from `source` into `target`, written
/// by the transaction that started at `start_ts`: unique to it, so that writing it needs no
/// conflict check (`set_unchecked`), and taken by the target's indegree run that folds it
/// (see [`crate::indegree`]).
pub fn delta(target: &str, source: &str, start_ts: u64) -> Bytes {
    Bytes::from(format!("{}{target}\0{source}\0{start_ts:016x}", DELTAS.prefix()))
}

/// The source of a change row ([`delta`]); a row of the older format (`d:<target>\0<source>`,
/// one per edge) names it as well.
pub fn delta_source(row: &[u8]) -> Option<&str> {
    let key = child_key(row)?;
    Some(key.split_once('\0').map_or(key, |(source, _)| source))
}

/// The row of a URL's rank cells: a row of its own, a few dozen bytes, since the page row
/// (its body among its cells) is rewritten whole for any cell of it by the embedded store,
/// and an update rewrites the ranks of thousands of pages.
pub fn rank_row(url: &str) -> Bytes {
    Bytes::from(format!("{}{url}", RANKS.prefix()))
}

/// The buckets of rank: a URL's pushes are rows of the bucket a byte of its blake3 picks,
/// and one run of the bucket folds them all (see [`crate::rank`]). One bucket: an update's
/// pushes reach most pages of a small web, and one run that folds them in memory costs
/// less than rounds of runs over many buckets (on one build, an update of a 1,000-page web
/// took 130 ms with one, 500 with four, 610 with sixteen); more buckets would let more
/// workers fold at once.
pub const RANK_BUCKETS: u8 = 1;

/// The rank bucket of `url`.
pub fn rank_bucket(url: &str) -> u8 {
    if RANK_BUCKETS == 1 {
        // Asked for each push: no hash when there is one bucket.
        return 0;
    }
    rank_bucket_of(blake3::hash(url.as_bytes()).as_bytes()[0])
}

/// The rank bucket of a URL whose blake3 begins with `byte`.
pub fn rank_bucket_of(byte: u8) -> u8 {
    u8::try_from(u16::from(byte) * u16::from(RANK_BUCKETS) / 256).expect("below RANK_BUCKETS")
}

/// The row of a shard of rank states (see [`crate::rank`]'s `shard`): `shard` of `bucket`.
pub fn rank_shard(bucket: u8, shard: u8) -> Bytes {
    Bytes::from(format!("{}{bucket:02x}{shard:02x}", SHARDS.prefix()))
}

/// The head row of a rank bucket: its notification and its mark.
pub fn rank_head(bucket: u8) -> Bytes {
    Bytes::from(format!("{}{bucket:02x}", PUSHES.prefix()))
}

/// The bucket a rank head row names.
pub fn rank_head_bucket(row: &[u8]) -> Option<u8> {
    let key = PUSHES.key_of(row)?;
    u8::from_str_radix(key, 16).ok().filter(|b| key.len() == 2 && *b < RANK_BUCKETS)
}

/// A row holding pushes of rank to `target` not yet folded into its `rank:in`, or the word
/// that its out-set may have changed, written by the transaction that started at
/// `start_ts` (see [`crate::rank`]).
pub fn push(target: &str, start_ts: u64) -> Bytes {
    Bytes::from(format!(
        "{}{:02x}\0{target}\0{start_ts:016x}",
        PUSHES.prefix(),
        rank_bucket(target)
    ))
}

/// The row and value of one transaction's word to resolve the out-sets of `urls` again, all
/// of `bucket` (`rank:resolves`: the URLs, a space between two, which a URL never holds),
/// named `*` and a hash of the list (no URL starts with `*`), so that two lists of one
/// transaction are two rows.
pub fn resolves(bucket: u8, urls: &[&str], start_ts: u64) -> (Bytes, Bytes) {
    let list = urls.join(" ");
    let name = blake3::hash(list.as_bytes()).to_hex();
    let row = format!("{}{bucket:02x}\0*{}\0{start_ts:016x}", PUSHES.prefix(), &name[..16]);
    (Bytes::from(row), Bytes::from(list))
}

/// The target of a push row ([`push`]).
pub fn push_target(row: &[u8]) -> Option<&str> {
    Some(child_key(row)?.rsplit_once('\0')?.0)
}

/// The row counting, for the page `end`, its aliases that `source` links to.
pub fn via(end: &str, source: &str) -> Bytes {
    Bytes::from(format!("{}{end}\0{source}", VIAS.prefix()))
}

/// The row saying that `alias` redirects, through any number of hops, to the page `end`.
pub fn alias_at(end: &str, alias: &str) -> Bytes {
    Bytes::from(format!("{}{end}\0{alias}", ALIASES.prefix()))
}

/// The row range `[start, end)` of rows `<prefix><key>\0…`.
pub fn children(kind: &'static Prefix, key: &str) -> (Vec<u8>, Vec<u8>) {
    let prefix = kind.prefix();
    (format!("{prefix}{key}\0").into_bytes(), format!("{prefix}{key}\u{1}").into_bytes())
}

/// The part of a child row after `<prefix><key>\0`.
pub fn child_key(row: &[u8]) -> Option<&str> {
    let at = row.iter().position(|b| *b == 0)?;
    std::str::from_utf8(&row[at + 1..]).ok()
}

pub fn redirect_in(target: &str, source: &str) -> Bytes {
    Bytes::from(format!("{}{target}\0{source}", REDIRECTS.prefix()))
}

/// The recrawl's due-time index row of `url`, due at `ms` (ordered by time).
pub fn due_row(ms: u64, url: &str) -> Bytes {
    Bytes::from(format!("{}{ms:016x}\0{url}", DUE.prefix()))
}

/// The due rows' range up to and including `ms`.
pub fn due_until(ms: u64) -> (Vec<u8>, Vec<u8>) {
    (DUE.start().to_vec(), format!("{}{ms:016x}\u{1}", DUE.prefix()).into_bytes())
}

pub fn cluster_head(hash: &str) -> Bytes {
    Bytes::from(format!("{}{hash}", CLUSTERS.prefix()))
}

pub fn member(hash: &str, url: &str) -> Bytes {
    Bytes::from(format!("{}{hash}\0{url}", CLUSTERS.prefix()))
}

/// The four band-index rows of a simhash: one per 16-bit block, so that clusters within 3
/// bits share at least one (spec §6.4a).
pub fn blocks(simhash: u64) -> [Bytes; 4] {
    std::array::from_fn(|b| {
        Bytes::from(format!("{}{b}{:04x}", BANDS.prefix(), (simhash >> (16 * b)) & 0xffff))
    })
}

/// One cluster in a `near:block` cell: its hash, simhash and canonical URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockEntry {
    pub hash: String,
    pub simhash: u64,
    pub canonical: String,
}

impl BlockEntry {
    /// `"<simhash> <canonical>"`: the entry as the head's `near:registered` keeps it.
    pub fn registered(&self) -> String {
        format!("{} {}", simhash_hex(self.simhash), self.canonical)
    }

    /// The entry of cluster `hash` that `near:registered` describes.
    pub fn from_registered(hash: &str, raw: &[u8]) -> Option<BlockEntry> {
        let text = std::str::from_utf8(raw).ok()?;
        let (simhash, canonical) = text.split_once(' ')?;
        Some(BlockEntry {
            hash: hash.to_string(),
            simhash: parse_simhash(simhash.as_bytes())?,
            canonical: canonical.to_string(),
        })
    }
}

/// The entries of a `near:block` cell (lines `"<hash> <simhash> <canonical>"`, by hash).
pub fn block_entries(raw: &[u8]) -> Vec<BlockEntry> {
    let text = String::from_utf8_lossy(raw);
    text.lines()
        .filter_map(|line| {
            let (hash, rest) = line.split_once(' ')?;
            BlockEntry::from_registered(hash, rest.as_bytes())
        })
        .collect()
}

/// A `near:block` cell's value for `entries` (sorted by hash), `None` when there are none.
pub fn block_value(entries: &[BlockEntry]) -> Option<Bytes> {
    if entries.is_empty() {
        return None;
    }
    let mut out = String::new();
    for e in entries {
        out.push_str(&e.hash);
        out.push(' ');
        out.push_str(&e.registered());
        out.push('\n');
    }
    Some(Bytes::from(out))
}

pub fn simhash_hex(simhash: u64) -> String {
    format!("{simhash:016x}")
}

pub fn parse_simhash(hex: &[u8]) -> Option<u64> {
    u64::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok().filter(|_| hex.len() == 16)
}

pub const CONFIG_ROW: &[u8] = b"m:config";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edge_of_two_urls_at_the_pair_limit_fits_the_store_key_limit() {
        let target = "t".repeat(perc_crawl::urls::PAIR_BYTES_MAX / 2);
        let source = "s".repeat(perc_crawl::urls::PAIR_BYTES_MAX - target.len());
        assert_eq!(edge(&target, &source).len(), perc_store::ROW_KEY_BYTES_MAX);
    }
}
