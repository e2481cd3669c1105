# SPDX-License-Identifier: MIT
"""TLS to Redis (`redis.tls`): the shim and `lockshim check` over a
redis-server that speaks TLS only (support/tls.py's TlsServer).

The test's own PKI (support/tls.py, conftest's pki): a CA, a server
certificate for DNS:localhost and IP:127.0.0.1, one for DNS:localhost only,
an expired one, a client certificate, and a second, unrelated CA with a
client certificate of its own.
- mutual exclusion over TLS (processes x threads; the control run without
  the shim loses updates), a fork child's own session, a session Redis
  closed during a call (no SIGPIPE), client certificates required and given, the
  server verified by IP address, by name (server_name, SNI) and through
  ca_dir;
- each failure names its cause, in the shim's log and in `lockshim check`:
  unknown CA, name mismatch, expired, a client certificate missing or
  refused, a plain-text port, a TLS-only port with a plain config (the
  shim's log line of the call names it too, as check does), a server silent
  during the handshake (bounded by connect_timeout_ms), a server frozen
  mid-session (bounded by command_timeout_ms), no system CA store;
  verify = false accepts any certificate;
- a guarded program that speaks TLS itself (python3's ssl, curl) keeps
  working, and the shared object shows no TLS symbol.
"""
import http.server
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time

import pytest

from support.scenarios import DROPPED_LOCK, dropped_during_a_call
from support.server import connections, start_servers
from support.tls import TlsServer
from support.util import ASAN, CLI, MULT, SHIM, TIMEOUT, run, shim_env, write_config
from support.workers import RACE_LOCK, race

pytestmark = pytest.mark.timing  # time bounds and forced races: make test-repeat

PY = "/usr/bin/python3"  # Debian's, whose ssl module is OpenSSL's
CALL = 'locks = ( { symbol = "other_call"; key = "tls"; wait_ms = 300; linger_ms = 0; } );\n'
OTHER_OK, OTHER_SKIPPED = "other rc=2 errno=0", "other rc=-1 errno=16"


# ---- the PKI -----------------------------------------------------------------

# ---- a TLS-only redis-server -------------------------------------------------

@pytest.fixture
def tls_servers(request, pki):
    """Starts TLS redis-servers (TlsServer's arguments); each is stopped by
    pid when the test ends, its log printed if the test failed."""
    yield from start_servers(request, lambda **kw: TlsServer(pki, **kw),
                             lambda s: "redis-server (TLS, %s)" % s.cert)


def tls_config(tmp_path, port, body=CALL, host="127.0.0.1", redis_extra="", **tls):
    """A config for host:port with a tls group of the settings tls (strings
    quoted, booleans as they are)."""
    group = " ".join("%s = %s;" % (k, str(v).lower() if isinstance(v, bool) else '"%s"' % v)
                     for k, v in tls.items())
    return write_config(tmp_path, None, 'redis = { host = "%s"; port = %d; %s tls = { %s }; };\n%s'
                        % (host, port, redis_extra, group, body))


def check(cfg):
    return subprocess.run([CLI, "check", "-c", cfg], env=shim_env(None, preload=False),
                          capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)


def call_once(progs, cfg):
    """One guarded other_call(1) under the shim: (stdout line, stderr)."""
    r = run([progs["driver"], "other:1"], cfg)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip(), r.stderr


def assert_fails(progs, cfg, cause):
    """The guarded call is skipped with cause in the shim's log, and
    `lockshim check` exits 69 naming it."""
    out, err = call_once(progs, cfg)
    assert out == OTHER_SKIPPED and cause in err, err
    r = check(cfg)
    assert r.returncode == 69 and cause in r.stderr, (r.stdout, r.stderr)
    return r.stderr


# ---- it works ----------------------------------------------------------------

def test_control_without_the_shim_loses_updates(progs, tmp_path):
    assert race(progs["ledger"], "direct", str(tmp_path / "c"), None, procs=3, iters=10,
                threads=3) < 90


def test_processes_and_threads_exclude_each_other_over_tls(progs, tls_servers, pki, tmp_path):
    """3 processes x 3 threads on one counter, every connection TLS verified
    by IP address: exact, and the lock keys were Redis's (TLS port only)."""
    srv = tls_servers()
    cfg = tls_config(tmp_path, srv.port, RACE_LOCK, ca_file=pki["ca"])
    assert race(progs["ledger"], "direct", str(tmp_path / "c"), cfg, procs=3, iters=10,
                threads=3) == 90
    assert connections(srv) > 3


