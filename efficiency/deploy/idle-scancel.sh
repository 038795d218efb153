#!/usr/bin/env bash
# Idle-GPU policy command hook (IDLE_POLICY_COMMAND=/opt/efficiency/idle-scancel.sh): cancel a Slurm job
# whose allocated GPUs stayed idle past the team's warning and grace period.
#
# Called without a shell as: idle-scancel.sh <external_id>, with in the environment
#   EFFICIENCY_JOB_ID        the job's external id (the Slurm job id for jobs the prolog registered)
#   EFFICIENCY_JOB_SELECTOR  the job's label selector, JSON (e.g. {"hpc_job": "48213"})
#   EFFICIENCY_JOB_GPUS      the job's explicit GPU list, JSON
#   EFFICIENCY_REASON        why (the idle evidence), also written to the job's admin comment
# Exit status 0 = cancelled; anything else is logged as a failure on the team's policy log.
# The worker's user needs the right to cancel other users' jobs (Slurm operator/coordinator).
set -euo pipefail
job_id="${1:?usage: idle-scancel.sh <slurm job id>}"
case "$job_id" in
  *[!0-9_]*) echo "refusing: '$job_id' is not a Slurm job id" >&2; exit 2 ;;
esac
reason="${EFFICIENCY_REASON:-idle GPUs}"
scontrol update JobId="$job_id" AdminComment="efficiency idle-GPU policy: ${reason:0:200}" 2>/dev/null || true
scancel --signal=TERM --full "$job_id"
logger -t efficiency-idle-policy "cancelled job $job_id: ${reason:0:300}" 2>/dev/null || true
echo "cancelled $job_id"
