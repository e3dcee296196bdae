#!/usr/bin/env bash
# The archive and the DCP writer at every thread count of a many-core machine, against ZipNN and DCP + ZStandard
# at the same thread count, on two consecutive steps of a real training series (lmc's public API only).
#
#   codecs/lmc/benchmarks/many_cores.sh SERIES L,N OUT [THREADS]     # THREADS default: 1,2,16,8,4
#
# SERIES is a Trainer folder (checkpoint-<step>/ with model.safetensors and optimizer.pt), e.g. one trained by
# `python -m lmcbench.tinygpt SERIES --preset tinygpt_large --set max_steps=300 --set save_steps=100`
# (`--device cuda` where there is a GPU). Writes OUT/archive_speed/{report.md,results.json} (rows appear in
# OUT/archive_speed.log as each thread count finishes: 16 comes third so a short lease still measures it) and
# OUT/dcp_speed.txt (the DCP writer and DCP + ZStandard, both with all cores).
set -euo pipefail
series=$1 steps=$2 out=$3 threads=${4:-1,2,16,8,4}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
cores=$(nproc)
py=${PYTHON:-python3}
echo "machine: $(nproc) cores, $("$py" -c 'import platform; print(platform.processor() or platform.machine())')"
"$py" -c 'import lmc, numba, numpy, torch; print("lmc", lmc.__version__, "numba", numba.__version__,
      "numpy", numpy.__version__, "torch", torch.__version__)'
"$py" "$here/archive_speed.py" "$series" --steps "$steps" --threads "$threads" --repeat 2 --peers \
    --out "$out/archive_speed" | tee "$out/archive_speed.log"
"$py" "$here/dcp_speed.py" --threads "$cores" --dcp-threads "$cores" --repeats 2 --background | tee "$out/dcp_speed.txt"
