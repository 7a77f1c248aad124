"""Chapter 11's files: scripts that run under torchrun (and whose functions run under helpers.launch), the
runner that starts them from a notebook cell, and the cluster manifests (slurm.sbatch, pytorchjob.yaml).

    jobs.py          run(commands, timeout): torchrun jobs from a cell, output streamed, nothing left behind
    train_script.py  section 1: a DDP training script with init_process_group, the entry point torchrun starts
    resumable.py     section 4: training that checkpoints with torch.distributed.checkpoint and resumes
    hsdp_nodes.py    section 5: HSDP (fully_shard on a 2-D mesh) across two torchrun agents, the "nodes"
"""
