"""'nixl_cu12' (the name NIXL's CUDA 12 wheel installs; TensorRT-LLM tries
it first) backed by pdx: the same API as 'nixl'; its _api, _bindings,
_utils and logging modules are found in the 'nixl' folder beside it."""
import os as _os

from pdx.nixl import (  # noqa: F401
    DEFAULT_COMM_PORT, nixl_agent, nixl_agent_config, nixl_backend_handle,
    nixl_prepped_dlist_handle, nixl_thread_sync_t, nixl_xfer_handle,
)

__all__ = [
    "DEFAULT_COMM_PORT", "nixl_agent", "nixl_agent_config",
    "nixl_backend_handle", "nixl_prepped_dlist_handle",
    "nixl_thread_sync_t", "nixl_xfer_handle",
]

__path__ = [_os.path.join(_os.path.dirname(_os.path.dirname(
    _os.path.abspath(__file__))), "nixl")]

from . import _api, _bindings  # noqa: F401,E402
