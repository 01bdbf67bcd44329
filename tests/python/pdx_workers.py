"""Worker processes for the pdx Python tests (spawned; every function takes
the pipe end first). Each reports an exception as ("error", traceback) so
the test fails with the worker's stack instead of a timeout."""
import json
import os
import time

import numpy as np

os.environ.setdefault("UCX_NET_DEVICES", "lo")

import pdx  # noqa: E402
import worker_boot  # noqa: E402
from worker_boot import recv  # noqa: E402

# Bounded like the tests: every stack dumped and the worker ended if stuck.
reporting = worker_boot.reporting(
    timeout=float(os.environ.get("PDX_PY_WORKER_TIMEOUT", "200")))


def pattern(nbytes, seed):
    """Deterministic bytes, the same in every process."""
    return np.random.default_rng(seed).integers(0, 256, nbytes,
                                                dtype=np.uint8)


def wait_notif(agent, peer, want, timeout=20.0):
    """Collect notifications from `peer` until `want` of them arrived."""
    got = []
    end = time.monotonic() + timeout
    while len(got) < want:
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError("%d of %d notifications from %s: %r"
                               % (len(got), want, peer, got))
        got += agent.get_notifs(timeout=min(left, 0.5)).get(peer, [])
    return got


@reporting
def native_peer(conn, size):
    """Native API peer: a shared region (pdx.mem_alloc) and a private one
    (bytearray); serves READ/WRITE/inspect commands from the test."""
    with pdx.Agent("nat-p") as a:
        shm = pdx.mem_alloc(size)
        priv = bytearray(size)
        np.frombuffer(shm, np.uint8)[:] = pattern(size, 1)
        np.frombuffer(priv, np.uint8)[:] = pattern(size, 2)
        regs = [a.register(shm), a.register(priv)]
        conn.send((a.describe(), shm.addr, pdx.addr_of(priv)))
        peer = a.load_peer(recv(conn))
        bufs = {"shm": shm, "priv": priv}
        while True:
            cmd = recv(conn)
            if cmd == "quit":
                break
            if cmd[0] == "get":
                conn.send(bytes(memoryview(bufs[cmd[1]])))
            elif cmd[0] == "fill":
                np.frombuffer(bufs[cmd[1]], np.uint8)[:] = \
                    pattern(size, cmd[2])
                conn.send("ok")
            elif cmd[0] in ("READ", "WRITE"):
                # (op, local buffer, local offset, remote addr, len, notif)
                _, which, off, raddr, n, notif = cmd
                laddr = pdx.addr_of(bufs[which]) + off
                x = a.create_xfer(cmd[0], [(laddr, n, 0)], [(raddr, n, 0)],
                                  peer, notif=notif)
                x.post()
                x.wait(timeout=20)
                x.release()
                conn.send("ok")
            elif cmd[0] == "notifs":
                conn.send(wait_notif(a, cmd[1], cmd[2]))
        for r in regs:
            r.deregister()
        shm.close()


@reporting
def shm_child(conn, shm, size):
    """Receives a SharedMemory through multiprocessing (pickled as a
    duplicate of its fd), writes into it, and serves it to a peer."""
    view = np.frombuffer(shm, np.uint8)
    got = view[:size].copy()
    view[:] = pattern(size, 11)
    with pdx.Agent("shm-child") as a:
        reg = a.register(shm)
        conn.send((got.tobytes(), shm.addr, a.describe()))
        assert recv(conn) == "quit"
        reg.deregister()
    del view
    shm.close()


@reporting
def victim(conn, size):
    """A peer that is killed by the test."""
    a = pdx.Agent("victim")
    shm = pdx.mem_alloc(size)
    a.register(shm)
    conn.send((a.describe(), shm.addr, os.getpid()))
    time.sleep(600)


# -- vLLM's NixlConnector sequence, prefill side ---------------------------
NIXL_LAYERS = 4
NIXL_BLOCKS = 32
NIXL_BLOCK_LEN = 16384


def layer_bytes(layer, side):
    n = NIXL_BLOCKS * NIXL_BLOCK_LEN
    return pattern(n, 1000 * side + layer)


def block_descs(bases):
    """vLLM's layout of descriptors: layer-major, one per block."""
    rows = np.empty((len(bases) * NIXL_BLOCKS, 3), dtype=np.uint64)
    for l, base in enumerate(bases):
        off = np.arange(NIXL_BLOCKS, dtype=np.uint64) * NIXL_BLOCK_LEN
        rows[l * NIXL_BLOCKS:(l + 1) * NIXL_BLOCKS, 0] = base + off
        rows[l * NIXL_BLOCKS:(l + 1) * NIXL_BLOCKS, 1] = NIXL_BLOCK_LEN
        rows[l * NIXL_BLOCKS:(l + 1) * NIXL_BLOCKS, 2] = 0
    return rows


