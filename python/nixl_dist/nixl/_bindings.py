"""nixl._bindings on pdx: the names stacks and NIXL's tests import from it
(error classes, list classes, segment and operation constants, and
nixlAgent/nixlAgentConfig, through which nixl_agent makes its pdx.Agent;
nixlAgent here is a pdx.Agent that also has NIXL's low-level binding
methods: createBackend, registerMem, createXferReq, ...) and the
nixl_status_t constants."""
from pdx.nixl import (  # noqa: F401
    nixlXferTelemetry, NIXL_INIT_AGENT, DEFAULT_COMM_PORT,
    nixlInvalidParamError, nixlNotFoundError, nixlBackendError,
    nixlRemoteDisconnectError, nixlNotSupportedError, nixlNotAllowedError,
    nixlMismatchError, nixlCancelledError, nixlNotPostedError,
    nixlRepostActiveError, nixlUnknownError, nixlNoTelemetryError,
    nixlXferDList, nixlRegDList, nixlRemoteDList,
    DRAM_SEG, VRAM_SEG, BLK_SEG, OBJ_SEG, FILE_SEG, NIXL_READ, NIXL_WRITE,
    HAVE_UCX_GPU_DEVICE_API, nixlAgent, nixlAgentConfig,
    NIXL_IN_PROG, NIXL_SUCCESS, NIXL_ERR_NOT_POSTED, NIXL_ERR_INVALID_PARAM,
    NIXL_ERR_BACKEND, NIXL_ERR_NOT_FOUND, NIXL_ERR_MISMATCH,
    NIXL_ERR_NOT_ALLOWED, NIXL_ERR_REPOST_ACTIVE, NIXL_ERR_UNKNOWN,
    NIXL_ERR_NOT_SUPPORTED, NIXL_ERR_REMOTE_DISCONNECT, NIXL_ERR_CANCELED,
    NIXL_ERR_NO_TELEMETRY,
)
