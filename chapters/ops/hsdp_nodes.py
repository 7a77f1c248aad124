r"""HSDP across machines: replicate across nodes, shard within a node, with FSDP2's fully_shard on a 2-D mesh.

Run the same command on every node (here: twice on one machine, two "nodes" of 2 processes each); ENDPOINT is
host:port of the rendezvous, on any one node, the same for all:

    torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=ENDPOINT --rdzv-id=hsdp \
        chapters/ops/hsdp_nodes.py --steps 4 --out artifacts/ops/hsdp.pt

The mesh is (nodes, processes per node) = (replicate, shard): torchrun numbers the processes node by node
(RANK = GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK), so each row of the mesh is one node. Parameters are
sharded over the processes of a node, whose links are fast (NVLink on GPUs), and replicated across nodes,
whose links are slower: per step, gradients are reduce-scattered within a node, and only the shards are
all-reduced across nodes (chapter 09).
"""
import argparse
import os
import pathlib
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

if not __package__:  # run as a script (torchrun): make the package `ops` importable
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from helpers.backend import rank_device  # noqa: E402
from ops.train_script import BATCH_PER_RANK, exit_now, finish, init_from_env, make_model, rank_batch, say  # noqa: E402

LR = 0.05


def train(steps, mesh_shape):
    """SGD on a 2-D mesh (replicate, shard); returns the full final parameters (gathered) as one CPU vector."""
    rank, world_size, device = dist.get_rank(), dist.get_world_size(), rank_device()
    mesh = init_device_mesh(device.type, mesh_shape, mesh_dim_names=("replicate", "shard"))
    model = make_model(device)                 # the same weights on every rank; each keeps its own slice
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)      # a 2-D mesh makes it HSDP
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    weight = model[0].weight
    if rank == 0:
        say(f"mesh {mesh_shape} {mesh.mesh_dim_names}: model[0].weight {tuple(weight.shape)} placements "
            f"{weight.placements}, this rank holds {tuple(weight.to_local().shape)}")
    for step in range(steps):
        x, y = rank_batch(step, rank, world_size, BATCH_PER_RANK, device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()        # reduce-scatter within the node, all-reduce of the shards across nodes
        optimizer.step()
    full = [p.full_tensor() for p in model.parameters()]   # a collective: every rank gathers
    return nn.utils.parameters_to_vector(full).detach().cpu()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", type=pathlib.Path, help="rank 0 saves the final full parameters here")
    args = parser.parse_args(argv)
    init_from_env()
    rank = dist.get_rank()
    nodes = int(os.environ["WORLD_SIZE"]) // int(os.environ["LOCAL_WORLD_SIZE"])
    say(f"rank {rank}: node (GROUP_RANK) {os.environ['GROUP_RANK']}, LOCAL_RANK {os.environ['LOCAL_RANK']}, "
        f"pid {os.getpid()}")
    finish(train(args.steps, (nodes, int(os.environ["LOCAL_WORLD_SIZE"]))), args.out)


if __name__ == "__main__":
    main()
    exit_now()
