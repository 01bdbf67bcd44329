"""Shared pytest setup for the pdx Python tests: loopback only, a hard
timeout per test (faulthandler dumps every thread's stack and exits), and
helpers for spawned worker processes whose every wait is bounded."""
import faulthandler
import multiprocessing as mp
import os
import sys

import pytest

os.environ.setdefault("UCX_NET_DEVICES", "lo")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

TEST_TIMEOUT = float(os.environ.get("PDX_PY_TEST_TIMEOUT", "240"))


def missing_dep(what):
    """A test needs a Debian package that scripts/deps.sh installs and it
    is absent: a skip saying so, except where the run promised every
    dependency (scripts/test.sh sets PDX_TEST_REQUIRE_DEPS=1 after
    deps.sh), where a skip would hide that the test did not run: a
    failure."""
    if os.environ.get("PDX_TEST_REQUIRE_DEPS") == "1":
        pytest.fail("%s, but PDX_TEST_REQUIRE_DEPS=1 (scripts/deps.sh "
                    "installs it)" % what, pytrace=False)
    pytest.skip(what)


@pytest.fixture(autouse=True)
def _hard_timeout():
    faulthandler.dump_traceback_later(TEST_TIMEOUT, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


class Worker:
    """A spawned process running target(conn, *args): a worker function
    (worker_boot.reporting), or the name of one in pdx_workers."""

    def __init__(self, target, *args):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        if isinstance(target, str):
            import pdx_workers
            target = getattr(pdx_workers, target)
        self.proc = ctx.Process(target=target, args=(child,) + args,
                                daemon=True)
        self.proc.start()
        child.close()

    def recv(self, timeout=60.0):
        if not self.conn.poll(timeout):
            raise TimeoutError("worker sent nothing in %.0f s" % timeout)
        msg = self.conn.recv()
        if isinstance(msg, tuple) and msg and msg[0] == "error":
            raise RuntimeError("worker failed:\n" + msg[1])
        return msg

    def send(self, *msg):
        self.conn.send(msg if len(msg) != 1 else msg[0])

    def join(self, timeout=30.0):
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
            raise TimeoutError("worker did not exit in %.0f s" % timeout)
        return self.proc.exitcode

    def kill(self):
        self.proc.kill()
        self.proc.join(10)


@pytest.fixture
def spawn():
    workers = []

    def start(target, *args):
        w = Worker(target, *args)
        workers.append(w)
        return w

    yield start
    for w in workers:
        if w.proc.is_alive():
            w.proc.kill()
            w.proc.join(10)
