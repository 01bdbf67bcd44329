"""pdx.vllm.PdxConnector: vLLM's KVConnectorBase_V1 (and SupportsHMA) over
pdx's C connector. Imported only where vLLM is: pdx/vllm/__init__.py
falls back to a class that explains, without it.

vLLM loads it with
  --kv-transfer-config '{"kv_connector": "PdxConnector",
                         "kv_connector_module_path": "pdx.vllm",
                         "kv_role": "kv_producer" | "kv_consumer" | "kv_both",
                         "kv_connector_extra_config": {...}}'
(docs/VLLM.md lists the extra config). One object per role: vLLM makes a
SCHEDULER one in the engine core and a WORKER one in the worker; both
calls below are vLLM's, the work is _scheduler.py's and _worker.py's."""
import dataclasses
import logging
import os
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1 import base as _base

from . import _settings
from ._scheduler import SchedulerSide
from ._worker import WorkerSide

log = logging.getLogger("vllm.distributed.kv_transfer.pdx")

try:  # the stats and Prometheus hooks, where this vLLM has them
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics as _PromBase, KVConnectorStats as _StatsBase)
except Exception:  # noqa: BLE001 - a vLLM without them
    _PromBase, _StatsBase = None, None

_TransferResults = getattr(_base, "KVConnectorTransferResults", None)


class PdxConnectorMetadata(_base.KVConnectorMetadata):
    """One step's work for the worker side (plain data: a dict)."""

    def __init__(self, step):
        self.step = step


@dataclasses.dataclass
class PdxHandshakeMetadata(_base.KVConnectorHandshakeMetadata):
    """What the worker side tells the scheduler side at start: its agent,
    its side channel, and its process (the scheduler side must be in the
    same one)."""
    agent: str = ""
    side_channel: str = ""
    pid: int = 0


if _StatsBase is not None:
    @dataclasses.dataclass
    class PdxKVConnectorStats(_StatsBase):
        """Counts since the last report: loads, their failures, tokens
        loaded, pushes asked, layer saves, peers refused; the offload
        pool's hits, misses and saves."""

        def reset(self):
            self.data = {}

        def aggregate(self, other):
            for k, v in (other.data or {}).items():
                self.data[k] = self.data.get(k, 0) + v
            return self

        def reduce(self):
            return dict(self.data)

        def is_empty(self):
            return not any(self.data.values())
else:
    PdxKVConnectorStats = None

_PROM_KEYS = ("loads", "load_failures", "tokens_loaded", "pushes_asked",
              "layer_saves", "saves", "peers_refused", "peers_unreachable",
              "freed_done", "freed_reject", "freed_expired",
              "freed_peer_gone",
              "offload_hits", "offload_misses", "offload_saves")

if _PromBase is not None:
    class PdxPromMetrics(_PromBase):
        """vllm:pdx_<count>_total counters, one per engine."""

        def __init__(self, vllm_config, metric_types, labelnames,
                     per_engine_labelvalues):
            super().__init__(vllm_config, metric_types, labelnames,
                             per_engine_labelvalues)
            self._counters = {}
            for k in _PROM_KEYS:
                c = self._counter_cls(
                    name="vllm:pdx_%s" % k,
                    documentation="pdx connector: %s" % k.replace("_", " "),
                    labelnames=labelnames)
                self._counters[k] = {
                    idx: c.labels(*vals)
                    for idx, vals in per_engine_labelvalues.items()}

        def observe(self, transfer_stats_data, engine_idx=0):
            for k, v in (transfer_stats_data or {}).items():
                per = self._counters.get(k)
                if per and v and engine_idx in per:
                    per[engine_idx].inc(v)
else:
    PdxPromMetrics = None


def _supports_hma():
    return getattr(_base, "SupportsHMA", None)


_Bases = tuple(b for b in (_base.KVConnectorBase_V1, _supports_hma())
               if b is not None)


