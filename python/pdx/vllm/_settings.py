"""vLLM's own settings and KV cache tensors, turned into a pdx connector
config and layout, and checked: the hash algorithm
(prefix_caching_hash_algo), the seed vLLM derives NONE_HASH from
(PYTHONHASHSEED), the block size, the cache dtype and the KV layout come
from vLLM; a value the connector's extra config (or a pdx config file)
pins that differs is refused here, naming the field and both values.

Nothing here imports vLLM: the objects are read by attribute, so the same
code runs under vLLM and under a test's stand-in of its types."""
import json
import os
import re

import pdx

# vLLM's names of the hash algorithms pdx reproduces in C. "sha256" and
# "xxhash" hash a pickle, which only CPython can produce.
HASH_ALGOS = ("sha256_cbor", "xxhash_cbor")

# kv_connector_extra_config keys this connector reads (the rest is refused,
# with the nearest known key, so a typo is never silently ignored).
EXTRA_KEYS = {
    "agent_name", "children", "offload", "remote", "backends", "store",
    "side_channel_host", "side_channel_port", "layerwise", "load_mode",
    "push", "pdx_config", "hash_algo", "hash_seed", "block_size",
    "kv_dtype", "kv_layout", "cluster_key_file", "rpc_timeout",
    "retry_unreachable", "load_timeout", "reuse",
}


class SettingsMismatch(ValueError):
    """A setting that differs between vLLM and what pdx was told (or
    between two sides): the message names the field and both values."""


def _mismatch(field, ours, theirs, ours_from, theirs_from, hint=""):
    return SettingsMismatch(
        "pdx.vllm: %s mismatch: %s has %r, %s has %r%s"
        % (field, ours_from, ours, theirs_from, theirs,
           (": " + hint) if hint else ""))


def _attr(obj, *names, default=None):
    for n in names:
        if obj is not None and getattr(obj, n, None) is not None:
            return getattr(obj, n)
    return default


def _dtype_name(d):
    s = str(d)
    return s[len("torch."):] if s.startswith("torch.") else s


def _short_name(model_id):
    """configs/README.md's rule for the agent name's model part."""
    s = model_id.rsplit("/", 1)[-1].lower()
    out, seen_digit = "", False
    for ch in s:
        if ch == "-" and seen_digit:
            break
        if ch.isalnum():
            out += ch
            seen_digit |= ch.isdigit()
    return out or "pdx"


