//! A TCP fault proxy for the fault tests (issue 27): listens on a loopback port and forwards
//! every connection to a target, misbehaving as told. The [`Mode`] applies at once to every
//! connection, open or new:
//!
//! - [`Mode::Pass`]: forwards bytes as they come.
//! - [`Mode::Latency`]: waits this long before forwarding each chunk, in each direction.
//! - [`Mode::Blackhole`]: a network partition. New connections are accepted but not connected
//!   on; nothing is forwarded either way and every socket stays open, so both ends wait (as on
//!   a real partition, until their own timeouts). On heal, what was held is delivered, as TCP
//!   retransmission would.
//! - [`Mode::Reset`]: every open connection is closed with a TCP RST on both sides, and new
//!   ones are reset as soon as they are accepted.
//!
//! It also counts a PostgreSQL client's statements and requests in what it forwards
//! ([`ProxyStats::pg_statements`], [`ProxyStats::pg_requests`]), for tests of how many a store's
//! call costs.
//!
//! ```
//! use kuralle_tests::fault_proxy::{FaultProxy, Mode};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
//! let target = echo.local_addr().unwrap();
//! tokio::spawn(async move {
//!     let (mut socket, _) = echo.accept().await.unwrap();
//!     let (mut r, mut w) = socket.split();
//!     tokio::io::copy(&mut r, &mut w).await.unwrap();
//! });
//! let proxy = FaultProxy::start(target).await.unwrap();
//! proxy.set(Mode::Latency(std::time::Duration::from_millis(5)));
//! let mut client = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
//! client.write_all(b"ping").await.unwrap();
//! let mut back = [0u8; 4];
//! client.read_exact(&mut back).await.unwrap();
//! assert_eq!(&back, b"ping");
//! # });
//! ```

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::pg_frames::{Counts, Frames};

/// How the proxy treats traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward as it comes.
    Pass,
    /// Wait this long before forwarding each chunk, in each direction.
    Latency(Duration),
    /// Forward nothing, keep every socket open, accept new connections without connecting on.
    Blackhole,
    /// Reset every connection, open or new.
    Reset,
}

/// What the proxy did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections it closed with an RST (in [`Mode::Reset`]).
    pub reset: u64,
    /// Bytes forwarded, both directions.
    pub bytes: u64,
    /// PostgreSQL statements the clients sent, when the traffic is PostgreSQL's and not
    /// encrypted ([`Counts::statements`]).
    pub pg_statements: u64,
    /// PostgreSQL requests the clients sent ([`Counts::requests`]).
    pub pg_requests: u64,
}

#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    reset: AtomicU64,
    bytes: AtomicU64,
    pg: Counts,
}

/// A running proxy; dropping it stops it and closes its connections.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    counters: Arc<Counters>,
    accepting: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `target`, in [`Mode::Pass`].
    pub async fn start(target: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (mode, _) = watch::channel(Mode::Pass);
        let counters = Arc::new(Counters::default());
        let accepting = tokio::spawn(accept(listener, target, mode.subscribe(), Arc::clone(&counters)));
        Ok(Self { addr, mode, counters, accepting })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches every connection, open and new, to `mode`.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }

    /// What the proxy did so far.
    pub fn stats(&self) -> ProxyStats {
        ProxyStats {
            accepted: self.counters.accepted.load(Ordering::Relaxed),
            reset: self.counters.reset.load(Ordering::Relaxed),
            bytes: self.counters.bytes.load(Ordering::Relaxed),
            pg_statements: self.counters.pg.statements(),
            pg_requests: self.counters.pg.requests(),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The accept task owns the connections' JoinSet: aborting it aborts them.
        self.accepting.abort();
    }
}

async fn accept(listener: TcpListener, target: SocketAddr, mode: watch::Receiver<Mode>, counters: Arc<Counters>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                counters.accepted.fetch_add(1, Ordering::Relaxed);
                connections.spawn(connection(client, target, mode.clone(), Arc::clone(&counters)));
            }
            // Reap finished connections so the set does not grow with them.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Closes the connection's sockets with an RST rather than a FIN, counted first so that a
/// peer who sees the RST sees it counted.
fn reset(sockets: impl IntoIterator<Item = TcpStream>, counters: &Counters) {
    counters.reset.fetch_add(1, Ordering::Relaxed);
    for socket in sockets {
        // A zero linger makes the close abortive; it never blocks.
        let _ = socket.set_zero_linger();
        drop(socket);
    }
}

async fn connection(client: TcpStream, target: SocketAddr, mut mode: watch::Receiver<Mode>, counters: Arc<Counters>) {
    let _ = client.set_nodelay(true);
    // Nothing reaches the target while partitioned, not even the connection.
    let now = match mode.wait_for(|m| *m != Mode::Blackhole).await {
        Ok(m) => *m,
        Err(_) => return,
    };
    if now == Mode::Reset {
        reset([client], &counters);
        return;
    }
    let Ok(server) = TcpStream::connect(target).await else {
        reset([client], &counters);
        return;
    };
    let _ = server.set_nodelay(true);
    let (mut client, mut server) = (client, server);
    let reset_now = {
        let (mut cr, mut cw) = client.split();
        let (mut sr, mut sw) = server.split();
        let mut until_reset = mode.clone();
        tokio::select! {
            biased;
            _ = until_reset.wait_for(|m| *m == Mode::Reset) => true,
            _ = async {
                tokio::join!(
                    pump(&mut cr, &mut sw, mode.clone(), &counters, Some(Frames::default())),
                    pump(&mut sr, &mut cw, mode.clone(), &counters, None),
                )
            } => false,
        }
    };
    if reset_now {
        reset([client, server], &counters);
    }
}

