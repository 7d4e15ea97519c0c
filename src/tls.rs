//! The runner's HTTP client and its trust roots (PROTOCOL.md section 1): the
//! system store (so a platform's `SSL_CERT_FILE` applies), plus the PEM file
//! named by `HOSTED_BOOT_CA_FILE`, plus a bundled root set when the system
//! has none. One client serves the coordinator calls, the clone and the
//! credential helper, so they trust the same roots.
//!
//! The system store is read once per process ([`system_roots`]) and from one
//! bundle file where the system has one (Debian's
//! `/etc/ssl/certs/ca-certificates.crt`, and the other files OpenSSL looks
//! for): reading every file of the CA directory as well (what
//! `rustls-native-certs` does) cost about half the start-up to the first
//! request (BENCHMARKS.md, "Resident cost"), and the directory holds the
//! same certificates as the bundle on every distribution that has both.
//! The directory is read when there is no bundle file; `SSL_CERT_FILE` and
//! `SSL_CERT_DIR`, when set, are read as given.

mod pem;
mod resolve;

pub use resolve::{SystemResolver, Unresolved, causes, texts};

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, bail};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// Installs the ring crypto provider for rustls. Idempotent; call it once at
/// the start of `main` (and of any test that builds a client).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Reads the certificates (DER) of a PEM file.
///
/// Errors: the file is missing or unreadable, or holds no certificate (a
/// configuration error: the operator named it on purpose).
pub fn read_ca_file(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    // A FIFO would block the boot in the read: `stat` first.
    let meta = std::fs::metadata(path)
        .with_context(|| format!("cannot read HOSTED_BOOT_CA_FILE {}", path.display()))?;
    if !readable_whole(path, &meta) {
        bail!(
            "HOSTED_BOOT_CA_FILE {} is not a regular file; {CA_WHAT_TO_DO}",
            path.display()
        );
    }
    let pem = std::fs::read(path)
        .with_context(|| format!("cannot read HOSTED_BOOT_CA_FILE {}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| {
            format!(
                "HOSTED_BOOT_CA_FILE {} is not a PEM certificate bundle",
                path.display()
            )
        })?;
    if certs.is_empty() {
        bail!(
            "HOSTED_BOOT_CA_FILE {} holds no certificate; {CA_WHAT_TO_DO}",
            path.display()
        );
    }
    Ok(certs)
}

/// The system's trust roots (DER), read once per process: `SSL_CERT_FILE`
/// and `SSL_CERT_DIR` when either is set (as given); otherwise the first
/// bundle file OpenSSL's probe finds, or, when there is none (or it holds
/// no certificate), the CA directories. Empty when the system has no store.
pub fn system_roots() -> &'static [rustls::pki_types::CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<rustls::pki_types::CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let file = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from);
        let dir = std::env::var_os("SSL_CERT_DIR");
        match (file, dir) {
            (None, None) => {}
            // The file alone: what the system store's loader would read.
            (Some(file), None) => return read_bundle(&file),
            (file, Some(_)) => {
                // With SSL_CERT_DIR beside it, a file that gives nothing
                // would go unnoticed in the union: it is read alone first.
                if file.is_some_and(|file| read_bundle(&file).is_empty()) {
                    CERT_FILE_GAVE_NONE.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                return rustls_native_certs::load_native_certs().certs;
            }
        }
        let probe = openssl_probe::probe();
        load_roots(probe.cert_file.as_deref(), &probe.cert_dir)
    })
}

/// Set by [`system_roots`] when `SSL_CERT_FILE` gave no certificate.
static CERT_FILE_GAVE_NONE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Why the file `SSL_CERT_FILE` names cannot be read as one, checked with
/// `stat` before anything opens it: a FIFO (or a device) there would block
/// the boot in its first read, silently.
fn cert_file_not_regular() -> Option<String> {
    let file = PathBuf::from(std::env::var_os("SSL_CERT_FILE")?);
    match std::fs::metadata(&file) {
        Err(e) => Some(format!(
            "cannot read SSL_CERT_FILE {} ({e}); {CERT_WHAT_TO_DO}",
            file.display()
        )),
        Ok(meta) if !readable_whole(&file, &meta) => Some(format!(
            "SSL_CERT_FILE {} is not a regular file; {CERT_WHAT_TO_DO}",
            file.display()
        )),
        Ok(_) => None,
    }
}

/// Whether a read of `path` ends: a regular file, or `/dev/null` (an empty
/// store said plainly); not a FIFO, socket, directory or other device.
fn readable_whole(path: &Path, meta: &std::fs::Metadata) -> bool {
    meta.is_file() || std::fs::canonicalize(path).is_ok_and(|p| p == Path::new("/dev/null"))
}

/// What to do about an unusable `HOSTED_BOOT_CA_FILE`.
const CA_WHAT_TO_DO: &str = "point it at a PEM file with the proxy's CA";

