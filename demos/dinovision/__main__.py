"""DinoVision: live segmentation over a rendered 3D scene, fine-tuned on the device.

    python -m demos.dinovision                       # a window when a display exists
    python -m demos.dinovision --headless --frames 300 --out out/dinovision
    python -m demos.dinovision --stereo              # two eye views, inferred as one batch

In the window: the mask is drawn over the scene; the decoder trains from the engine's
class-ID target (auto-label, key A toggles) and from your brush: left-drag paints the
selected class, right-drag erases, keys 1-9 select a class, N picks a new class slot to
teach, C clears the brush, T pauses training, S saves. The decoder is saved on exit and
restored on the next start. Esc quits.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def parse(argv=None):
    ap = argparse.ArgumentParser(prog="python -m demos.dinovision", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--headless", action="store_true", help="no window: write frames, metrics and a plot")
    ap.add_argument("--frames", type=int, default=None, help="frames to run (headless default 150)")
    ap.add_argument("--out", default="out/dinovision", help="where headless runs write their results")
    ap.add_argument("--size", type=int, default=None, help="model resolution (default 128, headless 96)")
    ap.add_argument("--stereo", action="store_true", help="two eye views as one batch of two")
    ap.add_argument("--steps-per-frame", type=int, default=2, help="decoder training steps per frame")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--weights", help="DINOv2 weights in the transformers layout (safetensors) for the backbone")
    ap.add_argument("--decoder", default=str(Path.home() / ".cache" / "meganeura" / "dinovision_decoder.safetensors"),
                    help="where the fine-tuned decoder is saved on exit and restored from")
    ap.add_argument("--fresh", action="store_true", help="start from an untrained decoder")
    ap.add_argument("--eval-points", type=int, default=6, help="held-out evaluations during a headless run")
    ap.add_argument("--budget-ms", type=float, default=None, help="ML budget per frame (window mode)")
    return ap.parse_args(argv)


def _missing_demo_dependencies() -> list:
    import importlib.util

    return [m for m in ("skimage", "PIL", "matplotlib") if importlib.util.find_spec(m) is None]


def main(argv=None):
    args = parse(argv)
    missing = _missing_demo_dependencies()
    if missing:
        print(f"the DinoVision demo needs {', '.join(missing)}: pip install 'meganeura[demo]'", file=sys.stderr)
        return 2
    windowed = not args.headless and bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
                                          or sys.platform in ("win32", "darwin"))
    if windowed:
        from .window import run_window

        run_window(args)
        return 0
    from .headless import run_headless

    if not args.headless:
        print("no display found: running headless (write frames, metrics.json and plots to --out)")
    run_headless(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
