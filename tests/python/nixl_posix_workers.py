"""Peer process for test_nixl_posix.py: a storage server in the pattern of
NIXL's remote storage example (written from reading it; none of it
copied): an agent with the POSIX and UCX plugins, DRAM buffers and files;
a client's notification asks it to READ (file -> its memory -> the
client's memory over UCX) or WRITE (the client's memory -> its memory ->
file); it answers b"COMPLETE". Reports an exception as ("error",
traceback)."""
import os
import time

import numpy as np

from worker_boot import reporting

os.environ.setdefault("UCX_NET_DEVICES", "lo")

NBUF, BUF_LEN = 3, 64 * 1024


def file_bytes(i):
    """The server's file i before any request (the same in every process)."""
    return np.random.default_rng(77 + i).integers(
        0, 256, BUF_LEN, dtype=np.uint8).tobytes()


def _wait(agent, h, timeout=30.0):
    end = time.monotonic() + timeout
    while True:
        st = agent.check_xfer_state(h)
        if st == "DONE":
            return
        if time.monotonic() > end:
            raise TimeoutError("transfer still %s" % st)
        time.sleep(0.0005)


def _xfer(agent, op, local, remote, peer):
    h = agent.initialize_xfer(op, local, remote, peer)
    assert agent.transfer(h) in ("PROC", "DONE")
    _wait(agent, h)
    agent.release_xfer_handle(h)


@reporting
def storage_server(conn, fileprefix):
    from nixl._api import nixl_agent, nixl_agent_config
    agent = nixl_agent("storage", nixl_agent_config(backends=[]))
    assert "POSIX" in agent.get_plugin_list()
    agent.create_backend("POSIX")
    agent.create_backend("UCX")
    bufs = [np.zeros(BUF_LEN, np.uint8) for _ in range(NBUF)]
    fds = []
    for i in range(NBUF):
        path = "%s_%d" % (fileprefix, i)
        with open(path, "wb") as f:
            f.write(file_bytes(i))
        fds.append(os.open(path, os.O_RDWR | getattr(os, "O_DIRECT", 0)))
    mem = agent.register_memory(
        [(b.ctypes.data, BUF_LEN, 0, str(i)) for i, b in enumerate(bufs)],
        "DRAM")
    files = agent.register_memory(
        [(0, BUF_LEN, fd, "%s_%d" % (fileprefix, i))
         for i, fd in enumerate(fds)], "FILE")
    conn.send(("md", agent.get_agent_metadata()))
    if not conn.poll(30):
        raise TimeoutError("no metadata from the client")
    kind, md = conn.recv()
    client = agent.add_remote_agent(md)
    conn.send(("loaded", None))
    served = 0
    end = time.monotonic() + 60
    while served < 2:
        if time.monotonic() > end:
            raise TimeoutError("%d of 2 requests served" % served)
        notifs = agent.get_new_notifs()
        for peer, msgs in notifs.items():
            for msg in msgs:
                op, remote = msg[:4], agent.deserialize_descs(msg[4:])
                if op == b"READ":
                    _xfer(agent, "READ", mem.trim(), files.trim(),
                          agent.name)
                    _xfer(agent, "WRITE", mem.trim(), remote, peer)
                elif op == b"WRTE":
                    _xfer(agent, "READ", mem.trim(), remote, peer)
                    _xfer(agent, "WRITE", mem.trim(), files.trim(),
                          agent.name)
                else:
                    raise ValueError("request %r" % msg[:4])
                agent.send_notif(peer, b"COMPLETE")
                served += 1
        time.sleep(0.001)
    assert client is not None
    agent.deregister_memory(mem)
    agent.deregister_memory(files, backends=["POSIX"])
    for fd in fds:
        os.close(fd)
    agent.close()
    conn.send(("done", None))
