"""Weights into GPU buffers at load.

queue.write_buffer copies each write into fresh staging memory of wgpu's, and faulting in
those pages bounds it: Stable Diffusion's 3.46 GB in 544 tensors took 0.445 s on 4 threads
on the H200 (7.8 GB/s; 1.0 s on one). A few staging buffers reused round after round, filled
by numpy on threads (np.copyto releases the GIL) through a writable view of the mapped
range, took 0.199 s (17 GB/s; bench/upload_paths.py). Small packages keep write_buffer:
the ring's staging memory would cost more than it saves."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np

RING_FROM_BYTES = 32 << 20  # below: one write_buffer per tensor
STAGING_BYTES = 64 << 20  # per staging buffer (16 MiB x 8 measured 0.23 s, 64 MiB x 8 0.25)
STAGING_COUNT = 4
PIECE_BYTES = 4 << 20  # each thread copies pieces this big (big tensors spread over threads)
ALIGN = 256  # staging offsets (copies need 4, mapping 8)


def tensor_bytes(t: dict, value) -> np.ndarray:
    """`value` as the bytes of manifest tensor `t`, padded to whole 4-byte words (writes and
    copies come in words; an odd number of f16 values gets a zero)."""
    from .package import DTYPES

    arr = np.ascontiguousarray(value, dtype=DTYPES[t["dtype"]]).reshape(-1)
    if arr.nbytes % 4:
        arr = np.concatenate([arr, np.zeros(1, arr.dtype)])
    return arr.view(np.uint8)


def write_all(device, writes: list, threads: int, ring: bool) -> None:
    """Write each (buffer, byte offset, uint8 array of a multiple of 4 bytes) in `writes`;
    through a ring of staging buffers when `ring` and the writes are big enough, else with
    queue.write_buffer on `threads` threads."""
    total = sum(int(data.nbytes) for _, _, data in writes)
    if ring and total >= RING_FROM_BYTES:
        _through_ring(device, writes, threads, total)
        return
    order = sorted(writes, key=lambda w: -w[2].nbytes)  # the largest first: no long write starts last
    if threads <= 1 or len(order) <= 1:
        for buffer, offset, data in order:
            device.queue.write_buffer(buffer, offset, data)
        return
    with ThreadPoolExecutor(min(threads, len(order)), thread_name_prefix="meganeura-upload") as pool:
        _all_or_first_error([pool.submit(device.queue.write_buffer, b, o, d) for b, o, d in order])


def plan_rounds(sizes: list, staging_bytes: int) -> list:
    """Per fill of a staging buffer, its chunks (write index, byte offset in the write,
    staging offset, bytes): writes packed in order at ALIGN-ed offsets, big ones split."""
    rounds, chunks, used = [], [], 0
    for index, nbytes in enumerate(sizes):
        done = 0
        while done < nbytes:
            if used >= staging_bytes:
                rounds.append(chunks)
                chunks, used = [], 0
            piece = min(nbytes - done, staging_bytes - used)
            chunks.append((index, done, used, piece))
            used = -(-(used + piece) // ALIGN) * ALIGN
            done += piece
    return rounds + [chunks] if chunks else rounds


def _through_ring(device, writes, threads, total):
    import wgpu

    order = sorted(writes, key=lambda w: -w[2].nbytes)
    staging_bytes = min(STAGING_BYTES, -(-total // STAGING_COUNT // ALIGN) * ALIGN)
    rounds = plan_rounds([int(d.nbytes) for _, _, d in order], staging_bytes)
    usage = wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC
    ring = [device.create_buffer(size=staging_bytes, usage=usage, mapped_at_creation=True, label=f"mn-staging{i}")
            for i in range(min(STAGING_COUNT, len(rounds)))]
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="meganeura-upload") as pool:
        for i, chunks in enumerate(rounds):
            staging = ring[i % len(ring)]
            if i >= len(ring):
                staging.map_sync(wgpu.MapMode.WRITE)  # waits for the copies of its last round
            try:
                _fill(staging, staging_bytes, order, chunks, pool)
            finally:
                staging.unmap()
            encoder = device.create_command_encoder()
            for index, start, at, nbytes in chunks:
                buffer, offset, _ = order[index]
                encoder.copy_buffer_to_buffer(staging, at, buffer, offset + start, nbytes)
            device.queue.submit([encoder.finish()])


def _fill(staging, size, order, chunks, pool):
    """Copy a round's chunks into the mapped staging buffer, in pieces on the pool's threads."""
    get_range = getattr(staging, "_experimental_get_mapped_range", None)
    if get_range is None:  # another wgpu-py: one copy at a time, under the GIL
        for index, start, at, nbytes in chunks:
            staging.write_mapped(order[index][2][start:start + nbytes], at)
        return
    mapped = np.frombuffer(get_range(0, size), dtype=np.uint8)
    try:
        futures = [pool.submit(np.copyto, mapped[at + p:at + p + min(PIECE_BYTES, nbytes - p)],
                               order[index][2][start + p:start + p + min(PIECE_BYTES, nbytes - p)])
                   for index, start, at, nbytes in chunks for p in range(0, nbytes, PIECE_BYTES)]
        _all_or_first_error(futures)
    finally:
        del mapped  # the view must not outlive the mapping (unmap invalidates its memory)


def _all_or_first_error(futures):
    """Wait for every future (none may still touch mapped memory after an error), then raise
    the first error, cancelling what has not started."""
    wait(futures, return_when="FIRST_EXCEPTION")
    failed = [f for f in futures if f.done() and f.exception() is not None]
    if failed:
        for f in futures:
            f.cancel()
        wait(futures)
        raise failed[0].exception()
    wait(futures)
