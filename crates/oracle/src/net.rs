//! The oracle over the network, for distributed mode: [`serve`] puts a [`LocalOracle`] (its
//! reservations persisted in the shared store) behind a TCP port, and [`RemoteOracle`] is the
//! client every worker uses through the same [`Oracle`] trait.
//!
//! The protocol, one TCP connection per client, answers in request order:
//!
//! ```text
//!   request   u32 n (big-endian)              n >= 1 timestamps wanted
//!   answer    0u8, u64 first                  first, first+1, .., first+n-1 are yours
//!             1u8, u32 len, len bytes         the oracle's error, as text
//! ```
//!
//! Batching, as the paper's clients do: a client keeps one request in flight; every caller
//! that arrives meanwhile waits, and the next request asks for all of them at once, so a
//! round trip serves as many callers as are waiting. If the connection fails (the server
//! restarted, say) the client reconnects and asks again: timestamps the lost answer carried
//! are skipped, never reused, and a restarted server starts above its persisted mark, so every
//! client still sees them strictly increasing.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use perc_store::Ts;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use crate::{LocalOracle, Oracle, OracleError};

/// Most timestamps one request may ask for.
const REQUEST_MAX: u64 = 1 << 20;

/// How often a serving oracle reads the store's mark to find out that a newer oracle has
/// superseded it (besides finding out at its next reservation).
pub const FENCE_CHECK_MS: u64 = 500;

/// Serves `oracle` on `listener` until the task is dropped, the listener fails, or the
/// oracle is superseded by a newer one on the same store (an error: the process should
/// stop). Connections live in the serving task: dropping it closes them all.
pub async fn serve(listener: TcpListener, oracle: Arc<LocalOracle>) -> std::io::Result<()> {
    let mut connections = tokio::task::JoinSet::new();
    let mut check = tokio::time::interval(Duration::from_millis(FENCE_CHECK_MS));
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => accepted?,
            Some(_) = connections.join_next() => continue,
            _ = oracle.superseded() => {
                return Err(std::io::Error::other(OracleError::Superseded { epoch: oracle.epoch() }));
            }
            _ = check.tick() => {
                if let Err(e) = oracle.check_fence().await {
                    tracing::warn!(error = %e, "the oracle cannot read its mark");
                }
                continue;
            }
        };
        let oracle = oracle.clone();
        connections.spawn(async move {
            if let Err(e) = connection(stream, oracle).await {
                tracing::debug!(%peer, error = %e, "oracle client went away");
            }
        });
    }
}

async fn connection(stream: TcpStream, oracle: Arc<LocalOracle>) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let (read, write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut write = BufWriter::new(write);
    loop {
        let n = match read.read_u32().await {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        let answer = if n == 0 || u64::from(n) > REQUEST_MAX {
            Err(format!("a request must ask for 1 to {REQUEST_MAX} timestamps, not {n}"))
        } else {
            oracle.next_batch(n).await.map_err(|e| e.to_string())
        };
        match answer {
            Ok(first) => {
                write.write_u8(0).await?;
                write.write_u64(first.0).await?;
            }
            Err(message) => {
                write.write_u8(1).await?;
                write.write_u32(message.len() as u32).await?;
                write.write_all(message.as_bytes()).await?;
            }
        }
        // Answer every request already read before flushing: pipelined clients get one write.
        if read.buffer().is_empty() {
            write.flush().await?;
        }
    }
}

/// How a [`RemoteOracle`] behaves when the server is away.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// How long to keep reconnecting before callers get [`OracleError::Unavailable`].
    pub reconnect_for_ms: u64,
    /// The longest pause between reconnection attempts.
    pub backoff_max_ms: u64,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig { reconnect_for_ms: 30_000, backoff_max_ms: 500 }
    }
}

type Waiter = (u32, oneshot::Sender<Result<Ts, OracleError>>);

/// The client of an oracle server; see the module docs.
pub struct RemoteOracle {
    requests: mpsc::UnboundedSender<Waiter>,
}

impl RemoteOracle {
    /// Connects to the server at `addr` (`host:port`), failing if it cannot be reached within
    /// `config.reconnect_for_ms`.
    pub async fn connect(addr: &str, config: ClientConfig) -> Result<RemoteOracle, OracleError> {
        let stream = reconnect(addr, &config).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(pump(addr.to_string(), config, stream, rx));
        Ok(RemoteOracle { requests: tx })
    }
}

#[async_trait]
impl Oracle for RemoteOracle {
    async fn next_batch(&self, n: u32) -> Result<Ts, OracleError> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send((n.max(1), tx))
            .map_err(|_| OracleError::Unavailable("the oracle client has stopped".into()))?;
        rx.await.map_err(|_| OracleError::Unavailable("the oracle client has stopped".into()))?
    }
}

async fn reconnect(addr: &str, config: &ClientConfig) -> Result<TcpStream, OracleError> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(config.reconnect_for_ms);
    let mut pause = 5u64;
    let mut said = false;
    loop {
        match TcpStream::connect(addr).await {
            Ok(s) => {
                s.set_nodelay(true).map_err(|e| OracleError::Unavailable(e.to_string()))?;
                return Ok(s);
            }
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(OracleError::Unavailable(format!(
                    "cannot reach the timestamp oracle at {addr}: {e}"
                )));
            }
            Err(e) => {
                if !said {
                    tracing::warn!(
                        "waiting for the timestamp oracle at {addr} ({e}); trying again for up \
                         to {} s",
                        config.reconnect_for_ms / 1000
                    );
                    said = true;
                }
                tokio::time::sleep(Duration::from_millis(pause)).await;
                pause = (pause * 2).min(config.backoff_max_ms.max(1));
            }
        }
    }
}

