"""The `meganeura` command: compile models into packages, and describe packages.

    meganeura compile MODEL.onnx -o OUT.mnpk [--train --loss cross_entropy|mse
        --optimizer sgd|adamw --lr LR [--freeze GLOB]... [--ignore-index N]
        [--lora RANK --lora-targets GLOB... [--lora-alpha A]] [--memory-budget SIZE]]
        [--batch N] [--weights f16]
    meganeura info OUT.mnpk
    meganeura --version

Bad arguments exit with status 2 and one line on stderr (a memory budget under the smallest
the training step reaches too, naming that one); a model that cannot compile,
status 1 and one line (a traceback only with MEGANEURA_DEBUG set in the environment).
"""
from __future__ import annotations

import argparse
import contextlib
import fnmatch
import math
import os
import sys
import tempfile
from pathlib import Path

from meganeura import __version__

from .ir.training import EXACT_INT, TrainConfig

DEFAULTS = TrainConfig()
# the options that shape the training step: given without --train, they are refused
TRAINING_OPTIONS = {"loss": "--loss", "optimizer": "--optimizer", "lr": "--lr", "weight_decay": "--weight-decay",
                    "clip_norm": "--clip-norm", "freeze": "--freeze", "ignore_index": "--ignore-index",
                    "lora_rank": "--lora", "lora_targets": "--lora-targets", "lora_alpha": "--lora-alpha",
                    "memory_budget": "--memory-budget"}


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (status 2), without the usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def _number(kind: str, ok, what: str):
    """An argparse type: a finite `kind` (int or float) for which ok(value) holds."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(value) or not ok(value):
            raise argparse.ArgumentTypeError(f"must be {what}, not {text}")
        return value
    return parse


def _size(text):
    """An argparse type: a memory size in bytes ('256MiB', '1.5GB', '1000000')."""
    from .passes.remat import parse_size
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _refuse(message: str) -> int:
    print(f"meganeura: {message}", file=sys.stderr)
    return 2


def _debugging() -> bool:
    return bool(os.environ.get("MEGANEURA_DEBUG"))


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


def _train_config(args) -> TrainConfig | None:
    """The TrainConfig the options ask for (None without --train); options not given keep
    TrainConfig's defaults."""
    if not args.train:
        return None
    given = {k: getattr(args, k) for k in TRAINING_OPTIONS if getattr(args, k) is not None}
    return TrainConfig(**given)


def _unmatched_freeze(patterns, params) -> str | None:
    """A refusal naming the first --freeze pattern that matches no parameter, else None."""
    names = sorted(params)
    for p in patterns:
        if not any(fnmatch.fnmatchcase(n, p) for n in names):
            some = ", ".join(names[:5]) + (f", ... ({len(names)} in all)" if len(names) > 5 else "")
            return f"--freeze {p!r} matches no parameter; the model's parameters are: {some or 'none'}"
    return None


def _unmatched_lora(model, patterns) -> str | None:
    """A refusal naming the first --lora-targets glob that matches no matmul weight (by its name,
    or the name of an ONNX node reading it), with the model's matmul weights; else None."""
    from .ir.lora import targets

    try:
        targets(model.graph, patterns or (), getattr(model, "param_users", None))
    except ValueError as exc:
        return str(exc).replace("LoRA target", "--lora-targets", 1)
    return None


def _umask() -> int:
    mask = os.umask(0o022)  # (the only way to read it is to set it)
    os.umask(mask)
    return mask


