"""A Session: one package on one wgpu device, ready to run or record its programs.

Everything that costs (buffers, shader modules, pipelines, bind groups) is made once, at load
(runtime/loader.py; with quick_start, the tuned pipelines on threads after it: runtime/tiers.py;
a training package's training state just after it: runtime/training_state.py); running a program
then only encodes set_pipeline / set_bind_group / dispatch per kernel. The host can record a
program (or a range of its dispatches) into its own command encoder, between its render passes.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import numpy as np

from . import native
from .adapters import SessionAdapters
from .device import default_device, fresh_device
from .gpu_objects import GpuObjects
from .inputs import as_source, check_batch, coerce, pad, rows
from .loader import BIND_GROUP_THREADS, Loader
from .loading import LoadingSession, checked_switch_interval, default_threads, shorten_switch_interval
from .package import QUICK, Package
from .session_weights import SessionWeights
from .tiers import TunedTier
from .training_state import TrainingState

SKIPPED = "optimizer.skipped_steps"  # state counter of training steps rejected for NaN/inf


@dataclass(frozen=True)
class SessionOptions:
    """How a Session loads (Session's keyword arguments): kept for its rebuild."""

    device_class: str | None = None
    memory_limit: int | None = None
    shader_checks: bool = True
    quick_start: bool = False
    host_switch_interval: float | None = None


class Session(SessionWeights, SessionAdapters):
    def __init__(self, device, package, device_class: str | None = None, memory_limit: int | None = None,
                 shader_checks: bool = True, quick_start: bool = False, host_switch_interval: float | None = None,
                 _progress=None):
        """Load a package onto a device: buffers, pipelines and bind groups are made once, here.

        Everything in the package is checked against its manifest and the device's limits
        before the first GPU object is made (docs/PACKAGE.md). A frame then costs only
        set_pipeline / set_bind_group / dispatch per kernel.

        Args:
            device: the host's `wgpu.GPUDevice`, or None for wgpu's shared default device
                (the one pygfx and other wgpu libraries use).
            package: a Package, or a .mnpk file's path (the fastest first launch: on POSIX the
                file is mapped, not copied, and its weights checked while the driver compiles
                the pipelines and they upload). Replace a package file by a rename, as
                `meganeura compile` does: one written into or cut short in place while mapped
                is refused by the next Session of it (a rebuild), but written into during a
                load it can leave this one a mix of old and new weights, and cut short then
                it stops the process (SIGBUS).
            device_class: "gpu" or "cpu": which kernel variants run; by default CPU
                rasterisers (lavapipe) get the CPU ones where the device has the subgroup
                feature with 8-lane subgroups (they need it: "cpu" elsewhere is refused).
            memory_limit: bytes; a package whose buffers need more is refused before anything
                is allocated (with a gigabyte of weights, the lifted sizes' small buffer is
                added to them once the weights' buffers are made).
            shader_checks: False has the WGSL compiler leave out the checks it adds to every
                kernel (indices into buffers and arrays clamped, loops bounded): faster, and
                only for packages you compiled yourself. WGSL is still validated, but a package
                from elsewhere could then read or write past its bindings (into neighbouring
                tensors, or further where the driver has no robust buffer access), past its
                workgroup memory, or loop until the driver resets the GPU.
            quick_start: return once the quick tier's kernels are made (few, and cheap to
                compile: a first launch's driver compile is most of its load; in a training
                package, those of the training step alone are made with its training state),
                and run them until the tuned ones, compiled behind them on threads, take their
                place (`tier`, `wait_tuned()`); they compute the same, more slowly.
            host_switch_interval: seconds (e.g. loading.SWITCH_INTERVAL): Python's thread
                switch interval while it loads, at most this, then restored (the loading
                threads' returns from wgpu and zlib wait less for the constructor's own
                Python); None leaves it alone.

        Raises:
            PackageError: the package is damaged or inconsistent, asks more than the
                device's limits, or wgpu refuses a kernel.
            GPUOutOfMemoryError: the device cannot hold the package, or it needs more than
                `memory_limit`; nothing of it is kept.
            ValueError: an unknown `device_class`, or "cpu" on a device that cannot run it.
            TypeError: `package` is neither a Package nor a path.
        """
        if device_class not in (None, "cpu", "gpu"):
            raise ValueError(f"device_class {device_class!r}: use 'cpu' or 'gpu'")
        self._options = SessionOptions(device_class, memory_limit, shader_checks, quick_start, host_switch_interval)
        opened = isinstance(package, (str, os.PathLike))
        # (a background load's interval is its LoadingSession's, for the whole of it)
        release = shorten_switch_interval(checked_switch_interval(host_switch_interval) if _progress is None else None)
        try:
            if opened:  # its weights read (and checked) while the pipelines compile
                package = Package._open(package, programs=False)  # (its kernels and programs: checked by the Loader)
            if not isinstance(package, Package):
                raise TypeError("Session(device, package): package is a Package or a path to a .mnpk file")
            try:
                self._load(package, device, _progress)
            except BaseException:
                if opened:  # nobody will upload its weights: their read stops
                    package.abandon()
                raise
        finally:
            release()

    def _load(self, package: Package, device, progress) -> None:
        self.package, self.tensors = package, package.tensors  # (tensors as stored: for hosts binding buffers)
        self.device = device if device is not None else default_device()
        options = self._options
        self.memory_limit, self.shader_checks, self.quick_start = (options.memory_limit, options.shader_checks,
                                                                   options.quick_start)
        self._objects = GpuObjects(self.device, package.plan, self.shader_checks, progress)
        self._tuned = self._training = None
        loader = Loader(package, self._objects, options.device_class, self.memory_limit, self.quick_start)
        self.upload_threads = loader.upload_threads  # (the benchmarks record it)
        first = loader.load()
        self._manifest, self._table, self.device_class = package.parsed, first.table, first.device_class
        m = self._manifest
        # the training step's own kernels and the tuned tier's compile beside the host's frames: on a
        # background load's threads, or on the cores the host is likely to leave
        behind_threads = default_threads() if progress is None else progress.threads
        if first.later:
            self._training = TrainingState(self._objects, self._table, m, first.later, first.variant,
                                           {i: m.kernels[i] for i in first.behind}, behind_threads)
        try:
            if self._table.tier == QUICK:
                self._tuned = TunedTier(self._objects, self._table, m, self._training, self.device_class, first.tuned,
                                        behind_threads, BIND_GROUP_THREADS)
        except BaseException:
            self.close()  # (the training state's thread stopped)
            raise
        self._staging, self._ready = {}, {}
        self._skip_counter = m.plan.tensor(SKIPPED, "state")  # None: compiled without the NaN guard

    @classmethod
    def load_in_background(cls, device, package, threads: int | None = None,
                           host_switch_interval: float | None = None, *, switch_interval: float | None = None,
                           **options) -> LoadingSession:
        """Start making a Session on a thread of its own and return at once.

        The host's frames go on while the driver compiles (a first launch of a big package
        takes a second or more). Poll `.done()` and `.progress` each frame, then `.result()`.

        Args:
            device: as for Session().
            package: as for Session().
            threads: how many threads the driver compiles on (default: the cores less
                loading.SPARE_CORES).
            host_switch_interval: Python's thread switch interval while it loads, in seconds,
                then restored (e.g. loading.SWITCH_INTERVAL: the host's thread then waits less
                for the loading threads between its calls into wgpu); None leaves it alone.
            switch_interval: the older name of `host_switch_interval`.
            **options: Session()'s other keyword arguments.

        Returns:
            LoadingSession: `.progress`, `.done()`, and `.result()` (the Session, or what
            stopped it, raised).
        """
        return LoadingSession(cls, device, package, threads, options,
                              checked_switch_interval(host_switch_interval, switch_interval))

    def rebuild(self, device=None, weights=None, strict: bool = True) -> Session:
        """This package in a new Session, e.g. after DeviceLostError, with the same options.

        Optimizer state (moments, step count, a changed lr, skipped_steps) starts from the
        package's: write_tensor() it back if the host kept it.

        Args:
            device: the device to load on; by default a new one, since a lost one never
                comes back.
            weights: a file written by save_weights, or a name -> array dict, loaded over the
                package's own weights; None keeps the package's.
            strict: refuse weights that miss a parameter of the package or name one it lacks.

        Returns:
            The new Session.
        """
        s = Session(device if device is not None else fresh_device(), self.package, **asdict(self._options))
        if isinstance(weights, dict):
            s.set_weights(weights, strict)
        elif weights is not None:
            s.load_weights(weights, strict)
        return s

    def close(self) -> None:
        """Let go of this session's GPU objects. They are released, never destroyed: wgpu
        frees each one once no submitted (or still recorded) command buffer uses it. A
        Session still compiling its tuned kernels, or its training step's own, waits for those the
        driver has begun."""
        self._objects.closed = True
        if self._tuned is not None:  # (first: it would start its compiles once the training state's stop)
            self._tuned.stop_soon()
        for behind in filter(None, (self._training, self._tuned)):
            behind.cancel()
        self._objects.release()
        self._table.clear()
        self._staging, self._ready = {}, {}

    # ---------------------------------------------------------------- state
    @property
    def buffers(self):
        """The package's buffers by index (those of the training state wait for it)."""
        return self._objects.buffers

    @property
    def allocated_bytes(self) -> int:
        """Bytes of the GPU buffers this session made."""
        return self._objects.allocated_bytes

    @property
    def lost(self) -> bool:
        """Whether the device was lost (DeviceLostError): rebuild() makes a working session."""
        return self._objects.lost

    @property
    def closed(self) -> bool:
        """Whether close() was called."""
        return self._objects.closed

    @property
    def tier(self) -> str:
        """"quick" while a quick_start Session runs its quick tier, then "tuned"."""
        return self._table.tier

    @property
    def kernels(self) -> dict:
        """Kernel index -> (compute pipeline, bind group layout), of the tier that runs."""
        return self._table.kernels

    @property
    def programs(self) -> dict:
        """Program -> the steps record() encodes; waits for the training state (`training_ready`)."""
        if self._training is not None and not self.closed:
            self._training.join()
        return self._table.steps

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

    # ---------------------------------------------------------------- running
    def record(self, encoder, program: str, start: int = 0, stop: int | None = None, pass_kwargs=None):
        """Encode dispatches [start, stop) of `program` as one compute pass into `encoder`.

        The host decides where the pass sits between its render passes; nothing is submitted.

        Args:
            encoder: the host's `wgpu.GPUCommandEncoder`.
            program: "infer", "train_step", or another program of the package.
            start: the first dispatch (a program cut into chunks across frames records a range
                each frame; dispatch_count() tells how many there are).
            stop: one past the last dispatch; None: to the end.
            pass_kwargs: keyword arguments of `begin_compute_pass` (e.g. timestamp_writes).
        """
        steps = self._steps(program)[start:stop]
        with self._objects.guard(f"recording {program}"):
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
        return len(self._program(program).dispatches)

    def wait_tuned(self, timeout: float | None = None) -> None:
        """Wait (up to `timeout` seconds: TimeoutError) until the tuned kernels run, where a
        quick_start Session began on its quick tier; raises what stopped them (the Session
        then runs on with its quick tier)."""
        if self._tuned is not None:
            self._tuned.wait(timeout)

    def _program(self, program):
        """The manifest's `program` (a records.Program); RuntimeError once closed, KeyError naming those it has."""
        if self.closed:
            raise RuntimeError("this session was closed")
        programs = self._manifest.programs
        if program not in programs:
            raise KeyError(f"no program {program!r} in this package; it has {sorted(programs)}")
        return programs[program]

    def _steps(self, program):
        steps = self._table.steps.get(program)
        if steps is None or self.closed:
            self._program(program)  # (closed, or no such program)
            self._training.wait()  # (train_step: or raises what stopped it, e.g. GPUOutOfMemoryError)
            return self._table.steps[program]
        return steps

    def write_inputs(self, program: str, inputs: dict, rows: int | None = None, check_finite: bool = True):
        """Upload inputs (after checking them) for the next run or record() of `program`.

        Args:
            program: the program whose inputs these are.
            inputs: input name -> array, every input of the program.
            rows: how many rows of the batch are real (the rest: padding); None: all.
            check_finite: refuse float inputs holding NaN or infinity.
        """
        p = self._manifest.programs[program]
        given, public = set(inputs), set(p.public_inputs)
        if given - public:
            raise ValueError(f"{program}: unknown inputs {sorted(given - public)}; it takes {sorted(public)}")
        if public - given:
            raise ValueError(f"{program}: missing inputs {sorted(public - given)}; it takes {sorted(public)}")
        arrays = {name: coerce(name, inputs[name], p.inputs[name], check_finite) for name in p.public_inputs}
        with self._objects.guard(f"uploading the inputs of {program}"):
            for name, t in p.inputs.items():
                if name == p.row_mask:
                    n = t.shape[0]
                    mask = np.zeros(n, np.float32)
                    mask[: (n if rows is None else rows)] = 1.0
                    self._objects.write(t, mask)
                else:
                    self._objects.write(t, arrays[name])

    def run(self, program: str, inputs: dict, check_finite: bool = True) -> dict:
        """Run `program` on `inputs` (name -> array) and return its outputs (name -> array).

        A batch smaller than the compiled one is padded (and, for training, masked out
        of the loss); a larger one is split into several runs of `infer`. A training step
        whose loss or gradients are not finite, or whose labels on the GPU fall outside the
        classes, or whose every row is ignored, changes nothing (see `skipped_steps`).

        Args:
            program: "infer", "train_step", or another program of the package.
            inputs: input name -> numpy array (for training, with `labels`).
            check_finite: refuse float inputs holding NaN or infinity.

        Returns:
            Output name -> numpy array (for a training step, `loss`).

        Raises:
            InputError: a name, shape, dtype or value the program cannot take (a label
                outside the classes, NaN unless `check_finite` is False, an empty batch);
                nothing ran and the weights are unchanged. A ValueError.
            KeyError: no such program.
            DeviceLostError: the device was lost.
        """
        p = self._program(program)
        b = self._manifest.batch_size
        inputs = check_batch(p, inputs, b, self._manifest.training, check_finite)
        n = rows(inputs)
        if b is None or n is None or n == b:
            self.write_inputs(program, inputs, check_finite=False)  # (checked above)
            return self._execute(program)
        outs = []
        for s in range(0, n, b):
            part = {k: pad(v, s, b) for k, v in inputs.items()}
            self.write_inputs(program, part, rows=min(b, n - s), check_finite=False)
            outs.append(self._execute(program))
        return {k: np.concatenate([o[k] for o in outs])[:n] if np.ndim(outs[0][k]) else outs[0][k]
                for k in outs[0]}

    def _execute(self, program):
        with self._objects.guard(f"running {program}"):
            out = self._submit_and_read(program)
        if "loss" in out and not np.isfinite(out["loss"]).all() and self._skip_counter is None:
            raise FloatingPointError(f"{program}: the loss is {out['loss']} (not finite) and this package was "
                                     "compiled without skip_nonfinite, so the weights took the step")
        return out

    def _submit_and_read(self, program):
        """Submit the program with copies of its outputs into mappable buffers; wait; read.

        The command buffer for the next call of the same program is recorded while the GPU
        runs this one, so that a synchronous call waits for little more than the GPU
        (bench/results/2026-12-03-h200-sync-call.md)."""
        staged = self._staged(program)
        steps = self._steps(program)
        ready = self._ready.pop(program, None)
        cb = ready[1] if ready is not None and ready[0] is steps else self._commands(program, staged)
        self.device.queue.submit([cb])
        self._ready[program] = (steps, self._commands(program, staged))
        out = {}
        for buf, name, t, size in staged:
            buf.map_sync(self._objects.wgpu.MapMode.READ)
            data = np.frombuffer(buf.read_mapped(0, -(-size // 8) * 8), dtype=t.np_dtype)
            out[name] = as_source(t, data[:t.count].reshape(t.shape).copy())
            buf.unmap()
        return out

    def _staged(self, program) -> list:
        """[(mappable buffer, output name, tensor, bytes)] for the program's outputs, made once."""
        wgpu, staged = self._objects.wgpu, []
        for name, t in self._manifest.programs[program].outputs.items():
            size = max(4, t.count * 4)
            key = (program, name)
            if key not in self._staging:
                self._staging[key] = self.device.create_buffer(
                    size=-(-size // 8) * 8, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
            staged.append((self._staging[key], name, t, size))
        return staged

    def _commands(self, program, staged):
        """The program's dispatches, then its outputs copied into `staged`, as a command buffer.
        (A command buffer holds no input data: inputs are written to the queue before it runs.)"""
        enc = self.device.create_command_encoder()
        self.record(enc, program)
        for buf, _, t, size in staged:
            enc.copy_buffer_to_buffer(self.buffers[t.buffer], t.offset, buf, 0, -(-size // 4) * 4)
        return enc.finish()

    @property
    def skipped_steps(self) -> int:
        """Training steps rejected on the GPU, weights untouched: a loss or gradient NaN/inf, a
        label outside the classes (written on the GPU), or a batch whose every row is ignored."""
        if self._skip_counter is None:
            return 0
        return int(self.read_tensor(SKIPPED, "state"))

    def readback(self, program: str, output: str, depth: int = 3):
        """A non-blocking reader of one output: results arrive frames later, never a stall.

        Record it after the program each frame (`rb.record(encoder)`, then `rb.submitted()`
        once the encoder is submitted; FrameScheduler.readback() does both) and take the
        newest finished value with `rb.poll()` (None until one has arrived).

        Args:
            program: the program that writes the output.
            output: the output's name.
            depth: how many copies are in flight at most (map_async ring buffers).

        Returns:
            A Readback (runtime/readback.py).
        """
        from .readback import Readback

        return Readback(self, program, output, depth)
