"""A checked manifest as typed records, parsed once after its validation (runtime/manifest_checks.py):
nothing after the checks reads the msgpack maps by string.

In two parts, as the checks are: a BufferPlan (buffers, tensors, what the device must offer), which
making and filling the buffers needs; then the Manifest (kernels, programs, batch, training) around it.
Records are frozen dataclasses; the small values that key dictionaries (a binding, a launch, a
layout's or a bind group's key) are named tuples: thousands are made and hashed at each load.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .format import DTYPES


# element types a package may record as an input's or output's source type, by the tensor's dtype
SOURCE_DTYPES = {"f32": ("float16", "bfloat16", "bool", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                         "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn"),
                 "i32": ("int8", "uint8", "int16", "uint16", "uint32", "int64", "uint64", "bool", "int4", "uint4",
                         "int2", "uint2")}


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of the package: what it holds and where (a buffer, a byte offset into it)."""

    name: str
    role: str  # input, param, state, constant or output
    dtype: str  # f32, i32, or f16 (parameters only)
    shape: tuple[int, ...]
    buffer: int
    offset: int = 0
    init: str | None = None  # zeros or blob (an output's says nothing: "none", or absent)
    program: str | None = None  # an output's program
    grouped: bool = False  # placed at an offset of its own: a parameter group's member, sharing a buffer
    # an input's or output's element type in the source model, where it differs from `dtype`
    # (float16, bfloat16, int64, uint8, bool, ...: SOURCE_DTYPES): a Session converts there
    source: str | None = None

    @property
    def count(self) -> int:
        """Values it holds (a Python int: no wrap-around)."""
        return math.prod(self.shape)

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(DTYPES[self.dtype])

    @property
    def nbytes(self) -> int:
        return self.count * self.np_dtype.itemsize


class LayoutKey(NamedTuple):
    """What a bind group layout depends on: each storage binding's access, and how many lifted sizes
    the kernel reads from its uniform buffer (runtime/lifted_sizes.py)."""

    access: tuple[str, ...]
    lifted: int


@dataclass(frozen=True, slots=True)
class KernelInfo:
    wgsl: str
    entry: str
    label: str
    workgroup_size: tuple[int, int, int]
    layout: LayoutKey

    @property
    def access(self) -> tuple[str, ...]:
        return self.layout.access


class Binding(NamedTuple):
    """A dispatch's storage binding: a buffer whole (size None), or `size` bytes of it from `offset`."""

    buffer: int
    offset: int = 0
    size: int | None = None


class Launch(NamedTuple):
    """What a variant of a dispatch sets: its kernel, its workgroup count and its lifted sizes."""

    kernel: int
    workgroups: tuple[int, int, int]
    lifted: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, eq=False)
class Dispatch:
    launch: Launch  # as compiled: the GPU's tuned kernel
    bindings: tuple[Binding, ...]
    variants: Mapping[str, Launch]  # device class ("cpu", "gpu") or QUICK -> its own launch

    @property
    def kernel(self) -> int:
        return self.launch.kernel

    def as_variant(self, variant: str) -> Launch:
        """The launch a device running `variant` makes: its own where it has one, else the dispatch's."""
        return self.variants.get(variant, self.launch)


class BindGroupKey(NamedTuple):
    """What a bind group depends on: its layout, its bindings and the slice of lifted sizes it binds
    (pooled scratch makes many dispatches bind alike: they share one group)."""

    layout: LayoutKey
    bindings: tuple[Binding, ...]
    lifted: tuple[int, ...]


@dataclass(frozen=True, slots=True, eq=False)
class Program:
    name: str
    inputs: Mapping[str, TensorInfo]
    outputs: Mapping[str, TensorInfo]
    dispatches: tuple[Dispatch, ...]
    scratch_peak_bytes: int
    row_mask: str | None = None  # the hidden input that masks a batch's padded rows

    @property
    def public_inputs(self) -> list[str]:
        """The inputs a caller gives (all but the row mask)."""
        return [name for name in self.inputs if name != self.row_mask]