/// What to do about an unusable `SSL_CERT_FILE`.
const CERT_WHAT_TO_DO: &str = "point it at a PEM bundle of trust roots (Debian: /etc/ssl/certs/ca-certificates.crt), or unset it to use the system's";

/// The certificates of `file` if it holds any, else those of the files in
/// `dirs` (unreadable or malformed entries skipped, as the system store's
/// loader does).
fn load_roots(
    file: Option<&Path>,
    dirs: &[PathBuf],
) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    if let Some(file) = file {
        let certs = read_bundle(file);
        if !certs.is_empty() {
            return certs;
        }
    }
    let mut certs: Vec<_> = dirs
        .iter()
        .flat_map(|dir| rustls_native_certs::load_certs_from_paths(None, Some(dir)).certs)
        .collect();
    certs.sort_unstable_by(|a, b| a.as_ref().cmp(b.as_ref()));
    certs.dedup();
    certs
}

/// The certificates of the PEM bundle `file` (unreadable or malformed
/// sections skipped, as the system store's loader does): read by
/// [`pem::certificates`] when it is plain, else by rustls-native-certs.
fn read_bundle(file: &Path) -> Vec<CertificateDer<'static>> {
    if let Ok(text) = std::fs::read(file)
        && let Some(certs) = pem::certificates(&text)
    {
        return certs;
    }
    rustls_native_certs::load_certs_from_paths(Some(file), None).certs
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
    if let Some(problem) = cert_file_not_regular() {
        bail!(problem);
    }
    let system = system_roots();
    if (system.is_empty() || CERT_FILE_GAVE_NONE.load(std::sync::atomic::Ordering::Relaxed))
        && let Some(problem) = unusable_cert_env()
    {
        bail!(problem);
    }
    // A sandbox without a CA store: the bundled roots.
    let system = if system.is_empty() {
        webpki_root_certs::TLS_SERVER_ROOT_CERTS
    } else {
        system
    };
    let extra = match ca_file {
        Some(path) => read_ca_file(path)?,
        None => Vec::new(),
    };
    let build = |roots: &[&CertificateDer<'static>]| {
        customize(
            reqwest::Client::builder()
                .dns_resolver(std::sync::Arc::new(SystemResolver))
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(concat!("hosted-boot/", env!("CARGO_PKG_VERSION")))
                .tls_certs_only(
                    roots
                        .iter()
                        .filter_map(|der| reqwest::Certificate::from_der(der).ok()),
                ),
        )
        .build()
    };
    let all: Vec<_> = system.iter().chain(&extra).collect();
    let failure = match build(&all) {
        Ok(client) => return Ok(client),
        Err(e) => e,
    };
    // Only a failed build pays for parsing each root on its own: a root
    // rustls cannot parse failed the whole client with a message naming no
    // file ("invalid peer certificate: BadEncoding"). It is skipped, as
    // OpenSSL skips it, with a warning naming its file.
    let kept_system = parsable_roots(
        system,
        "the system store",
        CERT_WHAT_TO_DO,
        system_store_files,
    )?;
    let kept_extra = parsable_roots(&extra, "HOSTED_BOOT_CA_FILE", CA_WHAT_TO_DO, || {
        ca_file.map(Path::to_path_buf).into_iter().collect()
    })?;
    if kept_system.len() == system.len() && kept_extra.len() == extra.len() {
        return Err(failure).context("cannot set up TLS for the HTTP client");
    }
    let kept: Vec<_> = kept_system.into_iter().chain(kept_extra).collect();
    build(&kept).context("cannot set up TLS for the HTTP client")
}

/// The roots of `roots` rustls can use as trust anchors. When some are not,
/// a warning names the files of `files` (the files the store was read
/// from, listed only then) that hold them.
///
/// Errors: no root of a non-empty `roots` is usable (a configuration
/// error: falling back to no roots, or to the bundled ones, would fail
/// every handshake with `UnknownIssuer`, far from the cause).
fn parsable_roots<'a>(
    roots: &'a [CertificateDer<'static>],
    store: &str,
    what_to_do: &str,
    files: impl FnOnce() -> Vec<PathBuf>,
) -> anyhow::Result<Vec<&'a CertificateDer<'static>>> {
    let (kept, bad): (Vec<_>, Vec<_>) = roots
        .iter()
        .partition(|der| rustls::RootCertStore::empty().add((*der).clone()).is_ok());
    if bad.is_empty() {
        return Ok(kept);
    }
    let holding: Vec<String> = files()
        .into_iter()
        .filter(|file| {
            rustls_native_certs::load_certs_from_paths(Some(file), None)
                .certs
                .iter()
                .any(|c| bad.contains(&c))
        })
        .map(|file| file.display().to_string())
        .collect();
    let holding = if holding.is_empty() {
        "a file of the store".to_string()
    } else {
        holding.join(", ")
    };
    if kept.is_empty() {
        bail!(
            "no trust root of {store} can be used: rustls cannot parse the {} certificate(s) of {holding}; {what_to_do}",
            bad.len()
        );
    }
    tracing::warn!(
        skipped = bad.len(),
        kept = kept.len(),
        files = %holding,
        "trust roots rustls cannot parse were skipped: {store} in {holding}; replace or remove them"
    );
    Ok(kept)
}

