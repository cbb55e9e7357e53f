"""The `meganeura` command: compile models into packages, and describe packages.

    meganeura compile MODEL.onnx -o OUT.mnpk [--train --loss cross_entropy|mse
        --optimizer sgd|adamw --lr LR [--freeze GLOB]...] [--batch N] [--weights f16]
    meganeura info OUT.mnpk
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path


def _progress(total: int, quiet: bool):
    """A callback advancing a progress bar on stderr, one tick per compiler stage."""
    if quiet:
        return lambda name: None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=total, desc="compiling", unit="stage", file=sys.stderr, leave=False,
               bar_format="{desc}: {bar:20} {n_fmt}/{total_fmt} {postfix}")

    def step(name):
        bar.set_postfix_str(name)
        bar.update(1)

    return step, bar.close


def cmd_compile(args) -> int:
    from .compile import compile_model
    from .onnx_import import load_onnx
    from .training import TrainConfig

    src = Path(args.model)
    if not src.is_file():
        print(f"meganeura: no such model file: {src}", file=sys.stderr)
        return 2
    if src.suffix.lower() != ".onnx":
        print(f"meganeura: {src.name}: only ONNX models (.onnx) compile from the command line; "
              "use the Python builder API for others", file=sys.stderr)
        return 2
    train = None
    if args.train:
        train = TrainConfig(loss=args.loss, optimizer=args.optimizer, lr=args.lr, freeze=args.freeze or [],
                            clip_norm=args.clip_norm, weight_decay=args.weight_decay)
    elif args.freeze:
        print("meganeura: --freeze only makes sense with --train", file=sys.stderr)
        return 2
    if args.weights == "f16" and args.train and not args.freeze and not args.quiet:
        print("meganeura: note: --weights f16 stores only weights that training does not update; with --train "
              "and no --freeze every weight trains and stays f32", file=sys.stderr)
    step, close = _progress(6 if train else 4, args.quiet)
    try:
        step("import ONNX")
        model = load_onnx(src, batch_size=args.batch)
        data = compile_model(model, train, source={"kind": "onnx", "file": src.name}, progress=step,
                             weights=args.weights)
    except (ValueError, NotImplementedError, KeyError) as exc:
        close()
        print(f"meganeura: cannot compile {src.name}: {exc}", file=sys.stderr)
        return 1
    close()
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=out.name, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:  # write then rename: a crash never leaves half a package
        f.write(data)
    os.replace(tmp, out)
    if not args.quiet:
        print(f"wrote {out} ({len(data)} bytes)")
    return 0


def cmd_info(args) -> int:
    from meganeura.runtime.package import Package, PackageError

    try:
        pkg = Package.load(args.package)
    except PackageError as exc:
        print(f"meganeura: {args.package}: {exc}", file=sys.stderr)
        return 1
    print(pkg.summary())
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="meganeura", description="Compile models for the meganeura runtime.")
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile an ONNX model into a .mnpk package")
    c.add_argument("model", help="the model, MODEL.onnx")
    c.add_argument("-o", "--output", required=True, help="the package to write, OUT.mnpk")
    c.add_argument("--train", action="store_true", help="also compile a training step (program train_step)")
    c.add_argument("--loss", choices=("cross_entropy", "mse"), default="cross_entropy")
    c.add_argument("--optimizer", choices=("sgd", "adamw"), default="adamw")
    c.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 0.001)")
    c.add_argument("--weight-decay", type=float, default=None,
                   help="weight decay (default: 0.01 for adamw as in PyTorch, 0 for sgd)")
    c.add_argument("--clip-norm", type=float, default=None, help="clip the global gradient norm")
    c.add_argument("--freeze", action="append", metavar="GLOB",
                   help="parameters whose names match GLOB get no gradient (repeatable)")
    c.add_argument("--batch", type=int, default=None,
                   help="batch size when the model's batch dimension is dynamic (default 64)")
    c.add_argument("--weights", choices=("f32", "f16"), default="f32",
                   help="f16: store the weights that only matmuls and convolutions read, and training does "
                        "not update, in half precision (half their bytes; the arithmetic stays f32)")
    c.add_argument("-q", "--quiet", action="store_true")
    c.set_defaults(fn=cmd_compile)
    i = sub.add_parser("info", help="describe a package")
    i.add_argument("package")
    i.set_defaults(fn=cmd_info)
    args = ap.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
