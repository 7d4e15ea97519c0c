//! A fast reader of PEM certificate bundles, for the system store's bundle
//! file (Debian's is 220 KB).
//!
//! rustls-pki-types' PEM reader decodes base64 a byte at a time, with the
//! care a private key needs: reading that bundle was a third of the
//! runner's start-up to its first request (BENCHMARKS.md, "Start-up",
//! callgrind: 8.6 M of 26.0 M instructions, 5.7 M of them in its base64).
//! Certificates are public, so this reader splits the sections itself and
//! decodes each with the `base64` crate. It understands only the bundle's
//! plain form: a file with any other section, or a section it cannot
//! decode, is left to rustls-pki-types (`None`), so what is accepted, what
//! is skipped and what is reported stay that reader's.

use base64::Engine;
use rustls::pki_types::CertificateDer;

const BEGIN: &[u8] = b"-----BEGIN CERTIFICATE-----";
const END: &[u8] = b"-----END CERTIFICATE-----";

/// Largest base64 section read here (bytes, whitespace removed); a larger
/// one is rustls-pki-types' to refuse. No root certificate comes near it.
const MAX_SECTION: usize = 64 * 1024;

/// A marker line without the trailing spaces and `\r` rustls-pki-types
/// also ignores there (not a tab or a form feed, which it refuses).
fn marker(line: &[u8]) -> &[u8] {
    let end = line
        .iter()
        .rposition(|&b| b != b' ' && b != b'\r')
        .map_or(0, |i| i + 1);
    &line[..end]
}

