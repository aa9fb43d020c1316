"""NCCL allreduce reference for docs/data/fig10.csv, through torch.distributed.

Run on a GPU machine with PyTorch (its NCCL) as

    python3 -m torch.distributed.run --nproc_per_node=N scripts/nccl_allreduce.py [SIZES]

SIZES: comma-separated byte counts (default 8 B x 4^k up to 256 MiB). Rank 0
prints `nccl,<pes>,<bytes>,<time_us>,<busbw_GBps>` rows (fig10.csv schema,
no header): float32 sum, out of place, 5 warm-up then 200 (20 from 16 MiB)
timed allreduces between two CUDA events; busbw = bytes / time * 2 (n-1) / n
as nccl-tests computes it.
"""
import sys

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank, n = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(rank)
if len(sys.argv) > 1:
    sizes = [int(s) for s in sys.argv[1].split(",")]
else:
    sizes = [8 << (2 * k) for k in range(13)] + [256 << 20]
for size in sizes:
    x = torch.ones(max(size // 4, 1), dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    iters = 20 if size >= (16 << 20) else 200
    for _ in range(5):
        y.copy_(x)
        dist.all_reduce(y)
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        dist.all_reduce(y)
    end.record()
    torch.cuda.synchronize()
    us = start.elapsed_time(end) * 1000 / iters
    busbw = size / us / 1e3 * 2 * (n - 1) / n
    if rank == 0:
        print(f"nccl,{n},{size},{us:.2f},{busbw:.2f}", flush=True)
dist.destroy_process_group()
