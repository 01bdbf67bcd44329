"""TEST STAND-IN for vLLM (tests/python/vllm_standin/README.md): what the
model runner hands the scheduler about the connector, per step."""
from dataclasses import dataclass, field


@dataclass
class KVConnectorOutput:
    finished_sending: set = None
    finished_recving: set = None
    invalid_block_ids: set = field(default_factory=set)
    kv_connector_stats: object = None
    kv_cache_events: object = None
    kv_connector_worker_meta: object = None