/// The certificates (DER, in file order) of the PEM bundle `pem`, when
/// every line of it that begins `-----BEGIN ` opens a `CERTIFICATE` section
/// that a `-----END CERTIFICATE-----` line closes and whose body is
/// canonical base64 (spaces, tabs and line ends aside); text outside the
/// sections is ignored, as rustls-pki-types ignores it. `None` for any
/// other file: the caller reads it with rustls-pki-types instead.
pub(super) fn certificates(pem: &[u8]) -> Option<Vec<CertificateDer<'static>>> {
    // rustls-pki-types also ends a line at a `\r`: only `\r\n` is read
    // here, a lone `\r` is its reader's.
    if memchr::memchr_iter(b'\r', pem).any(|i| pem.get(i + 1) != Some(&b'\n')) {
        return None;
    }
    let mut certs = Vec::new();
    let mut body: Option<Vec<u8>> = None;
    let mut rest = pem;
    while !rest.is_empty() {
        let (line, next) = match memchr::memchr(b'\n', rest) {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &rest[rest.len()..]),
        };
        rest = next;
        match &mut body {
            None => {
                if line.starts_with(b"-----BEGIN ") {
                    if marker(line) != BEGIN {
                        return None;
                    }
                    body = Some(Vec::with_capacity(2048));
                }
            }
            Some(b64) => {
                if line.starts_with(b"-----") {
                    if marker(line) != END {
                        return None;
                    }
                    let der = base64::engine::general_purpose::STANDARD
                        .decode(&*b64)
                        .ok()?;
                    certs.push(CertificateDer::from(der));
                    body = None;
                    continue;
                }
                // A subset of the whitespace rustls-pki-types skips (it
                // also skips \x0b and \x0c, which fail here: its reader).
                // Every `\r` ends its line (checked above); a bundle's
                // lines hold no other.
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                if memchr::memchr2(b' ', b'\t', line).is_none() {
                    b64.extend_from_slice(line);
                } else {
                    b64.extend(line.iter().filter(|&&b| !matches!(b, b' ' | b'\t')));
                }
                if b64.len() > MAX_SECTION {
                    return None;
                }
            }
        }
    }
    body.is_none().then_some(certs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rustls::pki_types::pem::PemObject;

    /// What rustls-pki-types reads from `pem`, as rustls-native-certs keeps
    /// it: the certificates of every section it could read.
    fn reference(pem: &[u8]) -> Vec<Vec<u8>> {
        CertificateDer::pem_slice_iter(pem)
            .filter_map(Result::ok)
            .map(|c| c.as_ref().to_vec())
            .collect()
    }

    fn ders(certs: Vec<CertificateDer<'static>>) -> Vec<Vec<u8>> {
        certs.into_iter().map(|c| c.as_ref().to_vec()).collect()
    }

    /// The first `n` bundled roots as one PEM bundle, 64-column lines,
    /// `eol` line ends, `between` before each section.
    fn bundle_of(n: usize, eol: &str, between: &str) -> String {
        let mut text = String::new();
        for der in webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().take(n) {
            let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
            text.push_str(between);
            text.push_str("-----BEGIN CERTIFICATE-----");
            text.push_str(eol);
            for line in b64.as_bytes().chunks(64) {
                text.push_str(std::str::from_utf8(line).unwrap());
                text.push_str(eol);
            }
            text.push_str("-----END CERTIFICATE-----");
            text.push_str(eol);
        }
        text
    }

    fn bundle(eol: &str, between: &str) -> String {
        bundle_of(usize::MAX, eol, between)
    }

    #[test]
    fn a_plain_bundle_reads_as_rustls_reads_it() {
        for (eol, between) in [("\n", ""), ("\r\n", "# a comment\n"), ("\n", "\n\n")] {
            let text = bundle(eol, between);
            let fast = certificates(text.as_bytes()).expect("a plain bundle");
            assert_eq!(fast.len(), webpki_root_certs::TLS_SERVER_ROOT_CERTS.len());
            assert_eq!(ders(fast), reference(text.as_bytes()));
        }
    }

    #[test]
    fn the_systems_bundle_reads_as_rustls_reads_it() {
        let Some(file) = openssl_probe::probe().cert_file else {
            hosted_boot_test_support::skip(
                "this system has no CA bundle file (apt-get install ca-certificates)",
            );
            return;
        };
        let Ok(pem) = std::fs::read(&file) else {
            hosted_boot_test_support::skip(format!("cannot read {}", file.display()));
            return;
        };
        // Debian's and Fedora's bundles are plain: the fast reader must
        // take them, or start-up pays rustls-pki-types' reader again.
        let fast = certificates(&pem).expect("the system's bundle is plain PEM");
        assert!(!fast.is_empty(), "{}", file.display());
        assert_eq!(ders(fast), reference(&pem), "{}", file.display());
    }

    #[test]
    fn other_sections_and_broken_ones_are_left_to_rustls() {
        let good = bundle("\n", "");
        let cases = [
            format!("{good}-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n"),
            format!(
                "{good}-----BEGIN TRUSTED CERTIFICATE-----\nAAAA\n-----END TRUSTED CERTIFICATE-----\n"
            ),
            format!("{good}-----BEGIN CERTIFICATE-----\nAAAA\n"),
            format!("{good}-----BEGIN CERTIFICATE-----\nA!AA\n-----END CERTIFICATE-----\n"),
            format!("{good}-----BEGIN CERTIFICATE-----\nAA\x0bAA\n-----END CERTIFICATE-----\n"),
            format!("-----BEGIN CERTIFICATE-----\n-----BEGIN CERTIFICATE-----\n{good}"),
            // rustls-pki-types refuses a tab or form feed after a marker
            // and ends a line at a lone `\r` (found by a break-it review).
            good.replacen(
                "-----BEGIN CERTIFICATE-----\n",
                "-----BEGIN CERTIFICATE-----\t\n",
                1,
            ),
            good.replacen(
                "-----BEGIN CERTIFICATE-----\n",
                "-----BEGIN CERTIFICATE-----\x0c\n",
                1,
            ),
            format!("# c\r{good}"),
        ];
        for case in cases {
            assert!(certificates(case.as_bytes()).is_none(), "{case:.80}");
        }
    }

    proptest! {
        /// Whatever a damaged bundle holds, what the fast reader accepts is
        /// what rustls-pki-types reads.
        #[test]
        fn accepted_means_the_same(
            edits in proptest::collection::vec((0usize..1_000_000, any::<u8>(), 0u8..3), 1..6),
        ) {
            let mut pem = bundle_of(12, "\n", "# text\n").into_bytes();
            for (at, byte, op) in edits {
                let at = at % (pem.len() + 1);
                match op {
                    0 => pem.insert(at, byte),
                    1 if at < pem.len() => { pem.remove(at); }
                    _ if at < pem.len() => pem[at] = byte,
                    _ => {}
                }
            }
            if let Some(fast) = certificates(&pem) {
                prop_assert_eq!(ders(fast), reference(&pem));
            }
        }
    }
}
