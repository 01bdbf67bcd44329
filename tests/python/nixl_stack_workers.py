"""Peer processes for test_nixl_stacks.py: each plays the other side of one
stack's NIXL sequence through the 'nixl' package (pdx's shim, found on
PYTHONPATH as the stack would find NIXL). Every function takes the pipe end
first and reports an exception as ("error", traceback)."""
import os
import time

import numpy as np

from worker_boot import recv, reporting  # noqa: F401 (recv: the workers')

os.environ.setdefault("UCX_NET_DEVICES", "lo")

BLOCKS, BLOCK_LEN, LAYERS = 16, 4096, 2


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
def sglang_decode(conn):
    """SGLang's decode side (disaggregation/nixl/conn.py): agent with
    backends=[] then create_backend('UCX', {'num_threads': '8'}), KV and
    aux registered as (ptr, len, gpu_id, '') tuples, metadata and
    addresses sent to prefill, then get_new_notifs parsed as
    '{room}_kv_{chunk}_{is_last}_{rank}' and '{room}_aux'."""
    from nixl._api import nixl_agent, nixl_agent_config
    agent = nixl_agent("decode-7", nixl_agent_config(backends=[],
                                                     num_threads=8))
    agent.create_backend("UCX", {"num_threads": "8"})
    assert "UCX" in agent.get_plugin_list()
    kv = [np.zeros(BLOCKS * BLOCK_LEN, np.uint8) for _ in range(LAYERS)]
    aux = np.zeros(512, np.uint8)
    agent.register_memory([(k.ctypes.data, k.nbytes, 0, "") for k in kv],
                          "DRAM")
    agent.register_memory([(aux.ctypes.data, aux.nbytes, 0, "")], "DRAM")
    conn.send((agent.get_agent_metadata(), [k.ctypes.data for k in kv],
               aux.ctypes.data))
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
    conn.send(("notifs", parsed, [bytes(k) for k in kv], bytes(aux)))
    # Wait to be killed (the prefill side then sees this peer die).
    recv(conn, 100)


@reporting
def lmcache_receiver(conn):
    """LMCache's receiving side (v1/transfer_channel/nixl_channel.py):
    backends=[] + create_backend with parameters, mem type 'cpu' with
    tp_rank as the device id, its transfer descriptors sent to the peer
    with get_serialized_descs, notifications polled; close() in LMCache's
    order (deregister_memory before release_dlist_handle)."""
    from nixl._api import nixl_agent, nixl_agent_config
    tp_rank = 0
    agent = nixl_agent("lmcache-recv", nixl_agent_config(backends=[]))
    agent.create_backend("UCX", {"num_threads": "4"})
    buf = np.zeros(8 * BLOCK_LEN, np.uint8)
    reg = agent.get_reg_descs([(buf.ctypes.data, buf.nbytes, tp_rank, "")],
                              "cpu")
    agent.register_memory(reg)
    xfer = agent.get_xfer_descs(
        [(buf.ctypes.data + i * BLOCK_LEN, BLOCK_LEN, tp_rank)
         for i in range(8)], "cpu")
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", xfer, "cpu")
    conn.send((agent.get_agent_metadata(), agent.get_serialized_descs(xfer)))
    peer_meta = recv(conn)
    peer = agent.add_remote_agent(peer_meta)
    notifs_until(agent, peer.decode(), lambda m: b"lmcache-put-3" in m)
    conn.send(("data", bytes(buf)))
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
