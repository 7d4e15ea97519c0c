//! The latency knob ([`super::CoordinatorOptions::latency`],
//! `hosted-boot-coordinator serve --latency-ms L`): every route of the contract
//! (section 2) and every git request is answered no sooner than L after it
//! arrived, as by a coordinator one round trip of L away. It is what the
//! boot-latency benchmark (`bench/boot-latency`) measures the runner's
//! critical path against. The dev API is never delayed: it is the operator's
//! (and the benchmark's clock), not the sandbox's. A fault's own `delay_ms`
//! comes on top.

use std::time::Duration;

use super::state::Target;

/// Whether requests to `route` wait out the latency (every route but the
/// dev API and unknown paths).
pub(super) fn applies_to(route: Target) -> bool {
    !matches!(route, Target::Dev | Target::Unknown)
}

/// Waits `latency` before a request to `route` is answered (nothing for a
/// zero latency or a route it does not apply to).
pub(super) async fn answer_after(latency: Duration, route: Target) {
    if !latency.is_zero() && applies_to(route) {
        tokio::time::sleep(latency).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_contract_route_and_git_is_delayed_but_not_the_dev_api() {
        assert!(applies_to(Target::Route(crate::Route::AgentToken)));
        assert!(applies_to(Target::Route(crate::Route::Session)));
        assert!(applies_to(Target::Git));
        assert!(!applies_to(Target::Dev));
        assert!(!applies_to(Target::Unknown));
    }
}
