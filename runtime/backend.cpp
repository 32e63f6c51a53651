#include "runtime/backend.h"

#include "core/error.h"

namespace dsv4 {

// Backends without an MTP module: the engine checks has_mtp() before drafting.
std::vector<float> ModelBackend::draft(std::span<BackendSequence* const>, std::span<const int32_t>) {
  throw Error("this backend has no MTP module for speculative decoding");
}

void ModelBackend::accept(BackendSequence&, int64_t) {
  throw Error("this backend has no MTP module for speculative decoding");
}

}  // namespace dsv4
