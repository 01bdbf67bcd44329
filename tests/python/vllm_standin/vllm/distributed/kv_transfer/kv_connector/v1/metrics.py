"""TEST STAND-IN for vLLM (tests/python/vllm_standin/README.md): the
connector stats container and the Prometheus registration base, as vLLM
shapes them (KVConnectorStats.data; KVConnectorPromMetrics(vllm_config,
metric_types, labelnames, per_engine_labelvalues) with _counter_cls).
The metric types are the test's own counters, not prometheus_client."""
from dataclasses import dataclass, field


@dataclass
class KVConnectorStats:
    data: dict = field(default_factory=dict)

    def reset(self):
        raise NotImplementedError

    def aggregate(self, other):
        raise NotImplementedError

    def reduce(self):
        raise NotImplementedError

    def is_empty(self):
        raise NotImplementedError


class Gauge:
    pass


class Counter:
    pass


class Histogram:
    pass


class TestCounter:
    """A counter with prometheus_client's labels()/inc() calls."""
    registry = {}

    def __init__(self, name, documentation, labelnames):
        self.name, self.doc, self.labelnames = name, documentation, labelnames
        self.values = {}
        TestCounter.registry[name] = self

    def labels(self, *values):
        counter = self

        class _Child:
            def inc(self, v=1):
                counter.values[values] = counter.values.get(values, 0) + v
        return _Child()


class KVConnectorPromMetrics:
    def __init__(self, vllm_config, metric_types, labelnames,
                 per_engine_labelvalues):
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._gauge_cls = metric_types[Gauge]
        self._counter_cls = metric_types[Counter]
        self._histogram_cls = metric_types[Histogram]
        self._labelnames = labelnames
        self.per_engine_labelvalues = per_engine_labelvalues

    def observe(self, transfer_stats_data, engine_idx=0):
        raise NotImplementedError
