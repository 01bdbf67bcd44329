"""'nixl' backed by pdx (pdx.nixl): a stack written for NIXL imports it and
runs on pdx unchanged. Submodules as NIXL's: _api, _bindings, _utils,
logging.

This folder is the one source of pdx's 'nixl' modules. The 'nixl'
distribution (`pip install ./python ./python/nixl_dist`) installs them
under their own names; a build tree and the pdx wheel also carry a copy in
pdx/_nixl_shim (pdx.nixl.SHIM_PATH, pdx.nixl.install())."""
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
