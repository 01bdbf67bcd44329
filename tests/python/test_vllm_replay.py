"""pdx.vllm.PdxConnector driven as vLLM drives a KV connector (the replay
of vllm_replay.py, following vLLM commit
003df2961dd8830c317a61f9745ccd557da9fa06), in two engine processes (and a
third where a peer must be refused), torch CPU tensors as the KV caches:

* a 1,200-token prompt handed from P to D with its partial tail,
  byte-exact, and P's blocks freed on D's done;
* D-to-P reuse on a second turn (P reads D's offload pool);
* an offload hit after the GPU cache forgot everything;
* a peer with another hash seed, hash algorithm, block size or cache
  dtype refused at connect with the field and both values named; a
  pinned setting vLLM does not have refused likewise;
* the holder killed mid-load: the blocks reported as load errors, then
  recomputed, and never a hang;
* layer-wise push and load, each layer in order, landing while the
  prefill node still computes later layers;
* preemption (a resumed request hits its own saved blocks), abort (of a
  load on its way, of a prefill), lease expiry;
* D aborting requests P holds blocks for: P frees them (reject or done),
  not at the lease's end.

Every call the replay makes goes through the connector's class as vLLM
makes it; an AttributeError or NotImplementedError fails the test."""
import random
import time

import pytest

torch = pytest.importorskip("torch", reason="the replay's KV caches are "
                            "torch CPU tensors (python3-torch)")

import vllm_replay_model as vr  # noqa: E402
from vllm_replay_workers import engine_proc, settings_proc  # noqa: E402

OFFLOAD = {"offload": {"budget_bytes": "64MiB"}}
P_D = {"do_remote_decode": True, "do_remote_prefill": False}

# Every call vLLM makes on a connector over a request's life (the
# scheduler's, the model runner's, once per engine): the replay must make
# each at least once.
SURFACE = {
    "register_kv_caches", "get_handshake_metadata",
    "set_xfer_handshake_metadata", "bind_gpu_block_pool",
    "get_finished_count", "prefer_cross_layer_blocks",
    "requires_kv_delivery", "build_kv_connector_stats",
    "build_prom_metrics", "requires_piecewise_for_cudagraph",
    "get_required_kvcache_layout", "on_new_request",
    "get_num_new_matched_tokens", "update_state_after_alloc",
    "build_connector_meta", "bind_connector_metadata", "start_load_kv",
    "wait_for_layer_load", "save_kv_layer", "wait_for_save",
    "get_finished", "get_block_ids_with_load_errors",
    "get_kv_connector_stats", "get_kv_connector_kv_cache_events",
    "build_connector_worker_meta", "clear_connector_metadata",
    "update_connector_output", "take_events", "has_pending_push_work",
    "request_finished_all_groups", "reset_cache", "shutdown"}


def tokens(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(vr.VOCAB) for _ in range(n)]


def start(spawn, role, extra, seed="0", **kw):
    spec = dict(role=role, extra=extra, seed=seed, **kw)
    w = spawn(engine_proc, spec)
    msg = w.recv(60.0)
    assert msg[0] == "ready", msg
    w.info = msg[1]
    return w


def call(w, *cmd, timeout=120.0):
    w.send(*cmd)
    return w.recv(timeout)


def run(w, vids, timeout=60.0, freed=True):
    return call(w, "run", vids, {"timeout": timeout, "freed": freed},
                timeout=timeout + 30)


def stop(w):
    calls = call(w, "stop")
    w.join()
    return calls


