"""Judging what the kernel returned: probe values as plain data, the public checks replayed, reference answers, the
student's own errors."""
