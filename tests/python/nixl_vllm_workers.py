"""Both sides of test_nixl_vllm.py's sequences, vLLM's newest pull-mode
NixlConnector driving NIXL through the 'nixl' package (pdx's shim,
imported as vllm's nixl_utils does: importlib.import_module("nixl._api")):
the P worker (vllm_prefill), and the D ranks' sequences (DRank,
d_pull_hetero_tp, d_prefill_killed), which the tests run in their own
process with host memory, or in a worker on another host (vllm_decode,
test_nixl_vram.py) with GPU memory. `mem` is "DRAM" or "VRAM" (the fake
driver's, fake_vram.py): the caches are registered with that mem type, as
vLLM does with kv_buffer_device cpu or cuda. Every worker function takes
the pipe end first; an exception is reported as ("error", traceback)."""
import os
import sys
import time
import uuid

import numpy as np

import fake_vram
from worker_boot import recv, reporting

os.environ.setdefault("UCX_NET_DEVICES", "lo")

# K and V in separate regions per layer, as vLLM registers FlashAttention
# caches: 2 layers x (K, V) = 4 regions of NBLOCKS blocks.
NBLOCKS, BLOCK_LEN, LAYERS = 24, 2048, 2
NREGIONS = 2 * LAYERS


def region_bytes(region, seed):
    """Deterministic content of one region, the same in every process."""
    return np.random.default_rng(7919 * seed + region).integers(
        0, 256, NBLOCKS * BLOCK_LEN, dtype=np.uint8)


def block_rows(bases, chunk_off=0, chunk_len=BLOCK_LEN):
    """vLLM's _build_fa_*: region-major, one (addr, len, dev) per block."""
    return [(b + blk * BLOCK_LEN + chunk_off, chunk_len, 0)
            for b in bases for blk in range(NBLOCKS)]


def nixl_api():
    import importlib
    import pdx.nixl
    if pdx.nixl.SHIM_PATH not in sys.path:
        sys.path.insert(0, pdx.nixl.SHIM_PATH)
    return importlib.import_module("nixl._api")


@reporting
def vllm_prefill(conn, seed, expected, mem="DRAM"):
    """P: registers its K/V regions as vLLM does, prepares its local list
    with NIXL_INIT_AGENT, sends (metadata, bases) and serves notifications:
    "<req>:<consumers>" frees a request once that many arrived, "HB:a,b"
    extends leases. `expected` lists the request ids it must free. Sends
    ("freed", freed, heartbeats, unknown) and waits for "quit" (or is
    killed by the test). Host memory is shared (pdx.mem_alloc); GPU
    memory is on device 0."""
    api = nixl_api()
    agent = api.nixl_agent(str(uuid.uuid4()), api.nixl_agent_config(
        num_threads=4, capture_telemetry=True))
    regions = []
    for r in range(NREGIONS):
        m = fake_vram.region(mem, NBLOCKS * BLOCK_LEN, 0, shared=True)
        m.write(region_bytes(r, seed))
        regions.append(m)
    caches_data = [(m.addr, NBLOCKS * BLOCK_LEN, 0, "") for m in regions]
    descs = agent.get_reg_descs(caches_data, mem)
    agent.register_memory(descs, backends=["UCX"])
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", agent.get_xfer_descs(
        block_rows([m.addr for m in regions]), mem))
    conn.send(("meta", agent.get_agent_metadata(),
               [m.addr for m in regions], agent.name))
    counts, freed, unknown, heartbeats = {}, [], [], []
    end = time.monotonic() + 60
    while set(freed) != set(expected) and time.monotonic() < end:
        for msgs in agent.get_new_notifs().values():
            for raw in msgs:
                msg = raw.decode("utf-8")
                if msg.startswith("HB:"):
                    heartbeats.extend(msg[3:].split(","))
                    continue
                req, consumers = msg.rsplit(":", 1)
                if req not in expected:
                    unknown.append(req)
                    continue
                counts[req] = counts.get(req, 0) + 1
                if counts[req] == int(consumers):
                    freed.append(req)
        time.sleep(0.001)
    conn.send(("freed", sorted(freed), sorted(heartbeats), unknown))
    if recv(conn, 60) == "quit":
        agent.release_dlist_handle(local)
        agent.deregister_memory(descs)
        conn.send("bye")



# -- the D side: vLLM's pull-mode decode ranks ------------------------------
HALF = BLOCK_LEN // 2


def recv_from_p(conn, timeout=60.0):
    """P's next message; its failure raised with P's traceback."""
    assert conn.poll(timeout), "the prefill process sent nothing"
    msg = conn.recv()
    if isinstance(msg, tuple) and msg and msg[0] == "error":
        raise RuntimeError("prefill process failed:\n" + msg[1])
    return msg


def wait_state(agent, h, timeout=20.0):
    end = time.monotonic() + timeout
    while True:
        st = agent.check_xfer_state(h)
        if st != "PROC" or time.monotonic() > end:
            return st
        time.sleep(0.0005)


