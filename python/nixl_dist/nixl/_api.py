"""nixl._api on pdx: see pdx.nixl."""
from pdx.nixl import *  # noqa: F401,F403
from pdx.nixl import (  # noqa: F401
    nixl_agent, nixl_agent_config, nixl_xfer_handle,
    nixl_prepped_dlist_handle, nixl_backend_handle, DEFAULT_COMM_PORT,
)
