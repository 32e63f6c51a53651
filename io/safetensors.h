// safetensors files: mmap'd reader (single file or sharded folder) and a writer.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace dsv4 {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
};

// A tensor inside an mmap'd file: metadata + pointer to its bytes (valid while the file is open).
struct TensorRef {
  TensorInfo info;
  const uint8_t* data = nullptr;
};

// One .safetensors file, mmap'd read-only. The constructor validates the header (JSON, dtypes,
// offsets inside the data section, byte sizes = numel * dtype size) and throws Error naming the
// file and the offending tensor (e.g. a truncated file).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorRef>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorRef> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint folder: `model.safetensors.index.json` (weight_map name -> shard) when present,
// else every *.safetensors file in the folder. Names must be unique across shards; a name the
// index lists but its shard lacks is an error naming both.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);
  // An in-memory tensor set (e.g. random weights for benchmarks); `owner` keeps the bytes alive.
  // Data pointers may point to host or device memory; consumers that read bytes on the host must
  // only be handed host tensors.
  Checkpoint(std::map<std::string, TensorRef> refs, std::shared_ptr<void> owner)
      : dir_("<memory>"), refs_(std::move(refs)), owner_(std::move(owner)) {}
  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const { return refs_.count(name) != 0; }
  // Throws Error "missing tensor 'name'" when absent.
  const TensorRef& get(const std::string& name) const;
  const std::map<std::string, TensorRef>& tensors() const { return refs_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorRef> refs_;
  std::shared_ptr<void> owner_;
};

// Writer: collects tensors, then writes one file (8-byte little-endian header length, JSON header
// with sorted names and data_offsets, 8-byte aligned, then the raw bytes).
class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  void add_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  void write(const std::string& path) const;
  // Writes `dir/model.safetensors`, or, when the tensors exceed max_shard_bytes, numbered shards
  // `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json`.
  void write_folder(const std::string& dir, size_t max_shard_bytes) const;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace dsv4
