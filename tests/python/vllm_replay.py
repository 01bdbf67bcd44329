"""The replay: one vLLM engine rank, driven the way vLLM's scheduler
(vllm/v1/core/sched/scheduler.py) and model runner
(vllm/v1/worker/kv_connector_model_runner_mixin.py) drive a KV connector,
at vLLM commit 003df2961dd8830c317a61f9745ccd557da9fa06: the same calls,
in the same order, with the same arguments, on vLLM's types
(tests/python/vllm_standin: the test's stand-in of them). Our own code,
written from reading vLLM's; none of it is vLLM's. The model is
vllm_replay_model.py's fake."""
import collections
import hashlib
import os
import time
from types import SimpleNamespace

import numpy as np
import torch

from vllm.config import (CacheConfig, KVTransferConfig, ModelConfig,
                         ParallelConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorRole, supports_hma)
from vllm.distributed.kv_transfer.kv_connector.v1 import metrics as vm
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.sched.output import (CachedRequestData, NewRequestData,
                                       SchedulerOutput)
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus

from vllm_replay_model import (BLOCK, NUM_LAYERS, caches_spec, kv_rows,
                               next_token, token_keys)


def vllm_block_hashes(seed, tokens, algo, block=BLOCK):
    """vLLM's request.block_hashes (sha256_cbor), computed as vLLM does in
    kv_cache_utils, in plain Python (the test_connector.py recipe); empty
    for other algorithms (vLLM's own xxhash needs a module not here)."""
    if algo != "sha256_cbor":
        return []
    from test_connector import vllm_sha256_cbor
    return vllm_sha256_cbor(seed, tokens, block)


class Recorder:
    """The connector, every call counted: the replay's proof of which of
    vLLM's calls it made."""

    def __init__(self, obj, calls):
        self._obj, self._calls = obj, calls

    def __getattr__(self, name):
        v = getattr(self._obj, name)
        self._calls[name] += 1
        return v


