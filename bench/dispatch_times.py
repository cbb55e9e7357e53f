"""GPU time of every dispatch of a full-size workload's program, by index (timestamp queries,
one compute pass per dispatch), for reading beside the same package compiled elsewhere
(compiles are deterministic: dispatch i is the same kernel on any machine).

    python bench/dispatch_times.py ResNet [--program train_step] [--out DIR]

NAME picks a workload of bench/plan_stats.py by substring (random weights, no PyTorch).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name")
    ap.add_argument("--program", default="train_step")
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    from plan_stats import workloads
    from profile_program import profile

    from meganeura.compiler import compile_model
    from meganeura.runtime import Package, Session

    name, build, train = next(w for w in workloads() if args.name.lower() in w[0].lower())
    data = compile_model(build(), train, share_scratch=True)
    session = Session(None, Package.from_bytes(data))
    rng = np.random.default_rng(0)
    prog = session.package.programs[args.program]
    inputs = {}
    for key, ti in prog["inputs"].items():
        t = session.tensors[ti]
        if key == prog.get("row_mask"):
            continue  # hidden: the runtime fills it
        inputs[key] = (rng.integers(0, 2, t["shape"]) if t["dtype"] == "i32" else rng.standard_normal(t["shape"]))
    session.run(args.program, inputs)
    rows = profile(session, args.program)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dispatch_times.json").write_text(json.dumps(
        {"workload": name, "program": args.program, "package_sha256": hashlib.sha256(data).hexdigest(),
         "dispatches": [{"ms": ms, "label": label, "workgroups": list(wg)} for ms, label, wg in rows]}))
    print(f"{name} {args.program}: {sum(r[0] for r in rows):.3f} ms in {len(rows)} dispatches")


if __name__ == "__main__":
    main()