def test_handoff_reuse_offload(spawn):
    p = start(spawn, "kv_producer", OFFLOAD, engine_id="P1")
    d = start(spawn, "kv_consumer", OFFLOAD, engine_id="D1")
    t1 = tokens(1200, 1)  # 18 full blocks and a 48-token tail
    call(p, "submit", "r1", t1, 1, dict(P_D))
    rp = run(p, ["r1"], freed=False)["r1"]
    kv = rp["kv_transfer_params"]
    assert kv["do_remote_prefill"] and kv["pdx"]["tail"]["tokens"] == 48
    assert len(kv["pdx"]["hashes"]) == 18
    # P's blocks are held for D: vLLM must keep stepping P to free them.
    assert call(p, "pending") is True
    call(d, "submit", "r1", t1, 8, kv)
    rd = run(d, ["r1"])["r1"]
    # Byte-exact: every KV byte of the 1,199 loaded tokens is P's, and D
    # computed only the last prompt token and its decode steps.
    assert rd["digest"] == rp["digest"] and rd["mismatched"] == 0
    assert rd["computed"] == 8 and not rd["load_errors"]
    assert rd["output"] == vr.expected_output(t1, 8)
    # P's blocks were held for D and freed on its done.
    assert run(p, ["r1"])["r1"]["freed"]
    pi = call(p, "info")
    assert pi["held"] == 0 and pi["stats"]["freed_done"] == 1
    assert pi["free_blocks"] == 64
    assert call(p, "pending") is False

    # D-to-P reuse: the next turn's prefill reads the conversation from
    # D's pool (its handoff came back with D's answer).
    reuse = rd["kv_transfer_params"]
    assert reuse and reuse["pdx"]["source"] == "pool"
    t2 = t1 + rd["output"] + tokens(300, 2)
    call(p, "submit", "r2", t2, 1, dict(P_D, **reuse))
    r2 = run(p, ["r2"], freed=False)["r2"]
    assert r2["computed"] == len(t2) - 18 * 64, r2["computed"]
    assert r2["mismatched"] == 0
    assert r2["output"] == vr.expected_output(t2, 1)
    assert call(p, "info")["stats"]["tokens_loaded"] == 18 * 64
    call(d, "info")  # D drives its side: P's done frees D's pool lease
    # Offload hit after eviction: P's GPU cache forgets everything; its
    # pool still has r1's blocks, saved layer by layer.
    call(p, "evict")
    t3 = t1[:1100] + tokens(200, 3)
    call(p, "submit", "r3", t3, 2)
    r3 = run(p, ["r3"])["r3"]
    assert r3["computed"] == len(t3) - 17 * 64 + 1, r3["computed"]
    assert r3["mismatched"] == 0 and r3["output"] == \
        vr.expected_output(t3, 2)
    assert call(p, "info")["offload"]["hits"] >= 17
    calls = stop(p)
    assert SURFACE <= set(calls), SURFACE - set(calls)
    stop(d)


def test_refused_peers_and_settings(spawn):
    # P as vLLM without the hybrid allocator drives it: request_finished.
    p = start(spawn, "kv_producer", {}, engine_id="P2", hma=False)
    t = tokens(700, 4)
    call(p, "submit", "r", t, 1, dict(P_D))
    kv = run(p, ["r"], freed=False)["r"]["kv_transfer_params"]
    agent = kv["pdx"]["agent"]
    # Another hash seed: refused at connect, the field named with both
    # NONE_HASHes; the request is computed, not silently missed.
    d = start(spawn, "kv_consumer", {}, seed="another", engine_id="D2")
    call(d, "submit", "r", t, 2, kv)
    rd = run(d, ["r"])["r"]
    why = call(d, "refused", agent)
    assert "hash seed" in why and "PYTHONHASHSEED" in why, why
    assert "this engine has" in why and "the peer has" in why, why
    assert rd["computed"] == 700 + 1 and rd["output"] == \
        vr.expected_output(t, 2)
    assert call(d, "info")["stats"]["peers_refused"] == 1
    stop(d)
    # Another algorithm.
    d = start(spawn, "kv_consumer", {}, algo="xxhash_cbor", engine_id="D3")
    call(d, "submit", "r", t, 1, kv)
    run(d, ["r"])
    why = call(d, "refused", agent)
    assert "prefix_caching_hash_algo" in why, why
    assert "sha256_cbor" in why and "xxhash_cbor" in why, why
    stop(d)
    # Another block size, another cache dtype: refused at connect, both
    # values named, the request computed here.
    for kw, field, values in (
            ({"block_size": 32}, "block_size", ("32", "64")),
            ({"kv_dtype": "fp8_e4m3"}, "cache_dtype",
             ("fp8_e4m3", "fp8_ds_mla"))):
        d = start(spawn, "kv_consumer", {}, engine_id="D3b", **kw)
        call(d, "submit", "r", t, 2, kv)
        rd = run(d, ["r"])["r"]
        why = call(d, "refused", agent)
        assert field in why and all(v in why for v in values), why
        assert rd["computed"] == 700 + 1 and rd["output"] == \
            vr.expected_output(t, 2)
        assert call(d, "info")["stats"]["peers_refused"] == 1
        stop(d)
    assert "request_finished" in stop(p)
    # A setting the extra config pins that vLLM does not have.
    spec = dict(role="kv_consumer", seed="0", engine_id="D4")
    for extra, field, values in (
            ({"hash_seed": "1"}, "hash_seed", ("'1'", "'0'")),
            ({"block_size": 16}, "block_size", ("'16'", "'64'")),
            ({"kv_dtype": "bfloat16"}, "kv_dtype",
             ("'bfloat16'", "'fp8_ds_mla'"))):
        w = spawn(settings_proc, spec, extra)
        msg = w.recv(60.0)
        assert msg and msg.startswith("SettingsMismatch") and \
            field in msg and all(v in msg for v in values), msg
    w = spawn(settings_proc, dict(spec, algo="sha256"), {})
    msg = w.recv(60.0)
    assert "prefix_caching_hash_algo" in msg and "'sha256'" in msg, msg


