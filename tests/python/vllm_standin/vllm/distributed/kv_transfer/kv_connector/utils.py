"""TEST STAND-IN for vLLM (see tests/python/vllm_standin/README.md): the
KV cache layout query the connector makes."""
_LAYOUT = "NHD"


def get_kv_cache_layout():
    return _LAYOUT


def set_kv_cache_layout(layout):
    global _LAYOUT
    _LAYOUT = layout
