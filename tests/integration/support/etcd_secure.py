# SPDX-License-Identifier: MIT
"""An etcd of the test's own with authentication or TLS (test_etcd.py's
step 3): make_certs() writes, with openssl in a directory, a CA, a server
certificate for 127.0.0.1 (and the name etcd.test) and a client
certificate signed by it, and a second CA that signed none of them.
SecureEtcd is support/etcd.py's EtcdServer serving https with those
(client certificates required with client_auth), or with a root user and
auth enabled (enable_auth); its call(), keys() and lease_ttl() speak the
same TLS and send a token once auth is on.
"""
import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request

from support.etcd import ETCD, EtcdServer

ROOT_PASSWORD = "s3cret-\"root\"-pw"


def _openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, capture_output=True)


def make_certs(d):
    """Writes ca.crt, server.crt/key (127.0.0.1, etcd.test), client.crt/key
    (CN root, by ca) and other-ca.crt into d; returns {name: path}."""
    def ca(name):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                 "-subj", "/CN=lockshim test %s" % name, "-keyout", name + ".key",
                 "-out", name + ".crt", cwd=d)

    def leaf(name, cn, ext):
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write(ext)
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=" + cn,
                 "-keyout", name + ".key", "-out", name + ".csr", cwd=d)
        _openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-extfile", name + ".ext",
                 "-out", name + ".crt", cwd=d)

    ca("ca")
    ca("other-ca")
    # clientAuth too: with --client-cert-auth, etcd's gateway dials its own
    # gRPC server with the server certificate.
    leaf("server", "127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:etcd.test\n"
         "extendedKeyUsage=serverAuth,clientAuth\n")
    leaf("client", "root", "extendedKeyUsage=clientAuth\n")
    return {n: os.path.join(d, n) for n in ("ca.crt", "other-ca.crt", "server.crt",
                                            "server.key", "client.crt", "client.key")}


class SecureEtcd(EtcdServer):
    """One member; certs (make_certs's) makes it serve https only;
    client_auth: only to clients with a certificate of its CA; extra:
    more arguments of etcd."""

    def __init__(self, certs=None, client_auth=False, extra=()):
        super().__init__("s")
        self.certs = certs
        self.client_auth = client_auth
        self.extra = list(extra)
        self.token = self.password = None
        self.ctx = None
        if certs:
            self.ctx = ssl.create_default_context(cafile=certs["ca.crt"])
            self.ctx.load_cert_chain(certs["client.crt"], certs["client.key"])
        handlers = [urllib.request.ProxyHandler({})]
        if self.ctx:
            handlers.append(urllib.request.HTTPSHandler(context=self.ctx))
        self.opener = urllib.request.build_opener(*handlers)

    def url(self):
        return "%s://127.0.0.1:%d" % ("https" if self.certs else "http", self.port)

    def launch(self, cluster, token):
        tls = []
        if self.certs:
            tls = ["--cert-file", self.certs["server.crt"], "--key-file",
                   self.certs["server.key"]]
            if self.client_auth:
                tls += ["--client-cert-auth", "--trusted-ca-file", self.certs["ca.crt"]]
        logf = open(self.log, "a")
        self.proc = subprocess.Popen(
            [ETCD, "--name", self.name, "--data-dir", os.path.join(self.dir, "data"),
             "--listen-client-urls", self.url(), "--advertise-client-urls", self.url(),
             "--listen-peer-urls", self.peer_url(),
             "--initial-advertise-peer-urls", self.peer_url(),
             "--initial-cluster", cluster, "--initial-cluster-token", token,
             "--log-outputs", "stderr"] + tls + self.extra,
            stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, cwd=self.dir)
        logf.close()

    def call(self, path, body, timeout=10):
        """POSTs body (JSON) to path over this server's TLS, with the token
        once auth is on (a new one when etcd refuses it: it expired);
        returns the decoded reply."""
        try:
            return self._post(path, body, timeout)
        except urllib.error.HTTPError as e:
            if not (self.token and e.code == 401 and path != "/v3/auth/authenticate"):
                raise
        self.token = None  # etcd refuses an authenticate with a stale token too
        self.token = self._post("/v3/auth/authenticate", {"name": "root",
                                                           "password": self.password},
                                timeout)["token"]
        return self._post(path, body, timeout)

    def _post(self, path, body, timeout):
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = self.token
        req = urllib.request.Request(self.url() + path, data=json.dumps(body).encode(),
                                     headers=headers)
        with self.opener.open(req, timeout=timeout) as r:
            return json.loads(r.read())

    def enable_auth(self, password=ROOT_PASSWORD):
        """Adds user root (role root) with password, enables auth, and keeps a
        token of root for call()."""
        self.call("/v3/auth/user/add", {"name": "root", "password": password})
        self.call("/v3/auth/role/add", {"name": "root"})
        self.call("/v3/auth/user/grant", {"user": "root", "role": "root"})
        self.call("/v3/auth/enable", {})
        self.password = password
        self.token = self.call("/v3/auth/authenticate",
                               {"name": "root", "password": password})["token"]
        return self
