"""The replay's fake model (no vLLM, no pdx): deterministic KV and
tokens. The KV of token t at layer L is a function of tokens[0..t], L and
the cache; the next token, a hash of every KV byte of the request at
sampling time. So a wrong byte loaded from a peer or the offload tier
changes the output, and the test computes every expected byte and token
without an engine."""
import hashlib

import numpy as np

BLOCK = 64
VOCAB = 151552
# A GLM-5.2-shaped model, small: 4 decoder layers and one MTP layer, the
# fp8_ds_mla cache (656 B/token) on each, index-K (132 B/token) on
# IndexShare's layers 0 and 2 and on the MTP layer.
NUM_LAYERS = 4
MLA_BPT, IDX_BPT = 656, 132
INDEX_LAYERS = (0, 2, 4)


def caches_spec():
    """[(vLLM layer name, layer, bytes per token)] in vLLM's naming."""
    out = []
    for layer in range(NUM_LAYERS + 1):
        out.append(("model.layers.%d.self_attn.attn" % layer, layer,
                    MLA_BPT))
        if layer in INDEX_LAYERS:
            out.append(("model.layers.%d.self_attn.indexer.k_cache" % layer,
                        layer, IDX_BPT))
    return out


def _mix(x):
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(0xFFFFFFFFFFFFFFFF)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def token_keys(tokens):
    """One 64-bit key per position, a function of tokens[0..t]."""
    keys = np.empty(len(tokens), np.uint64)
    h = np.uint64(0x1234567)
    with np.errstate(over="ignore"):
        for i, t in enumerate(tokens):
            h = _mix(h ^ np.uint64(t))
            keys[i] = h
    return keys


def kv_rows(keys, cache_index, bpt):
    """The KV bytes of those positions in one cache: (n, bpt) uint8."""
    with np.errstate(over="ignore"):
        base = _mix(keys ^ np.uint64(0xC0FFEE * (cache_index + 1)))
        lanes = np.arange(bpt // 4, dtype=np.uint64) * np.uint64(0x9E3779B1)
        rows = (base[:, None] + lanes[None, :]) & np.uint64(0xFFFFFFFF)
    return rows.astype(np.uint32).view(np.uint8).reshape(len(keys), bpt)


def next_token(kv_bytes_digest):
    return int.from_bytes(kv_bytes_digest[:4], "little") % VOCAB


def expected_output(tokens, max_tokens):
    """What any engine must sample for `tokens` (the test's reference)."""
    toks, out = list(tokens), []
    spec = caches_spec()
    for _ in range(max_tokens):
        keys = token_keys(toks)
        h = hashlib.sha256()
        for ci, (_, _, bpt) in enumerate(spec):
            h.update(kv_rows(keys, ci, bpt).tobytes())
        t = next_token(h.digest())
        out.append(t)
        toks.append(t)
    return out
