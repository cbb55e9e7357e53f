"""Engine-bridge fixtures: a headless X display, tiny per-pixel models, texture helpers.

At collection time (before any test asks wgpu for an adapter): the instance is restricted
to Vulkan on Linux (wgpu's GL backend panics beside an SDL window), and pygfx is imported
so that its preconfigure_default_device call joins the shared default device.
"""
import os
import shutil
import subprocess
import time

import pytest
from meganeura.engine_bridge import vulkan_only

vulkan_only()
import pygfx  # noqa: F401  (declares its device wishes at import)
from bridge_helpers import pixel_model
from meganeura.compiler import TrainConfig, compile_model
from meganeura.runtime import Package


def _die_with_parent():
    """In the Xvfb child: get SIGTERM when the test process dies, even by a C-level exit()
    (Xlib's error handler) that skips fixture teardown."""
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@pytest.fixture(scope="session")
def display():
    """An X display for window tests: $DISPLAY, else an Xvfb we start (and stop). No Xvfb: fail."""
    saved = {k: os.environ.get(k) for k in ("DISPLAY", "SDL_VIDEODRIVER", "SDL_AUDIODRIVER")}
    os.environ["SDL_VIDEODRIVER"], os.environ["SDL_AUDIODRIVER"] = "x11", "dummy"
    proc = None
    if not os.environ.get("DISPLAY"):
        exe = shutil.which("Xvfb")
        if exe is None:
            pytest.fail("window tests need Xvfb when no DISPLAY is set: apt-get install xvfb", pytrace=False)
        n = next(n for n in range(99, 199) if not os.path.exists(f"/tmp/.X11-unix/X{n}")
                 and not os.path.exists(f"/tmp/.X{n}-lock"))
        proc = subprocess.Popen([exe, f":{n}", "-screen", "0", "1024x768x24", "-nolisten", "tcp"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        end = time.monotonic() + 10
        while not os.path.exists(f"/tmp/.X11-unix/X{n}"):
            if proc.poll() is not None or time.monotonic() > end:
                proc.kill()
                pytest.fail(f"Xvfb :{n} did not start", pytrace=False)
            time.sleep(0.05)
        os.environ["DISPLAY"] = f":{n}"
    yield os.environ["DISPLAY"]
    if proc is not None:
        proc.terminate()
        proc.wait(5)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def seg_package():
    """The 32x32, 4-class pixel model with an AdamW training step."""
    return Package.from_bytes(compile_model(pixel_model(), TrainConfig(optimizer="adamw", lr=0.01)))
