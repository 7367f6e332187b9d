#!/usr/bin/env bash
# The offline checks of deploy/ (run by tools/run_tests.sh, one line each):
#   yamllint     every YAML file of deploy/ (deploy/yamllint.yml)
#   manifests    deploy/k8s: schemas with unknown keys refused, overlays
#                rendered (kubectl kustomize where kubectl exists), wiring,
#                the PrometheusRule in sync (check_manifests.mjs)
#   dockerfile   deploy/Dockerfile lint (check_dockerfile.mjs)
#   dashboard    deploy/monitoring/driftkv-dashboard.json is JSON
# The rules and the dashboard against Prometheus are bazel tests
# (//tests:monitoring_rules_test, //tests:monitoring_live_test).
#   tools/deploy_check/run.sh [CHECK...]   (default: all)
set -uo pipefail
cd "$(dirname "$0")/../.."
checks=("$@")
((${#checks[@]})) || checks=(yamllint manifests dockerfile dashboard)
failed=0
for c in "${checks[@]}"; do
  echo "== deploy check: $c"
  case "$c" in
    yamllint) yamllint -s -c deploy/yamllint.yml deploy/ && echo "yamllint: clean" ;;
    manifests) node tools/deploy_check/check_manifests.mjs ;;
    dockerfile) node tools/deploy_check/check_dockerfile.mjs ;;
    dashboard) /usr/bin/python3 -m json.tool deploy/monitoring/driftkv-dashboard.json >/dev/null && echo "dashboard: valid JSON" ;;
    *) echo "unknown check $c"; false ;;
  esac
  rc=$?
  if ((rc == 0)); then echo "DEPLOY CHECK PASSED: $c"; else echo "DEPLOY CHECK FAILED: $c"; failed=$((failed + 1)); fi
done
((failed == 0))
