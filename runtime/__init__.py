"""meganeura.runtime: load a package onto a wgpu device and run or record its programs.

Imports nothing of meganeura.compiler, and creates no device at import.
"""
from .errors import DeviceLostError, GPUOutOfMemoryError, InputError  # noqa: F401
from .package import Package, PackageError  # noqa: F401
from .session import Session  # noqa: F401
