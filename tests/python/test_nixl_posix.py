"""pdx.nixl's "POSIX" plugin (pdx/nixl/_posix.py) and NIXL's telemetry file
(pdx/nixl/_telemetry.py), as NIXL's remote storage example and
telemetry_reader use them: READ/WRITE between registered DRAM and
registered FILE regions (offset, len, fd, meta), byte-exact in the files,
"PROC" at transfer then "DONE", NIXL's error classes for bad lists and
failed I/O; two processes in the remote storage pattern (files on one
side, memory over UCX on loopback); the version-4 ring NIXL's readers
map, with the events of registrations, requests and errors."""
import multiprocessing as mp
import os
import struct
import sys
import threading
import time

import numpy as np
import pytest

import pdx
import pdx.nixl
from pdx.nixl import _posix, nixl_agent, nixl_agent_config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nixl_posix_workers as W  # noqa: E402

O_DIRECT = getattr(os, "O_DIRECT", 0)


def wait_done(agent, h, timeout=30.0):
    end = time.monotonic() + timeout
    while True:
        st = agent.check_xfer_state(h)
        if st == "DONE":
            return st
        assert st == "PROC"
        if time.monotonic() > end:
            raise TimeoutError("transfer still PROC after %.0f s" % timeout)
        time.sleep(0.0005)


@pytest.fixture
def agent():
    a = nixl_agent("px-%d" % os.getpid(),
                   nixl_agent_config(backends=[], capture_telemetry=True))
    a.create_backend("POSIX")
    a.create_backend("UCX")
    yield a
    a.close()


def pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.mark.parametrize("direct", [False, True])
def test_write_read_exact(agent, tmp_path, direct):
    """Several memory regions to several FILE regions (offsets inside a
    file, two files, sub-ranges at odd offsets and lengths) and back;
    the files hold exactly the bytes written and nothing else changes.
    With O_DIRECT fds too (unaligned buffers go through a buffered twin
    of the fd)."""
    flags = os.O_RDWR | os.O_CREAT | (O_DIRECT if direct else 0)
    p0, p1 = tmp_path / "f0", tmp_path / "f1"
    try:
        fd0 = os.open(p0, flags)
        fd1 = os.open(p1, flags)
    except OSError as e:  # a file system without O_DIRECT
        pytest.skip("open: %s" % e)
    # What the agent keeps from its first registration on (cma's
    # revocation table, one memfd) is counted in: fds of requests are not.
    warm = pattern(4096, 3)
    agent.deregister_memory(agent.register_memory(warm, "DRAM"))
    nfds = len(os.listdir("/proc/self/fd"))
    try:
        a, b = pattern(65536, 1), pattern(8192, 2)
        mem = agent.register_memory([(a.ctypes.data, a.nbytes, 0, "a"),
                                     (b.ctypes.data, b.nbytes, 0, "b")],
                                    "DRAM")
        files = agent.register_memory([(0, 65536, fd0, str(p0)),
                                       (1 << 20, 8192, fd0, str(p0)),
                                       (4096, 8192, fd1, str(p1))], "FILE")
        assert files.getType() == pdx.nixl.FILE_SEG
        local = agent.get_xfer_descs(
            [(a.ctypes.data, 65536, 0), (b.ctypes.data, 8192, 0),
             (a.ctypes.data + 13, 1000, 0)], "DRAM")
        remote = agent.get_xfer_descs(
            [(0, 65536, fd0), (1 << 20, 8192, fd0), (4096 + 7, 1000, fd1)],
            "FILE")
        h = agent.initialize_xfer("WRITE", local, remote, agent.name)
        assert agent.transfer(h) == "PROC"  # posted to a worker
        assert wait_done(agent, h) == "DONE"
        assert agent.query_xfer_backend(h) == "POSIX"
        t = agent.get_xfer_telemetry(h)
        assert t.totalBytes == 65536 + 8192 + 1000 and t.descCount == 3
        d0, d1 = p0.read_bytes(), p1.read_bytes()
        assert len(d0) == (1 << 20) + 8192 and len(d1) == 4096 + 7 + 1000
        assert d0[:65536] == a.tobytes()
        assert d0[65536:1 << 20] == bytes((1 << 20) - 65536)
        assert d0[1 << 20:] == b.tobytes()
        assert d1 == bytes(4096 + 7) + a.tobytes()[13:1013]
        # Reposting a finished request writes again (after a change).
        a[:100] = 0xAB
        assert agent.transfer(h) == "PROC"
        wait_done(agent, h)
        assert p0.read_bytes()[:65536] == a.tobytes()
        agent.release_xfer_handle(h)
        # READ back into cleared memory.
        want_a, want_b = a.copy(), b.copy()
        a[:] = 0
        b[:] = 0
        h = agent.initialize_xfer("READ", mem.trim(), agent.get_xfer_descs(
            [(0, 65536, fd0), (1 << 20, 8192, fd0)], "FILE"), agent.name)
        assert agent.transfer(h) == "PROC"
        wait_done(agent, h)
        assert a.tobytes() == want_a.tobytes()
        assert b.tobytes() == want_b.tobytes()
        agent.release_xfer_handle(h)
        agent.deregister_memory(files, backends=["POSIX"])
        agent.deregister_memory(mem)
        assert not agent._files.regs
        # No buffered twin of an O_DIRECT fd outlives its request.
        assert len(os.listdir("/proc/self/fd")) == nfds
    finally:
        os.close(fd0)
        os.close(fd1)


