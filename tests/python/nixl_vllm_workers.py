"""The prefill side of test_nixl_vllm.py: a vLLM (newest pull-mode
NixlConnector) P worker driving NIXL through the 'nixl' package (pdx's
shim, imported as vllm's nixl_utils does: importlib.import_module
("nixl._api")). Every function takes the pipe end first; an exception is
reported as ("error", traceback)."""
import os
import sys
import time
import uuid

import numpy as np

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
def vllm_prefill(conn, seed, expected):
    """P: registers its K/V regions as vLLM does, prepares its local list
    with NIXL_INIT_AGENT, sends (metadata, bases) and serves notifications:
    "<req>:<consumers>" frees a request once that many arrived, "HB:a,b"
    extends leases. `expected` lists the request ids it must free. Sends
    ("freed", freed, heartbeats, unknown) and waits for "quit" (or is
    killed by the test)."""
    api = nixl_api()
    agent = api.nixl_agent(str(uuid.uuid4()), api.nixl_agent_config(
        num_threads=4, capture_telemetry=True))
    import pdx
    regions = []
    for r in range(NREGIONS):
        m = pdx.mem_alloc(NBLOCKS * BLOCK_LEN)
        np.frombuffer(m, np.uint8)[:] = region_bytes(r, seed)
        regions.append(m)
    caches_data = [(m.addr, NBLOCKS * BLOCK_LEN, 0, "") for m in regions]
    descs = agent.get_reg_descs(caches_data, "DRAM")
    agent.register_memory(descs, backends=["UCX"])
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", agent.get_xfer_descs(
        block_rows([m.addr for m in regions]), "DRAM"))
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
