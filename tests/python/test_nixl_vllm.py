"""pdx in NIXL's place under vLLM's newest pull-mode NixlConnector worker
(vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py and
pull_worker.py), its NIXL calls made as that code makes them, through the
'nixl' package (importlib.import_module("nixl._api"), as vllm's
nixl_utils does):

* agents named str(uuid4()) with nixl_agent_config(num_threads=4,
  capture_telemetry=True) (UCX, no backends list);
* K and V of each layer registered as separate regions with
  get_reg_descs([(addr, len, dev, "")], "DRAM") and
  register_memory(descs, backends=["UCX"]); local lists prepared with
  "NIXL_INIT_AGENT", region-major, one descriptor per block;
* heterogeneous TP (D tp 2, P tp 1): each of two D ranks prepares a remote
  list of its head slice of every P block (rank_offset * half) and READs
  it with make_prepped_xfer("READ", ..., np.int64 ids from
  region * nblocks + block, notif_msg=b"<req>:2") + transfer();
  check_xfer_state "DONE"/"PROC", get_xfer_telemetry on DONE (vLLM's
  stats read descCount/totalBytes/xferDuration/postDuration),
  release_xfer_handle; P frees a request after 2 notifications;
* heartbeats send_notif(agent, notif_msg=b"HB:req-a,req-b");
* TTL eviction (_cleanup_remote_engine: release_dlist_handle,
  remove_remote_agent) and a new handshake to the same P, which READs
  again;
* P killed: check_xfer_state / transfer raise or report a failure (never
  hang), release_xfer_handle of the failed handle and vLLM's shutdown
  order (release handles, dlists, remove_remote_agent, deregister_memory)
  raise nothing.
Every byte read is compared with P's."""
import multiprocessing as mp
import os
import signal
import time
import uuid

import numpy as np

import nixl_vllm_workers as wk
from nixl_vllm_workers import BLOCK_LEN, NBLOCKS, NREGIONS

HALF = BLOCK_LEN // 2


def _spawn(*args):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=wk.vllm_prefill, args=(child,) + args,
                       daemon=True)
    proc.start()
    child.close()
    return parent, proc


def _recv(conn, timeout=60.0):
    assert conn.poll(timeout), "the prefill process sent nothing"
    msg = conn.recv()
    if isinstance(msg, tuple) and msg and msg[0] == "error":
        raise RuntimeError("prefill process failed:\n" + msg[1])
    return msg


def _wait(agent, h, timeout=20.0):
    end = time.monotonic() + timeout
    while True:
        st = agent.check_xfer_state(h)
        if st != "PROC" or time.monotonic() > end:
            return st
        time.sleep(0.0005)


def _desc_ids(blocks):
    """vLLM's _compute_desc_ids, all-attention path."""
    block_arr = np.asarray(blocks)[None, :]
    region_ids = np.arange(NREGIONS)[:, None]
    return (region_ids * NBLOCKS + block_arr).flatten()


class DRank:
    """One D TP rank of a tp-2 decode engine reading from a tp-1 P."""

    def __init__(self, api, rank):
        self.rank = rank
        self.agent = api.nixl_agent(str(uuid.uuid4()), api.nixl_agent_config(
            num_threads=4, capture_telemetry=True))
        # Each D rank holds half the heads: blocks of HALF bytes.
        self.caches = [np.zeros(NBLOCKS * HALF, np.uint8)
                       for _ in range(NREGIONS)]
        data = [(c.ctypes.data, c.nbytes, 0, "") for c in self.caches]
        self.reg = self.agent.get_reg_descs(data, "DRAM")
        self.agent.register_memory(self.reg, backends=["UCX"])
        rows = [(c.ctypes.data + b * HALF, HALF, 0)
                for c in self.caches for b in range(NBLOCKS)]
        self.local = self.agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", self.agent.get_xfer_descs(rows, "DRAM"))

    def handshake(self, meta, bases):
        self.peer = self.agent.add_remote_agent(meta)
        # _build_fa_remote: this rank's head slice of every P block.
        rows = wk.block_rows(bases, self.rank * HALF, HALF)
        self.remote = self.agent.prep_xfer_dlist(
            self.peer, self.agent.get_xfer_descs(rows, "DRAM"))
        return self.peer

    def read(self, d_blocks, p_blocks, notif):
        """pull_worker's _read_blocks: make, transfer; a failed transfer
        releases the handle (_handle_failed_transfer) and re-raises."""
        h = self.agent.make_prepped_xfer(
            "READ", self.local, _desc_ids(d_blocks), self.remote,
            _desc_ids(p_blocks), notif_msg=notif)
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
        for r, c in enumerate(self.caches):
            src = wk.region_bytes(r, seed).reshape(NBLOCKS, BLOCK_LEN)
            got = c.reshape(NBLOCKS, HALF)
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