def test_holder_killed_mid_load(spawn):
    p = start(spawn, "kv_producer", {}, engine_id="P5")
    d = start(spawn, "kv_consumer", {"load_timeout": 10}, engine_id="D5")
    t = tokens(1200, 5)
    call(p, "submit", "r5", t, 1, dict(P_D))
    kv = run(p, ["r5"], freed=False)["r5"]["kv_transfer_params"]
    call(d, "submit", "r5", t, 3, kv)
    # D matched P's blocks and scheduled the load; P dies before a byte
    # of it lands.
    d.send("run_paused", ["r5"], "r5", {"timeout": 60.0})
    assert d.recv(60.0) == ("paused", "r5")
    p.kill()
    time.sleep(0.3)
    d.send("go")
    t0 = time.monotonic()
    rd = d.recv(90.0)["r5"]
    assert time.monotonic() - t0 < 30  # never a hang
    # The load's blocks came back as load errors; vLLM recomputed them.
    assert rd["load_errors"], rd
    assert rd["computed"] >= 1200 and rd["mismatched"] == 0
    assert rd["output"] == vr.expected_output(t, 3)
    assert call(d, "info")["stats"]["load_failures"] == 1
    stop(d)
    # An unreachable P (dead before this D ever reached it): the handoff
    # is not matched, the prompt computed here, within the load timeout;
    # a second request naming the same P does not try it again (each try
    # can stall the scheduler up to rpc_timeout).
    d = start(spawn, "kv_consumer", {"load_timeout": 10}, engine_id="D5b")
    call(d, "submit", "r5", t, 3, kv)
    call(d, "submit", "r5b", t, 2, kv)
    t0 = time.monotonic()
    res = run(d, ["r5", "r5b"], timeout=60.0)
    assert time.monotonic() - t0 < 30  # never a hang
    for vid, n in (("r5", 3), ("r5b", 2)):
        assert res[vid]["computed"] >= 1200, res[vid]
        assert res[vid]["mismatched"] == 0
        assert res[vid]["output"] == vr.expected_output(t, n)
    di = call(d, "info")
    assert di["free_blocks"] == 64
    assert di["stats"]["peers_unreachable"] == 1, di["stats"]
    stop(d)


def test_holder_killed_mid_push(spawn):
    p = start(spawn, "kv_producer", {}, engine_id="P6", layer_time=0.05)
    pi = p.info
    d = start(spawn, "kv_consumer", {"load_timeout": 10}, engine_id="D6")
    t = tokens(1200, 6)
    push = {"do_remote_prefill": True,
            "pdx_push": {"agent": pi["agent"], "req": "k6",
                         "side_channel": pi["side_channel"]}}
    call(d, "submit", "r6", t, 3, push)
    call(d, "steps", 1)  # D asked P for a push
    call(p, "submit", "r6", t, 1, dict(P_D, pdx_push_key="k6"))
    call(p, "steps", 1)  # one chunk computed and pushed; then P dies
    p.kill()
    rd = run(d, ["r6"], timeout=60.0)["r6"]
    assert rd["load_errors"] and rd["computed"] >= 1200
    assert rd["mismatched"] == 0 and rd["output"] == \
        vr.expected_output(t, 3)
    stop(d)


