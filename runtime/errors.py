"""Errors a host can catch and act on."""


class PackageError(ValueError):
    """The package file is damaged, from an incompatible compiler, or inconsistent."""


class InputError(ValueError, TypeError):
    """An input the program cannot take: a wrong name, shape, dtype or value (a label outside
    the classes, NaN). Raised before anything runs: the weights are untouched. A ValueError
    (and, for a wrong dtype, the TypeError numpy users expect, too)."""


class DeviceLostError(RuntimeError):
    """The GPU device was lost (driver reset, GPU removed, or destroyed). Every GPU object
    of the session is gone; `session.rebuild(device, weights)` makes a working one."""


class GPUOutOfMemoryError(MemoryError):
    """The device could not allocate what the package needs. Nothing of the session was
    kept, and the host's device is still usable."""
