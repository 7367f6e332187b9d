// Offline validation of the Kubernetes manifests in deploy/k8s (no cluster):
//
//  1. Schemas: every object of the base and of each rendered overlay is
//     validated against the API schemas of the npm packages kubernetes-models
//     (core, apps, policy) and @kubernetes-models/prometheus-operator
//     (ServiceMonitor, PrometheusRule): types, enums, required fields.
//  2. Unknown keys refused: those schemas let unknown keys through (a
//     misspelled "replica:" would pass), so every object is validated
//     through a Proxy that records which keys the schema's validator looks
//     at. A key of an object whose validator looked at other keys but never
//     at that one, nor enumerated the object's keys (as it does for maps such
//     as labels or resources), is unknown: an error. Objects the schema
//     leaves free-form (no key looked at) are not checked.
//  3. Wiring: the StatefulSet's serviceName is a headless Service, selectors
//     match the pod labels, Services' target ports and probes' ports are
//     container ports, the ServiceMonitor selects a Service with its port,
//     the --config file is a key of the mounted ConfigMap; the gpu overlay
//     asks for nvidia.com/gpu and the cpu overlay does not.
//  4. The PrometheusRule equals deploy/monitoring/driftkv-rules.yml.
//  5. Self-test: misspelled keys and wrong types injected into copies of the
//     real objects must be refused (so check 2 is known to work).
//
// Overlays are rendered with `kubectl kustomize` when kubectl is on PATH,
// and always with the small renderer below (resources, strategic-merge
// patches by kind and name with lists merged on "name", images), which is
// enough for these overlays.
//   node tools/deploy_check/check_manifests.mjs
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import YAML from "yaml";
import { render as renderRule, OUT as RULE_FILE } from "./gen_prometheusrule.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const K8S = path.join(root, "deploy/k8s");
let passed = 0, failed = 0;
function ok(msg) { passed++; console.log(`ok    ${msg}`); }
function fail(msg) { failed++; console.log(`FAIL  ${msg}`); }
function check(cond, msg) { (cond ? ok : fail)(msg); }

// ---- schemas --------------------------------------------------------------
const MODELS = {
  "v1/ConfigMap": "kubernetes-models/v1/ConfigMap",
  "v1/Service": "kubernetes-models/v1/Service",
  "apps/v1/StatefulSet": "kubernetes-models/apps/v1/StatefulSet",
  "policy/v1/PodDisruptionBudget": "kubernetes-models/policy/v1/PodDisruptionBudget",
  "monitoring.coreos.com/v1/ServiceMonitor":
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor",
  "monitoring.coreos.com/v1/PrometheusRule":
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule",
};
const validators = {};
// The model module imports its compiled schema ("../../_schemas/X.js"); the
// package does not export that path, so import the file itself.
async function validatorFor(apiVersion, kind) {
  const key = `${apiVersion}/${kind}`;
  if (!(key in MODELS)) return null;
  if (!validators[key]) {
    const modelUrl = import.meta.resolve(MODELS[key]);
    const src = fs.readFileSync(fileURLToPath(modelUrl), "utf8");
    const m = src.match(/import\s*\{\s*validate\s*\}\s*from\s*"(\.[^"]*_schemas\/[^"]+)"/);
    if (!m) throw new Error(`no schema import in ${modelUrl}`);
    validators[key] = (await import(new URL(m[1], modelUrl).href)).validate;
  }
  return validators[key];
}

// Wraps `data` so that every object records the keys read and whether its
// keys were enumerated; returns [proxy, records].
function tracked(data) {
  const records = [];
  function wrap(value, where) {
    if (value === null || typeof value !== "object") return value;
    const rec = { where, value, seen: new Set(), enumerated: false };
    records.push(rec);
    const target = Array.isArray(value)
      ? value.map((v, i) => wrap(v, `${where}[${i}]`))
      : Object.fromEntries(Object.entries(value).map(([k, v]) => [k, wrap(v, `${where}.${k}`)]));
    return new Proxy(target, {
      get(t, p, r) { if (typeof p === "string") rec.seen.add(p); return Reflect.get(t, p, r); },
      has(t, p) { if (typeof p === "string") rec.seen.add(p); return Reflect.has(t, p); },
      ownKeys(t) { rec.enumerated = true; return Reflect.ownKeys(t); },
    });
  }
  return [wrap(data, ""), records];
}

export async function validateObject(obj) {
  const errors = [];
  const validate = await validatorFor(obj.apiVersion, obj.kind);
  if (!validate) return [`no schema for ${obj.apiVersion} ${obj.kind}`];
  const [proxy, records] = tracked(obj);
  if (!validate(proxy)) {
    for (const e of validate.errors) errors.push(`${e.instancePath || "/"} ${e.message ?? e.keyword} ${JSON.stringify(e.params)}`);
  }
  for (const r of records) {
    if (Array.isArray(r.value) || r.enumerated || r.seen.size === 0) continue;
    for (const k of Object.keys(r.value)) {
      if (!r.seen.has(k)) errors.push(`unknown key "${k}" at ${r.where || "/"}`);
    }
  }
  return errors;
}

