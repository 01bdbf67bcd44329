"""Peer processes for test_nixl_stacks.py: each plays the other side of one
stack's NIXL sequence through the 'nixl' package (pdx's shim, found on
PYTHONPATH as the stack would find NIXL). Every function takes the pipe end
first and reports an exception as ("error", traceback).

The SGLang and LMCache sequences' initiating sides are here too
(sglang_prefill_sequence, lmcache_sender_sequence): test_nixl_stacks.py
runs them in its own process with host memory, test_nixl_vram.py in a
worker on another host than their peer (sglang_prefill, lmcache_sender)
with GPU memory (`mem` "VRAM": the fake driver's, fake_vram.py), as the
stacks register it (SGLang "VRAM" for KV and "DRAM" for aux data,
LMCache "cuda")."""
import os
import time

import numpy as np

import fake_vram
from worker_boot import recv, reporting  # noqa: F401 (recv: the workers')

os.environ.setdefault("UCX_NET_DEVICES", "lo")

BLOCKS, BLOCK_LEN, LAYERS = 16, 4096, 2
# Where each side's GPU memory lives (FAKE_CUDA_DEVICES: 2 by default).
SGLANG_P_DEV, SGLANG_D_DEV = 0, 1


class Chan:
    """A pipe to another worker, with conftest Worker's recv and send."""

    def __init__(self, conn):
        self.conn = conn

    def recv(self, timeout=60.0):
        if not self.conn.poll(timeout):
            raise TimeoutError("peer worker sent nothing in %.0f s" % timeout)
        msg = self.conn.recv()
        if isinstance(msg, tuple) and msg and msg[0] == "error":
            raise RuntimeError("peer worker failed:\n" + msg[1])
        return msg

    def send(self, *msg):
        self.conn.send(msg if len(msg) != 1 else msg[0])


def wait_done(agent, h, timeout=20.0):
    end = time.monotonic() + timeout
    st = agent.check_xfer_state(h)
    while st == "PROC" and time.monotonic() < end:
        time.sleep(0.0005)
        st = agent.check_xfer_state(h)
    return st


def block_table(bases, blocks, dev=0):
    """SGLang/vLLM style (N, 3) uint64 descriptor arrays: every block of
    every layer."""
    rows = [(b + i * BLOCK_LEN, BLOCK_LEN, dev) for b in bases
            for i in range(blocks)]
    return np.array(rows, dtype=np.uint64)


def check_path(agent, h, mem):
    """A request between two hosts: UCX over tcp; GPU memory staged
    through pinned host memory (this UCX carries no CUDA memory)."""
    t = h.telemetry()
    assert agent.query_xfer_backend(h) == "ucx", t
    assert t["transport"].startswith("tcp"), t
    if mem == "VRAM":
        assert t["fallback"] and "staged" in t["fallback_why"], t


def kv_bytes(layer, seed):
    """Deterministic KV bytes of one layer, the same in every process."""
    return np.random.default_rng(1000 * seed + layer).integers(
        0, 256, BLOCKS * BLOCK_LEN, dtype=np.uint8)


def notifs_until(agent, peer, done, timeout=30.0):
    """get_new_notifs until done(list of messages from peer) is true."""
    got = []
    end = time.monotonic() + timeout
    while not done(got):
        if time.monotonic() > end:
            raise TimeoutError("notifications from %s: %r" % (peer, got))
        got += agent.get_new_notifs().get(peer, [])
        time.sleep(0.001)
    return got