def test_vllm_pull_hetero_tp():
    api = wk.nixl_api()
    seed = 5
    conn, proc = _spawn(seed, ["req-a", "req-b", "req-c"])
    try:
        _, meta, bases, p_name = _recv(conn)
        ranks = [DRank(api, r) for r in range(2)]
        for d in ranks:
            assert d.handshake(meta, bases).decode() == p_name
            assert d.agent.check_remote_metadata(d.peer)

        # req-a: both D ranks read their halves of P blocks 4, 9, 2 into
        # their blocks 0, 1, 2; each notifies "req-a:2".
        pairs_a = {0: 4, 1: 9, 2: 2}
        hs = [d.read(list(pairs_a), list(pairs_a.values()), b"req-a:2")
              for d in ranks]
        for d, h in zip(ranks, hs):
            assert _wait(d.agent, h) == "DONE"
            tel = d.agent.get_xfer_telemetry(h)
            assert tel.descCount == 3 * NREGIONS
            assert tel.totalBytes == 3 * NREGIONS * HALF
            assert tel.xferDuration >= 0 and tel.postDuration >= 0
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
                assert _wait(d.agent, h) == "DONE"
                d.agent.release_xfer_handle(h)

        tag, freed, heartbeats, unknown = _recv(conn)
        assert tag == "freed" and freed == ["req-a", "req-b", "req-c"]
        assert unknown == []
        assert heartbeats == sorted(["req-b", "req-c"] * 2)
        every = dict(pairs_a)
        every.update(pairs_b)
        every.update(pairs_c)
        for d in ranks:
            d.check(every, seed)

        conn.send("quit")
        assert _recv(conn) == "bye"
        proc.join(30)
        assert proc.exitcode == 0
        for d in ranks:
            d.shutdown()
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(10)


def test_vllm_prefill_killed():
    """P dies (SIGKILL) under a READ vLLM posted and under one it posts
    after: each ends with an exception or a non-DONE state within a bound,
    check_remote_metadata turns False, and vLLM's failure path
    (release_xfer_handle) and shutdown raise nothing."""
    api = wk.nixl_api()
    seed = 9
    conn, proc = _spawn(seed, ["never"])
    try:
        _, meta, bases, p_name = _recv(conn)
        d = DRank(api, 0)
        d.handshake(meta, bases)
        ok = d.read([0], [1], b"req-x:1")
        assert _wait(d.agent, ok) == "DONE"
        d.agent.release_xfer_handle(ok)
        d.check({0: 1}, seed)

        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        failed = []
        t0 = time.monotonic()
        end = t0 + 15
        # As vLLM's _pop_done_transfers: any state other than DONE/PROC, or
        # an exception from check_xfer_state or transfer, is a failure.
        while not failed and time.monotonic() < end:
            try:
                h = d.read(list(range(3, 8)), list(range(3, 8)),
                           b"req-y:1")
            except Exception as e:  # NIXL raises from transfer too
                failed.append(("post", e))
                break
            try:
                st = _wait(d.agent, h, timeout=max(0.1, end - time.monotonic()))
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
        while d.agent.check_remote_metadata(d.peer) and \
                time.monotonic() < end:
            time.sleep(0.01)
        assert not d.agent.check_remote_metadata(d.peer)
        d.shutdown()
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(10)