class MiniEngine:
    """One engine rank: a scheduler stand-in, a model runner stand-in and
    a worker, in one process (vLLM's uni executor)."""

    def __init__(self, role, extra, seed, algo="sha256_cbor", num_blocks=64,
                 budget=512, max_running=8, layer_time=0.0,
                 engine_id="engine0", policy="recompute",
                 kv_dtype="fp8_ds_mla", block_size=BLOCK, hma=True):
        from pdx.vllm import PdxConnector
        os.environ["PYTHONHASHSEED"] = seed
        self.seed, self.algo = seed, algo
        self.B = block_size
        self.hma = hma  # False: vLLM with the hybrid allocator disabled
        self.budget, self.max_running = budget, max_running
        self.layer_time = layer_time
        self.policy = policy
        self.cfg = VllmConfig(
            cache_config=CacheConfig(block_size, kv_dtype, algo,
                                     num_gpu_blocks=num_blocks),
            model_config=ModelConfig(hf_config=SimpleNamespace(
                num_hidden_layers=NUM_LAYERS)),
            parallel_config=ParallelConfig(),
            kv_transfer_config=KVTransferConfig(
                kv_role=role, engine_id=engine_id,
                kv_connector_extra_config=dict(extra),
                kv_load_failure_policy=policy))
        self.spec = caches_spec()
        self.kv = {name: torch.zeros((num_blocks, block_size, bpt),
                                     dtype=torch.uint8)
                   for name, _, bpt in self.spec}
        self.np = {name: t.numpy() for name, t in self.kv.items()}
        self.calls = collections.Counter()
        kvcc = SimpleNamespace(num_blocks=num_blocks, kv_cache_groups=[0])
        # vLLM's order: the worker (its caches registered), then the
        # scheduler, then the handshake from the workers to it.
        self.worker = Recorder(PdxConnector(self.cfg, KVConnectorRole.WORKER,
                                            kvcc), self.calls)
        self.worker.register_kv_caches(self.kv)
        self.sched = Recorder(PdxConnector(
            self.cfg, KVConnectorRole.SCHEDULER, kvcc), self.calls)
        self.sched.set_xfer_handshake_metadata(
            {0: self.worker.get_handshake_metadata()})
        self.sched.bind_gpu_block_pool(self)
        self._surface_once()
        self.free = collections.deque(range(num_blocks))
        self.blocks = {}
        self.requests = {}
        self.waiting = collections.deque()
        self.running = []
        self.finished_req_ids = set()
        self.preempted = set()
        self.finished_recving = set()
        self.failed_recving = set()
        self.results = {}
        self.layer_wait_done = {}  # vid -> {layer: monotonic time}
        self.layer_saved = {}      # layer -> monotonic time of last save
        self.load_errors = collections.defaultdict(set)
        self.computed = collections.Counter()  # tokens the model computed
        self.preemptions = 0
        self.pause_before_load = None

    def _surface_once(self):
        """The calls vLLM makes once per engine."""
        s, w = self.sched, self.worker
        assert supports_hma(s._obj)
        s.get_finished_count()
        s.prefer_cross_layer_blocks
        s.requires_kv_delivery
        type(s._obj).requires_piecewise_for_cudagraph(
            self.cfg.kv_transfer_config.kv_connector_extra_config)
        type(s._obj).get_required_kvcache_layout(self.cfg)
        stats_cls = type(s._obj).build_kv_connector_stats({"loads": 1})
        assert stats_cls is not None and not stats_cls.is_empty()
        prom = type(s._obj).build_prom_metrics(
            self.cfg, {vm.Gauge: vm.TestCounter, vm.Counter: vm.TestCounter,
                       vm.Histogram: vm.TestCounter}, ["engine"], {0: ["0"]})
        prom.observe({"loads": 1}, 0)
        self.calls.update(["get_finished_count", "build_kv_connector_stats",
                           "build_prom_metrics",
                           "requires_piecewise_for_cudagraph",
                           "get_required_kvcache_layout"])
        w.get_kv_connector_stats()

    def info(self):
        e = self.worker._obj._worker.engine
        return {"agent": e.name, "side_channel": e.side.addr,
                "free_blocks": len(self.free), "held": e.conn.held_requests(),
                "stats": dict(e.totals),
                "offload": e.conn.offload_stats() if e.offload else None,
                "config": e.config_json}

    # -------------------------------------------------------- scheduler
    def add(self, vid, tokens, max_tokens, params=None):
        req = Request(vid, tokens, max_tokens, params,
                      vllm_block_hashes(self.seed, tokens, self.algo,
                                        self.B))
        self.requests[vid] = req
        self.waiting.append(req)
        self.sched.on_new_request(req)

    def _alloc(self, vid, ntok):
        have = self.blocks.setdefault(vid, [])
        need = -(-ntok // self.B) - len(have)
        if need > len(self.free):
            return None
        new = [self.free.popleft() for _ in range(max(need, 0))]
        have.extend(new)
        return new

    def _free_blocks(self, vid):
        for b in self.blocks.pop(vid, ()):
            self.free.append(b)

    def _preempt(self, req):
        self._free_blocks(req.request_id)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(req)
        self.preempted.add(req.request_id)

    def schedule(self):
        budget = self.budget
        new, cached = [], CachedRequestData()
        nsched, ranges = {}, {}
        preempted = set()
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if n <= 0:
                i += 1
                continue
            newb = self._alloc(req.request_id, req.num_computed_tokens + n)
            while newb is None:
                victim = self.running.pop()
                self._preempt(victim)
                preempted.add(victim.request_id)
                if victim is req:
                    break
                newb = self._alloc(req.request_id,
                                   req.num_computed_tokens + n)
            if newb is None:
                break
            cached.req_ids.append(req.request_id)
            cached.new_block_ids.append((newb,))
            cached.num_computed_tokens.append(req.num_computed_tokens)
            nsched[req.request_id] = n
            ranges[req.request_id] = (req.num_computed_tokens,
                                      req.num_computed_tokens + n)
            budget -= n
            i += 1
        skipped = []
        while self.waiting and budget > 0 and not preempted and \
                len(self.running) < self.max_running:
            req = self.waiting[0]
            vid = req.request_id
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                if vid not in self.finished_recving:
                    skipped.append(self.waiting.popleft())
                    continue
                self._update_waiting_for_remote_kv(req)
                req.status = RequestStatus.PREEMPTED if req.num_preemptions \
                    else RequestStatus.WAITING
            ext, load_async = 0, False
            if req.num_computed_tokens == 0:
                ext, load_async = self.sched.get_num_new_matched_tokens(req,
                                                                        0)
                if ext is None:
                    skipped.append(self.waiting.popleft())
                    continue
                computed = ext
            else:
                computed = req.num_computed_tokens
            n = 0 if load_async else min(req.num_tokens - computed, budget)
            assert load_async or n > 0
            newb = self._alloc(vid, computed + n)
            if newb is None:
                break
            self.sched.update_state_after_alloc(
                req, KVCacheBlocks(self.blocks[vid]), ext)
            self.waiting.popleft()
            if load_async:
                req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                req.num_computed_tokens = computed
                skipped.append(req)
                continue
            self.running.append(req)
            if req.status == RequestStatus.PREEMPTED:
                cached.req_ids.append(vid)
                cached.resumed_req_ids.add(vid)
                cached.new_block_ids.append((list(self.blocks[vid]),))
                cached.num_computed_tokens.append(computed)
            else:
                new.append(NewRequestData(vid, req.prompt_token_ids,
                                          (list(self.blocks[vid]),),
                                          computed))
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = computed
            nsched[vid] = n
            ranges[vid] = (computed, computed + n)
            budget -= n
        for r in reversed(skipped):
            self.waiting.appendleft(r)
        so = SchedulerOutput(new, cached, nsched, sum(nsched.values()),
                             self.finished_req_ids,
                             self.preempted | preempted)
        so.kv_connector_metadata = self.sched.build_connector_meta(so)
        for vid, n in nsched.items():
            self.requests[vid].num_computed_tokens += n
        self.finished_req_ids = set()
        self.preempted = set()
        return so, ranges

    def _update_waiting_for_remote_kv(self, req):
        vid = req.request_id
        if vid in self.failed_recving:
            self.failed_recving.discard(vid)
            if not req.num_computed_tokens:
                self._free_blocks(vid)
        elif req.num_computed_tokens == req.num_tokens:
            req.num_computed_tokens = req.num_tokens - 1
        self.finished_recving.discard(vid)

    # ------------------------------------------------------ model runner
    def execute(self, so, ranges):
        w = self.worker
        meta = so.kv_connector_metadata
        if so.preempted_req_ids:
            w.handle_preemptions(meta)
        w.bind_connector_metadata(meta)
        if self.pause_before_load is not None:
            self.pause_before_load(meta)
        w.start_load_kv(SimpleNamespace(no_compile_layers={}))
        layers = collections.OrderedDict()
        for ci, (name, layer, bpt) in enumerate(self.spec):
            layers.setdefault(layer, []).append((ci, name, bpt))
        keys = {vid: token_keys(self.requests[vid].all_token_ids[:end])
                for vid, (_, end) in ranges.items()}
        for layer, caches in layers.items():
            for _, name, _ in caches:
                w.wait_for_layer_load(name)
            now = time.monotonic()
            for vid in ranges:
                self.layer_wait_done.setdefault(vid, {}).setdefault(layer,
                                                                    now)
            for ci, name, bpt in caches:
                for vid, (start, end) in ranges.items():
                    self._compute(vid, name, ci, bpt, keys[vid], start, end)
            if self.layer_time:
                time.sleep(self.layer_time)
            for _, name, _ in caches:
                w.save_kv_layer(name, self.kv[name], None)
            self.layer_saved[layer] = time.monotonic()
        w.wait_for_save()
        sending, recving = w.get_finished(so.finished_req_ids)
        out = KVConnectorOutput(
            finished_sending=sending, finished_recving=recving,
            invalid_block_ids=w.get_block_ids_with_load_errors(),
            kv_connector_stats=w.get_kv_connector_stats(),
            kv_cache_events=w.get_kv_connector_kv_cache_events(),
            kv_connector_worker_meta=w.build_connector_worker_meta())
        w.clear_connector_metadata()
        sampled = {}
        for vid, (start, end) in ranges.items():
            self.computed[vid] += end - start
            req = self.requests[vid]
            if end >= req.num_tokens:
                sampled[vid] = next_token(self.digest(vid, end))
        return sampled, out

    def _compute(self, vid, name, ci, bpt, keys, start, end):
        if end <= start:
            return
        rows = kv_rows(keys[start:end], ci, bpt)
        ids = self.blocks[vid]
        arr = self.np[name]
        for t in range(start, end):
            arr[ids[t // self.B], t % self.B, :] = rows[t - start]

    def kv_bytes(self, vid, ntok):
        """The request's KV of tokens [0, ntok), cache by cache."""
        ids = self.blocks[vid]
        parts = []
        for name, _, _ in self.spec:
            arr = self.np[name]
            rows = [arr[ids[b], :min(self.B, ntok - b * self.B), :]
                    for b in range(-(-ntok // self.B))]
            parts.append(np.concatenate(rows).tobytes())
        return parts

    def digest(self, vid, ntok):
        h = hashlib.sha256()
        for p in self.kv_bytes(vid, ntok):
            h.update(p)
        return h.digest()

    def mismatched_bytes(self, vid, ntok):
        """Bytes of the request's KV [0, ntok) that differ from the fake
        model's: 0 when every loaded byte is exact."""
        keys = token_keys(self.requests[vid].all_token_ids[:ntok])
        bad = 0
        for ci, ((name, _, bpt), got) in enumerate(
                zip(self.spec, self.kv_bytes(vid, ntok))):
            want = kv_rows(keys, ci, bpt).tobytes()
            bad += sum(a != b for a, b in zip(got, want)) if got != want \
                else 0
        return bad

    # --------------------------------------------------------- scheduler
    def update_from_output(self, so, sampled, out):
        failed = set()
        if out.invalid_block_ids:
            failed = self._handle_invalid_blocks(out.invalid_block_ids,
                                                 so.num_scheduled_tokens)
        for vid in so.num_scheduled_tokens:
            req = self.requests.get(vid)
            if vid in failed or req is None or req.is_finished():
                continue
            tok = sampled.get(vid)
            if tok is None:
                continue
            req.append_output_token_ids(tok)
            if req.num_output_tokens >= req.max_tokens:
                req.status = RequestStatus.FINISHED_LENGTH_CAPPED
                self.running.remove(req)
                self._finish(req)
        if failed and self.policy == "fail":
            for vid in failed:
                self.abort(vid, RequestStatus.FINISHED_ERROR)
        self._update_from_kv_xfer_finished(out)
        s = self.sched
        s.get_kv_connector_stats()
        list(s.take_events())
        s.has_pending_push_work()

    def _finish(self, req, delay=False):
        vid = req.request_id
        nb = -(-req.num_computed_tokens // self.B)
        ids = list(self.blocks.get(vid, ()))[:nb]
        # SupportsHMA: request_finished_all_groups, one list per group;
        # with the hybrid allocator disabled vLLM calls request_finished.
        if self.hma:
            cdelay, params = self.sched.request_finished_all_groups(
                req, (ids,))
        else:
            cdelay, params = self.sched.request_finished(req, ids)
        self.finished_req_ids.add(vid)
        n = req.num_prompt_tokens
        res = self.results[vid] = {
            "status": req.status.name, "output": list(req.output_token_ids),
            "kv_transfer_params": params,
            "computed": self.computed[vid],
            "preemptions": req.num_preemptions,
            "load_errors": sorted(self.load_errors.get(vid, ())),
            "freed": False, "t_finish": time.monotonic()}
        if vid in self.blocks and req.num_computed_tokens >= n - 1 and n > 1:
            res["digest"] = self.digest(vid, n - 1).hex()
            res["mismatched"] = self.mismatched_bytes(vid, n - 1)
        if not (delay or cdelay):
            self._release(vid)

    def _release(self, vid):
        self._free_blocks(vid)
        self.requests.pop(vid, None)
        if vid in self.results:
            self.results[vid]["freed"] = True

    def _update_from_kv_xfer_finished(self, out):
        self.sched.update_connector_output(out)
        for vid in out.finished_recving or ():
            req = self.requests[vid]
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished_recving.add(vid)
            else:
                assert req.is_finished(), (vid, req.status)
                self._release(vid)
        for vid in out.finished_sending or ():
            assert vid in self.requests, vid
            self._release(vid)

    def _handle_invalid_blocks(self, invalid, nsched):
        sync_failed = set()
        for req in list(self.waiting) + list(self.running):
            vid = req.request_id
            is_async = req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
            computed = req.num_computed_tokens - nsched.get(vid, 0)
            ids = self.blocks.get(vid, [])
            for idx, bid in enumerate(ids[:-(-computed // self.B)]):
                if bid in invalid:
                    req.num_computed_tokens = idx * self.B
                    self.load_errors[vid].update(
                        b for b in ids if b in invalid)
                    if is_async:
                        self.failed_recving.add(vid)
                    else:
                        sync_failed.add(vid)
                    break
        return sync_failed

    def abort(self, vid, status=RequestStatus.FINISHED_ABORTED):
        req = self.requests.get(vid)
        if req is None or req.is_finished():
            return
        delay = False
        if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            delay = vid not in self.finished_recving
            self.finished_recving.discard(vid)
            self.failed_recving.discard(vid)
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        req.status = status
        self._finish(req, delay)

    # -------------------------------------------------------------- loop
    def step(self):
        so, ranges = self.schedule()
        sampled, out = self.execute(so, ranges)
        self.update_from_output(so, sampled, out)
        return bool(ranges)

    def run(self, until, timeout=60.0, freed=True):
        """Step until every request of `until` finished (and, with
        `freed`, had its blocks freed), as an engine keeps stepping while
        it has requests; bounded by `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            done = all(v in self.results and
                       (self.results[v]["freed"] or not freed)
                       for v in until)
            if done:
                return {v: self.results[v] for v in until}
            # vLLM's engine goes idle when its scheduler has no requests
            # (Scheduler.has_requests): nothing running or waiting, none
            # just finished, no pending connector work. Idle, it would
            # never call get_finished again.
            assert self.running or self.waiting or self.finished_req_ids \
                or self.sched.has_pending_push_work(), \
                "replay: the engine would go idle with %s not done" % (
                    [v for v in until if v not in self.results or
                     not self.results[v]["freed"]],)
            if time.monotonic() > deadline:
                raise TimeoutError("replay: %s not done in %.0f s: %s"
                                   % (until, timeout, {
                                       v: self.results.get(v) or
                                       (self.requests[v].status.name
                                        if v in self.requests else "?")
                                       for v in until}))
            if not self.step():
                time.sleep(0.001)

    def evict(self):
        """The GPU cache forgets everything (vLLM's prefix cache evicted):
        only the offload tier still has the blocks."""
        for a in self.np.values():
            a[...] = 0

    def shutdown(self):
        self.sched.reset_cache()
        self.sched.shutdown()
        self.worker.shutdown()
        return dict(self.calls)
