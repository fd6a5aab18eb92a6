//! The CLI on a store that `perc serve` holds (docs/serve.md, "The CLI on a served store").
//! sled admits one process, so while a server runs, `perc status|canonical|page|export|
//! search|refetch|crawl --seeds` on its store ask its API instead of failing on the lock:
//! the server wrote where it listens in `DATA/serve.json`, and the write endpoints' token
//! is `serve.token` or `DATA/serve.token`. The reads answer what the same command answers
//! on the store; `refetch` and `crawl` hand the work to the server and return at once.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use perc_pipeline::{config, PipelineError};

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

    /// `GET /v1/export` into `w`, as it streams; the number of lines.
    pub async fn export(&self, w: &mut impl Write) -> Result<usize> {
        let mut r = self
            .http
            .get(format!("{}/v1/export", self.base))
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
