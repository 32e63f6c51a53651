// A 2-D weight matrix [out, in] as stored in the checkpoint (dense, FP8 block-scaled or FP4
// group-scaled): what every backend's linear op consumes. Points into mmap'd or device memory.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace dsv4 {

enum class WeightFormat : uint8_t {
  Dense,      // F32 / BF16 / F16 elements
  FP8Block,   // F8_E4M3 elements, scale [ceil(out/128), ceil(in/128)] (E8M0 or F32)
  FP4Group32  // packed e2m1 [out, in/2], scale [out, in/32] (E8M0)
};

struct WeightView {
  WeightFormat format = WeightFormat::Dense;
  DType dtype = DType::F32;        // element dtype for Dense / FP8Block
  int64_t out = 0, in = 0;
  const uint8_t* data = nullptr;
  DType scale_dtype = DType::F8_E8M0;
  const uint8_t* scale = nullptr;
  int64_t scale_cols = 0;          // columns of the scale tensor

  bool empty() const { return data == nullptr; }
};

}  // namespace dsv4
