//! Configuration: the embedded `config/default.toml`, then a file, then `PERC_*` environment
//! variables, then `--set section.key=value` flags; later ones win. Unknown sections or keys
//! (`PERC_*` variables included), values of the wrong type and values out of their range are
//! errors that name the key, the value and where it came from.

/// A configuration that cannot be used; the message names the key, the value and where it
/// came from.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

type Result<T, E = ConfigError> = std::result::Result<T, E>;

/// A [`ConfigError`] from a format string.
macro_rules! bad {
    ($($arg:tt)*) => { ConfigError(format!($($arg)*)) };
}

macro_rules! bail {
    ($($arg:tt)*) => { return Err(bad!($($arg)*)) };
}
use serde::Deserialize;
use toml::Value;

pub const DEFAULT: &str = include_str!("../../../config/default.toml");

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub store: Store,
    pub bigtable: Bigtable,
    pub oracle: Oracle,
    pub crawl: Crawl,
    pub workers: perc_notify::NotifyConfig,
    pub txn: Txn,
    pub recrawl: Recrawl,
    pub index: Index,
    pub serve: Serve,
    pub search: Search,
}

/// The search index of `perc serve` and `perc search` (docs/serve.md, "Search").
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Search {
    /// Whether `perc serve` keeps a search index (in `DATA/search`) and answers /v1/search.
    pub enabled: bool,
    /// How often the indexer looks at the search queue, and the most rows it takes in one
    /// transaction.
    pub tick_ms: u64,
    pub batch: u64,
    /// The most hits one query may ask for.
    pub limit_max: u64,
    /// The longest query accepted, and the most groups and NOTs it may hold: the query
    /// language's parser recurses on both, so a query of thousands would overflow a thread's
    /// stack (perc_search::QueryLimits).
    pub query_bytes_max: u64,
    pub query_nesting_max: u64,
    /// The most search queue rows kept when nothing drains them; beyond, the queue is
    /// emptied, and an index built before it is built again when it next catches up.
    pub queue_max: u64,
}

/// How the observers bound their work.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Index {
    /// The most inlink changes one in-degree run of a page folds (the rest: the next run).
    pub indegree_fold_max: u64,
    /// What a cluster's canonical is chosen by after the votes: `indegree` or `pagerank`.
    pub canonical_by: perc_observers::cluster::CanonicalBy,
}

/// When a fetched URL is fetched again by `perc serve` (docs/serve.md, "Recrawl").
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recrawl {
    /// The first interval, and its bounds: a change halves it, none doubles it.
    pub interval_s: u64,
    pub min_interval_s: u64,
    pub max_interval_s: u64,
    /// How often the scheduler looks for URLs that are due, and the most it asks for at once.
    pub tick_ms: u64,
    pub batch: u64,
    /// Back-pressure: the scheduler keeps the oldest pending notification younger than
    /// `pending_age_s` (see `pace`), and never lets more than `pending_max` wait.
    pub pending_age_s: u64,
    pub pending_max: u64,
    /// Intervals of URL prefixes (`[[recrawl.prefix]]`): the longest that contains a URL
    /// gives it the intervals it sets; the ones it leaves out are the global ones.
    pub prefix: Vec<RecrawlPrefix>,
}

/// One `[[recrawl.prefix]]` table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecrawlPrefix {
    pub prefix: String,
    pub interval_s: Option<u64>,
    pub min_interval_s: Option<u64>,
    pub max_interval_s: Option<u64>,
}