def test_prepped_storage(agent, tmp_path):
    """LMCache's NIXL storage pattern: one memory buffer prepared as pages
    (prep_xfer_dlist(NIXL_INIT_AGENT)), a file's pages registered and
    prepared under the agent's own name, make_prepped_xfer WRITE and READ
    by page indices; bytes exact; bad indices and lists refused."""
    page, n = 4096, 4
    mem = pattern(page * n, 11)
    p = tmp_path / "pages"
    fd = os.open(p, os.O_RDWR | os.O_CREAT)
    try:
        agent.register_memory([(mem.ctypes.data, mem.nbytes, 0, "")],
                              "DRAM")
        mlist = agent.prep_xfer_dlist(pdx.nixl.NIXL_INIT_AGENT, [
            (mem.ctypes.data + i * page, page, 0) for i in range(n)], "DRAM")
        agent.register_memory([(i * page, page, fd, str(p))
                               for i in range(n)], "FILE")
        flist = agent.prep_xfer_dlist(agent.name, agent.get_xfer_descs(
            [(i * page, page, fd) for i in range(n)], "FILE"), "FILE")
        h = agent.make_prepped_xfer("WRITE", mlist, [0, 2], flist, [3, 1])
        assert agent.transfer(h) == "PROC"
        wait_done(agent, h)
        data = p.read_bytes()
        assert data[3 * page:4 * page] == mem[:page].tobytes()
        assert data[page:2 * page] == mem[2 * page:3 * page].tobytes()
        assert data[:page] == bytes(page)
        agent.release_xfer_handle(h)
        want = mem.copy()
        mem[:] = 0
        h = agent.make_prepped_xfer("READ", mlist, np.array([1, 3],
                                                            np.int32),
                                    flist, [1, 3])
        agent.transfer(h)
        wait_done(agent, h)
        assert mem[page:2 * page].tobytes() == want[2 * page:3 * page].tobytes()
        assert mem[3 * page:].tobytes() == want[:page].tobytes()
        assert mem[:page].tobytes() == bytes(page)
        agent.release_xfer_handle(h)
        with pytest.raises(pdx.nixl.nixlInvalidParamError):
            agent.make_prepped_xfer("READ", mlist, [0], flist, [4])
        with pytest.raises(pdx.nixl.nixlInvalidParamError):
            agent.make_prepped_xfer("READ", mlist, [7], flist, [0])
        with pytest.raises(pdx.nixl.nixlNotSupportedError):
            agent.prep_xfer_dlist("other", [(0, page, fd)], "FILE")
        with pytest.raises(pdx.nixl.nixlNotFoundError):
            agent.prep_xfer_dlist(agent.name, [(n * page, page, fd)], "FILE")
        agent.release_dlist_handle(flist)
        with pytest.raises(pdx.nixl.nixlInvalidParamError, match="released"):
            agent.make_prepped_xfer("READ", mlist, [0], flist, [0])
        agent.release_dlist_handle(mlist)
    finally:
        os.close(fd)


