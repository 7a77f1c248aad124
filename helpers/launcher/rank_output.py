"""Each rank's output in the cell, line by line, prefixed `[rank r]`."""


class RankOutput:
    """Buffers partial lines per (rank, stream) so that ranks never interleave within a line."""

    def __init__(self, stdout, stderr):
        self.streams = {"stdout": stdout, "stderr": stderr}
        self.partial = {}

    def write(self, rank, stream, text):
        """Print every complete line of text now; keep the unfinished tail for later."""
        text = self.partial.pop((rank, stream), "") + text
        *lines, tail = text.split("\n")
        if lines:
            target = self.streams[stream]
            target.write("".join(f"[rank {rank}] {line}\n" for line in lines))
            target.flush()
        if tail:
            self.partial[(rank, stream)] = tail

    def flush(self):
        """Print unfinished lines (a rank ended without a final newline)."""
        for (rank, stream), tail in sorted(self.partial.items()):
            self.streams[stream].write(f"[rank {rank}] {tail}\n")
            self.streams[stream].flush()
        self.partial.clear()
