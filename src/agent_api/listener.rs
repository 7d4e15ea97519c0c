//! The proxy's listener (issue 32): at most [`MAX_CONNECTIONS`] connections
//! served at once (more wait in the kernel's listen backlog, where they
//! hold no descriptor of the runner's), each closed once neither side has
//! moved a byte for its idle bound. An agent that opened 21,000
//! connections reached the runner's file-descriptor limit.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// Connections served at once, as the credential broker allows.
pub const MAX_CONNECTIONS: usize = 32;

/// A listener of at most [`MAX_CONNECTIONS`] connections, each closed
/// after `idle` without a byte either way.
pub struct Capped {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    idle: Duration,
}

impl Capped {
    /// Serves `listener` with connections closed after `idle` without a
    /// byte (longer than any one request may be held: the proxy's own call
    /// to the coordinator is bounded by the per-attempt timeout).
    pub fn new(listener: TcpListener, idle: Duration) -> Capped {
        Capped {
            listener,
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            idle,
        }
    }
}

/// A connection's other end, for the handler (`ConnectInfo<Client>`).
#[derive(Clone, Copy, Debug)]
pub struct Client(pub SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Capped>> for Client {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Capped>) -> Client {
        Client(*stream.remote_addr())
    }
}

impl axum::serve::Listener for Capped {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Connection, SocketAddr) {
        loop {
            // The semaphore is never closed; a failure would be a bug, and
            // accepting nothing is the safe side.
            let Ok(permit) = self.slots.clone().acquire_owned().await else {
                std::future::pending::<()>().await;
                continue;
            };
            match self.listener.accept().await {
                Ok((stream, addr)) => {
                    return (
                        Connection {
                            stream,
                            _slot: permit,
                            idle: self.idle,
                            timer: Box::pin(tokio::time::sleep(self.idle)),
                        },
                        addr,
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, "agent API proxy: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// One accepted connection: its slot held until it is dropped, its idle
/// timer pushed back by every byte read or written.
pub struct Connection {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
}

impl Connection {
    fn moved(&mut self) {
        let idle = self.idle;
        self.timer.as_mut().reset(Instant::now() + idle);
    }

    /// `Err` once the idle bound has passed (the server then drops the
    /// connection).
    fn expired(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection was idle for its bound",
            )),
            Poll::Pending => Ok(()),
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.moved();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match self.expired(cx) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            },
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.stream).poll_write(cx, data) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.moved();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match self.expired(cx) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            },
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