def test_fork_child_has_its_own_tls_session(progs, tls_servers, pki, tmp_path):
    """After the parent's session is up, a fork child's guarded calls open a
    session of their own (the parent's is never used by both), and the
    parent's keeps working."""
    srv = tls_servers()
    cfg = tls_config(tmp_path, srv.port, 'locks = ( { symbol = "other_call"; key = "tls"; '
                     'linger_ms = 0; }, { symbol = "hold_call"; key = "own"; } );\n',
                     ca_file=pki["ca"])
    r = run([progs["driver"], "other:1", "fork", "other:1"], cfg)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines.count(OTHER_OK) == 2, r.stdout
    assert "child-other rc=2 errno=0" in lines and "child-own rc=42 errno=0" in lines, r.stdout
    assert " error: " not in r.stderr and " warn: " not in r.stderr, r.stderr


def test_connection_closed_by_redis_is_no_sigpipe_over_tls(hostile, tls_servers, pki, tmp_path,
                                                           procs):
    """test_hostile's CLIENT KILL during a guarded call, over TLS: no
    SIGPIPE, and the next call is guarded at once on a new session (the
    release is not written into the dead one)."""
    srv = tls_servers()
    cfg = tls_config(tmp_path, srv.port, 'log_level = "debug";\nlocks = ( %s );\n'
                     % DROPPED_LOCK, ca_file=pki["ca"])
    dropped_during_a_call(hostile, srv, cfg, procs, "client-kill")


def test_check_passes_over_tls(tls_servers, pki, tmp_path):
    srv = tls_servers()
    r = check(tls_config(tmp_path, srv.port, ca_file=pki["ca"]))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "redis: ok" in r.stdout


def localhost_is_loopback():
    """Whether "localhost" resolves, and to 127.0.0.1 (a bare chroot may have
    no /etc/hosts)."""
    try:
        return any(a[4][0] == "127.0.0.1" for a in socket.getaddrinfo("localhost", 1))
    except OSError:
        return False


@pytest.mark.parametrize("how", ["server_name", "host", "ca_dir"])
def test_server_verified_by_name_and_through_ca_dir(progs, tls_servers, pki, tmp_path, how):
    """server_name = "localhost" (SNI and the name verified) on 127.0.0.1; the
    host "localhost"; the CA from a directory: each verifies and locks."""
    if how == "host" and not localhost_is_loopback():
        pytest.skip("\"localhost\" does not resolve to 127.0.0.1 here (no /etc/hosts entry?)")
    srv = tls_servers(cert="dns_only" if how != "ca_dir" else "server")
    tls = {"ca_dir": pki["cas"]} if how == "ca_dir" else {"ca_file": pki["ca"]}
    if how == "server_name":
        tls["server_name"] = "localhost"
    cfg = tls_config(tmp_path, srv.port, host="localhost" if how == "host" else "127.0.0.1",
                     **tls)
    assert call_once(progs, cfg)[0] == OTHER_OK
    assert check(cfg).returncode == 0


def test_client_certificate_required_and_given(progs, tls_servers, pki, tmp_path):
    srv = tls_servers(auth_clients=True)
    cfg = tls_config(tmp_path, srv.port, ca_file=pki["ca"], cert_file=pki["client"],
                     key_file=pki["client.key"])
    out, err = call_once(progs, cfg)
    assert out == OTHER_OK, err
    assert check(cfg).returncode == 0


def test_verify_false_accepts_a_certificate_of_an_unknown_ca(progs, tls_servers, pki, tmp_path):
    srv = tls_servers()
    cfg = tls_config(tmp_path, srv.port, ca_file=pki["other"], verify=False)
    assert call_once(progs, cfg)[0] == OTHER_OK
    assert check(cfg).returncode == 0


# ---- each failure names its cause ------------------------------------------

def test_client_certificate_required_and_missing(progs, tls_servers, pki, tmp_path):
    srv = tls_servers(auth_clients=True)
    err = assert_fails(progs, tls_config(tmp_path, srv.port, ca_file=pki["ca"]),
                       "TLS: the server requires a client certificate")
    assert "cert_file" in err


def test_client_certificate_of_an_unknown_ca(progs, tls_servers, pki, tmp_path):
    srv = tls_servers(auth_clients=True)
    assert_fails(progs, tls_config(tmp_path, srv.port, ca_file=pki["ca"],
                                   cert_file=pki["stranger"], key_file=pki["stranger.key"]),
                 "TLS: the server refused the client certificate (alert ")