impl Recrawl {
    /// The schedule the fetch observer follows; an error naming a prefix that is not an
    /// absolute http(s) URL, an interval of 0, or a minimum above a maximum.
    pub fn schedule(&self) -> Result<perc_observers::model::Schedule> {
        use perc_observers::model::{Recrawl as Intervals, Schedule};
        let check = |what: &str, r: Intervals| -> Result<Intervals> {
            for (key, v) in [
                ("interval_s", r.interval_s),
                ("min_interval_s", r.min_interval_s),
                ("max_interval_s", r.max_interval_s),
            ] {
                if v == 0 {
                    bail!("{what}: {key} = 0 is out of range: it must be at least 1");
                }
            }
            if r.min_interval_s > r.max_interval_s {
                bail!(
                    "{what}: min_interval_s = {} is above max_interval_s = {}",
                    r.min_interval_s,
                    r.max_interval_s
                );
            }
            Ok(r)
        };
        let default = check(
            "recrawl",
            Intervals {
                interval_s: self.interval_s,
                min_interval_s: self.min_interval_s,
                max_interval_s: self.max_interval_s,
            },
        )?;
        let mut prefixes = Vec::new();
        for p in &self.prefix {
            let what = format!("recrawl.prefix {:?}", p.prefix);
            let prefix = perc_crawl::Prefix::parse(&p.prefix).map_err(|e| bad!("{what}: {e}"))?;
            if prefixes.iter().any(|(q, _)| *q == prefix) {
                bail!("{what}: the prefix is given twice");
            }
            let intervals = Intervals {
                interval_s: p.interval_s.unwrap_or(default.interval_s),
                min_interval_s: p.min_interval_s.unwrap_or(default.min_interval_s),
                max_interval_s: p.max_interval_s.unwrap_or(default.max_interval_s),
            };
            prefixes.push((prefix, check(&what, intervals)?));
        }
        Ok(Schedule { default, prefixes })
    }
}

/// `perc serve`: where it listens and what it accepts (docs/serve.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Serve {
    /// `host:port` (also --listen); port 0 picks a free one.
    pub listen: String,
    /// The largest request body, and the longest query string, accepted.
    pub body_bytes_max: u64,
    /// A request that takes longer is answered 408.
    pub request_timeout_ms: u64,
    /// How long a stop waits for the requests in flight.
    pub shutdown_ms: u64,
    /// A connection that sends no whole request head within this (a slow one, or one idle
    /// between requests) is closed.
    pub header_timeout_ms: u64,
    /// Connections open at once; one more is closed as soon as it is accepted.
    pub connections_max: usize,
    /// Exports streamed at once (`GET /v1/export`); one more is answered 503.
    pub exports_max: usize,
    /// A client that takes none of an answer's bytes for this long is cut off.
    pub stall_ms: u64,
    /// Threads that answer the API (beside the observers' and the crawler's).
    pub api_threads: usize,
    /// How many nice steps the threads that index (observers, fetches, the search
    /// indexer) run below the API's: a request is answered before a page is parsed when
    /// the cores are busy; 0 gives them the API's priority.
    pub indexing_nice: i32,
    /// The bearer token of the write endpoints; empty: the one in DATA/serve.token (made
    /// at the first start). Listening beyond loopback needs one set here.
    pub token: String,
    /// `Host` names the API answers to besides its own loopback names (see perc-serve).
    pub hosts: Vec<String>,
}

/// Which store backend: the embedded one, or Cloud Bigtable shared by many processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Sled,
    Bigtable,
    /// Nothing touches disk: the index lives as long as the process (throwaway runs,
    /// `perc replay --expect`).
    Memory,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Store {
    pub backend: Backend,
    pub data: String,
    pub cache_bytes: u64,
    /// The zstd level sled compresses its log with, 0 for none (a new store only: an existing
    /// one keeps whether it compresses).
    pub zstd_level: i64,
    /// Merged batches of unconditional writes in flight at once (`perc_store::Coalesced`).
    pub write_lanes: usize,
}

/// Where the Bigtable table is (for `store.backend = "bigtable"`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bigtable {
    pub project: String,
    pub instance: String,
    pub table: String,
    /// `host:port` of a Bigtable emulator; empty: Cloud Bigtable, with Application Default
    /// Credentials.
    pub emulator: String,
    pub channels: usize,
    pub timeout_ms: u64,
    /// How long opening waits for a table that cannot be reached yet (an emulator or a
    /// network still starting), trying again with backoff.
    pub connect_for_ms: u64,
}

