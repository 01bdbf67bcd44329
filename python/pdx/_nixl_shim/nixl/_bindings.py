"""nixl._bindings on pdx: the names stacks and NIXL's tests import from it
(error classes, list classes, segment and operation constants, and
nixlAgent/nixlAgentConfig, through which nixl_agent makes its pdx.Agent;
nixlAgent here is pdx.Agent, not NIXL's low-level binding object)."""
from pdx.nixl import (  # noqa: F401
    nixlXferTelemetry, NIXL_INIT_AGENT, DEFAULT_COMM_PORT,
    nixlInvalidParamError, nixlNotFoundError, nixlBackendError,
    nixlRemoteDisconnectError, nixlNotSupportedError, nixlNotAllowedError,
    nixlMismatchError, nixlCancelledError, nixlNotPostedError,
    nixlRepostActiveError, nixlUnknownError, nixlNoTelemetryError,
    nixlXferDList, nixlRegDList, nixlRemoteDList,
    DRAM_SEG, VRAM_SEG, BLK_SEG, OBJ_SEG, FILE_SEG, NIXL_READ, NIXL_WRITE,
    HAVE_UCX_GPU_DEVICE_API, nixlAgent, nixlAgentConfig,
)
