# SPDX-License-Identifier: MIT
"""Secure-execution mode: a set-user-ID root program, with the shim in
/etc/ld.so.preload, run by an unprivileged user (nobody).

Each run happens in a private mount namespace made by progs/secure_launch.c
(static, so the preload never applies to it): an overlay on /etc whose
upper directory is the test's own holds ld.so.preload and lockshim/; the
machine's /etc is never written, and the namespace goes with the program.
The user's LOCKSHIM_* variables must be ignored (no file of theirs opened
or created, nothing sent to their server), /etc/lockshim/lockshim.cfg used
only when it, its password_file and its log_file's directory are root's
alone; otherwise the program runs unguarded, with one line on stderr. The
same program without the set-user-ID bit still honours the environment.
"""
import os
import socket
import threading

import pytest

from support.secure import NOBODY, NOGROUP, PASSWORD, Layout
from support.server import RedisServer, lock_keys
from support.util import SHIM, others_can_read


class Recorder:
    """A fake Redis server (the user's): records every byte it receives and
    answers each read with an error."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.data = b""
        self.done = False
        self.thread = threading.Thread(target=self._serve)
        self.thread.start()

    def _serve(self):
        while not self.done:
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            with c:
                c.settimeout(2)
                try:
                    while True:
                        b = c.recv(4096)
                        if not b:
                            break
                        self.data += b
                        c.sendall(b"-ERR fake\r\n")
                except OSError:
                    pass

    def stop(self):
        self.done = True
        self.thread.join()
        self.sock.close()


def start(password=PASSWORD):
    r = RedisServer(password=password).start()
    fake = Recorder()
    return r, fake, Layout(r.port, fake.port)


def stop(r, fake, lay):
    fake.stop()
    r.cleanup()
    lay.cleanup()


# What an unprivileged user sets, each ignored by a set-user-ID program.
USER_ENVS = {
    "config_and_log_level": lambda lay: {"LOCKSHIM_CONFIG": lay.user_cfg,
                                         "LOCKSHIM_LOG_LEVEL": "debug"},
    "redis_password": lambda lay: {"LOCKSHIM_REDIS_PASSWORD": "not-the-password"},
    "check_fd": lambda lay: {"LOCKSHIM_CHECK_FD": "1"},
}


@pytest.mark.parametrize("which", sorted(USER_ENVS))
def test_setuid_program_ignores_the_users_environment(which):
    r, fake, lay = start()
    try:
        rc, out, err, keys, clients = lay.run(lay.secure, r, **USER_ENVS[which](lay))
        # the user's config: nothing sent to their server, no root-owned file
        assert fake.data == b"", "the user's server received %r" % fake.data[:200]
        assert not os.path.exists(lay.user_log), "the user's log_file was created"
        assert "debug" not in err
        # the trusted config guards the call, with its own password
        assert "enter threads=2 euid=0" in out, (out, err)
        assert keys and keys[0].endswith(":secure"), keys
        assert rc == 0 and "leave 42" in out, (rc, out, err)
        assert err == "", err
        log = os.path.join(lay.logdir, "lockshim.log")
        assert os.path.exists(log) and os.stat(log).st_uid == 0
    finally:
        stop(r, fake, lay)


def _chmod(mode, *path):
    return lambda lay: os.chmod(os.path.join(lay.base, *path), mode)


def _chown_nobody(*path):
    return lambda lay: os.chown(os.path.join(lay.base, *path), NOBODY, NOGROUP)


def _symlink_config(lay):
    real = os.path.join(lay.etc, "real.cfg")
    os.rename(lay.cfg, real)
    os.symlink("real.cfg", lay.cfg)


def _symlink_config_dir(lay):
    os.rename(lay.etc, lay.etc + ".real")
    os.symlink("lockshim.real", lay.etc)


# Each breaks one rule of the trusted files; the reason the line must give.
UNTRUSTED = {
    "etc_group_writable": (_chmod(0o775, "upper"), 'directory "/etc"'),
    "config_dir_symlink": (_symlink_config_dir, '"/etc/lockshim" is a symbolic link'),
    "config_group_writable": (_chmod(0o664, "upper", "lockshim", "lockshim.cfg"), "lockshim.cfg"),
    "config_other_writable": (_chmod(0o646, "upper", "lockshim", "lockshim.cfg"), "lockshim.cfg"),
    "config_not_root": (_chown_nobody("upper", "lockshim", "lockshim.cfg"), "lockshim.cfg"),
    "config_symlink": (_symlink_config, "symbolic link"),
    "config_dir_group_writable": (_chmod(0o775, "upper", "lockshim"), "/etc/lockshim"),
    "password_file_other_writable": (_chmod(0o602, "upper", "lockshim", "redis.pass"),
                                     "redis.pass"),
    "password_file_not_root": (_chown_nobody("upper", "lockshim", "redis.pass"), "redis.pass"),
    "log_dir_other_writable": (_chmod(0o1777, "upper", "lockshim", "log"), "/etc/lockshim/log"),
    "log_dir_not_root": (_chown_nobody("upper", "lockshim", "log"), "/etc/lockshim/log"),
}


@pytest.mark.parametrize("which", sorted(UNTRUSTED))
def test_untrusted_files_leave_the_program_unguarded(which):
    r, fake, lay = start()
    try:
        spoil, reason = UNTRUSTED[which]
        spoil(lay)
        rc, out, err, keys, clients = lay.run(lay.secure, r,
                                              LOCKSHIM_CONFIG=lay.user_cfg)
        # one line saying why, and nothing else of the shim's
        lines = err.splitlines()
        assert len(lines) == 1, err
        assert "secure-execution mode" in lines[0] and reason in lines[0], lines
        assert "nothing is guarded in this process" in lines[0]
        # the program runs as it would without the shim: no thread, no
        # connection, no lock, no log file
        assert "enter threads=1 euid=0" in out, (out, err)
        assert keys == [] and clients == 0, (keys, clients)
        assert rc == 0 and "leave 42" in out, (rc, out, err)
        assert fake.data == b""
        assert not os.path.exists(os.path.join(lay.logdir, "lockshim.log"))
    finally:
        stop(r, fake, lay)


@pytest.mark.skipif(not others_can_read(SHIM), reason="nobody cannot read the shim here "
                    "(a directory above the build is not searchable by others)")
def test_program_without_setuid_honours_the_environment(redis):
    """Control: the same program, not set-ID, run by the same user with
    the same preload, takes LOCKSHIM_CONFIG (its own server, log file)."""
    r, fake, lay = start()
    try:
        user_log = os.path.join(lay.base, "user", "user.log")
        lay.write_user_cfg(redis.port, None, user_log)
        rc, out, err, keys, clients = lay.run(lay.plain, redis, LOCKSHIM_CONFIG=lay.user_cfg)
        assert "enter threads=2 euid=%d" % NOBODY in out, (out, err)
        assert keys and keys[0].endswith(":user"), keys
        assert rc == 0 and "leave 42" in out, (rc, out, err)
        assert os.stat(user_log).st_uid == NOBODY
        assert lock_keys(r) == []  # the trusted config's server saw nothing
    finally:
        stop(r, fake, lay)