@dataclass(frozen=True, slots=True)
class Adapter:
    """One LoRA adapter: parameters `a` [rank, in] and `b` [out, rank] beside the frozen `weight`."""

    module: str  # PEFT's name of the adapted module
    weight: str
    a: str
    b: str
    transposed: bool  # the weight is stored [in, out], not PyTorch's [out, in]


@dataclass(frozen=True, slots=True)
class Lora:
    rank: int
    alpha: float
    adapters: tuple[Adapter, ...]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """How the compiler fit the training step into a memory budget (bytes; FLOPs per step)."""

    budget: int
    peak_bytes: int  # the step's buffers
    unbudgeted_peak_bytes: int  # the same step's without recomputation
    rematerialised: int  # forward values recomputed in the backward pass instead of kept
    rematerialised_bytes: int
    extra_flops: int  # the recomputation's
    step_flops: int  # the unbudgeted step's


MEMORY_FIELDS = ("budget", "peak_bytes", "unbudgeted_peak_bytes", "rematerialised", "rematerialised_bytes",
                 "extra_flops", "step_flops")


@dataclass(frozen=True, slots=True)
class Training:
    loss: str
    optimizer: str
    lr: float
    frozen: tuple[str, ...]
    ignore_index: int | None = None  # cross-entropy: labels equal to it leave the loss (None: no such label)
    classes: int | None = None  # cross-entropy: labels lie in [0, classes)
    lora: Lora | None = None  # the LoRA adapters, the only parameters it trains
    memory: MemoryBudget | None = None  # the memory budget it was compiled for


@dataclass(frozen=True, slots=True)
class BlobChecksum:
    """The weights blob's checksums: a CRC-32 per `chunk_bytes` of it, 4 bytes big-endian each in `values`."""

    chunk_bytes: int
    values: bytes


@dataclass(frozen=True, slots=True, eq=False)
class BufferPlan:
    """The buffers and the tensors in them, and what the package requires of a device."""

    format_version: int
    compiler_version: str
    buffers: tuple[int, ...]  # bytes of each
    tensors: tuple[TensorInfo, ...]
    buffer_bytes: int
    shared_scratch: bool
    features: tuple[str, ...]
    limits: Mapping[str, int]
    checksum: BlobChecksum

    def tensor(self, name: str, role: str) -> TensorInfo | None:
        for t in self.tensors:
            if t.name == name and t.role == role:
                return t
        return None

    def param_names(self) -> list[str]:
        return [t.name for t in self.tensors if t.role == "param"]

    def stored(self) -> list[TensorInfo]:
        """The tensors whose values the weights blob holds (parameters, constants, initial state)."""
        return [t for t in self.tensors if t.role in ("param", "state", "constant") and t.init == "blob"]


@dataclass(frozen=True, slots=True)
class SharedInitializer:
    """A weight of the source file that several nodes read: "split" into the parameters the
    source model kept apart (its exporter merged equal values), or kept "tied" as one."""

    action: str  # "split" | "tied"
    initializer: str  # the source file's name for it
    params: tuple[str, ...]
    why: str


@dataclass(frozen=True, slots=True, eq=False)
class Manifest:
    plan: BufferPlan
    kernels: tuple[KernelInfo, ...]
    programs: Mapping[str, Program]
    batch_size: int | None
    training: Training | None
    initializers: tuple[SharedInitializer, ...] = ()  # what the compiler split or kept tied

    @property
    def tensors(self) -> tuple[TensorInfo, ...]:
        return self.plan.tensors

    @property
    def buffers(self) -> tuple[int, ...]:
        return self.plan.buffers

    def kernels_of(self, variant: str, programs=None) -> set[int]:
        """The kernels a device running `variant` makes pipelines of (for `programs`, names: default all)."""
        return {d.as_variant(variant).kernel for name, p in self.programs.items()
                if programs is None or name in programs for d in p.dispatches}

    def lifted_values(self) -> set[tuple[int, ...]]:
        """Every distinct tuple of lifted sizes the dispatches (and their variants) carry."""
        return {launch.lifted for p in self.programs.values() for d in p.dispatches
                for launch in (d.launch, *d.variants.values()) if launch.lifted}


