"""nixl._bindings on pdx: the names stacks import from it."""
from pdx.nixl import (  # noqa: F401
    nixlXferTelemetry, NIXL_INIT_AGENT, DEFAULT_COMM_PORT,
    nixlInvalidParamError, nixlNotFoundError, nixlBackendError,
    nixlRemoteDisconnectError, nixlNotSupportedError, nixlNotAllowedError,
    nixlMismatchError, nixlCancelledError, nixlNotPostedError,
)
