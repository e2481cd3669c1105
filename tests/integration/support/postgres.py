# SPDX-License-Identifier: MIT
"""A PostgreSQL server of the test's own: a private cluster (initdb into a
temporary directory, owned by the `postgres` user: the server refuses to
run as root), on a free 127.0.0.1 port with its unix socket in that
directory, started as `runuser -u postgres -- postgres ...` and stopped by
its pid. restart() stops and starts it on the same port. psql() runs one
statement as the superuser. INITDB is None when no server is installed
(the tests skip, saying so).
"""
import glob
import os
import shutil
import signal
import subprocess
import tempfile

from resp import free_port
from support.process import ServerProcess
from support.util import wait_for

_BINS = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
INITDB = _BINS[-1] if _BINS else None


def skip_reason():
    """Why the postgres tests cannot run here, or None."""
    if not INITDB:
        return "no PostgreSQL server: /usr/lib/postgresql/*/bin/initdb is missing " \
               "(apt-get install postgresql)"
    if shutil.which("runuser") is None or os.geteuid() != 0:
        return "the private cluster is started as the postgres user: needs root and runuser"
    try:
        subprocess.run(["id", "postgres"], check=True, capture_output=True)
    except subprocess.CalledProcessError:
        return "no `postgres` user to run the server as"
    return None


class PostgresServer(ServerProcess):
    STOP_SIGNAL = signal.SIGINT  # fast shutdown: every session closed

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="lspg")
        os.chmod(self.dir, 0o755)
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "postgres.log")
        self.port = free_port()
        self.proc = None
        self.bindir = os.path.dirname(INITDB)
        subprocess.run(["chown", "postgres", self.dir], check=True)
        subprocess.run(["runuser", "-u", "postgres", "--", INITDB, "-D", self.data, "-A", "trust",
                        "-U", "postgres", "--no-sync"], check=True, capture_output=True,
                       cwd=self.dir)

    def conninfo(self):
        return "host=127.0.0.1 port=%d user=postgres dbname=postgres" % self.port

    def start(self):
        logf = open(self.log, "a")
        self.proc = subprocess.Popen(
            ["runuser", "-u", "postgres", "--", os.path.join(self.bindir, "postgres"),
             "-D", self.data, "-p", str(self.port), "-k", self.dir,
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=100"],
            stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, cwd=self.dir)
        logf.close()
        wait_for(self._ready, what="postgres on port %d" % self.port)
        return self

    def _ready(self):
        if self.proc.poll() is not None:
            raise AssertionError("postgres exited: %s" % self.tail())
        r = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                            "-Atc", "SELECT 1"], capture_output=True, text=True,
                           env=_plain_env())
        return r.stdout.strip() == "1"

    def psql(self, sql):
        r = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                            "-v", "ON_ERROR_STOP=1", "-Atc", sql], capture_output=True,
                           text=True, env=_plain_env())
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    def pid(self):
        """The postmaster's pid (runuser's child), from postmaster.pid."""
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            return int(f.readline())

    def _stop_pid(self):
        """The postmaster (stop() signals it; runuser, the child, exits
        after it, and is continued too: it stops itself when its child is
        stopped, and must run to reap it)."""
        try:
            return self.pid()
        except (OSError, ValueError):
            return self.proc.pid

    def restart(self):
        self.stop()
        return self.start()

    def add_password_user(self, user, password):
        """Makes role user with password, which must authenticate over TCP
        (scram-sha-256: a pg_hba.conf line before the trust ones, reloaded)."""
        self.psql("CREATE ROLE %s LOGIN PASSWORD '%s'" % (user, password))
        hba = os.path.join(self.data, "pg_hba.conf")
        with open(hba) as f:
            text = f.read()
        with open(hba, "w") as f:
            f.write("host all %s 127.0.0.1/32 scram-sha-256\n" % user + text)
        self.psql("SELECT pg_reload_conf()")


def _plain_env():
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "LOCKSHIM_CONFIG", "PGPASSWORD"):
        env.pop(k, None)
    return env
