"""DinoVision's per-frame ML time at 224x224, mono and stereo: meganeura's infer and
decoder-training programs against the same model in PyTorch eager (bench/dinovision_torch.py,
same weights), on the same GPU in one process. fp32, TF32 off. Sessions without shader
checks, as the demo makes them (it compiles its own package).

    python bench/dinovision.py [--out DIR] [--iters N] [--size 224]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from timing import time_program, time_torch  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/bench")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--half-backbone", action="store_true", help="the backbone's weights stored in f16")
    args = ap.parse_args(argv)
    import torch
    import wgpu

    from dinovision_torch import load
    from meganeura.demos.dinovision.app import load_backbone
    from meganeura.demos.dinovision.model import DemoConfig, compile_demo
    from meganeura.runtime import Package, Session
    from meganeura.runtime.device import default_device

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = default_device()
    weights = load_backbone()
    rows = []
    # warm the GPU's clocks and the driver's caches first, so the first row is not penalised
    warm = Session(device, Package.from_bytes(compile_demo(DemoConfig(height=args.size, width=args.size), weights)),
                   shader_checks=False)
    time_program(warm, "infer", {"pixel_values": np.zeros((1, 3, args.size, args.size), np.float32)}, iters=30)
    del warm
    for eyes in (1, 2):
        cfg = DemoConfig(height=args.size, width=args.size, eyes=eyes)
        t = time.perf_counter()
        data = compile_demo(cfg, weights, half_backbone=args.half_backbone)
        compile_s = time.perf_counter() - t
        session = Session(device, Package.from_bytes(data), shader_checks=False)  # as the demo runs it
        rng = np.random.default_rng(0)
        x = rng.standard_normal((eyes, 3, args.size, args.size)).astype(np.float32)
        lh, lw = cfg.label_shape
        labels = rng.integers(0, 7, eyes * lh * lw)
        session.run("infer", {"pixel_values": x})
        ours_infer = time_program(session, "infer", {"pixel_values": x}, iters=args.iters)
        ours_train = time_program(session, "train_decoder", {"labels": labels, "label_mask": np.ones(len(labels))},
                                  iters=args.iters)
        # the weights as the package holds them now (the backbone in f16 with --half-backbone)
        twin = load(cfg, {k: v.astype(np.float32) for k, v in session.weights().items()}, device="cuda")
        tx = torch.tensor(x, device="cuda")
        with torch.no_grad():  # the same computation? before torch's timed steps train its decoder
            theirs_logits = twin(tx).float().cpu().numpy()
        ours_logits = session.run("infer", {"pixel_values": x})["logits"]
        tl = torch.tensor(labels, device="cuda")
        params = [p for n, p in twin.named_parameters() if n.startswith("decoder.")]
        opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=1e-4)
        with torch.no_grad():
            feats = twin.features(tx)

        def infer():
            with torch.no_grad():
                return twin(tx)

        def train():
            opt.zero_grad(set_to_none=True)
            logits = twin.decode(feats, tx).permute(0, 2, 3, 1).reshape(-1, cfg.classes)
            torch.nn.functional.cross_entropy(logits, tl).backward()
            opt.step()

        theirs_infer = time_torch(infer, iters=args.iters)
        theirs_train = time_torch(train, iters=args.iters)
        row = {"eyes": eyes, "size": args.size, "compile_s": compile_s, "half_backbone": args.half_backbone,
               "package_mb": len(data) / 2**20, "gpu_mb": session.package.manifest["memory"]["buffer_bytes"] / 2**20,
               "logits_rel_err": float(np.abs(ours_logits - theirs_logits).max() / np.abs(theirs_logits).max()),
               "meganeura": {"infer": ours_infer, "train_step": ours_train},
               "torch": {"infer": theirs_infer, "train_step": theirs_train}}
        for k in ("infer", "train_step"):
            row[f"{k}_gpu_ratio"] = ours_infer["gpu_ms"] / theirs_infer["gpu_ms"] if k == "infer" else \
                ours_train["gpu_ms"] / theirs_train["gpu_ms"]
        frame_ours = ours_infer["gpu_ms"] + ours_train["gpu_ms"]
        frame_theirs = theirs_infer["gpu_ms"] + theirs_train["gpu_ms"]
        row["frame_gpu_ms"] = {"meganeura": frame_ours, "torch": frame_theirs, "ratio": frame_ours / frame_theirs}
        rows.append(row)
        print(json.dumps(row), flush=True)
    info = {"date": time.strftime("%Y-%m-%d"), "gpu": device.adapter.info["device"],
            "driver": device.adapter.info.get("description", ""), "wgpu": wgpu.__version__, "torch": torch.__version__}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dinovision.json").write_text(json.dumps({"info": info, "rows": rows}, indent=1))
    lines = [f"# DinoVision per-frame ML at {args.size}x{args.size}: {info['gpu']} ({info['driver']}), "
             f"wgpu {info['wgpu']}, torch {info['torch']}, fp32, TF32 off, {info['date']}", "",
             "| eyes | program | meganeura GPU ms | torch GPU ms | ratio | meganeura wall ms | torch wall ms | dispatches |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for k in ("infer", "train_step"):
            m, t = r["meganeura"][k], r["torch"][k]
            lines.append(f"| {r['eyes']} | {k} | {m['gpu_ms']:.3f} | {t['gpu_ms']:.3f} | {m['gpu_ms'] / t['gpu_ms']:.2f} | "
                         f"{m['wall_ms']:.3f} | {t['wall_ms']:.3f} | {m['dispatches']} |")
        f = r["frame_gpu_ms"]
        lines.append(f"| {r['eyes']} | frame (infer + 1 step) | {f['meganeura']:.3f} | {f['torch']:.3f} | {f['ratio']:.2f} | | | |")
    (out / "dinovision.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