def write_package(out: Path, data: bytes) -> None:
    """Write `data` to `out` atomically (a crash never leaves half a package), with the
    permissions a plain open() would give under the process umask."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=out.name, suffix=".tmp")  # (mkstemp makes it 0600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def cmd_compile(args) -> int:
    from .compile import compile_model
    from .options import CompileOptions
    from .onnx_import import load_onnx
    from .passes.remat import BudgetError

    if not args.train:
        given = [flag for k, flag in TRAINING_OPTIONS.items() if getattr(args, k) is not None]
        if given:
            return _refuse(f"{', '.join(given)} only make{'s' if len(given) == 1 else ''} sense with --train")
    elif args.ignore_index is not None and args.loss == "mse":
        return _refuse("--ignore-index applies to --loss cross_entropy only")
    elif (args.lora_rank is None) != (args.lora_targets is None) or (args.lora_alpha and not args.lora_rank):
        return _refuse("--lora RANK and --lora-targets GLOB go together (--lora-alpha with them)")
    src = Path(args.model)
    if not src.is_file():
        return _refuse(f"no such model file: {src}")
    if src.suffix.lower() != ".onnx":
        return _refuse(f"{src.name}: only ONNX models (.onnx) compile from the command line; "
                       "use the Python builder API for others")
    train = _train_config(args)
    if args.weights == "f16" and args.train and not args.freeze and not args.lora_rank and not args.quiet:
        print("meganeura: note: --weights f16 stores only weights that training does not update; with --train "
              "and no --freeze every weight trains and stays f32", file=sys.stderr)
    stages = 4 if not train else 7 if train.memory_budget else 6
    step, close = _progress(stages, args.quiet or not sys.stderr.isatty())
    try:
        step("import ONNX")
        model = load_onnx(src, batch_size=args.batch)
        refusal = _unmatched_freeze(train.freeze, model.graph.params) if train else None
        refusal = refusal or (_unmatched_lora(model, train.lora_targets) if train else None)
        if refusal:
            close()
            return _refuse(refusal)
        # the command owns its process: checksums on threads may shorten the GIL's switch interval
        options = CompileOptions(weights=args.weights, host_switch_interval=2e-4)
        data = compile_model(model, train, source={"kind": "onnx", "file": src.name}, progress=step,
                             options=options)
    except BudgetError as exc:  # an argument the step cannot meet
        close()
        return _refuse(f"--memory-budget: {exc}")
    except Exception as exc:  # expected ones (ValueError, NotImplementedError...) and bugs: one line
        close()
        if _debugging():
            raise
        why = str(exc) if isinstance(exc, (ValueError, NotImplementedError, KeyError)) else \
            f"{type(exc).__name__}: {exc} (set MEGANEURA_DEBUG=1 for a traceback)"
        print(f"meganeura: cannot compile {src.name}: {why}".replace("\n", " "), file=sys.stderr)
        return 1
    close()
    out = Path(args.output)
    try:
        write_package(out, data)
    except OSError as exc:
        if _debugging():
            raise
        print(f"meganeura: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
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


def parser() -> argparse.ArgumentParser:
    d = DEFAULTS
    ap = _Parser(prog="meganeura", description="Compile models for the meganeura runtime.")
    ap.add_argument("--version", action="version", version=f"meganeura {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile an ONNX model into a .mnpk package")
    c.add_argument("model", help="the model, MODEL.onnx")
    c.add_argument("-o", "--output", required=True, help="the package to write, OUT.mnpk")
    c.add_argument("--batch", type=_number(int, lambda v: v > 0, "a positive integer"),
                   help="batch size when the model's batch dimension is dynamic (default: 64)")
    c.add_argument("--weights", choices=("f32", "f16"), default="f32",
                   help="f16: store the weights that only matmuls and convolutions read, and training does "
                        "not update, in half precision (half their bytes; the arithmetic stays f32) "
                        "(default: f32)")
    c.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bar, no notes, no summary line (default: off; the progress bar "
                        "shows only when stderr is a terminal)")
    t = c.add_argument_group("training (options allowed only with --train)")
    t.add_argument("--train", action="store_true",
                   help="also compile a training step (program train_step) (default: off)")
    t.add_argument("--loss", choices=("cross_entropy", "mse"),
                   help=f"the loss; cross_entropy takes class ids as labels (default: {d.loss})")
    t.add_argument("--optimizer", choices=("sgd", "adamw"), help=f"(default: {d.optimizer})")
    t.add_argument("--lr", type=_number(float, lambda v: v > 0, "a positive finite number"),
                   help=f"learning rate (default: {d.lr})")
    t.add_argument("--weight-decay", type=_number(float, lambda v: v >= 0, "a finite number >= 0"),
                   help="weight decay (default: 0.01 for adamw as in PyTorch, 0 for sgd)")
    t.add_argument("--clip-norm", type=_number(float, lambda v: v > 0, "a positive finite number"),
                   help="clip the global gradient norm to this (default: no clipping)")
    t.add_argument("--freeze", action="append", metavar="GLOB",
                   help="parameters whose names match GLOB get no gradient (repeatable) (default: none)")
    t.add_argument("--ignore-index", type=_number(int, lambda v: abs(v) < EXACT_INT,
                                                  f"an integer within +-{EXACT_INT - 1}"), metavar="N",
                   help="cross_entropy: rows labelled N leave the loss, as in PyTorch; any other label "
                        f"outside the classes skips the step (default: {d.ignore_index})")
    t.add_argument("--lora", dest="lora_rank", type=_number(int, lambda v: v >= 1, "an integer >= 1"),
                   metavar="RANK", help="train low-rank adapters (LoRA, as PEFT) of this rank beside the weights "
                                        "--lora-targets matches, which stay frozen (default: off)")
    t.add_argument("--lora-targets", action="append", metavar="GLOB",
                   help="with --lora: matmul weights to adapt, by parameter name or by the name of an ONNX "
                        "node reading it, e.g. '*attention*query*' (repeatable) (default: none)")
    t.add_argument("--lora-alpha", type=_number(float, lambda v: v > 0, "a positive finite number"), metavar="A",
                   help=f"with --lora: the adapters' output is scaled by A / RANK (default: {d.lora_alpha:g}, "
                        "as PEFT)")
    t.add_argument("--memory-budget", type=_size, metavar="SIZE",
                   help="bytes the training step's buffers may take, e.g. 256MiB, 1GiB, 1.5GB: forward values "
                        "are recomputed in the backward pass to fit, or the compile fails naming the smallest "
                        "budget it reaches (default: no budget)")
    c.set_defaults(fn=cmd_compile)
    i = sub.add_parser("info", help="describe a package")
    i.add_argument("package", help="the package to describe, OUT.mnpk")
    i.set_defaults(fn=cmd_info)
    return ap


def main(argv=None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]); returns the exit status."""
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a refusal already printed
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    try:
        return args.fn(args)
    except Exception as exc:
        if _debugging():
            raise
        print(f"meganeura: {args.command} failed: {type(exc).__name__}: {exc}".replace("\n", " "), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
