#!/usr/bin/env bash
# The README quickstart's first command as a newcomer runs it: a fresh clone, a new HOME, no pip cache; prints
# the install's and the first run's seconds (the figures the README quotes).  Usage: .ci/time_quickstart.sh [REPO]
set -euo pipefail
repo=$(cd "${1:-$(dirname "$0")/..}" && pwd)
work=$(mktemp -d)
git clone -q "$repo" "$work/clone" && cd "$work/clone"
mkdir "$work/home"
export HOME="$work/home" PIP_NO_CACHE_DIR=1
t0=$(date +%s)
python3 -m venv .venv && . .venv/bin/activate && pip install -q torch==2.13.0 && pip install -q -e ./codecs/lmc -e '.[peers,test]'
t1=$(date +%s)
lmcbench > lmcbench.log 2>&1
t2=$(date +%s)
echo "commit $(git rev-parse --short HEAD): install $((t1 - t0)) s, lmcbench $((t2 - t1)) s, total $((t2 - t0)) s ($work)"
