"""Errors a host can catch and act on, besides PackageError (a bad package file)."""


class DeviceLostError(RuntimeError):
    """The GPU device was lost (driver reset, GPU removed, or destroyed). Every GPU object
    of the session is gone; `session.rebuild(device, weights)` makes a working one."""


class GPUOutOfMemoryError(MemoryError):
    """The device could not allocate what the package needs. Nothing of the session was
    kept, and the host's device is still usable."""
