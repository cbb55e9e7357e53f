"""A big package's first launch against PyTorch putting the same weights on the GPU, in fresh
processes, side by side: a package's weights blob is a safetensors file, so PyTorch loads those
very bytes (`safetensors.torch.load_file(device="cuda")`, its CUDA context made first, as a
game's device is) while meganeura makes a whole Session of the package (`quick_start=True`, its
driver warmed as in first_launch_timeline.py, the shader cache empty): the quick tier's
pipelines compiled, the weights checked and written (`session_s`). `weights_on_gpu_s` is when a
4-byte readback after it returns (the first run of a Session waits so): an upper bound on when
the GPU has copied the weights, as a training package's training state and the tuned tier are
being made beside it. Both read from the page cache: the package was just compiled and written,
the blob just written out of it (and synced). The two alternate which goes first each round.

    python bench/weights_to_gpu.py [--only SD-1.5] [--repeat 3] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD_TIMEOUT_S = 600  # (a child that hangs on a driver stops the run)


def torch_child(weights: str) -> dict:
    import safetensors.torch
    import torch

    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    tensors = safetensors.torch.load_file(weights, device="cuda")
    torch.cuda.synchronize()
    return {"weights_on_gpu_s": round(time.perf_counter() - t, 4), "tensors": len(tensors),
            "bytes": sum(v.numel() * v.element_size() for v in tensors.values()), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name()}


def meganeura_child(package: str) -> dict:
    sys.path.insert(0, str(Path(__file__).parent))
    import driver_start

    from meganeura.runtime import Session
    from meganeura.runtime.device import default_device

    device = default_device()
    driver_start.warm(device)
    t = time.perf_counter()
    s = Session(device, package, quick_start=True)
    session_s = time.perf_counter() - t
    weights = next(t for t in s.tensors if t["init"] == "blob")["buffer"]
    device.queue.read_buffer(s.buffers[weights], 0, 4)  # (a submit and a wait: every write before it copied)
    on_gpu = time.perf_counter() - t
    s.close()
    import wgpu

    info = device.adapter.info
    return {"session_s": round(session_s, 4), "weights_on_gpu_s": round(on_gpu, 4), "wgpu": wgpu.__version__,
            "adapter": info.get("device", ""), "driver": info.get("description", "")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=["SD-1.5"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--torch-child", help=argparse.SUPPRESS)
    ap.add_argument("--meganeura-child", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="out/bench")
    args = ap.parse_args(argv)
    if args.torch_child or args.meganeura_child:
        print(json.dumps(torch_child(args.torch_child) if args.torch_child else meganeura_child(args.meganeura_child)))
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from load_profile import compiled_packages

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for name, path in compiled_packages(args.only):
            blob = Path(path).with_suffix(".safetensors")
            _write_blob(path, blob)
            try:
                for r in range(args.repeat):
                    pair = [("torch", "--torch-child", blob), ("meganeura", "--meganeura-child", path)]
                    for who, flag, target in pair[::1 if r % 2 == 0 else -1]:
                        with tempfile.TemporaryDirectory() as cache:
                            env = dict(os.environ, __GL_SHADER_DISK_CACHE_PATH=cache)
                            done = subprocess.run([sys.executable, __file__, flag, str(target)], env=env,
                                                  capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
                        if done.returncode:
                            print(done.stderr[-3000:], file=sys.stderr)
                            raise SystemExit(f"{name}: the {who} child failed")
                        row = {"workload": name, "who": who, "run": r, **json.loads(done.stdout.splitlines()[-1])}
                        print(json.dumps(row), flush=True)
                        rows.append(row)
            finally:
                blob.unlink()
    finally:  # (what was measured is kept, whatever stopped the rest)
        (out / "weights_to_gpu.json").write_text(json.dumps(
            {"command": " ".join([Path(__file__).name, *(argv if argv is not None else sys.argv[1:])]), "rows": rows},
            indent=1))


def _write_blob(package: Path, blob: Path) -> None:
    """The package's weights blob (a safetensors file) to its own file, synced; where it lies in
    the package, from the runtime's own reading of its head (checked as a Session checks it)."""
    from meganeura.runtime.package import _head

    with open(package, "rb") as f, open(blob, "wb") as out:
        def read(a, b):
            f.seek(a)
            return f.read(b - a)
        _, start, end = _head(read, os.fstat(f.fileno()).st_size)
        f.seek(start)
        for at in range(start, end, 64 << 20):  # (in pieces: a package can be gigabytes)
            out.write(f.read(min(64 << 20, end - at)))
        out.flush()
        os.fsync(out.fileno())

if __name__ == "__main__":
    main()
