// Host glue between the CPU codec (codec/) and the CUDA kernels: GPU decode
// tables, encoder alphabets and transforms built from a DQuantCodec (pages
// have the codec's own layout, DQuantCodec::page_layout()).
// Kept out of the headers nvcc compiles, so that the CUDA build needs no
// codec headers.
#ifndef DRIFTKV_KERNELS_CODEC_BRIDGE_H_
#define DRIFTKV_KERNELS_CODEC_BRIDGE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "codec/dquant_codec.h"
#include "codec/rans.h"
#include "codec/transform/transforms_file.h"
#include "kernels/attention.h"
#include "kernels/encode.h"
#include "kernels/level_demote.h"
#include "kernels/level_promote.h"

namespace driftkv {
namespace gpu {

// The GPU form of a decode table: one 32-bit word per z = x mod 256,
//   [7:0] f   [15:8] bias = z - c   [31:16] the level m as fp16 bits,
// so that one lookup gives the state update and, packed two at a time with
// one byte permute, the tensor-core operand. 256 entries per alphabet.
void PackDecodeTable(const RansTable& table, uint32_t out[256]);

// The promotion's tables (kernels/level_promote.h PromoteParams::tables_dev):
// the key then the value decode table in kernels/promote_table.h's form,
// 512 words.
std::vector<uint32_t> PromoteDecodeTables(const DQuantCodec& codec);

// What a promotion takes from `codec`: its tables, already on the device
// (PromoteDecodeTables' words at tables_dev), and both records' payload
// sizes, into p (the rest of p untouched).
void SetPromoteCodec(const DQuantCodec& codec, const uint32_t* tables_dev, PromoteParams* p);

// The device form of kernels/transform.h for every layer of `set`.
std::vector<float> PackTransforms(const TransformSet& set);

// Layout and both alphabets of `codec` into p (the rest of p untouched);
// InvalidArgument when the kernels do not take the codec's pages
// (GpuPageLayoutError, e.g. a mean window other than kPageTokens).
absl::Status MakeEncodeAlphabets(const DQuantCodec& codec, EncodeParams* p);

// Both streams' encoding tables, level counts and payloads of `codec` into
// p.keys and p.values (the rest of p untouched).
void SetDemoteTables(const DQuantCodec& codec, DemoteParams* p);

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_CODEC_BRIDGE_H_