/// The files the system store is read from ([`system_roots`]):
/// `SSL_CERT_FILE` and the files of each `SSL_CERT_DIR` directory when
/// either is set, else the bundle file and CA directories OpenSSL's probe
/// finds. Read only to name a file in a warning.
fn system_store_files() -> Vec<PathBuf> {
    let (file, dirs) = match (
        std::env::var_os("SSL_CERT_FILE"),
        std::env::var_os("SSL_CERT_DIR"),
    ) {
        (None, None) => {
            let probe = openssl_probe::probe();
            (probe.cert_file, probe.cert_dir)
        }
        (file, dirs) => (
            file.map(PathBuf::from),
            dirs.map(|d| std::env::split_paths(&d).collect())
                .unwrap_or_default(),
        ),
    };
    let mut files: Vec<PathBuf> = file.into_iter().collect();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut in_dir: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        in_dir.sort();
        files.extend(in_dir);
    }
    files
}

/// Why the store `SSL_CERT_FILE` or `SSL_CERT_DIR` names gave no root, when
/// one is set: the system store's loader skips what it cannot use without
/// a word, and with the bundled roots in its place every handshake with a
/// private CA then failed `UnknownIssuer`, far from the cause. Called only
/// when no root was found, so a working store costs nothing here.
fn unusable_cert_env() -> Option<String> {
    const WHAT_TO_DO: &str = CERT_WHAT_TO_DO;
    if let Some(file) = std::env::var_os("SSL_CERT_FILE") {
        let file = PathBuf::from(file);
        return Some(match std::fs::read(&file) {
            Err(e) => format!(
                "cannot read SSL_CERT_FILE {} ({e}); {WHAT_TO_DO}",
                file.display()
            ),
            Ok(_) => format!(
                "SSL_CERT_FILE {} holds no PEM certificate; {WHAT_TO_DO}",
                file.display()
            ),
        });
    }
    std::env::var_os("SSL_CERT_DIR").map(|dir| {
        format!(
            "SSL_CERT_DIR {} holds no readable PEM certificate; point it at a directory of trust roots (Debian: /etc/ssl/certs), or unset it to use the system's",
            PathBuf::from(dir).display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PEM file of the bundled roots `pick` selects.
    fn pem(path: &Path, pick: impl Fn(usize) -> bool) -> Vec<Vec<u8>> {
        use base64::Engine;
        let mut text = String::new();
        let mut picked = Vec::new();
        for (i, der) in webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().enumerate() {
            if pick(i) {
                let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
                text.push_str("-----BEGIN CERTIFICATE-----\n");
                for line in b64.as_bytes().chunks(64) {
                    text.push_str(std::str::from_utf8(line).unwrap());
                    text.push('\n');
                }
                text.push_str("-----END CERTIFICATE-----\n");
                picked.push(der.as_ref().to_vec());
            }
        }
        std::fs::write(path, text).unwrap();
        picked
    }

    fn ders(certs: &[rustls::pki_types::CertificateDer<'static>]) -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = certs.iter().map(|c| c.as_ref().to_vec()).collect();
        v.sort();
        v
    }

    #[test]
    fn the_bundle_file_is_read_and_the_directory_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("certs");
        std::fs::create_dir(&dir).unwrap();
        let mut in_bundle = pem(&tmp.path().join("bundle.crt"), |i| i < 3);
        pem(&dir.join("only-in-dir.pem"), |i| i == 5);
        let roots = load_roots(Some(&tmp.path().join("bundle.crt")), &[dir]);
        in_bundle.sort();
        assert_eq!(ders(&roots), in_bundle);
    }

    #[test]
    fn without_a_bundle_file_the_directory_is_read() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("certs");
        std::fs::create_dir(&dir).unwrap();
        let mut a = pem(&dir.join("a.pem"), |i| i == 1);
        let b = pem(&dir.join("b.pem"), |i| i == 2);
        std::fs::write(tmp.path().join("empty.crt"), "").unwrap();
        a.extend(b);
        a.sort();
        // A missing bundle file, and one that holds no certificate.
        assert_eq!(ders(&load_roots(None, std::slice::from_ref(&dir))), a);
        assert_eq!(
            ders(&load_roots(
                Some(&tmp.path().join("empty.crt")),
                std::slice::from_ref(&dir)
            )),
            a
        );
    }

    #[test]
    fn the_client_builds_with_the_system_roots_and_a_ca_file() {
        let tmp = tempfile::tempdir().unwrap();
        pem(&tmp.path().join("ca.pem"), |i| i == 0);
        assert!(http_client(None).is_ok());
        assert!(http_client(Some(&tmp.path().join("ca.pem"))).is_ok());
        // A second call reads no file: the same roots.
        assert_eq!(system_roots().as_ptr(), system_roots().as_ptr());
    }
}