def test_unknown_ca(progs, tls_servers, pki, tmp_path):
    srv = tls_servers()
    err = assert_fails(progs, tls_config(tmp_path, srv.port, ca_file=pki["other"]),
                       "connect to 127.0.0.1:%d: TLS: certificate not trusted (unknown CA)"
                       % srv.port)
    assert "name mismatch" not in err


def test_system_ca_store_by_default(progs, tls_servers, tmp_path):
    """No ca_file or ca_dir: the system's store, which lacks the test CA."""
    srv = tls_servers()
    assert_fails(progs, tls_config(tmp_path, srv.port), "certificate not trusted (unknown CA)")


def test_server_name_mismatch(progs, tls_servers, pki, tmp_path):
    srv = tls_servers()
    assert_fails(progs, tls_config(tmp_path, srv.port, ca_file=pki["ca"],
                                   server_name="redis.internal"),
                 "TLS: certificate name mismatch: expected redis.internal")


def test_ip_address_mismatch(progs, tls_servers, pki, tmp_path):
    """A certificate for DNS:localhost only, reached by 127.0.0.1."""
    srv = tls_servers(cert="dns_only")
    assert_fails(progs, tls_config(tmp_path, srv.port, ca_file=pki["ca"]),
                 "TLS: certificate name mismatch: expected 127.0.0.1")


def test_expired_certificate(progs, tls_servers, pki, tmp_path):
    srv = tls_servers(cert="expired")
    err = assert_fails(progs, tls_config(tmp_path, srv.port, ca_file=pki["ca"]),
                       "TLS: certificate expired")
    assert "not trusted" not in err and "mismatch" not in err


def test_plain_config_on_the_tls_port_is_a_tls_only_port(progs, tls_servers, tmp_path):
    """`lockshim check` and the shim's own log line of the guarded call
    both name the likely cause (the same words: backend_plain_tls_hint),
    not only "Connection reset by peer"."""
    srv = tls_servers()
    cfg = write_config(tmp_path, None, 'redis = { port = %d; };\n%s' % (srv.port, CALL))
    r = check(cfg)
    assert r.returncode == 69 and "TLS-only port" in r.stderr, (r.stdout, r.stderr)
    assert r.stderr.count("likely cause:") == 1, r.stderr
    out, err = call_once(progs, cfg)
    assert out == OTHER_SKIPPED, err
    lines = [l for l in err.splitlines() if "not taken" in l]
    assert lines and "a TLS-only port? (lockshim speaks plain TCP)" in lines[-1], err


def test_tls_config_on_a_plain_port(progs, redis, pki, tmp_path):
    """A plain Redis port reads the ClientHello as an inline command: it
    waits for a newline (no answer within connect_timeout_ms) or, when the
    hello's random bytes hold one, answers an error in plain text."""
    err = assert_fails(progs, tls_config(tmp_path, redis.port, ca_file=pki["ca"]),
                       "(a port without TLS?)")
    assert ("TLS: no answer to the handshake within redis.connect_timeout_ms" in err or
            "TLS: the server answered in plain text" in err), err