def desc_ids(blocks):
    """vLLM's _compute_desc_ids, all-attention path."""
    block_arr = np.asarray(blocks)[None, :]
    region_ids = np.arange(NREGIONS)[:, None]
    return (region_ids * NBLOCKS + block_arr).flatten()


class DRank:
    """One D TP rank of a tp-2 decode engine reading from a tp-1 P; its
    caches in `mem` (GPU memory: rank r on device r of the driver's)."""

    def __init__(self, api, rank, mem="DRAM"):
        self.rank, self.mem = rank, mem
        self.dev = rank % fake_vram.driver().count if mem == "VRAM" else 0
        self.agent = api.nixl_agent(str(uuid.uuid4()), api.nixl_agent_config(
            num_threads=4, capture_telemetry=True))
        # Each D rank holds half the heads: blocks of HALF bytes.
        self.caches = [fake_vram.region(mem, NBLOCKS * HALF, self.dev)
                       for _ in range(NREGIONS)]
        data = [(c.addr, c.nbytes, self.dev, "") for c in self.caches]
        self.reg = self.agent.get_reg_descs(data, mem)
        self.agent.register_memory(self.reg, backends=["UCX"])
        rows = [(c.addr + b * HALF, HALF, self.dev)
                for c in self.caches for b in range(NBLOCKS)]
        self.local = self.agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", self.agent.get_xfer_descs(rows, mem))

    def handshake(self, meta, bases):
        self.peer = self.agent.add_remote_agent(meta)
        # _build_fa_remote: this rank's head slice of every P block (P's
        # memory is of the same kind, on its device 0).
        rows = block_rows(bases, self.rank * HALF, HALF)
        self.remote = self.agent.prep_xfer_dlist(
            self.peer, self.agent.get_xfer_descs(rows, self.mem))
        return self.peer

    def read(self, d_blocks, p_blocks, notif):
        """pull_worker's _read_blocks: make, transfer; a failed transfer
        releases the handle (_handle_failed_transfer) and re-raises."""
        h = self.agent.make_prepped_xfer(
            "READ", self.local, desc_ids(d_blocks), self.remote,
            desc_ids(p_blocks), notif_msg=notif)
        try:
            self.agent.transfer(h)
        except Exception:
            self.agent.release_xfer_handle(h)
            raise
        return h

    def evict(self):
        """_cleanup_remote_engine."""
        self.agent.release_dlist_handle(self.remote)
        self.agent.remove_remote_agent(self.peer)

    def check(self, pairs, seed):
        """Every block read equals P's, byte for byte (read back through
        the driver for GPU memory); the others are still zero."""
        for r, c in enumerate(self.caches):
            src = region_bytes(r, seed).reshape(NBLOCKS, BLOCK_LEN)
            got = c.read().reshape(NBLOCKS, HALF)
            for d, p in pairs.items():
                want = src[p, self.rank * HALF:(self.rank + 1) * HALF]
                assert np.array_equal(got[d], want), (self.rank, r, d, p)
            for d in set(range(NBLOCKS)) - set(pairs):
                assert not got[d].any(), (self.rank, r, d)

    def shutdown(self, handles=()):
        """vLLM's shutdown order."""
        for h in handles:
            self.agent.release_xfer_handle(h)
        self.agent.release_dlist_handle(self.local)
        self.evict()
        self.agent.deregister_memory(self.reg)


def _check_path(d, h, mem, across_hosts):
    """The request's path: across hosts, UCX; GPU memory there staged
    through pinned host memory (this UCX carries no CUDA memory)."""
    if not across_hosts:
        return
    t = h.telemetry()
    assert d.agent.query_xfer_backend(h) == "ucx", t
    assert t["transport"].startswith("tcp"), t
    if mem == "VRAM":
        assert t["fallback"] and "staged" in t["fallback_why"], t


