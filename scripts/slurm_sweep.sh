#!/bin/bash
# A sweep as a SLURM job array: one run of the attention x seed grid per array task, with the
# names `python -m lit_attn.tools.sweep` gives, so `python -m lit_attn.tools.compare` reads the result:
#
#   sbatch --array=0-13 scripts/slurm_sweep.sh      # 7 attentions x 2 seeds = 14 runs
#   python -m lit_attn.tools.compare runs/sqa-paper-*     # when they are done
#
# Submit the same array again after a time limit or a preemption: finished runs are skipped and
# interrupted ones resume from their last checkpoint (--ckpt_path auto); none restarts from step 0.
# Edit ATTENTIONS, SEEDS, PREFIX and CONFIG (or set them in the environment) for your experiment;
# the script's arguments go to every `main.py fit`, e.g. sbatch --array=0-13 scripts/slurm_sweep.sh
# --trainer.max_steps=2000. The sweep sets each run's attention, seed and name itself, after the
# config and those arguments, so neither can make a task train another attention than its name says.
#SBATCH --job-name=lit-attn-sweep
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
#SBATCH --signal=TERM@120
# (SIGTERM 2 minutes before the limit: main.py saves last.ckpt and exits cleanly.)
#SBATCH --output=slurm-%A_%a.out
set -euo pipefail

ATTENTIONS=${ATTENTIONS:-mha,gqa,mqa,sqa,ssqa,xsqa,xsmqa}
SEEDS=${SEEDS:-1,2}
PREFIX=${PREFIX:-sqa-paper}
CONFIG=${CONFIG:-configs/sqa_wikipedia.yaml}
TASK=${SLURM_ARRAY_TASK_ID:?run with sbatch --array=0-N, or set SLURM_ARRAY_TASK_ID}

exec srun python -m lit_attn.tools.sweep --task "$TASK" --attention "$ATTENTIONS" --seeds "$SEEDS" --prefix "$PREFIX" \
    --config "$CONFIG" -- "$@"
