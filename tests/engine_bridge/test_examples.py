"""Each example runs (headless: windows under the test display) and reports its frames."""
import json
import re

from bridge_helpers import run_example


def test_offscreen_example(tmp_path):
    out = run_example("offscreen.py", "--frames", "30", "--trace", str(tmp_path / "t.json"),
                      "--png", str(tmp_path / "f.png"))
    assert re.search(r"^frames +30 ", out, re.M) and "estimates only" not in out  # timestamps measured
    assert "frames drawn while the model loaded" in out  # (loaded by Session.load_in_background)
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert (tmp_path / "f.png").stat().st_size > 0


def test_pygame_example(display):
    assert re.search(r"^frames +20 ", run_example("pygame_overlay.py", "--frames", "20"), re.M)


def test_glfw_example(display):
    assert re.search(r"^frames +20 ", run_example("glfw_overlay.py", "--frames", "20"), re.M)


def test_pygfx_example():
    out = run_example("pygfx_shared_device.py", "--frames", "20")
    assert re.search(r"^frames +20 ", out, re.M) and "pixels per class" in out
