//! A TCP listener whose connections a handler can drop without an HTTP
//! response, for the `reset` fault (PROTOCOL.md section 6, `POST dev/faults`).
//!
//! Each accepted stream is wrapped in [`ConnIo`], which shares a [`ConnHandle`]
//! with the request handlers through axum's `ConnectInfo`. Killing the handle
//! makes the next read or write of the connection fail; before failing, the
//! socket is given a zero linger so that closing it sends a TCP RST. The client
//! therefore sees a transport error (a reset or an incomplete message), never
//! a status code.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// Shared between a connection and the handlers of its requests.
#[derive(Default)]
struct KillSwitch {
    killed: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

/// The handle a request handler uses to drop its connection.
#[derive(Clone, Default)]
pub(crate) struct ConnHandle(Arc<KillSwitch>);

impl ConnHandle {
    /// Drops the connection at its next read or write: no response is sent.
    pub(crate) fn kill(&self) {
        self.0.killed.store(true, Ordering::SeqCst);
        let waker = crate::lock(&self.0.waker).take();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// A TCP stream that fails all I/O once its [`ConnHandle`] is killed.
pub(crate) struct ConnIo {
    stream: TcpStream,
    handle: ConnHandle,
}

impl ConnIo {
    /// `Some(error)` once killed (after arming the RST), else registers the
    /// waker so that a kill during a pending read wakes the connection.
    fn check(&self, cx: &Context<'_>) -> Option<io::Error> {
        if self.handle.0.killed.load(Ordering::SeqCst) {
            // Zero linger: close() sends RST and discards unsent data.
            let _ = self.stream.set_zero_linger();
            return Some(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "connection dropped by an injected fault",
            ));
        }
        *crate::lock(&self.handle.0.waker) = Some(cx.waker().clone());
        None
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A [`TcpListener`] that hands out [`ConnIo`] streams.
pub(crate) struct KillableListener(pub(crate) TcpListener);

impl Listener for KillableListener {
    type Io = ConnIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    let io = ConnIo {
                        stream,
                        handle: ConnHandle::default(),
                    };
                    return (io, addr);
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait, then retry.
                    tracing::debug!(error = %e, "coordinator: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

impl Connected<IncomingStream<'_, KillableListener>> for ConnHandle {
    fn connect_info(stream: IncomingStream<'_, KillableListener>) -> Self {
        stream.io().handle.clone()
    }
}
