"""A 'nixl' package backed by pdx (pdx.nixl): put this directory's parent
first on PYTHONPATH and a stack written for NIXL runs on pdx unchanged."""
from pdx.nixl import (  # noqa: F401
    nixl_agent, nixl_agent_config, nixl_xfer_handle,
    nixl_prepped_dlist_handle,
)
from . import _api, _bindings  # noqa: F401
