"""Soak: render, inference and training in the offscreen host for many frames, watching
process memory and wgpu's live object counts. CI runs a reduced count (test_soak.py);
the full run is

    XDG_RUNTIME_DIR=/tmp/xdg .venv/bin/python tests/engine_bridge/soak.py --frames 20000
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def wgpu_objects() -> dict:
    import wgpu

    counts = wgpu.diagnostics.object_counts.get_dict()
    return {k: v["count"] for k, v in counts.items() if k != "total"}


def run_soak(frames: int, warm: int | None = None, budget_ms: float = 50.0) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from offscreen import H, W, colour_batches, colour_model

    from meganeura.engine_bridge import FrameScheduler, OffscreenHost, PatternScene, TensorOverlay, TextureInput
    from meganeura.runtime import Session

    host = OffscreenHost((160, 120))
    session = Session(host.device, colour_model())
    scene = PatternScene(host.device, (64, 64))
    feed = TextureInput(session, scene.texture, size=(H, W))
    overlay = TensorOverlay(session, "logits", size=(H, W))
    sched = FrameScheduler(session, budget_ms, before=[feed], after=[overlay])
    logits = sched.readback("logits")
    sched.train(colour_batches())
    sched.warm_up()
    # measured from when the scheduler's bounded per-frame statistics (its `history`) are full
    warm = warm if warm is not None else max(frames // 10, sched.stats.maxlen + 50)
    samples, results, start = [], 0, time.perf_counter()
    while sched.frame < frames:
        enc = host.device.create_command_encoder()
        scene.draw(enc, sched.frame / 60)
        sched.record(enc)
        overlay.composite(enc, host.texture(), background=scene.texture)
        sched.submit(enc)
        results += logits.poll() is not None
        if sched.frame in (warm, frames) or sched.frame % max(frames // 20, 1) == 0:  # every 5%
            gc.collect()
            samples.append({"frame": sched.frame, "rss": rss_bytes(), "objects": wgpu_objects()})
    sched.close()
    first = next(s for s in samples if s["frame"] >= warm)
    last = samples[-1]
    return {"frames": frames, "seconds": round(time.perf_counter() - start, 1), "train_steps": sched.steps_done,
            "readbacks": results, "skipped_steps": session.skipped_steps,
            "rss_warm_mb": round(first["rss"] / 2**20, 1), "rss_end_mb": round(last["rss"] / 2**20, 1),
            "rss_growth": (last["rss"] - first["rss"]) / first["rss"],
            "objects_warm": first["objects"], "objects_end": last["objects"], "samples": samples}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=20000)
    ap.add_argument("--out", help="write the result as JSON here")
    args = ap.parse_args(argv)
    result = run_soak(args.frames)
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
