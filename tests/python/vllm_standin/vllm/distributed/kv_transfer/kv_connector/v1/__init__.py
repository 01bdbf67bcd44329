"""TEST STAND-IN for vLLM (see tests/python/vllm_standin/README.md)."""
from .base import (  # noqa: F401
    KVConnectorBase_V1, KVConnectorRole, SupportsHMA)