// ---- rendering ------------------------------------------------------------
function readDocs(file) {
  return YAML.parseAllDocuments(fs.readFileSync(file, "utf8")).map((d) => {
    if (d.errors.length) throw new Error(`${file}: ${d.errors[0].message}`);
    return d.toJS();
  }).filter((d) => d);
}

const KUSTOMIZATION_KEYS = new Set(["apiVersion", "kind", "resources", "images", "patches"]);
function strategicMerge(base, patch) {
  if (Array.isArray(base) && Array.isArray(patch) &&
      patch.every((p) => p && typeof p === "object" && "name" in p)) {
    const out = base.map((b) => ({ ...b }));
    for (const p of patch) {
      const i = out.findIndex((b) => b && b.name === p.name);
      if (i >= 0) out[i] = strategicMerge(out[i], p); else out.push(p);
    }
    return out;
  }
  if (base && patch && typeof base === "object" && typeof patch === "object" &&
      !Array.isArray(base) && !Array.isArray(patch)) {
    const out = { ...base };
    for (const [k, v] of Object.entries(patch)) out[k] = k in base ? strategicMerge(base[k], v) : v;
    return out;
  }
  return patch;
}
function containersOf(obj) {
  const spec = obj?.spec?.template?.spec;
  return spec ? [...(spec.containers ?? []), ...(spec.initContainers ?? [])] : [];
}
export function renderKustomization(dir) {
  const kfile = path.join(dir, "kustomization.yaml");
  const [k] = readDocs(kfile);
  for (const key of Object.keys(k)) {
    if (!KUSTOMIZATION_KEYS.has(key)) throw new Error(`${kfile}: key "${key}" unknown to this renderer`);
  }
  let objects = [];
  for (const r of k.resources ?? []) {
    const p = path.join(dir, r);
    objects.push(...(fs.statSync(p).isDirectory() ? renderKustomization(p) : readDocs(p)));
  }
  for (const patch of k.patches ?? []) {
    for (const doc of readDocs(path.join(dir, patch.path))) {
      const i = objects.findIndex((o) => o.kind === doc.kind && o.metadata.name === doc.metadata.name);
      if (i < 0) throw new Error(`${patch.path}: no ${doc.kind} ${doc.metadata.name} to patch`);
      objects[i] = strategicMerge(objects[i], doc);
    }
  }
  for (const img of k.images ?? []) {
    for (const o of objects) {
      for (const c of containersOf(o)) {
        const [name, tag] = c.image.split(":");
        if (name === img.name) c.image = `${img.newName ?? name}:${img.newTag ?? tag}`;
      }
    }
  }
  return objects;
}

function kubectlRender(dir) {
  try {
    execFileSync("kubectl", ["version", "--client"], { stdio: "ignore" });
  } catch {
    return null;
  }
  return YAML.parseAllDocuments(execFileSync("kubectl", ["kustomize", dir], { encoding: "utf8" }))
    .map((d) => d.toJS()).filter((d) => d);
}

// ---- wiring ---------------------------------------------------------------
const matches = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);

function checkWiring(name, objects, variant) {
  const of = (kind) => objects.filter((o) => o.kind === kind);
  const [sts] = of("StatefulSet");
  if (!sts) return fail(`${name}: no StatefulSet`);
  const podLabels = sts.spec.template.metadata.labels;
  const [c] = sts.spec.template.spec.containers;
  const ports = new Map((c.ports ?? []).map((p) => [p.name, p.containerPort]));
  check(matches(sts.spec.selector.matchLabels, podLabels), `${name}: StatefulSet selector matches its pod labels`);
  const headless = of("Service").find((s) => s.metadata.name === sts.spec.serviceName);
  check(headless && headless.spec.clusterIP === "None", `${name}: serviceName ${sts.spec.serviceName} is a headless Service`);
  for (const s of of("Service")) {
    check(matches(s.spec.selector, podLabels), `${name}: Service ${s.metadata.name} selects the pods`);
    for (const p of s.spec.ports) {
      check(ports.has(p.targetPort) || [...ports.values()].includes(p.targetPort),
        `${name}: Service ${s.metadata.name} port ${p.name} targets container port ${p.targetPort}`);
    }
  }
  for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
    check(c[probe]?.grpc && [...ports.values()].includes(c[probe].grpc.port),
      `${name}: ${probe} is a gRPC health probe on a container port`);
  }
  for (const pdb of of("PodDisruptionBudget")) {
    check(matches(pdb.spec.selector.matchLabels, podLabels), `${name}: PodDisruptionBudget selects the pods`);
  }
  for (const sm of of("ServiceMonitor")) {
    const svc = of("Service").filter((s) => matches(sm.spec.selector.matchLabels, s.metadata.labels));
    check(svc.length === 1 && sm.spec.endpoints.every((e) => svc[0].spec.ports.some((p) => p.name === e.port)),
      `${name}: ServiceMonitor selects one Service (${svc.map((s) => s.metadata.name)}) with its ports`);
  }
  // --config FILE is a key of the ConfigMap mounted at FILE's folder.
  const args = [...(c.command ?? []), ...(c.args ?? [])];
  const config = args[args.indexOf("--config") + 1];
  const mount = (c.volumeMounts ?? []).find((m) => config?.startsWith(m.mountPath + "/"));
  const volume = sts.spec.template.spec.volumes.find((v) => v.name === mount?.name);
  const cm = of("ConfigMap").find((m) => m.metadata.name === volume?.configMap?.name);
  check(cm && path.basename(config) in (cm.data ?? {}), `${name}: --config ${config} is in ConfigMap ${cm?.metadata.name}`);
  const gpus = c.resources?.limits?.["nvidia.com/gpu"];
  if (variant === "gpu") {
    check(gpus === "1" || gpus === 1, `${name}: requests one nvidia.com/gpu`);
    check(args.includes("cuda") && c.image.includes("cuda"), `${name}: runs the cuda backend from the cuda image`);
  } else if (variant === "cpu") {
    check(gpus === undefined, `${name}: no nvidia.com/gpu`);
  }
  if (variant) check(c.resources?.requests?.memory && c.resources?.limits?.memory, `${name}: memory requests and limits set`);
}