def test_errors(tmp_path):
    """NIXL's error classes, and the agent keeps working after each."""
    p = tmp_path / "e"
    p.write_bytes(b"y" * 100)
    fd = os.open(p, os.O_RDWR)
    rfd = os.open(p, os.O_RDONLY)
    buf = np.zeros(4096, np.uint8)
    a = nixl_agent("pe-%d" % os.getpid(), nixl_agent_config(backends=[]))
    try:
        assert a.get_plugin_mem_types("POSIX") == ["FILE", "DRAM"]
        with pytest.raises(pdx.nixl.nixlNotFoundError, match="POSIX"):
            a.register_memory([(0, 100, fd, "e")], "FILE")
        a.create_backend("POSIX")
        a.create_backend("UCX")
        closed = os.open(p, os.O_RDONLY)
        os.close(closed)
        with pytest.raises(pdx.nixl.nixlInvalidParamError, match="fd"):
            a.register_memory([(0, 100, closed, "c")], "FILE")
        mem = a.register_memory([(buf.ctypes.data, 4096, 0, "")], "DRAM")
        files = a.register_memory([(0, 4096, fd, "e"), (0, 4096, rfd, "r")],
                                  "FILE")
        m = a.get_xfer_descs([(buf.ctypes.data, 100, 0)], "DRAM")

        def f(off, n, which=fd):
            return a.get_xfer_descs([(off, n, which)], "FILE")
        with pytest.raises(pdx.nixl.nixlNotFoundError, match="FILE"):
            a.initialize_xfer("READ", m, f(4050, 100), a.name)
        with pytest.raises(pdx.nixl.nixlNotFoundError, match="memory"):
            a.initialize_xfer("READ", a.get_xfer_descs(
                [(buf.ctypes.data + 4000, 100, 0)], "DRAM"), f(0, 100),
                a.name)
        with pytest.raises(pdx.nixl.nixlInvalidParamError, match="bytes"):
            a.initialize_xfer("READ", m, f(0, 99), a.name)
        with pytest.raises(pdx.nixl.nixlInvalidParamError):
            a.initialize_xfer("READ", m, a.get_xfer_descs(
                [(0, 50, fd), (50, 50, fd)], "FILE"), a.name)
        with pytest.raises(pdx.nixl.nixlNotSupportedError, match="own"):
            a.initialize_xfer("READ", m, f(0, 100), "someone-else")
        with pytest.raises(pdx.nixl.nixlBackendError, match="notif"):
            a.initialize_xfer("READ", m, f(0, 100), a.name, b"note")
        with pytest.raises(pdx.nixl.nixlNotSupportedError):
            a.prep_xfer_dlist("", f(0, 100))
        with pytest.raises(KeyError):
            a.initialize_xfer("COPY", m, f(0, 100), a.name)
        # Past the end of the file: a backend error at check_xfer_state.
        h = a.initialize_xfer("READ", a.get_xfer_descs(
            [(buf.ctypes.data, 4096, 0)], "DRAM"), f(0, 4096), a.name)
        assert a.transfer(h) == "PROC"
        with pytest.raises(pdx.nixl.nixlBackendError, match="end of file"):
            wait_done(a, h)
        a.release_xfer_handle(h)
        # A write through a read-only fd: EBADF, a backend error.
        h = a.initialize_xfer("WRITE", m, f(0, 100, rfd), a.name)
        a.transfer(h)
        with pytest.raises(pdx.nixl.nixlBackendError, match="WRITE"):
            wait_done(a, h)
        a.release_xfer_handle(h)
        # Still working: a good READ (its nominal cost: POSIX figures).
        h = a.initialize_xfer("READ", m, f(0, 100), a.name)
        assert a.estimate_xfer_cost(h) == (25, 12, "ANALYTICAL_BACKEND")
        a.transfer(h)
        wait_done(a, h)
        assert buf[:100].tobytes() == b"y" * 100
        a.release_xfer_handle(h)
        with pytest.raises(pdx.nixl.nixlNotPostedError):
            a.check_xfer_state(h)
        a.deregister_memory(files)
        with pytest.raises(pdx.nixl.nixlNotFoundError):
            a.initialize_xfer("READ", m, f(0, 100), a.name)
        a.deregister_memory(mem)
    finally:
        a.close()
        os.close(fd)
        os.close(rfd)