def kv_cache_layout():
    """vLLM's KV cache layout (NHD/HND), when vLLM says; None without it."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.utils import (
            get_kv_cache_layout)
        return str(get_kv_cache_layout())
    except Exception:  # noqa: BLE001 - any vLLM without it
        return None


def settings(vllm_config, environ=None):
    """What pdx takes from vLLM, as a dict, every field checked against the
    pins of kv_connector_extra_config and of a pdx config file it names.
    Raises SettingsMismatch (a field differs, or cannot be shared between
    P and D) or ValueError (an unknown extra key)."""
    env = os.environ if environ is None else environ
    cc = vllm_config.cache_config
    mc = vllm_config.model_config
    pc = vllm_config.parallel_config
    ktc = vllm_config.kv_transfer_config
    extra = dict(_attr(ktc, "kv_connector_extra_config", default={}) or {})
    unknown = sorted(set(extra) - EXTRA_KEYS)
    if unknown:
        import difflib
        near = difflib.get_close_matches(unknown[0], sorted(EXTRA_KEYS), 1)
        raise ValueError(
            "pdx.vllm: kv_connector_extra_config: unknown key %r%s (known: "
            "%s)" % (unknown[0], " (did you mean %r?)" % near[0]
                     if near else "", ", ".join(sorted(EXTRA_KEYS))))
    algo = str(_attr(cc, "prefix_caching_hash_algo", default="sha256"))
    if algo not in HASH_ALGOS:
        raise SettingsMismatch(
            "pdx.vllm: prefix_caching_hash_algo mismatch: vLLM has %r, pdx "
            "reproduces only %s (the pickle-based ones cannot be computed "
            "outside CPython, so P and D could never agree): start vLLM "
            "with --prefix-caching-hash-algo sha256_cbor (or xxhash_cbor)"
            % (algo, " and ".join(HASH_ALGOS)))
    seed = env.get("PYTHONHASHSEED")
    if seed is None:
        raise SettingsMismatch(
            "pdx.vllm: hash seed mismatch: PYTHONHASHSEED is not set, so "
            "vLLM derives its NONE_HASH from random bytes and no two engines "
            "share a block hash: set PYTHONHASHSEED, the same on every P "
            "and D (and the offload tier's other readers)")
    block_size = int(cc.block_size)
    dtype = str(_attr(cc, "cache_dtype", default="auto"))
    if dtype == "auto":
        dtype = _dtype_name(_attr(mc, "dtype", default="auto"))
    layout = kv_cache_layout() or str(extra.get("kv_layout") or "NHD")
    s = {
        "hash_algo": algo,
        "hash_seed": seed,
        "block_size": block_size,
        "kv_dtype": dtype,
        "kv_layout": layout,
        "model_id": str(_attr(mc, "model", default="model")),
        "kv_role": str(_attr(ktc, "kv_role", default="kv_both")),
        "engine_id": str(_attr(ktc, "engine_id", default="0")),
        "dp_rank": int(_attr(pc, "data_parallel_rank",
                             "data_parallel_index", default=0)),
        "dp_size": int(_attr(pc, "data_parallel_size", default=1)),
        "tp_size": int(_attr(pc, "tensor_parallel_size", default=1)),
        "failure_policy": str(_attr(ktc, "kv_load_failure_policy",
                                    default="recompute")),
        "num_hidden_layers": int(_attr(
            _attr(mc, "hf_text_config", "hf_config"),
            "num_hidden_layers", default=0) or 0),
        "extra": extra,
    }
    vllm_names = {"hash_algo": "prefix_caching_hash_algo",
                  "hash_seed": "PYTHONHASHSEED",
                  "block_size": "block_size",
                  "kv_dtype": "cache_dtype",
                  "kv_layout": "KV cache layout"}
    for key, vname in vllm_names.items():
        if key in extra and str(extra[key]) != str(s[key]):
            raise _mismatch(key, str(extra[key]), str(s[key]),
                            "kv_connector_extra_config", "vLLM's " + vname)
    if extra.get("pdx_config"):
        s["file"] = _check_file(extra["pdx_config"], s)
    if s["tp_size"] != 1:
        raise ValueError(
            "pdx.vllm: tensor_parallel_size %d: PdxConnector pairs one "
            "engine rank with one pdx agent; run TP 1 per engine and scale "
            "with data parallelism (--data-parallel-size), as the GLM-5.2 "
            "deployment does" % s["tp_size"])
    return s


def _check_file(path, s):
    """A pdx config file's sections that must agree with vLLM."""
    with open(path) as f:
        doc = json.load(f)
    pins = [("hashing.algorithm", ("hashing", "algorithm"), "hash_algo",
             "prefix_caching_hash_algo"),
            ("hashing.seed", ("hashing", "seed"), "hash_seed",
             "PYTHONHASHSEED"),
            ("kv.block_tokens", ("kv", "block_tokens"), "block_size",
             "block_size"),
            ("model.kv_dtype", ("model", "kv_dtype"), "kv_dtype",
             "cache_dtype")]
    for field, (sec, key), ours, vname in pins:
        v = (doc.get(sec) or {}).get(key)
        if v is not None and str(v) != str(s[ours]):
            raise _mismatch(field, str(v), str(s[ours]),
                            "pdx config " + path, "vLLM's " + vname)
    return doc


def agent_name(s):
    extra = s["extra"]
    role = {"kv_producer": "p", "kv_consumer": "d"}.get(s["kv_role"], "pd")
    base = extra.get("agent_name") or "%s-%s-%s" % (
        _short_name(s["model_id"]), role,
        re.sub(r"[^A-Za-z0-9]", "", s["engine_id"])[:8] or "0")
    return "%s-dp%d" % (base, s["dp_rank"])[:63]


def _children(s, vram):
    extra = s["extra"]
    role = s["kv_role"]
    remote = extra.get("remote", {} if role in (
        "kv_producer", "kv_consumer", "kv_both") else None)
    offload = extra.get("offload")
    kids = {}
    if remote is not None:
        r = {"type": "remote",
             "failure_policy": "fail" if s["failure_policy"] == "fail"
             else "recompute"}
        r.update({k: v for k, v in dict(remote).items()
                  if k in ("lease_ms", "heartbeat_ms", "load_tail")})
        kids["remote"] = r
    if offload is not None:
        o = {"type": "offload", "budget_bytes": "1GiB"}
        o.update(dict(offload))
        o.setdefault("ranks_per_host", 1)
        kids["offload"] = o
    order = extra.get("children") or ["remote", "offload"]
    return [kids[k] for k in order if k in kids]


