"""A big package's first launch against PyTorch putting the same weights on the GPU, in fresh
processes, side by side: a package's weights blob is a safetensors file, so PyTorch loads those
very bytes (`safetensors.torch.load_file(device="cuda")`, its CUDA context made first, as a
game's device is) while meganeura makes a whole Session of the package (`quick_start=True`, its
driver warmed as in first_launch_timeline.py, the shader cache empty): every pipeline compiled,
the weights checked and written. `weights_on_gpu_s` adds the wait until the GPU has copied them
(a 4-byte readback: the first run of a Session waits so). The file is in the page cache for both
(compiled just before, read once for PyTorch).

    python bench/weights_to_gpu.py [--only SD-1.5] [--repeat 3] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def torch_child(weights: str) -> dict:
    import safetensors.torch
    import torch

    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    tensors = safetensors.torch.load_file(weights, device="cuda")
    torch.cuda.synchronize()
    return {"weights_on_gpu_s": round(time.perf_counter() - t, 4), "tensors": len(tensors),
            "bytes": sum(v.numel() * v.element_size() for v in tensors.values()), "torch": torch.__version__}


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
    return {"session_s": round(session_s, 4), "weights_on_gpu_s": round(on_gpu, 4)}


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

    rows = []
    for name, path in compiled_packages(args.only):
        blob = Path(path).with_suffix(".safetensors")
        with open(path, "rb") as f:  # (docs/PACKAGE.md: magic, version, manifest length, manifest, blob length, blob, sha256)
            data = f.read()
        (man_len,) = struct.unpack_from("<Q", data, 12)
        (blob_len,) = struct.unpack_from("<Q", data, 20 + man_len)
        blob.write_bytes(data[28 + man_len:28 + man_len + blob_len])
        del data
        try:
            for r in range(args.repeat):
                for who, flag, target in (("torch", "--torch-child", blob), ("meganeura", "--meganeura-child", path)):
                    with tempfile.TemporaryDirectory() as cache:
                        env = dict(os.environ, __GL_SHADER_DISK_CACHE_PATH=cache)
                        out = subprocess.run([sys.executable, __file__, flag, str(target)], env=env,
                                             capture_output=True, text=True)
                    if out.returncode:
                        print(out.stderr[-3000:], file=sys.stderr)
                        raise SystemExit(f"{name}: the {who} child failed")
                    row = {"workload": name, "who": who, "run": r, **json.loads(out.stdout.splitlines()[-1])}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        finally:
            blob.unlink()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "weights_to_gpu.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
