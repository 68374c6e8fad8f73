#!/usr/bin/env bash
# The harness experiments at paper scale (128K, B=1, Hq=32, Hkv=8, D=128, bf16) on one GPU, on the
# seeded synthetic inputs (no model weights are needed). Run from the repository root:
#   bash benchmarks/harness_paper_scale.sh [--smoke] [REV] [extra overrides...]
# Records land in results/ (resumable: finished points are skipped); with $OUT set (the lent GPU
# machine) they are also packed into $OUT/harness_results.tgz. A failed step does not stop the
# later ones; the exit status says whether any failed. --smoke: the same steps at the harness's
# tiny size on the CPU (dry_run=true, L=512, 2/1 heads; give results_dir=<a scratch folder>).
set -uo pipefail
if [ "${1:-}" = "--smoke" ]; then
  shift
  size=(data.L=512 data.heads_q=2 data.heads_kv=1 dry_run=true wandb.mode=disabled)
else
  size=(data.L=131072 data.heads_q=32 data.heads_kv=8)
fi
rev=${1:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
shift || true
if [ -d .whl ]; then  # the GPU machines lack hydra/omegaconf/wandb: install the carried wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1 WANDB_MODE=${WANDB_MODE:-offline}
common=(data=synthetic "${size[@]}" "git_rev=$rev" progress=false "$@")
failed=0
step() {  # step SECONDS ARGS...: one run.py call with its own time limit, so later steps still run
  local limit=$1; shift
  echo "=== run.py $* (limit ${limit}s)"
  timeout "$limit" python3 run.py "$@" "${common[@]}" 2>&1 | grep -v '^wandb:'
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    echo "step failed or timed out (exit $rc): $*"
    failed=1
  fi
}
step 180 -m experiment=operator_128k method=s2o,full,flexprefill,xattn,pbs,flashprefill
step 120 experiment=hparams_tau
step 60 experiment=component_ablation
step 60 experiment=hparams_S
step 150 experiment=fig4a_mse_vs_sparsity
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/harness_results.tgz" results/runs results/experiments 2>/dev/null
  ls -la "$OUT"
fi
exit $failed