@reporting
def nixl_prefill(conn, use_shim):
    if use_shim:
        # What a stack written for NIXL imports, unchanged.
        from nixl._api import nixl_agent, nixl_agent_config
    else:
        from pdx.nixl import nixl_agent, nixl_agent_config
    cfg = nixl_agent_config(num_threads=8, capture_telemetry=True,
                            backends=["UCX"])
    w = nixl_agent("prefill-0", cfg)
    # One cache per layer (vLLM: one tensor per layer), shared memory.
    caches = [pdx.mem_alloc(NIXL_BLOCKS * NIXL_BLOCK_LEN)
              for _ in range(NIXL_LAYERS)]
    for l, c in enumerate(caches):
        np.frombuffer(c, np.uint8)[:] = layer_bytes(l, 1)
    caches_data = [(c.addr, len(c), 0, "") for c in caches]
    descs = w.get_reg_descs(caches_data, "DRAM")
    w.register_memory(descs, backends=["UCX"])
    xfer_descs = w.get_xfer_descs(block_descs([c.addr for c in caches]),
                                  "DRAM")
    src_handle = w.prep_xfer_dlist("NIXL_INIT_AGENT", xfer_descs)
    conn.send((w.get_agent_metadata(), [c.addr for c in caches]))
    d_name = w.add_remote_agent(recv(conn)).decode()  # NIXL: bytes
    conn.send(("peer", d_name))

    # Requests P finished and holds: each is freed once its notifications
    # are counted ("req:<n>" means n readers each send one).
    pending = {b"req-7": 1, b"req-8": 2, b"req-9": 1}
    heartbeats = 0
    freed = []
    end = time.monotonic() + 60
    while pending and time.monotonic() < end:
        for peer, msgs in w.get_new_notifs().items():
            assert peer == d_name, peer
            for m in msgs:
                if m.startswith(b"hb:"):
                    heartbeats += 1
                    continue
                req, n = m.split(b":")
                assert int(n) == {b"req-7": 1, b"req-8": 2,
                                  b"req-9": 1}[req], m
                pending[req] -= 1
                if pending[req] == 0:
                    del pending[req]
                    freed.append(req.decode())
                    w.send_notif(d_name, b"freed:" + req)
        time.sleep(0.001)
    conn.send(("freed", freed, heartbeats, sorted(pending)))
    assert recv(conn) == "teardown"
    # vLLM's shutdown order.
    w.release_dlist_handle(src_handle)
    w.remove_remote_agent(d_name)
    w.deregister_memory(descs)
    w.close()
    for c in caches:
        c.close()
    conn.send("done")


# -- GLM-5.2-shaped connector handoff, prefill side ------------------------
def glm_block_bytes(layout_arenas, block_id, seed):
    """Stand-in KV of one block: per arena, bytes from (seed, arena)."""
    return [pattern(a["block_bytes"], seed * 1000 + i)
            for i, a in enumerate(layout_arenas)]


@reporting
def kv_prefill(conn, config_text, ntokens, nblocks_used):
    cfg = pdx.KVConfig.parse(config_text, name="prefill.json (test)")
    layout = pdx.Layout.from_config(cfg)
    mem = pdx.mem_alloc(layout.carve_size(4096))
    layout.carve(mem, 4096)
    arenas = layout.arenas()
    with pdx.KVConnector(cfg, layout) as conn_p:
        ids = list(range(nblocks_used))
        for b in ids:
            for a, data in zip(arenas, glm_block_bytes(arenas, b, 5 + b)):
                off = a["base"] - mem.addr + b * a["stride"]
                np.frombuffer(mem, np.uint8)[off:off + a["block_bytes"]] = \
                    data
        conn.send(conn_p.describe())
        d_name = conn_p.connect(recv(conn))
        tokens = [(i * 2654435761 + 1) % 151552 for i in range(ntokens)]
        req = pdx.KVRequest.from_tokens("req-glm", tokens, conn_p.hasher())
        params = conn_p.request_finished(req, ids, ntokens)
        assert conn_p.held_requests() == 1
        conn.send((params, [h.hex() for h in req.hashes],
                   req.tail_hash.hex() if req.tail_hash else None, d_name))
        freed = []
        end = time.monotonic() + 60
        while not freed and time.monotonic() < end:
            conn_p.progress()
            freed = conn_p.poll_freed()
            time.sleep(0.001)
        conn.send(("freed", freed, conn_p.held_requests()))
        assert recv(conn) == "quit"
    del arenas
    mem.close()
    conn.send("done")


def json_dumps(o):
    return json.dumps(o)
