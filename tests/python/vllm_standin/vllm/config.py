"""TEST STAND-IN for vLLM (tests/python/vllm_standin/README.md): the
fields of VllmConfig that PdxConnector reads, with vLLM's names."""
from dataclasses import dataclass, field


@dataclass
class CacheConfig:
    block_size: int = 64
    cache_dtype: str = "auto"
    prefix_caching_hash_algo: str = "sha256_cbor"
    enable_prefix_caching: bool = True
    num_gpu_blocks: int = 0


@dataclass
class ModelConfig:
    model: str = "zai-org/GLM-5.2-FP8"
    dtype: str = "bfloat16"
    hf_config: object = None


@dataclass
class ParallelConfig:
    data_parallel_rank: int = 0
    data_parallel_size: int = 1
    tensor_parallel_size: int = 1


@dataclass
class KVTransferConfig:
    kv_connector: str = "PdxConnector"
    kv_connector_module_path: str = "pdx.vllm"
    kv_role: str = "kv_both"
    engine_id: str = "engine0"
    kv_connector_extra_config: dict = field(default_factory=dict)
    kv_load_failure_policy: str = "recompute"

    @property
    def is_kv_producer(self):
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self):
        return self.kv_role in ("kv_consumer", "kv_both")


@dataclass
class VllmConfig:
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    model_config: ModelConfig = field(default_factory=ModelConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    kv_transfer_config: KVTransferConfig = None