/// Waits out a blackhole; returns the mode that ended it.
async fn passable(mode: &mut watch::Receiver<Mode>) -> Option<Mode> {
    mode.wait_for(|m| *m != Mode::Blackhole).await.ok().map(|m| *m)
}

/// Copies `from` to `to` chunk by chunk under the current mode, until EOF (then half-closes
/// `to`) or an error, counting a client's PostgreSQL messages in `frames`. A reset is handled
/// by the caller, which drops this future.
async fn pump<R, W>(
    from: &mut R,
    to: &mut W,
    mut mode: watch::Receiver<Mode>,
    counters: &Counters,
    mut frames: Option<Frames>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // While partitioned, read nothing either: the sender's buffers fill as they would.
        if passable(&mut mode).await.is_none() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        match passable(&mut mode).await {
            None => return,
            Some(Mode::Latency(d)) => tokio::time::sleep(d).await,
            Some(_) => {}
        }
        // Counted before the write, so that whoever reads these bytes sees them counted.
        counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
        if let Some(frames) = &mut frames {
            frames.feed(&buf[..n], &counters.pg);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// An echo server on a free loopback port.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = socket.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(client: &mut TcpStream, msg: &[u8]) -> io::Result<Vec<u8>> {
        client.write_all(msg).await?;
        let mut back = vec![0u8; msg.len()];
        client.read_exact(&mut back).await?;
        Ok(back)
    }

    /// Reading from `client` gets nothing for a while (bounded, so a broken proxy fails the
    /// test rather than passing it: only the absence of bytes is asserted here).
    async fn silent(client: &mut TcpStream) -> bool {
        let mut byte = [0u8; 1];
        tokio::time::timeout(Duration::from_millis(300), client.read(&mut byte)).await.is_err()
    }

    #[tokio::test]
    async fn pass_forwards_both_ways_and_counts() {
        let proxy = FaultProxy::start(echo().await).await.unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut client, b"hello").await.unwrap(), b"hello");
        assert_eq!(proxy.stats(), ProxyStats { accepted: 1, reset: 0, bytes: 10, ..ProxyStats::default() });
    }

    #[tokio::test]
    async fn latency_delays_each_direction() {
        let proxy = FaultProxy::start(echo().await).await.unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        proxy.set(Mode::Latency(Duration::from_millis(100)));
        let began = Instant::now();
        assert_eq!(round_trip(&mut client, b"slow").await.unwrap(), b"slow");
        // A lower bound only: one sleep each way cannot take less.
        assert!(began.elapsed() >= Duration::from_millis(200), "{:?}", began.elapsed());
    }

    #[tokio::test]
    async fn blackhole_holds_open_and_new_connections_then_heals() {
        let proxy = FaultProxy::start(echo().await).await.unwrap();
        let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut open, b"a").await.unwrap(), b"a");
        proxy.set(Mode::Blackhole);
        open.write_all(b"held").await.unwrap();
        assert!(silent(&mut open).await, "bytes crossed a blackhole");
        // A new connection is accepted (the socket stays open) but goes nowhere.
        let mut new = TcpStream::connect(proxy.addr()).await.unwrap();
        new.write_all(b"new").await.unwrap();
        assert!(silent(&mut new).await, "a new connection got through a blackhole");
        assert_eq!(proxy.stats().accepted, 2);

        proxy.set(Mode::Pass);
        let mut back = [0u8; 4];
        open.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"held", "what was held is delivered on heal");
        let mut back = [0u8; 3];
        new.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"new");
    }

    #[tokio::test]
    async fn reset_kills_open_and_new_connections_until_pass() {
        let proxy = FaultProxy::start(echo().await).await.unwrap();
        let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut open, b"a").await.unwrap(), b"a");
        proxy.set(Mode::Reset);
        let mut byte = [0u8; 1];
        let err = open.read(&mut byte).await.expect_err("an open connection is reset");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);

        let mut new = TcpStream::connect(proxy.addr()).await.unwrap();
        let err = new.read(&mut byte).await.expect_err("a new connection is reset");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        assert_eq!(proxy.stats().reset, 2);

        proxy.set(Mode::Pass);
        let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut again, b"back").await.unwrap(), b"back");
    }

    #[tokio::test]
    async fn blackhole_then_reset_resets_the_held_connections() {
        let proxy = FaultProxy::start(echo().await).await.unwrap();
        let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut open, b"a").await.unwrap(), b"a");
        proxy.set(Mode::Blackhole);
        let mut held = TcpStream::connect(proxy.addr()).await.unwrap();
        proxy.set(Mode::Reset);
        let mut byte = [0u8; 1];
        for client in [&mut open, &mut held] {
            let err = client.read(&mut byte).await.expect_err("reset");
            assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        }
    }
}
