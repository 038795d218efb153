#!/usr/bin/env bash
# Slurm EpilogSlurmctld: tell efficiency the job ended, so it is finalized and its archive kept.
#   slurm.conf:  EpilogSlurmctld=/etc/slurm/efficiency-epilog.sh
# EFFICIENCY_TOKEN: the cluster's scheduler credential, as in efficiency-prolog.sh (it ends the jobs of its
# own cluster, whatever their team).
set -u
. /etc/default/efficiency 2>/dev/null || true
curl -fsS --max-time 10 -X PATCH "$EFFICIENCY_URL/api/v1/jobs/$SLURM_JOB_ID/" \
  -H "Authorization: Token $EFFICIENCY_TOKEN" -H "Content-Type: application/json" \
  -d "{\"ended_at\": \"$(date -u +%FT%TZ)\"}" >/dev/null \
  || logger -t efficiency-epilog "job $SLURM_JOB_ID: could not mark the job ended"
exit 0
