//! The CLI on a store that `perc serve` holds (docs/serve.md, "The CLI on a served store").
//! sled admits one process, so while a server runs, `perc status|canonical|page|export|
//! search|refetch|crawl --seeds` on its store ask its API instead of failing on the lock:
//! the server wrote where it listens in `DATA/serve.json`, and the write endpoints' token
//! is `serve.token` or `DATA/serve.token`. The reads answer what the same command answers
//! on the store; `refetch` and `crawl` hand the work to the server and return at once.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use perc_pipeline::{config, PipelineError};
use url::Url;

use crate::args::Command;
use crate::files::{Exported, Replacement};
use crate::input::{parse_url, read_seeds, search_limit};
use crate::local::print_hits;

/// A running `perc serve` on this store.
pub struct Served {
    base: String,
    http: reqwest::Client,
    token: Option<String>,
}

/// An answer of the server: its status and body.
pub struct Answer {
    pub status: u16,
    pub body: String,
}

impl Answer {
    /// The message of an error answer (its `error` field).
    pub fn message(&self) -> String {
        serde_json::from_str::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or_else(|| self.body.trim().to_string())
    }

    /// The body of a 2xx answer; otherwise an error saying what the server said (a 503: the
    /// store below does not answer, exit 3).
    pub fn ok(self) -> Result<String> {
        match self.status {
            200..=299 => Ok(self.body),
            _ => Err(self.error()),
        }
    }

    fn error(&self) -> anyhow::Error {
        match self.status {
            503 => PipelineError::Unavailable(format!("perc serve: {}", self.message())).into(),
            status => anyhow!("perc serve answered {status}: {}", self.message()),
        }
    }
}

/// The server holding the sled store of `config`, when one is running: its address file is
/// there and something listens at the address (a file left by a killed server is not).
pub async fn find(config: &config::Config) -> Option<Served> {
    if config.store.backend != config::Backend::Sled {
        return None;
    }
    let dir = Path::new(&config.store.data);
    let text = std::fs::read_to_string(dir.join(perc_serve::ADDRESS_FILE)).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let addr: std::net::SocketAddr = v["addr"].as_str()?.parse().ok()?;
    let connect = tokio::net::TcpStream::connect(addr);
    tokio::time::timeout(Duration::from_secs(2), connect).await.ok()?.ok()?;
    let token = if config.serve.token.is_empty() {
        std::fs::read_to_string(dir.join(perc_serve::TOKEN_FILE))
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
    } else {
        Some(config.serve.token.clone())
    };
    let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(5)).build().ok()?;
    tracing::info!(%addr, "the store is served: asking perc serve");
    Some(Served { base: format!("http://{addr}"), http, token })
}

impl Served {
    pub fn base(&self) -> &str {
        &self.base
    }

    fn fail(&self, e: reqwest::Error) -> anyhow::Error {
        anyhow!("perc serve at {} does not answer: {e}", self.base)
    }

    /// GET `path` with `query`.
    pub async fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<Answer> {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .query(query)
            .send()
            .await
            .map_err(|e| self.fail(e))?;
        let status = r.status().as_u16();
        Ok(Answer { status, body: r.text().await.map_err(|e| self.fail(e))? })
    }

    /// POST `body` (JSON) to `path`, with the token.
    pub async fn post(&self, path: &str, body: &serde_json::Value) -> Result<Answer> {
        let mut r = self
            .http
            .post(format!("{}{path}", self.base))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
        if let Some(t) = &self.token {
            r = r.bearer_auth(t);
        }
        let r = r.send().await.map_err(|e| self.fail(e))?;
        let status = r.status().as_u16();
        Ok(Answer { status, body: r.text().await.map_err(|e| self.fail(e))? })
    }

    /// `GET /v1/export` (the link graph: `?links=1`) into `w`, as it streams; the number of
    /// lines.
    pub async fn export(&self, w: &mut impl Write, what: Exported) -> Result<usize> {
        let query = if what == Exported::Links { "?links=1" } else { "" };
        let mut r = self
            .http
            .get(format!("{}/v1/export{query}", self.base))
            .send()
            .await
            .map_err(|e| self.fail(e))?;
        if !r.status().is_success() {
            let status = r.status().as_u16();
            return Err(Answer { status, body: r.text().await.unwrap_or_default() }.error());
        }
        let mut lines = 0;
        while let Some(chunk) = r.chunk().await.map_err(|e| self.fail(e))? {
            lines += chunk.iter().filter(|b| **b == b'\n').count();
            w.write_all(&chunk).map_err(|cause| PipelineError::Io {
                what: "cannot write the export".into(),
                cause,
            })?;
        }
        Ok(lines)
    }
}

