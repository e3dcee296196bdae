#!/usr/bin/env bash
# The archive on the layouts real training writes (results/checkpoint_store/layouts.md): four real runs on the
# CPU, two gloo ranks each, then python -m lmcbench.archive_layouts over them. From the repository root, in the
# README's environment (pip install -e ./codecs/lmc -e '.[peers,test]'); about 3 minutes on 2 cores.
set -euo pipefail
R=${1:-/tmp/lmc-layout-runs}
rm -rf "$R" && mkdir -p "$R"
python tests/deepspeed_train.py "$R/deepspeed_zero2" big-zero2         # DeepSpeed ZeRO-2, bf16, 1.05 M params
python tests/deepspeed_train.py "$R/deepspeed_zero3" big-zero3         # DeepSpeed ZeRO-3, bf16, 1.05 M params
python tests/fsdp_train.py train "$R/fsdp2_dcp_1.9M" --steps 10 --save-every 2                     # FSDP2 + dcp.save
FSDP_TRAIN_DIM=768 python tests/fsdp_train.py train "$R/fsdp2_dcp_12.6M" --steps 8 --save-every 2  # the same, wider
python -m lmcbench.archive_layouts --out results/checkpoint_store \
  --note "runs: made by results/checkpoint_store/layouts.sh (real training, CPU, 2 gloo ranks each)" \
  --run "deepspeed_zero2=$R/deepspeed_zero2:deepspeed" --run "deepspeed_zero3=$R/deepspeed_zero3:deepspeed" \
  --run "fsdp2_dcp_1.9M=$R/fsdp2_dcp_1.9M:dcp" --run "fsdp2_dcp_12.6M=$R/fsdp2_dcp_12.6M:dcp"