def test_in_flight(agent, tmp_path, monkeypatch):
    """While a worker moves the bytes the request reads PROC, a repost
    raises nixlRepostActiveError, and release waits for the worker (the
    memory may go after it); then DONE."""
    gate, entered = threading.Event(), threading.Event()
    real = _posix._PosixXfer._move

    def slow(self, *args):
        entered.set()
        assert gate.wait(30)
        return real(self, *args)
    monkeypatch.setattr(_posix._PosixXfer, "_move", slow)
    p = tmp_path / "g"
    fd = os.open(p, os.O_RDWR | os.O_CREAT)
    try:
        buf = pattern(4096, 5)
        agent.register_memory([(buf.ctypes.data, 4096, 0, "")], "DRAM")
        agent.register_memory([(0, 4096, fd, "")], "FILE")
        h = agent.initialize_xfer(
            "WRITE", agent.get_xfer_descs([(buf.ctypes.data, 4096, 0)],
                                          "DRAM"),
            agent.get_xfer_descs([(0, 4096, fd)], "FILE"), agent.name)
        assert agent.transfer(h) == "PROC"
        assert entered.wait(30)
        assert agent.check_xfer_state(h) == "PROC"
        with pytest.raises(pdx.nixl.nixlRepostActiveError):
            agent.transfer(h)
        threading.Timer(0.2, gate.set).start()
        assert wait_done(agent, h) == "DONE"
        assert p.read_bytes() == buf.tobytes()
        # Released while in flight: waits for the bytes being moved.
        gate.clear()
        entered.clear()
        agent.transfer(h)
        assert entered.wait(30)
        threading.Timer(0.2, gate.set).start()
        t0 = time.monotonic()
        agent.release_xfer_handle(h)
        assert time.monotonic() - t0 >= 0.1
    finally:
        os.close(fd)


def test_remote_storage_two_processes(tmp_path, monkeypatch):
    """NIXL's remote storage pattern between two processes: the client
    asks the storage server (files + DRAM, POSIX and UCX) to READ its
    files into the client's memory, then to WRITE the client's memory to
    its files; bytes exact on both sides, b"COMPLETE" notifications."""
    # The server imports 'nixl' (pdx's shim), as the example does.
    monkeypatch.syspath_prepend(pdx.nixl.SHIM_PATH)
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    prefix = str(tmp_path / "srv")
    proc = ctx.Process(target=W.storage_server, args=(child, prefix),
                       daemon=True)
    proc.start()
    child.close()

    def recv(timeout=60):
        if not conn.poll(timeout):
            raise TimeoutError("server sent nothing in %d s" % timeout)
        msg = conn.recv()
        if msg[0] == "error":
            raise RuntimeError("server failed:\n" + msg[1])
        return msg

    a = nixl_agent("client-%d" % os.getpid(),
                   nixl_agent_config(backends=["UCX"]))
    try:
        bufs = [np.zeros(W.BUF_LEN, np.uint8) for _ in range(W.NBUF)]
        mem = a.register_memory([(b.ctypes.data, W.BUF_LEN, 0, "")
                                 for b in bufs], "DRAM")
        kind, md = recv()
        assert kind == "md"
        server = a.add_remote_agent(md).decode()
        conn.send(("md", a.get_agent_metadata()))
        assert recv()[0] == "loaded"
        req = a.get_serialized_descs(mem.trim())

        def ask(op):
            a.send_notif(server, op + req)
            end = time.monotonic() + 60
            while not a.check_remote_xfer_done(server, b"COMPLETE"):
                if time.monotonic() > end:
                    raise TimeoutError("no COMPLETE for %r" % op)
                if not proc.is_alive():
                    recv(1)
                time.sleep(0.001)
        ask(b"READ")
        for i, b in enumerate(bufs):
            assert b.tobytes() == W.file_bytes(i)
        for i, b in enumerate(bufs):
            b[:] = pattern(W.BUF_LEN, 300 + i)
        ask(b"WRTE")
        assert recv()[0] == "done"
        for i, b in enumerate(bufs):
            with open("%s_%d" % (prefix, i), "rb") as f:
                assert f.read() == b.tobytes()
        a.deregister_memory(mem)
    finally:
        a.close()
        if proc.is_alive():
            proc.kill()
        proc.join(10)


