//! Concurrency helpers every layer shares: locks that survive a panicked
//! holder (the workspace's, `hosted_boot_wire::locks`), a sleep to a
//! deadline that may not exist, and blocking work in its caller's span.

use tokio::time::Instant;

pub use hosted_boot_wire::locks::lock;

/// Sleeps until `deadline`; with `None`, never returns: the arm of a
/// `select!` whose timer is not armed.
pub async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// `tokio::task::spawn_blocking`, the work run inside the caller's span:
/// a blocking thread has no current span of its own, and the git work it
/// does (a fetch, a push) belongs to the step that asked for it.
pub fn spawn_blocking_in_span<F, R>(work: F) -> tokio::task::JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(work))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_deadline_never_wakes() {
        let at = Instant::now() + std::time::Duration::from_millis(20);
        sleep_until(Some(at)).await;
        assert!(Instant::now() >= at);
        let never = tokio::time::timeout(std::time::Duration::from_millis(50), sleep_until(None));
        assert!(never.await.is_err());
    }
}
