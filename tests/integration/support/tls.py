# SPDX-License-Identifier: MIT
"""TLS for the tests: a PKI made with openssl in a temporary directory, and
a redis-server whose only port speaks TLS.

make_pki(d) makes a CA, a server certificate for DNS:localhost and
IP:127.0.0.1, one for DNS:localhost only, an expired one, a client
certificate, and a second, unrelated CA with a client certificate of its
own; it returns their paths by name (conftest's session fixture pki).
TlsServer is a RedisServer on a TLS-only port, and TlsResp the test's own
client for it (it looks without verifying; the shim verifies).
"""
import os
import shutil
import socket
import ssl
import subprocess

from resp import Resp
from support.server import RedisServer

SAN = "DNS:localhost,IP:127.0.0.1"


# ---- the PKI -----------------------------------------------------------------

def openssl(d, *args):
    subprocess.run(["openssl"] + list(args), cwd=d, check=True, capture_output=True)


def new_key_csr(d, name, cn, rsa=False):
    key = ["rsa:2048"] if rsa else ["ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    openssl(d, "req", "-newkey", *key, "-nodes", "-keyout", name + ".key", "-out",
            name + ".csr", "-subj", "/CN=" + cn)


def new_ca(d, name, cn):
    openssl(d, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", name + ".key", "-out", name + ".crt", "-days", "2",
            "-subj", "/CN=" + cn)


def sign(d, name, san=None, ca="ca"):
    """Signs name.csr with ca (the test CA) for two days."""
    args = ["x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey", ca + ".key",
            "-CAcreateserial", "-out", name + ".crt", "-days", "2"]
    if san:
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write("subjectAltName = %s\n" % san)
        args += ["-extfile", name + ".ext"]
    openssl(d, *args)


def sign_expired(d, name, san):
    """Signs name.csr with the test CA, valid for one day of 2020."""
    with open(os.path.join(d, "ca.cnf"), "w") as f:
        f.write("[ca]\ndefault_ca = test\n[test]\ndatabase = index.txt\nnew_certs_dir = .\n"
                "serial = serial\ndefault_md = sha256\npolicy = any\nunique_subject = no\n"
                "x509_extensions = leaf\n[any]\ncommonName = supplied\n"
                "[leaf]\nsubjectAltName = %s\n" % san)
    open(os.path.join(d, "index.txt"), "w").close()
    with open(os.path.join(d, "serial"), "w") as f:
        f.write("1000\n")
    openssl(d, "ca", "-config", "ca.cnf", "-batch", "-notext", "-cert", "ca.crt", "-keyfile",
            "ca.key", "-in", name + ".csr", "-out", name + ".crt",
            "-startdate", "20200101000000Z", "-enddate", "20200102000000Z")


def make_pki(d):
    """Makes the test's certificates and keys in d; returns their paths by name."""
    new_ca(d, "ca", "lockshim test CA")
    new_ca(d, "other", "an unrelated CA")
    for name, cn, san in [("server", "localhost", SAN), ("dns_only", "localhost", "DNS:localhost"),
                          ("client", "lockshim client", None), ("stranger", "stranger", None)]:
        new_key_csr(d, name, cn, rsa=name == "client")
        sign(d, name, san, ca="other" if name == "stranger" else "ca")
    new_key_csr(d, "expired", "localhost")
    sign_expired(d, "expired", SAN)
    os.mkdir(os.path.join(d, "cas"))
    shutil.copy(os.path.join(d, "ca.crt"), os.path.join(d, "cas", "test-ca.pem"))
    p = {"cas": os.path.join(d, "cas")}
    for name in ("ca", "other", "server", "dns_only", "client", "stranger", "expired"):
        p[name], p[name + ".key"] = (os.path.join(d, name + ext) for ext in (".crt", ".key"))
    return p


# ---- a TLS-only redis-server -------------------------------------------------

class TlsResp(Resp):
    """Resp over TLS, for the test's own look at the server."""

    def __init__(self, port, ctx):  # pylint: disable=super-init-not-called
        self.s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5))
        self.f = self.s.makefile("rb")


class TlsServer(RedisServer):
    """A redis-server on 127.0.0.1 whose only port speaks TLS."""

    def __init__(self, pki, cert="server", auth_clients=False, extra=()):
        super().__init__()
        self.pki, self.cert, self.auth_clients = pki, cert, auth_clients
        self.extra = list(extra)  # more redis-server arguments

    def start(self):
        p = self.pki
        return self.launch(
            ["redis-server", "--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1",
             "--tls-cert-file", p[self.cert], "--tls-key-file", p[self.cert + ".key"],
             "--tls-ca-cert-file", p["ca"], "--tls-auth-clients",
             "yes" if self.auth_clients else "no", "--save", "", "--appendonly", "no",
             "--daemonize", "no", "--logfile", self.log, "--dir", self.dir] + self.extra,
            "redis-server with TLS on port %d" % self.port)

    def client(self):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the test looks; the shim verifies
        ctx.load_cert_chain(self.pki["client"], self.pki["client.key"])
        return TlsResp(self.port, ctx)

    def _ready(self):
        try:
            return super()._ready()
        except ssl.SSLError:
            return False
