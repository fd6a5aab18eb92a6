//! A static site served on 127.0.0.1 from a directory: the demo behind `make run`, and the
//! fixture sites the tests crawl. Files map to paths (`dir/` serves `index.html`); a file
//! `_redirects` holds lines `FROM TO STATUS`; `.html` is served as `text/html` (no charset:
//! pages declare theirs), `.txt` as `text/plain`, `.xml` and `.gz` as XML and gzip (the
//! bytes as stored: a `.xml.gz` sitemap stays compressed); a missing file is a 404.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::body::Body;
use axum::http::{header, StatusCode, Uri};
use axum::response::Response;
use axum::Router;

struct Site {
    root: PathBuf,
    redirects: HashMap<String, (String, u16)>,
}

/// A running site: its base URL, and the task serving it (aborted on drop).
pub struct Served {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Served {
    pub fn base(&self) -> url::Url {
        url::Url::parse(&format!("http://{}/", self.addr)).expect("a socket address makes a URL")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `root` on a free port of 127.0.0.1.
pub async fn serve(root: &Path) -> Result<Served> {
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
    let site = Arc::new(Site { root: root.to_path_buf(), redirects });
    let app = Router::new().fallback(move |uri: Uri| {
        let site = site.clone();
        async move { respond(&site, &uri) }
    });
    let listener =
        tokio::net::TcpListener::bind("127.0.0.1:0").await.context("binding 127.0.0.1")?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(Served { addr, task })
}

fn respond(site: &Site, uri: &Uri) -> Response {
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
            Response::builder()
                .header(header::CONTENT_TYPE, ct)
                .body(Body::from(bytes))
                .expect("valid response")
        }
        Err(_) => status_only(StatusCode::NOT_FOUND),
    }
}
