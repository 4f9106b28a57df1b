"""Build of memtp_sim's compiled kernels (``memtp_sim/_kernels.pyx``, Cython); the project's
metadata and dependencies are in pyproject.toml.

Built by ``pip install -e .`` (in place) or ``pip install .``; a C compiler and the Python headers
are needed (Debian: ``gcc python3-dev``). The extension is optional: where it cannot be built the
install goes on without it, and the engine runs its numpy code (the same results, 2 to 13 times
slower) and warns once per process. The test suite fails without it
(tests/test_kernels.py).
"""

import hashlib
import shutil
import sys
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithCalibration(build_py):
    """Ship the repository's ``calibration/`` inside the package as ``memtp_sim/_calibration``
    (``hardware/profile.py`` looks there first, then in the source tree)."""

    def run(self) -> None:
        super().run()
        shutil.copytree(ROOT / "calibration", Path(self.build_lib) / "memtp_sim" / "_calibration",
                        dirs_exist_ok=True)


# no fused multiply-add: the kernels must round exactly as the numpy code they replace
FLAGS = [] if sys.platform == "win32" else ["-O2", "-ffp-contract=off"]
# the source's digest goes into the extension: memtp_sim/_compiled.py refuses a build of another
# version of the source (an old .so after a pull that changed the kernels) instead of running it
SOURCE_SHA256 = hashlib.sha256((ROOT / "memtp_sim" / "_kernels.pyx").read_bytes()).hexdigest()
# numpy's C random library (numpy/random/lib): the drafted-block kernel draws from the run's own
# Generators with numpy's distribution functions, the same numbers the Python calls give
NPYRANDOM = str(Path(np.get_include()).parent.parent / "random" / "lib")
KERNELS = Extension("memtp_sim._kernels", ["memtp_sim/_kernels.pyx"], include_dirs=[np.get_include()],
                    library_dirs=[NPYRANDOM], libraries=["npyrandom", "m"],
                    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"),
                                   ("MEMTP_KERNELS_SHA256", f'"{SOURCE_SHA256}"'),
                                   ("MEMTP_NUMPY_BUILD_VERSION", f'"{np.__version__}"')], extra_compile_args=FLAGS)
EXTENSIONS = cythonize([KERNELS], language_level=3)
for ext in EXTENSIONS:
    ext.optional = True  # cythonize makes new Extension objects without it

setup(ext_modules=EXTENSIONS, cmdclass={"build_py": BuildPyWithCalibration})