// ---- main -----------------------------------------------------------------
async function validateAll(name, objects) {
  for (const o of objects) {
    const errors = await validateObject(o);
    check(errors.length === 0, `${name}: ${o.kind} ${o.metadata?.name}${errors.length ? ": " + errors.join("; ") : ""}`);
  }
}

async function selfTest() {
  const base = renderKustomization(path.join(K8S, "base"));
  const get = (kind) => structuredClone(base.find((o) => o.kind === kind));
  const cases = [];
  let o = get("StatefulSet"); o.spec.replica = 3; cases.push(["spec.replica (misspelled replicas)", o]);
  o = get("StatefulSet"); o.spec.template.spec.containers[0].imagePullPolicyy = "Always"; cases.push(["container imagePullPolicyy", o]);
  o = get("StatefulSet"); o.spec.template.spec.containers[0].readinessProbe.grpc.servce = "x"; cases.push(["grpc probe servce", o]);
  o = get("StatefulSet"); o.spec.replicas = "3"; cases.push(["replicas as a string", o]);
  o = get("ServiceMonitor"); o.spec.endpoints[0].intervall = "15s"; cases.push(["ServiceMonitor endpoint intervall", o]);
  o = get("PodDisruptionBudget"); o.spec.maxUnavailible = 1; cases.push(["PodDisruptionBudget maxUnavailible", o]);
  o = get("Service"); o.spec.cluster_ip = "None"; cases.push(["Service cluster_ip", o]);
  o = get("PrometheusRule"); o.spec.groups[1].rules[0].fore = "5m"; cases.push(["PrometheusRule rule fore", o]);
  for (const [what, obj] of cases) {
    const errors = await validateObject(obj);
    check(errors.length > 0, `self-test: ${what} refused${errors.length ? ` (${errors[0]})` : ""}`);
  }
  // Maps stay open: labels, annotations, resources, ConfigMap data.
  o = get("StatefulSet"); o.metadata.labels["example.com/any"] = "x";
  o.spec.template.spec.containers[0].resources = { limits: { "example.com/device": "1" } };
  check((await validateObject(o)).length === 0, "self-test: label and resource maps accept any key");
}

async function main() {
  check(fs.readFileSync(RULE_FILE, "utf8") === renderRule(),
    "base/prometheusrule.yaml equals deploy/monitoring/driftkv-rules.yml (gen_prometheusrule.mjs)");
  await validateAll("base", renderKustomization(path.join(K8S, "base")));
  checkWiring("base", renderKustomization(path.join(K8S, "base")), null);
  for (const overlay of fs.readdirSync(path.join(K8S, "overlays")).sort()) {
    const dir = path.join(K8S, "overlays", overlay);
    const own = renderKustomization(dir);
    await validateAll(`overlays/${overlay}`, own);
    checkWiring(`overlays/${overlay}`, own, overlay);
    const kubectl = kubectlRender(dir);
    if (kubectl === null) {
      console.log(`note  overlays/${overlay}: kubectl not on PATH, kustomize rendering by kubectl skipped`);
      continue;
    }
    await validateAll(`overlays/${overlay} (kubectl kustomize)`, kubectl);
    checkWiring(`overlays/${overlay} (kubectl kustomize)`, kubectl, overlay);
    const norm = (objs) => JSON.stringify(objs.map((x) => `${x.kind}/${x.metadata.name}`).sort());
    check(norm(kubectl) === norm(own), `overlays/${overlay}: kubectl kustomize renders the same objects`);
  }
  await selfTest();
  console.log(`${passed} checks ok, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) await main();
