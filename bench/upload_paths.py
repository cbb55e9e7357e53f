"""How fast host weights reach GPU buffers, by upload path (numpy + wgpu-py only).

The runtime uploads each tensor with queue.write_buffer on 4 threads (~3 GB/s for Stable
Diffusion's 3.3 GB on an H200); every write copies into fresh staging memory of wgpu's,
which we suspect pays page faults. This times the alternatives, each from the first call
until the GPU has finished every copy (a 4-byte map_async readback is the fence: 0.32's
on_submitted_work_done is broken):

  write_buffer x1          one queue.write_buffer per tensor, one thread
  write_buffer xN          the same on --threads threads, largest tensor first
  ring KxS x1              K reused MAP_WRITE staging buffers of S MiB: map_sync(WRITE),
                           write_mapped (small tensors packed, big ones split), unmap,
                           copy_buffer_to_buffer, submit; creation reported apart
  ring KxS xN              the same, the memcpy into the mapped range on N threads
                           (np.copyto releases the GIL; write_mapped does not)
  mapped_at_creation x1/xN fresh destinations created mapped, filled, unmapped: this path
                           replaces creating the buffers, so creation is in its time

Every path is checked by reading back a few destination buffers. Sizes are MiB; GB/s
is 1e9 bytes per second. Run on the GPU machine (repo root, `.device` carried along):
  source .device/env.sh && python3 bench/upload_paths.py --out $OUT
Quick check on lavapipe:
  XDG_RUNTIME_DIR=/tmp/xdg .venv/bin/python bench/upload_paths.py --total-mb 64
"""
from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import wgpu

MIB = 1 << 20
DEST_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
STAGING_USAGE = wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC
PACK_ALIGN = 256  # mapped offsets must be multiples of 8, copy offsets of 4: 256 is safe
COPY_PIECE = 4 * MIB  # threaded memcpy works in pieces this big, for balance


def get_device():
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp/xdg")
    os.makedirs(os.environ["XDG_RUNTIME_DIR"], exist_ok=True)
    try:
        from meganeura.runtime.device import default_device
        return default_device()
    except ImportError:
        return wgpu.utils.get_default_device()


