"""Compile time of every full-size configuration (random weights), inference and a whole
AdamW training step, split into graph work and package writing. CPU only.

    python bench/compile_times.py [--only NAME ...] [--repeat N] [--out DIR]

--repeat N keeps each model's fastest of N compiles (on a shared machine the others'
load comes and goes). cpu_s is this process's CPU time: the weights' hash and copies run
on threads beside the graph work, so on two idle cores it exceeds compile_s.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def workloads():
    from meganeura.compiler import TrainConfig
    from meganeura.compiler.models import dinov2, llama, mlp, resnet, unet, whisper

    mse = TrainConfig(loss="mse", optimizer="adamw")
    ce = TrainConfig(loss="cross_entropy", optimizer="adamw")
    yield "MLP 64-128-10 (b64)", lambda: mlp.mlp([64, 128, 10], batch=64), ce
    yield "ResNet-18 224 (b1)", lambda: resnet.resnet18(batch=1), ce
    yield "ResNet-50 224 (b1)", lambda: resnet.resnet50(batch=1), ce
    yield "DINOv2 ViT-S/14 224 (b1)", lambda: dinov2.dinov2(dinov2.dinov2_vits14_config()), mse
    yield "Whisper-tiny encoder 3000 frames", lambda: whisper.whisper_encoder(whisper.whisper_tiny_encoder_config()), mse
    yield "SmolLM2-135M seq 256", lambda: llama.llama(llama.smollm2_135m_config(), seq=256), mse
    try:
        from meganeura.compiler.models import smolvla

        yield "SmolVLA action expert", lambda: smolvla.smolvla_expert(smolvla.smolvla_expert_config()), mse
    except (ImportError, AttributeError):
        pass
    yield "SD-1.5 U-Net 64x64 latent", lambda: unet.unet(unet.full_size_config()), mse


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", default="out/bench")
    ap.add_argument("--no-reserve", action="store_true",
                    help="experiment: no early Reservation of the package bytes (pages touched at the end)")
    ap.add_argument("--populate-threads", type=int, help="experiment: threads that fault in the reserved pages")
    ap.add_argument("--populate-step", type=int, help="experiment: MiB per madvise call faulting them in")
    ap.add_argument("--bench-workload", help="experiment: compile bench/run.py's workload NAME (its PyTorch twin "
                                             "held in this process, as the bench does), printing each stage")
    args = ap.parse_args(argv)
    if args.bench_workload:
        return _in_bench_process(args.bench_workload, args.repeat)
    from meganeura.compiler.package import blob
    from meganeura.compiler import compile_model
    from meganeura.compiler import compile as compile_module

    if args.no_reserve:
        compile_module.estimated_package_bytes = lambda model: 0
    if args.populate_threads:
        blob.POPULATE_THREADS = args.populate_threads
    if args.populate_step:
        blob.POPULATE_STEP = args.populate_step << 20

    rows = []
    for name, build, train in workloads():
        if args.only and not any(o.lower() in name.lower() for o in args.only):
            continue
        t = time.perf_counter()
        model = build()
        built = time.perf_counter() - t
        best = None
        for _ in range(args.repeat):
            marks = {}
            t, cpu = time.perf_counter(), time.process_time()
            data = compile_model(model, train, progress=lambda stage, marks=marks: marks.setdefault(stage, time.perf_counter()))
            total, end = time.perf_counter() - t, time.perf_counter()
            cpu = time.process_time() - cpu
            write = end - marks.get("write package", end)
            size = len(data)
            del data
            if best is None or total < best[0]:
                best = (total, write, cpu)
        total, write, cpu = best
        params = sum(v.size for v in model.params.values())
        rows.append({"model": name, "parameters": int(params), "build_s": built, "compile_s": total,
                     "graph_s": total - write, "write_s": write, "cpu_s": cpu, "package_mb": size / 2**20})
        print(f"{name:34s} {params / 1e6:8.1f} M params  compile {total:6.2f} s "
              f"(graph {total - write:5.2f} s, writing {write:5.2f} s, cpu {cpu:5.2f} s)  {size / 2**20:8.1f} MiB",
              flush=True)
        del model
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compile_times.json").write_text(json.dumps(rows, indent=1))


def _in_bench_process(name: str, repeat: int):
    """Compile as bench/run.py does (its twin and weights in memory), `repeat` times."""
    import gc
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    import models  # noqa: F401  (registers the bench's workloads)
    from workloads import WORKLOADS

    from meganeura.compiler import compile_model

    case = WORKLOADS[name]()
    gc.collect()
    for _ in range(repeat):
        marks = {}
        t, cpu = time.perf_counter(), time.process_time()
        data = compile_model(case.model, case.train, share_scratch=True,
                             progress=lambda stage, marks=marks: marks.setdefault(stage, time.perf_counter()))
        end = time.perf_counter()
        stages, last = [], t
        for stage, at in list(marks.items()) + [("end", end)]:
            stages.append(f"{at - last:.2f}")
            last = at
        print(f"{name}: compile {end - t:.2f} s, cpu {time.process_time() - cpu:.2f} s; stages "
              + " / ".join(f"{s}" for s in stages) + f" ({', '.join(marks)}, end)", flush=True)
        del data


if __name__ == "__main__":
    main()