def pdx_config(s, bytes_per_token, num_blocks, mem_type, device):
    """The pdx config (configs/README.md's schema) of this engine rank, as
    a dict: vLLM's settings, the shape of its KV tensors, and the extra
    config's children, backends and store (or a pdx config file's)."""
    extra = s["extra"]
    doc = s.get("file") or {}
    vram = mem_type == pdx.VRAM
    backends = extra.get("backends") or doc.get("backends") or (
        [{"name": "ucx"}, {"name": "cuda_ipc"}] if vram else
        [{"name": "ucx"}, {"name": "cma"}])
    cfg = {
        "version": 1,
        "description": "generated by pdx.vllm from vLLM's settings",
        "model": {"id": s["model_id"][:127] or "model",
                  "kv_dtype": re.sub(r"[^A-Za-z0-9._-]", "_",
                                     s["kv_dtype"])[:31],
                  "num_layers": 1,
                  "mla_bytes_per_token": int(bytes_per_token)},
        "parallel": {"dp_size": max(s["dp_size"], s["dp_rank"] + 1),
                     "dp_rank": s["dp_rank"]},
        "kv": {"block_tokens": s["block_size"],
               "num_blocks": int(num_blocks),
               "memory": "vram" if vram else "dram",
               "device": int(device)},
        "hashing": {"algorithm": s["hash_algo"], "seed": s["hash_seed"]},
        # Peers are many and found per request (the handoff names its
        # holder): the config's one peer is a placeholder.
        "agent": {"role": "both", "name": agent_name(s),
                  "peer": "vllm-peers"},
        "connector": {"children": (doc.get("connector") or {}).get(
            "children") or _children(s, vram)},
        "backends": backends,
    }
    key = extra.get("cluster_key_file") or \
        (doc.get("agent") or {}).get("cluster_key_file")
    if key:
        cfg["agent"]["cluster_key_file"] = key
    store = extra.get("store") or doc.get("store")
    if store:
        cfg["store"] = store
    for ch in cfg["connector"]["children"]:
        if ch.get("type") == "offload":
            ch.setdefault("ranks_per_host", 1)
            ch["ranks_per_host"] = min(ch["ranks_per_host"],
                                       cfg["parallel"]["dp_size"])
    return cfg


_LAYER_RE = re.compile(r"layers\.(\d+)\.")


def _kind_of(name, split):
    if "indexer" in name:
        return "index_k"
    return "kv" if split else "mla"


def arenas_of(kv_caches, block_size, num_blocks=None, num_hidden_layers=0):
    """vLLM's KV cache tensors (layer name -> tensor), as pdx arenas.

    A tensor [num_blocks, ...] is one arena (MLA, indexer keys); a tensor
    [2, num_blocks, ...] (K and V planes, as FlashAttention lays them out)
    is two. Each block must be contiguous in its plane. Arenas are named by
    layer number and kind (layer<L>.mla, layer<L>.index_k, layer<L>.kv.k,
    ...) so that P and D of one model get one layout fingerprint; layers at
    or past the model's num_hidden_layers are MTP layers.

    Returns (list of add_arena keyword dicts, {vLLM layer name: layer})."""
    out, names = [], {}
    for idx, (name, t) in enumerate(sorted(kv_caches.items())):
        m = _LAYER_RE.search(name + ".")
        layer = int(m.group(1)) if m else idx
        names[name] = layer
        elem = t.element_size()
        shape = tuple(t.shape)
        split = (len(shape) >= 3 and shape[0] == 2 and
                 (num_blocks is None or shape[1] == num_blocks) and
                 shape[0] != num_blocks)
        planes = [(t[0], ".k"), (t[1], ".v")] if split else [(t, "")]
        for plane, suffix in planes:
            nb = plane.shape[0]
            blk = plane[0]
            block_bytes = blk.numel() * elem
            if not blk.is_contiguous() or block_bytes % block_size:
                raise ValueError(
                    "pdx.vllm: KV cache %s %s: a block is not %d contiguous "
                    "tokens" % (name, shape, block_size))
            dev = plane.device
            out.append({
                "name": "layer%d.%s%s" % (layer, _kind_of(name, split),
                                          suffix),
                "layer": layer,
                "kind": _kind_of(name, split),
                "bytes_per_token": block_bytes // block_size,
                "num_blocks": nb,
                "is_mtp": bool(num_hidden_layers) and
                layer >= num_hidden_layers,
                "stride": plane.stride(0) * elem,
                "base": plane.data_ptr(),
                "mem_type": pdx.VRAM if dev.type == "cuda" else pdx.DRAM,
                "device": (dev.index or 0) if dev.type == "cuda" else 0,
            })
    kinds = {"mla": 0, "kv": 0, "index_k": 1}
    out.sort(key=lambda a: (a["layer"], kinds[a["kind"]], a["name"]))
    seen = set()
    for a in out:
        if a["name"] in seen:
            raise ValueError("pdx.vllm: two KV caches map to arena %s"
                             % a["name"])
        seen.add(a["name"])
    return out, names
