# SPDX-License-Identifier: MIT
"""Containers (rootful podman, runc, explicit ulimits; images imported from
a debootstrap root, no registry):

1. examples/containers/run.sh (its config parses, its key has no {host}):
   the plain round (two job containers, no shim)
   loses updates, the guarded round (the shim bind-mounted read-only and
   preloaded, Redis in a third container) loses none; nothing it named is
   left (containers, images, networks, volumes), also after a Ctrl-C
   (SIGINT to its process group) in the middle of a run;
2. `lockshim status` on the host, against the Redis container's port
   published on 127.0.0.1, names the holder by its container's host name
   (its id) and its pid inside the container, and the waiter in another
   container by its host name; after `podman kill` of the holder the waiter
   enters only when the lease runs out, not at once: a holder in another
   pid namespace (another host name) is never judged dead.

Skipped, with the reason, where podman cannot run a container at all (a
trivial `podman run` of a one-file image), and for sanitizer builds (their
runtime is not in the image).
"""
import json
import os
import re
import secrets
import signal
import subprocess
import time

import pytest

from resp import free_port
from support import debroot
from support.util import ASAN, BUILD, CLI, MULT, ROOT, SHIM, TIMEOUT, TSAN, wait_for

pytestmark = pytest.mark.skipif(ASAN or TSAN, reason="a sanitizer build's runtime is not "
                                "in the container image")

