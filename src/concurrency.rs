//! Concurrency helpers every layer shares: locks that survive a panicked
//! holder (the workspace's, `hosted_boot_wire::locks`), and a sleep to a
//! deadline that may not exist.

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
