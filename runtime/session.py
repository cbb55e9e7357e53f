"""A Session: one package on one wgpu device, ready to run or record its programs.

Everything that costs (buffers, shader modules, pipelines, bind groups) is made once in
the constructor (with quick_start, the tuned pipelines on threads after it: runtime/tiers.py);
running a program then only encodes set_pipeline / set_bind_group / dispatch per kernel. The host can record a program (or a range of its dispatches) into
its own command encoder, between its render passes.
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager

import numpy as np

from . import native
from .device import default_device, fresh_device
from .device_limits import check_buffers, check_device
from .errors import DeviceLostError, GPUOutOfMemoryError
from .inputs import coerce, pad, rows
from .lifted_sizes import sizes_buffer, slice_bytes
from .loading import SWITCH_INTERVAL, LoadingSession, _switch_sooner, default_threads
from .package import DTYPES, QUICK, Package, PackageError, as_variant, kernels_of, tensor_bytes
from .session_weights import SessionWeights
from .threads import OnThread, in_background
from .tiers import TunedTier, assemble, longest_first, make_bind_groups
from .training_state import TRAINING, Buffers, TrainingState, deferred_buffers
from .workgroup_memory import check_workgroup_memory

# threads writing the weights, twice as many from BIG_UPLOAD bytes but in a background load (its host's frames
# first). H200, 4 / 8 threads: SD-1.5 (3.3 GB) 1.10-1.18 / 0.90-0.98 s, ResNet-50 (0.1 GB) 0.19-0.20 / 0.23
UPLOAD_THREADS, BIG_UPLOAD = 4, 1 << 30
# bind groups are made on one thread beside the pipelines' (their making is Python, bound by the
# GIL: more threads only queue for it, and a game's frame queues behind them; H200, ResNet-50's
# background load: worst frame 48-50 -> 22-24 ms, blocking loads no slower)
BIND_GROUP_THREADS = 1
LOAD_THREADS = 16  # most threads compiling pipelines at load (NVIDIA: ~15 ms of driver time each, cold)
# beside a gigabyte of weights' upload (which then ends the load), fewer: cores left to the upload (H200,
# SD-1.5, two calls: 0.47-0.62 s, median 0.54, against 0.49-0.69, median 0.57 on 16; faster in 10 of 12 rounds)
BIG_LOAD_THREADS = 12
SKIPPED = "optimizer.skipped_steps"  # state counter of training steps rejected for NaN/inf


class Session(SessionWeights):
    def __init__(self, device, package, device_class: str | None = None, memory_limit: int | None = None,
                 shader_checks: bool = True, quick_start: bool = False, _progress=None):
        """`package`: a Package, or a .mnpk file's path (the fastest first launch: on POSIX the
        file is mapped, not copied, and its weights checked while the driver compiles the
        pipelines and they upload; a file written into or cut short in place while mapped is
        refused by the next Session of it (a rebuild), but written into during a load it can
        leave this one a mix of old and new weights, and cut short then it stops the process
        (SIGBUS): replace a package by a rename, as `meganeura compile` does). `device_class` ("gpu" or "cpu")
        overrides which kernel variants run; by default CPU rasterisers (lavapipe) get the CPU
        ones. `memory_limit` (bytes) refuses a package whose buffers need more, before anything
        is allocated (with a gigabyte of weights, the lifted sizes' small buffer is added to them
        once the weights' buffers are made). `shader_checks=False`
        has the WGSL compiler leave out the checks it adds to every kernel (indices into
        buffers and arrays clamped, loops bounded): 8-20% faster on the H200, and only for
        packages you compiled yourself. WGSL is still validated, but a package from
        elsewhere could then read or write past its bindings (into neighbouring tensors, or
        further where the driver has no robust buffer access), past its workgroup memory,
        or loop until the driver resets the GPU. `quick_start=True`: return once the quick
        tier's kernels are made (few, and cheap to compile: a first launch's driver compile is
        most of its load; in a training package, those of the training step alone are made with
        its training state, runtime/training_state.py), and run them until the tuned ones, compiled behind them on threads,
        take their place (`tier`, `wait_tuned()`); they compute the same, more slowly. While
        it loads, Python's switch interval is at most loading.SWITCH_INTERVAL (then restored)."""
        if device_class not in (None, "cpu", "gpu"):
            raise ValueError(f"device_class {device_class!r}: use 'cpu' or 'gpu'")
        opened = isinstance(package, (str, os.PathLike))
        # a blocking load switches Python's threads as a background one does (LoadingSession): each
        # thread's return from wgpu or zlib otherwise waits up to 5 ms for this one's Python (H200,
        # SD-1.5: its weights' 109 buffers made by 0.12-0.16 s instead of 0.14-0.20, loads 0.42-0.48 s
        # against 0.44-0.51, five rounds)
        release = _switch_sooner(SWITCH_INTERVAL) if _progress is None else (lambda: None)
        try:
            if opened:  # its weights read (and checked) while the pipelines compile
                package = Package._open(package, programs=False)  # (its kernels and programs: checked in _load)
            if not isinstance(package, Package):
                raise TypeError("Session(device, package): package is a Package or a path to a .mnpk file")
            try:
                self._load(package, device, device_class, memory_limit, shader_checks, quick_start, _progress)
            except BaseException:
                if opened:  # nobody will upload its weights: their read stops
                    package._abandon()
                raise
        finally:
            release()

    def _load(self, pkg, device, device_class, memory_limit, shader_checks, quick_start, _progress):
        import wgpu

        self.package = pkg
        self.device = device if device is not None else default_device()
        self._wgpu = wgpu
        self.lost = self.closed = False
        self._device_class_arg, self.memory_limit = device_class, memory_limit
        self.shader_checks, self.quick_start = shader_checks, quick_start
        self._tuned, self._training, self._retired, self.tier = None, None, [], "tuned"
        self._progress = _progress  # a LoadingSession's count of pipelines made and weights uploaded
        m = pkg.manifest
        self.tensors = m["tensors"]
        self._layouts = {}
        uploads = [t for t in self.tensors if t["role"] in ("param", "state", "constant") and t["init"] == "blob"]
        stop, allocated, checked = threading.Event(), threading.Event(), threading.Event()
        groups = pipelines = None
        # from BIG_UPLOAD bytes of weights, buffers and upload on a thread from the start: their upload ends the
        # load (H200, one host: SD-1.5 0.80 / 0.84 -> 0.65 / 0.65 s); the weights' buffers made once their
        # sizes are checked, while this thread checks the kernels and dispatches (a file's: Package._open); for
        # smaller ones on this thread once the compiles are queued (these end their load)
        big = sum(tensor_bytes(t) for t in uploads) >= BIG_UPLOAD
        first = sorted({t["buffer"] for t in uploads}) if big else []
        check_buffers(m, self.device, memory_limit)  # every buffer's size, before any allocation

        def the_rest(made):  # the other buffers, once every check has passed; then `allocated`
            try:
                checked.wait()  # (the rest of the manifest checked, and which buffers the training state makes later)
                if not stop.is_set():
                    now = [i for i in range(len(m["buffers"])) if i not in later and i not in made]
                    made.update(self._allocate(now, "the package", stop, first))
                if not stop.is_set():
                    self.buffers = Buffers(made, len(m["buffers"]), later)
                    with self._gpu("making the package's buffers"):
                        self._sizes = sizes_buffer(self.device, self._sizes_layout)
                    self.allocated_bytes += self._sizes_layout[0]
            except BaseException:
                made.clear()  # (let go now, not when the traceback holding this frame is)
                stop.set()  # (before `allocated`: the bind thread, stopped, makes no group)
                raise
            finally:
                allocated.set()

        def buffers_and_weights():
            made = {}
            try:
                self.allocated_bytes = 0
                made.update(self._allocate(first, "the package's weights", stop))
            except BaseException:
                made.clear()
                stop.set()
                allocated.set()
                raise
            # a gigabyte of weights at hand is written from now on, while this thread makes the other buffers
            # once every check has passed (nothing runs before then; a refusal stops the writes and lets the
            # buffers go); other weights once every buffer is made (a file being read: not behind its read)
            early = bool(first) and pkg._weights_at_hand()
            if not early:
                the_rest(made)
            if stop.is_set():  # (the constructor failed meanwhile)
                return
            with self._gpu("uploading the weights"):  # (a mapped file's checked beside it: nothing runs before that passes)
                pkg._while_checked(lambda weights: self._upload(
                    uploads, weights, stop, dict(made), (lambda: the_rest(made)) if early else None), stop)
        self.upload_threads = UPLOAD_THREADS * (2 if big and _progress is None else 1)  # (the benchmarks record it)
        filled = None
        try:
            filled = OnThread(buffers_and_weights, "meganeura-upload") if big else None
            pkg._check_programs()
            self._sizes_layout = check_device(m, self.device, memory_limit)  # (the kernels' and dispatches' sizes)
            later = deferred_buffers(m)  # the training state: made after the load (runtime/training_state.py)
            self.device_class = device_class or (
                "cpu" if self.device.adapter.info.get("adapter_type") == "CPU" else "gpu")
            tuned = kernels_of(m, self.device_class)
            first_variant = self.device_class  # the variant run first
            if quick_start and self.device_class == "gpu" and any(
                    QUICK in d.get("variants", {}) for p in m["programs"].values() for d in p["dispatches"]):
                first_variant, self.tier = QUICK, QUICK  # (CPU rasterisers run their own variants)
            first_programs = [name for name in m["programs"] if name != TRAINING] if later else None
            # its kernels for the programs made now; the training step's own are compiled with its state
            used = kernels_of(m, first_variant, first_programs)
            behind = kernels_of(m, first_variant) - used
            check_workgroup_memory(m["kernels"], used | behind | tuned,
                                   self.device.limits.get("max-compute-workgroup-storage-size", 16384))
            checked.set()  # (the manifest and the device's limits all checked: the other buffers may be made)
            # the driver compiles pipelines, and bind groups are made, on threads beside the buffers
            # and the weights' upload (buffers_and_weights, above)
            todo = [(i, k) for i, k in enumerate(m["kernels"]) if i in used]
            if _progress is not None:
                _progress.expect(len(todo) + len(uploads))
            for i in used:
                self._layout(m["kernels"][i])  # shared by kernels: made here, not in the threads
            threads = None if _progress is None else min(_progress.threads, LOAD_THREADS)  # (a background load's)
            pipelines = _in_background({i: (self._pipeline, i, k) for i, k in longest_first(todo)}, threads,
                                       min(BIG_LOAD_THREADS, LOAD_THREADS) if big else LOAD_THREADS)
            groups = OnThread(lambda: make_bind_groups(self, first_variant, BIND_GROUP_THREADS, {}, stop, allocated,
                                                       first_programs), "meganeura-bind")
            for i in (behind | tuned) - used:  # (needed after the load: once the first tier's compiles are queued)
                self._layout(m["kernels"][i])
            if filled is None:
                buffers_and_weights()
            else:
                filled.wait()
        except BaseException:
            stop.set()  # no thread outlives the constructor; the upload's error is the one to see
            allocated.set()  # (the bind thread, stopped, makes no group)
            checked.set()
            if filled is not None:
                filled.join()
            if pipelines is not None:
                pipelines(quiet=True)
            if groups is not None:
                groups.join()
            raise
        try:
            self.kernels = pipelines()
        except BaseException:
            stop.set()
            groups.join()
            raise
        first, self._groups = groups.wait()
        self._programs = assemble(first, self.kernels, self._groups)
        behind_threads = default_threads() if _progress is None else _progress.threads  # (the host's frames go on
        # beside them: a background load's threads, or the spare cores)
        self._training = TrainingState(self, later, first_variant, {i: m["kernels"][i] for i in behind},
                                       behind_threads) if later else None
        try:
            if self.tier == QUICK:
                self._tuned = TunedTier(self, tuned, behind_threads, BIND_GROUP_THREADS)
        except BaseException:
            self.close()  # (the training state's thread stopped)
            raise
        self._staging = {}
        self._batch = (m.get("batch") or {}).get("size")
        self._skip_counter = pkg.tensor(SKIPPED, "state")  # None: compiled without the NaN guard

    @classmethod
    def load_in_background(cls, device, package, threads: int | None = None,
                           switch_interval: float | None = SWITCH_INTERVAL, **options) -> LoadingSession:
        """Start making a Session (the same arguments) on a thread of its own and return at
        once: the host's frames go on while the driver compiles (a first launch of a big package
        takes a second or more). Poll `.done()` and `.progress` each frame, then `.result()`.
        `threads`: how many the driver compiles on (default: the cores less loading.SPARE_CORES).
        `switch_interval`: Python's thread switch interval while it loads, in seconds (default
        0.5 ms, restored after; None leaves it alone): the host's thread then waits less for the
        loading threads between its calls (loading.SWITCH_INTERVAL)."""
        return LoadingSession(cls, device, package, threads, options, switch_interval)

    # ---------------------------------------------------------------- loading
    def _allocate(self, which: list, what: str, cancel=None, before=()) -> dict:
        """Buffers `which` (indices into the manifest's sizes), index -> buffer; none once `cancel` is set.
        (`before`: those made before them, counted in the out-of-memory message.)"""
        wgpu, sizes = self._wgpu, self.package.manifest["buffers"]
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        made, total = {}, 0
        for i in which:
            if cancel is not None and cancel.is_set():
                return {}
            try:
                made[i] = self.device.create_buffer(size=sizes[i], usage=usage, label=f"mn{i}")
            except wgpu.GPUValidationError as exc:
                made.clear()  # released, not destroyed: nothing was ever submitted with them
                self._raise_if_lost(exc, f"making {what}")
                raise GPUOutOfMemoryError(
                    f"{what} needs {sum(sizes[j] for j in (*before, *which)) / 2**20:.1f} MiB of GPU memory in "
                    f"{len(before) + len(which)} buffers; the device could not allocate buffer {i} "
                    f"({sizes[i] / 2**20:.1f} MiB): {str(exc).strip().splitlines()[-1].strip()}") from None
            total += sizes[i]
        self.allocated_bytes += total  # (all of them, or none)
        return made

    @contextmanager
    def _gpu(self, what):
        """Turn wgpu's "device is lost" validation errors into DeviceLostError."""
        if self.closed:
            raise RuntimeError(f"{what}: this session was closed")
        if self.lost:
            raise DeviceLostError(f"{what}: the GPU device was lost; make a new session with session.rebuild()")
        try:
            yield
        except self._wgpu.GPUValidationError as exc:
            self._raise_if_lost(exc, what)
            raise
        except self._wgpu.GPUOutOfMemoryError as exc:
            raise GPUOutOfMemoryError(f"{what}: the GPU ran out of memory ({str(exc).strip()[:200]})") from None

    def _raise_if_lost(self, exc, what):
        if "device is lost" in str(exc) or "Device lost" in str(exc):
            self.lost = True
            raise DeviceLostError(f"{what}: the GPU device was lost (driver reset, GPU removed or device "
                                  "destroyed); make a new session with session.rebuild()") from None

    def rebuild(self, device=None, weights=None, strict: bool = True) -> Session:
        """This package in a new session, e.g. after DeviceLostError: on `device` (by default
        a new device, since a lost one never comes back), with `weights` (a file written
        by save_weights, or a name -> array dict) loaded over the package's own. Optimizer
        state (moments, step count, a changed lr, skipped_steps) starts from the package's:
        write_tensor() it back if the host kept it."""
        s = Session(device if device is not None else fresh_device(), self.package,
                    self._device_class_arg, self.memory_limit, self.shader_checks, self.quick_start)
        if isinstance(weights, dict):
            s.set_weights(weights, strict)
        elif weights is not None:
            s.load_weights(weights, strict)
        return s

    def close(self) -> None:
        """Let go of this session's GPU objects. They are released, never destroyed: wgpu
        frees each one once no submitted (or still recorded) command buffer uses it. A
        Session still compiling its tuned kernels, or its training step's own, waits for those the
        driver has begun (up to a few tenths of a second on a first launch)."""
        self.closed = True
        if self._tuned is not None:  # (first: it would start its compiles once the training state's stop)
            self._tuned.stop_soon()
        for behind in filter(None, (self._training, self._tuned)):
            behind.cancel()
        self.buffers, self._programs, self.kernels, self._staging, self._layouts = [], {}, {}, {}, {}
        self._groups, self._retired = {}, []
        self._sizes = (None, {})

    @property
    def programs(self) -> dict:
        """Program -> the steps record() encodes; waits for the training state (`training_ready`)."""
        if self._training is not None and not self.closed:
            self._training.join()
        return self._programs

    @property
    def training_ready(self) -> bool:
        """Whether the training state (runtime/training_state.py) is made or given up; never blocks."""
        return self._training is None or self._training.done

    @property
    def training_error(self) -> BaseException | None:
        """What stopped the training state being made (e.g. GPUOutOfMemoryError), once ready."""
        return self._training.error if self._training is not None and self._training.done else None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _bind_group(self, program, j, access, buffers, ranges, lifted):
        entries = [(self.buffers[bi], r[0], r[1]) if r else (self.buffers[bi], 0, self.buffers[bi].size)
                   for bi, r in zip(buffers, ranges)]
        if lifted:  # the kernel's sizes, after its storage buffers (compiler/lift_sizes.py)
            entries.append((self._sizes[0], self._sizes[1][lifted], slice_bytes(len(lifted))))
        try:
            return native.bind_group(self.device, self._layouts[access, len(lifted)][0], entries)
        except self._wgpu.GPUValidationError as exc:
            self._raise_if_lost(exc, "loading the package")
            raise PackageError(f"program {program} dispatch {j}: {exc}") from None

    def _layout(self, k):
        wgpu = self._wgpu
        key = tuple(k["access"]), k.get("lifted", 0)
        if key not in self._layouts:
            entries = [{"binding": b, "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": "storage" if a == "read_write" else "read-only-storage"}}
                       for b, a in enumerate(k["access"])]
            if key[1]:  # (its size: a kernel declaring more than its count is refused when its pipeline is made)
                entries.append({"binding": len(entries), "visibility": wgpu.ShaderStage.COMPUTE,
                                "buffer": {"type": "uniform", "min_binding_size": slice_bytes(key[1])}})
            try:
                bgl = self.device.create_bind_group_layout(entries=entries)
                self._layouts[key] = (bgl, self.device.create_pipeline_layout(bind_group_layouts=[bgl]))
            except wgpu.GPUValidationError as exc:
                self._raise_if_lost(exc, "loading the package")
                raise
        return self._layouts[key]

    def _forms(self, variant: str, programs=None) -> dict:
        """Program (of `programs`, default all) -> [(each dispatch as `variant` runs it, its bind group's key)]."""
        kernels = self.package.manifest["kernels"]

        def form(d):
            d = as_variant(d, variant)
            return d, (tuple(kernels[d["kernel"]]["access"]), tuple(d["buffers"]),
                       tuple(None if r is None else tuple(r) for r in d.get("ranges") or [None] * len(d["buffers"])),
                       tuple(d.get("lifted") or ()))
        return {name: [form(d) for d in p["dispatches"]] for name, p in self.package.manifest["programs"].items()
                if programs is None or name in programs}

    def _pipeline(self, i, k, counted=True):
        wgpu = self._wgpu
        bgl, layout = self._layout(k)
        try:
            module = native.shader_module(self.device, k["wgsl"], k.get("label", ""), bool(self.shader_checks))
            pipeline = self.device.create_compute_pipeline(
                layout=layout, compute={"module": module, "entry_point": k["entry"]}, label=k.get("label", ""))
        except wgpu.GPUValidationError as exc:
            self._raise_if_lost(exc, "loading the package")
            raise PackageError(f"kernel {i} ({k.get('label', '')}) was rejected by the WGSL compiler: {exc}") from None
        if counted and self._progress is not None:
            self._progress.tick()
        return pipeline, bgl

    def _upload(self, tensors, weights, stop, into, meanwhile=None):
        """Write `tensors`' weights into buffers `into` (index -> buffer), the largest first, on
        `upload_threads` threads: each write copies into a fresh staging buffer of the driver's;
        none once `stop` is set (the load failed). `meanwhile()` runs on this thread beside them."""
        order = sorted(tensors, key=lambda t: -weights[t["name"]].nbytes)
        writes = _in_background({i: (self._write_counted, t, weights[t["name"]], stop, into)
                                 for i, t in enumerate(order)}, self.upload_threads)
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException:
                stop.set()
                writes(quiet=True)
                raise
        writes()

    def _write_counted(self, t, value, stop, into):
        if stop.is_set():
            return
        self._write(t, value, into)
        if self._progress is not None:
            self._progress.tick()

    # ---------------------------------------------------------------- running
    def record(self, encoder, program: str, start: int = 0, stop: int | None = None, pass_kwargs=None):
        """Encode dispatches [start, stop) of `program` as one compute pass into `encoder`."""
        steps = self._steps(program)[start:stop]
        with self._gpu(f"recording {program}"):
            cpass = encoder.begin_compute_pass(**(pass_kwargs or {}))
            raw = native.raw()
            handle = getattr(cpass, "_internal", None) if raw else None
            if handle is not None:
                native.record_raw(raw, handle, steps)
            else:
                set_pipeline, set_group = cpass.set_pipeline, cpass.set_bind_group
                dispatch, last = cpass.dispatch_workgroups, None
                for pipeline, group, (x, y, z), _, _ in steps:
                    if pipeline is not last:  # runs of one kernel (layers share kernels) bind it once
                        set_pipeline(pipeline)
                        last = pipeline
                    set_group(0, group)
                    dispatch(x, y, z)
            cpass.end()  # through wgpu-py: errors recorded in the pass raise here

    def dispatch_count(self, program: str) -> int:  # (from the manifest: never waits for the training state)
        return len(self._program(program)["dispatches"])

    def wait_tuned(self, timeout: float | None = None) -> None:
        """Wait (up to `timeout` seconds: TimeoutError) until the tuned kernels run, where a
        quick_start Session began on its quick tier; raises what stopped them (the Session
        then runs on with its quick tier)."""
        if self._tuned is not None:
            self._tuned.wait(timeout)

    def _program(self, program) -> dict:
        """The manifest's `program`; RuntimeError once closed, KeyError naming those it has."""
        if self.closed:
            raise RuntimeError("this session was closed")
        if program not in self.package.programs:
            raise KeyError(f"no program {program!r} in this package; it has {sorted(self.package.programs)}")
        return self.package.programs[program]

    def _steps(self, program):
        steps = self._programs.get(program)
        if steps is None or self.closed:
            self._program(program)  # (closed, or no such program)
            self._training.wait()  # (train_step: or raises what stopped it, e.g. GPUOutOfMemoryError)
            return self._programs[program]
        return steps

    def write_inputs(self, program: str, inputs: dict, rows: int | None = None, check_finite: bool = True):
        """Upload inputs (after checking them) for the next run of `program`. Float inputs
        holding NaN or infinity are refused unless `check_finite` is False."""
        p = self.package.programs[program]
        expected = {k: self.tensors[i] for k, i in p["inputs"].items()}
        mask = p.get("row_mask")
        given = set(inputs)
        public = {k for k in expected if k != mask}
        if given - public:
            raise ValueError(f"{program}: unknown inputs {sorted(given - public)}; it takes {sorted(public)}")
        if public - given:
            raise ValueError(f"{program}: missing inputs {sorted(public - given)}; it takes {sorted(public)}")
        arrays = {name: coerce(name, inputs[name], t, check_finite) for name, t in expected.items() if name != mask}
        with self._gpu(f"uploading the inputs of {program}"):
            for name, t in expected.items():
                if name == mask:
                    n = t["shape"][0]
                    m = np.zeros(n, np.float32)
                    m[: (n if rows is None else rows)] = 1.0
                    self._write(t, m)
                else:
                    self._write(t, arrays[name])

    def run(self, program: str, inputs: dict, check_finite: bool = True) -> dict:
        """Run `program` on `inputs` (name -> array) and return its outputs (name -> array).

        A batch smaller than the compiled one is padded (and, for training, masked out
        of the loss); a larger one is split into several runs of `infer`. A training step
        whose loss or gradients are not finite changes nothing (see `skipped_steps`).
        """
        p = self._program(program)
        n = rows(inputs)
        if self._batch is None or n is None or n == self._batch:
            self.write_inputs(program, inputs, check_finite=check_finite)
            return self._execute(program)
        b = self._batch
        if n > b and program != "infer":
            raise ValueError(f"{program} was compiled for batches of {b}; got {n} rows "
                             f"(split the batch, or compile with a larger batch)")
        outs = []
        for s in range(0, n, b):
            part = {k: pad(v, s, b) for k, v in inputs.items()}
            self.write_inputs(program, part, rows=min(b, n - s), check_finite=check_finite)
            outs.append(self._execute(program))
        return {k: np.concatenate([o[k] for o in outs])[:n] if np.ndim(outs[0][k]) else outs[0][k]
                for k in outs[0]}

    def _execute(self, program):
        with self._gpu(f"running {program}"):
            out = self._submit_and_read(program)
        if "loss" in out and not np.isfinite(out["loss"]).all() and self._skip_counter is None:
            raise FloatingPointError(f"{program}: the loss is {out['loss']} (not finite) and this package was "
                                     "compiled without skip_nonfinite, so the weights took the step")
        return out

    def _submit_and_read(self, program):
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
            enc.copy_buffer_to_buffer(self.buffers[t["buffer"]], t.get("offset", 0), self._staging[key], 0,
                                      -(-size // 4) * 4)
            staged.append((name, t, size))
        self.device.queue.submit([enc.finish()])
        out = {}
        for name, t, size in staged:
            buf = self._staging[(program, name)]
            buf.map_sync(wgpu.MapMode.READ)
            data = np.frombuffer(buf.read_mapped(0, -(-size // 8) * 8), dtype=DTYPES[t["dtype"]])
            out[name] = data[: int(np.prod(t["shape"], dtype=np.int64))].reshape(t["shape"]).copy()
            buf.unmap()
        return out

    @property
    def skipped_steps(self) -> int:
        """Training steps rejected on the GPU because their loss or a gradient was NaN/inf."""
        if self._skip_counter is None:
            return 0
        return int(self.read_tensor(SKIPPED, "state"))

    def readback(self, program: str, output: str, depth: int = 3):
        """A non-blocking reader of one output (see runtime/readback.py)."""
        from .readback import Readback

        return Readback(self, program, output, depth)


def _in_background(calls: dict, threads: int | None = None, most: int | None = None):
    """threads.in_background on `threads` threads (default: `most`, else LOAD_THREADS, or this
    one, when asked, for 8 calls or fewer)."""
    return in_background(calls, threads if threads is not None else (most or LOAD_THREADS) if len(calls) > 8 else 0)

