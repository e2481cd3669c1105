# SPDX-License-Identifier: MIT
"""Processes of the test's own: what every server class shares, and what
/proc tells of a pid.

ServerProcess is the base of RedisServer, PostgresServer, ZookeeperServer
and EtcdServer. A subclass's __init__ sets self.dir (a temporary directory
the server owns), self.log (its log file) and self.proc (the Popen, None
until started). stop() ends the server by its pid, SIGCONT first (a test
may have frozen it), then STOP_SIGNAL, then SIGKILL after STOP_WAIT
seconds; tail() is the end of its log, printed when a test failed;
cleanup() stops it and removes its directory. A server whose child is not
the server itself (postgres under runuser) names the pid to signal in
_stop_pid().
"""
import os
import shutil
import signal
import subprocess


def _signal(pid, sig):
    """Sends sig to pid; a process already gone is no error."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class ServerProcess:
    STOP_SIGNAL = signal.SIGTERM
    STOP_WAIT = 30  # seconds from STOP_SIGNAL to SIGKILL
    TAIL = 3000  # characters of the log tail() returns

    def _stop_pid(self):
        """The pid stop() signals: the child's own."""
        return self.proc.pid

    def stop(self, sig=None):
        """Stops the server (sig: STOP_SIGNAL unless given) and reaps its
        child; does nothing when it is not running."""
        if self.proc and self.proc.poll() is None:
            target = self._stop_pid()
            for pid in dict.fromkeys((target, self.proc.pid)):
                _signal(pid, signal.SIGCONT)
            _signal(target, sig or self.STOP_SIGNAL)
            try:
                self.proc.wait(self.STOP_WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def tail(self):
        """The last TAIL characters of the log ("" when there is none)."""
        try:
            with open(self.log) as f:
                return f.read()[-self.TAIL:]
        except OSError:
            return ""

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def cpu_ticks(pid):
    """utime + stime of pid (every thread), in clock ticks."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def maps(pid):
    """The text of /proc/PID/maps: the objects pid has mapped."""
    with open("/proc/%d/maps" % pid) as f:
        return f.read()
