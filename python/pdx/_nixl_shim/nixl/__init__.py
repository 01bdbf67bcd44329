"""A 'nixl' package backed by pdx (pdx.nixl): put this directory's parent
first on PYTHONPATH (or install pdx's 'nixl' distribution,
python/nixl_dist) and a stack written for NIXL runs on pdx unchanged.
Submodules as NIXL's: _api, _bindings, _utils, logging."""
from pdx.nixl import (  # noqa: F401
    DEFAULT_COMM_PORT, nixl_agent, nixl_agent_config, nixl_backend_handle,
    nixl_prepped_dlist_handle, nixl_thread_sync_t, nixl_xfer_handle,
)
from . import _api, _bindings  # noqa: F401

__all__ = [
    "DEFAULT_COMM_PORT", "nixl_agent", "nixl_agent_config",
    "nixl_backend_handle", "nixl_prepped_dlist_handle",
    "nixl_thread_sync_t", "nixl_xfer_handle",
]