/// One round trip: ask for `n`, read the answer.
async fn round_trip(stream: &mut TcpStream, n: u32) -> std::io::Result<Result<Ts, String>> {
    stream.write_u32(n).await?;
    match stream.read_u8().await? {
        0 => Ok(Ok(Ts(stream.read_u64().await?))),
        1 => {
            let len = stream.read_u32().await? as usize;
            let mut buf = vec![0; len.min(1 << 16)];
            stream.read_exact(&mut buf).await?;
            Ok(Err(String::from_utf8_lossy(&buf).into_owned()))
        }
        other => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unknown answer tag {other}"),
        )),
    }
}

/// The client's one task: gathers every waiting caller into one request at a time.
async fn pump(
    addr: String,
    config: ClientConfig,
    mut stream: TcpStream,
    mut rx: mpsc::UnboundedReceiver<Waiter>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let mut total = u64::from(batch[0].0);
        while total < REQUEST_MAX {
            match rx.try_recv() {
                Ok(w) => {
                    total += u64::from(w.0);
                    batch.push(w);
                }
                Err(_) => break,
            }
        }
        // A batch over the limit (only if callers ask for huge runs) goes as it is: the
        // server refuses it and the callers get its error.
        let n = total.min(u64::from(u32::MAX)) as u32;
        let answer = loop {
            match round_trip(&mut stream, n).await {
                Ok(a) => break a,
                Err(e) => {
                    tracing::warn!(%addr, error = %e, "oracle connection lost; reconnecting");
                    match reconnect(&addr, &config).await {
                        Ok(s) => stream = s,
                        Err(e) => break Err(e.to_string()),
                    }
                }
            }
        };
        match answer {
            Ok(start) => {
                let mut next = start.0;
                for (k, tx) in batch {
                    let _ = tx.send(Ok(Ts(next)));
                    next += u64::from(k);
                }
            }
            Err(message) => {
                for (_, tx) in batch {
                    let _ = tx.send(Err(OracleError::Unavailable(message.clone())));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use perc_store::{MemStore, Schema, Store};

    async fn server(store: Arc<dyn Store>) -> (String, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let oracle = Arc::new(LocalOracle::open(store, 50).await.unwrap());
        let task = tokio::spawn(async move {
            let _ = serve(listener, oracle).await;
        });
        (addr, task)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_callers_share_round_trips_and_never_see_a_repeat() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new(Schema::new([crate::FAMILY])));
        let (addr, _server) = server(store).await;
        let client = Arc::new(RemoteOracle::connect(&addr, ClientConfig::default()).await.unwrap());
        let mut tasks = Vec::new();
        for t in 0..16u32 {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut seen = Vec::new();
                for i in 0..300u32 {
                    let n = 1 + (i + t) % 4;
                    let first = client.next_batch(n).await.unwrap();
                    for k in 0..u64::from(n) {
                        let ts = Ts(first.0 + k);
                        assert!(seen.last().is_none_or(|l| ts > *l), "increasing per caller");
                        seen.push(ts);
                    }
                }
                seen
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        let total = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), total, "no timestamp handed out twice");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restarted_server_continues_above_everything_handed_out() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new(Schema::new([crate::FAMILY])));
        // The first server runs on a runtime of its own, so that it can die the way a process
        // does: every task and socket gone at once.
        let first = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let oracle = Arc::new(LocalOracle::open(store.clone(), 50).await.unwrap());
        first.spawn(async move { serve(TcpListener::from_std(listener).unwrap(), oracle).await });
        let client =
            RemoteOracle::connect(&addr.to_string(), ClientConfig::default()).await.unwrap();
        let mut last = Ts::ZERO;
        for _ in 0..120 {
            let ts = client.next().await.unwrap();
            assert!(ts > last);
            last = ts;
        }
        // The server dies and comes back on the same port.
        tokio::task::spawn_blocking(move || drop(first)).await.unwrap();
        let listener = TcpListener::bind(addr).await.unwrap();
        let oracle = Arc::new(LocalOracle::open(store, 50).await.unwrap());
        let _second = tokio::spawn(serve(listener, oracle));
        // 120 handed out in blocks of 50: the mark stood at 150, and the new server starts
        // above it, so the first answer after the restart shows which server gave it.
        let after = client.next().await.unwrap();
        assert_eq!(after, Ts(151), "the client reconnected to the new server");
        last = after;
        for _ in 0..120 {
            let ts = client.next().await.unwrap();
            assert!(ts > last, "{ts:?} after {last:?} across the restart");
            last = ts;
        }
    }

    #[tokio::test]
    async fn an_unreachable_server_is_a_clear_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let config = ClientConfig { reconnect_for_ms: 50, backoff_max_ms: 10 };
        let err = RemoteOracle::connect(&addr, config).await.err().expect("no server");
        assert!(err.to_string().contains(&format!("cannot reach the timestamp oracle at {addr}")));
    }
}