RUN_SH = os.path.join(ROOT, "examples", "containers", "run.sh")
OPTS = ["--runtime", "runc", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=1024:1024"]
RESULT = re.compile(r"^(plain|guarded) +2 containers x 3 processes x 40 entries: "
                    r"balance (\d+) of (\d+) expected \((\d+) lost\) in [0-9.]+ s$", re.M)
LEASE_MS = 4000


def podman(*args, check=True, timeout=None):
    """Runs `podman ARGS`; returns the CompletedProcess (text mode)."""
    r = subprocess.run(["podman"] + list(args), capture_output=True, text=True,
                       timeout=timeout or TIMEOUT * 5)
    assert not check or r.returncode == 0, (args, r.stderr)
    return r


def prefix():
    """A name prefix no other run shares."""
    return "lockshim-t%d-%s" % (os.getpid(), secrets.token_hex(3))


def leftovers(pre):
    """Every container, image, network and volume whose name has pre."""
    found = []
    for what, fmt in [(["ps", "-a"], "{{.Names}}"), (["images"], "{{.Repository}}"),
                      (["network", "ls"], "{{.Name}}"), (["volume", "ls"], "{{.Name}}")]:
        r = podman(*what, "--format", fmt)
        found += ["%s %s" % (what[0], n) for n in r.stdout.split() if pre in n]
    return found


def remove_all(pre):
    """Removes what leftovers(pre) finds: containers first."""
    found = [n.split() for n in leftovers(pre)]
    for kind, remove in [("ps", ["rm", "-f", "-t", "0"]), ("volume", ["volume", "rm", "-f"]),
                         ("network", ["network", "rm", "-f"]), ("images", ["rmi", "-f"])]:
        names = [n for k, n in found if k == kind]
        if names:
            podman(*remove, *names, check=False)


@pytest.fixture(scope="module")
def podman_works(tmp_path_factory):
    """Skips unless podman can run a container here: a one-file image (a
    static program) imported and run."""
    if os.geteuid() != 0:
        pytest.skip("rootful podman needs root")
    if subprocess.run(["sh", "-c", "command -v podman"], capture_output=True).returncode:
        pytest.skip("podman is not installed (scripts/install-deps.sh installs it)")
    d = tmp_path_factory.mktemp("probe")
    src = d / "true.c"
    src.write_text("int main(void) { return 0; }\n")
    subprocess.run(["gcc", "-static", "-o", str(d / "true"), str(src)], check=True)
    os.unlink(str(src))
    image = "localhost/%s-probe:latest" % prefix()
    try:
        r = subprocess.run("tar -C %s -c . | podman import -q - %s" % (d, image), shell=True,
                           capture_output=True, text=True, timeout=TIMEOUT)
        if r.returncode:
            pytest.skip("podman cannot import an image here: " + r.stderr.strip())
        r = podman("run", "--rm", *OPTS, image, "/true", check=False)
        if r.returncode:
            pytest.skip("podman cannot run a container here: " + r.stderr.strip())
    finally:
        podman("rmi", "-f", image, check=False)


def run_sh(pre, **kw):
    env = dict(os.environ, LOCKSHIM_EXAMPLE_PREFIX=pre,
               LOCKSHIM_BUILD=os.path.relpath(BUILD, ROOT))
    return subprocess.Popen([RUN_SH], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_container_config_is_valid_and_shared():
    """The config run.sh mounts parses (69: its Redis, "redis", is not
    reachable from here), and its key is one for every container."""
    cfg = os.path.join(ROOT, "examples", "containers", "ledger.cfg")
    r = subprocess.run([CLI, "check", "-c", cfg], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode in (0, 69) and "ok, 1 lock(s)" in r.stdout, r.stdout + r.stderr
    assert "  post_entry: key example:ledger:{arg0:str}, " in r.stdout, r.stdout


@pytest.mark.timing
def test_run_sh_plain_loses_updates_guarded_none_nothing_left(podman_works):
    pre = prefix()
    p = run_sh(pre)
    try:
        out, err = p.communicate(timeout=600 * MULT)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        left = leftovers(pre)
        remove_all(pre)
    assert p.returncode == 0, out + err
    results = {m[0]: [int(m[1]), int(m[2]), int(m[3])] for m in RESULT.findall(out)}
    assert set(results) == {"plain", "guarded"}, out
    got, expected, lost = results["plain"]
    assert expected == 240 and lost == expected - got and lost > 0, out  # the control
    assert results["guarded"] == [240, 240, 0], out
    assert left == [], left


def test_run_sh_ctrl_c_leaves_nothing(podman_works):
    """SIGINT to run.sh's process group (a terminal's Ctrl-C) once its Redis
    container runs: it exits 130 and removes all it made."""
    pre = prefix()
    p = run_sh(pre, start_new_session=True)
    try:
        said = []
        for line in p.stderr:  # its progress lines, until Redis answers
            said.append(line)
            if line.startswith("run.sh: Redis answers in "):
                break
        assert p.poll() is None, "".join(said)
        assert pre + "-redis" in podman("ps", "--format", "{{.Names}}").stdout.split()
        assert len(leftovers(pre)) >= 5  # the control: there is something to remove
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=120 * MULT)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        left = leftovers(pre)
        remove_all(pre)
    assert p.returncode == 130, out + err
    assert left == [], left


# ---- a holder seen from the host and killed --------------------------------------

@pytest.fixture(scope="module")
def images(podman_works):
    """(base, redis): a minimal Debian 12 image (support/debroot.py's root,
    imported) and one with redis-server added; removed at the end."""
    root = debroot.base_root()
    pre = prefix()
    base, red = "localhost/%s-base:latest" % pre, "localhost/%s-redis:latest" % pre
    try:
        subprocess.run("tar -C %s --exclude=./.complete -c . | podman import -q - %s"
                       % (root, base), shell=True, check=True, capture_output=True,
                       timeout=TIMEOUT * 5)
        r = podman("run", *OPTS, "--name", pre + "-build", base, "sh", "-c",
                   "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y "
                   "-qq --no-install-recommends redis-server >/dev/null && apt-get clean",
                   check=False)
        if r.returncode:
            pytest.skip("apt-get install redis-server failed in the image: " + r.stderr[-500:])
        podman("commit", "-q", pre + "-build", red)
        podman("rm", pre + "-build")
        yield base, red
    finally:
        remove_all(pre)


@pytest.fixture
def pod(images, progs, tmp_path):
    """A network with a Redis container (reached as "redis" through an
    /etc/hosts entry, port published on 127.0.0.1) and start(name, *argv) for job containers under the shim;
    everything removed at the end."""
    base, red = images
    pre = prefix()
    port = free_port()
    cfgdir = tmp_path / "cfg"
    cfgdir.mkdir()
    lock = ('locks = ( { symbol = "hold_call"; key = "hold"; lease_ms = %d; '
            'wait_ms = 60000; } );\n' % LEASE_MS)
    (cfgdir / "lockshim.cfg").write_text('redis = { host = "redis"; port = 6379; };\n' + lock)
    host_cfg = tmp_path / "host.cfg"
    host_cfg.write_text('redis = { host = "127.0.0.1"; port = %d; };\n' % port + lock)

    class Pod:
        cfg = str(host_cfg)
        redis_ip = None

        def start(self, name, *argv):
            podman("run", *OPTS, "-d", "--name", pre + "-" + name, "--network", pre + "-net",
                   "--add-host", "redis:" + self.redis_ip,
                   "-v", "%s:%s:ro" % (progs["dir"], progs["dir"]),
                   "-v", SHIM + ":/opt/lockshim/liblockshim.so:ro",
                   "-v", "%s:/opt/lockshim/cfg:ro" % cfgdir,
                   "-e", "LD_PRELOAD=/opt/lockshim/liblockshim.so",
                   "-e", "LOCKSHIM_CONFIG=/opt/lockshim/cfg/lockshim.cfg", base, *argv)
            return pre + "-" + name

    try:
        podman("network", "create", pre + "-net")
        podman("run", *OPTS, "-d", "--name", pre + "-redis", "--network", pre + "-net",
               "-p", "127.0.0.1:%d:6379" % port, red,
               "redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "")
        wait_for(lambda: podman("exec", pre + "-redis", "redis-cli", "ping",
                                check=False).stdout.strip() == "PONG", what="Redis container")
        # By address, as run.sh does: without aardvark-dns or CNI's dnsname
        # a user network resolves no container names.
        Pod.redis_ip = podman("inspect", "-f",
                              "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                              pre + "-redis").stdout.strip()
        assert Pod.redis_ip, "the Redis container has no address"
        yield Pod()
    finally:
        for name in [n.split()[1] for n in leftovers(pre) if n.startswith("ps ")]:
            r = podman("logs", name, check=False)
            print("---- %s ----\n%s%s" % (name, r.stdout, r.stderr))
        remove_all(pre)


def status(cfg):
    r = subprocess.run([CLI, "status", "-c", cfg, "--json"], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def inside(container):
    """(host name, pid of the driver inside the container's pid namespace,
    its pid on the host)."""
    host = podman("inspect", "-f", "{{.Config.Hostname}}", container).stdout.strip()
    rows = [l.split(None, 2) for l in
            podman("top", container, "pid", "hpid", "args").stdout.splitlines()[1:]]
    [(pid, hpid)] = [(int(r[0]), int(r[1])) for r in rows if "driver" in r[2]]
    return host, pid, hpid


@pytest.mark.timing
def test_status_names_container_and_killed_holder_waits_for_lease(pod, progs):
    a = pod.start("a", progs["driver"], "call:600000")
    [held] = wait_for(lambda: status(pod.cfg), what="the lock held in container a")
    host_a, pid_a, hpid_a = inside(a)
    cid = podman("inspect", "-f", "{{.Id}}", a).stdout.strip()
    assert host_a == cid[:12]  # a container's host name is, by default, its id
    assert (held["host"], held["pid"], held["program"]) == (host_a, pid_a, "driver"), held
    assert pid_a != hpid_a  # the pid in the container's namespace, not the host's

    b = pod.start("b", progs["driver"], "call:600000")
    host_b = inside(b)[0]
    [held] = wait_for(lambda: [l for l in status(pod.cfg) if l["waiters"]],
                      what="container b waiting")
    assert held["host"] == host_a and [w["host"] for w in held["waiters"]] == [host_b], held

    left_ms = held["lease_left_ms"]
    t0 = time.monotonic()
    podman("kill", a)
    [held] = wait_for(lambda: [l for l in status(pod.cfg) if l["host"] == host_b],
                      timeout=LEASE_MS / 1000 + 10, what="container b entering")
    waited = time.monotonic() - t0
    # Not at once: the dead holder's lock ran out its lease (what was left
    # of it when status read it, minus the time status took, 0.3 s), ...
    assert waited >= left_ms / 1000 - 0.3, (waited, left_ms)
    # ... and soon after (a waiter asks again every retry_max_ms, 100 ms).
    assert waited <= LEASE_MS / 1000 + 3 * MULT, waited
    assert held["pid"] == inside(b)[1] and held["waiters"] == [], held
