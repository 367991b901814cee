//! A latency-injecting TCP proxy on loopback: every connection's bytes are
//! delayed by RTT/2 in each direction (order kept), so a registry on
//! 127.0.0.1 answers as one at that distance does — a new connection's
//! handshake costs a round trip too. It counts the connections it is asked
//! for (HTTP/1.1 opens one per concurrent request; HTTP/2 multiplexes).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// What the proxy saw.
#[derive(Default, Debug)]
pub struct Counts {
    /// Connections opened through it.
    pub connections: AtomicU64,
}

/// A running proxy: its address and counts. Dropping it stops accepting.
pub struct Proxy {
    pub addr: SocketAddr,
    pub counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a proxy to `upstream` with round-trip time `rtt` milliseconds
/// (read as each connection opens: set it between runs).
pub async fn start(upstream: SocketAddr, rtt: Arc<std::sync::atomic::AtomicU64>) -> Proxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
    let addr = listener.local_addr().expect("proxy addr");
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    let task = tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            c.connections.fetch_add(1, Ordering::Relaxed);
            let rtt = Duration::from_millis(rtt.load(Ordering::Relaxed));
            tokio::spawn(async move {
                // The SYN/ACK a real connection waits for: one round trip
                // before the first byte can go.
                tokio::time::sleep(rtt).await;
                let Ok(server) = TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let half = rtt / 2;
                tokio::spawn(pump(cr, sw, half));
                tokio::spawn(pump(sr, cw, half));
            });
        }
    });
    Proxy { addr, counts, task }
}

/// Copies `from` to `to`, each chunk delivered `delay` after it was read.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}
