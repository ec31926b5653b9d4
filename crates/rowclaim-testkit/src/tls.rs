//! Certificates a test makes for itself (with the `openssl` command): a CA of its own and a
//! server certificate it signed, for servers that speak TLS.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A CA made for one test, in a temp dir that lives as long as it does.
pub struct TestCa {
    dir: tempfile::TempDir,
}

/// A server certificate and its key, PEM.
pub struct ServerCert {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

impl TestCa {
    /// A new CA (an EC P-256 key, valid for two days).
    pub fn new() -> TestCa {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir for a test CA: {e}"));
        ec_key(dir.path(), "ca.key");
        openssl(
            dir.path(),
            &[
                "req",
                "-x509",
                "-new",
                "-key",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=rowclaim test CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
        TestCa { dir }
    }

    /// The CA's certificate (PEM), for `sslrootcert=`.
    pub fn cert_path(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A server certificate this CA signed for the DNS name `host` (and no other name).
    pub fn server_cert(&self, host: &str) -> ServerCert {
        let d = self.dir.path();
        ec_key(d, "server.key");
        let subject = format!("/CN={host}");
        openssl(
            d,
            &[
                "req",
                "-new",
                "-key",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                &subject,
            ],
        );
        let ext = format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth\nsubjectAltName=DNS:{host}\n"
        );
        std::fs::write(d.join("server.ext"), ext)
            .unwrap_or_else(|e| panic!("write server.ext: {e}"));
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "server.ext",
            ],
        );
        let read =
            |name: &str| std::fs::read(d.join(name)).unwrap_or_else(|e| panic!("read {name}: {e}"));
        ServerCert {
            cert: read("server.pem"),
            key: read("server.key"),
        }
    }
}

impl Default for TestCa {
    fn default() -> Self {
        TestCa::new()
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("run openssl (is it installed?): {e}"));
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An EC P-256 private key in `dir`, named `name`.
fn ec_key(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            name,
        ],
    );
}
