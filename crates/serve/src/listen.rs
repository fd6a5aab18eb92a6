//! The HTTP listener: accepts connections and serves the router on each, with the bounds a
//! server facing untrusted clients needs and axum's own `serve` does not set.
//!
//! - A connection that sends no whole request head within `serve.header_timeout_ms` is
//!   closed: a slowloris client trickling a head byte by byte, and a keep-alive connection
//!   idle between requests, alike (hyper's header read timeout, which runs while the
//!   connection waits for a head).
//! - At most `serve.connections_max` connections are open at once; one more is closed as soon
//!   as it is accepted, so that a flood of sockets cannot take the file descriptors the crawl
//!   and the store need.
//! - An accept that fails for want of file descriptors (or memory) waits a moment and goes
//!   on: the listener never ends on a flood.
//! - A stop closes the listener, lets the requests in flight finish (the caller bounds how
//!   long), and closes idle connections.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The listener's bounds (`[serve]`).
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub header_timeout: Duration,
    pub connections_max: usize,
    /// How long the requests in flight get once a stop is asked for.
    pub grace: Duration,
}

impl Bounds {
    pub fn of(config: &perc_pipeline::config::Serve) -> Bounds {
        Bounds {
            header_timeout: Duration::from_millis(config.header_timeout_ms),
            connections_max: config.connections_max,
            grace: Duration::from_millis(config.shutdown_ms),
        }
    }
}

/// How long an accept that failed for a local reason (no file descriptor) waits before the
/// next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `router` on `listener` until `stop`, then waits for the connections' requests in
/// flight to finish.
pub async fn serve(listener: TcpListener, router: Router, bounds: Bounds, stop: CancellationToken) {
    let open = Arc::new(tokio::sync::Semaphore::new(bounds.connections_max.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(bounds.header_timeout);
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and the like: the socket stays in the backlog; try again shortly.
                tracing::warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            metrics::counter!("perc_http_connections_refused_total").increment(1);
            drop(stream);
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = http.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
