"""A NIXL-compatible agent on pdx: ``nixl_agent`` and ``nixl_agent_config``
with the calls vLLM's NixlConnector (and SGLang's, Dynamo's) makes on
``nixl._api``: same names, arguments and return conventions.

Use it in place of NIXL without changing the stack's code:

* ``pip install ./python ./python/nixl_dist`` (one command, any venv, no
  package index): the modules ``nixl``, ``nixl_cu12`` and ``nixl_cu13``
  give this module as ``nixl._api`` and ``nixl._bindings``, and
  ``importlib.metadata.version("nixl")`` answers; or
* put ``pdx.nixl.SHIM_PATH`` (``<build>/python/pdx/_nixl_shim``, or the
  same folder of an installed pdx: the same modules) first on
  ``sys.path``/PYTHONPATH; or
* call ``pdx.nixl.install()`` before the stack imports ``nixl``.

numpy is optional (NIXL requires it): without it descriptors are tuples.
``prep_xfer_dlist`` also takes NIXL 1.5's strided rows, an N x 5 array of
(addr, len, devId, stride, count) with a mem type, indexed by flattened
block. A failure raises its NIXL class with pdx's text, and pdx does not
print it a second time (PDX_LOG_LEVEL=info does).

Where pdx behaves differently from NIXL:

* Handles are objects (pdx.PreparedList, nixl_xfer_handle wrapping a
  pdx.Xfer), not integers; using one after release raises ``pdx.Closed``
  instead of undefined behaviour.
* "UCX" means pdx's UCX backend plus ``cma`` (same-host memcpy into the
  peer's shared memory) and ``cuda_ipc`` where a GPU is present; the
  backend for each request is chosen by pdx (``backends=`` arguments are
  accepted and ignored). ``query_xfer_backend`` names the pdx backend.
  ``create_backend`` creates them; pdx adds backends only before memory
  is registered or peers are added (nixlNotAllowedError after). NIXL's UCX
  parameters are accepted and reported by get_backend_params; only pdx's
  own (tls, max_chunk) change anything.
* A notification is sent after every post of a request that carries one:
  reposting a finished request with ``transfer()`` sends it again (as
  NIXL does); ``transfer(h, notif_msg)`` with another message remakes the
  finished request with it (pdx fixes a request's notification when it is
  made); a request still in flight raises nixlRepostActiveError.
* check_xfer_state/transfer return "DONE" or "PROC"; a failure raises the
  NIXL class for it, as NIXL's bindings do (nixlRemoteDisconnectError for
  a dead peer, ...; they are the pdx exceptions, with pdx's text).
  get_xfer_telemetry raises nixlNoTelemetryError unless the agent
  captures telemetry (``capture_telemetry=True`` or NIXL_TELEMETRY_ENABLE=y;
  =n turns it off), as NIXL. Times are microseconds as in NIXL.
* Malformed descriptor input to get_xfer_descs/get_reg_descs gives None
  (logged on the 'nixl' logger) and an unknown mem type or operation a
  KeyError, as NIXL; the calls taking such a None raise
  nixlInvalidParamError.
* Exactly repeated registrations of one region are reference-counted
  (NIXL accepts them); partly overlapping ones are refused.
* deregister_memory is accepted in any order: a region that prepared
  lists or requests (finished or not) still use stays registered until
  the last of them is released, then goes; close() frees everything.
* get_serialized_descs/deserialize_descs use pdx's own byte format, not
  pickle: bytes from a peer are parsed and checked, never executed.
* add_remote_agent returns the name as bytes (as NIXL); every call takes
  names as str or bytes. check_remote_metadata is False once the peer is
  unknown, removed or known dead.
* The listener thread (enable_listen_thread, listen_port; 0 picks a free
  port, in .listen_port) speaks pdx's own framing, so both ends must be
  pdx.nixl; it listens on all addresses as NIXL, or on
  $PDX_NIXL_LISTEN_ADDR. fetch_remote_metadata loads in the background
  (poll check_remote_metadata). Partial metadata carries the full blob
  plus the regions it names; transfers may use only named regions
  (nixlNotFoundError otherwise), as NIXL.
  With NIXL_ETCD_ENDPOINTS (and NIXL_ETCD_NAMESPACE, default
  /nixl/agents) metadata goes through pdx's etcd store module under
  NIXL's keys, <namespace>/<agent>/<label> ("metadata" for the full
  metadata; pdx blobs, so pdx and NIXL agents do not read each other's):
  send_local_metadata() and send_partial_agent_metadata(label=...)
  publish, fetch_remote_metadata(name, label=...) waits up to 5 s for the
  key and loads it, invalidate_local_metadata() removes every key the
  agent sent (peers that loaded it keep it). The pdx agent also publishes
  its own key (agents/<name>) for liveness: a peer sees it die with its
  lease.
* Loopback (the agent's own name as the remote side) goes through a shadow
  pdx.Agent "<name>.loopback" that registers the same regions (made at
  the first loopback use); its notifications come back under the agent's
  own name. prep_mem_view is not supported.
* estimate_xfer_cost returns (duration us, margin us,
  "ANALYTICAL_BACKEND") from pdx's model: the request's measured time
  once it ran with telemetry captured, else its bytes over a nominal
  bandwidth of the path pdx chose plus per-request and per-segment costs.

The modules: _common (constants, errors, configs, handles), _descs
(descriptor lists and their byte format), _binding (nixl._bindings'
nixlAgent), _exchange (metadata: peers, partial metadata, listener, etcd
mode), _etcd (the store module's keys), _agent (nixl_agent).

docs/NIXL.md has the table of NIXL calls and their status per stack.
"""

