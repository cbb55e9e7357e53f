"""Checkpoints survive crashes: a process killed at any point while saving leaves the
previous file or the new one, whole, never a torn one."""
import os
import random
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from meganeura.runtime.checkpoint import safetensors_bytes, write_atomic

SAVER = """
import sys
import numpy as np
from meganeura.runtime.checkpoint import safetensors_bytes, write_atomic
path, i = sys.argv[1], int(sys.argv[2])
print("ready", flush=True)
while True:  # save version i, i+1, ... until killed
    write_atomic(path, safetensors_bytes({"w": np.full(1 << 20, i, np.float32), "step": np.array([i])}))
    print(i, flush=True)
    i += 1
"""


def _version(path) -> int:
    """The version a checkpoint holds; fails on a torn or mixed file."""
    data = load_file(str(path))
    step = int(data["step"][0])
    assert data["w"].shape == (1 << 20,) and (data["w"] == step).all(), f"a torn checkpoint (version {step})"
    return step


def test_killed_while_saving_leaves_the_old_or_the_new_file(tmp_path):
    path = tmp_path / "weights.safetensors"
    write_atomic(path, safetensors_bytes({"w": np.zeros(1 << 20, np.float32), "step": np.array([0])}))
    rng = random.Random(3)
    last, kills, saves = 0, 0, 0
    while kills < 100:
        batch = []
        for _ in range(4):  # a few savers at once (different files), each killed at a random moment
            p = tmp_path / f"w{len(batch)}.safetensors"
            write_atomic(p, safetensors_bytes({"w": np.full(1 << 20, last, np.float32), "step": np.array([last])}))
            proc = subprocess.Popen([sys.executable, "-c", SAVER, str(p), str(last + 1)],
                                    stdout=subprocess.PIPE, text=True)
            batch.append((p, proc))
        for p, proc in batch:
            assert proc.stdout.readline().strip() == "ready"
        for p, proc in batch:
            time.sleep(rng.uniform(0.0, 0.06))
            proc.kill()
        for p, proc in batch:
            proc.wait()
            done = [int(x) for x in proc.stdout.read().split()]
            proc.stdout.close()
            got = _version(p)
            finished = done[-1] if done else last
            # the newest finished save, or the one in flight when the kill came (renamed, not yet reported)
            assert got in (finished, finished + 1), (got, finished)
            kills += 1
            saves += len(done)
    leftovers = [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    print(f"{kills} kills during {saves} completed saves; {len(leftovers)} temporary files left behind")
    assert saves >= 100
    assert _version(path) == 0  # untouched by the others
    # a crashed save's temporary file goes at the next save, once it is clearly not a live one's
    for f in leftovers:
        os.utime(tmp_path / f, (time.time() - 3600, time.time() - 3600))
    for p in {tmp_path / (f.split(".tmp")[0].rsplit(".", 1)[0].lstrip(".")) for f in leftovers}:
        write_atomic(p, safetensors_bytes({"step": np.array([0])}))
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_saving_keeps_permissions_and_symlinks(tmp_path):
    target = tmp_path / "real.safetensors"
    write_atomic(target, safetensors_bytes({"w": np.ones(2, np.float32)}))
    os.chmod(target, 0o640)
    link = tmp_path / "link.safetensors"
    link.symlink_to(target)
    write_atomic(link, safetensors_bytes({"w": np.zeros(2, np.float32)}))
    assert link.is_symlink() and (load_file(str(link))["w"] == 0).all()
    assert target.stat().st_mode & 0o777 == 0o640


def test_a_failed_save_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "w.safetensors"
    write_atomic(path, safetensors_bytes({"w": np.ones(4, np.float32)}))

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space"):
        write_atomic(path, safetensors_bytes({"w": np.zeros(4, np.float32)}))
    monkeypatch.undo()
    assert (load_file(str(path))["w"] == 1).all()
    assert os.listdir(tmp_path) == ["w.safetensors"]  # the temporary file was removed


def test_session_refuses_to_save_nan_weights_over_a_good_file(device, tmp_path):
    from meganeura.compiler import Builder, TrainConfig, compile_model
    from meganeura.runtime import Package, Session

    b = Builder()
    b.output("y", b.linear(b.input("x", (2, 3)), b.param("w", np.ones((2, 3))), b.param("c", np.zeros(2))))
    session = Session(device, Package.from_bytes(compile_model(b.build(), TrainConfig(loss="mse"))))
    session.save_weights(tmp_path / "w.safetensors")
    session.write_tensor("c", np.array([np.nan, 0.0]), role="param")
    with pytest.raises(ValueError, match=r"not saving .*\['c'\] hold NaN"):
        session.save_weights(tmp_path / "w.safetensors")
    assert (load_file(str(tmp_path / "w.safetensors"))["c"] == 0).all()
