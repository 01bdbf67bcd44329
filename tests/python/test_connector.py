"""The connector from Python: block hashes identical to vLLM's recipe, a
layout from per-layer arenas or buffers, and a GLM-5.2-shaped P -> D
handoff between two processes (the repository's GLM-5.2 prefill/decode
configs with fewer blocks, DRAM arenas, UCX over shared memory plus cma),
every loaded byte checked."""
import hashlib
import json
import os
import struct
import time

import numpy as np
import pytest

import pdx
from pdx_workers import glm_block_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "configs", "glm52-fp8-mtp")


# vLLM's sha256_cbor in plain Python: sha256(cbor2.dumps(x, canonical=True))
# over (parent, tuple(tokens), extra_keys), NONE_HASH = H(seed).
def _cbor_head(major, n):
    if n < 24:
        return bytes([major << 5 | n])
    for extra, fmt in ((24, ">B"), (25, ">H"), (26, ">I"), (27, ">Q")):
        if n < 1 << (8 * struct.calcsize(fmt)):
            return bytes([major << 5 | extra]) + struct.pack(fmt, n)
    raise ValueError(n)


def cbor(x):
    if x is None:
        return b"\xf6"
    if isinstance(x, int):
        return _cbor_head(0, x)
    if isinstance(x, bytes):
        return _cbor_head(2, len(x)) + x
    if isinstance(x, str):
        b = x.encode()
        return _cbor_head(3, len(b)) + b
    if isinstance(x, (tuple, list)):
        return _cbor_head(4, len(x)) + b"".join(cbor(i) for i in x)
    raise TypeError(x)