/// The timestamp oracle: in this process, or a `perc oracle` server.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Oracle {
    /// `host:port` of `perc oracle`; empty: the oracle runs in this process (embedded mode).
    pub server: String,
    /// How long a client keeps reconnecting to a server that went away.
    pub reconnect_for_ms: u64,
    /// Timestamps an embedded oracle reserves per durable write of its high-water mark.
    pub block: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Crawl {
    pub user_agent: String,
    pub max_depth: u32,
    pub max_redirects: u32,
    pub max_pages: u64,
    pub body_bytes_max: u64,
    pub connect_timeout_ms: u64,
    pub total_timeout_ms: u64,
    pub concurrency_max: usize,
    /// Requests in flight to one host that asks for no delay (spec §6.2: one by default).
    pub per_host: usize,
    pub host_delay_ms: u64,
    pub delay_cap_ms: u64,
    pub robots_ttl_ms: u64,
    pub robots_retry_ms: u64,
    pub robots_attempts: u32,
    /// How long a host whose robots.txt cannot be had is left alone before it is tried
    /// again (doubled for each give-up in a row, up to `robots_ttl_ms`).
    pub robots_give_up_ms: u64,
    pub prefixes: Vec<String>,
    pub seeds_max: u64,
    /// Crawl the URLs of the sitemaps the seeds' robots.txt files name (spec §6.1).
    pub sitemaps: bool,
    /// The most in-scope URLs taken from the sitemaps of one list of seeds.
    pub sitemap_urls_max: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Txn {
    pub lock_ttl_ms: u64,
    pub liveness_ttl_ms: u64,
}

impl Config {
    /// The embedded defaults alone (`config/default.toml`).
    pub fn defaults() -> Config {
        load(None, &[], &[]).expect("the embedded defaults are valid")
    }
}

/// A config file's text as TOML. An error names the line and column and says what is
/// wrong, without quoting the line: it may hold a secret (`serve.token`).
fn parse_toml(text: &str, origin: &str) -> Result<Value> {
    text.parse::<Value>().map_err(|e| {
        let at = e.span().map_or(String::new(), |span| {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!(" at line {line}, column {column}")
        });
        bad!("{origin}: not valid TOML{at}: {}", e.message().trim())
    })
}

/// Where each key's value came from, for error messages.
type Origins = std::collections::HashMap<String, String>;

/// Merges `over` into `base`, refusing keys `base` does not have.
fn merge(
    base: &mut Value,
    over: Value,
    origin: &str,
    path: &str,
    origins: &mut Origins,
) -> Result<()> {
    match (base, over) {
        (Value::Table(b), Value::Table(o)) => {
            for (k, v) in o {
                let key = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                if !b.contains_key(&k) {
                    let section = (!path.is_empty()).then_some(path);
                    return Err(unknown(origin, &key, b.keys(), section));
                }
                let slot = b.get_mut(&k).expect("present");
                merge(slot, v, origin, &key, origins)?;
            }
            Ok(())
        }
        (b, o) => {
            if std::mem::discriminant(b) != std::mem::discriminant(&o) {
                // The value is quoted, but for a secret's.
                if path.ends_with("token") {
                    bail!("{origin}: {path} must be a {}", b.type_str());
                }
                bail!("{origin}: {path} must be a {}, not {o}", b.type_str());
            }
            *b = o;
            origins.insert(path.to_string(), origin.to_string());
            Ok(())
        }
    }
}

/// The error for an unknown key, naming the closest known one when there is a close one.
/// `known` are full keys, or, when `section` is given, the names in that section.
fn unknown<'a>(
    origin: &str,
    key: &str,
    known: impl Iterator<Item = &'a String>,
    section: Option<&str>,
) -> ConfigError {
    let flat = key.to_ascii_lowercase().replace('_', ".");
    if let Some((old, new)) = RENAMED.iter().find(|(old, _)| old.replace('_', ".") == flat) {
        return bad!("{origin}: {old} is now {new}");
    }
    let last = match section {
        Some(s) => key.strip_prefix(s).and_then(|k| k.strip_prefix('.')).unwrap_or(key),
        None => key,
    };
    let closest = known
        .map(|k| (edit_distance(&last.to_ascii_lowercase(), &k.to_ascii_lowercase()), k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4))
        .min();
    match closest {
        Some((_, k)) => {
            let fixed = section.map_or_else(|| k.clone(), |s| format!("{s}.{k}"));
            bad!("{origin}: unknown configuration key {key:?} (did you mean {fixed:?}?)")
        }
        None => bad!("{origin}: unknown configuration key {key:?}"),
    }
}

