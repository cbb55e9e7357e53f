"""The quick tier against the tuned one on full-size workloads: each package's Session made with
quick_start=True and its tuned kernels held back (they never swap in), then a plain Session; the
same random inputs through both: the infer output's max relative difference and the first two
training losses, with the tier each ran on. (The kernel-variant tests check the quick kernels
against float64 on small cases; this checks what a game's first launch runs.)

    OUT=out/bench python bench/quick_tier_check.py [NAME ...]   (default: DINOv2, ResNet-50, SmolLM2, Whisper)
"""
import json
import os
import sys
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from load_profile import compiled_packages  # noqa: E402

from meganeura.runtime import Package, Session  # noqa: E402
from meganeura.runtime.device import default_device  # noqa: E402
from meganeura.runtime.gpu_objects import GpuObjects  # noqa: E402


def _inputs(pkg) -> dict:
    """Random inputs for both programs (i32 ones below 1000: valid class ids and tokens)."""
    rng, inputs = np.random.default_rng(0), {}
    for prog in ("infer", "train_step"):
        for k, ti in pkg.programs[prog]["inputs"].items():
            t = pkg.tensors[ti]
            if k != pkg.programs[prog].get("row_mask"):
                inputs.setdefault(k, rng.integers(0, 1000, t["shape"]).astype(np.int32) if t["dtype"] == "i32"
                                  else rng.standard_normal(t["shape"]).astype(np.float32))
    return inputs


def main(only):
    gate, real = threading.Event(), GpuObjects.pipeline

    def held(self, i, k, counted=True):  # the tuned tier's compiles (on its pool's threads) wait for the gate
        if threading.current_thread().name.startswith("meganeura-tuned"):
            gate.wait()
        return real(self, i, k, counted)
    GpuObjects.pipeline = held
    dev, out = default_device(), []
    for name, path in compiled_packages(only or ["DINOv2", "ResNet-50 224 (b16", "SmolLM2", "Whisper"]):
        pkg = Package.load(path)
        inputs, res = _inputs(pkg), {}
        for tier in ("quick", "tuned"):
            s = Session(dev, pkg, device_class="gpu", quick_start=(tier == "quick"))  # (lavapipe too)
            try:
                assert s.tier == tier, (s.tier, tier)
                y = next(iter(s.run("infer", {k: v for k, v in inputs.items() if k in pkg.programs["infer"]["inputs"]}).values()))
                train = {k: v for k, v in inputs.items() if k in pkg.programs["train_step"]["inputs"]}
                res[tier] = (y, [float(s.run("train_step", train)["loss"]) for _ in range(2)], s.tier)
            finally:
                gate.set()  # (the held compiles finish, also after an error: no thread waits on; close() cancels the swap)
            s.close()
            gate.clear()
        yq, yt = res["quick"][0], res["tuned"][0]
        row = {"workload": name, "infer_rel_diff": float(np.abs(yq - yt).max() / max(1e-30, np.abs(yt).max())),
               "quick": [*res["quick"][1], res["quick"][2]], "tuned": [*res["tuned"][1], res["tuned"][2]]}
        print(json.dumps(row), flush=True)
        out.append(row)
    folder = Path(os.environ.get("OUT", "out/bench"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "quick_check.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
