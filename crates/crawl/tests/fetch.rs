//! The HTTP fetcher against a server on 127.0.0.1 that the test starts on a free port.

use std::io::Write;
use std::time::{Duration, Instant};

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use perc_crawl::{FetchError, FetchLimits, Fetcher, HttpFetcher, Polite, PolitenessConfig};
use url::Url;

async fn serve() -> Url {
    let bomb = {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&vec![0u8; 8 * 1024 * 1024]).unwrap();
        gz.finish().unwrap()
    };
    let app = Router::new()
        .route(
            "/ok",
            get(|| async {
                ([(header::CONTENT_TYPE, "text/html; charset=ISO-8859-1")], "<title>ok</title>")
            }),
        )
        .route("/plain", get(|| async { ([(header::CONTENT_TYPE, "text/plain")], "hi") }))
        .route(
            "/moved",
            get(|| async { (StatusCode::MOVED_PERMANENTLY, [(header::LOCATION, "/ok#frag")], "") }),
        )
        .route(
            "/big",
            get(|| async { ([(header::CONTENT_TYPE, "text/html")], vec![b'x'; 2 * 1024 * 1024]) }),
        )
        .route(
            "/bomb",
            get(move || {
                let bomb = bomb.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, "text/html"), (header::CONTENT_ENCODING, "gzip")],
                        bomb,
                    )
                }
            }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "late"
            }),
        )
        .route(
            "/busy",
            get(|| async { (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, "1")], "") }),
        )
        .route("/gone", get(|| async { StatusCode::NOT_FOUND.into_response() }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Url::parse(&format!("http://{addr}/")).unwrap()
}

fn limits() -> FetchLimits {
    FetchLimits {
        connect_timeout_ms: 1_000,
        total_timeout_ms: 1_000,
        body_bytes_max: 1024 * 1024,
        ..FetchLimits::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_redirects_and_limits() {
    let base = serve().await;
    let f = HttpFetcher::new(limits()).unwrap();
    let ok = f.fetch(&base.join("ok").unwrap()).await.unwrap();
    // Charset labels are case-insensitive; the media-type parser gives them lower-cased.
    assert_eq!(
        (ok.status, ok.content_type.as_deref(), ok.charset.as_deref()),
        (200, Some("text/html"), Some("iso-8859-1"))
    );
    assert!(ok.is_html());
    assert_eq!(&ok.body[..], b"<title>ok</title>");
    assert!(!f.fetch(&base.join("plain").unwrap()).await.unwrap().is_html());

    let moved = f.fetch(&base.join("moved").unwrap()).await.unwrap();
    assert_eq!(moved.status, 301, "redirects are not followed by the fetcher");
    assert_eq!(moved.location.unwrap().as_str(), base.join("ok#frag").unwrap().as_str());

    assert_eq!(f.fetch(&base.join("gone").unwrap()).await.unwrap().status, 404);
    assert_eq!(
        f.fetch(&base.join("big").unwrap()).await.unwrap_err(),
        FetchError::TooLarge { max_bytes: 1024 * 1024 }
    );
    // 8 MiB of zeros gzipped to a few KiB: cut off at the cap after decompression.
    assert_eq!(
        f.fetch(&base.join("bomb").unwrap()).await.unwrap_err(),
        FetchError::TooLarge { max_bytes: 1024 * 1024 }
    );
    let started = Instant::now();
    assert_eq!(
        f.fetch(&base.join("slow").unwrap()).await.unwrap_err(),
        FetchError::Timeout { after_ms: 1_000 }
    );
    assert!(started.elapsed() < Duration::from_secs(4));
    let busy = f.fetch(&base.join("busy").unwrap()).await.unwrap();
    assert_eq!((busy.status, busy.retry_after_s), (429, Some(1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_host_is_named() {
    // A port nothing listens on: bind one, learn it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let f = HttpFetcher::new(limits()).unwrap();
    let err =
        f.fetch(&Url::parse(&format!("http://127.0.0.1:{port}/")).unwrap()).await.unwrap_err();
    assert!(
        matches!(err, FetchError::Unreachable { ref host, .. } if host == "127.0.0.1"),
        "{err}"
    );
    assert!(err.to_string().starts_with("cannot connect to 127.0.0.1"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn politeness_spaces_requests_to_one_host() {
    let base = serve().await;
    // Four requests at once are allowed; a delay between requests makes it one at a time.
    let polite = Polite::new(
        HttpFetcher::new(limits()).unwrap(),
        PolitenessConfig { concurrency_max: 8, per_host: 4, host_delay_ms: 0, delay_cap_ms: 2_000 },
    );
    let ok = base.join("ok").unwrap();
    polite.set_host_delay(&ok, 150).await;
    let started = Instant::now();
    let (a, b, c) = tokio::join!(polite.fetch(&ok), polite.fetch(&ok), polite.fetch(&ok));
    assert!(a.is_ok() && b.is_ok() && c.is_ok());
    // Three requests, two delays of 150 ms between them.
    assert!(started.elapsed() >= Duration::from_millis(300), "{:?}", started.elapsed());
    // Retry-After on a 429 pushes the host's next request back (capped).
    polite.set_host_delay(&ok, 0).await;
    polite.fetch(&base.join("busy").unwrap()).await.unwrap();
    let started = Instant::now();
    polite.fetch(&ok).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(900), "{:?}", started.elapsed());
}

/// A server whose `/wave` answers only once `wave` requests are in flight together (or 503
/// after 5 s), counting the most it ever had in flight.
async fn serve_waves(wave: usize) -> (Url, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let barrier = Arc::new(tokio::sync::Barrier::new(wave));
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let seen = most.clone();
    let app = Router::new().route(
        "/wave",
        get(move || {
            let (barrier, now, most) = (barrier.clone(), now.clone(), most.clone());
            async move {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                let met = tokio::time::timeout(Duration::from_secs(5), barrier.wait()).await;
                now.fetch_sub(1, Ordering::SeqCst);
                if met.is_ok() {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (Url::parse(&format!("http://{addr}/wave")).unwrap(), seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_gets_per_host_requests_at_once_and_no_more() {
    // A host that allows four requests at once.
    let (wave, most) = serve_waves(4).await;
    let limits = FetchLimits { total_timeout_ms: 10_000, ..limits() };
    let config = PolitenessConfig { per_host: 4, ..PolitenessConfig::default() };
    let polite = Polite::new(HttpFetcher::new(limits).unwrap(), config);
    // Eight requests: two waves of four, each of which the server sees in flight together.
    let all = futures::future::join_all((0..8).map(|_| polite.fetch(&wave))).await;
    let statuses: Vec<u16> = all.into_iter().map(|r| r.unwrap().status).collect();
    assert_eq!(statuses, [200; 8]);
    assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 4, "never more than per_host");
    let counts = polite.host_counts();
    let host = format!("http://{}", wave.authority());
    assert_eq!((counts[&host].requests, counts[&host].failed), (8, 0));
}
