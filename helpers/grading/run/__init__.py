"""Running a student's notebook: a sandboxed kernel per submission, its limits, the probe runtime inside it."""