def vllm_sha256_cbor(seed, tokens, block_size, lora=None, salt=None):
    h = lambda x: hashlib.sha256(cbor(x)).digest()  # noqa: E731
    parent = h(seed)
    out = []
    for i in range(len(tokens) // block_size):
        extra = []
        if lora is not None:
            extra.append(lora)
        if salt and i == 0:
            extra.append(salt)
        blk = tuple(tokens[i * block_size:(i + 1) * block_size])
        parent = h((parent, blk, tuple(extra) if extra else None))
        out.append(parent)
    return out


def test_hashes_match_vllm_recipe():
    tokens = [(i * 7919 + 3) % 151552 for i in range(1000)]
    hs = pdx.Hasher("sha256_cbor", "glm52-pd", 64)
    assert hs.none_hash == hashlib.sha256(cbor("glm52-pd")).digest()
    assert hs.hash_blocks(tokens) == vllm_sha256_cbor("glm52-pd", tokens, 64)
    assert hs.hash_blocks(np.array(tokens, np.int64), lora_name="ad",
                          cache_salt="s") == \
        vllm_sha256_cbor("glm52-pd", tokens, 64, lora="ad", salt="s")
    # Incremental form and the partial tail key.
    full, tail = hs.hash_blocks(tokens, tail=True)
    assert len(full) == 15 and tail is not None
    assert hs.hash_next(full[-1], tokens[960:]) == tail
    assert hs.hash_next(None, tokens[:64]) == full[0]
    x = pdx.Hasher("xxhash_cbor", "", 16)
    assert len(x.hash_blocks(list(range(33)))[0]) == 16
    try:
        import cbor2
        import xxhash
    except ImportError:
        return
    seed_hash = xxhash.xxh3_128_digest(cbor2.dumps("", canonical=True))
    assert x.none_hash == seed_hash
    b0 = xxhash.xxh3_128_digest(cbor2.dumps(
        (seed_hash, tuple(range(16)), None), canonical=True))
    assert x.hash_blocks(list(range(33)))[0] == b0


def test_layout_from_arenas_and_buffers():
    bufs = [np.zeros(8 * 64 * 656, np.uint8) for _ in range(3)]
    lay = pdx.Layout.from_tensors(64, bufs, 656, kinds="mla")
    assert lay.num_arenas == 3 and lay.num_blocks == 8
    assert lay.arenas()[1]["base"] == bufs[1].ctypes.data
    assert lay.arenas()[2]["name"] == "layer2.mla"
    d = lay.block_descs([1, 2, 3], merged=True)
    assert len(d) == 3 and d[0] == (bufs[0].ctypes.data + 64 * 656,
                                    3 * 64 * 656, 0)
    lay2 = pdx.Layout.from_arenas(64, [
        dict(name="layer%d.mla" % i, layer=i, kind="mla",
             bytes_per_token=656, num_blocks=8) for i in range(3)])
    assert lay2.fingerprint == lay.fingerprint
    glm = pdx.Layout.glm52(4)
    cfg = pdx.KVConfig.load(os.path.join(CONFIGS, "prefill.json"))
    assert pdx.Layout.from_config(cfg).fingerprint == glm.fingerprint
    assert glm.num_arenas == 101 and glm.bytes_per_block == 3502592


def small_config(name):
    """The GLM-5.2 DP8 config with a test-sized pool and DRAM arenas."""
    with open(os.path.join(CONFIGS, name)) as f:
        c = json.load(f)
    c["kv"]["num_blocks"] = 24
    c["kv"]["memory"] = "dram"
    c["backends"] = [{"name": "ucx", "options": {"tls": "sm"}},
                     {"name": "cma"}]
    for ch in c["connector"]["children"]:
        if ch["type"] == "offload":
            ch["budget_bytes"] = "32MiB"
            ch["ranks_per_host"] = 1
        else:
            ch["heartbeat_ms"] = 200
    return json.dumps(c)


def test_glm52_handoff_p_to_d(spawn):
    ntokens = 8 * 64 + 10  # 8 full blocks and a 10-token tail
    nused = 9
    p = spawn("kv_prefill", small_config("prefill.json"), ntokens, nused)
    p_blob = p.recv()
    cfg = pdx.KVConfig.parse(small_config("decode.json"),
                             name="decode.json (test)")
    assert cfg.num_blocks == 24 and cfg.mem_type == "DRAM"
    layout = pdx.Layout.from_config(cfg)
    mem = pdx.mem_alloc(layout.carve_size(4096))
    layout.carve(mem, 4096)
    with pdx.KVConnector(cfg, layout) as d:
        assert d.connect(p_blob) == "glm52-p-dp0"
        p.send(d.describe())
        params, hashes, tail, d_name = p.recv()
        assert d_name == "glm52-d-dp0" and isinstance(params, dict)
        d.check_params(params)
        tokens = [(i * 2654435761 + 1) % 151552 for i in range(ntokens)]
        req = pdx.KVRequest.from_tokens("d-glm", tokens, d.hasher(),
                                        params=params)
        assert [h.hex() for h in req.hashes] == hashes
        assert req.tail_hash.hex() == tail and req.tail_tokens == 10
        m = None
        end = time.monotonic() + 10
        while m is None and time.monotonic() < end:
            m = d.lookup(req)
        assert m == {"source": "remote", "blocks": 8, "tail": True,
                     "tokens": ntokens - 1}
        d_ids = [23, 5, 6, 7, 0, 1, 2, 12, 13]  # scattered, then runs
        d.load(req, m, d_ids)
        got = None
        end = time.monotonic() + 30
        while got is None and time.monotonic() < end:
            d.progress()
            got = d.load_check("d-glm")
            time.sleep(0.0005)
        assert got == ntokens - 1
        arenas = layout.arenas()
        view = np.frombuffer(mem, np.uint8)
        for p_id, d_id in enumerate(d_ids):
            want = glm_block_bytes(arenas, p_id, 5 + p_id)
            for a, data in zip(arenas, want):
                off = a["base"] - mem.addr + d_id * a["stride"]
                if p_id == nused - 1:
                    data = data[:10 * a["bytes_per_token"]]  # the tail
                assert np.array_equal(view[off:off + len(data)], data), \
                    (a["name"], p_id)
        # Blocks not loaded stay zero.
        a = arenas[0]
        off = a["base"] - mem.addr + 20 * a["stride"]
        assert not view[off:off + a["block_bytes"]].any()
        del view
        # D saves what it loaded into its offload pool (save_only).
        d.save(req, d_ids)
        end = time.monotonic() + 20
        while not d.save_check("d-glm") and time.monotonic() < end:
            time.sleep(0.001)
        assert d.save_check("d-glm")
        st = d.offload_stats()
        assert st["saves"] >= 8 and st["block_bytes"] == 3502592, st
        _, freed, held = p.recv()
        assert freed == [("req-glm", "done")] and held == 0
        p.send("quit")
        assert p.recv() == "done"
        assert p.join() == 0
        with pytest.raises(pdx.NotFound):
            d.load_abort("never-loaded")
    with pytest.raises(pdx.Closed):
        d.progress()
    mem.close()