def test_server_answering_in_plain_text(progs, pki, tmp_path):
    """A server that answers the ClientHello in plain text at once."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(16)

        def answer():
            while True:
                try:
                    c, _ = srv.accept()
                except OSError:
                    return
                with c:
                    c.recv(4096)
                    c.sendall(b"-ERR unknown command\r\n")
        threading.Thread(target=answer, daemon=True).start()
        cfg = tls_config(tmp_path, srv.getsockname()[1], ca_file=pki["ca"])
        assert_fails(progs, cfg, "TLS: the server answered in plain text (a port without TLS?)")
        srv.shutdown(socket.SHUT_RDWR)


def test_silent_server_is_bounded_by_connect_timeout(progs, pki, tmp_path):
    """A port that accepts connections and never answers: the handshake
    gives up at connect_timeout_ms, with the cause."""
    with socket.socket() as quiet:
        quiet.bind(("127.0.0.1", 0))
        quiet.listen(16)  # never accepted: the kernel completes the TCP handshake
        cfg = tls_config(tmp_path, quiet.getsockname()[1], ca_file=pki["ca"],
                         redis_extra="connect_timeout_ms = 300;")
        t0 = time.monotonic()
        r = check(cfg)
        took = time.monotonic() - t0
    assert r.returncode == 69 and "TLS: no answer to the handshake" in r.stderr, r.stderr
    assert took < 0.3 + 2 * MULT


def test_frozen_server_is_bounded_by_command_timeout(progs, tls_servers, pki, tmp_path, procs):
    """Redis stopped (SIGSTOP) after the TLS session is up: the next call
    fails within command_timeout_ms, reported as a timeout, and is skipped."""
    srv = tls_servers()
    cfg = tls_config(tmp_path, srv.port, ca_file=pki["ca"],
                     redis_extra="command_timeout_ms = 300;")
    p = procs([progs["driver"], "other:1", "stdin", "other:1"], cfg)
    assert p.expect("other") == OTHER_OK
    os.kill(srv.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        p.send()
        assert p.expect("other") == OTHER_SKIPPED
        assert time.monotonic() - t0 < 0.3 * 3 + 2 * MULT
    finally:
        os.kill(srv.proc.pid, signal.SIGCONT)
    rc, _, err = p.finish()
    assert rc == 0 and "timed out after 300 ms" in err, err


def test_missing_system_ca_store_is_named(pki, tls_servers, tmp_path):
    """Without Debian's ca-certificates bundle (hidden by an empty tmpfs in a
    private mount namespace) and no ca_file: the error says so."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no private mount namespace here (a chroot whose root is not a mount "
                    "point)")
    srv = tls_servers()
    cfg = tls_config(tmp_path, srv.port)
    r = subprocess.run(["unshare", "-m", "sh", "-c",
                        "mount -t tmpfs none /etc/ssl/certs && exec \"$0\" check -c \"$1\"",
                        CLI, cfg], env=shim_env(None, preload=False), capture_output=True,
                       text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert r.returncode == 69, (r.stdout, r.stderr)
    assert "TLS: no CA store: /etc/ssl/certs/ca-certificates.crt" in r.stderr
    assert "ca-certificates" in r.stderr and "ca_file" in r.stderr


# ---- the program's own TLS ---------------------------------------------------

BODY = "hello over https\n"


@pytest.fixture
def https(pki):
    """A python https server on 127.0.0.1 (the test CA's server certificate)
    in a thread; yields its port."""
    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY.encode())

        def log_message(self, *args):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki["server"], pki["server.key"])
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


FETCH = """
import os, ssl, sys, urllib.request
os.fsync(os.open(sys.argv[3], os.O_WRONLY | os.O_CREAT))
ctx = ssl.create_default_context(cafile=sys.argv[2])
sys.stdout.write(urllib.request.urlopen(sys.argv[1], context=ctx, timeout=30).read().decode())
"""


@pytest.mark.parametrize("prog", ["python3", "curl"])
def test_guarded_program_with_its_own_tls(tls_servers, pki, https, tmp_path, prog):
    """Python's ssl (OpenSSL) and curl fetch https://127.0.0.1 while the
    shim guards their own OpenSSL handshake (and python's fsync) over its
    TLS connection: the page arrives and every guarded call took the lock."""
    if ASAN and prog == "curl":
        pytest.skip("curl with libasan preloaded hangs in setlocale, with or without the shim")
    srv = tls_servers()
    url = "https://127.0.0.1:%d/" % https
    symbols = ["SSL_do_handshake", "fsync"] if prog == "python3" else ["SSL_connect"]
    cfg = tls_config(tmp_path, srv.port, 'log_level = "debug";\nlocks = ( %s );\n'
                     % ", ".join('{ symbol = "%s"; }' % s for s in symbols), ca_file=pki["ca"])
    argv = ([PY, "-c", FETCH, url, pki["ca"], str(tmp_path / "f")] if prog == "python3" else
            ["curl", "-sS", "--cacert", pki["ca"], url])
    r = run(argv, cfg)
    assert r.returncode == 0 and r.stdout == BODY, r.stderr
    for s in symbols:
        assert "acquired lockshim:%s for" % s in r.stderr, r.stderr
    assert " error: " not in r.stderr, r.stderr


def test_no_tls_symbol_is_visible(tmp_path):
    """The shared object exports nothing but its version node, and neither
    defines nor needs an mbedtls_* symbol dynamically."""
    defined = subprocess.run(["nm", "-D", "--defined-only", SHIM], capture_output=True,
                             text=True, check=True).stdout.split("\n")
    assert [l.split()[-1] for l in defined if l.strip()] == ["LOCKSHIM_1"]
    dynamic = subprocess.run(["nm", "-D", SHIM], capture_output=True, text=True,
                             check=True).stdout
    assert "mbedtls" not in dynamic and "SSL_" not in dynamic