def test_layerwise_push_in_order(spawn):
    # P takes 30 ms a layer; D computes each layer as soon as P's push of
    # it landed (its forward waits layer by layer).
    p = start(spawn, "kv_producer", OFFLOAD, engine_id="P7",
              layer_time=0.03)
    pi = p.info
    d = start(spawn, "kv_consumer", {"load_mode": "layerwise"},
              engine_id="D7")
    t = tokens(1200, 7)
    push = {"do_remote_prefill": True,
            "pdx_push": {"agent": pi["agent"], "req": "k7",
                         "side_channel": pi["side_channel"]}}
    call(p, "submit", "r7", t, 1, dict(P_D, pdx_push_key="k7"))
    call(d, "submit", "r7", t, 4, push)
    d.send("run", ["r7"], {"timeout": 60.0, "freed": True})
    p.send("run", ["r7"], {"timeout": 60.0, "freed": True})
    rd, rp = d.recv(90.0)["r7"], p.recv(90.0)["r7"]
    assert rd["mismatched"] == 0 and rd["digest"] == rp["digest"]
    assert rd["computed"] == 4 and rd["output"] == vr.expected_output(t, 4)
    wait = call(d, "timing", "r7")["wait"]
    saved = call(p, "timing", "r7")["saved"]
    layers = sorted(wait)
    # In order, and each layer in before P had computed the last one.
    assert [wait[x] for x in layers] == sorted(wait[x] for x in layers)
    for x in layers[:-1]:
        assert wait[x] < saved[layers[-1]], (x, wait, saved)
    pi = call(p, "info")
    assert pi["stats"]["freed_done"] == 1 and pi["held"] == 0
    assert call(d, "info")["stats"]["pushes_asked"] == 1
    stop(p)
    stop(d)


def test_preemption_abort_lease(spawn):
    # 20 blocks for two 700-token requests: the second is preempted when
    # it grows, and resumes from the blocks it saved (offload hit).
    p = start(spawn, "kv_producer",
              dict(OFFLOAD, remote={"lease_ms": 1500, "heartbeat_ms": 500}),
              engine_id="P8", num_blocks=20)
    a, b = tokens(700, 8), tokens(700, 9)
    call(p, "submit", "a", a, 16)
    call(p, "submit", "b", b, 4)
    res = run(p, ["a", "b"], timeout=90.0)
    assert res["b"]["preemptions"] >= 1
    assert res["a"]["output"] == vr.expected_output(a, 16)
    assert res["b"]["output"] == vr.expected_output(b, 4)
    assert res["b"]["mismatched"] == 0
    assert res["b"]["computed"] < 700 + 4 + 324  # resumed from its saves
    # Abort mid-prefill: no handoff, blocks freed, nothing held.
    call(p, "submit", "c", tokens(1100, 10), 1, dict(P_D))
    call(p, "steps", 1)
    call(p, "abort", "c")
    assert run(p, ["c"])["c"]["status"] == "FINISHED_ABORTED"
    # Lease expiry: a handoff nobody reads is freed by its lease.
    call(p, "submit", "e", tokens(300, 11), 1, dict(P_D))
    run(p, ["e"], freed=False)
    t0 = time.monotonic()
    assert run(p, ["e"], timeout=20.0)["e"]["freed"]
    assert 1.0 < time.monotonic() - t0 < 10.0
    pi = call(p, "info")
    assert pi["stats"]["freed_expired"] == 1 and pi["held"] == 0
    assert pi["free_blocks"] == 20
    # D aborts a load on its way (a push P has not started): stopped, its
    # blocks returned only once the load is over.
    d = start(spawn, "kv_consumer", {}, engine_id="D8")
    push = {"do_remote_prefill": True,
            "pdx_push": {"agent": pi["agent"], "req": "k9",
                         "side_channel": p.info["side_channel"]}}
    call(d, "submit", "f", tokens(600, 12), 4, push)
    call(d, "steps", 2)
    call(d, "abort", "f")
    rf = run(d, ["f"], timeout=30.0)["f"]
    assert rf["status"] == "FINISHED_ABORTED" and rf["freed"]
    assert call(d, "info")["free_blocks"] == 64
    stop(d)
    stop(p)


