// `driftkv-codec sweep`: rate-distortion sweep of several codecs (docs/quality.md).
#ifndef DRIFTKV_EVAL_SWEEP_H_
#define DRIFTKV_EVAL_SWEEP_H_

namespace driftkv {

// argv[0] is "sweep"; returns the process exit code.
int RunSweep(int argc, char** argv);

}  // namespace driftkv

#endif  // DRIFTKV_EVAL_SWEEP_H_
