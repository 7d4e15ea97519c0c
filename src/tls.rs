//! The runner's HTTP client and its trust roots (PROTOCOL.md section 1): the
//! system store (so a platform's `SSL_CERT_FILE` applies), plus the PEM file
//! named by `HOSTED_BOOT_CA_FILE`, plus a bundled root set when the system
//! has none. One client serves the coordinator calls, the clone and the
//! credential helper, so they trust the same roots.

use std::path::Path;

use anyhow::{Context, bail};

/// Installs the ring crypto provider for rustls. Idempotent; call it once at
/// the start of `main` (and of any test that builds a client).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Reads the certificates of a PEM file.
///
/// Errors: the file is missing or unreadable, or holds no certificate (a
/// configuration error: the operator named it on purpose).
pub fn read_ca_file(path: &Path) -> anyhow::Result<Vec<reqwest::Certificate>> {
    let pem = std::fs::read(path)
        .with_context(|| format!("cannot read HOSTED_BOOT_CA_FILE {}", path.display()))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).with_context(|| {
        format!(
            "HOSTED_BOOT_CA_FILE {} is not a PEM certificate bundle",
            path.display()
        )
    })?;
    if certs.is_empty() {
        bail!(
            "HOSTED_BOOT_CA_FILE {} holds no certificate; point it at a PEM file with the proxy's CA",
            path.display()
        );
    }
    Ok(certs)
}

/// Builds the HTTP client: no redirects (a 3xx is a verdict, PROTOCOL.md
/// section 2), rustls, the roots described in the module docs.
///
/// Errors: a CA file that cannot be used (see [`read_ca_file`]), or a TLS
/// set-up failure.
pub fn http_client(ca_file: Option<&Path>) -> anyhow::Result<reqwest::Client> {
    http_client_with(ca_file, |b| b)
}

/// [`http_client`] with `customize` applied to the builder (timeouts, a
/// proxy of its own): the same trust roots, for the egress canary.
///
/// Errors: as [`http_client`].
pub fn http_client_with(
    ca_file: Option<&Path>,
    customize: impl Fn(reqwest::ClientBuilder) -> reqwest::ClientBuilder,
) -> anyhow::Result<reqwest::Client> {
    install_crypto_provider();
    let extra = match ca_file {
        Some(path) => read_ca_file(path)?,
        None => Vec::new(),
    };
    let builder = || {
        customize(
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(concat!("hosted-boot/", env!("CARGO_PKG_VERSION")))
                .tls_certs_merge(extra.clone()),
        )
    };
    match builder().build() {
        Ok(client) => Ok(client),
        // A sandbox without a CA store: fall back to the bundled roots.
        Err(_) => {
            let bundled = webpki_root_certs::TLS_SERVER_ROOT_CERTS
                .iter()
                .filter_map(|der| reqwest::Certificate::from_der(der).ok());
            builder()
                .tls_certs_merge(bundled)
                .build()
                .context("cannot set up TLS for the HTTP client")
        }
    }
}