/// Keys whose values are lists of tables: a file sets them, a variable or a flag cannot.
const TABLES: &[&str] = &["recrawl.prefix"];

/// Keys that moved, with where they are now.
const RENAMED: &[(&str, &str)] = &[("txn.oracle_block", "oracle.block")];

/// Levenshtein distance, for suggestions.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(row[j + 1] + 1);
            prev = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// The allowed range of every integer key: a value outside it would hang, spin or divide by
/// zero somewhere, or make no sense. Checked once, when the configuration loads.
const RANGES: &[(&str, i64, i64)] = &[
    ("store.cache_bytes", 1 << 20, i64::MAX),
    ("store.zstd_level", 0, 22),
    ("store.write_lanes", 1, 1024),
    ("bigtable.channels", 1, 256),
    ("bigtable.timeout_ms", 1, i64::MAX),
    ("bigtable.connect_for_ms", 0, i64::MAX),
    ("oracle.reconnect_for_ms", 0, i64::MAX),
    ("crawl.max_depth", 0, 10_000),
    ("crawl.max_redirects", 0, 100),
    ("crawl.max_pages", 0, i64::MAX),
    ("crawl.body_bytes_max", 1024, 1 << 30),
    ("crawl.connect_timeout_ms", 1, i64::MAX),
    ("crawl.total_timeout_ms", 1, i64::MAX),
    ("crawl.concurrency_max", 1, 10_000),
    ("crawl.per_host", 1, 1_000),
    ("crawl.host_delay_ms", 0, i64::MAX),
    ("crawl.delay_cap_ms", 0, i64::MAX),
    ("crawl.robots_ttl_ms", 1, i64::MAX),
    ("crawl.robots_retry_ms", 0, i64::MAX),
    ("crawl.robots_attempts", 1, 100),
    ("crawl.robots_give_up_ms", 1, i64::MAX),
    ("crawl.sitemap_urls_max", 0, i64::MAX),
    ("crawl.seeds_max", 1, i64::MAX),
    ("workers.scanners", 0, 1024),
    ("workers.concurrency", 1, 100_000),
    ("workers.io_concurrency", 1, 100_000),
    ("workers.scan_batch", 1, 1_000_000),
    ("workers.conflict_retries", 0, 1_000_000),
    ("workers.failures_max", 1, 1_000_000),
    ("workers.failure_backoff_ms", 0, i64::MAX),
    ("workers.idle_ms", 1, i64::MAX),
    ("workers.idle_max_ms", 1, i64::MAX),
    ("workers.report_ms", 0, i64::MAX),
    ("workers.gather_ms", 0, i64::MAX),
    ("workers.lease_ttl_ms", 100, i64::MAX),
    ("workers.gc_interval_ms", 0, i64::MAX),
    ("workers.seed", 0, i64::MAX),
    ("txn.lock_ttl_ms", 100, i64::MAX),
    ("txn.liveness_ttl_ms", 100, i64::MAX),
    ("oracle.block", 1, i64::MAX),
    ("recrawl.interval_s", 1, i64::MAX),
    ("recrawl.min_interval_s", 1, i64::MAX),
    ("recrawl.max_interval_s", 1, i64::MAX),
    ("recrawl.tick_ms", 1, i64::MAX),
    ("recrawl.batch", 1, 1_000_000),
    ("recrawl.pending_max", 1, 10_000_000),
    ("recrawl.pending_age_s", 1, 86_400),
    ("serve.body_bytes_max", 1024, 1 << 30),
    ("serve.request_timeout_ms", 1, i64::MAX),
    ("serve.shutdown_ms", 0, i64::MAX),
    ("serve.header_timeout_ms", 1, i64::MAX),
    ("serve.connections_max", 1, 1_000_000),
    ("serve.exports_max", 1, 1_000),
    ("serve.stall_ms", 1, i64::MAX),
    ("serve.api_threads", 1, 256),
    ("serve.indexing_nice", 0, 19),
    ("index.indegree_fold_max", 1, 1 << 30),
    ("search.tick_ms", 1, i64::MAX),
    ("search.batch", 1, 1_000_000),
    ("search.limit_max", 1, 10_000),
    ("search.query_bytes_max", 1, 65_536),
    ("search.query_nesting_max", 0, 64),
    ("search.queue_max", 0, i64::MAX),
];

