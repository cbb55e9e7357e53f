"""A Session: one package on one wgpu device, ready to run or record its programs.

Everything that costs (buffers, shader modules, pipelines, bind groups) is made once in
the constructor; running a program then only encodes set_pipeline / set_bind_group /
dispatch per kernel. The host can record a program (or a range of its dispatches) into
its own command encoder, between its render passes.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from .device import default_device
from .package import DTYPES, Package, PackageError

_LIMIT_NAMES = {  # manifest name -> wgpu limit name
    "max_storage_buffers_per_shader_stage": "max-storage-buffers-per-shader-stage",
    "max_compute_workgroups_per_dimension": "max-compute-workgroups-per-dimension",
    "max_storage_buffer_binding_size": "max-storage-buffer-binding-size",
    "max_buffer_size": "max-buffer-size",
}


class Session:
    def __init__(self, device, package, device_class: str | None = None):
        """`device_class` ("gpu" or "cpu") overrides which kernel variants run; by default
        CPU rasterisers (lavapipe) get the CPU ones."""
        import wgpu

        if isinstance(package, (str, os.PathLike)):
            package = Package.load(package)
        if not isinstance(package, Package):
            raise TypeError("Session(device, package): package is a Package or a path to a .mnpk file")
        self.package = pkg = package
        self.device = dev = device if device is not None else default_device()
        self._wgpu = wgpu
        m = pkg.manifest
        self._check_device(m["requires"])
        self.tensors = m["tensors"]
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        self.buffers = [dev.create_buffer(size=size, usage=usage, label=f"mn{i}")
                        for i, size in enumerate(m["buffers"])]
        for t in self.tensors:
            if t["role"] in ("param", "state", "constant") and t["init"] == "blob":
                self._write(t, pkg.weights[t["name"]])
        self._layouts = {}
        if device_class not in (None, "cpu", "gpu"):
            raise ValueError(f"device_class {device_class!r}: use 'cpu' or 'gpu'")
        self.device_class = device_class or (
            "cpu" if self.device.adapter.info.get("adapter_type") == "CPU" else "gpu")
        chosen = [d.get("variants", {}).get(self.device_class, d) for p in m["programs"].values()
                  for d in p["dispatches"]]
        used = {c["kernel"] for c in chosen}
        self.kernels = {i: self._pipeline(i, k) for i, k in enumerate(m["kernels"]) if i in used}
        self.programs = {}
        for name, p in m["programs"].items():
            steps = []
            for j, d in enumerate(p["dispatches"]):
                d = {**d, **d.get("variants", {}).get(self.device_class, {})}
                pipeline, layout = self.kernels[d["kernel"]]
                entries = [{"binding": b, "resource": {"buffer": self.buffers[bi], "offset": 0,
                                                       "size": self.buffers[bi].size}}
                           for b, bi in enumerate(d["buffers"])]
                try:
                    group = dev.create_bind_group(layout=layout, entries=entries)
                except wgpu.GPUValidationError as exc:
                    raise PackageError(f"program {name} dispatch {j}: {exc}") from None
                steps.append((pipeline, group, tuple(d["workgroups"])))
            self.programs[name] = steps
        self._staging = {}
        self._batch = (m.get("batch") or {}).get("size")

    # ---------------------------------------------------------------- loading
    def _check_device(self, requires):
        missing = [f for f in requires["features"] if f not in self.device.features]
        if missing:
            raise PackageError(f"this device lacks features the package needs: {missing}")
        for name, need in requires["limits"].items():
            have = self.device.limits.get(_LIMIT_NAMES.get(name, name.replace("_", "-")))
            if have is not None and need > have:
                raise PackageError(f"the package needs {name} = {need}; this device allows {have}")

    def _pipeline(self, i, k):
        wgpu = self._wgpu
        key = tuple(k["access"])
        if key not in self._layouts:
            entries = [{"binding": b, "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": "storage" if a == "read_write" else "read-only-storage"}}
                       for b, a in enumerate(k["access"])]
            bgl = self.device.create_bind_group_layout(entries=entries)
            self._layouts[key] = (bgl, self.device.create_pipeline_layout(bind_group_layouts=[bgl]))
        bgl, layout = self._layouts[key]
        try:
            module = self.device.create_shader_module(code=k["wgsl"], label=k.get("label", ""))
            pipeline = self.device.create_compute_pipeline(
                layout=layout, compute={"module": module, "entry_point": k["entry"]}, label=k.get("label", ""))
        except wgpu.GPUValidationError as exc:
            raise PackageError(f"kernel {i} ({k.get('label', '')}) was rejected by the WGSL compiler: {exc}") from None
        return pipeline, bgl

    def _write(self, t, value):
        arr = np.ascontiguousarray(value, dtype=DTYPES[t["dtype"]])
        self.device.queue.write_buffer(self.buffers[t["buffer"]], 0, arr.tobytes())

    # ---------------------------------------------------------------- running
    def record(self, encoder, program: str, start: int = 0, stop: int | None = None, pass_kwargs=None):
        """Encode dispatches [start, stop) of `program` as one compute pass into `encoder`."""
        steps = self._steps(program)[start:stop]
        cpass = encoder.begin_compute_pass(**(pass_kwargs or {}))
        for pipeline, group, wg in steps:
            cpass.set_pipeline(pipeline)
            cpass.set_bind_group(0, group)
            cpass.dispatch_workgroups(*wg)
        cpass.end()

    def dispatch_count(self, program: str) -> int:
        return len(self._steps(program))

    def _steps(self, program):
        if program not in self.programs:
            raise KeyError(f"no program {program!r} in this package; it has {sorted(self.programs)}")
        return self.programs[program]

    def write_inputs(self, program: str, inputs: dict, rows: int | None = None):
        """Upload inputs (after checking them) for the next run of `program`."""
        p = self.package.programs[program]
        expected = {k: self.tensors[i] for k, i in p["inputs"].items()}
        mask = p.get("row_mask")
        given = set(inputs)
        public = {k for k in expected if k != mask}
        if given - public:
            raise ValueError(f"{program}: unknown inputs {sorted(given - public)}; it takes {sorted(public)}")
        if public - given:
            raise ValueError(f"{program}: missing inputs {sorted(public - given)}; it takes {sorted(public)}")
        for name, t in expected.items():
            if name == mask:
                n = t["shape"][0]
                m = np.zeros(n, np.float32)
                m[: (n if rows is None else rows)] = 1.0
                self._write(t, m)
                continue
            self._write(t, _coerce(name, inputs[name], t))

    def run(self, program: str, inputs: dict) -> dict:
        """Run `program` on `inputs` (name -> array) and return its outputs (name -> array).

        A batch smaller than the compiled one is padded (and, for training, masked out
        of the loss); a larger one is split into several runs of `infer`.
        """
        p = self.package.programs.get(program)
        if p is None:
            raise KeyError(f"no program {program!r} in this package; it has {sorted(self.programs)}")
        n = _rows(inputs)
        if self._batch is None or n is None or n == self._batch:
            self.write_inputs(program, inputs)
            return self._execute(program)
        b = self._batch
        if n > b and program != "infer":
            raise ValueError(f"{program} was compiled for batches of {b}; got {n} rows "
                             f"(split the batch, or compile with a larger batch)")
        outs = []
        for s in range(0, n, b):
            part = {k: _pad(v, s, b) for k, v in inputs.items()}
            self.write_inputs(program, part, rows=min(b, n - s))
            outs.append(self._execute(program))
        return {k: np.concatenate([o[k] for o in outs])[:n] if np.ndim(outs[0][k]) else outs[0][k]
                for k in outs[0]}

    def _execute(self, program):
        wgpu = self._wgpu
        p = self.package.programs[program]
        enc = self.device.create_command_encoder()
        self.record(enc, program)
        staged = []
        for name, ti in p["outputs"].items():
            t = self.tensors[ti]
            size = max(4, int(np.prod(t["shape"], dtype=np.int64)) * 4)
            key = (program, name)
            if key not in self._staging:
                self._staging[key] = self.device.create_buffer(
                    size=-(-size // 8) * 8, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
            enc.copy_buffer_to_buffer(self.buffers[t["buffer"]], 0, self._staging[key], 0, -(-size // 4) * 4)
            staged.append((name, t, size))
        self.device.queue.submit([enc.finish()])
        out = {}
        for name, t, size in staged:
            buf = self._staging[(program, name)]
            buf.map_sync(wgpu.MapMode.READ)
            data = np.frombuffer(buf.read_mapped(0, -(-size // 8) * 8), dtype=DTYPES[t["dtype"]])
            out[name] = data[: int(np.prod(t["shape"], dtype=np.int64))].reshape(t["shape"]).copy()
            buf.unmap()
        if "loss" in out and not np.isfinite(out["loss"]).all():
            raise FloatingPointError(f"{program}: the loss is {out['loss']} (not finite); "
                                     "check the inputs and the learning rate")
        return out

    def readback(self, program: str, output: str, depth: int = 3):
        """A non-blocking reader of one output (see runtime/readback.py)."""
        from .readback import Readback

        return Readback(self, program, output, depth)

    # ---------------------------------------------------------------- weights
    def read_tensor(self, name: str, role: str = "param") -> np.ndarray:
        t = self.package.tensor(name, role)
        if t is None:
            raise KeyError(f"no {role} named {name!r}")
        data = self.device.queue.read_buffer(self.buffers[t["buffer"]], 0, self.buffers[t["buffer"]].size)
        count = int(np.prod(t["shape"], dtype=np.int64))
        return np.frombuffer(data, dtype=DTYPES[t["dtype"]])[:count].reshape(t["shape"]).copy()

    def write_tensor(self, name: str, value, role: str = "state") -> None:
        """Overwrite a parameter or state tensor (e.g. "optimizer.lr" for a schedule)."""
        t = self.package.tensor(name, role)
        if t is None:
            raise KeyError(f"no {role} named {name!r}")
        v = np.asarray(value)
        if list(v.shape) != list(t["shape"]):
            raise ValueError(f"{role} {name!r} has shape {t['shape']}, got {list(v.shape)}")
        self._write(t, v)

    def weights(self, only=None) -> dict:
        """Parameters by name; `only`: glob patterns selecting some (e.g. ["decoder.*"])."""
        import fnmatch

        names = self.package.param_names()
        if only is not None:
            names = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in only)]
        return {name: self.read_tensor(name) for name in names}

    def save_weights(self, path, only=None) -> None:
        """Write the parameters (or those matching `only`) as safetensors, by the source
        model's names, atomically: a crash while saving leaves the old file intact."""
        from safetensors.numpy import save_file

        path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=path.name, suffix=".tmp")
        os.close(fd)
        try:
            save_file(self.weights(only), tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def load_weights(self, path, strict: bool = True) -> None:
        """Load parameters saved by save_weights (or any safetensors with these names)."""
        from safetensors.numpy import load_file

        try:
            values = load_file(str(path))
        except Exception as exc:
            raise ValueError(f"cannot read weights from {path}: {exc}") from None
        self.set_weights(values, strict)

    def set_weights(self, values: dict, strict: bool = True) -> None:
        names = set(self.package.param_names())
        unknown, missing = set(values) - names, names - set(values)
        if strict and (unknown or missing):
            raise ValueError(f"weights do not match the package: missing {sorted(missing)}, "
                             f"unknown {sorted(unknown)}")
        checked = {}
        for name in names & set(values):
            t = self.package.tensor(name, "param")
            v = np.asarray(values[name])
            if list(v.shape) != list(t["shape"]):
                raise ValueError(f"weight {name!r} has shape {list(v.shape)}, the package needs {t['shape']}")
            if not np.isfinite(v).all():
                raise ValueError(f"weight {name!r} holds NaN or infinity")
            checked[name] = (t, v)
        for t, v in checked.values():  # all checked first: a bad file changes nothing
            self._write(t, v)


def _rows(inputs):
    firsts = {np.shape(v)[0] for v in inputs.values() if np.ndim(v) > 0}
    return firsts.pop() if len(firsts) == 1 else None


def _pad(v, start, b):
    v = np.asarray(v)
    part = v[start:start + b]
    if part.shape[0] == b:
        return part
    pad = np.zeros((b - part.shape[0],) + part.shape[1:], dtype=part.dtype)
    return np.concatenate([part, pad])


def _coerce(name, value, t):
    arr = np.asarray(value)
    if list(arr.shape) != list(t["shape"]):
        raise ValueError(f"input {name!r} has shape {list(arr.shape)}; the model expects {t['shape']}")
    if t["dtype"] == "i32":
        if arr.dtype.kind not in "iub":
            raise TypeError(f"input {name!r} holds {arr.dtype} values; it takes integers")
        if arr.size and (arr.min() < -(2 ** 31) or arr.max() >= 2 ** 31):
            raise ValueError(f"input {name!r} has values outside the 32-bit range")
        return arr.astype(np.int32)
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"input {name!r} holds {arr.dtype} values; it takes numbers")
    return arr.astype(np.float32)
