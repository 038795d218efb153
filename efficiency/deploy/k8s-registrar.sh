#!/usr/bin/env bash
# Kubernetes registrar: registers the GPU pods of batch Jobs with efficiency, and ends them, using the
# cluster's scheduler credential (an ApiToken of kind "scheduler": manage.py issue_token --scheduler
# --cluster <name>). It runs in the platform's namespace (kubernetes-job.yaml), never in a team's: the
# credential speaks for every team on the cluster, so no team's pod may hold it.
#
# Which pods: label efficiency.io/register=true, owned by a Job (ownerReferences), in a namespace the
# platform labelled efficiency.io/team=<team slug>. What the platform vouches for: the team (the namespace's
# label), the owner (the namespace's annotation efficiency.io/owner), the job id (the pod's name), its GPUs
# (the pod's {namespace, pod} labels on dcgm-exporter's series, run with -k). What the team describes: the
# pod's annotation efficiency.io/job, JSON such as {"model": {...}, "dtype": "bf16", "gpu_model": "...",
# "kind": "training"}; identity fields in it (external_id, team, owner, selector, gpus, cluster) are dropped.
# Idempotent: each pass re-posts every pod (started_at = the pod's start, ended_at = its containers' finish).
#
# Environment: EFFICIENCY_URL, EFFICIENCY_TOKEN (the scheduler token), REGISTRAR_INTERVAL_S (default 30),
# REGISTRAR_ONCE=1 for a single pass. Needs kubectl (RBAC: get/list pods and namespaces), jq and curl.
set -u
interval="${REGISTRAR_INTERVAL_S:-30}"

one_pass() {
  local namespaces pods
  namespaces=$(kubectl get namespaces -l efficiency.io/team -o json) || { echo "kubectl: namespaces" >&2; return 1; }
  pods=$(kubectl get pods --all-namespaces -l efficiency.io/register=true -o json) || { echo "kubectl: pods" >&2; return 1; }
  jq -c --argjson ns "$namespaces" '
    ($ns.items | map({key: .metadata.name,
       value: {team: .metadata.labels["efficiency.io/team"],
               owner: (.metadata.annotations["efficiency.io/owner"] // "")}}) | from_entries) as $teams
    | .items[]
    | select(any(.metadata.ownerReferences[]?; .kind == "Job"))
    | select($teams[.metadata.namespace] != null and .status.startTime != null)
    | ((.metadata.annotations["efficiency.io/job"] // "{}") | (try fromjson catch {})) as $d
    | ([.spec.containers[]? | (.resources.limits["nvidia.com/gpu"] // "0") | tonumber] | add // 0) as $gpus
    | select($gpus > 0)
    | ([.status.containerStatuses[]? | .state.terminated.finishedAt // empty] | max) as $finished
    | (if (.status.phase == "Succeeded" or .status.phase == "Failed") and $finished != null
       then {ended_at: $finished} else {} end) as $ended
    | ($d | if type == "object" then . else {} end
          | del(.external_id, .team, .owner, .selector, .gpus, .cluster, .gpu_count, .started_at, .ended_at))
      + {external_id: .metadata.name, name: ($d.name? // .metadata.name),
         team: $teams[.metadata.namespace].team, owner: $teams[.metadata.namespace].owner,
         started_at: .status.startTime, gpu_count: $gpus,
         selector: {namespace: .metadata.namespace, pod: .metadata.name}}
      + $ended' <<<"$pods" | while IFS= read -r body; do
    id=$(jq -r .external_id <<<"$body")
    curl -fsS --max-time 10 -X POST "$EFFICIENCY_URL/api/v1/jobs/" \
      -H "Authorization: Token $EFFICIENCY_TOKEN" -H "Content-Type: application/json" -d "$body" >/dev/null \
      || echo "registrar: pod $id not registered" >&2
  done
}

while true; do
  one_pass
  [ "${REGISTRAR_ONCE:-0}" = "1" ] && exit 0
  sleep "$interval"
done
