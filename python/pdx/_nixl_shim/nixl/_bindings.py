"""nixl._bindings on pdx: the names stacks and NIXL's tests import from it
(error classes, list classes, segment and operation constants). The
low-level nixlAgent/nixlAgentConfig binding classes are not provided: use
nixl._api.nixl_agent."""
from pdx.nixl import (  # noqa: F401
    nixlXferTelemetry, NIXL_INIT_AGENT, DEFAULT_COMM_PORT,
    nixlInvalidParamError, nixlNotFoundError, nixlBackendError,
    nixlRemoteDisconnectError, nixlNotSupportedError, nixlNotAllowedError,
    nixlMismatchError, nixlCancelledError, nixlNotPostedError,
    nixlRepostActiveError, nixlUnknownError, nixlNoTelemetryError,
    nixlXferDList, nixlRegDList, nixlRemoteDList,
    DRAM_SEG, VRAM_SEG, BLK_SEG, OBJ_SEG, FILE_SEG, NIXL_READ, NIXL_WRITE,
    HAVE_UCX_GPU_DEVICE_API,
)
