"""Chapter 10's capstone: a small GPT, its data, your DDP and FSDP, and the torchrun script (see README.md)."""