fn check_ranges(root: &Value, origins: &Origins) -> Result<()> {
    for (key, min, max) in RANGES {
        let (section, name) = key.split_once('.').expect("section.key");
        let Some(v) = root.get(section).and_then(|s| s.get(name)).and_then(Value::as_integer)
        else {
            continue;
        };
        if v < *min || v > *max {
            let origin = origins.get(*key).map_or("config/default.toml", String::as_str);
            let range = if *max == i64::MAX {
                format!("at least {min}")
            } else {
                format!("{min} to {max}")
            };
            bail!("{origin}: {key} = {v} is out of range: it must be {range}");
        }
    }
    Ok(())
}

/// Parses a command-line or environment value as the type the key already has.
fn typed(like: &Value, raw: &str, origin: &str, key: &str) -> Result<Value> {
    let bad = || match key.ends_with("token") {
        true => bad!("{origin}: {key} must be a {}", like.type_str()),
        false => bad!("{origin}: {key} must be a {}, not {raw:?}", like.type_str()),
    };
    if TABLES.contains(&key) {
        bail!("{origin}: {key} is a list of tables ([[{key}]]): set it in a config file");
    }
    Ok(match like {
        Value::String(_) => Value::String(raw.to_string()),
        Value::Integer(_) => Value::Integer(raw.trim().parse().map_err(|_| bad())?),
        Value::Boolean(_) => Value::Boolean(raw.trim().parse().map_err(|_| bad())?),
        Value::Array(_) => Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.to_string()))
                .collect(),
        ),
        _ => return Err(bad()),
    })
}

fn set_key(
    root: &mut Value,
    key: &str,
    raw: &str,
    origin: &str,
    origins: &mut Origins,
) -> Result<()> {
    let (section, name) =
        key.split_once('.').ok_or_else(|| bad!("{origin}: {key:?} is not section.key"))?;
    if root.get(section).and_then(|s| s.get(name)).is_none() {
        let all: Vec<String> =
            all_keys(root).into_iter().map(|(s, k)| format!("{s}.{k}")).collect();
        return Err(unknown(origin, key, all.iter(), None));
    }
    let slot = root.get_mut(section).and_then(|s| s.get_mut(name)).expect("checked above");
    *slot = typed(slot, raw, origin, key)?;
    origins.insert(key.to_string(), origin.to_string());
    Ok(())
}

