// Lints deploy/Dockerfile offline (no Docker engine here): the diagnostics of
// dockerfile-utils (the VS Code Docker language server's validator: unknown
// instructions, bad flags and arguments, JSON-form errors, ...) must be
// empty, and the file must keep the README's build: a Debian 12 base,
// tools/install_deps.sh, the bazel targets, an unprivileged user, the ports
// of deploy/k8s.
//   node tools/deploy_check/check_dockerfile.mjs [Dockerfile]
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { validate } from "dockerfile-utils";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const file = process.argv[2] ?? path.join(root, "deploy/Dockerfile");
const text = fs.readFileSync(file, "utf8");
let passed = 0, failed = 0;
const check = (cond, msg) => { cond ? passed++ : failed++; console.log(`${cond ? "ok  " : "FAIL"}  ${msg}`); };

const diagnostics = validate(text, {
  deprecatedMaintainer: 2, directiveCasing: 2, emptyContinuationLine: 2, instructionCasing: 2,
  instructionCmdMultiple: 2, instructionEntrypointMultiple: 2, instructionHealthcheckMultiple: 2,
  instructionJSONInSingleQuotes: 2, instructionWorkdirRelative: 2,
});
for (const d of diagnostics) console.log(`      line ${d.range.start.line + 1}: ${d.message}`);
check(diagnostics.length === 0, `dockerfile-utils: ${diagnostics.length} diagnostics`);
check(/^ARG DEBIAN_IMAGE=debian:12$/m.test(text), "Debian 12 base");
check(/tools\/install_deps\.sh/.test(text), "installs with tools/install_deps.sh");
check(/bazel --batch build \/\/service:driftkv-server \/\/cli:driftkv/.test(text), "builds //service:driftkv-server //cli:driftkv");
check(/bazel --batch build \/\/service:driftkv-server-cuda/.test(text), "cuda target builds //service:driftkv-server-cuda");
check(/^USER 65532:65532$/m.test(text), "runs as 65532 (deploy/k8s runAsUser)");
check(/^EXPOSE 50051 9464$/m.test(text), "exposes the gRPC and metrics ports of deploy/k8s");
check(fs.existsSync(file + ".dockerignore") || fs.existsSync(path.join(root, ".dockerignore")), "has a .dockerignore");
// Self-test: the linter does flag a broken file.
const broken = validate("FROM debian:12\nEXPOSE notaport\nCOPY\nENTRYPOINT [\"a\"\n", {});
check(broken.length >= 2, `self-test: a broken Dockerfile gets ${broken.length} diagnostics (${broken.map((d) => d.message).join("; ")})`);
console.log(`${passed} checks ok, ${failed} failed`);
process.exit(failed ? 1 : 0);
