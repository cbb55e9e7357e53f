"""Where the wall time of a tiny program goes on this host: encoder, record, finish,
submit, GPU wait (three ways), readback. Prints microseconds per step (medians)."""
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


def main():
    import wgpu

    from meganeura.compiler import compile_model
    from meganeura.runtime import Package, Session
    from workloads import WORKLOADS

    case = WORKLOADS["mlp_64-128-10_b64"]()
    model, train, inputs = case.model, case.train, case.inputs
    s = Session(None, Package.from_bytes(compile_model(model, train)))
    dev = s.device
    s.write_inputs("infer", {"x": inputs["x"]})
    stage = dev.create_buffer(size=64 * 10 * 4, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
    out = s.buffers[s.tensors[s.package.programs["infer"]["outputs"]["logits"]]["buffer"]]
    for mode in ("map_sync", "poll_then_map", "fence_map_async_spin"):
        rows = []
        for i in range(60):
            t = [time.perf_counter()]
            enc = dev.create_command_encoder(); t.append(time.perf_counter())
            s.record(enc, "infer"); t.append(time.perf_counter())
            enc.copy_buffer_to_buffer(out, 0, stage, 0, 64 * 10 * 4)
            cb = enc.finish(); t.append(time.perf_counter())
            dev.queue.submit([cb]); t.append(time.perf_counter())
            if mode == "poll_then_map":
                dev._poll_wait()
                stage.map_sync(wgpu.MapMode.READ)
            elif mode == "map_sync":
                stage.map_sync(wgpu.MapMode.READ)
            else:
                p = stage.map_async(wgpu.MapMode.READ)
                while not p._thread_event.is_set():
                    dev._poll(False)
                p.sync_wait()
            t.append(time.perf_counter())
            stage.read_mapped(0, 64 * 10 * 4); stage.unmap(); t.append(time.perf_counter())
            if i >= 10:
                rows.append(np.diff(t) * 1e6)
        med = np.median(rows, axis=0)
        print(f"{mode:22s} encoder {med[0]:.1f}  record {med[1]:.1f}  finish {med[2]:.1f}  submit {med[3]:.1f}  "
              f"wait {med[4]:.1f}  read {med[5]:.1f}  total {med.sum():.1f} us")


if __name__ == "__main__":
    main()
