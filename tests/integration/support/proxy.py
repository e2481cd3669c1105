# SPDX-License-Identifier: MIT
"""A small threaded TCP proxy on 127.0.0.1 that sits between the shim and
Redis and can misbehave on demand (test_stranded.py):

  PASS          forwards both ways
  DROP_REPLIES  forwards what clients send, discards what Redis answers
  BLACK_HOLE    discards everything both ways, keeps every connection open

The mode applies to every byte read from then on, on every connection.
reply_delay (seconds) holds every chunk Redis answers that long before
forwarding it: a client farther from Redis than one on the loopback
(test_redlock.py's starvation pair).
stop() closes the listener and every socket and joins the threads.
"""
import socket
import threading
import time

PASS = "pass"
DROP_REPLIES = "drop replies"
BLACK_HOLE = "black hole"


class Proxy:
    def __init__(self, upstream_port, mode=PASS, reply_delay=0.0):
        self.upstream_port = upstream_port
        self.mode = mode
        self.reply_delay = reply_delay
        self.accepted = 0              # client connections so far
        self.dropped = {"request": 0, "reply": 0}   # bytes discarded
        self._lock = threading.Lock()
        self._socks = []
        self._threads = []
        self._stopping = False
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]

    def start(self):
        self._spawn(self._accept_loop)
        return self

    def set_mode(self, mode):
        assert mode in (PASS, DROP_REPLIES, BLACK_HOLE), mode
        self.mode = mode

    def stop(self):
        with self._lock:
            self._stopping = True
            socks = [self._listener] + self._socks
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in self._threads:
            t.join(10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ---- internals ----------------------------------------------------------

    def _spawn(self, fn, *args):
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _track(self, s):
        """Registers s for stop(); returns False (and closes s) when stopping."""
        with self._lock:
            if not self._stopping:
                self._socks.append(s)
                return True
        s.close()
        return False

    def _accept_loop(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._track(client):
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            if not self._track(upstream):
                return
            for s in (client, upstream):  # a hop forwards at once: no Nagle delay added
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self.accepted += 1
            self._spawn(self._pump, client, upstream, "request")
            self._spawn(self._pump, upstream, client, "reply")

    def _forwards(self, direction):
        mode = self.mode
        return mode == PASS or (mode == DROP_REPLIES and direction == "request")

    def _pump(self, src, dst, direction):
        """Copies src to dst while the mode allows it, discarding otherwise;
        when either side closes, closes the other side's writing half."""
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            if self._forwards(direction):
                if direction == "reply" and self.reply_delay:
                    time.sleep(self.reply_delay)  # latency injected, not a wait for anything
                try:
                    dst.sendall(data)
                except OSError:
                    break
            else:
                with self._lock:
                    self.dropped[direction] += len(data)
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
