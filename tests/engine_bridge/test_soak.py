"""Soak: render + inference + training frames in the offscreen host on lavapipe. Process
memory and every wgpu object count stay flat once the scheduler's bounded statistics are
full. CI runs 1,500 frames; the full 20,000-frame run is `python tests/engine_bridge/soak.py`."""
from soak import run_soak


def test_memory_and_wgpu_objects_stay_flat(device):
    r = run_soak(1500)
    print({k: v for k, v in r.items() if k != "samples"})
    assert r["train_steps"] > 1000 and r["readbacks"] > 1000 and r["skipped_steps"] == 0
    assert r["objects_end"] == r["objects_warm"]  # not one wgpu object more or less
    assert abs(r["rss_growth"]) <= 0.01, f"process memory grew {r['rss_growth']:.1%} over the soak"
