# Data Parallelism, hands-on. The two commands: `make lab` and `make test`.
# Needs only python3 (with venv and pip); everything else goes into .venv at the repo root.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Written after a successful install; reinstall only when the dependency list changes.
STAMP := $(VENV)/.installed
# Extra JupyterLab options, e.g. make lab JUPYTER_ARGS="--port 8890 --ip 0.0.0.0". --allow-root (as root) and
# --no-browser (Linux without a display) are added by scripts/lab_args.py.
JUPYTER_ARGS ?=
# Where torch comes from: empty = chosen for the machine by scripts/pip_install_args.py (Linux without an NVIDIA
# GPU: PyTorch's CPU index); a URL = that index (e.g. https://download.pytorch.org/whl/cu126); default = PyPI.
TORCH_INDEX ?=
# Extra pytest options, e.g. make test PYTEST_ARGS="-x -k launch"
PYTEST_ARGS ?=
# pytest workers for make test (pytest-xdist); TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
# Chapters run under nbval here; solutions and student labs run under papermill in tests/test_labs.py,
# which also asserts each check's result (solutions: all pass; labs: all "not implemented").
NOTEBOOKS := $(wildcard chapters/*.ipynb)

# make grade LAB=03 SUBMISSIONS=dir OUT=dir [PROBES=dir] [SOLUTIONS=dir] [JOBS=2]
#            [RESUME=1 | ONLY="alice bob" | FRESH=1]: OUT must be new or empty, unless RESUME=1 finishes the run in it,
#            ONLY= re-grades some of its students, or FRESH=1 deletes it first (helpers/grading/state.py)
LAB ?=
SUBMISSIONS ?=
OUT ?=
PROBES ?=
SOLUTIONS ?=
JOBS ?=
RESUME ?=
ONLY ?=
FRESH ?=
# make grade-init LAB= SUBMISSIONS= OUT= [options] once, then make grade ... SHARD=k/N for k = 1..N wherever OUT is
#            shared (scripts/grading/: a SLURM array, a Kubernetes Indexed Job), then make grade-merge OUT= [FORMAT=]:
#            a class on many machines (helpers/grading/shards.py)
SHARD ?=
# make grade ... FORMAT=canvas|gradescope|moodle|csv [ASSIGNMENT="Lab 03 (12345)"]: the LMS's import file
#            [DEADLINE=2026-12-01T23:59+01:00 [LATE_PER_DAY=0.1] [LATE_MAX_DAYS=7] [TIMES=times.csv]]: a late policy
# (helpers/grading/report/gradebook.py: each LMS's columns and how it names an assignment)
FORMAT ?=
ASSIGNMENT ?=
DEADLINE ?=
LATE_PER_DAY ?=
LATE_MAX_DAYS ?=
TIMES ?=
# make release OUT=dir COURSE_REPO=url: the address students will clone the release from, written into every
# notebook's install cell; the release refuses to run without one (or with a placeholder such as YOUR-ORG).
COURSE_REPO ?=

.PHONY: setup lab labs test test-install bench bench-grading grade grade-init grade-merge release gpu-check clean help

help:
	@echo "make lab    set up if needed, then open JupyterLab on chapter 00"
	@echo "make test   set up if needed, then run every test and execute every notebook"
	@echo "make test-install   install the course into a fresh venv (Colab cell, pip install) and run chapter 00"
	@echo "make labs   regenerate labs/ from solutions/ (labs are never edited by hand)"
	@echo "make bench  time the launcher (vs spawn, fork) and lab 04's bucketed DDP (vs torch DDP)"
	@echo "make bench-grading   time grading a class of 20 (lab 03)"
	@echo "make grade  LAB=03 SUBMISSIONS=dir OUT=dir [PROBES=dir] [JOBS=2] [RESUME=1|ONLY=ids|FRESH=1]: grade a class"
	@echo "            [FORMAT=canvas ASSIGNMENT='Lab 03 (12345)'] [DEADLINE=iso LATE_PER_DAY=0.1 LATE_MAX_DAYS=7]"
	@echo "            [SHARD=k/N]: only the k-th of N slices of the class, into OUT/shards/ (after make grade-init)"
	@echo "make grade-init  LAB=03 SUBMISSIONS=dir OUT=dir [options of grade]: a class on many machines: OUT/state.json"
	@echo "            (the run's seed, the solution's values), which every make grade ... SHARD=k/N reads"
	@echo "make grade-merge OUT=dir [FORMAT=...]: the shards' results into OUT's grades.csv, feedback, LMS file, similarity"
	@echo "make release OUT=dir COURSE_REPO=url   write the student repository into a new dir: no solutions, probes or"
	@echo "            answer key; url = its public address, which every notebook's install cell clones on Colab"
	@echo "make setup  create .venv and install the course into it (idempotent) [TORCH_INDEX=url|default]"
	@echo "make gpu-check   on a machine with GPUs: every chapter, lab solution and the capstone on NCCL ->"
	@echo "            artifacts/gpu-check/report.md (without a GPU: says so, exits 0)"
	@echo "            [GPU_CHECK_ARGS=\"--pretend-gpus 3\"]: rehearse on a CPU the world sizes of 3 GPUs, on Gloo"
	@echo "make clean  remove .venv and test artifacts"

setup: $(STAMP)

# torch first, alone (--no-deps), with the index chosen for the machine; then the course, whose torch pin is
# already satisfied, so the CPU index is asked about torch only.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	args=$$(TORCH_INDEX="$(TORCH_INDEX)" $(PY) scripts/pip_install_args.py) && \
		$(PY) -m pip install --quiet --disable-pip-version-check --no-deps $$args
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[dev]"
	touch $(STAMP)

# set -x shows the command with the options chosen for this machine; exec: JupyterLab replaces the shell, so
# Ctrl-C and a kill by PID reach the server itself. The server's root is the checkout (chapters/, labs/ and the
# rest in the file browser; given only a file, jupyter serves that file's folder), and the URL it prints opens
# chapter 00 (default_url), headless or not.
FIRST_CHAPTER := chapters/00_first_distributed_program.ipynb
lab: setup
	@args=$$($(PY) scripts/lab_args.py) && set -x && \
		exec $(VENV)/bin/jupyter lab $(FIRST_CHAPTER) --ServerApp.root_dir=. \
		--LabApp.default_url=/lab/tree/$(FIRST_CHAPTER) $$args $(JUPYTER_ARGS)

# Two pytest workers: most of a test's time is kernels and ranks starting or waiting, so two at once fill
# the 2 cores better than one. loadscope keeps a test file (and a notebook's cells, which share one kernel)
# on one worker, so module fixtures are built once. tests/longest_first.py hands out the longest files first (by the
# seconds in tests/scope_seconds.json), so both workers end together.
# tests/device_guard_plugin.py runs the chapters with the device guard pretending (the NCCL path, checked on a CPU).
# tests/warm_kernels.py: the notebooks' kernels (nbval's python3-warm, tests/test_labs.py) are forks of one process
# per worker that imported torch once; a kernel started the usual way costs ~10 s of CPU before its first cell.
# The fresh-environment install test (tests/test_install.py, marker `install`) is `make test-install`: it is pip
# unpacking PyTorch for 3-5 minutes, the same on every run, and .ci/run runs it after `make test`.
# One intra-op thread per process: the 2 workers' kernels (and the graded ones: helpers/grading/grade.py
# kernel_threads) with torch's default of every core spin-wait on each other, 17% more CPU seconds measured.
test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope --nbval-lax --nbval-kernel-name python3-warm \
		-p no:cacheprovider -m "not install" -p tests.device_guard_plugin -p tests.warm_kernels -p tests.longest_first \
		tests $(NOTEBOOKS) $(PYTEST_ARGS)

test-install: setup
	$(PY) -m pytest -p no:cacheprovider -m install tests/test_install.py $(PYTEST_ARGS)

labs: setup
	$(PY) -m helpers.grading.prepare.labgen

bench: setup
	$(PY) -m tests.bench_launch
	$(PY) -m tests.bench_bucketing

bench-grading: setup
	$(PY) -m tests.bench_grading --lab 03 --students 20

grade: setup
	@test -n "$(LAB)" -a -n "$(SUBMISSIONS)" -a -n "$(OUT)" || \
		{ echo "usage: make grade LAB=03 SUBMISSIONS=dir OUT=dir [PROBES=dir] [SOLUTIONS=dir] [JOBS=2] [RESUME=1 | ONLY=ids | FRESH=1] [FORMAT=canvas ASSIGNMENT='Lab 03 (12345)'] [DEADLINE=iso LATE_PER_DAY=0.1 LATE_MAX_DAYS=7 TIMES=csv] [SHARD=k/N]"; exit 2; }
	$(PY) -m helpers.grading.grade $(GRADE_MODE) --lab '$(LAB)' --submissions '$(SUBMISSIONS)' --out '$(OUT)' \
		$(if $(PROBES),--probes '$(PROBES)') $(if $(SOLUTIONS),--solutions '$(SOLUTIONS)') $(if $(JOBS),--jobs '$(JOBS)') \
		$(if $(RESUME),--resume) $(if $(ONLY),--only $(ONLY)) $(if $(FRESH),--fresh) $(if $(SHARD),--shard '$(SHARD)') \
		$(REPORT_ARGS)

# The LMS file's and the late policy's options: make grade's and make grade-merge's.
grade-merge grade: REPORT_ARGS = $(if $(FORMAT),--format '$(FORMAT)') $(if $(ASSIGNMENT),--assignment '$(ASSIGNMENT)') \
	$(if $(DEADLINE),--deadline '$(DEADLINE)') $(if $(LATE_PER_DAY),--late-per-day '$(LATE_PER_DAY)') \
	$(if $(LATE_MAX_DAYS),--late-max-days '$(LATE_MAX_DAYS)') $(if $(TIMES),--times '$(TIMES)')

# make grade-init: make grade's command with --init (its options, no SHARD): writes OUT/state.json, grades no one.
grade-init: GRADE_MODE = --init
grade-init: grade

grade-merge: setup
	@test -n "$(OUT)" || { echo "usage: make grade-merge OUT=dir [PROBES=dir] [SOLUTIONS=dir] [FORMAT=...]: after make grade-init and every make grade ... SHARD=k/N"; exit 2; }
	$(PY) -m helpers.grading.shards --out '$(OUT)' $(if $(PROBES),--probes '$(PROBES)') \
		$(if $(SOLUTIONS),--solutions '$(SOLUTIONS)') $(REPORT_ARGS)

# The student edition, a new repository outside this one; helpers/grading/prepare/release.py says what it leaves out.
release: setup
	@test -n "$(OUT)" || { echo "usage: make release OUT=../student-repo COURSE_REPO=https://github.com/<owner>/<name>.git (OUT: a new or empty directory outside this one)"; exit 2; }
	$(PY) -m helpers.grading.prepare.release --out '$(OUT)' --course-repo '$(COURSE_REPO)'

# Every chapter and solution under papermill with BACKEND="nccl" and world sizes capped at the GPU count, the device
# guard in its "check" mode, then the capstone under torchrun; scripts/gpu_check.py says what the report holds.
gpu-check: setup
	$(PY) scripts/gpu_check.py $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) artifacts .pytest_cache