@reporting
def sglang_decode(conn, mem="DRAM"):
    """SGLang's decode side (disaggregation/nixl/conn.py): agent with
    backends=[] then create_backend('UCX', {'num_threads': '8'}), KV (in
    `mem`) and aux (host memory) registered as (ptr, len, gpu_id, '')
    tuples, metadata, addresses and the KV's device sent to prefill, then
    get_new_notifs parsed as '{room}_kv_{chunk}_{is_last}_{rank}' and
    '{room}_aux'."""
    from nixl._api import nixl_agent, nixl_agent_config
    agent = nixl_agent("decode-7", nixl_agent_config(backends=[],
                                                     num_threads=8))
    agent.create_backend("UCX", {"num_threads": "8"})
    assert "UCX" in agent.get_plugin_list()
    dev = SGLANG_D_DEV if mem == "VRAM" else 0
    kv = [fake_vram.region(mem, BLOCKS * BLOCK_LEN, dev)
          for _ in range(LAYERS)]
    aux = np.zeros(512, np.uint8)
    agent.register_memory([(k.addr, k.nbytes, dev, "") for k in kv], mem)
    agent.register_memory([(aux.ctypes.data, aux.nbytes, 0, "")], "DRAM")
    conn.send((agent.get_agent_metadata(), [k.addr for k in kv],
               aux.ctypes.data, dev))
    room = recv(conn)
    prefill = recv(conn)

    def finished(msgs):
        kv_last = any(m.split(b"_")[1:2] == [b"kv"] and
                      m.split(b"_")[3] == b"1" for m in msgs)
        return kv_last and b"%d_aux" % room in msgs

    msgs = notifs_until(agent, prefill, finished)
    parsed = []
    for m in msgs:
        parts = m.decode().split("_")
        assert int(parts[0]) == room, m
        if parts[1] == "kv":
            parsed.append(("kv", int(parts[2]), parts[3] == "1",
                           int(parts[4])))
        else:
            assert parts[1] == "aux", m
            parsed.append(("aux",))
    conn.send(("notifs", parsed, [k.read().tobytes() for k in kv],
               bytes(aux)))
    # Wait to be killed (the prefill side then sees this peer die).
    recv(conn, 100)


@reporting
def lmcache_receiver(conn, mem="DRAM"):
    """LMCache's receiving side (v1/transfer_channel/nixl_channel.py):
    backends=[] + create_backend with parameters, mem type 'cpu' (or
    'cuda' for GPU memory) with tp_rank as the device id, its transfer
    descriptors sent to the peer with get_serialized_descs, notifications
    polled; close() in LMCache's order (deregister_memory before
    release_dlist_handle)."""
    from nixl._api import nixl_agent, nixl_agent_config
    tp_rank = 0
    mt = "cuda" if mem == "VRAM" else "cpu"
    agent = nixl_agent("lmcache-recv", nixl_agent_config(backends=[]))
    agent.create_backend("UCX", {"num_threads": "4"})
    buf = fake_vram.region(mem, 8 * BLOCK_LEN, tp_rank)
    reg = agent.get_reg_descs([(buf.addr, buf.nbytes, tp_rank, "")], mt)
    agent.register_memory(reg)
    xfer = agent.get_xfer_descs(
        [(buf.addr + i * BLOCK_LEN, BLOCK_LEN, tp_rank)
         for i in range(8)], mt)
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", xfer, mt)
    conn.send((agent.get_agent_metadata(), agent.get_serialized_descs(xfer)))
    peer_meta = recv(conn)
    peer = agent.add_remote_agent(peer_meta)
    notifs_until(agent, peer.decode(), lambda m: b"lmcache-put-3" in m)
    conn.send(("data", buf.read().tobytes()))
    assert recv(conn) == "close"
    # LMCache's close(): regions first, then the prepared list.
    agent.deregister_memory(reg)
    agent.release_dlist_handle(local)
    agent.remove_remote_agent(peer)
    conn.send("closed")


@reporting
def trtllm_peer(conn):
    """TensorRT-LLM's Python agent (_torch/disaggregation/nixl/_agent_py.py)
    on the other side: imports nixl_cu13, else nixl_cu12, else nixl;
    registers its cache, deregisters with a new get_reg_descs list while
    its prepared list lives, notification as str."""
    try:
        from nixl_cu13._api import nixl_agent, nixl_agent_config
    except ImportError:
        try:
            from nixl_cu12._api import nixl_agent, nixl_agent_config
        except ImportError:
            from nixl._api import nixl_agent, nixl_agent_config
    agent = nixl_agent("trtllm-gen", nixl_agent_config(backends=["UCX"]))
    cache = np.zeros(BLOCKS * BLOCK_LEN, np.uint8)
    agent.register_memory(agent.get_reg_descs(
        [(cache.ctypes.data, cache.nbytes, 0, "")], "DRAM"))
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", agent.get_xfer_descs(
        [(cache.ctypes.data, cache.nbytes, 0)], "DRAM"))
    conn.send((agent.get_agent_metadata(), cache.ctypes.data))
    ctx = agent.add_remote_agent(recv(conn)).decode()
    notifs_until(agent, ctx, lambda m: b"trtllm-req-11:done" in m)
    conn.send(("data", bytes(cache)))
    assert recv(conn) == "close"
    agent.deregister_memory(agent.get_reg_descs(
        [(cache.ctypes.data, cache.nbytes, 0, "")], "DRAM"))
    agent.send_notif(ctx, "trtllm-gen:closed")
    agent.release_dlist_handle(local)
    conn.send("closed")