import bisect  # noqa: F401  (names 'from pdx.nixl import *' gave)
import enum  # noqa: F401
import logging  # noqa: F401
import os
import socket  # noqa: F401
import struct  # noqa: F401
import sys
import threading  # noqa: F401

try:
    import numpy as np  # noqa: F401
except ImportError:  # optional: pdx.nixl works without it (a plain venv)
    pass

from ._common import (  # noqa: F401
    BLK_SEG,
    DEFAULT_COMM_PORT,
    DRAM_SEG,
    FILE_SEG,
    HAVE_UCX_GPU_DEVICE_API,
    NIXL_INIT_AGENT,
    NIXL_READ,
    NIXL_WRITE,
    OBJ_SEG,
    VRAM_SEG,
    nixlBackendError,
    nixlCancelledError,
    nixlInvalidParamError,
    nixlMismatchError,
    nixlNoTelemetryError,
    nixlNotAllowedError,
    nixlNotFoundError,
    nixlNotPostedError,
    nixlNotSupportedError,
    nixlRemoteDisconnectError,
    nixlRepostActiveError,
    nixlUnknownError,
    nixlXferTelemetry,
    nixl_agent_config,
    nixl_backend_handle,
    nixl_prepped_dlist_handle,
    nixl_thread_sync_t,
    nixl_xfer_handle,
)
from ._descs import (  # noqa: F401
    deserialize_descs,
    nixlRegDList,
    nixlRemoteDList,
    nixlXferDList,
    nixl_reg_dlist,
    nixl_remote_dlist,
    nixl_xfer_dlist,
    serialize_descs,
)
from ._binding import (  # noqa: F401
    NIXL_ERR_BACKEND,
    NIXL_ERR_CANCELED,
    NIXL_ERR_INVALID_PARAM,
    NIXL_ERR_MISMATCH,
    NIXL_ERR_NOT_ALLOWED,
    NIXL_ERR_NOT_FOUND,
    NIXL_ERR_NOT_POSTED,
    NIXL_ERR_NOT_SUPPORTED,
    NIXL_ERR_NO_TELEMETRY,
    NIXL_ERR_REMOTE_DISCONNECT,
    NIXL_ERR_REPOST_ACTIVE,
    NIXL_ERR_UNKNOWN,
    NIXL_IN_PROG,
    NIXL_SUCCESS,
    nixlAgent,
    nixlAgentConfig,
)
from ._agent import (  # noqa: F401
    nixl_agent,
)

# The folder holding a 'nixl' package backed by this package.
SHIM_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "_nixl_shim")


def install():
    """Make ``import nixl`` (and nixl_cu12, nixl_cu13, with their _api,
    _bindings, _utils and logging) resolve to pdx's shim packages, for
    stacks written against NIXL: SHIM_PATH goes first on sys.path and
    modules of those names already imported are dropped. Returns the
    'nixl' package."""
    import importlib
    if SHIM_PATH not in sys.path:
        sys.path.insert(0, SHIM_PATH)
    for m in [m for m in sys.modules
              if m.split(".")[0] in ("nixl", "nixl_cu12", "nixl_cu13")]:
        del sys.modules[m]
    return importlib.import_module("nixl")


# The classes keep the module name they had before pdx.nixl became a
# package: reprs, pickles (nixl_xfer_dlist, nixl_reg_dlist, ...) and the
# names stacks log stay 'pdx.nixl.<class>'.
for _c in (nixl_xfer_handle, nixl_agent_config, nixlXferTelemetry,
           nixl_thread_sync_t, nixl_xfer_dlist, nixl_reg_dlist,
           nixl_remote_dlist, nixlAgentConfig, nixl_agent,
           nixlRepostActiveError, nixlUnknownError, nixlNoTelemetryError):
    _c.__module__ = __name__
del _c