def d_pull_hetero_tp(api, p, seed, mem="DRAM", across_hosts=False):
    """The decode engine's sequence against P (the pipe to vllm_prefill,
    started with `seed` and ["req-a", "req-b", "req-c"]): two D ranks
    read their halves, heartbeats, a TTL eviction and a new handshake,
    every byte checked; P told to quit."""
    _, meta, bases, p_name = recv_from_p(p)
    ranks = [DRank(api, r, mem) for r in range(2)]
    for d in ranks:
        assert d.handshake(meta, bases).decode() == p_name
        assert d.agent.check_remote_metadata(d.peer)

    # req-a: both D ranks read their halves of P blocks 4, 9, 2 into
    # their blocks 0, 1, 2; each notifies "req-a:2".
    pairs_a = {0: 4, 1: 9, 2: 2}
    hs = [d.read(list(pairs_a), list(pairs_a.values()), b"req-a:2")
          for d in ranks]
    for d, h in zip(ranks, hs):
        assert wait_state(d.agent, h) == "DONE"
        tel = d.agent.get_xfer_telemetry(h)
        assert tel.descCount == 3 * NREGIONS
        assert tel.totalBytes == 3 * NREGIONS * HALF
        assert tel.xferDuration >= 0 and tel.postDuration >= 0
        _check_path(d, h, mem, across_hosts)
        d.agent.release_xfer_handle(h)
    # Heartbeats for requests still being waited for.
    for d in ranks:
        d.agent.send_notif(d.peer, notif_msg=b"HB:req-b,req-c")

    # TTL eviction of the P engine on rank 1, then a new handshake.
    ranks[1].evict()
    assert not ranks[1].agent.check_remote_metadata(ranks[1].peer)
    ranks[1].handshake(meta, bases)

    # req-b: blocks 10..13 (contiguous), req-c: one block.
    pairs_b = {10 + i: 20 + i for i in range(4)}
    pairs_c = {23: 0}
    for pairs, req in ((pairs_b, b"req-b:2"), (pairs_c, b"req-c:2")):
        hs = [d.read(list(pairs), list(pairs.values()), req)
              for d in ranks]
        for d, h in zip(ranks, hs):
            assert wait_state(d.agent, h) == "DONE"
            d.agent.release_xfer_handle(h)

    tag, freed, heartbeats, unknown = recv_from_p(p)
    assert tag == "freed" and freed == ["req-a", "req-b", "req-c"]
    assert unknown == []
    assert heartbeats == sorted(["req-b", "req-c"] * 2)
    every = dict(pairs_a)
    every.update(pairs_b)
    every.update(pairs_c)
    for d in ranks:
        d.check(every, seed)

    p.send("quit")
    assert recv_from_p(p) == "bye"
    for d in ranks:
        d.shutdown()


def d_prefill_killed(api, p, seed, kill_p, mem="DRAM", across_hosts=False):
    """P (vllm_prefill with `seed` and ["never"]) dies by kill_p() under a
    READ vLLM posted and under one it posts after: each ends with an
    exception or a non-DONE state within a bound, check_remote_metadata
    turns False, and vLLM's failure path (release_xfer_handle) and
    shutdown raise nothing. Returns the seconds until the failure showed."""
    _, meta, bases, p_name = recv_from_p(p)
    d = DRank(api, 0, mem)
    d.handshake(meta, bases)
    ok = d.read([0], [1], b"req-x:1")
    assert wait_state(d.agent, ok) == "DONE"
    _check_path(d, ok, mem, across_hosts)
    d.agent.release_xfer_handle(ok)
    d.check({0: 1}, seed)

    kill_p()
    failed = []
    t0 = time.monotonic()
    end = t0 + 15
    # As vLLM's _pop_done_transfers: any state other than DONE/PROC, or
    # an exception from check_xfer_state or transfer, is a failure.
    while not failed and time.monotonic() < end:
        try:
            h = d.read(list(range(3, 8)), list(range(3, 8)), b"req-y:1")
        except Exception as e:  # NIXL raises from transfer too
            failed.append(("post", e))
            break
        try:
            st = wait_state(d.agent, h,
                            timeout=max(0.1, end - time.monotonic()))
            if st not in ("DONE", "PROC"):
                failed.append(("state", st))
            # DONE: the peer not yet seen dead: try again
        except Exception as e:
            failed.append(("check", e))
        d.agent.release_xfer_handle(h)  # vLLM's _handle_failed_transfer
        time.sleep(0.01)
    took = time.monotonic() - t0
    print("failure seen after %.3f s: %s" % (took, failed))
    assert failed, "READs from a killed peer never failed in 15 s"
    if failed[0][0] != "state":
        # NIXL's class for a peer that went away, with pdx's reason.
        import nixl._bindings as nb
        assert isinstance(failed[0][1], nb.nixlRemoteDisconnectError), \
            failed
        assert "gone" in str(failed[0][1]) or \
            "disconnect" in str(failed[0][1]), failed
    end = time.monotonic() + 10
    while d.agent.check_remote_metadata(d.peer) and time.monotonic() < end:
        time.sleep(0.01)
    assert not d.agent.check_remote_metadata(d.peer)
    d.shutdown()
    return took


@reporting(timeout=150)
def vllm_decode(conn, p, seq, seed, mem):
    """The D engine in a worker (on another host than P): runs sequence
    `seq` ("pull" or "killed") against P on pipe `p`; for "killed" the
    test kills P when asked ("kill P" -> "killed"). Sends "ok"."""
    api = nixl_api()
    if seq == "pull":
        d_pull_hetero_tp(api, p, seed, mem, across_hosts=True)
    else:
        def kill_p():
            conn.send("kill P")
            assert recv(conn, 30) == "killed"
        d_prefill_killed(api, p, seed, kill_p, mem, across_hosts=True)
    conn.send("ok")
