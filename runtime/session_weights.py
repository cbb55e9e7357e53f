"""A Session's parameters and state tensors: read, written, saved and loaded by name."""
from __future__ import annotations

import numpy as np

from .checkpoint import safetensors_bytes, write_atomic
from .inputs import fits


class SessionWeights:
    """Session's weights methods, on the Session's `_manifest` (runtime/records.py) and `_objects`
    (runtime/gpu_objects.py: its buffers, their writes and reads)."""

    def _tensor(self, name: str, role: str):
        t = self._manifest.plan.tensor(name, role)
        if t is None:
            raise KeyError(f"no {role} named {name!r}")
        return t

    def read_tensor(self, name: str, role: str = "param") -> np.ndarray:
        """A copy of parameter (role "param") or state tensor (role "state") `name`, e.g.
        "optimizer.step"; blocking: for set-up and tests, not a frame. KeyError: no such tensor."""
        t = self._tensor(name, role)
        if t.count == 0:
            return np.zeros(t.shape, dtype=t.np_dtype)
        with self._objects.guard(f"reading {name}"):
            return self._objects.read(t)

    def write_tensor(self, name: str, value, role: str = "state") -> None:
        """Overwrite a state (or, with role "param", parameter) tensor with `value`, of its shape:
        e.g. "optimizer.lr" for a schedule. KeyError: no such tensor; ValueError: a wrong shape."""
        t = self._tensor(name, role)
        v = np.asarray(value)
        if v.shape != t.shape:
            raise ValueError(f"{role} {name!r} has shape {list(t.shape)}, got {list(v.shape)}")
        fits(t, v)
        with self._objects.guard(f"writing {name}"):
            self._objects.write(t, v)

    def weights(self, only=None) -> dict:
        """The parameters by the source model's names, copied from the GPU (blocking).

        Args:
            only: glob patterns selecting some (e.g. ["decoder.*"]); None: all.

        Returns:
            Name -> numpy array.
        """
        import fnmatch

        names = self._manifest.plan.param_names()
        if only is not None:
            names = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in only)]
        return {name: self.read_tensor(name) for name in names}

    def save_weights(self, path, only=None) -> None:
        """Write the parameters as safetensors, by the source model's names, atomically.

        A temporary file is written, synced and renamed over `path` (runtime/checkpoint.py):
        a crash while saving leaves the old file or the new one, whole.

        Args:
            path: the file to write.
            only: glob patterns selecting the parameters to save; None: all.

        Raises:
            ValueError: weights holding NaN or infinity (refused, not saved over a good file).
        """
        weights = self.weights(only)
        bad = [name for name, v in weights.items() if not np.isfinite(v).all()]
        if bad:
            raise ValueError(f"not saving {path}: weights {bad[:5]} hold NaN or infinity")
        write_atomic(path, safetensors_bytes(weights))

    def load_weights(self, path, strict: bool = True) -> None:
        """Load parameters saved by save_weights (or any safetensors file with these names).

        Args:
            path: the safetensors file.
            strict: refuse a file that misses a parameter of the package or holds one it lacks.

        Raises:
            ValueError: an unreadable file, or names, shapes or values that do not fit; every
                array is checked before any is written, so a bad file changes nothing.
        """
        from safetensors.numpy import load_file

        try:
            values = load_file(str(path))
        except Exception as exc:
            raise ValueError(f"cannot read weights from {path}: {exc}") from None
        self.set_weights(values, strict)

    def set_weights(self, values: dict, strict: bool = True) -> None:
        """Write parameters from `values` (name -> array), all checked before any is written;
        as load_weights, whose arguments and errors these are."""
        plan = self._manifest.plan
        names = set(plan.param_names())
        unknown, missing = set(values) - names, names - set(values)
        if strict and (unknown or missing):
            raise ValueError(f"weights do not match the package: missing {sorted(missing)}, "
                             f"unknown {sorted(unknown)}")
        checked = {}
        for name in names & set(values):
            t = plan.tensor(name, "param")
            v = np.asarray(values[name])
            if v.shape != t.shape:
                raise ValueError(f"weight {name!r} has shape {list(v.shape)}, the package needs {list(t.shape)}")
            if not np.isfinite(v).all():
                raise ValueError(f"weight {name!r} holds NaN or infinity")
            fits(t, v)
            checked[name] = (t, v)
        with self._objects.guard("loading weights"):
            for t, v in checked.values():  # all checked first: a bad file changes nothing
                self._objects.write(t, v)