# -- NIXL's telemetry file --------------------------------------------------
def read_ring(path):
    """NIXL's sharedRingBuffer<nixlTelemetryEvent> (version 4), as its
    telemetry_reader maps it: header, then 16-byte events; pops them all
    (writes read_pos, as the reader does)."""
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        wpos, rpos, ver, ever, cap, mask = struct.unpack_from("=QQiiQQ",
                                                              data, 0)
        assert ver == ever == 4 and mask == cap - 1
        assert len(data) == 40 + 16 * cap
        out = []
        while rpos != wpos:
            ev, val = struct.unpack_from("=I4xQ", data, 40 + 16 * rpos)
            out.append((pdx.nixl._telemetry.EVENT_NAMES[ev], val))
            rpos = (rpos + 1) & mask
        f.seek(8)
        f.write(struct.pack("=Q", rpos))
    return out, cap


def test_telemetry_file(tmp_path, monkeypatch):
    """With NIXL_TELEMETRY_ENABLE=y and NIXL_TELEMETRY_DIR, the agent
    writes NIXL's ring file <dir>/<name>: registrations, per request its
    post time, transfer time, bytes (TX for WRITE, RX for READ) and one
    request, errors by class; a full ring drops events and reports how
    many (agent_telemetry_events_dropped) once there is room."""
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "y")
    monkeypatch.setenv("NIXL_TELEMETRY_DIR", str(tmp_path))
    monkeypatch.setenv("NIXL_TELEMETRY_BUFFER_SIZE", "16")
    name = "tele-%d" % os.getpid()
    a = nixl_agent(name, nixl_agent_config(backends=[]))
    path = tmp_path / name
    fd = os.open(tmp_path / "data", os.O_RDWR | os.O_CREAT)
    try:
        a.create_backend("POSIX")
        a.create_backend("UCX")
        buf = pattern(3000, 9)
        mem = a.register_memory([(buf.ctypes.data, 3000, 0, "")], "DRAM")
        files = a.register_memory([(0, 3000, fd, "")], "FILE")
        m, f = mem.trim(), files.trim()
        for op in ("WRITE", "READ"):
            h = a.initialize_xfer(op, m, f, name)
            a.transfer(h)
            wait_done(a, h)
            a.release_xfer_handle(h)
        with pytest.raises(pdx.nixl.nixlNotFoundError):
            a.initialize_xfer("READ", m, a.get_xfer_descs(
                [(5000, 3000, fd)], "FILE"), name)
        ev, cap = read_ring(path)
        assert cap == 16
        names = [e for e, _ in ev]
        assert ev[:2] == [("agent_memory_registered", 3000)] * 2
        assert names[2:6] == ["agent_xfer_post_time", "agent_xfer_time",
                              "agent_tx_bytes", "agent_tx_requests_num"]
        assert ev[4][1] == 3000 and ev[5][1] == 1
        assert names[6:10] == ["agent_xfer_post_time", "agent_xfer_time",
                               "agent_rx_bytes", "agent_rx_requests_num"]
        assert ev[8][1] == 3000 and ev[9][1] == 1
        assert ev[10:] == [("agent_err_not_found", 1)]
        # Fill the ring (15 usable slots): the rest are dropped, and
        # counted once the reader made room.
        for _ in range(20):
            a.deregister_memory(files)
            a.register_memory([(0, 3000, fd, "")], "FILE")
        ev, _ = read_ring(path)
        assert len(ev) == 15
        a.deregister_memory(mem)
        ev, _ = read_ring(path)
        assert ev == [("agent_telemetry_events_dropped", 25),
                      ("agent_memory_deregistered", 3000)]
    finally:
        a.close()
        os.close(fd)
    # Off without the directory, or with =n over capture_telemetry.
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "n")
    b = nixl_agent(name + "-off", nixl_agent_config(capture_telemetry=True))
    b.close()
    assert not (tmp_path / (name + "-off")).exists()
