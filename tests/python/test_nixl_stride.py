"""NIXL 1.5's strided descriptors in prep_xfer_dlist, in the style of
NIXL's own test/python/test_nixl_api.py (fixtures of uuid-named agents of
one backend, two connected agents, nixl._utils buffers): an N x 5 array
of rows (addr, len, devId, stride, count) prepares `count` blocks of `len`
bytes spaced `stride` apart, and make_prepped_xfer indexes the handle by
flattened block index, run by run; the same transfers as with the blocks
listed one by one, every byte checked. What NIXL refuses is refused: no
mem type (ValueError), a wrong dtype or a non-contiguous array
(ValueError), count 0, len 0, stride < len (nixlInvalidParamError). Run
through the 'nixl' shim package, as a stack imports it."""
import sys
import time
import uuid

import numpy as np
import pytest

import pdx.nixl

sys.path.insert(0, pdx.nixl.SHIM_PATH)

import nixl._bindings as bindings  # noqa: E402
import nixl._utils as utils  # noqa: E402
from nixl._api import nixl_agent, nixl_agent_config  # noqa: E402

BLOCK = 4096
NBLOCKS = 64


@pytest.fixture(scope="module")
def backend_name():
    return "UCX"


@pytest.fixture
def two_connected_agents(backend_name):
    agent1, agent2 = (
        nixl_agent(str(uuid.uuid4()),
                   nixl_conf=nixl_agent_config(backends=[backend_name])),
        nixl_agent(str(uuid.uuid4()),
                   nixl_conf=nixl_agent_config(backends=[backend_name])),
    )
    agent1.add_remote_agent(agent2.get_agent_metadata())
    agent2.add_remote_agent(agent1.get_agent_metadata())
    yield (agent1, agent2)
    agent1.remove_remote_agent(agent2.name)
    agent2.remove_remote_agent(agent1.name)


@pytest.fixture
def two_buffers(two_connected_agents):
    """agent1 owns `src` (blocks of value 1 + block index), agent2 `dst`
    (zeros); both registered."""
    agent1, agent2 = two_connected_agents
    size = NBLOCKS * BLOCK
    src = utils.malloc_passthru(size)
    dst = utils.malloc_passthru(size)
    for b in range(NBLOCKS):
        pdx_fill(src + b * BLOCK, BLOCK, 1 + b)
    pdx_fill(dst, size, 0)
    reg1 = agent1.register_memory(
        agent1.get_reg_descs([(src, size, 0, "")], "DRAM"))
    reg2 = agent2.register_memory(
        agent2.get_reg_descs([(dst, size, 0, "")], "DRAM"))
    # Metadata again, now with the regions (as NIXL's tests do after
    # registering).
    agent1.add_remote_agent(agent2.get_agent_metadata())
    agent2.add_remote_agent(agent1.get_agent_metadata())
    yield src, dst
    agent1.deregister_memory(reg1)
    agent2.deregister_memory(reg2)
    utils.free_passthru(src)
    utils.free_passthru(dst)


def pdx_fill(addr, size, value):
    import ctypes
    ctypes.memset(addr, value & 0xFF, size)


def block_of(addr, b):
    import ctypes
    return ctypes.string_at(addr + b * BLOCK, BLOCK)


def wait_done(agent, handle, timeout=20.0):
    end = time.monotonic() + timeout
    state = agent.check_xfer_state(handle)
    while state == "PROC" and time.monotonic() < end:
        state = agent.check_xfer_state(handle)
    return state