class PdxConnector(*_Bases):
    """vLLM's KV connector over pdx: offload tier, P/D handoff with leases
    and partial tails, D-to-P reuse, layer-wise push and load, and the
    invariants (hash algorithm and seed, block size, cache dtype, KV
    layout) checked against vLLM's settings and every peer."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        except TypeError:  # a vLLM whose base takes (vllm_config, role)
            super().__init__(vllm_config, role)
        self._s = _settings.settings(vllm_config)
        self._num_blocks = getattr(kv_cache_config, "num_blocks", None) or \
            getattr(vllm_config.cache_config, "num_gpu_blocks", None)
        is_worker = getattr(role, "name", str(role)).upper().endswith(
            "WORKER")
        self._sched = None if is_worker else SchedulerSide(self._s)
        self._worker = WorkerSide(self._s) if is_worker else None
        self._handshake = {}
        log.info("pdx.vllm: PdxConnector (%s) for %s: %s, seed from "
                 "PYTHONHASHSEED, block %d, %s, layout %s",
                 "worker" if is_worker else "scheduler",
                 self._s["model_id"], self._s["hash_algo"],
                 self._s["block_size"], self._s["kv_dtype"],
                 self._s["kv_layout"])

    # ---------------------------------------------------------- scheduler
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self._sched.get_num_new_matched_tokens(request,
                                                      num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._sched.update_state_after_alloc(request, blocks,
                                             num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return PdxConnectorMetadata(
            self._sched.build_connector_meta(scheduler_output))

    def request_finished(self, request, block_ids):
        return self._sched.request_finished(request, block_ids)

    def request_finished_all_groups(self, request, block_ids):
        if len(block_ids) > 1 and any(block_ids[1:]):
            log.warning("pdx.vllm: %s has %d KV cache groups: pdx hands "
                        "off the first", request.request_id, len(block_ids))
        return self._sched.request_finished(request, block_ids)

    def update_connector_output(self, connector_output):
        self._sched.update_connector_output(connector_output)

    def take_events(self):
        return ()

    def get_finished_count(self):
        return None

    def has_pending_push_work(self):
        # True while a finished request's blocks wait for get_finished (a
        # handoff held for D, a push, a save): vLLM keeps stepping.
        return self._sched is not None and self._sched.has_pending_work()

    def set_xfer_handshake_metadata(self, metadata):
        self._handshake = dict(metadata or {})
        for meta in self._handshake.values():
            if getattr(meta, "pid", os.getpid()) != os.getpid():
                raise RuntimeError(
                    "pdx.vllm: the worker side of this engine runs in "
                    "process %d, the scheduler side in %d: PdxConnector "
                    "needs both in one (tensor_parallel_size 1, vLLM's "
                    "uni executor)" % (meta.pid, os.getpid()))

    def reset_cache(self):
        return False  # the offload tier keeps its blocks

    # ------------------------------------------------------------- worker
    def register_kv_caches(self, kv_caches):
        self._worker.register(kv_caches, self._num_blocks)

    def get_handshake_metadata(self):
        e = self._worker.engine if self._worker else None
        if e is None:
            return None
        return PdxHandshakeMetadata(agent=e.name, side_channel=e.side.addr,
                                    pid=os.getpid())

    def handle_preemptions(self, kv_connector_metadata):
        if kv_connector_metadata is not None:
            self._worker.handle_preemptions(kv_connector_metadata.step)

    def start_load_kv(self, forward_context, **kwargs):
        self._worker.start_load_kv(self._get_connector_metadata().step)

    def wait_for_layer_load(self, layer_name):
        self._worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        self._worker.save_kv_layer(layer_name)

    def wait_for_save(self):
        self._worker.wait_for_save()

    def get_finished(self, finished_req_ids):
        return self._worker.get_finished(finished_req_ids)

    def get_transfer_results(self, finished_req_ids=None):
        sending, recving = self._worker.get_finished(finished_req_ids or ())
        failed = self._worker.take_failed()
        if _TransferResults is None:
            return {"finished_sending": sending or set(),
                    "finished_recving": recving or set(),
                    "failed_recving": failed}
        return _TransferResults(finished_sending=sending or set(),
                                finished_recving=recving or set(),
                                failed_recving=failed)

    def get_block_ids_with_load_errors(self):
        return self._worker.get_block_ids_with_load_errors()

    def clear_connector_metadata(self):
        super().clear_connector_metadata()
        if self._worker is not None:
            self._worker.finish_step()

    def shutdown(self):
        if self._worker is not None:
            self._worker.shutdown()

    # -------------------------------------------------------------- stats
    def get_kv_connector_stats(self):
        e = self._worker.engine if self._worker else None
        if e is None or PdxKVConnectorStats is None:
            return None
        data = e.take_stats()
        if e.offload:
            o = e.conn.offload_stats()
            now = {"offload_hits": o["hits"], "offload_misses": o["misses"],
                   "offload_saves": o["saves"]}
            last = getattr(self, "_last_offload", {})
            for k, v in now.items():
                data[k] = v - last.get(k, 0)
            self._last_offload = now
        return PdxKVConnectorStats(data=data)

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        if PdxKVConnectorStats is None:
            return None
        return PdxKVConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames,
                           per_engine_labelvalues):
        if PdxPromMetrics is None:
            return None
        return PdxPromMetrics(vllm_config, metric_types, labelnames,
                              per_engine_labelvalues)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]):
        # wait_for_layer_load / save_kv_layer run Python between layers.
        return bool((extra_config or {}).get("layerwise", True))