def test_d_abort_frees_p(spawn):
    # D aborts two requests whose blocks P holds for it: one still waiting
    # (never loaded: P is told to free at once), one whose load was
    # scheduled (stopped; P freed on D's done or reject, whichever came
    # first). P holds nothing afterwards, long before any lease ends.
    p = start(spawn, "kv_producer", {"remote": {"lease_ms": 120000}},
              engine_id="P9")
    d = start(spawn, "kv_consumer", {}, engine_id="D9")
    ta, tb = tokens(1200, 13), tokens(700, 14)
    call(p, "submit", "a", ta, 1, dict(P_D))
    call(p, "submit", "b", tb, 1, dict(P_D))
    rp = run(p, ["a", "b"], freed=False)
    assert call(p, "info")["held"] == 2
    call(d, "submit", "a", ta, 4, rp["a"]["kv_transfer_params"])
    call(d, "submit", "b", tb, 4, rp["b"]["kv_transfer_params"])
    call(d, "abort", "b")
    call(d, "steps", 1)  # a's load scheduled and started
    call(d, "abort", "a")
    rd = run(d, ["a", "b"], timeout=30.0)
    assert rd["a"]["status"] == rd["b"]["status"] == "FINISHED_ABORTED"
    assert rd["a"]["freed"] and rd["b"]["freed"]
    assert call(d, "info")["free_blocks"] == 64
    t0 = time.monotonic()
    assert all(r["freed"] for r in run(p, ["a", "b"], timeout=30.0).values())
    assert time.monotonic() - t0 < 60  # not the 120 s lease
    st = call(p, "info")
    assert st["held"] == 0 and st["free_blocks"] == 64, st
    assert st["stats"]["freed_reject"] >= 1, st["stats"]
    assert st["stats"]["freed_reject"] + st["stats"]["freed_done"] == 2
    assert st["stats"]["freed_expired"] == 0
    # Nothing left for vLLM to keep stepping for, on either side.
    assert call(p, "pending") is False and call(d, "pending") is False
    stop(d)
    stop(p)


def test_without_vllm_and_shipped_configs():
    """pdx.vllm imports without vLLM (this process has none) and its class
    says why it cannot run; the shipped configs load into pdx configs."""
    import glob
    import json
    import os
    from types import SimpleNamespace as NS

    import pdx
    import pdx.vllm
    from pdx.vllm import _settings
    assert not pdx.vllm.VLLM_AVAILABLE
    with pytest.raises(ImportError, match="needs vLLM"):
        pdx.vllm.PdxConnector(None, None)
    root = os.path.join(os.path.dirname(__file__), "..", "..", "configs",
                        "vllm")
    files = sorted(glob.glob(os.path.join(root, "*.json")))
    assert len(files) == 3
    for f in files:
        with open(f) as fh:
            ktc = json.load(fh)
        cfg = NS(cache_config=NS(block_size=64, cache_dtype="fp8",
                                 prefix_caching_hash_algo="sha256_cbor"),
                 model_config=NS(model="zai-org/GLM-5.2-FP8",
                                 hf_config=NS(num_hidden_layers=78)),
                 parallel_config=NS(data_parallel_rank=3,
                                    data_parallel_size=8,
                                    tensor_parallel_size=1),
                 kv_transfer_config=NS(**ktc, engine_id="e0"))
        s = _settings.settings(cfg, environ={"PYTHONHASHSEED": "0"})
        doc = _settings.pdx_config(s, 54728, 8192, pdx.VRAM, 3)
        if "backends" not in ktc["kv_connector_extra_config"]:
            doc["backends"] = [{"name": "ucx"}]
        c = pdx.KVConfig.parse(json.dumps(doc), name=f)
        assert c.block_tokens == 64 and c.dp_rank == 3, f
        assert c.agent_name.endswith("-dp3"), c.agent_name
    with pytest.raises(ValueError, match="did you mean 'offload'"):
        _settings.settings(NS(**dict(vars(cfg), kv_transfer_config=NS(
            kv_role="kv_both", engine_id="e",
            kv_connector_extra_config={"ofload": {}}))),
            environ={"PYTHONHASHSEED": "0"})
