#!/usr/bin/env bash
# The 24M confirmation of the lossy frontier's chosen points (issue 34), for a machine with a GPU and ~16 cores:
# trains the tinygpt_large series (24M parameters, 1,000 steps, a checkpoint every 50) on the GPU unless SERIES
# holds one, then runs each point below as its own `lmcbench experiment=lossy` process (2 CPU threads each, all
# at once), the resumed runs' training on the GPU (lossy.device=cuda), resuming every 5 checkpoints (at steps
# 300, 550, 800). The methods code on the CPU exactly as on a CPU-only machine.
#
#   results/lossy/confirm_24m/run.sh OUT [SERIES]        # then: python experiments/lossy.py --merge MERGED OUT/*/lossy
#
# LOSSY_TIMEOUT (seconds, default none) stops every point still running then; a stopped point writes no row.
# PRESET, DEVICE and EXTRA (more overrides for every point) exist to try the script on a small CPU series.
set -uo pipefail
mkdir -p "$1"
out=$(cd "$1" && pwd)
series=${2:-$out/series}
series=$(mkdir -p "$series" && cd "$series" && pwd)
py=${PYTHON:-python3}
cd "$out"  # not the repository: `python -m lmcbench` there would import its sources, not the installed package
if [ ! -e "$series/lmcbench_series.json" ]; then
    "$py" -m lmcbench.tinygpt "$series" --preset "${PRESET:-tinygpt_large}" --device "${DEVICE:-cuda}" || exit 1
fi
limit=${LOSSY_TIMEOUT:-0}

point() {  # NAME OVERRIDES...: one point, in the background
    local name=$1
    shift
    OMP_NUM_THREADS=2 NUMBA_NUM_THREADS=2 timeout "${limit}" "$py" -m lmcbench experiment=lossy \
        source="${PRESET:-tinygpt_large}" +source.path="$series" lossy.device="${DEVICE:-cuda}" lossy.resume_every=5 \
        hydra.run.dir="$out/$name/hydra" results_dir="$out/$name" ${EXTRA:-} "$@" >"$out/$name.log" 2>&1 &
}

efq() {  # NAME Q V_BLOCK [JUDGED]
    point "$1" "lossy.judged=[${4:-resumed}]" 'lossy.only=[efq]' \
        "lossy.methods.efq=[{q:$2,alloc:rms,recon:gain,v_block:$3}]"
}
efq efq_q2.1 2.1 1024
efq efq_q2.15 2.15 1024
efq efq_q1.8 1.8 1024
efq efq_q2.4 2.4 1024
efq efq_q1.2 1.2 1024
efq efq_q2.1_v64 2.1 64
efq efq_q2.1_recon 2.1 1024 reconstruction
point adam8bit_256 'lossy.judged=[resumed]' 'lossy.only=[adam8bit]' 'lossy.methods.adam8bit=[{block:256}]'
wait
for f in "$out"/*.log; do echo "== $f"; tail -3 "$f"; done
