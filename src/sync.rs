//! Concurrency helpers every layer shares: locks that survive a panicked
//! holder, and a sleep to a deadline that may not exist.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tokio::time::Instant;

/// Locks `mutex`, taking it over when a holder panicked: every value the
/// runner keeps behind a lock stays consistent between statements (a
/// counter, a slot, a list), so a panic elsewhere must not take the
/// redaction, the spool or the process registry down with it.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// [`lock`] for reading an `RwLock`.
pub fn read<T: ?Sized>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// [`lock`] for writing an `RwLock`.
pub fn write<T: ?Sized>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

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

    #[test]
    fn a_poisoned_lock_is_taken_over_with_its_value() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let l = std::sync::Arc::new(RwLock::new(2));
        let (m2, l2) = (m.clone(), l.clone());
        let _ = std::thread::spawn(move || {
            let _m = m2.lock().unwrap();
            let _l = l2.write().unwrap();
            panic!("poison both");
        })
        .join();
        assert!(m.is_poisoned() && l.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
        *write(&l) += 1;
        assert_eq!(*read(&l), 3);
    }

    #[tokio::test]
    async fn no_deadline_never_wakes() {
        let at = Instant::now() + std::time::Duration::from_millis(20);
        sleep_until(Some(at)).await;
        assert!(Instant::now() >= at);
        let never = tokio::time::timeout(std::time::Duration::from_millis(50), sleep_until(None));
        assert!(never.await.is_err());
    }
}
