//! A static site served on 127.0.0.1 from a directory: the demo behind `make run`, and the
//! fixture sites the tests crawl. Files map to paths (`dir/` serves `index.html`); a file
//! `_redirects` holds lines `FROM TO STATUS`; `.html` is served as `text/html` (no charset:
//! pages declare theirs), `.txt` as `text/plain`, `.xml` and `.gz` as XML and gzip (the
//! bytes as stored: a `.xml.gz` sitemap stays compressed); a missing file is a 404. Each
//! file has an `ETag` (of its bytes), and a request that sends it back in `If-None-Match`
//! is answered 304, as web servers do.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::body::Body;
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::Response;
use axum::Router;

struct Site {
    root: PathBuf,
    redirects: HashMap<String, (String, u16)>,
    /// Requests answered 304.
    not_modified: AtomicU64,
}

/// A running site: its base URL, and the task serving it (aborted on drop).
pub struct Served {
    pub addr: SocketAddr,
    site: Arc<Site>,
    task: tokio::task::JoinHandle<()>,
}

impl Served {
    pub fn base(&self) -> url::Url {
        url::Url::parse(&format!("http://{}/", self.addr)).expect("a socket address makes a URL")
    }

    /// How many requests it answered 304 (Not Modified).
    pub fn not_modified(&self) -> u64 {
        self.site.not_modified.load(Ordering::Relaxed)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `root` on a free port of 127.0.0.1.
pub async fn serve(root: &Path) -> Result<Served> {
    serve_on(root, SocketAddr::from(([127, 0, 0, 1], 0))).await
}

/// Serves `root` at `addr` (port 0: a free one).
pub async fn serve_on(root: &Path, addr: SocketAddr) -> Result<Served> {
    let mut redirects = HashMap::new();
    if let Ok(text) = std::fs::read_to_string(root.join("_redirects")) {
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let parts: Vec<&str> = line.split_whitespace().collect();
            let [from, to, status] = parts[..] else {
                anyhow::bail!(
                    "{}/_redirects line {}: expected FROM TO STATUS",
                    root.display(),
                    n + 1
                );
            };
            redirects.insert(
                from.to_string(),
                (to.to_string(), status.parse().context("redirect status")?),
            );
        }
    }
    let site =
        Arc::new(Site { root: root.to_path_buf(), redirects, not_modified: AtomicU64::new(0) });
    let serving = site.clone();
    let app = Router::new().fallback(move |uri: Uri, headers: HeaderMap| {
        let site = serving.clone();
        async move { respond(&site, &uri, &headers) }
    });
    let listener =
        tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(Served { addr, site, task })
}

fn respond(site: &Site, uri: &Uri, headers: &HeaderMap) -> Response {
    let path = uri.path();
    let status_only =
        |s: StatusCode| Response::builder().status(s).body(Body::empty()).expect("valid response");
    if let Some((to, status)) = site.redirects.get(path) {
        return Response::builder()
            .status(StatusCode::from_u16(*status).unwrap_or(StatusCode::FOUND))
            .header(header::LOCATION, to)
            .body(Body::empty())
            .expect("valid response");
    }
    if path.split('/').any(|seg| seg == "..") {
        return status_only(StatusCode::BAD_REQUEST);
    }
    let mut file = site.root.join(path.trim_start_matches('/'));
    if path.ends_with('/') {
        file.push("index.html");
    }
    match std::fs::read(&file) {
        Ok(bytes) => {
            let ct = match file.extension().and_then(|e| e.to_str()) {
                Some("html") => "text/html",
                Some("txt") => "text/plain",
                Some("png") => "image/png",
                Some("xml") => "application/xml",
                Some("gz") => "application/gzip",
                _ => "application/octet-stream",
            };
            let etag = format!("\"{}\"", &blake3::hash(&bytes).to_hex()[..16]);
            let asked = headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok());
            if asked.is_some_and(|a| a.split(',').any(|t| t.trim() == etag)) {
                site.not_modified.fetch_add(1, Ordering::Relaxed);
                return Response::builder()
                    .status(StatusCode::NOT_MODIFIED)
                    .header(header::ETAG, etag)
                    .body(Body::empty())
                    .expect("valid response");
            }
            Response::builder()
                .header(header::CONTENT_TYPE, ct)
                .header(header::ETAG, etag)
                .body(Body::from(bytes))
                .expect("valid response")
        }
        Err(_) => status_only(StatusCode::NOT_FOUND),
    }
}