def tensor_sizes(total_bytes, pattern_mb):
    """Byte sizes cycling through pattern_mb (whole float32s) until total_bytes is used."""
    sizes, used, i = [], 0, 0
    while used < total_bytes:
        nbytes = min(max(4, int(pattern_mb[i % len(pattern_mb)] * MIB) // 4 * 4), total_bytes - used)
        sizes.append(nbytes)
        used += nbytes
        i += 1
    return sizes


class Bench:
    def __init__(self, device, total_bytes, pattern_mb):
        self.device, self.queue = device, device.queue
        self.sizes = tensor_sizes(total_bytes, pattern_mb)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        # distinct words everywhere, so a misplaced copy fails the check; arange touches every page
        self.host = np.arange(sum(self.sizes) // 4, dtype=np.uint32).view(np.float32)
        self.host_bytes = self.host.view(np.uint8)
        self.tensors = [self.host_bytes[s:s + n].view(np.float32) for s, n in zip(self.starts, self.sizes)]
        start = time.perf_counter()
        self.dests = [device.create_buffer(size=n, usage=DEST_USAGE) for n in self.sizes]
        self.dest_create_s = time.perf_counter() - start
        self.fence_source = device.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_SRC)
        self.fence_readback = device.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.MAP_READ)
        largest = int(np.argmax(self.sizes))
        self.checked = sorted({0, len(self.sizes) // 2, len(self.sizes) - 1, largest})

    def fence(self):
        """Return once the GPU has finished everything submitted (and flushed pending writes)."""
        encoder = self.device.create_command_encoder()
        encoder.copy_buffer_to_buffer(self.fence_source, 0, self.fence_readback, 0, 4)
        self.queue.submit([encoder.finish()])
        self.fence_readback.map_sync(wgpu.MapMode.READ)
        self.fence_readback.unmap()

    def clear_dests(self):
        """Zero the destinations so that a path which moves nothing fails its check."""
        encoder = self.device.create_command_encoder()
        for buffer in self.dests:
            encoder.clear_buffer(buffer)
        self.queue.submit([encoder.finish()])
        self.fence()

    def check(self, buffers, path):
        for i in self.checked:
            got = np.frombuffer(self.queue.read_buffer(buffers[i]), dtype=np.uint32)
            assert np.array_equal(got, self.tensors[i].view(np.uint32)), f"{path}: tensor {i} differs"

    # ------------------------------------------------------------------ paths
    def write_buffer(self, threads):
        if threads == 1:
            for buffer, tensor in zip(self.dests, self.tensors):
                self.queue.write_buffer(buffer, 0, tensor)
        else:
            order = sorted(range(len(self.sizes)), key=lambda i: -self.sizes[i])
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(lambda i: self.queue.write_buffer(self.dests[i], 0, self.tensors[i]), order))
        return self.dests, {}

    def plan_rounds(self, staging_bytes):
        """Chunks (tensor, tensor offset, staging offset, bytes) per staging fill."""
        rounds, chunks, used = [], [], 0
        for index, nbytes in enumerate(self.sizes):
            done = 0
            while done < nbytes:
                if used >= staging_bytes:
                    rounds.append(chunks)
                    chunks, used = [], 0
                piece = min(nbytes - done, staging_bytes - used)
                chunks.append((index, done, used, piece))
                used = -(-(used + piece) // PACK_ALIGN) * PACK_ALIGN
                done += piece
        return rounds + [chunks] if chunks else rounds

    def staging_ring(self, count, staging_mb, threads):
        staging_bytes = int(staging_mb * MIB) // PACK_ALIGN * PACK_ALIGN
        rounds = self.plan_rounds(staging_bytes)  # planning is cheap and not what we measure
        start = time.perf_counter()
        ring = [self.device.create_buffer(size=staging_bytes, usage=STAGING_USAGE) for _ in range(count)]
        create_s = time.perf_counter() - start
        pool = ThreadPoolExecutor(threads) if threads > 1 else None
        for round_index, chunks in enumerate(rounds):
            staging = ring[round_index % count]
            staging.map_sync(wgpu.MapMode.WRITE)  # waits for this buffer's previous copies
            if pool is None:
                for index, tensor_offset, staging_offset, nbytes in chunks:
                    source = self.starts[index] + tensor_offset
                    staging.write_mapped(self.host_bytes[source:source + nbytes], staging_offset)
            else:  # a writable view of the mapped range, filled by numpy outside the GIL
                mapped = np.frombuffer(staging._experimental_get_mapped_range(0, staging_bytes), dtype=np.uint8)
                pieces = [(self.starts[i] + t + p, s + p, min(COPY_PIECE, n - p))
                          for i, t, s, n in chunks for p in range(0, n, COPY_PIECE)]
                list(pool.map(lambda c, mapped=mapped: np.copyto(mapped[c[1]:c[1] + c[2]], self.host_bytes[c[0]:c[0] + c[2]]), pieces))
                del mapped  # the view dies with the mapping
            staging.unmap()
            encoder = self.device.create_command_encoder()
            for index, tensor_offset, staging_offset, nbytes in chunks:
                encoder.copy_buffer_to_buffer(staging, staging_offset, self.dests[index], tensor_offset, nbytes)
            self.queue.submit([encoder.finish()])
        if pool is not None:
            pool.shutdown()
        return self.dests, {"create_s": create_s, "rounds": len(rounds), "_release": ring}

    def mapped_at_creation(self, threads):
        buffers = [self.device.create_buffer(size=n, usage=DEST_USAGE, mapped_at_creation=True) for n in self.sizes]
        if threads == 1:
            for buffer, tensor in zip(buffers, self.tensors):
                buffer.write_mapped(tensor)
        else:
            def fill(index):
                mapped = np.frombuffer(buffers[index]._experimental_get_mapped_range(), dtype=np.uint8)
                np.copyto(mapped, self.host_bytes[self.starts[index]:self.starts[index] + self.sizes[index]])
            order = sorted(range(len(self.sizes)), key=lambda i: -self.sizes[i])
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(fill, order))
        for buffer in buffers:
            buffer.unmap()
        return buffers, {"_release": buffers}

    def time_path(self, name, run, repeats):
        seconds, extras = [], []
        for _ in range(repeats):
            self.clear_dests()
            start = time.perf_counter()
            buffers, extra = run()
            self.fence()
            seconds.append(time.perf_counter() - start)
            self.check(buffers, name)
            for buffer in extra.pop("_release", []):
                buffer.destroy()  # nothing in flight uses them: the fence and the check are done
            extras.append(extra)
        best = min(seconds)
        result = {"seconds": seconds, "best_s": best, "gbps": sum(self.sizes) / best / 1e9}
        if "create_s" in extras[0]:
            result["create_s"] = [e["create_s"] for e in extras]
            with_create = min(s + e["create_s"] for s, e in zip(seconds, extras))
            result["best_with_create_s"] = with_create
            result["gbps_with_create"] = sum(self.sizes) / with_create / 1e9
            result["rounds"] = extras[0]["rounds"]
        return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--total-mb", type=float, default=3300)
    parser.add_argument("--tensor-mb", type=float, nargs="+", default=[0.01, 0.01, 0.01, 0.5, 2.5, 6.5, 13, 26],
                        help="tensor sizes cycled in order (default: many tiny, most bytes in big ones)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--staging-mb", type=float, default=64)
    parser.add_argument("--staging-count", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--out", help="folder for upload_paths.json")
    args = parser.parse_args()

    device = get_device()
    bench = Bench(device, int(args.total_mb * MIB) // 4 * 4, args.tensor_mb)
    total = sum(bench.sizes)
    print(f"device: {device.adapter.info['device']} ({device.adapter.info['backend_type']}); "
          f"{total / 1e9:.3f} GB in {len(bench.sizes)} tensors; "
          f"creating the destinations took {bench.dest_create_s:.3f} s (not in the times below)")

    threads = args.threads
    paths = {"write_buffer x1": lambda: bench.write_buffer(1),
             f"write_buffer x{threads}": lambda: bench.write_buffer(threads)}
    for count in args.staging_count:
        for n in (1, threads):
            paths[f"ring {count}x{args.staging_mb:g}MiB x{n}"] = (lambda c=count, n=n: bench.staging_ring(c, args.staging_mb, n))
    paths["mapped_at_creation x1"] = lambda: bench.mapped_at_creation(1)
    paths[f"mapped_at_creation x{threads}"] = lambda: bench.mapped_at_creation(threads)

    results = {}
    print(f"{'path':<28}{'best s':>9}{'GB/s':>8}{'+create s':>11}{'GB/s':>8}   all runs (s)")
    for name, run in paths.items():
        r = results[name] = bench.time_path(name, run, args.repeats)
        created = (f"{r['best_with_create_s']:>11.3f}{r['gbps_with_create']:>8.2f}"
                   if "create_s" in r else f"{'':>11}{'':>8}")
        print(f"{name:<28}{r['best_s']:>9.3f}{r['gbps']:>8.2f}{created}   "
              + " ".join(f"{s:.3f}" for s in r["seconds"]), flush=True)
    print(f"all paths checked: tensors {bench.checked} read back equal")

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        report = {"device": dict(device.adapter.info), "wgpu": wgpu.__version__, "total_bytes": total,
                  "tensor_count": len(bench.sizes), "tensor_mb_pattern": args.tensor_mb,
                  "dest_create_s": bench.dest_create_s, "threads": threads, "staging_mb": args.staging_mb,
                  "paths": results}
        with open(os.path.join(args.out, "upload_paths.json"), "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {os.path.join(args.out, 'upload_paths.json')}")


if __name__ == "__main__":
    main()