def test_strided_prep_matches_flat(two_connected_agents, two_buffers):
    agent1, agent2 = two_connected_agents
    src, dst = two_buffers
    # agent1's blocks as two runs: the even blocks 0..30 (stride 2 blocks,
    # 16 blocks), then blocks 32..63 dense (stride == len, 32 blocks).
    rows = np.array([[src, BLOCK, 0, 2 * BLOCK, 16],
                     [src + 32 * BLOCK, BLOCK, 0, BLOCK, 32]], np.uint64)
    remote = agent2.prep_xfer_dlist(agent1.name, rows, "DRAM")
    flat = [src + 2 * b * BLOCK for b in range(16)] + \
        [src + (32 + b) * BLOCK for b in range(32)]
    # agent2's side dense, as int64 rows (NIXL takes both dtypes).
    local = agent2.prep_xfer_dlist(
        "NIXL_INIT_AGENT",
        np.array([[dst, BLOCK, 0, BLOCK, NBLOCKS]], np.int64), "DRAM")
    # Flattened indices: remote block i is flat[i].
    pick_remote = [0, 5, 15, 16, 47, 20]
    pick_local = [3, 9, 1, 60, 0, 33]
    h = agent2.make_prepped_xfer("READ", local, pick_local, remote,
                                 pick_remote, b"strided")
    assert agent2.transfer(h) in ("DONE", "PROC")
    assert wait_done(agent2, h) == "DONE"
    for lb, ri in zip(pick_local, pick_remote):
        want = bytes([(1 + (flat[ri] - src) // BLOCK) & 0xFF]) * BLOCK
        assert block_of(dst, lb) == want, (lb, ri)
    untouched = set(range(NBLOCKS)) - set(pick_local)
    assert all(block_of(dst, b) == bytes(BLOCK) for b in untouched)
    agent2.release_xfer_handle(h)
    end = time.monotonic() + 10
    while not agent1.check_remote_xfer_done(agent2.name, b"strided"):
        assert time.monotonic() < end
    # The same rows listed one by one prepare the same list.
    flat_h = agent2.prep_xfer_dlist(
        agent1.name, [(a, BLOCK, 0) for a in flat], "DRAM")
    h = agent2.make_prepped_xfer("WRITE", local, [3], flat_h, [40])
    assert agent2.transfer(h) in ("DONE", "PROC")
    assert wait_done(agent2, h) == "DONE"
    # dst block 3 holds src block 0 (value 1); flat[40] is src block 56.
    assert block_of(src, (flat[40] - src) // BLOCK) == b"\x01" * BLOCK
    agent2.release_xfer_handle(h)
    for handle in (remote, local, flat_h):
        agent2.release_dlist_handle(handle)


def test_strided_list_of_tuples(two_connected_agents, two_buffers):
    """5-tuples (no numpy array) give the same handle."""
    agent1, agent2 = two_connected_agents
    src, dst = two_buffers
    remote = agent2.prep_xfer_dlist(
        agent1.name, [(src + BLOCK, BLOCK, 0, 3 * BLOCK, 4)], "DRAM")
    local = agent2.prep_xfer_dlist(
        "NIXL_INIT_AGENT", [(dst, BLOCK, 0, BLOCK, 4)], "DRAM")
    h = agent2.make_prepped_xfer("READ", local, [0, 1, 2, 3], remote,
                                 [0, 1, 2, 3])
    agent2.transfer(h)
    assert wait_done(agent2, h) == "DONE"
    for i in range(4):
        assert block_of(dst, i) == bytes([2 + 3 * i]) * BLOCK
    agent2.release_xfer_handle(h)
    agent2.release_dlist_handle(remote)
    agent2.release_dlist_handle(local)


def test_strided_refusals(two_connected_agents, two_buffers):
    agent1, agent2 = two_connected_agents
    src, _ = two_buffers
    good = np.array([[src, BLOCK, 0, BLOCK, 4]], np.uint64)
    with pytest.raises(ValueError):  # NIXL: a mem type is mandatory
        agent2.prep_xfer_dlist(agent1.name, good)
    with pytest.raises(ValueError):
        agent2.prep_xfer_dlist(agent1.name, good.astype(np.float64), "DRAM")
    with pytest.raises(ValueError):
        agent2.prep_xfer_dlist(agent1.name,
                               np.asfortranarray(np.repeat(good, 2, 0)),
                               "DRAM")
    for bad in ([src, BLOCK, 0, BLOCK, 0],       # count 0
                [src, 0, 0, BLOCK, 4],           # len 0
                [src, BLOCK, 0, BLOCK - 1, 4]):  # stride < len
        with pytest.raises(bindings.nixlInvalidParamError):
            agent2.prep_xfer_dlist(agent1.name, np.array([bad], np.uint64),
                                   "DRAM")
    # A run past the peer's region is refused as any descriptor would be.
    with pytest.raises(bindings.nixlNotFoundError):
        agent2.prep_xfer_dlist(
            agent1.name,
            np.array([[src, BLOCK, 0, BLOCK, NBLOCKS + 1]], np.uint64),
            "DRAM")
