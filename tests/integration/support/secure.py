# SPDX-License-Identifier: MIT
"""The set-user-ID layout of the secure-execution tests (test_secure.py,
and test_postgres.py's libpq variables): a set-user-ID root program run
by nobody in a private mount namespace (progs/secure_launch.c, static, so
the preload never applies to it) whose /etc is an overlay with the test's
own ld.so.preload and lockshim/ directory; the machine's /etc is never
written. Layout holds the files; run() starts the program there.
"""
import grp
import os
import pwd
import shutil
import subprocess
import tempfile

import pytest

from support.server import lock_keys
from support.util import PRELOAD, TIMEOUT, cc, shim_env

NOBODY = pwd.getpwnam("nobody").pw_uid
NOGROUP = grp.getgrnam("nogroup").gr_gid
PASSWORD = "trusted-pass"
SECRET = "root-only-secret"



class Layout:
    """The files of one test under a fresh 0755 directory in /tmp (not
    nosuid): bin/ (the programs), upper/ (what the overlay adds to /etc),
    private/ (root-only: the secret the user's config names), user/
    (nobody's: the user's config)."""

    def __init__(self, redis_port, fake_port):
        self.base = tempfile.mkdtemp(prefix="lss", dir="/tmp")
        os.chmod(self.base, 0o755)
        p = lambda *a: os.path.join(self.base, *a)
        for d, mode in [("bin", 0o755), ("upper", 0o755), ("work", 0o755),
                        ("private", 0o700), ("user", 0o755), ("upper/lockshim", 0o755),
                        ("upper/lockshim/log", 0o755)]:
            os.mkdir(p(d))
            os.chmod(p(d), mode)
        os.chown(p("user"), NOBODY, NOGROUP)
        self.launch = cc(p("bin", "launch"), ["secure_launch.c"], "-static", "-O2")
        self.plain = cc(p("bin", "plain"), ["secure.c"], "-O0")
        self.secure = p("bin", "secure")
        shutil.copy(self.plain, self.secure)
        os.chown(self.secure, 0, 0)
        os.chmod(self.secure, 0o4755)
        self.upper, self.work = p("upper"), p("work")
        self.etc = p("upper", "lockshim")
        self.cfg = p("upper", "lockshim", "lockshim.cfg")
        self.passfile = p("upper", "lockshim", "redis.pass")
        self.logdir = p("upper", "lockshim", "log")
        self.secret = p("private", "secret")
        self.user_log = p("private", "user.log")
        self.user_cfg = p("user", "user.cfg")
        self._write(p("upper", "ld.so.preload"), PRELOAD + "\n", 0o644)
        self._write(self.passfile, PASSWORD + "\n", 0o600)
        self._write(self.secret, SECRET + "\n", 0o600)
        self._write(self.cfg, (
            'redis = { host = "127.0.0.1"; port = %d; password_file = "/etc/lockshim/redis.pass"; };\n'
            'log_file = "/etc/lockshim/log/lockshim.log";\n'
            'locks = ( { symbol = "secure_work"; key = "secure"; } );\n') % redis_port, 0o644)
        self.write_user_cfg(fake_port, self.secret, self.user_log)

    @staticmethod
    def _write(path, text, mode):
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)

    def write_user_cfg(self, port, password_file, log_file):
        pw = 'password_file = "%s";' % password_file if password_file else ""
        self._write(self.user_cfg, (
            'redis = { host = "127.0.0.1"; port = %d; %s };\n'
            'log_file = "%s";\nlog_level = "debug";\n'
            'locks = ( { symbol = "secure_work"; key = "user"; } );\n') % (port, pw, log_file),
            0o644)
        os.chown(self.user_cfg, NOBODY, NOGROUP)

    def run(self, prog, redis, **user_env):
        """Runs prog as nobody in the namespace with user_env (the user's
        LOCKSHIM_* variables, nothing else of the kind); inside the call,
        notes the lock keys and redis's clients. Returns (rc, stdout,
        stderr, keys, clients)."""
        env = {k: v for k, v in shim_env(None, preload=False).items()
               if not k.startswith("LOCKSHIM_")}
        env.update(user_env)
        p = subprocess.Popen([self.launch, self.upper, self.work, str(NOBODY), str(NOGROUP),
                              prog], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        keys = clients = None
        try:
            first = p.stdout.readline()
            if first.startswith("enter"):
                keys = lock_keys(redis)
                clients = len(redis.cmd("CLIENT", "LIST").splitlines()) - 1
                p.stdin.write("go\n")
                p.stdin.flush()
            out, err = p.communicate(timeout=TIMEOUT)
            if p.returncode == 2 and err.startswith("secure_launch: namespace:"):
                # A chroot (CI's bare-Debian proof) has no mount point at /
                # to make private: the namespace cannot be made there.
                pytest.skip("no private mount namespace here: " + err.strip())
            return p.returncode, first + out, err, keys, clients
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()

    def cleanup(self):
        shutil.rmtree(self.base, ignore_errors=True)
