"""A Session's LoRA adapters (a package compiled with `--lora`): saved and loaded under PEFT's
names, so that they move between meganeura and PyTorch with PEFT, and merged into the weights
they adapt.

PEFT's names: `base_model.model.<module>.lora_A.weight` [rank, in] and `.lora_B.weight`
[out, rank]; a model's output is x W^T + (alpha / rank) x A^T B^T, both programs ("infer" too)
running the adapters.
"""
from __future__ import annotations

import numpy as np

from .checkpoint import safetensors_bytes, write_atomic
from .records import Lora

PREFIX = "base_model.model."


def peft_names(lora: Lora) -> dict:
    """PEFT's name of each adapter parameter -> its parameter name in the package."""
    return {f"{PREFIX}{a.module}.lora_{x}.weight": name for a in lora.adapters for x, name in (("A", a.a), ("B", a.b))}


class SessionAdapters:
    """Session's adapter methods, on its `_manifest` and SessionWeights' reads and writes."""

    @property
    def lora(self) -> Lora | None:
        """The package's LoRA adapters (rank, alpha, and each one's parameters), or None."""
        training = self._manifest.training
        return None if training is None else training.lora

    def _lora(self) -> Lora:
        if self.lora is None:
            raise ValueError("this package has no LoRA adapters (compile it with --train --lora RANK)")
        return self.lora

    def adapters(self) -> dict:
        """The adapters' values by PEFT's names."""
        return {peft: self.read_tensor(name) for peft, name in peft_names(self._lora()).items()}

    def save_adapters(self, path) -> None:
        """Write the adapters as safetensors under PEFT's names (what PEFT's save_pretrained writes
        into adapter_model.safetensors), atomically as save_weights; NaN/inf refused."""
        values = self.adapters()
        bad = [name for name, v in values.items() if not np.isfinite(v).all()]
        if bad:
            raise ValueError(f"not saving {path}: adapters {bad[:5]} hold NaN or infinity")
        write_atomic(path, safetensors_bytes(values))

    def load_adapters(self, path) -> None:
        """Load adapters saved by save_adapters or by PEFT (`.lora_A.default.weight` read as
        `.lora_A.weight`); every adapter of the package must be there, and nothing else."""
        from safetensors.numpy import load_file

        try:
            values = load_file(str(path))
        except Exception as exc:
            raise ValueError(f"cannot read adapters from {path}: {exc}") from None
        names = peft_names(self._lora())
        values = {k.replace(".default.weight", ".weight"): v for k, v in values.items()}
        unknown, missing = sorted(set(values) - set(names)), sorted(set(names) - set(values))
        if unknown or missing:
            raise ValueError(f"adapters do not match the package: missing {missing[:5]}, unknown {unknown[:5]}")
        self.set_weights({names[k]: v for k, v in values.items()}, strict=False)

    def merge_adapters(self) -> None:
        """Fold each adapter into its weight (W += alpha / rank * B @ A, transposed for a weight
        stored [in, out]) and zero its B: the model answers as before (to the weight's rounding,
        f16 for a package with f16 weights), with the adapters contributing nothing. The optimizer
        state is left as it is."""
        lora = self._lora()
        merged = {}
        for a in lora.adapters:
            low, high = self.read_tensor(a.a).astype(np.float64), self.read_tensor(a.b).astype(np.float64)
            w = self.read_tensor(a.weight)
            delta = lora.scale * (high @ low)
            delta = delta.T if a.transposed else delta
            if delta.shape != w.shape:
                raise ValueError(f"adapter {a.module}: B @ A is {list(delta.shape)}, its weight {list(w.shape)}")
            merged[a.weight] = (w.astype(np.float64) + delta).astype(w.dtype)
            merged[a.b] = np.zeros_like(high, np.float32)
        self.set_weights(merged, strict=False)
