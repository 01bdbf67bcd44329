"""'nixl_cu13' backed by pdx (the pdx 'nixl' distribution): the package
pdx._nixl_shim.nixl under this name; its submodules (_api, _bindings,
_utils, logging) load from that folder."""
import os as _os

import pdx.nixl as _pdx_nixl
from pdx._nixl_shim.nixl import *  # noqa: F401,F403
from pdx._nixl_shim.nixl import __all__  # noqa: F401

__path__ = [_os.path.join(_pdx_nixl.SHIM_PATH, "nixl")]
