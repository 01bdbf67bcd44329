"""The 'nixl' distribution's PEP 517 backend (pyproject.toml's
backend-path): pdx's own (python/build_backend/pdx_build.py) run on this
folder, which builds a pure-Python wheel of the modules nixl, nixl_cu12 and
nixl_cu13 from here, their one source. Standard library only."""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(_HERE), "build_backend"))

import pdx_build as _pdx_build  # noqa: E402


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory,
                                     config_settings=None):
    return _pdx_build.prepare_metadata_for_build_wheel(
        metadata_directory, config_settings, src_dir=_HERE)


def build_wheel(wheel_directory, config_settings=None,
                metadata_directory=None):
    return _pdx_build.build_wheel(wheel_directory, config_settings,
                                  metadata_directory, src_dir=_HERE)


def build_sdist(sdist_directory, config_settings=None):
    raise RuntimeError("nixl_build: no sdist; install from the checkout: "
                       "pip install ./python ./python/nixl_dist")
