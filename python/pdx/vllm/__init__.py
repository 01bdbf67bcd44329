"""pdx as a vLLM KV connector: ``pdx.vllm.PdxConnector``.

vLLM loads it by name::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "PdxConnector",
        "kv_connector_module_path": "pdx.vllm", "kv_role": "kv_producer",
        "kv_connector_extra_config": {"offload": {"budget_bytes": "256GiB"}}}'

(docs/VLLM.md: roles, the extra config, the GLM-5.2 P/D deployment and its
proxy, ``python -m pdx.vllm.proxy``). The class is built where vLLM is
importable; without vLLM this module still imports, and using the class
raises an ImportError that says why."""
import logging as _logging

try:
    from ._connector import (  # noqa: F401
        PdxConnector, PdxConnectorMetadata, PdxHandshakeMetadata,
        PdxKVConnectorStats, PdxPromMetrics)
    VLLM_AVAILABLE = True
    VLLM_IMPORT_ERROR = None
except ImportError as _e:
    if not str(getattr(_e, "name", "") or "").startswith("vllm") and \
            "vllm" not in str(_e):
        raise
    VLLM_AVAILABLE = False
    VLLM_IMPORT_ERROR = _e

    class PdxConnector:  # noqa: D401 - the stand-in without vLLM
        """Without vLLM: importable, unusable (the error says why)."""

        def __init__(self, *args, **kwargs):
            raise ImportError(
                "pdx.vllm.PdxConnector needs vLLM, which this Python cannot "
                "import (%s): install vLLM in the environment that runs "
                "`vllm serve`, beside pdx" % (VLLM_IMPORT_ERROR,))

    PdxConnectorMetadata = PdxHandshakeMetadata = None
    PdxKVConnectorStats = PdxPromMetrics = None
    _logging.getLogger(__name__).debug("pdx.vllm: vLLM not importable: %s",
                                       _e)

from ._settings import SettingsMismatch  # noqa: E402,F401

__all__ = ["PdxConnector", "PdxConnectorMetadata", "PdxHandshakeMetadata",
           "SettingsMismatch", "VLLM_AVAILABLE"]
