"""Workers of test_nixl_vram.py that have no host-memory twin elsewhere:
tensors in GPU memory through pdx.nixl (a torch CUDA tensor's and a CuPy
array's stand-ins, fake_vram.py) and the KV connector's GPU arenas
(GLM-5.2 layout) between two hosts. Each runs in a host of its own
(netns_hosts.hosted), takes the pipe end to the test first and, where it
has a peer worker, that peer's pipe second; an exception is reported as
("error", traceback)."""
import json
import time

import numpy as np

import fake_vram
from nixl_stack_workers import Chan, check_path, notifs_until, wait_done
from worker_boot import recv, reporting

NBYTES = 1 << 20  # one tensor: 512 Ki float16


def _pattern(seed, n=NBYTES):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@reporting(timeout=150)
def tensor_target(conn, i_conn):
    """The passive side: a torch-like CUDA tensor (device 1) to be read
    and a CuPy-like array (device 0) to be written, registered as objects
    (the mem type and device come from them), their descriptors sent
    serialized; waits for the initiator's notifications, then sends what
    is in its GPU memory."""
    from nixl._api import nixl_agent, nixl_agent_config
    peer = Chan(i_conn)
    drv = fake_vram.driver()
    agent = nixl_agent("vram-target", nixl_agent_config(backends=["UCX"]))
    src = fake_vram.CudaTensor(drv, NBYTES // 2, 2, dev=1)
    src.write(_pattern(1))
    dst = fake_vram.CudaArray(drv, (NBYTES // 4,), "<f4", dev=0)
    regs = [agent.register_memory(src), agent.register_memory(dst)]
    assert [r.mem_type for r in regs] == ["VRAM", "VRAM"]
    assert list(regs[0]) == [(src.addr, NBYTES, 1, "")]
    assert list(regs[1]) == [(dst.addr, NBYTES, 0, "")]
    peer.send((agent.get_agent_metadata(),
               agent.get_serialized_descs(agent.get_xfer_descs(src)),
               agent.get_serialized_descs(agent.get_xfer_descs(dst))))
    name = agent.add_remote_agent(peer.recv()).decode()
    notifs_until(agent, name, lambda m: b"write-done" in m and
                 b"read-done" in m)
    conn.send(("target", src.read().tobytes(), dst.read().tobytes()))
    assert recv(conn) == "close"
    for r in regs:
        agent.deregister_memory(r)
    agent.close()


@reporting(timeout=150)
def tensor_initiator(conn, t_conn):
    """The active side: READs the target's tensor into a CuPy-like array
    of its own (VRAM -> VRAM) and into a numpy array (VRAM -> DRAM),
    WRITEs a torch-like tensor's halves (a list of two tensors as rows)
    into the target's array, each request's path checked (UCX over tcp,
    GPU memory staged); sends what it read."""
    from nixl._api import nixl_agent, nixl_agent_config
    peer = Chan(t_conn)
    drv = fake_vram.driver()
    agent = nixl_agent("vram-init", nixl_agent_config(
        backends=["UCX"], capture_telemetry=True))
    t_meta, t_src_b, t_dst_b = peer.recv()
    name = agent.add_remote_agent(t_meta)
    peer.send(agent.get_agent_metadata())
    t_src = agent.deserialize_descs(t_src_b)
    t_dst = agent.deserialize_descs(t_dst_b)
    assert t_src.getType() == t_dst.getType() == 1  # VRAM_SEG

    into = fake_vram.CudaArray(drv, (NBYTES // 2,), "<f2", dev=1)
    host = np.zeros(NBYTES, np.uint8)
    halves = [fake_vram.CudaTensor(drv, NBYTES // 4, 2, dev=0)
              for _ in range(2)]
    halves[0].write(_pattern(2)[:NBYTES // 2])
    halves[1].write(_pattern(2)[NBYTES // 2:])
    regs = [agent.register_memory(o) for o in [into, host] + halves]
    assert [r.mem_type for r in regs] == ["VRAM", "DRAM", "VRAM", "VRAM"]

    def run(op, local, remote, notif, mem):
        h = agent.initialize_xfer(op, local, remote, name, notif)
        agent.transfer(h)
        assert wait_done(agent, h) == "DONE"
        check_path(agent, h, mem)
        agent.release_xfer_handle(h)

    run("READ", agent.get_xfer_descs(into), t_src, b"", "VRAM")
    run("READ", agent.get_xfer_descs(host), t_src, b"", "VRAM")
    rows = agent.get_xfer_descs(halves)
    assert [r[2] for r in rows] == [0, 0] and len(rows) == 2
    remote = agent.get_xfer_descs(
        [(t_dst[0][0] + i * (NBYTES // 2), NBYTES // 2, t_dst[0][2])
         for i in range(2)], "VRAM")
    run("WRITE", rows, remote, b"write-done", "VRAM")
    agent.send_notif(name, b"read-done")
    conn.send(("initiator", into.read().tobytes(), host.tobytes()))
    assert recv(conn) == "close"
    for r in regs:
        agent.deregister_memory(r)
    agent.remove_remote_agent(name)
    agent.close()


# -- the KV connector's GPU arenas ----------------------------------------
def hosts_config(text, device):
    """A test config (test_connector.small_config's) for two hosts: GPU
    arenas on `device`, UCX over tcp, cma and cuda_ipc there too (they
    decline a peer on another host)."""
    c = json.loads(text)
    c["kv"]["memory"] = "vram"
    c["kv"]["device"] = device
    c["backends"] = [{"name": "ucx", "options": {"tls": "tcp"}},
                     {"name": "cma"}, {"name": "cuda_ipc"}]
    return json.dumps(c)


def agent_stats(kv, name, timeout=5.0):
    """The stats JSON of this process's agent `name` (the connector
    `kv`'s), from its stats socket (as `pdx-info --stats` reads it),
    driving the connector's progress while waiting."""
    import os
    import socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0pdx-stats.%d.%s" % (os.getpid(), name))
    s.setblocking(False)
    data = b""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        kv.progress()
        try:
            chunk = s.recv(65536)
        except BlockingIOError:
            time.sleep(0.005)
            continue
        if not chunk:
            break
        data += chunk
    s.close()
    # "pdx-stats <bytes>\n", then the JSON (core/stats_sock.c).
    head, _, body = data.partition(b"\n")
    assert head.startswith(b"pdx-stats ") and \
        int(head.split()[1]) == len(body), head
    return json.loads(body)


def _vram_arenas(cfg):
    import pdx
    layout = pdx.Layout.from_config(cfg)
    assert layout.mem_type == "VRAM"
    mem = fake_vram.region("VRAM", layout.carve_size(4096), cfg.device)
    layout.carve((mem.addr, mem.nbytes, "VRAM", cfg.device), 4096)
    return layout, mem


@reporting(timeout=150)
def kv_prefill_vram(conn, d_conn, config_text, ntokens, nused):
    """P: the connector over GPU arenas, blocks 0..nused-1 written through
    the driver (glm_block_bytes), the request finished from the arenas
    (held for D); waits for D's done (poll_freed)."""
    import pdx
    from pdx_workers import glm_block_bytes
    d = Chan(d_conn)
    cfg = pdx.KVConfig.parse(config_text, name="prefill.json (vram test)")
    assert cfg.mem_type == "VRAM"
    layout, mem = _vram_arenas(cfg)
    arenas = layout.arenas()
    with pdx.KVConnector(cfg, layout) as p:
        for b in range(nused):
            for a, data in zip(arenas, glm_block_bytes(arenas, b, 5 + b)):
                mem.write(data, a["base"] - mem.addr + b * a["stride"])
        d.send(p.describe())
        d_name = p.connect(d.recv())
        tokens = [(i * 2654435761 + 1) % 151552 for i in range(ntokens)]
        req = pdx.KVRequest.from_tokens("req-glm", tokens, p.hasher())
        params = p.request_finished(req, list(range(nused)), ntokens)
        d.send((params, d_name))
        freed = []
        end = time.monotonic() + 60
        while not freed and time.monotonic() < end:
            p.progress()
            freed = p.poll_freed()
            time.sleep(0.001)
        conn.send(("freed", freed, p.held_requests()))
        assert recv(conn) == "quit"
    mem.free()


@reporting(timeout=150)
def kv_decode_vram(conn, p_conn, config_text, ntokens, nused):
    """D: the connector over GPU arenas on another host than P, the
    handoff looked up and loaded into scattered blocks (P's GPU memory to
    D's, staged over UCX), every byte read back through the driver and
    compared; sends ("loaded", checks, telemetry of the connector's
    agent's peer path)."""
    import pdx
    from pdx_workers import glm_block_bytes
    p = Chan(p_conn)
    cfg = pdx.KVConfig.parse(config_text, name="decode.json (vram test)")
    layout, mem = _vram_arenas(cfg)
    arenas = layout.arenas()
    with pdx.KVConnector(cfg, layout) as d:
        assert d.connect(p.recv()) == "glm52-p-dp0"
        p.send(d.describe())
        params, d_name = p.recv()
        assert d_name == "glm52-d-dp0"
        d.check_params(params)
        tokens = [(i * 2654435761 + 1) % 151552 for i in range(ntokens)]
        req = pdx.KVRequest.from_tokens("d-glm", tokens, d.hasher(),
                                        params=params)
        m = None
        end = time.monotonic() + 10
        while m is None and time.monotonic() < end:
            m = d.lookup(req)
        assert m == {"source": "remote", "blocks": nused - 1, "tail": True,
                     "tokens": ntokens - 1}, m
        d_ids = [23, 5, 6, 7, 0, 1, 2, 12, 13][:nused]
        d.load(req, m, d_ids)
        got = None
        end = time.monotonic() + 60
        while got is None and time.monotonic() < end:
            d.progress()
            got = d.load_check("d-glm")
            time.sleep(0.0005)
        assert got == ntokens - 1
        tail = ntokens - (nused - 1) * layout.block_tokens
        view = mem.read()
        for p_id, d_id in enumerate(d_ids):
            want = glm_block_bytes(arenas, p_id, 5 + p_id)
            for a, data in zip(arenas, want):
                off = a["base"] - mem.addr + d_id * a["stride"]
                if p_id == nused - 1:
                    data = data[:tail * a["bytes_per_token"]]
                assert np.array_equal(view[off:off + len(data)], data), \
                    (a["name"], p_id)
        a = arenas[0]
        off = a["base"] - mem.addr + 20 * a["stride"]
        assert not view[off:off + a["block_bytes"]].any()
        conn.send(("loaded", agent_stats(d, d_name)))
        assert recv(conn) == "quit"
    mem.free()
