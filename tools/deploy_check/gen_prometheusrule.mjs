// Writes deploy/k8s/base/prometheusrule.yaml from deploy/monitoring/driftkv-rules.yml:
// the same groups, wrapped in a Prometheus Operator PrometheusRule, so that
// the rules exist once. check_manifests.mjs fails when the two differ.
//   node tools/deploy_check/gen_prometheusrule.mjs [--check]
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import YAML from "yaml";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
export const RULES = path.join(root, "deploy/monitoring/driftkv-rules.yml");
export const OUT = path.join(root, "deploy/k8s/base/prometheusrule.yaml");

export function render() {
  const rules = YAML.parse(fs.readFileSync(RULES, "utf8"));
  const doc = {
    apiVersion: "monitoring.coreos.com/v1",
    kind: "PrometheusRule",
    metadata: {
      name: "driftkv-server",
      labels: { "app.kubernetes.io/name": "driftkv", "app.kubernetes.io/component": "server" },
    },
    spec: { groups: rules.groups },
  };
  return (
    "---\n" +
    "# GENERATED from deploy/monitoring/driftkv-rules.yml by\n" +
    "# tools/deploy_check/gen_prometheusrule.mjs: edit the rules there and rerun.\n" +
    YAML.stringify(doc, { lineWidth: 160, minContentWidth: 60 })
  );
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const text = render();
  if (process.argv.includes("--check")) {
    const same = fs.existsSync(OUT) && fs.readFileSync(OUT, "utf8") === text;
    console.log(same ? "prometheusrule.yaml matches driftkv-rules.yml" : "prometheusrule.yaml is stale: rerun gen_prometheusrule.mjs");
    process.exit(same ? 0 : 1);
  }
  fs.writeFileSync(OUT, text);
  console.log(`wrote ${path.relative(root, OUT)}`);
}
