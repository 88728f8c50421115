# Two front doors: `make demo` and `make test`. Both install what they need (system packages too, when root).
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
SYSTEM_PACKAGES := iperf3 iproute2 iputils-ping openssh-server openssh-client ethtool procps kmod slurmctld slurmd slurm-client munge sudo dataset-fashion-mnist
# The suite runs on 3 xdist workers: on 2 cores a third worker fills the time the others wait on shaped links,
# sshd, Ansible and Slurm. Modules with a module-scoped fixture (a lab, a Slurm cluster, a sudo rule) carry
# pytest.mark.xdist_group so --dist loadgroup keeps each on one worker. The 15 slowest are printed in every log:
# the suite should stay under ~12 min on 2 cores. PYTEST_ARGS="-n 0 ..." runs it serially.
PYTEST_ARGS ?= -n 3 --dist loadgroup --durations=15

.PHONY: demo test test-unit test-integration lint sysdeps venv bench clean-cluster gpu-check gpu-wheels

# System packages the tests and the local cluster use. Installed only when missing; needs root and apt.
sysdeps: $(VENV)/.sysdeps
$(VENV)/.sysdeps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "missing system packages:$$missing (run as root, or install them)"; exit 2; fi; \
	  echo "installing system packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@mkdir -p $(VENV) && touch $@

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@

# The main job on the local emulated cluster: 4 hosts, sync SGD vs PowerSGD at a low and a high rate.
demo: sysdeps venv
	$(BIN)/python -m testbed.demo

test: sysdeps venv lint
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-unit: venv
	$(BIN)/python -m pytest -q tests/unit

lint: venv
	$(BIN)/ruff check testbed shaping runners tests bench
	$(BIN)/lint-imports  # layer contracts: pyproject.toml [tool.importlinter], docs/architecture.md
	@if [ -d ansible/playbooks ]; then cd ansible && ../$(BIN)/ansible-playbook --syntax-check -i inventory.example.yml playbooks/*.yml >/dev/null && ../$(BIN)/ansible-lint -q playbooks roles; fi

bench: sysdeps venv
	$(BIN)/python bench/shaping_accuracy.py

# GPU check (bench/gpu_check.py): capabilities, an NCCL preflight, NCCL over sockets between 2 emulated hosts on this
# machine's GPU(s), then the model calibrated (NCCL), profiled (GPU) and predicted against those trials, all within
# --deadline (540 s). Runs with the machine's own python3 and torch (no venv: GPU machines bring their CUDA build);
# prints "no CUDA device: skipped" where there is none. `make gpu-wheels` first, on a machine with a package registry,
# for a GPU machine without one. Results: GPU_CHECK_ARGS="--out DIR" (the tables and one tarball).
#   PYTHONUNBUFFERED=1 NCCL_DEBUG=WARN make gpu-check GPU_CHECK_ARGS="--out $$OUT"
GPU_PYTHON ?= python3
GPU_CHECK_ARGS ?=
gpu-check:
	$(GPU_PYTHON) bench/gpu_check.py $(GPU_CHECK_ARGS)

# Pure-Python wheels the controller side needs that a bare GPU machine may lack; bench/gpu_check.py puts them on
# sys.path. (Carry .gpu-wheels along with the checkout.)
# Pure-Python (py3-none-any) wheels only, for the GPU machine's Python 3.12; gpu_check runs without them too (loopback).
gpu-wheels: venv
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
	  --abi none --platform any -d .gpu-wheels 'pyroute2>=0.9.7,<0.10'

# Remove every cluster the testbed made on this machine (also leftovers of crashed runs).
clean-cluster: venv
	$(BIN)/testbed down --all