@reporting
def nixl_listener_target(conn, port):
    """NIXL's own exchange (examples/python/basic_two_peers.py's pattern),
    target side: a listener thread on 127.0.0.1:port, waits until the
    initiator's metadata arrived, sends its descriptors as a notification
    (get_serialized_descs), waits for the initiator's notification."""
    os.environ["PDX_NIXL_LISTEN_ADDR"] = "127.0.0.1"
    from nixl._api import nixl_agent, nixl_agent_config
    agent = nixl_agent("target", nixl_agent_config(True, True, port))
    buf = np.arange(BLOCK_LEN // 4, dtype=np.uint32).view(np.uint8).copy()
    reg = agent.register_memory(buf)
    conn.send(("listening", agent.listen_port))
    end = time.monotonic() + 30
    while not agent.check_remote_metadata("initiator"):
        if time.monotonic() > end:
            raise TimeoutError("no metadata from the initiator")
        time.sleep(0.005)
    agent.send_notif("initiator", agent.get_serialized_descs(
        agent.get_xfer_descs(buf)))
    notifs_until(agent, "initiator", lambda m: b"read-done" in m)
    # The initiator invalidates its metadata here at the end.
    end = time.monotonic() + 30
    while agent.check_remote_metadata("initiator"):
        if time.monotonic() > end:
            raise TimeoutError("initiator's metadata still loaded")
        time.sleep(0.005)
    agent.deregister_memory(reg)
    agent.close()
    conn.send(("done", bytes(buf)))


@reporting
def dynamo_passive(conn):
    """Dynamo's nixl_connect passive side (a ReadableOperation and a
    WritableOperation of Connector): nixl_agent(worker_id) with the default
    config, memory registered as [(ptr, size, device_id, 'cpu')] with mem
    type 'cpu', metadata handed out as zlib-compressed hex with the
    descriptors and a notification key; completion seen by polling
    update_notifs() for the key; Descriptor.__del__ deregisters."""
    import uuid
    import zlib
    from nixl._api import nixl_agent
    agent = nixl_agent(uuid.uuid4().hex)
    readable = kv_bytes(0, 21)
    writable = np.zeros(BLOCK_LEN * 2, np.uint8)
    handles = []
    for arr in (readable, writable):
        handles.append(agent.register_memory(
            [(arr.ctypes.data, arr.nbytes, 0, "cpu")], "cpu"))
    md = zlib.compress(agent.get_agent_metadata(), level=6).hex()
    conn.send({"nixl_metadata": md, "read_key": "rk-" + uuid.uuid4().hex,
               "write_key": "wk-" + uuid.uuid4().hex,
               "readable": [(readable.ctypes.data, readable.nbytes, "cpu")],
               "writable": [(writable.ctypes.data, writable.nbytes, "cpu")]})
    keys = recv(conn)
    seen = set()
    end = time.monotonic() + 30
    while seen != set(keys):
        if time.monotonic() > end:
            raise TimeoutError("keys seen: %r of %r" % (seen, keys))
        for values in agent.update_notifs().values():
            for v in values:
                if isinstance(v, bytes) and v.decode("utf-8") in keys:
                    seen.add(v.decode("utf-8"))
        time.sleep(0.01)
    conn.send(("complete", bytes(writable)))
    assert recv(conn) == "bye"
    for h in handles:
        agent.deregister_memory(h)
    conn.send("closed")


# -- the initiating sides (this process or a worker of its own) -------------
def sglang_prefill_sequence(d, kill_d, mem="DRAM", across_hosts=False):
    """SGLang's prefill side against sglang_decode (`d`: its channel):
    KV in `mem` and aux in host memory registered as SGLang does, KV in
    two chunks (scattered blocks, np.int32 ids) and aux with
    initialize_xfer, every byte and notification checked; then peer
    recovery: kill_d() kills the decode side, check_remote_metadata turns
    False and a transfer to it raises nixlRemoteDisconnectError."""
    from nixl._api import nixl_agent, nixl_agent_config
    from nixl._bindings import nixlRemoteDisconnectError
    d_meta, d_bases, d_aux, d_dev = d.recv()

    agent = nixl_agent("prefill-7", nixl_agent_config(backends=[],
                                                      num_threads=8))
    agent.create_backend("UCX", {"num_threads": "8"})
    assert "UCX" in agent.get_plugin_list()
    assert agent.get_backend_params("UCX")["num_threads"] == "8"
    dev = SGLANG_P_DEV if mem == "VRAM" else 0
    kv_src = [kv_bytes(layer, 3) for layer in range(LAYERS)]
    kv = [fake_vram.region(mem, BLOCKS * BLOCK_LEN, dev)
          for _ in range(LAYERS)]
    for k, data in zip(kv, kv_src):
        k.write(data)
    aux = np.frombuffer(bytes(range(256)) * 2, np.uint8).copy()
    agent.register_memory([(k.addr, k.nbytes, dev, "") for k in kv], mem)
    agent.register_memory([(aux.ctypes.data, aux.nbytes, 0, "")], "DRAM")
    name = agent.add_remote_agent(d_meta)
    assert name == b"decode-7"  # NIXL returns bytes
    src = agent.prep_xfer_dlist("NIXL_INIT_AGENT", agent.get_xfer_descs(
        block_table([k.addr for k in kv], BLOCKS, dev), mem))
    dst = agent.prep_xfer_dlist(name, agent.get_xfer_descs(
        block_table(d_bases, BLOCKS, d_dev), mem))
    room, rank = 42, 0
    d.send(room)
    d.send("prefill-7")

    # KV in two chunks: prefill blocks -> decode blocks (scattered), ids as
    # SGLang passes them (np.int32 arrays), block b of layer l at
    # l * BLOCKS + b.
    p_blocks = [[1, 5, 2], [9, 14]]
    d_blocks = [[0, 7, 3], [15, 4]]

    def ids(blocks):
        return np.concatenate([layer * BLOCKS + np.asarray(blocks, np.int32)
                               for layer in range(LAYERS)]).astype(np.int32)

    for chunk, (pb, db) in enumerate(zip(p_blocks, d_blocks)):
        last = int(chunk == len(p_blocks) - 1)
        h = agent.make_prepped_xfer(
            "WRITE", src, ids(pb), dst, ids(db),
            b"%d_kv_%d_%d_%d" % (room, chunk, last, rank))
        assert agent.transfer(h) in ("DONE", "PROC")
        assert wait_done(agent, h) == "DONE"
        if across_hosts:
            check_path(agent, h, mem)
        agent.release_xfer_handle(h)
    # Aux data with initialize_xfer.
    h = agent.initialize_xfer(
        "WRITE",
        agent.get_xfer_descs([(aux.ctypes.data, aux.nbytes, 0)], "DRAM"),
        agent.get_xfer_descs([(d_aux, aux.nbytes, 0)], "DRAM"),
        name, b"%d_aux" % room)
    agent.transfer(h)
    assert wait_done(agent, h) == "DONE"
    if across_hosts:
        check_path(agent, h, "DRAM")
    agent.release_xfer_handle(h)

    msg = d.recv()
    assert msg[0] == "notifs"
    parsed, d_kv, d_auxb = msg[1], msg[2], msg[3]
    assert sorted(parsed) == sorted([("kv", 0, False, 0), ("kv", 1, True, 0),
                                     ("aux",)])
    assert d_auxb == aux.tobytes()
    for layer in range(LAYERS):
        want = np.zeros(BLOCKS * BLOCK_LEN, np.uint8)
        for pb, db in zip(sum(p_blocks, []), sum(d_blocks, [])):
            want[db * BLOCK_LEN:(db + 1) * BLOCK_LEN] = \
                kv_src[layer][pb * BLOCK_LEN:(pb + 1) * BLOCK_LEN]
        assert d_kv[layer] == want.tobytes(), "layer %d" % layer

    # Peer recovery: decode dies; SGLang's checks see it.
    assert agent.check_remote_metadata(name)
    kill_d()
    end = time.monotonic() + 20
    while agent.check_remote_metadata(name) and time.monotonic() < end:
        time.sleep(0.01)
    assert not agent.check_remote_metadata(name), \
        "peer still alive 20 s after its death"
    try:
        h = agent.make_prepped_xfer("WRITE", src, ids([0]), dst, ids([0]),
                                    b"%d_kv_9_1_0" % room)
        agent.transfer(h)
        wait_done(agent, h)
    except nixlRemoteDisconnectError:
        pass
    else:
        raise AssertionError("a WRITE to a dead peer raised nothing")
    agent.remove_remote_agent(name)
    agent.release_dlist_handle(dst)
    agent.release_dlist_handle(src)
    agent.close()
    for k in kv:
        k.free()


def lmcache_sender_sequence(r, mem="DRAM", across_hosts=False):
    """LMCache's sending side against lmcache_receiver (`r`: its
    channel): mem type 'cpu' ('cuda' for GPU memory), the receiver's
    descriptors from deserialize_descs, three WRITEs in reverse block
    order, the last notified, every byte checked; close() in LMCache's
    order with the transfer handles never released until the end."""
    from nixl._api import nixl_agent, nixl_agent_config
    mt = "cuda" if mem == "VRAM" else "cpu"
    r_meta, r_descs_bytes = r.recv()
    agent = nixl_agent("lmcache-send", nixl_agent_config(backends=[]))
    agent.create_backend("UCX", {"num_threads": "4"})
    data = np.frombuffer(np.random.default_rng(5).bytes(8 * BLOCK_LEN),
                         np.uint8).copy()
    buf = fake_vram.region(mem, data.nbytes, 0)
    buf.write(data)
    reg = agent.get_reg_descs([(buf.addr, buf.nbytes, 0, "")], mt)
    agent.register_memory(reg)
    local_descs = agent.get_xfer_descs(
        [(buf.addr + i * BLOCK_LEN, BLOCK_LEN, 0) for i in range(8)], mt)
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", local_descs, mt)
    peer_name = agent.add_remote_agent(r_meta)
    r.send(agent.get_agent_metadata())
    remote_descs = agent.deserialize_descs(r_descs_bytes)
    assert remote_descs.descCount() == 8
    remote = agent.prep_xfer_dlist(peer_name, remote_descs, mt)
    # Blocks 0..7 of the sender into 7..0 of the receiver, three puts, the
    # last with the notification; LMCache never releases these handles.
    handles = []
    for k, (lo, hi) in enumerate([(0, 3), (3, 6), (6, 8)]):
        h = agent.make_prepped_xfer(
            "WRITE", local, list(range(lo, hi)), remote,
            [7 - i for i in range(lo, hi)],
            b"lmcache-put-%d" % (k + 1 if k < 2 else 3))
        agent.transfer(h)
        assert wait_done(agent, h) == "DONE"
        if across_hosts:
            check_path(agent, h, mem)
        handles.append(h)
    msg = r.recv()
    want = b"".join(bytes(data[(7 - i) * BLOCK_LEN:(8 - i) * BLOCK_LEN])
                    for i in range(8))
    assert msg[0] == "data" and msg[1] == want
    r.send("close")
    assert r.recv() == "closed"
    # Our close() in LMCache's order: deregister first (handles alive), then
    # the lists, transfer handles never released: no Busy, no crash.
    agent.deregister_memory(reg)
    agent.release_dlist_handle(local)
    agent.release_dlist_handle(remote)
    agent.remove_remote_agent(peer_name)
    # The region stays registered while the unreleased handles hold it and
    # goes when they do.
    assert agent.query_memory(reg, "UCX") == [None]
    for h in handles:
        agent.release_xfer_handle(h)
    assert not agent._zombies
    agent.close()
    buf.free()


@reporting(timeout=150)
def sglang_prefill(conn, d_conn, mem):
    """sglang_prefill_sequence in a worker, against sglang_decode on pipe
    `d_conn` (another host); the test kills the decode side when asked
    ("kill D" -> "killed"). Sends "ok"."""
    def kill_d():
        conn.send("kill D")
        assert recv(conn, 30) == "killed"
    sglang_prefill_sequence(Chan(d_conn), kill_d, mem, across_hosts=True)
    conn.send("ok")


@reporting(timeout=150)
def lmcache_sender(conn, r_conn, mem):
    """lmcache_sender_sequence in a worker, against lmcache_receiver on
    pipe `r_conn` (another host). Sends "ok"."""
    lmcache_sender_sequence(Chan(r_conn), mem, across_hosts=True)
    conn.send("ok")
