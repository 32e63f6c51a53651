// Reads the compact tensor manifests written by scripts/make_manifest.py (no weight data).
#pragma once
#include <map>
#include <string>

#include "io/safetensors.h"

namespace dsv4::test {

// Expands every template row (name with {VAR}, dtype, comma shape, VAR=a-b,c lists) into name -> info.
std::map<std::string, TensorInfo> load_manifest(const std::string& path);

}  // namespace dsv4::test