/// Every (section, key) of the configuration tree.
fn all_keys(root: &Value) -> Vec<(String, String)> {
    root.as_table()
        .into_iter()
        .flat_map(|t| t.iter())
        .flat_map(|(section, v)| {
            v.as_table()
                .into_iter()
                .flat_map(|t| t.keys())
                .map(move |k| (section.clone(), k.clone()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Builds the configuration from the layers.
pub fn load(
    file: Option<&std::path::Path>,
    env: &[(String, String)],
    sets: &[String],
) -> Result<Config> {
    let mut root = parse_toml(DEFAULT, "config/default.toml")?;
    let mut origins = Origins::new();
    if let Some(path) = file {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad!("cannot read the config file {origin}: {e}"))?;
        merge(&mut root, parse_toml(&text, &origin)?, &origin, "", &mut origins)?;
    }
    // PERC_<SECTION>_<KEY>: matched against the keys that exist, so names stay exact; any
    // other PERC_ variable is a misspelt key (the binary's own variables are listed).
    let keys = all_keys(&root);
    for (name, value) in env {
        let Some(rest) = name.strip_prefix("PERC_") else { continue };
        if NOT_CONFIG.contains(&name.as_str()) {
            continue;
        }
        let origin = format!("environment variable {name}");
        match keys.iter().find(|(s, k)| format!("{s}_{k}").eq_ignore_ascii_case(rest)) {
            Some((section, key)) => {
                set_key(&mut root, &format!("{section}.{key}"), value, &origin, &mut origins)?
            }
            None => {
                let known: Vec<String> =
                    keys.iter().map(|(s, k)| format!("{s}_{k}").to_ascii_uppercase()).collect();
                let mut e = unknown(&origin, rest, known.iter(), None).to_string();
                e.push_str(" (PERC_<SECTION>_<KEY> sets a configuration key)");
                return Err(ConfigError(e));
            }
        }
    }
    for s in sets {
        let (key, value) =
            s.split_once('=').ok_or_else(|| bad!("--set {s:?}: expected section.key=value"))?;
        set_key(&mut root, key.trim(), value, &format!("--set {key}"), &mut origins)?;
    }
    check_ranges(&root, &origins)?;
    // A value of the wrong type is quoted in serde's message: not the token's.
    let mut config: Config = root.try_into().map_err(|e: toml::de::Error| match e.message() {
        m if m.contains("token") => bad!("configuration: serve.token must be a string"),
        _ => bad!("configuration: {e}"),
    })?;
    config.recrawl.schedule()?;
    // However it was set (a file, PERC_STORE_DATA, --set, --data), `:memory:` names no
    // directory but the memory store.
    if config.store.data == MEMORY {
        config.store.backend = Backend::Memory;
    }
    Ok(config)
}

/// What `store.data` (and `--data`) names for a store in memory.
pub const MEMORY: &str = ":memory:";

/// `PERC_` variables that are not configuration keys: the tests' and tools' own.
const NOT_CONFIG: &[&str] =
    &["PERC_CBTEMULATOR", "PERC_SEED", "PERC_SEEDS", "PERC_KILL9_CHILD_DIR", "PERC_KILL9_FIRST"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_data_selects_the_memory_store_from_any_layer() {
        let env = vec![("PERC_STORE_DATA".to_string(), MEMORY.to_string())];
        assert_eq!(load(None, &env, &[]).unwrap().store.backend, Backend::Memory);
        let set = load(None, &[], &[format!("store.data={MEMORY}")]).unwrap();
        assert_eq!(set.store.backend, Backend::Memory);
        assert_eq!(load(None, &[], &[]).unwrap().store.backend, Backend::Sled);
    }

    #[test]
    fn layers_and_errors() {
        let c = load(None, &[], &[]).unwrap();
        assert_eq!(c.crawl.max_depth, 20);
        let env = vec![
            ("PERC_CRAWL_MAX_DEPTH".to_string(), "3".to_string()),
            ("HOME".into(), "/x".into()),
        ];
        let c = load(
            None,
            &env,
            &["workers.scanners=7".into(), "crawl.prefixes=http://a/,http://b/".into()],
        )
        .unwrap();
        assert_eq!((c.crawl.max_depth, c.workers.scanners), (3, 7));
        assert_eq!(c.crawl.prefixes, vec!["http://a/", "http://b/"]);
        let e = load(None, &[], &["crawl.max_dpth=3".into()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--set crawl.max_dpth: unknown configuration key \"crawl.max_dpth\" (did you mean \"crawl.max_depth\"?)"
        );
        let e = load(None, &[("PERC_CRAWL_MAX_DEPTH".into(), "deep".into())], &[]).unwrap_err();
        assert_eq!(e.to_string(), "environment variable PERC_CRAWL_MAX_DEPTH: crawl.max_depth must be a integer, not \"deep\"");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("bad.toml");
        std::fs::write(&f, "[crawl]\nmax_depth = \"x\"\n").unwrap();
        let e = load(Some(&f), &[], &[]).unwrap_err();
        assert!(e.to_string().ends_with("crawl.max_depth must be a integer, not \"x\""), "{e}");
        std::fs::write(&f, "[crawl\n").unwrap();
        assert!(load(Some(&f), &[], &[]).unwrap_err().to_string().contains("not valid TOML"));
        std::fs::write(&f, "[nosuch]\nx = 1\n").unwrap();
        assert!(load(Some(&f), &[], &[])
            .unwrap_err()
            .to_string()
            .contains("unknown configuration key \"nosuch\""));
    }

    #[test]
    fn out_of_range_values_name_key_value_range_and_origin() {
        for (set, want) in [
            (
                "oracle.block=0",
                "--set oracle.block: oracle.block = 0 is out of range: it must be at least 1",
            ),
            ("txn.oracle_block=5", "--set txn.oracle_block: txn.oracle_block is now oracle.block"),
            (
                "store.cache_bytes=0",
                "store.cache_bytes = 0 is out of range: it must be at least 1048576",
            ),
            (
                "workers.scan_batch=0",
                "workers.scan_batch = 0 is out of range: it must be 1 to 1000000",
            ),
            ("crawl.concurrency_max=0", "crawl.concurrency_max = 0 is out of range"),
        ] {
            let e = load(None, &[], &[set.to_string()]).unwrap_err().to_string();
            assert!(e.contains(want), "{set}: {e}");
        }
        let env = [("PERC_WORKERS_IDLE_MS".to_string(), "0".to_string())];
        let e = load(None, &env, &[]).unwrap_err().to_string();
        assert_eq!(e, "environment variable PERC_WORKERS_IDLE_MS: workers.idle_ms = 0 is out of range: it must be at least 1");
        let dir = tempfile::tempdir().unwrap();
        // A secret's value is never quoted back, whatever is wrong with it.
        let load_str = |text: &str| {
            let f = dir.path().join("secret.toml");
            std::fs::write(&f, text).unwrap();
            load(Some(&f), &[], &[]).unwrap_err().to_string()
        };
        let e = load_str("[serve]\ntoken = 12345\n");
        assert!(!e.contains("12345") && e.contains("serve.token must be a string"), "{e}");
        let e = load_str("[serve]\ntoken = secret-value\n");
        assert!(!e.contains("secret-value") && e.contains("at line 2, column 9"), "{e}");
        let f = dir.path().join("c.toml");
        std::fs::write(&f, "[workers]\nconcurrency = 0\n").unwrap();
        let e = load(Some(&f), &[], &[]).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}: workers.concurrency = 0", f.display())), "{e}");
    }

    #[test]
    fn misspelt_keys_and_variables_are_errors_naming_the_closest_key() {
        let env = [("PERC_CRAWL_MAX_DEPHT".to_string(), "3".to_string())];
        let e = load(None, &env, &[]).unwrap_err().to_string();
        assert!(
            e.starts_with("environment variable PERC_CRAWL_MAX_DEPHT: unknown configuration key"),
            "{e}"
        );
        assert!(e.contains("did you mean \"CRAWL_MAX_DEPTH\"?"), "{e}");
        let e = load(None, &[], &["crawl.max_dept=3".into()]).unwrap_err().to_string();
        assert!(e.contains("did you mean \"crawl.max_depth\"?"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.toml");
        std::fs::write(&f, "[crawl]\nuser_agnet = \"x\"\n").unwrap();
        let e = load(Some(&f), &[], &[]).unwrap_err().to_string();
        assert!(e.contains("unknown configuration key \"crawl.user_agnet\" (did you mean \"crawl.user_agent\"?)"), "{e}");
        // The tests' own variables are not configuration.
        assert!(load(None, &[("PERC_SEED".into(), "4".into())], &[]).is_ok());
    }

    #[test]
    fn recrawl_prefixes_give_their_urls_intervals_and_bad_ones_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.toml");
        let with = |tables: &str| {
            std::fs::write(&f, format!("[recrawl]\ninterval_s = 1000\n{tables}")).unwrap();
            load(Some(&f), &[], &[]).map(|c| c.recrawl.schedule().unwrap())
        };
        let s = with(
            "[[recrawl.prefix]]\nprefix = \"http://h.test/news\"\nmin_interval_s = 60\n\
             [[recrawl.prefix]]\nprefix = \"http://h.test/news/live/\"\ninterval_s = 90\n",
        )
        .unwrap();
        let at = |u: &str| *s.for_url(&url::Url::parse(u).unwrap());
        let (news, live, rest) =
            (at("http://h.test/news/a"), at("http://h.test/news/live/b"), at("http://h.test/x"));
        assert_eq!(
            (news.interval_s, news.min_interval_s, news.max_interval_s),
            (1000, 60, 2592000)
        );
        assert_eq!((live.interval_s, live.min_interval_s), (90, 3600), "the longest prefix wins");
        assert_eq!((rest.interval_s, rest.min_interval_s), (1000, 3600));
        assert_eq!(at("http://h.test/newsletter").interval_s, 1000, "a segment boundary");
        assert_eq!(at("https://h.test/news/a").min_interval_s, 3600, "another origin");
        for (tables, want) in [
            ("[[recrawl.prefix]]\nprefix = \"news/\"\n", "recrawl.prefix \"news/\": the scope prefix \"news/\" is not an absolute http(s) URL"),
            ("[[recrawl.prefix]]\nprefix = \"http://h.test/\"\nmin_interval_s = 9999999\n", "recrawl.prefix \"http://h.test/\": min_interval_s = 9999999 is above max_interval_s = 2592000"),
            ("[[recrawl.prefix]]\nprefix = \"http://h.test/\"\ninterval_s = 0\n", "interval_s = 0 is out of range"),
            ("[[recrawl.prefix]]\nprefix = \"http://h.test/a\"\n[[recrawl.prefix]]\nprefix = \"http://h.test/a\"\n", "the prefix is given twice"),
            ("[[recrawl.prefix]]\nprefix = \"http://h.test/\"\nintervl_s = 5\n", "unknown field `intervl_s`"),
        ] {
            let e = with(tables).unwrap_err().to_string();
            assert!(e.contains(want), "{tables}: {e}");
        }
        let e = load(None, &[], &["recrawl.prefix=http://h.test/".into()]).unwrap_err();
        assert_eq!(e.to_string(), "--set recrawl.prefix: recrawl.prefix is a list of tables ([[recrawl.prefix]]): set it in a config file");
    }

    #[test]
    fn the_test_config_only_names_known_keys() {
        let test =
            std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/test.toml"));
        let c = load(Some(test), &[], &[]).unwrap();
        assert_eq!(c.workers.scan_batch, 16);
    }
}
