#!/usr/bin/env bash
# Slurm PrologSlurmctld: register each job with efficiency when it starts (runs once, on the controller).
#   slurm.conf:  PrologSlurmctld=/etc/slurm/efficiency-prolog.sh
# Needs curl and jq; EFFICIENCY_URL and EFFICIENCY_TOKEN in /etc/default/efficiency (root-only, 0600).
# EFFICIENCY_TOKEN is the cluster's scheduler credential, not a user's token:
#   manage.py issue_token --scheduler --cluster <cluster> --name "slurm prolog/epilog on <cluster>"
# It registers jobs of every team on the cluster with the owner and job id Slurm gives (SLURM_JOB_USER,
# SLURM_JOB_ID) and the GPUs Slurm allocated (the hpc_job label): only such jobs may be cancelled by the
# idle-GPU policy (README, "Threat model"). Keep it on the controller: a user holding it could claim any
# team's jobs.
# The team is the job's Slurm account (SLURM_JOB_ACCOUNT, account names = team slugs); without one, the
# comment's "team". Users describe the model in the job comment; the identity fields (id, owner, GPUs,
# selector, start) are Slurm's and are dropped from the comment, e.g.
#   #SBATCH --comment='{"team":"llm","kind":"training","model":{"name":"llama-7b","n_params":6.7e9,"n_layers":32,"n_heads":32,"head_dim":128,"seq_len":4096},"dtype":"bf16","gpu_model":"NVIDIA H100 80GB HBM3","global_batch":256,"parallelism":{"tp":1,"pp":1,"dp":8}}'
# GPUs are matched by the hpc_job label that dcgm-exporter adds with --hpc-job-mapping-dir.
# A failure here must never block the job: errors are logged and the script exits 0.
set -u
. /etc/default/efficiency 2>/dev/null || true
log() { logger -t efficiency-prolog "job ${SLURM_JOB_ID:-?}: $*"; }

info=$(scontrol show job -o "$SLURM_JOB_ID") || { log "scontrol failed"; exit 0; }
# The comment holds a JSON object: take it from its first '{' to the last '}' on the line.
comment=$(grep -o 'Comment={.*}' <<<"$info" | sed 's/^Comment=//')
gpus=$(grep -o 'gres/gpu=[0-9]*' <<<"$info" | head -n1 | cut -d= -f2)
jq -e . >/dev/null 2>&1 <<<"$comment" || { log "no JSON model description in the job comment; not registered"; exit 0; }

body=$(jq -n --argjson c "$comment" --arg id "$SLURM_JOB_ID" --arg name "${SLURM_JOB_NAME:-}" \
  --arg user "${SLURM_JOB_USER:-}" --arg gpus "${gpus:-0}" --arg now "$(date -u +%FT%TZ)" \
  --arg account "${SLURM_JOB_ACCOUNT:-}" '
  ($c | del(.gpu_count, .external_id, .owner, .selector, .gpus, .cluster, .started_at, .ended_at))
  + {external_id: $id, name: $name, owner: $user, started_at: $now,
     gpu_count: ($gpus | tonumber), selector: {hpc_job: $id}}
  + (if $account != "" then {team: $account} else {} end)')

curl -fsS --max-time 10 -X POST "$EFFICIENCY_URL/api/v1/jobs/" \
  -H "Authorization: Token $EFFICIENCY_TOKEN" -H "Content-Type: application/json" -d "$body" >/dev/null \
  || log "registration failed"
exit 0
