#!/bin/sh
# Build stage of Dockerfile.cpu / Dockerfile.cuda: install the locked
# environment into /opt/venv and the course into /opt/course, add the
# unprivileged `student` user, and set the permissions the trust split needs.
#   $1      cpu | cuda (which docker/torch-$1.txt pins torch)
#   /ctx    the build context written by `labs image build`:
#           docker/ (this script, the lock), course/ (labs.yaml, pyproject.toml,
#           harness/, labs/, graders/), wheels/ (torch, when the host had it),
#           ca.crt (the host's CA bundle, when it set one for pip)
set -eu
flavor=$1
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_DEFAULT_TIMEOUT=180 PIP_PROGRESS_BAR=off
[ -f /ctx/ca.crt ] && export PIP_CERT=/ctx/ca.crt
lock=/ctx/docker/requirements.lock
torch=$(grep -v '^#' "/ctx/docker/torch-$flavor.txt")

python3 -m venv /opt/venv
pip="/opt/venv/bin/python -m pip"
# torch from the wheel the host put in the context (no index: the CPU build is
# not on PyPI), else from the index (set TORCH_INDEX for the CPU build there).
$pip install -q --no-index --find-links /ctx/wheels --no-deps "$torch" \
  || $pip install -q --no-deps ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} "$torch"
# everything else, pinned by the lock; the harness is installed as a package
# (its pytest plugin is an entry point)
$pip install -q -c "$lock" "$torch" "/ctx/course[triton]"
/opt/venv/bin/python -m pip check

# the course, without the harness (installed above); never solutions/
mkdir -p /opt/course
for f in labs.yaml pyproject.toml labs graders; do cp -a "/ctx/course/$f" /opt/course/; done
find /opt/course -name __pycache__ -prune -exec rm -rf {} +   # keep the venv's bytecode: imports stay fast
rm -rf /opt/venv/share/man

# who may read what: root runs the trusted grader; student code runs as uid
# 10001 or a uid of its own (harness/sandbox/isolation.py), which must not read the hidden graders
groupadd -g 10001 student
useradd -u 10001 -g 10001 -M -d /tmp -s /usr/sbin/nologin student
chown -R root:root /opt/venv /opt/course
chmod -R u=rwX,go=rX /opt/venv /opt/course
chmod -R go= /opt/course/graders
# grader-side harness modules (oracles, testing, grading, front ends): root only. The worker
# imports a staged copy of the worker side (harness/sandbox/isolation.py, worker_files()).
/opt/venv/bin/python - <<'PY'
import os, harness
from harness.sandbox.isolation import worker_files
top = os.path.dirname(harness.__file__)
keep = set(worker_files())
for root, _, files in os.walk(top):
    for f in files:
        if os.path.relpath(os.path.join(root, f), top) not in keep:
            os.chmod(os.path.join(root, f), 0o600)
PY
