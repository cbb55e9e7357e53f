"""Each example runs (headless: windows under the test display) and reports its frames."""
import json

from bridge_helpers import run_example


def test_offscreen_example(tmp_path):
    out = run_example("offscreen.py", "--frames", "30", "--trace", str(tmp_path / "t.json"),
                      "--png", str(tmp_path / "f.png"))
    assert "'frames': 30" in out and "'timestamps': True" in out
    assert "frames drawn while the model loaded" in out  # (loaded by Session.load_in_background)
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert (tmp_path / "f.png").stat().st_size > 0


def test_pygame_example(display):
    assert "'frames': 20" in run_example("pygame_overlay.py", "--frames", "20")


def test_glfw_example(display):
    assert "'frames': 20" in run_example("glfw_overlay.py", "--frames", "20")


def test_pygfx_example():
    out = run_example("pygfx_shared_device.py", "--frames", "20")
    assert "'frames': 20" in out and "pixels per class" in out
