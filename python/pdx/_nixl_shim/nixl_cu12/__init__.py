"""'nixl_cu12' (the name NIXL's CUDA 12 wheel installs; TensorRT-LLM tries
it first) backed by pdx: the same package as 'nixl' (its _api, _bindings,
_utils and logging modules are found in nixl's folder)."""
import os as _os

from pdx._nixl_shim.nixl import *  # noqa: F401,F403
from pdx._nixl_shim.nixl import __all__  # noqa: F401

__path__ = [_os.path.join(_os.path.dirname(_os.path.dirname(
    _os.path.abspath(__file__))), "nixl")]
