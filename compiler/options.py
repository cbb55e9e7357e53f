"""CompileOptions: every choice of the compiler that a caller may change, in one frozen record.

Made once at the edge (compile_model's arguments, the command line, a test, bench/) and
passed down: a pass takes it as an argument, a kernel generator reads it from the Schedule
(`sched.options`). No module global changes what the compiler does.

    options = CompileOptions(weights="f16")
    variant = options.replace(gemm={"k_unroll": 4})   # a plan changes by the keys given
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from .codegen.plans import ATTENTION_BWD_PLAN, ATTENTION_PLAN, GEMM_PLAN

WEIGHT_TYPES = ("f32", "f16")
PLANS = {"gemm": GEMM_PLAN, "attention": ATTENTION_PLAN, "attention_backward": ATTENTION_BWD_PLAN}


def _plan(defaults: dict):
    return field(default_factory=lambda: MappingProxyType(dict(defaults)))


@dataclass(frozen=True)
class CompileOptions:
    """How to compile. The defaults are the measured best (bench/README.md); the switches
    exist for A/B runs in bench/ and for tests that reach every code path.

    Attributes:
        weights: "f16" stores the weights that only matmuls and convolutions read, and no
            training step updates, in half precision (the arithmetic stays f32).
        share_scratch: programs draw scratch buffers from one pool (less memory), for hosts
            that never run inference between the chunks of a training step.
        arenas: parameters, gradients and optimizer state in a few shared buffers (passes/
            arenas.py); False: a buffer each.
        arena_groups, arena_min_bytes: about how many groups a model's parameters make, and
            the bytes of a group at least (ir/groups.py). Larger groups mean fewer update
            kernels but pack worse into the scratch pool, whose buffers are whole
            (bench/REJECTED.md: parameter groups).
        pointwise_conv_as_matmul: 1x1 convolutions (stride 1, no padding, one group) and
            their input gradients run as batched matmuls.
        sink_chains: a kernel, with the producers only it reads, moves down to just before
            its first reader when no tensor then lives longer (passes/schedule.py).
        lift_sizes: the quick tier's kernels read their sizes from a buffer, so that kernels
            differing only in sizes share one pipeline (codegen/lift_sizes.py).
        quick_divisors: the quick tier lifts divisors too.
        merge_quick: the quick tier's small kernels merge into fewer pipelines
            (codegen/merge_quick.py).
        host_switch_interval: seconds between Python's thread switches while the weights are
            checksummed on threads (the compile's main thread then hands the GIL back sooner);
            None leaves the process's interval alone. Process-wide: the command line sets it.
        gemm, attention, attention_backward: tile plans of the kernel generators
            (codegen/plans.py); read-only mappings.
    """
    weights: str = "f32"
    share_scratch: bool = False
    arenas: bool = True
    arena_groups: int = 128
    arena_min_bytes: int = 1 << 20
    pointwise_conv_as_matmul: bool = True
    sink_chains: bool = True
    lift_sizes: bool = True
    quick_divisors: bool = True
    merge_quick: bool = True
    host_switch_interval: float | None = None
    gemm: Mapping = _plan(GEMM_PLAN)
    attention: Mapping = _plan(ATTENTION_PLAN)
    attention_backward: Mapping = _plan(ATTENTION_BWD_PLAN)

    def __post_init__(self):
        if self.weights not in WEIGHT_TYPES:
            raise ValueError(f"weights must be one of {WEIGHT_TYPES}, not {self.weights!r}")
        for name, defaults in PLANS.items():
            plan = dict(getattr(self, name))
            unknown = sorted(set(plan) - set(defaults))
            if unknown:
                raise ValueError(f"unknown {name} plan keys {unknown}; known: {sorted(defaults)}")
            object.__setattr__(self, name, MappingProxyType({**defaults, **plan}))

    def replace(self, **changes) -> CompileOptions:
        """A copy with `changes`; a plan given as a dict changes only the keys it holds."""
        for name in PLANS:
            if name in changes:
                changes[name] = {**getattr(self, name), **changes[name]}
        return dataclasses.replace(self, **changes)

    def __hash__(self):
        return hash(tuple(tuple(sorted(v.items())) if isinstance(v, Mapping) else v
                          for v in (getattr(self, f.name) for f in dataclasses.fields(self))))


DEFAULT = CompileOptions()