def parse_plan(m: dict) -> BufferPlan:
    """The BufferPlan of a manifest that manifest_checks.check_layout has passed."""
    tensors = tuple(TensorInfo(t["name"], t["role"], t["dtype"], tuple(t["shape"]), t["buffer"], t.get("offset", 0),
                               t.get("init"), t.get("program"), "offset" in t, t.get("source"))
                    for t in m["tensors"])
    memory, requires, ck = m["memory"], m["requires"], m["blob_checksum"]
    return BufferPlan(m["format_version"], m["compiler_version"], tuple(m["buffers"]), tensors,
                      memory["buffer_bytes"], memory.get("shared_scratch", False), tuple(requires["features"]),
                      dict(requires["limits"]), BlobChecksum(ck["chunk_bytes"], ck["values"]))


def parse_manifest(m: dict, plan: BufferPlan | None = None) -> Manifest:
    """The Manifest of a manifest that every check has passed (`plan`: its BufferPlan, if parsed already)."""
    plan = plan if plan is not None else parse_plan(m)
    kernels = tuple(KernelInfo(k["wgsl"], k["entry"], k.get("label", ""), tuple(k["workgroup_size"]),
                               LayoutKey(tuple(k["access"]), k.get("lifted", 0))) for k in m["kernels"])
    bound = {}  # a dispatch's buffers (bound whole) -> its bindings: one tuple for the many that bind alike
    programs = {name: _program(name, p, plan.tensors, bound) for name, p in m["programs"].items()}
    train = m.get("training")
    training = None if train is None else Training(train["loss"], train["optimizer"], train["lr"],
                                                   tuple(train["frozen"]), train.get("ignore_index"),
                                                   train.get("classes"), _lora(train.get("lora")),
                                                   _memory(train.get("memory")))
    batch = m.get("batch")
    shared = tuple(SharedInitializer(n["action"], n["initializer"], tuple(n["params"]), n["why"])
                   for n in m.get("initializers", ()))
    return Manifest(plan, kernels, programs, None if batch is None else batch["size"], training, shared)


def _program(name: str, p: dict, tensors: tuple, bound: dict) -> Program:
    dispatches = []
    for d in p["dispatches"]:
        ranges = d.get("ranges")
        if ranges is None:
            buffers = tuple(d["buffers"])
            bindings = bound.get(buffers)
            if bindings is None:
                bindings = bound[buffers] = tuple(Binding(b) for b in buffers)
        else:
            bindings = tuple(Binding(b) if r is None else Binding(b, r[0], r[1]) for b, r in zip(d["buffers"], ranges))
        lifted = d.get("lifted")
        launch = Launch(d["kernel"], tuple(d["workgroups"]), tuple(lifted) if lifted else ())
        variants = d.get("variants")
        dispatches.append(Dispatch(launch, bindings, {cls: _launch(v) for cls, v in variants.items()} if variants
                                   else _NO_VARIANTS))
    return Program(name, {k: tensors[i] for k, i in p["inputs"].items()},
                   {k: tensors[i] for k, i in p["outputs"].items()}, tuple(dispatches), p["scratch_peak_bytes"],
                   p.get("row_mask"))


def _memory(memory: dict | None) -> MemoryBudget | None:
    return None if memory is None else MemoryBudget(**{k: int(memory[k]) for k in MEMORY_FIELDS})


def _lora(lora: dict | None) -> Lora | None:
    if lora is None:
        return None
    return Lora(lora["rank"], float(lora["alpha"]), tuple(Adapter(a["module"], a["weight"], a["a"], a["b"],
                                                                  a["transposed"]) for a in lora["adapters"]))


_NO_VARIANTS = {}  # (shared by every dispatch without variants: never written)


def _launch(v: dict) -> Launch:
    lifted = v.get("lifted")
    return Launch(v["kernel"], tuple(v["workgroups"]), tuple(lifted) if lifted else ())
