//! Configuration: the embedded `config/default.toml`, then a file, then `PERC_*` environment
//! variables, then `--set section.key=value` flags; later ones win. Unknown sections or keys
//! and values of the wrong type are errors that name the key and where it came from.

use anyhow::{anyhow, bail, Context, Result};
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
}

/// Which store backend: the embedded one, or Cloud Bigtable shared by many processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Sled,
    Bigtable,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Store {
    pub backend: Backend,
    pub data: String,
    pub cache_bytes: u64,
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
}

/// The timestamp oracle: in this process, or a `perc oracle` server.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Oracle {
    /// `host:port` of `perc oracle`; empty: the oracle runs in this process (embedded mode).
    pub server: String,
    /// How long a client keeps reconnecting to a server that went away.
    pub reconnect_for_ms: u64,
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
    pub host_delay_ms: u64,
    pub delay_cap_ms: u64,
    pub robots_ttl_ms: u64,
    pub robots_retry_ms: u64,
    pub prefixes: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Txn {
    pub lock_ttl_ms: u64,
    pub liveness_ttl_ms: u64,
    pub oracle_block: u64,
}

fn parse_toml(text: &str, origin: &str) -> Result<Value> {
    text.parse::<Value>().map_err(|e| anyhow!("{origin}: not valid TOML: {e}"))
}

/// Merges `over` into `base`, refusing keys `base` does not have.
fn merge(base: &mut Value, over: Value, origin: &str, path: &str) -> Result<()> {
    match (base, over) {
        (Value::Table(b), Value::Table(o)) => {
            for (k, v) in o {
                let key = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                let slot = b
                    .get_mut(&k)
                    .ok_or_else(|| anyhow!("{origin}: unknown configuration key {key:?}"))?;
                merge(slot, v, origin, &key)?;
            }
            Ok(())
        }
        (b, o) => {
            if std::mem::discriminant(b) != std::mem::discriminant(&o) {
                bail!("{origin}: {path} must be a {}, not {o}", b.type_str());
            }
            *b = o;
            Ok(())
        }
    }
}

/// Parses a command-line or environment value as the type the key already has.
fn typed(like: &Value, raw: &str, origin: &str, key: &str) -> Result<Value> {
    let bad = || anyhow!("{origin}: {key} must be a {}, not {raw:?}", like.type_str());
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

fn set_key(root: &mut Value, key: &str, raw: &str, origin: &str) -> Result<()> {
    let (section, name) =
        key.split_once('.').ok_or_else(|| anyhow!("{origin}: {key:?} is not section.key"))?;
    let slot = root
        .get_mut(section)
        .and_then(|s| s.get_mut(name))
        .ok_or_else(|| anyhow!("{origin}: unknown configuration key {key:?}"))?;
    *slot = typed(slot, raw, origin, key)?;
    Ok(())
}

/// Builds the configuration from the layers.
pub fn load(
    file: Option<&std::path::Path>,
    env: &[(String, String)],
    sets: &[String],
) -> Result<Config> {
    let mut root = parse_toml(DEFAULT, "config/default.toml")?;
    if let Some(path) = file {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the config file {origin}"))?;
        merge(&mut root, parse_toml(&text, &origin)?, &origin, "")?;
    }
    // PERC_<SECTION>_<KEY>: matched against the keys that exist, so names stay exact.
    let keys: Vec<(String, String)> = root
        .as_table()
        .into_iter()
        .flat_map(|t| t.iter())
        .flat_map(|(section, v)| {
            v.as_table()
                .into_iter()
                .flat_map(|t| t.keys())
                .map(move |k| (section.clone(), k.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    for (name, value) in env {
        let Some(rest) = name.strip_prefix("PERC_") else { continue };
        if let Some((section, key)) =
            keys.iter().find(|(s, k)| format!("{s}_{k}").eq_ignore_ascii_case(rest))
        {
            set_key(
                &mut root,
                &format!("{section}.{key}"),
                value,
                &format!("environment variable {name}"),
            )?;
        }
    }
    for s in sets {
        let (key, value) =
            s.split_once('=').ok_or_else(|| anyhow!("--set {s:?}: expected section.key=value"))?;
        set_key(&mut root, key.trim(), value, &format!("--set {key}"))?;
    }
    root.try_into().map_err(|e: toml::de::Error| anyhow!("configuration: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            "--set crawl.max_dpth: unknown configuration key \"crawl.max_dpth\""
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
    fn the_test_config_only_names_known_keys() {
        let test =
            std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/test.toml"));
        let c = load(Some(test), &[], &[]).unwrap();
        assert_eq!(c.workers.scan_batch, 16);
    }
}