/// The JSON of a 2xx answer.
pub fn json(answer: Answer) -> Result<serde_json::Value> {
    let body = answer.ok()?;
    serde_json::from_str(&body).context("perc serve answered something that is not JSON")
}

/// A command on a store that `perc serve` holds, through its API (see [`remote`]).
pub(crate) async fn through_server(
    command: Command,
    config: &config::Config,
    served: &Served,
) -> Result<ExitCode> {
    let not_found = |answer: &Answer| -> Option<ExitCode> {
        (answer.status == 404).then(|| {
            say!("{}", answer.message());
            ExitCode::from(1)
        })
    };
    match command {
        Command::Status => {
            let text = served.get("/v1/status", &[("format", "text")]).await?.ok()?;
            out!("{}", text.trim_end());
        }
        Command::Canonical { url } => {
            let url = parse_url(&url)?;
            let answer = served.get("/v1/canonical", &[("url", url.as_str())]).await?;
            if let Some(code) = not_found(&answer) {
                return Ok(code);
            }
            let v = json(answer)?;
            out!("{}", v["canonical"].as_str().unwrap_or_default());
        }
        Command::Page { url } => {
            let url = parse_url(&url)?;
            let answer = served.get("/v1/page", &[("url", url.as_str())]).await?;
            if let Some(code) = not_found(&answer) {
                return Ok(code);
            }
            out!("{}", answer.ok()?.trim_end());
        }
        Command::Export { out, links } => {
            let what = Exported::of(links);
            let n = if out.as_os_str() == "-" {
                let mut f = std::io::BufWriter::new(std::io::stdout().lock());
                let n = served.export(&mut f, what).await?;
                f.flush()?;
                n
            } else {
                let mut tmp = Replacement::create(&out)?;
                let n = served.export(&mut tmp.file, what).await?;
                tmp.finish()?;
                out!("exported {n} {} to {}", what.unit(), out.display());
                n
            };
            tracing::debug!(lines = n, "exported through perc serve");
        }
        Command::Search { query, limit, lang } => {
            let (q, limit) = (query.join(" "), search_limit(config, limit)?.to_string());
            let mut params = vec![("q", q.as_str()), ("limit", limit.as_str())];
            if let Some(lang) = &lang {
                params.push(("lang", lang));
            }
            let answer = served.get("/v1/search", &params).await?;
            let hits: Vec<perc_search::Hit> = serde_json::from_value(json(answer)?["hits"].take())
                .context("perc serve's search hits")?;
            return print_hits(&q, hits);
        }
        Command::Refetch { urls, all } => return refetch(served, &urls, all).await,
        Command::Crawl { seeds, prefixes, warc_out, .. } => {
            seed(served, config, &seeds, &prefixes, warc_out.as_deref()).await?
        }
        _ => unreachable!("only the commands that ask the index go through a server"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `perc refetch` through the server: the URLs (or all) fetched again; 1 if some is unknown.
async fn refetch(served: &Served, urls: &[String], all: bool) -> Result<ExitCode> {
    let body = if all {
        serde_json::json!({ "all": true })
    } else {
        if urls.is_empty() {
            bail!("refetch needs URLs, or --all");
        }
        let urls: Vec<String> =
            urls.iter().map(|u| parse_url(u).map(String::from)).collect::<Result<_>>()?;
        serde_json::json!({ "urls": urls })
    };
    let v = json(served.post("/v1/refetch", &body).await?)?;
    let unknown = v["unknown"].as_array().cloned().unwrap_or_default();
    for u in &unknown {
        say!("warning: {} is not known to this index; not fetched", u.as_str().unwrap_or(""));
    }
    out!(
        "perc serve at {} fetches {} pages again (it indexes them as they come)",
        served.base(),
        v["refetching"]
    );
    Ok(if unknown.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `perc crawl` through the server: the seeds added to its crawl.
async fn seed(
    served: &Served,
    config: &config::Config,
    seeds: &Path,
    prefixes: &[String],
    warc_out: Option<&Path>,
) -> Result<()> {
    if warc_out.is_some() {
        bail!(
            "--warc-out: perc serve at {} holds this store and records nothing; stop it \
             to crawl with --warc-out",
            served.base()
        );
    }
    let seeds = read_seeds(seeds, config.crawl.seeds_max)?;
    let seeds: Vec<&str> = seeds.iter().map(Url::as_str).collect();
    let body = serde_json::json!({ "seeds": seeds, "prefixes": prefixes });
    let v = json(served.post("/v1/seeds", &body).await?)?;
    for u in v["outside_scope"].as_array().into_iter().flatten() {
        say!(
            "warning: the seed {} is outside the prefixes: fetched, its links not followed",
            u.as_str().unwrap_or("")
        );
    }
    out!(
        "perc serve at {} crawls {} seeds (perc status shows how far it is)",
        served.base(),
        v["seeds"]
    );
    Ok(())
}
