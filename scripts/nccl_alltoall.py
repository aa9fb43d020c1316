"""NCCL all-to-all anchor for the team alltoall and moe (issue 22), through torch.distributed.

Run on a GPU machine with PyTorch (its NCCL) as

    python3 -m torch.distributed.run --nproc_per_node=N scripts/nccl_alltoall.py [SIZES]

SIZES: comma-separated byte counts *per pair* (what each rank sends to each
rank, itself included; default 1 KiB x 4^k up to 64 MiB). Each rank's
buffer holds N * size bytes of bfloat16 (moe's element type). Rank 0 prints
`nccl-alltoall,<pes>,<bytes_per_pair>,<time_us>,<algbw_GBps>` rows:
`all_to_all_single` with equal splits, out of place, 5 warm-up then 100 (10
from 16 MiB per pair) timed calls between two CUDA events; algbw = the bytes
a rank sends to the others (N-1) * size / time.

For moe's dispatch at T tokens x top-k x H bfloat16 per PE, the same bytes
per pair are T * k * H * 2 / N (uniform routing).
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
    sizes = [1024 << (2 * k) for k in range(9)]
for size in sizes:
    elems = max(size // 2, 1)
    x = torch.ones(n * elems, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    iters = 10 if size >= (16 << 20) else 100
    for _ in range(5):
        dist.all_to_all_single(y, x)
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        dist.all_to_all_single(y, x)
    end.record()
    torch.cuda.synchronize()
    us = start.elapsed_time(end) * 1000 / iters
    algbw = (n - 1) * elems * 2 / us / 1e3
    if rank == 0:
        print(f"nccl-alltoall,{n},{elems * 2},{us:.2f},{algbw:.2f}", flush=True)
dist.destroy_process_group()
