# SPDX-License-Identifier: MIT
"""What the integration tests share, as redis's tests/support/: plain
helpers that test files import (`from support.topology import Cluster`);
the fixtures that wrap them are in conftest.py. No module here imports a
test module or conftest.

util       the build's paths, the environment's knobs, running programs
           under the shim, polling (wait_for)
server     a redis-server of the test's own; bodies of server fixtures
topology   Sentinel, Cluster and Redlock topologies of several nodes
workers    the counter workloads, the blocking holder, programs in the
           background (Bg)
tls        the test PKI and a TLS-only redis-server
scenarios  test bodies several files run: a connection dropped during a
           call (hostile program), a longjmp out of a guarded call
"""
