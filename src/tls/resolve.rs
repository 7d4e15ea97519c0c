//! Name resolution for the HTTP client, failing with a type of its own
//! ([`Unresolved`]): the client's default resolver fails with an error a
//! caller can tell from others only by its text (`dns error`), and the
//! egress canary and the retry's messages need to tell "the name does not
//! resolve" from "nothing answered". It resolves as the default one does
//! (the system's `getaddrinfo`, on the blocking pool).

use std::error::Error as StdError;
use std::net::SocketAddr;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// The system resolver.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let name = host.clone();
            let found = tokio::net::lookup_host((name.as_str(), 0)).await;
            match found {
                Ok(addrs) => {
                    let addrs: Vec<SocketAddr> = addrs.collect();
                    Ok(Box::new(addrs.into_iter()) as Addrs)
                }
                Err(source) => Err(Box::new(Unresolved { host, source }) as _),
            }
        })
    }
}

/// A host name the system could not resolve.
#[derive(Debug, thiserror::Error)]
#[error("the name {host} does not resolve")]
pub struct Unresolved {
    /// The name.
    pub host: String,
    /// `getaddrinfo`'s answer.
    #[source]
    pub source: std::io::Error,
}

/// `error` and its causes, outermost first, into the error an
/// `io::Error` wraps (whose `source` skips it: a TLS alert arrives as an
/// `io::Error` wrapping the `rustls::Error`).
pub fn causes<'a>(error: &'a (dyn StdError + 'static)) -> Vec<&'a (dyn StdError + 'static)> {
    let mut all = Vec::new();
    let mut next = Some(error);
    while let Some(e) = next {
        all.push(e);
        next = match e.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|inner| inner as &(dyn StdError + 'static)),
            None => e.source(),
        };
    }
    all
}

/// Each cause's text, outermost first, without the repeats: an
/// `io::Error` shows the error it wraps, which [`causes`] holds next.
pub fn texts(causes: &[&(dyn StdError + 'static)]) -> Vec<String> {
    let mut texts: Vec<String> = causes.iter().map(|c| c.to_string()).collect();
    texts.dedup();
    texts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_name_that_does_not_resolve_fails_with_its_type() {
        let error = SystemResolver
            .resolve("no-such-host.invalid".parse().unwrap())
            .await
            .err()
            .unwrap();
        let unresolved = error.downcast_ref::<Unresolved>().unwrap();
        assert_eq!(unresolved.host, "no-such-host.invalid");
        let addrs: Vec<_> = SystemResolver
            .resolve("localhost".parse().unwrap())
            .await
            .unwrap()
            .collect();
        assert!(!addrs.is_empty());
    }

    #[test]
    fn causes_reach_into_an_io_error() {
        let inner = Unresolved {
            host: "h".into(),
            source: std::io::Error::other("gai"),
        };
        let outer = std::io::Error::other(inner);
        let all = causes(&outer);
        // The outer io::Error, what it wraps, its source, and the text the
        // innermost io::Error wraps.
        assert_eq!(all.len(), 4, "{all:?}");
        assert!(all[1].is::<Unresolved>());
        assert!(all[2].is::<std::io::Error>());
    }
}
